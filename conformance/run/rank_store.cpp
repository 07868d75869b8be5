#include "conformance/run/rank_store.hpp"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <mutex>

#include "conformance/launch/store.hpp"

namespace gradcert {
namespace {

// Every call is one round trip on one connection, under a lock (c10d may share a store between
// threads); clone() opens another connection. Failures become c10d's DistStoreError.
class RankStore final : public c10d::Store {
 public:
  RankStore(const std::string& address, std::chrono::milliseconds timeout)
      : Store(timeout),
        address_(address),
        client_(guarded([&] { return std::make_unique<StoreClient>(address, timeout); })) {}

  c10::intrusive_ptr<c10d::Store> clone() override { return c10::make_intrusive<RankStore>(address_, timeout_); }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    locked([&] { client_->set(key, value); });
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return locked([&] { return client_->compare_set(key, expected, desired); });
  }
  std::vector<uint8_t> get(const std::string& key) override {
    return locked([&] { return client_->get(key, timeout_); });
  }
  int64_t add(const std::string& key, int64_t value) override {
    return locked([&] { return client_->add(key, value); });
  }
  bool deleteKey(const std::string& key) override {
    return locked([&] { return client_->remove(key); });
  }
  bool check(const std::vector<std::string>& keys) override {
    return locked([&] { return client_->check(keys); });
  }
  int64_t getNumKeys() override {
    return locked([&] { return client_->num_keys(); });
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    locked([&] { client_->wait(keys, timeout); });
  }
  void append(const std::string& key, const std::vector<uint8_t>& value) override {
    locked([&] { client_->append(key, value); });
  }

 private:
  template <typename F>
  static auto guarded(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const std::exception& e) {
      C10_THROW_ERROR(DistStoreError, e.what());
    }
  }
  template <typename F>
  auto locked(F&& f) -> decltype(f()) {
    std::lock_guard<std::mutex> lock(mutex_);
    return guarded(f);
  }

  std::string address_;
  std::mutex mutex_;
  std::unique_ptr<StoreClient> client_;
};

}  // namespace

c10::intrusive_ptr<c10d::Store> connect_rank_store(const std::string& address, std::chrono::milliseconds timeout) {
  return c10::make_intrusive<RankStore>(address, timeout);
}

}  // namespace gradcert
