// Measured memory: a tracking CPU allocator for LibTorch, the process high-water mark,
// the CUDA caching allocator's statistics, and a per-phase recorder. Torch-free header;
// the definitions (alloc_tracker.cpp) link against LibTorch.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "conformance/core/memory_types.hpp"

namespace at {
class Tensor;
}

namespace gradcert {

/// Installs the tracking allocator as LibTorch's CPU allocator (c10::SetCPUAllocator),
/// delegating to the allocator it replaces. Idempotent and thread-safe. Only storage
/// allocated after the first call is counted. Returns false when LibTorch kept another
/// allocator (one registered with a higher priority).
bool install_tracking_allocator();
/// The tracking allocator is LibTorch's current CPU allocator.
bool tracking_allocator_installed();
/// Live bytes of CPU tensor storage allocated through the tracker.
int64_t current_bytes();
/// The most live bytes since install or the last reset_peak().
int64_t peak_bytes();
/// Starts a new peak window: peak := current.
void reset_peak();
/// Allocations made through the tracker since install (a count, not bytes).
int64_t allocation_count();

/// The process's resident-set high-water mark (VmHWM of /proc/self/status) in bytes; -1
/// where it cannot be read. It includes everything (libraries, untracked buffers).
int64_t process_high_water_bytes();
/// Resets VmHWM to the current RSS (writes 5 to /proc/self/clear_refs); false when the
/// kernel refuses, in which case VmHWM stays the high-water mark of the whole process.
bool reset_process_high_water();

/// The CUDA caching allocator's statistics for one device, in bytes.
struct DeviceMemoryStats {
  bool available = false;
  std::string why;  ///< when not available: why ("no accelerator in this LibTorch build", ...)
  int64_t allocated_current = 0, allocated_peak = 0;
  int64_t reserved_current = 0, reserved_peak = 0;
};
/// Statistics of accelerator device `device` (through at::accelerator, so this compiles
/// and links against the CPU wheel and answers "unavailable" there).
DeviceMemoryStats device_memory_stats(int device = 0);
/// Resets the device's peak statistics; false when no device statistics are available.
bool reset_device_peak(int device = 0);

/// Records the peak of each phase of a run on one rank and one length bucket. Each mark()
/// closes the phase that ran since start() or the previous mark(): it records the tracked
/// peak (or, with a device, the device's allocated peak), the live bytes, the seconds and
/// the process high-water mark, then resets the peaks for the next phase.
class MemoryPhases {
 public:
  /// `device` < 0 measures CPU storage (installs the tracking allocator); >= 0 measures
  /// that accelerator device's caching allocator.
  explicit MemoryPhases(std::string bucket, int rank = 0, int device = -1);
  /// Starts the first phase: resets the peaks and the clock.
  void start();
  /// Closes the phase named `phase` and starts the next one.
  void mark(const std::string& phase);
  const std::vector<PhasePeak>& phases() const { return phases_; }
  /// The phase with the largest peak (nullptr when none).
  const PhasePeak* worst() const;

 private:
  void reset();
  std::string bucket_;
  int rank_, device_;
  std::chrono::steady_clock::time_point since_;
  std::vector<PhasePeak> phases_;
};

/// Bytes of the distinct storages behind `tensors` (undefined tensors skipped, shared
/// storage counted once): the exact model-state figure for memory.lower_bound.
int64_t distinct_storage_bytes(const std::vector<at::Tensor>& tensors);

}  // namespace gradcert
