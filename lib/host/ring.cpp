// SPSC rings in shared memory (framing: protocol.hpp; waiting scheme: ring.hpp).
//
// No lost wake-up: a waiter reads the other side's seq, sets its own `waiting`, re-checks its condition and
// only then FUTEX_WAITs on the seq it read. The other side stores its counter (head or tail), bumps its seq,
// then reads the waiter's `waiting`; these accesses are seq_cst, so either the waiter's re-check sees the new
// counter or the other side sees the flag and wakes it (a FUTEX_WAIT on a seq that changed returns at once).
// The futex is a shared one (no FUTEX_PRIVATE): the two processes map the word at different addresses, and
// the waiter's mapping of it may be read-only (FUTEX_WAIT and FUTEX_WAKE only read the word).
#include "lib/host/ring.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string_view>

#include "lib/core/error.hpp"

namespace dspark::host {
namespace {

using Clock = std::chrono::steady_clock;
// How long a wait spins before it sleeps on the futex: DSPARK_RING_SPIN_US (0 to 1000000) in the environment,
// else 30 us, which covers a peer that answers at once and costs little when idle. A sleeping side wakes
// tens of microseconds after the publish; a longer spin trades a busy core for that latency.
std::chrono::nanoseconds spin_limit() {
  static const std::chrono::nanoseconds limit = [] {
    constexpr int64_t kDefaultUs = 30, kMaxUs = 1'000'000;
    const char* v = std::getenv("DSPARK_RING_SPIN_US");
    if (v == nullptr || *v == '\0') return std::chrono::nanoseconds(std::chrono::microseconds(kDefaultUs));
    char* end = nullptr;
    const long long us = std::strtoll(v, &end, 10);
    if (*end != '\0' || us < 0 || us > kMaxUs)
      fail("DSPARK_RING_SPIN_US={}: expected microseconds in [0, {}]", v, kMaxUs);
    return std::chrono::nanoseconds(std::chrono::microseconds(us));
  }();
  return limit;
}

constexpr uint32_t kPaddingMinBytes = 8;  // bytes + type: all that fits 8 bytes before the end

static_assert(std::atomic<uint32_t>::is_always_lock_free &&
              sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
              sizeof(std::atomic<uint64_t>) == sizeof(uint64_t));

uint32_t* futex_word(std::atomic<uint32_t>& seq) {
  return reinterpret_cast<uint32_t*>(&seq);
}

void futex_wake(std::atomic<uint32_t>& seq) {
  syscall(SYS_futex, futex_word(seq), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Returns on a wake, a timeout, a signal or when seq != expected: the caller re-checks its condition either
// way.
void futex_wait(std::atomic<uint32_t>& seq, uint32_t expected, std::chrono::nanoseconds timeout) {
  const auto ns = timeout.count();
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  syscall(SYS_futex, futex_word(seq), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Sleeps on the other side's `seq` with this side's `waiting` set until ready() (true) or `until` (false).
template <typename Ready>
bool sleep_until(std::atomic<uint32_t>& seq, std::atomic<uint32_t>& waiting, Clock::time_point until,
                 Ready& ready) {
  for (;;) {
    const uint32_t seen = seq.load(std::memory_order_seq_cst);
    waiting.store(1, std::memory_order_seq_cst);
    if (ready()) {
      waiting.store(0, std::memory_order_seq_cst);
      return true;
    }
    const auto left = until - Clock::now();
    if (left <= std::chrono::nanoseconds::zero()) {
      waiting.store(0, std::memory_order_seq_cst);
      return false;
    }
    futex_wait(seq, seen, left);
    waiting.store(0, std::memory_order_seq_cst);
    if (ready()) return true;
    if (Clock::now() >= until) return false;
  }
}

// Spins, then sleeps on the futex, until ready() or the timeout. With a spin window ahead, sleeps until the
// window opens first (a publish wakes it sooner) and spins through the window; a wait that starts inside its
// window spins through the rest of it. A message that arrives in the window is seen without a wake-up.
template <typename Ready>
bool wait_for(std::atomic<uint32_t>& seq, std::atomic<uint32_t>& waiting, std::chrono::nanoseconds timeout,
              Ready ready, const SpinWindow& window = {}) {
  if (ready()) return true;
  if (timeout <= std::chrono::nanoseconds::zero()) return false;
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  auto spin_for = spin_limit();
  if (window.from > start + spin_for) {
    if (sleep_until(seq, waiting, std::min(window.from, deadline), ready)) return true;
    if (Clock::now() >= deadline) return false;
    spin_for = std::max(spin_for, window.length);
  } else if (window.length > std::chrono::nanoseconds::zero()) {
    spin_for = std::max<std::chrono::nanoseconds>(spin_for, window.from + window.length - start);
  }
  const auto spin_start = Clock::now();
  const auto spin_end = spin_start + std::min<std::chrono::nanoseconds>(spin_for, deadline - spin_start);
  for (uint32_t i = 1;; ++i) {
    cpu_relax();
    if (ready()) return true;
    if (i % 64 == 0 && Clock::now() >= spin_end) break;
  }
  return sleep_until(seq, waiting, deadline, ready);
}

}  // namespace

std::optional<bool> spin_ahead_setting() {
  static const std::optional<bool> on = []() -> std::optional<bool> {
    const char* v = std::getenv("DSPARK_RING_SPIN_AHEAD");
    if (v == nullptr || *v == '\0') return std::nullopt;
    if (std::string_view(v) == "0") return false;
    if (std::string_view(v) == "1") return true;
    fail("DSPARK_RING_SPIN_AHEAD={}: expected 0 or 1", v);
  }();
  return on;
}

SpinWindow expected_window(Clock::time_point since, std::chrono::nanoseconds expected) {
  using std::chrono::microseconds;
  if (expected <= std::chrono::nanoseconds::zero() || !spin_ahead_setting().value_or(true)) return {};
  constexpr microseconds kTimerSlack(60), kMinLead(50), kMaxLead(500);
  const auto lead = std::clamp<std::chrono::nanoseconds>(expected / 8, kMinLead, kMaxLead) + kTimerSlack;
  return {since + expected - lead, 2 * lead};
}

namespace {

void check_message_size(const RingView& v, uint32_t bytes) {
  if (bytes % kMessageAlign != 0 || bytes < sizeof(MessageHeader) || bytes > max_message_bytes(v.capacity))
    fail("ring message of {} bytes: must be a multiple of {}, at least {} and at most {} (ring of {} bytes)",
         bytes, kMessageAlign, sizeof(MessageHeader), max_message_bytes(v.capacity), v.capacity);
}

// Room for a message of `bytes` written at `head`, counting the padding when it would cross the ring's end. A
// tail that the other process corrupted (ahead of head, or too far behind) leaves no room: the writer times
// out instead of overwriting anything.
bool has_space(const RingView& v, uint64_t head, uint32_t bytes) {
  const uint64_t used = head - v.consumer->tail.load(std::memory_order_seq_cst);
  if (used > v.capacity) return false;
  const uint64_t to_end = v.capacity - (head & (v.capacity - 1));
  const uint64_t need = bytes <= to_end ? bytes : to_end + bytes;
  return need <= v.capacity - used;
}

// The consumer's release of ring bytes, waking a producer that waits for space.
void release_to(const RingView& v, uint64_t tail) {
  v.consumer->tail.store(tail, std::memory_order_seq_cst);
  if (v.producer->waiting.load(std::memory_order_seq_cst) != 0) {
    v.consumer->seq.fetch_add(1, std::memory_order_seq_cst);
    futex_wake(v.consumer->seq);
  }
}

}  // namespace

uint64_t max_message_bytes(uint64_t capacity) {
  return capacity / 2;
}

uint8_t* RingWriter::try_reserve(uint32_t bytes) {
  check_message_size(v_, bytes);
  const uint64_t head = v_.producer->head.load(std::memory_order_relaxed);  // this side alone writes head
  if (!has_space(v_, head, bytes)) return nullptr;
  const uint64_t off = head & (v_.capacity - 1);
  const uint64_t to_end = v_.capacity - off;
  if (bytes <= to_end) {
    pending_ = head + bytes;
    reserved_ = v_.data + off;
  } else {
    // The message would cross the end: a padding message covers the rest, published together with the
    // message.
    const MessageHeader pad{static_cast<uint32_t>(to_end), static_cast<uint32_t>(MessageType::padding), 0};
    std::memcpy(v_.data + off, &pad, std::min<uint64_t>(to_end, sizeof(pad)));
    pending_ = head + to_end + bytes;
    reserved_ = v_.data;
  }
  reserved_bytes_ = bytes;
  return reserved_;
}

uint8_t* RingWriter::reserve(uint32_t bytes, std::chrono::nanoseconds timeout) {
  check_message_size(v_, bytes);
  const uint64_t head = v_.producer->head.load(std::memory_order_relaxed);
  if (!wait_for(v_.consumer->seq, v_.producer->waiting, timeout, [&] { return has_space(v_, head, bytes); }))
    return nullptr;
  return try_reserve(bytes);
}

void RingWriter::publish() {
  if (reserved_ == nullptr) fail("RingWriter::publish without a reserved message");
  uint32_t written = 0;
  std::memcpy(&written, reserved_, sizeof(written));
  if (written != reserved_bytes_)
    fail("RingWriter::publish: the message header says {} bytes, {} were reserved", written, reserved_bytes_);
  reserved_ = nullptr;
  v_.producer->head.store(pending_, std::memory_order_seq_cst);
  v_.producer->seq.fetch_add(1, std::memory_order_seq_cst);
  if (v_.consumer->waiting.load(std::memory_order_seq_cst) != 0) futex_wake(v_.producer->seq);
}

const MessageHeader* RingReader::peek(bool& corrupt) {
  corrupt = false;
  peeked_bytes_ = 0;
  const uint64_t mask = v_.capacity - 1;
  for (;;) {
    const uint64_t tail = v_.consumer->tail.load(std::memory_order_relaxed);  // this side alone writes tail
    const uint64_t head = v_.producer->head.load(std::memory_order_acquire);
    if (head == tail) return nullptr;
    // Every number here comes from the other process: check before touching the bytes they point at.
    const uint64_t avail = head - tail;
    const uint64_t off = tail & mask;
    const uint64_t to_end = v_.capacity - off;
    if (avail > v_.capacity || avail % kMessageAlign != 0 || off % kMessageAlign != 0) {
      corrupt = true;
      return nullptr;
    }
    uint32_t words[2];  // bytes, type: the part of a header even the shortest padding message has
    std::memcpy(words, v_.data + off, sizeof(words));
    const uint32_t bytes = words[0];
    if (bytes % kMessageAlign != 0 || bytes < kPaddingMinBytes || bytes > avail || bytes > to_end) {
      corrupt = true;
      return nullptr;
    }
    if (words[1] == static_cast<uint32_t>(MessageType::padding)) {
      if (bytes != to_end) {
        corrupt = true;
        return nullptr;
      }
      release_to(v_, tail + bytes);
      continue;
    }
    if (bytes < sizeof(MessageHeader) || bytes > max_message_bytes(v_.capacity)) {
      corrupt = true;
      return nullptr;
    }
    next_ = tail + bytes;
    peeked_bytes_ = bytes;
    return reinterpret_cast<const MessageHeader*>(v_.data + off);
  }
}

void RingReader::consume() {
  if (peeked_bytes_ == 0) return;
  peeked_bytes_ = 0;
  release_to(v_, next_);
}

bool RingReader::wait(std::chrono::nanoseconds timeout, const SpinWindow& window) {
  const RingView v = v_;
  return wait_for(
      v.producer->seq, v.consumer->waiting, timeout,
      [v] {
        return v.producer->head.load(std::memory_order_seq_cst) !=
               v.consumer->tail.load(std::memory_order_relaxed);
      },
      window);
}

}  // namespace dspark::host
