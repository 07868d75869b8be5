// The capped logs of a launch's ranks (NOTE [log cap]; rank_group.hpp).
#include "conformance/launch/rank_group.hpp"

#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace gradcert::launch_detail {

void CappedLog::write(const char* p, size_t n) {
  if (const int err = write_bytes(file, p, n); err && !write_error) write_error = err;
}

void CappedLog::take(const char* p, size_t n) {
  recent.append(p, n);
  if (recent.size() > 2 * kLogRecent) recent.erase(0, recent.size() - kLogRecent);
  if (total < kLogHead) {
    const size_t head = std::min<uint64_t>(n, kLogHead - total);
    write(p, head);
    total += head;
    p += head;
    n -= head;
  }
  total += n;
  tail.append(p, n);
  if (tail.size() > 2 * kLogTail) tail.erase(0, tail.size() - kLogTail);
}

void CappedLog::drain(size_t budget) {
  char buf[64 << 10];
  while (in >= 0 && budget > 0) {
    const ssize_t n = ::read(in, buf, std::min(sizeof buf, budget));
    if (n > 0) {
      take(buf, static_cast<size_t>(n));
      budget -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    ::close(in);  // end of output (or an error reading it)
    in = -1;
  }
}

void CappedLog::finish() {
  drain(SIZE_MAX);
  if (in >= 0) ::close(in), in = -1;
  if (file < 0) return;
  const uint64_t after_head = total > kLogHead ? total - kLogHead : 0;
  const size_t kept = static_cast<size_t>(std::min<uint64_t>(after_head, kLogTail));
  if (after_head > kept) {
    const std::string marker = "\n[... " + std::to_string(after_head - kept) + " bytes cut ...]\n";
    write(marker.data(), marker.size());
  }
  write(tail.data() + tail.size() - kept, kept);
  tail.clear();
  ::close(file);
  file = -1;
}

int Logs::add(const std::string& path) {
  CappedLog l;
  l.path = path;
  l.file = open_log(path);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(l.file);
    throw std::runtime_error("cannot make a pipe for log " + path + ": " + std::strerror(err));
  }
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  l.in = fds[0];
  logs.push_back(std::move(l));
  return fds[1];
}

void Logs::wait(std::chrono::milliseconds timeout, const std::vector<int>& wake) {
  std::vector<pollfd> fds;
  std::vector<CappedLog*> of;
  for (auto& l : logs)
    if (l.in >= 0) fds.push_back({l.in, POLLIN, 0}), of.push_back(&l);
  for (int fd : wake) fds.push_back({fd, POLLIN, 0});
  if (fds.empty()) {
    std::this_thread::sleep_for(timeout);
    return;
  }
  if (::poll(fds.data(), fds.size(), static_cast<int>(timeout.count())) <= 0) return;
  for (size_t i = 0; i < of.size(); ++i)
    if (fds[i].revents) of[i]->drain(4 << 20);
}

void Logs::finish() {
  for (auto& l : logs) l.finish();
}

const CappedLog* Logs::find(const std::string& path) const {
  for (const auto& l : logs)
    if (l.path == path) return &l;
  return nullptr;
}

}  // namespace gradcert::launch_detail
