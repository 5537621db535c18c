// The memfds of an attach: what the host sees, what it cannot do to the worker's memory (shrink, grow, write,
// map or re-protect it writable), and the checks a host makes on what it was handed.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "lib/core/error.hpp"
#include "lib/host/codec.hpp"
#include "lib/host/liveness.hpp"
#include "lib/host/session_areas.hpp"
#include "ring_test_util.hpp"

namespace dspark::host {
namespace {

using ::testing::HasSubstr;

ModelDescription test_model() {
  ModelDescription m{};
  m.vocab_size = 1000;
  m.hidden = 64;
  m.taps = 3;
  m.row_bytes = 3 * 64 * 2;
  m.block_size = 8;
  m.window = 128;
  m.slots = 16;
  m.max_batch = 8;
  m.max_context_rows = 256;
  m.tp = 1;
  m.max_model_len = 4096;
  return m;
}

// The host's side of a fresh pair, and the descriptors it was handed (dups: open() takes its own).
struct Pair {
  SessionAreas worker = SessionAreas::create(test_model(), 7, WorkerState::serving);
  UniqueFd worker_fd{dup(worker.worker_fd())}, host_fd{dup(worker.host_fd())};
  SessionAreas host = SessionAreas::open(UniqueFd(dup(worker_fd.get())), UniqueFd(dup(host_fd.get())));
};

std::string open_error(int worker_fd, int host_fd) {
  try {
    SessionAreas::open(UniqueFd(dup(worker_fd)), UniqueFd(dup(host_fd)));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SessionAreas, TheHostSeesTheWorkersHeaderAndBothRingsCross) {
  const uint64_t t0 = monotonic_ns();
  Pair p;
  const WorkerHeader& h = p.host.worker();
  EXPECT_NE(&h, &p.worker.worker());  // a second mapping
  EXPECT_EQ(h.magic, kMagic);
  EXPECT_EQ(h.version, kProtocolVersion);
  EXPECT_EQ(h.session, 7u);
  const ModelDescription m = test_model();
  EXPECT_EQ(std::memcmp(&h.model, &m, sizeof(m)), 0);
  EXPECT_EQ(h.worker_state.load(), static_cast<uint32_t>(WorkerState::serving));
  EXPECT_EQ(h.worker_pid.load(), getpid());
  EXPECT_GE(h.worker_heartbeat_ns.load(), t0);
  EXPECT_EQ(p.host.requests().capacity, request_ring_bytes(test_model()));
  EXPECT_EQ(p.host.responses().capacity, response_ring_bytes(test_model()));

  RingWriter to_worker(p.host.requests());
  RingReader from_host(p.worker.requests());
  ASSERT_TRUE(test::send(to_worker, 4000, 17));
  bool corrupt = false;
  const MessageHeader* msg = from_host.peek(corrupt);
  ASSERT_NE(msg, nullptr);
  EXPECT_TRUE(test::check_message(msg, 4000, 17));
  from_host.consume();
  RingWriter to_host(p.worker.responses());
  RingReader from_worker(p.host.responses());
  ASSERT_TRUE(test::send(to_host, 64, 18));
  msg = from_worker.peek(corrupt);
  ASSERT_NE(msg, nullptr);
  EXPECT_TRUE(test::check_message(msg, 64, 18));
  p.host.host().host_heartbeat_ns = 123;
  EXPECT_EQ(p.worker.host().host_heartbeat_ns.load(), 123u);
}

TEST(SessionAreas, RingsHoldTheLargestMessages) {
  for (ModelDescription m : {test_model(), ModelDescription{}}) {
    const uint64_t rq = request_ring_bytes(m), rs = response_ring_bytes(m);
    EXPECT_TRUE(std::has_single_bit(rq));
    EXPECT_TRUE(std::has_single_bit(rs));
    EXPECT_GE(rs, 64u * 1024);
    EXPECT_GE(max_message_bytes(rq), max_step_bytes(m));  // two full steps
    EXPECT_GE(rs, 8 * max_draft_answer_bytes(m, 0));
    EXPECT_GE(response_ring_bytes(m, 2), 2 * max_draft_answer_bytes(m, 2));
  }
  // Two whole distributions of k = 8 positions: 16 rows of V = 1000 floats and their 16 row indices.
  EXPECT_EQ(max_draft_answer_bytes(test_model(), 2) - max_draft_answer_bytes(test_model(), 0),
            16 * 4 + 16 * 4000);
  EXPECT_EQ(max_draft_answer_bytes(ModelDescription{}, 2), max_draft_answer_bytes(ModelDescription{}, 0));
  ModelDescription huge = test_model();
  huge.max_context_rows = 1u << 30;
  EXPECT_THROW(request_ring_bytes(huge), Error);
}

// Everything a host could try on the worker area with the descriptor it holds fails, and the worker's
// mapping still works afterwards.
TEST(SessionAreas, TheHostCannotResizeWriteOrMapTheWorkerAreaWritable) {
  Pair p;
  const int fd = p.worker_fd.get();
  struct stat before {};
  ASSERT_EQ(fstat(fd, &before), 0);
  errno = 0;
  EXPECT_EQ(ftruncate(fd, 0), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(ftruncate(fd, 576), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(ftruncate(fd, before.st_size * 2), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), -1);
  EXPECT_EQ(errno, EPERM);
  const uint64_t forged = kMagic ^ 1;
  errno = 0;
  EXPECT_EQ(pwrite(fd, &forged, sizeof(forged), 0), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
  EXPECT_EQ(errno, EPERM);
  // A read-only mapping cannot be made writable either (the seal took its VM_MAYWRITE).
  void* ro = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(ro, MAP_FAILED);
  errno = 0;
  EXPECT_EQ(mprotect(ro, 4096, PROT_READ | PROT_WRITE), -1);
  EXPECT_EQ(errno, EACCES);
  munmap(ro, 4096);
  // The host's own mapping, the one SessionAreas::open made, is read-only as well.
  errno = 0;
  EXPECT_EQ(mprotect(&p.host.worker(), 4096, PROT_READ | PROT_WRITE), -1);
  EXPECT_EQ(errno, EACCES);
  // Reopened through /proc: a new open file of the same sealed memfd.
  UniqueFd again(open(fmt::format("/proc/self/fd/{}", fd).c_str(), O_RDWR));
  ASSERT_TRUE(again);
  EXPECT_EQ(ftruncate(again.get(), 0), -1);
  EXPECT_EQ(pwrite(again.get(), &forged, sizeof(forged), 0), -1);
  struct stat after {};
  ASSERT_EQ(fstat(fd, &after), 0);
  EXPECT_EQ(after.st_size, before.st_size);
  EXPECT_EQ(p.worker.worker().magic, kMagic);
  p.worker.worker().worker_heartbeat_ns = 5;  // the worker's own mapping still writes
  EXPECT_EQ(p.host.worker().worker_heartbeat_ns.load(), 5u);
}

TEST(SessionAreas, TheHostAreaCannotBeResized) {
  Pair p;
  const int fd = p.host_fd.get();
  errno = 0;
  EXPECT_EQ(ftruncate(fd, 0), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(ftruncate(fd, 1 << 30), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);  // sealed: no seal comes off or on any more
}

// A memfd pair as a broken or hostile worker might hand it over: the host refuses it with the reason.
TEST(SessionAreas, TheHostRefusesUnsealedOrMisshapenAreas) {
  Pair p;
  EXPECT_EQ(open_error(p.worker_fd.get(), p.host_fd.get()), "");
  // Unsealed.
  UniqueFd plain(memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(plain.get(), 1 << 20), 0);
  EXPECT_THAT(open_error(plain.get(), p.host_fd.get()), HasSubstr("worker area is not sealed"));
  EXPECT_THAT(open_error(p.worker_fd.get(), plain.get()), HasSubstr("host area is not sealed"));
  // Not a memfd at all.
  UniqueFd devnull(open("/dev/null", O_RDONLY));
  EXPECT_THAT(open_error(devnull.get(), p.host_fd.get()), HasSubstr("not a sealable memfd"));
  // Sealed, but its header says something else.
  const auto forged = [&](auto edit) {
    UniqueFd fd(memfd_create("forged", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    const size_t bytes = area_data_offset<WorkerHeader>() + response_ring_bytes(test_model());
    EXPECT_EQ(ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
    std::vector<uint8_t> image(sizeof(WorkerHeader));
    std::memcpy(image.data(), &p.worker.worker(), sizeof(WorkerHeader));
    edit(*reinterpret_cast<WorkerHeader*>(image.data()));
    EXPECT_EQ(pwrite(fd.get(), image.data(), image.size(), 0), static_cast<ssize_t>(image.size()));
    EXPECT_EQ(fcntl(fd.get(), F_ADD_SEALS, kWorkerAreaSeals), 0);
    return open_error(fd.get(), p.host_fd.get());
  };
  EXPECT_EQ(forged([](WorkerHeader&) {}), "");
  EXPECT_THAT(forged([](WorkerHeader& h) { h.magic = 7; }), HasSubstr("not a dspark worker area"));
  EXPECT_THAT(forged([](WorkerHeader& h) { h.version = kProtocolVersion + 1; }),
              HasSubstr(fmt::format("protocol version {}", kProtocolVersion + 1)));
  EXPECT_THAT(forged([](WorkerHeader& h) { h.header_bytes = 64; }), HasSubstr("header of 64 bytes"));
  EXPECT_THAT(forged([](WorkerHeader& h) { h.response_bytes -= 64; }), HasSubstr("power of 2"));
  EXPECT_THAT(forged([](WorkerHeader& h) { h.response_bytes *= 2; }), HasSubstr("do not hold rings"));
  EXPECT_THAT(forged([](WorkerHeader& h) { h.request_bytes = 1ull << 50; }), HasSubstr("power of 2"));
}

double thread_cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-3;
}

// Each side sleeps on a futex word it maps read-only (the other side's seq): FUTEX_WAIT there must sleep (an
// idle wait costs no CPU) and FUTEX_WAKE must reach it (a publish wakes it long before its timeout).
TEST(SessionAreas, FutexWaitsWorkOnTheReadOnlyMappings) {
  Pair p;
  for (const bool host_waits : {true, false}) {
    SCOPED_TRACE(host_waits ? "the host waits for an answer" : "the worker waits for a request");
    RingReader reader(host_waits ? p.host.responses() : p.worker.requests());
    RingWriter writer(host_waits ? p.worker.responses() : p.host.requests());
    double cpu_ms = 0;
    bool idle = true;
    std::thread idle_wait([&] {
      const double cpu0 = thread_cpu_ms();
      idle = reader.wait(std::chrono::milliseconds(200));
      cpu_ms = thread_cpu_ms() - cpu0;
    });
    idle_wait.join();
    EXPECT_FALSE(idle);
    EXPECT_LT(cpu_ms, 20.0);
    std::atomic<bool> woke{false};
    std::thread waiter([&] { woke = reader.wait(std::chrono::seconds(5)); });
    const RingConsumerControl& consumer = host_waits ? p.host.host().response : p.worker.worker().request;
    while (consumer.waiting.load() == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // well into FUTEX_WAIT
    const auto sent = std::chrono::steady_clock::now();
    ASSERT_TRUE(test::send(writer, 64, 1));
    waiter.join();
    EXPECT_TRUE(woke);
    EXPECT_LT(std::chrono::steady_clock::now() - sent, std::chrono::milliseconds(500));  // not the timeout
  }
}

TEST(Liveness, ProcessAliveAndHeartbeatAges) {
  EXPECT_TRUE(process_alive(getpid()));
  EXPECT_TRUE(process_alive(1));  // not ours to signal: EPERM still means alive
  EXPECT_FALSE(process_alive(0));
  EXPECT_FALSE(process_alive(-5));
  const uint64_t now = monotonic_ns();
  EXPECT_EQ(heartbeat_age_ns(now - 5, now), 5u);
  EXPECT_EQ(heartbeat_age_ns(now + 5, now), 0u);  // stamped between the two reads
  EXPECT_EQ(heartbeat_age_ns(now + kHeartbeatFutureSlackNs, now), 0u);
  EXPECT_FALSE(heartbeat_age_ns(now + kHeartbeatFutureSlackNs + 1, now).has_value());  // forged: never fresh
  EXPECT_FALSE(heartbeat_age_ns(UINT64_MAX, now).has_value());
}

}  // namespace
}  // namespace dspark::host
