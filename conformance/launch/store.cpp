#include "conformance/launch/store.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <thread>

namespace gradcert {

// NOTE [rank store] The ranks meet (Gloo's rendezvous: each rank sets its address, waits for
// and reads its peers') through a key-value store that the harness serves for the life of a run
// (NOTE [store] in harness.cpp). It was c10d's TCPStore on 127.0.0.1. Its client prefers IPv6,
// so it connects to ::ffff:127.0.0.1, and it names the peer of every socket it makes with
// getnameinfo() without NI_NUMERICHOST: a reverse DNS lookup of the v4-mapped address, which
// /etc/hosts does not answer. Where the resolver is slow or drops a query, a rank's store
// client stalls for the resolver's timeout: on the CPU machine here, one such lookup in 50
// took exactly 5.0 s (resolv.conf's default), and 1-2 launches of each `gradcert certify`
// stalled 5.0 s in the TCPStore client constructor. A rank's rendezvous has no business with
// DNS, so the harness serves this small store on an abstract Unix socket instead: no name
// lookup, no port to pick, nothing another process can take first. Its semantics are c10d's
// (get and wait block until the keys exist, add keeps decimal text, compareSet as TCPStore's),
// the ranks speak it through a c10d::Store (conformance/run/rank_store.cpp), and a blocking
// call's timeout is the client's: a rank that never arrives fails its peers' rendezvous after
// timeout.collective_s with the keys named. The server's map lives on its own thread; one
// pending blocking call per connection (clients are synchronous) is answered when a write
// makes it whole.
//
// Messages both ways: u32 field count, then each field as u32 length + bytes (little endian,
// as the machine's). A request's first field is the operation; a reply's is "ok" or "error".

namespace {

constexpr uint32_t kMaxFields = 1u << 16;
constexpr uint32_t kMaxField = 64u << 20;

void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }

std::string encode(const std::vector<StoreBytes>& fields) {
  std::string out;
  put_u32(out, static_cast<uint32_t>(fields.size()));
  for (const auto& f : fields) {
    put_u32(out, static_cast<uint32_t>(f.size()));
    out.append(reinterpret_cast<const char*>(f.data()), f.size());
  }
  return out;
}

enum class Parse { Complete, Partial, Bad };

// One message from the front of `in`: its fields and the bytes it took.
Parse decode(const std::string& in, std::vector<StoreBytes>& fields, size_t& used) {
  size_t pos = 0;
  auto u32 = [&](uint32_t& v) {
    if (in.size() - pos < sizeof v) return false;
    std::memcpy(&v, in.data() + pos, sizeof v);
    pos += sizeof v;
    return true;
  };
  uint32_t n = 0;
  if (!u32(n)) return Parse::Partial;
  if (n == 0 || n > kMaxFields) return Parse::Bad;
  fields.clear();
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t len = 0;
    if (!u32(len)) return Parse::Partial;
    if (len > kMaxField) return Parse::Bad;
    if (in.size() - pos < len) return Parse::Partial;
    fields.emplace_back(in.begin() + static_cast<std::ptrdiff_t>(pos),
                        in.begin() + static_cast<std::ptrdiff_t>(pos + len));
    pos += len;
  }
  used = pos;
  return Parse::Complete;
}

StoreBytes bytes(const std::string& s) { return StoreBytes(s.begin(), s.end()); }
std::string text(const StoreBytes& b) { return std::string(b.begin(), b.end()); }

// sockaddr_un for an address: "@name" is abstract (a leading NUL), anything else a path.
socklen_t unix_address(const std::string& address, sockaddr_un& sa) {
  sa = {};
  sa.sun_family = AF_UNIX;
  if (address.empty() || address.size() >= sizeof sa.sun_path)
    throw std::runtime_error("store address '" + address + "': must have 1 to " +
                             std::to_string(sizeof sa.sun_path - 1) + " characters");
  std::memcpy(sa.sun_path, address.data(), address.size());
  if (address[0] == '@') sa.sun_path[0] = '\0';
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size());
}

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// The server

struct StoreServer::State {
  std::string address;
  int listen_fd = -1;
  int wake[2] = {-1, -1};  // the destructor writes a byte: the thread ends
  std::thread thread;

  struct Connection {
    int fd = -1;
    std::string in, out;
    std::vector<StoreBytes> pending;  // a get or wait that waits for keys (empty: none)
  };
  std::map<std::string, StoreBytes> data;
  std::vector<Connection> connections;

  bool has_all(const std::vector<StoreBytes>& f, size_t from) const {
    for (size_t i = from; i < f.size(); ++i)
      if (!data.count(text(f[i]))) return false;
    return true;
  }

  // The reply to a request; false (no reply yet) for a get or wait whose keys are missing.
  bool answer(const std::vector<StoreBytes>& f, std::vector<StoreBytes>& reply, bool& wrote) {
    const std::string op = text(f[0]);
    auto args = [&](size_t n) {
      if (f.size() != n + 1)
        throw std::invalid_argument("operation '" + op + "' takes " + std::to_string(n) + " fields, got " +
                                    std::to_string(f.size() - 1));
    };
    reply = {bytes("ok")};
    if (op == "set") {
      args(2);
      data[text(f[1])] = f[2];
      wrote = true;
    } else if (op == "get") {
      args(1);
      auto it = data.find(text(f[1]));
      if (it == data.end()) return false;
      reply.push_back(it->second);
    } else if (op == "add") {
      args(2);
      const std::string key = text(f[1]);
      int64_t now = 0;
      if (auto it = data.find(key); it != data.end()) {
        const std::string held = text(it->second);
        size_t used = 0;
        try {
          now = std::stoll(held, &used);
        } catch (const std::exception&) {
          used = std::string::npos;
        }
        if (used != held.size()) throw std::invalid_argument("key '" + key + "' holds '" + held + "', not an integer");
      }
      now += std::stoll(text(f[2]));
      data[key] = bytes(std::to_string(now));
      reply.push_back(bytes(std::to_string(now)));
      wrote = true;
    } else if (op == "compare_set") {
      args(3);
      const std::string key = text(f[1]);
      auto it = data.find(key);
      if (it == data.end() ? f[2].empty() : it->second == f[2]) {
        data[key] = f[3];
        reply.push_back(f[3]);
        wrote = true;
      } else {
        reply.push_back(it == data.end() ? f[2] : it->second);
      }
    } else if (op == "append") {
      args(2);
      auto& v = data[text(f[1])];
      v.insert(v.end(), f[2].begin(), f[2].end());
      wrote = true;
    } else if (op == "check") {
      reply.push_back(bytes(has_all(f, 1) ? "1" : "0"));
    } else if (op == "wait") {
      if (!has_all(f, 1)) return false;
    } else if (op == "delete") {
      args(1);
      reply.push_back(bytes(data.erase(text(f[1])) ? "1" : "0"));
    } else if (op == "num_keys") {
      args(0);
      reply.push_back(bytes(std::to_string(data.size())));
    } else {
      throw std::invalid_argument("unknown operation '" + op + "'");
    }
    return true;
  }

  // Serves what `c` has sent, one request at a time; a waiting request holds the rest back.
  void serve(Connection& c, bool& wrote) {
    std::vector<StoreBytes> f, reply;
    while (c.pending.empty()) {
      size_t used = 0;
      const Parse p = decode(c.in, f, used);
      if (p == Parse::Partial) return;
      if (p == Parse::Bad) {  // not a client of this store: drop it
        ::close(c.fd);
        c.fd = -1;
        return;
      }
      c.in.erase(0, used);
      try {
        if (!answer(f, reply, wrote)) {
          c.pending = f;
          return;
        }
      } catch (const std::exception& e) {
        reply = {bytes("error"), bytes(e.what())};
      }
      c.out += encode(reply);
    }
  }

  // After a write: every waiting request that the keys now satisfy is answered.
  void release_waiters() {
    bool wrote = true;
    while (wrote) {
      wrote = false;
      for (auto& c : connections) {
        if (c.fd < 0 || c.pending.empty()) continue;
        std::vector<StoreBytes> reply;
        bool w = false;
        if (answer(c.pending, reply, w)) {
          c.pending.clear();
          c.out += encode(reply);
          serve(c, wrote);  // requests queued behind it
        }
      }
    }
  }

  void flush(Connection& c) {
    while (!c.out.empty()) {
      const ssize_t k = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (k <= 0) {  // the client is gone
        ::close(c.fd);
        c.fd = -1;
        return;
      }
      c.out.erase(0, static_cast<size_t>(k));
    }
  }

  void run() {
    std::vector<pollfd> fds;
    for (;;) {
      fds.assign({{wake[0], POLLIN, 0}, {listen_fd, POLLIN, 0}});
      for (const auto& c : connections)
        fds.push_back({c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[0].revents) return;
      bool wrote = false;
      for (size_t i = 0; i < connections.size(); ++i) {
        Connection& c = connections[i];
        const short ev = fds[i + 2].revents;
        if (ev & (POLLIN | POLLHUP | POLLERR)) {
          char buf[65536];
          const ssize_t k = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
          if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR && errno != EWOULDBLOCK)) {
            ::close(c.fd);
            c.fd = -1;
            continue;
          }
          if (k > 0) {
            c.in.append(buf, static_cast<size_t>(k));
            serve(c, wrote);
          }
        }
      }
      if (wrote) release_waiters();
      for (auto& c : connections)
        if (c.fd >= 0) flush(c);
      connections.erase(
          std::remove_if(connections.begin(), connections.end(), [](const Connection& c) { return c.fd < 0; }),
          connections.end());
      if (fds[1].revents & POLLIN) {
        const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) connections.push_back({fd, {}, {}, {}});
      }
    }
  }
};

StoreServer::StoreServer() : state_(std::make_unique<State>()) {
  static std::atomic<int> serial{0};
  std::random_device rd;
  for (int attempt = 0; state_->listen_fd < 0; ++attempt) {
    char tag[16];
    std::snprintf(tag, sizeof tag, "%08x", static_cast<unsigned>(rd()));
    const std::string address =
        "@gradcert-store-" + std::to_string(::getpid()) + "-" + std::to_string(serial++) + "-" + tag;
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error("rank store: socket: " + errno_text(errno));
    sockaddr_un sa;
    const socklen_t len = unix_address(address, sa);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0 || ::listen(fd, 1024) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EADDRINUSE && attempt < 8) continue;
      throw std::runtime_error("rank store: cannot listen on " + address + ": " + errno_text(err));
    }
    state_->listen_fd = fd;
    state_->address = address;
  }
  if (::pipe2(state_->wake, O_CLOEXEC) != 0) {
    ::close(state_->listen_fd);
    throw std::runtime_error("rank store: pipe: " + errno_text(errno));
  }
  state_->thread = std::thread([s = state_.get()] { s->run(); });
}

StoreServer::~StoreServer() {
  const char b = 1;
  while (::write(state_->wake[1], &b, 1) < 0 && errno == EINTR) {}
  state_->thread.join();
  for (auto& c : state_->connections)
    if (c.fd >= 0) ::close(c.fd);
  ::close(state_->listen_fd);
  ::close(state_->wake[0]);
  ::close(state_->wake[1]);
}

const std::string& StoreServer::address() const { return state_->address; }

// ---------------------------------------------------------------------------------------------
// The client

StoreClient::StoreClient(const std::string& address, std::chrono::milliseconds timeout)
    : address_(address), timeout_(timeout) {
  sockaddr_un sa;
  const socklen_t len = unix_address(address, sa);
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw std::runtime_error("rank store " + address + ": socket: " + errno_text(errno));
  int r;
  do {
    r = ::connect(fd_, reinterpret_cast<sockaddr*>(&sa), len);
  } while (r != 0 && errno == EINTR);
  if (r != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error("rank store " + address + ": cannot connect: " + errno_text(err) +
                             (err == ECONNREFUSED ? " (no store is served there: has the harness ended?)" : ""));
  }
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<StoreBytes> StoreClient::call(const std::vector<StoreBytes>& request, std::chrono::milliseconds timeout,
                                          const std::string& waiting_for) {
  const std::string op = text(request[0]);
  auto fail = [&](const std::string& why) -> std::runtime_error {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;  // the conversation is out of step: nothing more goes over this connection
    return std::runtime_error("rank store " + address_ + ": " + op + ": " + why);
  };
  if (fd_ < 0)
    throw std::runtime_error("rank store " + address_ + ": " + op +
                             ": the connection was closed after an earlier failure");
  const std::string out = encode(request);
  for (size_t sent = 0; sent < out.size();) {
    const ssize_t k = ::send(fd_, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw fail("cannot send: " + errno_text(errno) + " (the store's server is gone)");
    sent += static_cast<size_t>(k);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string in;
  std::vector<StoreBytes> reply;
  for (;;) {
    size_t used = 0;
    const Parse p = decode(in, reply, used);
    if (p == Parse::Bad) throw fail("the reply is not a store message");
    if (p == Parse::Complete) break;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd pfd{fd_, POLLIN, 0};
    const int r = left.count() > 0 ? ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30))) : 0;
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      const double s = std::chrono::duration<double>(timeout).count();
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", s);
      const std::string why =
          "timed out after " + std::string(secs) + " s" +
          (waiting_for.empty() ? " waiting for the reply"
                               : " waiting for " + waiting_for +
                                     " (no rank set it: a peer that died, or never reached the rendezvous)");
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
      throw StoreTimeout("rank store " + address_ + ": " + op + ": " + why);
    }
    char buf[65536];
    const ssize_t k = ::recv(fd_, buf, sizeof buf, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw fail(k == 0 ? "the store's server closed the connection" : "cannot read: " + errno_text(errno));
    in.append(buf, static_cast<size_t>(k));
  }
  if (text(reply[0]) != "ok") throw fail(reply.size() > 1 ? text(reply[1]) : "the server refused the request");
  reply.erase(reply.begin());
  return reply;
}

namespace {
std::string keys_text(const std::vector<std::string>& keys) {
  std::string s = keys.size() == 1 ? "key " : "keys ";
  for (size_t i = 0; i < keys.size(); ++i) s += (i ? ", '" : "'") + keys[i] + "'";
  return s;
}
}  // namespace

void StoreClient::set(const std::string& key, const StoreBytes& value) {
  call({bytes("set"), bytes(key), value}, timeout_, "");
}

StoreBytes StoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  return call({bytes("get"), bytes(key)}, timeout, keys_text({key})).at(0);
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  return std::stoll(text(call({bytes("add"), bytes(key), bytes(std::to_string(delta))}, timeout_, "").at(0)));
}

StoreBytes StoreClient::compare_set(const std::string& key, const StoreBytes& expected, const StoreBytes& desired) {
  return call({bytes("compare_set"), bytes(key), expected, desired}, timeout_, "").at(0);
}

void StoreClient::append(const std::string& key, const StoreBytes& value) {
  call({bytes("append"), bytes(key), value}, timeout_, "");
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  std::vector<StoreBytes> req = {bytes("check")};
  for (const auto& k : keys) req.push_back(bytes(k));
  return text(call(req, timeout_, "").at(0)) == "1";
}

void StoreClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<StoreBytes> req = {bytes("wait")};
  for (const auto& k : keys) req.push_back(bytes(k));
  call(req, timeout, keys_text(keys));
}

bool StoreClient::remove(const std::string& key) {
  return text(call({bytes("delete"), bytes(key)}, timeout_, "").at(0)) == "1";
}

int64_t StoreClient::num_keys() { return std::stoll(text(call({bytes("num_keys")}, timeout_, "").at(0))); }

}  // namespace gradcert
