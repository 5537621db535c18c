// What a hostile host-side process can do to a real worker: nothing to its memory (the sealed memfds),
// nothing that crashes or wedges it (garbage in every word a host writes ends that host's session within the
// stated bound, and the next host drafts as before), and nothing to the attached host's session (a second
// process is refused, with the reason, and the first host's answers do not change).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <functional>
#include <random>
#include <string>

#include "client/dspark_client.hpp"
#include "tests/e2e/raw_host.hpp"
#include "tests/support/worker_process.hpp"

namespace dspark {
namespace {

using namespace std::chrono_literals;

constexpr int kRowValues = 3 * 256;  // tiny config: 3 taps of H = 256

std::string ring_name(const char* what) {
  return "/dspark-e2e-" + std::to_string(::getpid()) + "-" + what;
}

std::vector<uint16_t> rows(int n) {
  std::mt19937 g(11);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> v(static_cast<size_t>(n) * kRowValues);
  for (auto& x : v) x = float_to_bf16(normal(g));
  return v;
}

// A fresh host's draft of slot 0 after 16 context rows: what every healthy session answers.
std::vector<int32_t> fresh_draft(const std::string& ring) {
  Client c(ring, 10000);
  c.context(0, 0, rows(16));
  const dspark_draft_request r{0, 5, 16, -1, 0, 0, 0};
  return c.draft({&r, 1}).ids;
}

// A draft through a raw host: context rows for slot 0, then a draft request.
std::vector<int32_t> raw_draft(test::RawHost& h) {
  host::Request step;
  step.type = host::MessageType::step;
  step.step.contexts = {{0, 0, 16}};
  const std::vector<uint16_t> r = rows(16);
  step.step.rows.assign(r.begin(), r.end());
  step.step.drafts = {{0, 5, 16, -1, 0}};
  const host::Response a = h.call(step);
  EXPECT_TRUE(a.status.ok()) << a.status.message;
  return a.draft.ids;
}

host::Response raw_attach(test::RawHost& h) {
  host::Request attach;
  attach.type = host::MessageType::attach;
  attach.attach = {host::kProtocolVersion, ::getpid()};
  return h.call(attach);
}

TEST(WorkerAttacks, TheHostCannotResizeOrWriteTheWorkersMemoryAndTheWorkerKeepsServing) {
  test::WorkerProcess worker(1, ring_name("seal"));
  const std::vector<int32_t> reference = fresh_draft(worker.ring());
  test::RawHost h(worker.ring());
  ASSERT_TRUE(h.attached()) << h.why();
  ASSERT_TRUE(raw_attach(h).status.ok());
  // What truncated the old segment to 0 (SIGBUS in the worker) or to 576 bytes (no host could attach).
  for (const off_t size : {off_t{0}, off_t{576}, off_t{1} << 32}) {
    errno = 0;
    EXPECT_EQ(ftruncate(h.worker_fd(), size), -1) << size;
    EXPECT_EQ(errno, EPERM) << size;
    errno = 0;
    EXPECT_EQ(ftruncate(h.host_fd(), size), -1) << size;
    EXPECT_EQ(errno, EPERM) << size;
  }
  // Header forgery: worker_state, the model description, the answer ring.
  const uint32_t forged = static_cast<uint32_t>(host::WorkerState::unhealthy);
  errno = 0;
  EXPECT_EQ(pwrite(h.worker_fd(), &forged, sizeof(forged), offsetof(host::WorkerHeader, worker_state)), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, h.worker_fd(), 0), MAP_FAILED);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(mprotect(&h.areas().worker(), 4096, PROT_READ | PROT_WRITE), -1);
  EXPECT_EQ(errno, EACCES);
  EXPECT_EQ(h.areas().worker().worker_state.load(), static_cast<uint32_t>(host::WorkerState::serving));
  EXPECT_EQ(raw_draft(h), reference);  // the session goes on, with the same answers
  EXPECT_FALSE(h.closed_by_worker(0ms));
}

// One hostile write into the host area, and how soon the worker must end the session for it.
struct Garbage {
  const char* what;
  std::function<void(test::RawHost&)> write;
  std::chrono::milliseconds bound;  // the worker's host_timeout_ms is 1000 in the test config
  bool stamps = true;               // the host keeps its heartbeat going meanwhile
  bool corrupt = false;             // counted as a rejected message, not as a lost host
};

TEST(WorkerAttacks, GarbageInEveryHostWordEndsThatSessionAndTheNextHostDraftsAsBefore) {
  test::WorkerProcess worker(1, ring_name("garbage"));
  const std::vector<int32_t> reference = fresh_draft(worker.ring());
  const Garbage cases[] = {
      {"a heartbeat an hour ahead of the worker's clock",
       [](test::RawHost& h) {
         h.areas().host().host_heartbeat_ns = host::monotonic_ns() + 3600'000'000'000ull;
       },
       1000ms, false},
      {"a heartbeat of UINT64_MAX", [](test::RawHost& h) { h.areas().host().host_heartbeat_ns = UINT64_MAX; },
       1000ms, false},
      {"a heartbeat that stops", [](test::RawHost&) {}, 2500ms, false},
      {"a request head past the data",
       [](test::RawHost& h) {
         h.areas().host().request.head = h.areas().worker().request.tail + 4 * h.areas().requests().capacity;
       },
       1000ms, true, true},
      {"a request head behind the tail",
       [](test::RawHost& h) { h.areas().host().request.head = h.areas().worker().request.tail - 8; }, 1000ms,
       true, true},
      {"a message header of 4 GiB - 8",
       [](test::RawHost& h) {
         const uint64_t head = h.areas().host().request.head;
         const uint32_t words[2] = {0xFFFFFFF8u, static_cast<uint32_t>(host::MessageType::step)};
         std::memcpy(h.areas().requests().data + (head & (h.areas().requests().capacity - 1)), words, 8);
         h.areas().host().request.head = head + 64;
       },
       1000ms, true, true},
      {"a response tail ahead of the worker's head, then a request (its answer cannot be written)",
       [](test::RawHost& h) {
         h.areas().host().response.tail = 1ull << 40;
         host::Request health;
         health.type = host::MessageType::health;
         health.id = 77;
         h.send(health);
       },
       2500ms},
  };
  uint64_t lost = 0, corrupt = 0;
  for (const Garbage& g : cases) {
    SCOPED_TRACE(g.what);
    test::RawHost h(worker.ring());
    ASSERT_TRUE(h.attached()) << h.why();
    ASSERT_TRUE(raw_attach(h).status.ok());
    const auto t0 = std::chrono::steady_clock::now();
    g.write(h);
    bool closed = false;
    while (!closed && std::chrono::steady_clock::now() - t0 < g.bound) {
      if (g.stamps) h.beat();
      closed = h.closed_by_worker(20ms);
    }
    EXPECT_TRUE(closed) << "the worker kept the session past " << g.bound.count() << " ms";
    (g.corrupt ? corrupt : lost) += closed;
    EXPECT_EQ(fresh_draft(worker.ring()), reference);  // the next host attaches and drafts as before
  }
  // Garbage in the flags and futex words a host writes only costs wake-ups: the session goes on.
  test::RawHost h(worker.ring());
  ASSERT_TRUE(h.attached()) << h.why();
  ASSERT_TRUE(raw_attach(h).status.ok());
  h.areas().host().request.waiting = 0xFFFFFFFFu;
  h.areas().host().request.seq = 12345;
  h.areas().host().response.waiting = 0xFFFFFFFFu;
  h.areas().host().response.seq = 999;
  EXPECT_EQ(raw_draft(h), reference);
  EXPECT_FALSE(h.closed_by_worker(0ms));
  host::Request stats;
  stats.type = host::MessageType::stats;
  const host::Response s = h.call(stats);
  EXPECT_EQ(s.stats.hosts_lost, lost);
  EXPECT_GE(s.stats.rejected_messages, corrupt);
}

// The old attack: a raw message from another process of the same user, while a host is attached, changed the
// attached host's next draft. Now the other process gets no memory at all, only the reason.
TEST(WorkerAttacks, ASecondProcessIsRefusedAndTheAttachedHostsAnswersDoNotChange) {
  test::WorkerProcess worker(1, ring_name("inject"));
  Client first(worker.ring(), 60000);
  first.context(0, 0, rows(16));
  const dspark_draft_request r{0, 5, 16, -1, 0, 0, 0};
  const std::vector<int32_t> before = first.draft({&r, 1}).ids;

  const std::string cli = std::string(DSPARK_BINARY_DIR) + "/apps/dspark_client --ring " + worker.ring();
  const auto run = [](const std::string& cmd, int& rc) {
    std::string out;
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    char buf[512];
    while (p != nullptr && fgets(buf, sizeof(buf), p) != nullptr) out += buf;
    rc = p != nullptr ? pclose(p) : -1;
    return out;
  };
  int rc = 0;
  // A second host: refused at once, naming the attached host.
  const std::string second = run(cli + " --timeout-ms 2000 info", rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(second.find("another host (pid " + std::to_string(::getpid()) + ") is attached"),
            std::string::npos)
      << second;
  // An observer reads state and counters beside the host.
  const std::string status = run(cli + " status", rc);
  EXPECT_EQ(rc, 0) << status;
  EXPECT_NE(status.find("state serving"), std::string::npos) << status;
  EXPECT_NE(status.find("host_pid " + std::to_string(::getpid())), std::string::npos) << status;
  EXPECT_NE(status.find("hosts_refused 1"), std::string::npos) << status;

  EXPECT_EQ(first.draft({&r, 1}).ids, before);
  const dspark_stats s = first.stats();
  EXPECT_EQ(s.hosts_refused, 1u);
  EXPECT_EQ(s.hosts_lost, 0u);
}

}  // namespace
}  // namespace dspark
