// The C API when things go wrong: a killed, stopped or hung worker, answers that come too late, a second
// host, a dead previous host. Every call must come back (UNAVAILABLE with a reason), never hang.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <thread>

#include "client/dspark_client.h"
#include "fake_worker.hpp"
#include "lib/host/socket_path.hpp"
#include "test_util.hpp"

namespace dspark::test {
namespace {

using namespace std::chrono_literals;

std::string last_error(const dspark_client* c) {
  return dspark_last_error(c);
}

// Kills and reaps a forked child when a test ends early.
struct Child {
  pid_t pid = -1;
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

// Forked children run before any thread of this process exists (gtest runs one test per process under ctest,
// and each test joins its threads), so they may use threads and the heap freely.
[[noreturn]] void run_fake_forever(const std::string& name, FakeOptions o) {
  try {
    FakeWorker w(name, o);
    for (;;) pause();
  } catch (...) {
  }
  _exit(1);
}

TEST(ClientLiveness, KilledWorkerEndsTheWait) {
  const std::string name = unique_ring_name();
  Child worker;
  worker.pid = fork();
  ASSERT_GE(worker.pid, 0);
  if (worker.pid == 0) {
    FakeOptions o;
    o.answer_steps = false;
    run_fake_forever(name, o);
  }
  Attached a(name, 10000);
  ASSERT_EQ(a.status, DSPARK_OK) << dspark_last_error(nullptr);
  std::thread killer([&] {
    std::this_thread::sleep_for(300ms);
    kill(worker.pid, SIGKILL);
    waitpid(worker.pid, nullptr, 0);  // a zombie would still look alive to kill(pid, 0)
    worker.pid = -1;
  });
  const auto t0 = std::chrono::steady_clock::now();
  const dspark_draft_request req{0, 1, 5, -1, 0, 0, 0};
  const dspark_status s = dspark_draft(a.c, &req, 1, 1, {});  // the default 30 s timeout
  const double waited = seconds_since(t0);
  killer.join();
  EXPECT_EQ(s, DSPARK_UNAVAILABLE);
  EXPECT_LT(waited, 1.0);
  EXPECT_NE(last_error(a.c).find("gone"), std::string::npos) << last_error(a.c);
  // Later calls fail at once.
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(dspark_stats_get(a.c, nullptr), DSPARK_INVALID_ARGUMENT);
  dspark_stats st{};
  EXPECT_EQ(dspark_stats_get(a.c, &st), DSPARK_UNAVAILABLE);
  EXPECT_LT(seconds_since(t1), 0.1);
  ::unlink(host::socket_path(name).c_str());  // the killed worker could not remove its socket
}

TEST(ClientLiveness, NoAnswerInTimeIsUnavailableAndTheLateAnswerIsSkipped) {
  const std::string name = unique_ring_name();
  FakeOptions o;
  o.answer_delay_ms = 600;
  FakeWorker w(name, o);
  Attached a(name, 5000);
  ASSERT_EQ(a.status, DSPARK_OK);
  dspark_set_timeout(a.c, 200);
  const dspark_draft_request first{0, 1, 5, -1, 0, 0, 0}, second{2, 9, 11, -1, 0, 0, 0};
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(dspark_draft(a.c, &first, 1, 1, {}), DSPARK_UNAVAILABLE);
  const double waited = seconds_since(t0);
  EXPECT_GE(waited, 0.19);
  EXPECT_LT(waited, 0.5);
  EXPECT_NE(last_error(a.c).find("no answer"), std::string::npos) << last_error(a.c);
  // The first request's answer arrives while the second waits: it must not be taken for the second's.
  dspark_set_timeout(a.c, 5000);
  int32_t ids[5] = {};
  ASSERT_EQ(dspark_draft(a.c, &second, 1, 1, {ids, nullptr, nullptr, nullptr}), DSPARK_OK) << last_error(a.c);
  int32_t id = 0;
  float c = 0, l = 0, g = 0;
  fake_draft(fake_model(), {2, 9, 11, -1, 0}, true, 0, id, c, l, g);
  EXPECT_EQ(ids[0], id);
}

TEST(ClientLiveness, StoppedWorkerEndsTheWait) {
  const std::string name = unique_ring_name();
  FakeOptions o;
  o.answer_steps = false;
  FakeWorker w(name, o);
  Attached a(name, 5000);
  ASSERT_EQ(a.status, DSPARK_OK);
  std::thread stopper([&] {
    std::this_thread::sleep_for(200ms);
    w.set_state(host::WorkerState::stopped);
  });
  const auto t0 = std::chrono::steady_clock::now();
  const dspark_draft_request req{0, 1, 5, -1, 0, 0, 0};
  EXPECT_EQ(dspark_draft(a.c, &req, 1, 1, {}), DSPARK_UNAVAILABLE);
  stopper.join();
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_NE(last_error(a.c).find("stopped"), std::string::npos) << last_error(a.c);
}

TEST(ClientLiveness, HungWorkerHeartbeatEndsTheWait) {
  const std::string name = unique_ring_name();
  FakeOptions o;
  o.answer_steps = false;
  FakeWorker w(name, o);
  Attached a(name, 5000);
  ASSERT_EQ(a.status, DSPARK_OK);
  w.freeze_heartbeat(10s);
  const auto t0 = std::chrono::steady_clock::now();
  const dspark_draft_request req{0, 1, 5, -1, 0, 0, 0};
  EXPECT_EQ(dspark_draft(a.c, &req, 1, 1, {}), DSPARK_UNAVAILABLE);
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_NE(last_error(a.c).find("heartbeat"), std::string::npos) << last_error(a.c);
}

TEST(ClientLiveness, DroppedHostIsToldToAttachAgain) {
  const std::string name = unique_ring_name();
  FakeWorker w(name);
  Attached a(name, 5000);
  ASSERT_EQ(a.status, DSPARK_OK);
  w.drop_host();  // as a worker that found this host lost
  ASSERT_TRUE(eventually([&] { return w.host_pid() == 0; }));
  dspark_health h{};
  EXPECT_EQ(dspark_health_get(a.c, &h), DSPARK_UNAVAILABLE);
  EXPECT_NE(last_error(a.c).find("attach again"), std::string::npos) << last_error(a.c);
}

TEST(ClientLiveness, SecondHostIsRefusedWhileTheFirstLives) {
  const std::string name = unique_ring_name();
  int go[2], result[2];
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(result), 0);
  Child first;
  first.pid = fork();
  ASSERT_GE(first.pid, 0);
  if (first.pid == 0) {  // the first host: attach on "go", detach on the second byte
    char b = 0;
    if (read(go[0], &b, 1) != 1) _exit(2);
    dspark_client* c = nullptr;
    const auto s = static_cast<char>(dspark_attach(name.c_str(), 5000, &c));
    if (write(result[1], &s, 1) != 1) _exit(2);
    if (read(go[0], &b, 1) != 1) _exit(2);
    dspark_detach(c);
    _exit(0);
  }
  FakeWorker w(name);
  char b = 1;
  ASSERT_EQ(write(go[1], &b, 1), 1);
  ASSERT_EQ(read(result[0], &b, 1), 1);
  ASSERT_EQ(b, DSPARK_OK);
  EXPECT_EQ(w.host_pid(), first.pid);

  dspark_client* c = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(dspark_attach(name.c_str(), 5000, &c), DSPARK_UNAVAILABLE);
  EXPECT_LT(seconds_since(t0), 1.0);  // refused at once, not at the timeout
  EXPECT_NE(last_error(nullptr).find("another host (pid " + std::to_string(first.pid) + ")"),
            std::string::npos)
      << last_error(nullptr);
  EXPECT_EQ(w.host_pid(), first.pid);  // untouched
  EXPECT_EQ(w.refused(), 1u);

  ASSERT_EQ(write(go[1], &b, 1), 1);  // the first host detaches and exits
  int status = 0;
  ASSERT_EQ(waitpid(first.pid, &status, 0), first.pid);
  first.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  Attached second(name, 5000);
  EXPECT_EQ(second.status, DSPARK_OK) << last_error(nullptr);
  for (int fd : {go[0], go[1], result[0], result[1]}) close(fd);
}

// A host that dies attached (no detach: the kernel closes its socket) is released at once, and the next host
// attaches without waiting for a timeout.
TEST(ClientLiveness, DeadPreviousHostIsReleasedByTheWorker) {
  const std::string name = unique_ring_name();
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  const pid_t host = fork();  // before the fake's threads exist
  ASSERT_GE(host, 0);
  if (host == 0) {
    char b = 0;
    if (read(go[0], &b, 1) != 1) _exit(2);
    dspark_client* c = nullptr;
    _exit(dspark_attach(name.c_str(), 5000, &c) == DSPARK_OK ? 0 : 1);
  }
  FakeWorker w(name);
  const char b = 1;
  ASSERT_EQ(write(go[1], &b, 1), 1);
  close(go[0]);
  close(go[1]);
  int status = 0;
  ASSERT_EQ(waitpid(host, &status, 0), host);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  Attached a(name, 5000);
  EXPECT_EQ(a.status, DSPARK_OK) << last_error(nullptr);
  EXPECT_LT(seconds_since(t0), 0.5);  // well under the fake's 1 s host timeout
  EXPECT_EQ(w.hosts_lost(), 1u);
}

}  // namespace
}  // namespace dspark::test
