// Protocol versions from the client's side (docs/clients.md, "Protocol versions"): the version each client
// reports, the one it says in its hello, and the refusal of a worker that serves another one, surfaced as the
// attach's error.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstring>
#include <string>
#include <thread>

#include "client/dspark_client.h"
#include "client/dspark_client.hpp"
#include "lib/host/listener.hpp"
#include "lib/host/socket_io.hpp"
#include "lib/host/socket_path.hpp"
#include "test_util.hpp"

namespace dspark::test {
namespace {

using namespace std::chrono_literals;

TEST(ClientVersions, EveryClientReportsTheHeadersVersion) {
  EXPECT_EQ(dspark_protocol_version(), 7u);
  EXPECT_EQ(dspark_protocol_version(), host::kProtocolVersion);
  EXPECT_EQ(dspark::protocol_version(), host::kProtocolVersion);
}

// A worker of the next protocol version that serves only that one: it answers one hello with `reply` (sent as
// `bytes` bytes) and records the hello's version.
class FutureWorker {
 public:
  FutureWorker(const std::string& name, const host::SocketReply& reply, size_t bytes)
      : listener_(host::socket_path(name), std::nullopt), thread_([this, reply, bytes] {
          pollfd p{listener_.fd(), POLLIN, 0};
          if (poll(&p, 1, 5000) != 1) return;
          host::UniqueFd conn(accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC));
          host::SocketHello hello{};
          if (host::receive_message(conn.get(), &hello, sizeof(hello), 5s) != host::Received::message) return;
          hello_version_ = hello.version;
          (void)host::send_message(conn.get(), &reply, bytes);
        }) {}
  ~FutureWorker() { join(); }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  uint32_t hello_version() const { return hello_version_; }  // after join()

 private:
  host::Listener listener_;
  uint32_t hello_version_ = 0;
  std::thread thread_;
};

constexpr uint32_t kFuture = host::kProtocolVersion + 1;

host::SocketReply future_reply(host::Admission admission, const char* reason) {
  host::SocketReply r{};
  r.head.magic = host::kSocketMagic;
  r.head.version = kFuture;
  r.head.admission = static_cast<uint32_t>(admission);
  std::strncpy(r.head.reason, reason, sizeof(r.head.reason) - 1);
  return r;
}

TEST(ClientVersions, AWorkerThatServesAnotherVersionIsAClearError) {
  // The rule's refusal: the frozen head alone, its reason naming both versions.
  const std::string name = unique_ring_name();
  {
    const std::string why =
        fmt::format("the client speaks protocol version {}; this worker serves protocol version {}",
                    host::kProtocolVersion, kFuture);
    FutureWorker w(name, future_reply(host::Admission::refused, why.c_str()), sizeof(host::SocketReplyHead));
    dspark_client* c = nullptr;
    EXPECT_EQ(dspark_attach(name.c_str(), 5000, &c), DSPARK_UNAVAILABLE);
    EXPECT_EQ(c, nullptr);
    EXPECT_EQ(std::string(dspark_last_error(nullptr)), "attach " + name + ": " + why);
    dspark_detach(c);
  }
  // A worker that answers in its own version without a reason: the client names both versions itself.
  const std::string other = unique_ring_name();
  FutureWorker w(other, future_reply(host::Admission::accepted, ""), sizeof(host::SocketReply));
  dspark_client* c = nullptr;
  EXPECT_EQ(dspark_attach(other.c_str(), 5000, &c), DSPARK_UNAVAILABLE);
  EXPECT_EQ(std::string(dspark_last_error(nullptr)),
            fmt::format(
                "attach {}: the worker (pid {}) at {} answers in protocol version {}; this client speaks {}",
                other, getpid(), host::socket_path(other), kFuture, host::kProtocolVersion));
  dspark_detach(c);
}

TEST(ClientVersions, TheHelloSaysTheVersionTheClientSpeaks) {
  const std::string name = unique_ring_name();
  FutureWorker w(name, future_reply(host::Admission::refused, "no"), sizeof(host::SocketReplyHead));
  dspark_client* c = nullptr;
  EXPECT_EQ(dspark_attach(name.c_str(), 5000, &c), DSPARK_UNAVAILABLE);
  w.join();
  EXPECT_EQ(w.hello_version(), host::kProtocolVersion);
}

}  // namespace
}  // namespace dspark::test
