#include "conformance/launch/cuda_probe.hpp"

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace gradcert {

// NOTE [cuda probe] CUDA must not be initialised in the gradcert process: its rank processes
// are forked from it (NOTE [zygote]), and a child of a process that initialised CUDA cannot use
// CUDA. So the probe runs in a forked child that loads the driver itself (dlopen of
// libcuda.so.1, cuInit, cuDeviceGetCount; no CUDA header or library is linked) and writes one
// line back through a pipe. The three reasons it tells apart, in the order a user fixes them:
//   1. this binary was built against a CPU-only torch (GRADCERT_WITH_CUDA is unset; known without a child: the CUDA
//      build is scripts/bootstrap --cuda && scripts/build --cuda, binary build-cuda/gradcert);
//   2. no NVIDIA driver (libcuda.so.1 does not load);
//   3. the driver loads but has no device (cuInit or cuDeviceGetCount fail or count 0;
//      CUDA_VISIBLE_DEVICES is named, as it hides devices).
namespace {

#ifdef GRADCERT_WITH_CUDA
std::string probe_in_child() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    return std::string("0 no NVIDIA driver: libcuda.so.1 does not load (") + (e ? e : "?") + ")";
  }
  using init_fn = int (*)(unsigned);
  using count_fn = int (*)(int*);
  auto init = reinterpret_cast<init_fn>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<count_fn>(dlsym(lib, "cuDeviceGetCount"));
  if (!init || !count) return "0 the NVIDIA driver library lacks cuInit / cuDeviceGetCount";
  const char* vis = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string visible = vis ? std::string("; CUDA_VISIBLE_DEVICES='") + vis + "'" : "";
  if (int rc = init(0); rc != 0)
    return "0 no CUDA device: the driver loads but cuInit fails with CUresult " + std::to_string(rc) +
           (rc == 100 ? " (CUDA_ERROR_NO_DEVICE)" : "") + visible;
  int n = 0;
  if (int rc = count(&n); rc != 0)
    return "0 no CUDA device: cuDeviceGetCount fails with CUresult " + std::to_string(rc) + visible;
  if (n == 0) return "0 no CUDA device: the driver reports 0 devices" + visible;
  return std::to_string(n) + " ok";
}
#endif

}  // namespace

CudaProbe probe_cuda() {
#ifndef GRADCERT_WITH_CUDA
  return {0, "this gradcert is built against a CPU-only torch (no CUDA, no NCCL): build the CUDA variant with "
             "`scripts/bootstrap --cuda && scripts/build --cuda` and run build-cuda/gradcert"};  // no child needed
#else
  int fds[2];
  if (pipe(fds) != 0) return {0, "cannot probe CUDA: pipe() failed"};
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return {0, "cannot probe CUDA: fork() failed"};
  }
  if (pid == 0) {
    close(fds[0]);
    const std::string line = probe_in_child();
    ssize_t off = 0;
    while (off < static_cast<ssize_t>(line.size())) {
      const ssize_t w = write(fds[1], line.data() + off, line.size() - off);
      if (w <= 0) break;
      off += w;
    }
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  const size_t sp = out.find(' ');
  if (out.empty() || sp == std::string::npos)
    return {0, "cannot probe CUDA: the probe process ended without an answer (" +
                   std::string(WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status)) : "no output") + ")"};
  const int n = std::atoi(out.substr(0, sp).c_str());
  return n > 0 ? CudaProbe{n, ""} : CudaProbe{0, out.substr(sp + 1)};
#endif
}

// NOTE [device] --device (run, certify, audit, observe) or the spec's `device`: "cpu" (the
// default), "cuda", or "auto" (cuda where the probe finds a device, else cpu, and the run says
// which). It is resolved once, in the CLI, before an earlier report is cleared and before any
// rank starts, so a refusal (exit 2, one line: the probe's reason) leaves everything as it was.
// The resolved device reaches external stacks, the PyTorch adapters and the observe
// integrations as GRADCERT_DEVICE; the float64 reference stays on the CPU.
std::string resolve_device(const std::string& requested, const std::string& what) {
  if (requested == "cpu") return "cpu";
  if (requested != "cuda" && requested != "auto")
    throw std::invalid_argument(what + ": expected cpu, cuda or auto, got '" + requested + "'");
  const CudaProbe p = probe_cuda();
  if (p.count > 0) return "cuda";
  if (requested == "auto") return "cpu";
  throw std::runtime_error(what + " cuda: " + p.reason);
}

}  // namespace gradcert
