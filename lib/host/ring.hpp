// Single-producer single-consumer message rings in shared memory (see protocol.hpp for the framing). Waiting
// is a short spin, then a futex wait on the other side's seq word, so an idle side uses no CPU.
//
// Each side writes only its own half of the control words (RingProducerControl: head, seq, waiting;
// RingConsumerControl: tail, seq, waiting), so each half can live in memory only its side may write. The
// producer bumps its seq on every publish and wakes the consumer when the consumer's `waiting` is set; the
// consumer bumps its seq and wakes on a release only when the producer's `waiting` is set. Whatever a side
// reads from the other half is checked before use. A padding message may be as short as 8 bytes (its bytes
// and type words only) when the ring's end is 8 bytes away.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>

#include "lib/host/protocol.hpp"

namespace dspark::host {

// One ring as a side sees it: the producer writes through `producer` and `data`, the consumer through
// `consumer` only (its mappings of the rest may be read-only).
struct RingView {
  RingProducerControl* producer = nullptr;
  RingConsumerControl* consumer = nullptr;
  uint8_t* data = nullptr;
  uint64_t capacity = 0;  // power of 2
};

// When a wait expects its message: from `from` on it spins for `length` (or DSPARK_RING_SPIN_US, if longer)
// instead of sleeping, and before it sleeps on the futex (a publish still wakes it at once); a wait that
// starts inside the window spins through the rest of it. A default window (length 0) is the plain wait: spin
// DSPARK_RING_SPIN_US, then sleep.
struct SpinWindow {
  std::chrono::steady_clock::time_point from{};
  std::chrono::nanoseconds length{0};
};

// The window of a wait whose message is expected `expected` after `since` (as long as the last such wait
// took): it opens a lead plus a futex sleep's timer slack (60 us) before then and lasts twice that, the lead
// an eighth of `expected` within [50 us, 500 us]. The default window when `expected` is zero, or when
// DSPARK_RING_SPIN_AHEAD is 0 in the environment.
SpinWindow expected_window(std::chrono::steady_clock::time_point since, std::chrono::nanoseconds expected);

// DSPARK_RING_SPIN_AHEAD in the environment: 1 or 0, or nothing when unset (the side's own default: the
// client spins ahead; the worker where its backend leaves the host's cores idle). Another value is refused
// naming it.
std::optional<bool> spin_ahead_setting();

// The last two durations of a recurring wait: a step's answer after its request (the host), the next step's
// request after the previous answer (the worker). The next such wait's window is expected_window of the
// nearer one, so one slow round does not move the window past the usual arrival; none recorded: the default.
class RecentWaits {
 public:
  void record(std::chrono::nanoseconds took) {
    last_[1] = last_[0];
    last_[0] = took;
  }
  SpinWindow window(std::chrono::steady_clock::time_point since) const {
    return expected_window(since, std::min(last_[0], last_[1]));
  }
  void clear() { last_[0] = last_[1] = std::chrono::nanoseconds::zero(); }

 private:
  std::chrono::nanoseconds last_[2] = {};
};

// Largest message a ring of `capacity` bytes accepts (half of it: a message plus the padding before it always
// fit).
uint64_t max_message_bytes(uint64_t capacity);

class RingWriter {
 public:
  explicit RingWriter(RingView v) : v_(v) {}
  // Space for a message of `bytes` (a multiple of 8, at most max_message_bytes), or nullptr when the consumer
  // has not freed enough yet. Writes the padding message first when the message would cross the ring's end.
  uint8_t* try_reserve(uint32_t bytes);
  // Waits (spin, then futex on the consumer's progress) up to `timeout` for space; nullptr on timeout.
  uint8_t* reserve(uint32_t bytes, std::chrono::nanoseconds timeout);
  // Makes the reserved message visible and wakes the consumer when it sleeps.
  void publish();

 private:
  RingView v_;
  uint64_t pending_ = 0;  // head after the reserved message
  uint8_t* reserved_ = nullptr;
  uint32_t reserved_bytes_ = 0;
};

class RingReader {
 public:
  explicit RingReader(RingView v) : v_(v) {}
  // The next message, or nullptr when none is published. Padding is skipped. Sets `corrupt` (and returns
  // nullptr) when a header's length is not a multiple of 8, is shorter than a header, or runs past what was
  // published.
  const MessageHeader* peek(bool& corrupt);
  // The length of the message peek() returned, as validated: use it rather than re-reading the header in
  // shared memory, which the other process may rewrite.
  uint32_t peeked_bytes() const { return peeked_bytes_; }
  // Releases the message returned by peek().
  void consume();
  // Waits up to `timeout` for a message to be published (spin, then futex; with a window ahead, futex until
  // it, spin through it, then futex). True when one is there.
  bool wait(std::chrono::nanoseconds timeout, const SpinWindow& window = {});

 private:
  RingView v_;
  uint64_t next_ = 0;          // tail after the peeked message
  uint32_t peeked_bytes_ = 0;  // 0: nothing peeked
};

}  // namespace dspark::host
