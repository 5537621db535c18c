// Two processes over the real memfds of an attach: the parent creates them (the worker's side), a forked
// child opens them as a host would (its own mappings, the worker area read-only, so the futexes are shared
// ones and each side sleeps on a word it can only read). The parent sends on the response ring, the child
// answers each message with its checksum on the request ring; both rings wrap many times and both sides sleep
// and wake.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "lib/host/session_areas.hpp"
#include "ring_test_util.hpp"

namespace dspark::host {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kMessages = 20000;

uint64_t checksum(const uint8_t* p, uint32_t bytes) {
  uint64_t sum = 1469598103934665603ull;
  for (uint32_t i = 0; i < bytes; ++i) sum = (sum ^ p[i]) * 1099511628211ull;
  return sum;
}

struct Answer {
  MessageHeader header;
  uint64_t sum;
  uint64_t bytes;
};

// The child: echo each message's id, length and checksum. Exit codes say what went wrong (gtest is the
// parent's).
[[noreturn]] void serve(int worker_fd, int host_fd) {
  try {
    SessionAreas s = SessionAreas::open(UniqueFd(dup(worker_fd)), UniqueFd(dup(host_fd)));
    RingReader messages(s.responses());
    RingWriter answers(s.requests());
    for (uint64_t n = 0; n < kMessages;) {
      if (!messages.wait(10s)) _exit(2);
      bool corrupt = false;
      const MessageHeader* h = messages.peek(corrupt);
      if (corrupt) _exit(3);
      if (h == nullptr) continue;
      const uint32_t bytes = messages.peeked_bytes();
      const Answer a{{sizeof(Answer), static_cast<uint32_t>(MessageType::step), h->id},
                     checksum(reinterpret_cast<const uint8_t*>(h), bytes),
                     bytes};
      messages.consume();
      uint8_t* p = answers.reserve(sizeof(Answer), 10s);
      if (p == nullptr) _exit(4);
      std::memcpy(p, &a, sizeof(a));
      answers.publish();
      ++n;
    }
    _exit(0);
  } catch (...) {
    _exit(5);
  }
}

TEST(RingProcesses, TwoProcessesExchangeMessages) {
  ModelDescription m{};
  m.row_bytes = 384;
  m.max_context_rows = 64;
  m.max_batch = 4;
  m.block_size = 4;
  m.slots = 4;
  SessionAreas s = SessionAreas::create(m, 1, WorkerState::serving);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) serve(s.worker_fd(), s.host_fd());
  s.drop_fds();

  // Request sizes and contents from a seed both threads derive them from.
  const auto request_bytes = [](uint64_t id) {
    return static_cast<uint32_t>(16 + 8 * (std::mt19937_64(id)() % 1024));  // up to 8 KiB
  };
  std::atomic<bool> sender_ok{true};
  std::thread sender([&] {
    RingWriter w(s.responses());
    for (uint64_t id = 0; id < kMessages; ++id)
      if (!test::send(w, request_bytes(id), id, 10s)) {
        sender_ok = false;
        return;
      }
  });
  // No ASSERT until the sender is joined: a failure stops the loop, kills the child, then reports.
  RingReader answers(s.requests());
  std::vector<uint8_t> expected;
  uint64_t received = 0;
  std::string error;
  while (received < kMessages && error.empty()) {
    if (!answers.wait(10s)) {
      error = "timed out waiting for an answer";
      break;
    }
    bool corrupt = false;
    const MessageHeader* h = answers.peek(corrupt);
    if (corrupt) error = "corrupt answer";
    if (h == nullptr) continue;
    Answer a{};
    if (answers.peeked_bytes() != sizeof(a)) {
      error = "answer of the wrong size";
      break;
    }
    std::memcpy(&a, h, sizeof(a));
    answers.consume();
    const uint32_t bytes = request_bytes(received);
    expected.resize(bytes);
    test::fill_message(expected.data(), bytes, received);
    if (a.header.id != received || a.bytes != bytes || a.sum != checksum(expected.data(), bytes))
      error = fmt::format("answer {} (id {}, {} bytes) does not match its request", received, a.header.id,
                          a.bytes);
    ++received;
  }
  EXPECT_EQ(error, "");
  if (!error.empty()) kill(child, SIGKILL);
  sender.join();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(received, kMessages);
  EXPECT_TRUE(sender_ok);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_GT(s.worker().response.head.load(), 20 * s.responses().capacity);  // wrapped many times
  EXPECT_GT(s.host().request.head.load(), 20 * sizeof(Answer));
}

}  // namespace
}  // namespace dspark::host
