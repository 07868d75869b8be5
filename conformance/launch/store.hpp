// The ranks' rendezvous store: served by the harness on a Unix socket, spoken by the ranks'
// c10d::Store (conformance/run/rank_store.hpp). NOTE [rank store] in store.cpp says why it is
// not c10d's TCPStore.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradcert {

/// A key or value of the store: bytes.
using StoreBytes = std::vector<uint8_t>;

/// A blocking call (get, wait) that outlasted its timeout; the message names the keys.
struct StoreTimeout : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A key-value store for the ranks' rendezvous, served on a thread of this process over an
/// abstract Unix socket. get and wait block (in the client) until every key named exists.
class StoreServer {
 public:
  /// Binds a fresh abstract socket and starts serving; throws naming the cause.
  StoreServer();
  /// Stops serving and closes every connection: a client still waiting sees the store end.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  /// What a client connects to: "@gradcert-store-<pid>-<n>-<tag>" (the @ stands for the NUL
  /// that starts an abstract name).
  const std::string& address() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// One connection to a StoreServer: the c10d Store operations, one round trip each. Not
/// thread-safe. Errors throw std::runtime_error naming the address (and the key); a blocking
/// call past its timeout throws StoreTimeout and closes the connection.
class StoreClient {
 public:
  /// Connects to `address` (a StoreServer's; a leading @ is an abstract name, else a path).
  /// `timeout` bounds every reply of a call that does not block.
  StoreClient(const std::string& address, std::chrono::milliseconds timeout);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const StoreBytes& value);
  /// The value of `key`, waiting up to `timeout` until some client sets it.
  StoreBytes get(const std::string& key, std::chrono::milliseconds timeout);
  /// Adds `delta` to the integer held at `key` (0 when absent); returns the sum.
  int64_t add(const std::string& key, int64_t delta);
  /// c10d's compareSet: sets `desired` when the value is `expected` (absent counts as an
  /// empty `expected`); returns the value now held (or `expected` when absent and not set).
  StoreBytes compare_set(const std::string& key, const StoreBytes& expected, const StoreBytes& desired);
  /// Appends to the value at `key` (creating it).
  void append(const std::string& key, const StoreBytes& value);
  /// Whether every key exists now.
  bool check(const std::vector<std::string>& keys);
  /// Waits up to `timeout` until every key exists.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  /// Removes `key`; whether it existed.
  bool remove(const std::string& key);
  int64_t num_keys();

 private:
  std::vector<StoreBytes> call(const std::vector<StoreBytes>& request, std::chrono::milliseconds timeout,
                               const std::string& waiting_for);
  std::string address_;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;
};

}  // namespace gradcert
