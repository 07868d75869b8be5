// Tests for the ranks' rendezvous store (NOTE [rank store]): c10d's semantics, blocking calls
// answered by another client's write, timeouts that name the keys, and no hang when the server
// or a client goes away.
#include "conformance/launch/store.hpp"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>

namespace gradcert {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

StoreBytes b(const std::string& s) { return StoreBytes(s.begin(), s.end()); }
std::string s(const StoreBytes& v) { return std::string(v.begin(), v.end()); }

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

TEST(RankStore, HasC10dSemantics) {
  StoreServer server;
  EXPECT_EQ(server.address().rfind("@gradcert-store-", 0), 0u) << server.address();
  StoreClient c(server.address(), 5s);
  c.set("a", b("1"));
  EXPECT_EQ(s(c.get("a", 1s)), "1");
  c.set("a", b("x y"));  // a set replaces
  EXPECT_EQ(s(c.get("a", 1s)), "x y");
  EXPECT_EQ(c.add("n", 5), 5);  // absent counts as 0; kept as decimal text, as TCPStore's
  EXPECT_EQ(c.add("n", -7), -2);
  EXPECT_EQ(s(c.get("n", 1s)), "-2");
  // compareSet as TCPStore's: absent + empty expected sets; a mismatch returns what is held.
  EXPECT_EQ(s(c.compare_set("cs", {}, b("first"))), "first");
  EXPECT_EQ(s(c.compare_set("cs", b("other"), b("second"))), "first");
  EXPECT_EQ(s(c.compare_set("cs", b("first"), b("second"))), "second");
  EXPECT_EQ(s(c.compare_set("absent", b("e"), b("d"))), "e");
  EXPECT_FALSE(c.check({"absent"}));
  c.append("log", b("ab"));
  c.append("log", b("cd"));
  EXPECT_EQ(s(c.get("log", 1s)), "abcd");
  EXPECT_TRUE(c.check({"a", "n", "cs", "log"}));
  EXPECT_FALSE(c.check({"a", "nope"}));
  EXPECT_EQ(c.num_keys(), 4);
  EXPECT_TRUE(c.remove("a"));
  EXPECT_FALSE(c.remove("a"));
  EXPECT_EQ(c.num_keys(), 3);
  const StoreBytes binary = {0, 255, 7, 0, 10};  // values are bytes, NULs included
  c.set("bin", binary);
  EXPECT_EQ(c.get("bin", 1s), binary);
  try {
    c.add("log", 1);
    FAIL() << "add on a non-integer value was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("key 'log' holds 'abcd', not an integer"), std::string::npos) << e.what();
  }
}

TEST(RankStore, GetAndWaitBlockUntilAnotherClientWrites) {
  StoreServer server;
  StoreClient waiter(server.address(), 5s), other_waiter(server.address(), 5s), writer(server.address(), 5s);
  const auto t0 = Clock::now();
  auto got = std::async(std::launch::async, [&] { return s(waiter.get("addr/1", 10s)); });
  auto waited = std::async(std::launch::async, [&] {
    other_waiter.wait({"addr/0", "addr/1"}, 10s);
    return seconds_since(t0);
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(got.wait_for(0s), std::future_status::timeout) << "get returned before the key was set";
  writer.set("addr/1", b("peer one"));
  EXPECT_EQ(got.get(), "peer one");
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(waited.wait_for(0s), std::future_status::timeout) << "wait returned with addr/0 missing";
  writer.add("addr/0", 1);
  const double when = waited.get();
  EXPECT_GE(when, 0.3);
  EXPECT_LT(when, 5.0);
}

TEST(RankStore, ATimeoutNamesTheKeysAndEndsTheConnection) {
  StoreServer server;
  StoreClient c(server.address(), 5s);
  const auto t0 = Clock::now();
  try {
    c.wait({"rank/0", "rank/1"}, 300ms);
    FAIL() << "wait on keys nobody sets returned";
  } catch (const StoreTimeout& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(server.address()), std::string::npos) << m;
    EXPECT_NE(m.find("timed out after 0.3 s waiting for keys 'rank/0', 'rank/1'"), std::string::npos) << m;
  }
  const double took = seconds_since(t0);
  EXPECT_GE(took, 0.29);
  EXPECT_LT(took, 3.0);
  try {  // a late reply must not be read as the answer to the next call
    c.set("x", b("1"));
    FAIL() << "a connection out of step was reused";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("closed after an earlier failure"), std::string::npos) << e.what();
  }
  StoreClient fresh(server.address(), 5s);  // the server still serves others
  fresh.set("rank/0", b("here"));
  EXPECT_TRUE(fresh.check({"rank/0"}));
}

TEST(RankStore, AGoneServerOrClientIsAnErrorNotAHang) {
  std::string address;
  {
    auto server = std::make_unique<StoreServer>();
    address = server->address();
    StoreClient c(address, 5s);
    auto got = std::async(std::launch::async, [&] { return s(c.get("never", 20s)); });
    std::this_thread::sleep_for(100ms);
    StoreClient quitter(address, 5s);
    auto lost = std::async(std::launch::async, [&] {
      try {
        quitter.get("never", 20s);
      } catch (const std::exception&) {}
    });
    std::this_thread::sleep_for(50ms);
    const auto t0 = Clock::now();
    server.reset();  // the harness ends while ranks wait
    try {
      got.get();
      FAIL() << "get returned a value from a store that ended";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("closed the connection"), std::string::npos) << e.what();
    }
    EXPECT_LT(seconds_since(t0), 3.0);
    lost.get();
  }
  try {
    StoreClient late(address, 1s);
    FAIL() << "connected to a store that ended";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot connect"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(address), std::string::npos) << e.what();
  }
}

TEST(RankStore, ABadMessageDropsOnlyThatConnection) {
  StoreServer server;
  StoreClient good(server.address(), 5s);
  good.set("k", b("v"));
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, server.address().data(), server.address().size());
  sa.sun_path[0] = '\0';
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa),
                      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + server.address().size())),
            0);
  const char junk[] = "\xff\xff\xff\xffGET / HTTP/1.0\r\n\r\n";
  ASSERT_GT(::write(fd, junk, sizeof junk - 1), 0);
  char buf[16];
  EXPECT_EQ(::read(fd, buf, sizeof buf), 0) << "the server kept a connection that sent no store message";
  ::close(fd);
  EXPECT_EQ(s(good.get("k", 1s)), "v");
}

}  // namespace
}  // namespace gradcert
