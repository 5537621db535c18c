// The shared-memory segment: create/open, permissions, live and stale owners, checks on open, ring sizes.
#include <fcntl.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <optional>

#include "lib/core/error.hpp"
#include "lib/host/codec.hpp"
#include "lib/host/segment.hpp"
#include "ring_test_util.hpp"

namespace dspark::host {
namespace {

using ::testing::AllOf;
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

// Unique per process and test; removed again whatever the test left.
class SegmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = fmt::format("/dspark_test_{}_{}", getpid(),
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    shm_unlink(name_.c_str());
  }
  void TearDown() override { shm_unlink(name_.c_str()); }

  // Any content under the name: what a crashed or foreign program might leave.
  void write_file(const std::vector<uint8_t>& bytes) {
    const int fd = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    close(fd);
  }
  std::string open_error() {
    try {
      Segment::open(name_);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  bool exists() const {
    struct stat st {};
    return stat(("/dev/shm" + name_).c_str(), &st) == 0;
  }

  std::string name_;
};

pid_t reaped_child_pid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  return pid;
}

TEST_F(SegmentTest, CreateThenOpenSeesTheSameSegment) {
  const ModelDescription m = test_model();
  const uint64_t t0 = monotonic_ns();
  Segment worker = Segment::create(name_, 0600, m);
  Segment host = Segment::open(name_);
  const SegmentHeader& h = host.header();
  EXPECT_NE(&h, &worker.header());  // a second mapping
  EXPECT_EQ(h.magic, kMagic);
  EXPECT_EQ(h.version, kProtocolVersion);
  EXPECT_EQ(h.header_bytes, sizeof(SegmentHeader));
  EXPECT_EQ(std::memcmp(&h.model, &m, sizeof(m)), 0);
  EXPECT_EQ(h.worker_state.load(), static_cast<uint32_t>(WorkerState::starting));
  EXPECT_EQ(h.worker_pid.load(), getpid());
  EXPECT_GE(h.worker_heartbeat_ns.load(), t0);
  EXPECT_LE(h.worker_heartbeat_ns.load(), monotonic_ns());
  EXPECT_EQ(h.host_pid.load(), 0);
  EXPECT_EQ(h.request_offset % 64, 0u);
  EXPECT_EQ(h.response_offset % 64, 0u);
  EXPECT_EQ(host.requests().capacity, request_ring_bytes(m));
  EXPECT_EQ(host.responses().capacity, response_ring_bytes(m));
  EXPECT_EQ(host.name(), name_);

  // Both directions, across the two mappings.
  RingWriter to_worker(host.requests());
  RingReader from_host(worker.requests());
  ASSERT_TRUE(test::send(to_worker, 4000, 17));
  bool corrupt = false;
  const MessageHeader* msg = from_host.peek(corrupt);
  ASSERT_NE(msg, nullptr);
  EXPECT_TRUE(test::check_message(msg, 4000, 17));
  RingWriter to_host(worker.responses());
  RingReader from_worker(host.responses());
  ASSERT_TRUE(test::send(to_host, 64, 18));
  msg = from_worker.peek(corrupt);
  ASSERT_NE(msg, nullptr);
  EXPECT_TRUE(test::check_message(msg, 64, 18));
  host.header().host_pid = 123;
  EXPECT_EQ(worker.header().host_pid.load(), 123);
}

TEST_F(SegmentTest, RingsHoldTheLargestMessages) {
  for (ModelDescription m : {test_model(), ModelDescription{}}) {
    const uint64_t rq = request_ring_bytes(m), rs = response_ring_bytes(m);
    EXPECT_TRUE(std::has_single_bit(rq));
    EXPECT_TRUE(std::has_single_bit(rs));
    EXPECT_GE(rs, 64u * 1024);
    EXPECT_GE(max_message_bytes(rq), max_step_bytes(m));  // two full steps
    EXPECT_GE(rs, 8 * max_draft_answer_bytes(m));
  }
  ModelDescription huge = test_model();
  huge.max_context_rows = 1u << 30;
  EXPECT_THROW(request_ring_bytes(huge), Error);
}

TEST_F(SegmentTest, PermissionsAreExactlyTheMode) {
  for (const uint32_t mode : {0600u, 0640u, 0660u, 0644u}) {
    for (const mode_t mask : {mode_t{0}, mode_t{022}, mode_t{077}}) {
      const mode_t old = umask(mask);
      std::optional<Segment> s;
      s.emplace(Segment::create(name_, mode, test_model()));
      umask(old);
      struct stat st {};
      ASSERT_EQ(stat(("/dev/shm" + name_).c_str(), &st), 0);
      EXPECT_EQ(st.st_mode & 07777, mode) << std::oct << "mode " << mode << " umask " << mask;
      s.reset();
      EXPECT_FALSE(exists());
    }
  }
  EXPECT_THROW(Segment::create(name_, 010000, test_model()), Error);
}

TEST_F(SegmentTest, RefusesTheNameOfALiveWorker) {
  Segment first = Segment::create(name_, 0600, test_model());
  try {
    Segment::create(name_, 0600, test_model());
    FAIL() << "a live worker's segment was replaced";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("shared memory segment {} belongs to a live worker (pid {})",
                                                name_, getpid())));
  }
  EXPECT_NO_THROW(Segment::open(name_));
}

TEST_F(SegmentTest, ReplacesASegmentWhoseWorkerIsGone) {
  std::optional<Segment> old;
  old.emplace(Segment::create(name_, 0600, test_model()));
  old->header().worker_pid = reaped_child_pid();
  old->header().model.vocab_size = 1;
  Segment fresh = Segment::create(name_, 0600, test_model());
  EXPECT_EQ(fresh.header().worker_pid.load(), getpid());
  EXPECT_EQ(Segment::open(name_).header().model.vocab_size, test_model().vocab_size);
  old.reset();  // the old owner must not remove its successor's name
  EXPECT_TRUE(exists());
  EXPECT_NO_THROW(Segment::open(name_));
}

TEST_F(SegmentTest, ReplacesASegmentWithAnOldHeartbeat) {
  Segment old = Segment::create(name_, 0600, test_model());
  old.header().worker_heartbeat_ns = monotonic_ns() - 3'000'000'000ull;
  EXPECT_NO_THROW(Segment::create(name_, 0600, test_model()));
}

TEST_F(SegmentTest, ReplacesAForeignFile) {
  write_file(std::vector<uint8_t>(100, 0xab));
  EXPECT_NO_THROW(Segment::create(name_, 0600, test_model()));
  shm_unlink(name_.c_str());
  write_file(std::vector<uint8_t>(64 * 1024, 0));
  EXPECT_NO_THROW(Segment::create(name_, 0600, test_model()));
}

TEST_F(SegmentTest, TheCreatorRemovesTheName) {
  { Segment s = Segment::create(name_, 0600, test_model()); }
  EXPECT_FALSE(exists());
  {
    Segment s = Segment::create(name_, 0600, test_model());
    Segment moved = std::move(s);
    Segment host = Segment::open(name_);
  }
  EXPECT_FALSE(exists());
}

TEST_F(SegmentTest, OpenOfAMissingNameNamesIt) {
  EXPECT_THAT(open_error(), AllOf(HasSubstr(name_), HasSubstr("does not exist")));
}

TEST_F(SegmentTest, OpenOfANonDsparkSegmentNamesIt) {
  write_file(std::vector<uint8_t>(100, 1));
  EXPECT_THAT(open_error(), AllOf(HasSubstr(name_), HasSubstr("not a dspark segment")));
  shm_unlink(name_.c_str());
  write_file(std::vector<uint8_t>(64 * 1024, 0));
  EXPECT_THAT(open_error(), AllOf(HasSubstr(name_), HasSubstr("not a dspark segment")));
}

TEST_F(SegmentTest, OpenOfAnotherVersionNamesIt) {
  Segment s = Segment::create(name_, 0600, test_model());
  s.header().version = kProtocolVersion + 1;
  EXPECT_THAT(open_error(),
              AllOf(HasSubstr(name_), HasSubstr(fmt::format("version {}", kProtocolVersion + 1))));
  s.header().version = kProtocolVersion;
  s.header().header_bytes = 64;
  EXPECT_THAT(open_error(), AllOf(HasSubstr(name_), HasSubstr("header of 64 bytes")));
}

TEST_F(SegmentTest, OpenChecksTheRingsAgainstTheFile) {
  Segment s = Segment::create(name_, 0600, test_model());
  SegmentHeader& h = s.header();
  const uint64_t saved[4] = {h.request_offset, h.request_bytes, h.response_offset, h.response_bytes};
  const auto restore = [&] {
    h.request_offset = saved[0];
    h.request_bytes = saved[1];
    h.response_offset = saved[2];
    h.response_bytes = saved[3];
  };
  ASSERT_NO_THROW(Segment::open(name_));
  h.response_bytes = 1ull << 40;
  EXPECT_THAT(open_error(), AllOf(HasSubstr(name_), HasSubstr("response ring")));
  restore();
  h.request_offset += 8;  // misaligned
  EXPECT_THAT(open_error(), AllOf(HasSubstr(name_), HasSubstr("request ring")));
  restore();
  h.request_bytes -= 64;  // not a power of 2
  EXPECT_THAT(open_error(), HasSubstr("request ring"));
  restore();
  h.response_offset = ~uint64_t{0} - 63;  // offset + bytes overflows
  EXPECT_THAT(open_error(), HasSubstr("response ring"));
  restore();
  h.response_offset = h.request_offset;
  h.response_bytes = h.request_bytes;
  EXPECT_THAT(open_error(), HasSubstr("overlap"));
  restore();
  h.magic = 7;
  EXPECT_THAT(open_error(), HasSubstr("not a dspark segment"));
}

TEST_F(SegmentTest, RejectsBadNames) {
  for (const char* bad : {"", "/", "noslash", "/a/b", "/a/"})
    EXPECT_THROW(Segment::create(bad, 0600, test_model()), Error) << bad;
  EXPECT_THROW(Segment::open("/" + std::string(300, 'x')), Error);
}

TEST(Liveness, ProcessAlive) {
  EXPECT_TRUE(process_alive(getpid()));
  EXPECT_TRUE(process_alive(1));  // not ours to signal: EPERM still means alive
  EXPECT_FALSE(process_alive(0));
  EXPECT_FALSE(process_alive(-5));
  EXPECT_FALSE(process_alive(reaped_child_pid()));
  const uint64_t a = monotonic_ns();
  const uint64_t b = monotonic_ns();
  EXPECT_GE(b, a);
}

}  // namespace
}  // namespace dspark::host
