#include "backends/runtime/alloc_tracker.hpp"

#include <ATen/DeviceAccelerator.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace gradcert {

namespace {

std::atomic<int64_t> g_current{0}, g_peak{0}, g_count{0};

void raise_peak(int64_t now) {
  int64_t seen = g_peak.load(std::memory_order_relaxed);
  while (now > seen && !g_peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {}
}

// NOTE [tracking allocator] LibTorch asks c10::GetCPUAllocator() for every CPU storage
// (at::empty, zeros, clones, autograd's gradient buffers, ...). The tracker wraps the
// allocator it replaces: allocate() delegates, counts the requested bytes, and keeps the
// original DataPtr in a table keyed by the data pointer. The DataPtr it returns is
// "simple" (context == data, deleter release()), because kernels also use the raw
// interface (raw_allocate asserts get() == get_context(); float32 gelu does this), so a
// context struct around the original cannot be used. release() takes the entry out of the
// table, subtracts its size and destroys the original DataPtr, whose own deleter frees the
// memory. Storage allocated before install keeps its own deleter and is never subtracted,
// so current_bytes() counts only what was allocated since. Zero-byte allocations with a
// null pointer are passed through uncounted.
struct Allocation {
  c10::DataPtr original;
  size_t bytes = 0;
};

std::mutex g_table_mutex;
std::unordered_map<void*, Allocation>* g_table = new std::unordered_map<void*, Allocation>();  // never destroyed

void release(void* data) {
  Allocation a;
  {
    std::lock_guard<std::mutex> lock(g_table_mutex);
    auto it = g_table->find(data);
    if (it == g_table->end()) return;  // cannot happen: only allocate() hands out release()
    a = std::move(it->second);
    g_table->erase(it);
  }
  g_current.fetch_sub(static_cast<int64_t>(a.bytes), std::memory_order_relaxed);
  // a.original frees the memory as it goes out of scope.
}

struct TrackingAllocator final : c10::Allocator {
  explicit TrackingAllocator(c10::Allocator* inner) : inner(inner) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr original = inner->allocate(n);
    void* data = original.get();
    if (!data) return original;
    const c10::Device device = original.device();
    {
      std::lock_guard<std::mutex> lock(g_table_mutex);
      (*g_table)[data] = Allocation{std::move(original), n};
    }
    const int64_t now =
        g_current.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) + static_cast<int64_t>(n);
    g_count.fetch_add(1, std::memory_order_relaxed);
    raise_peak(now);
    return {data, data, &release, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  c10::Allocator* inner;
};

TrackingAllocator* g_tracker = nullptr;
std::mutex g_install;
constexpr uint8_t kPriority = 1;  // above the default CPU allocator's registration (0)

int64_t read_status_kib(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, key.size() + 1, key + ":") == 0) {
      std::istringstream fields(line.substr(key.size() + 1));
      int64_t kib = -1;
      fields >> kib;
      return kib;
    }
  return -1;
}

}  // namespace

bool install_tracking_allocator() {
  std::lock_guard<std::mutex> lock(g_install);
  if (!g_tracker) {
    // Deliberately leaked: live storages' contexts and LibTorch's allocator table point here.
    g_tracker = new TrackingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(g_tracker, kPriority);
  }
  return c10::GetCPUAllocator() == g_tracker;
}

bool tracking_allocator_installed() {
  std::lock_guard<std::mutex> lock(g_install);
  return g_tracker && c10::GetCPUAllocator() == g_tracker;
}

int64_t current_bytes() { return g_current.load(std::memory_order_relaxed); }
int64_t peak_bytes() { return g_peak.load(std::memory_order_relaxed); }
void reset_peak() { g_peak.store(g_current.load(std::memory_order_relaxed), std::memory_order_relaxed); }
int64_t allocation_count() { return g_count.load(std::memory_order_relaxed); }

int64_t process_high_water_bytes() {
  const int64_t kib = read_status_kib("VmHWM");
  return kib < 0 ? -1 : kib * 1024;
}

bool reset_process_high_water() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

// NOTE [device statistics] at::accelerator reaches the CUDA caching allocator through
// c10's allocator registry, so this file needs no CUDA headers or libraries: on the CPU
// wheel getAccelerator() is empty and the answer is "unavailable"; on a CUDA build it
// returns the caching allocator's aggregate allocated/reserved bytes and their peaks.
DeviceMemoryStats device_memory_stats(int device) {
  DeviceMemoryStats s;
  try {
    const auto type = at::accelerator::getAccelerator(false);
    if (!type) {
      s.why = "no accelerator in this LibTorch build";
      return s;
    }
    if (device >= static_cast<int>(at::accelerator::deviceCount())) {
      s.why = "no " + c10::DeviceTypeName(*type, true) + " device " + std::to_string(device);
      return s;
    }
    const auto stats = at::accelerator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    constexpr auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    s.available = true;
    s.allocated_current = stats.allocated_bytes[all].current;
    s.allocated_peak = stats.allocated_bytes[all].peak;
    s.reserved_current = stats.reserved_bytes[all].current;
    s.reserved_peak = stats.reserved_bytes[all].peak;
  } catch (const std::exception& e) {
    s.available = false;
    s.why = e.what();
  }
  return s;
}

bool reset_device_peak(int device) {
  if (!device_memory_stats(device).available) return false;
  at::accelerator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
  return true;
}

MemoryPhases::MemoryPhases(std::string bucket, int rank, int device)
    : bucket_(std::move(bucket)), rank_(rank), device_(device) {
  if (device_ < 0) install_tracking_allocator();
}

void MemoryPhases::reset() {
  if (device_ < 0)
    reset_peak();
  else
    reset_device_peak(device_);
  reset_process_high_water();
  since_ = std::chrono::steady_clock::now();
}

void MemoryPhases::start() { reset(); }

void MemoryPhases::mark(const std::string& phase) {
  PhasePeak p;
  p.rank = rank_;
  p.bucket = bucket_;
  p.phase = phase;
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
  if (device_ < 0) {
    p.device = "cpu";
    p.peak_bytes = peak_bytes();
    p.current_bytes = current_bytes();
  } else {
    const auto s = device_memory_stats(device_);
    p.device = "cuda:" + std::to_string(device_);
    p.peak_bytes = s.available ? s.allocated_peak : -1;
    p.current_bytes = s.available ? s.allocated_current : -1;
    p.reserved_peak_bytes = s.available ? s.reserved_peak : -1;
  }
  p.process_high_water_bytes = process_high_water_bytes();
  phases_.push_back(p);
  reset();
}

const PhasePeak* MemoryPhases::worst() const {
  const PhasePeak* w = nullptr;
  for (const auto& p : phases_)
    if (!w || p.peak_bytes > w->peak_bytes) w = &p;
  return w;
}

int64_t distinct_storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    const auto& storage = t.storage();
    if (seen.insert(storage.unsafeGetStorageImpl()).second) bytes += static_cast<int64_t>(storage.nbytes());
  }
  return bytes;
}

}  // namespace gradcert
