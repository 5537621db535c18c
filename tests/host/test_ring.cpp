// SPSC rings: framing, wrap-around with padding, back-pressure, two threads, futex waits, corrupt headers.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <random>
#include <thread>
#include <utility>

#include "lib/core/error.hpp"
#include "ring_test_util.hpp"

namespace dspark::host {
namespace {

using namespace std::chrono_literals;
using test::check_message;
using test::fill_message;
using test::make_ring;
using test::send;
using Clock = std::chrono::steady_clock;

double thread_cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-3;
}

TEST(Ring, MaxMessageIsHalfTheCapacity) {
  EXPECT_EQ(max_message_bytes(1024), 512u);
  EXPECT_EQ(max_message_bytes(1ull << 20), 1ull << 19);
}

TEST(Ring, RoundTripsInOneThread) {
  auto ring = make_ring(4096);
  RingWriter w(ring->view());
  RingReader r(ring->view());
  bool corrupt = true;
  EXPECT_EQ(r.peek(corrupt), nullptr);
  EXPECT_FALSE(corrupt);
  for (uint64_t id = 0; id < 200; ++id) {
    const auto bytes = static_cast<uint32_t>(16 + 8 * (id % 23));
    ASSERT_TRUE(send(w, bytes, id));
    const MessageHeader* h = r.peek(corrupt);
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(r.peeked_bytes(), bytes);
    EXPECT_TRUE(check_message(h, bytes, id));
    r.consume();
    EXPECT_EQ(r.peek(corrupt), nullptr);
    EXPECT_FALSE(corrupt);
  }
  EXPECT_EQ(ring->producer.head.load(), ring->consumer.tail.load());
}

// Messages of awkward sizes cross the ring's end many times; each crossing writes a padding message first.
TEST(Ring, WrapsWithPaddingAtAwkwardSizes) {
  constexpr uint64_t kCap = 1024;
  auto ring = make_ring(kCap);
  RingWriter w(ring->view());
  RingReader r(ring->view());
  std::mt19937_64 rng(7);
  std::deque<std::pair<uint32_t, uint64_t>> queued;
  uint64_t next_id = 0, received = 0, laps = 0, paddings = 0;
  while (received < 20000) {
    // Write until full, then read a random number of messages.
    for (;;) {
      const auto bytes = static_cast<uint32_t>(16 + 8 * (rng() % 63));  // 16 .. 512
      const uint64_t head = ring->producer.head.load();
      uint8_t* p = w.try_reserve(bytes);
      if (p == nullptr) break;
      fill_message(p, bytes, next_id);
      w.publish();
      const uint64_t after = ring->producer.head.load();
      if (after - head != bytes) {
        ++paddings;
        EXPECT_EQ(after % kCap, bytes);  // continued at offset 0
      }
      laps += after / kCap != head / kCap;
      queued.emplace_back(bytes, next_id++);
    }
    const uint64_t n = 1 + rng() % queued.size();
    for (uint64_t i = 0; i < n; ++i) {
      bool corrupt = false;
      const MessageHeader* h = r.peek(corrupt);
      ASSERT_FALSE(corrupt);
      ASSERT_NE(h, nullptr);
      ASSERT_TRUE(check_message(h, queued.front().first, queued.front().second)) << "message " << received;
      queued.pop_front();
      r.consume();
      ++received;
    }
  }
  EXPECT_GT(laps, 1000u);
  EXPECT_GT(paddings, 500u);
}

// 8 bytes before the end there is room for a padding message's bytes and type only.
TEST(Ring, PadsTheLastEightBytes) {
  constexpr uint64_t kCap = 256;
  auto ring = make_ring(kCap);
  RingWriter w(ring->view());
  RingReader r(ring->view());
  bool corrupt = false;
  for (uint32_t bytes : {112u, 112u, 24u}) {  // head at 248
    ASSERT_TRUE(send(w, bytes, bytes));
    ASSERT_NE(r.peek(corrupt), nullptr);
    r.consume();
  }
  ASSERT_EQ(ring->producer.head.load(), 248u);
  ASSERT_TRUE(send(w, 16, 99));
  EXPECT_EQ(ring->producer.head.load(), 248u + 8 + 16);
  uint32_t pad[2];
  std::memcpy(pad, ring->bytes() + 248, sizeof(pad));
  EXPECT_EQ(pad[0], 8u);
  EXPECT_EQ(pad[1], static_cast<uint32_t>(MessageType::padding));
  const MessageHeader* h = r.peek(corrupt);
  ASSERT_NE(h, nullptr);
  EXPECT_TRUE(check_message(h, 16, 99));
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(h), ring->bytes());
}

TEST(Ring, AFullRingRefusesUntilConsumed) {
  auto ring = make_ring(1024);
  RingWriter w(ring->view());
  RingReader r(ring->view());
  for (uint64_t id = 0; id < 8; ++id) ASSERT_TRUE(send(w, 128, id, 0ns));
  EXPECT_EQ(w.try_reserve(128), nullptr);
  EXPECT_EQ(w.try_reserve(16), nullptr);
  const auto t0 = Clock::now();
  EXPECT_EQ(w.reserve(128, 20ms), nullptr);
  EXPECT_GE(Clock::now() - t0, 20ms);
  bool corrupt = false;
  ASSERT_NE(r.peek(corrupt), nullptr);
  EXPECT_EQ(w.try_reserve(16), nullptr);  // peeked, not yet consumed
  r.consume();
  EXPECT_NE(w.try_reserve(128), nullptr);
}

TEST(Ring, ReserveWaitsForTheConsumer) {
  auto ring = make_ring(1024);
  RingWriter w(ring->view());
  for (uint64_t id = 0; id < 8; ++id) ASSERT_TRUE(send(w, 128, id, 0ns));
  std::thread consumer([&] {
    std::this_thread::sleep_for(50ms);
    RingReader r(ring->view());
    bool corrupt = false;
    if (r.peek(corrupt) != nullptr) r.consume();
  });
  const auto t0 = Clock::now();
  uint8_t* p = w.reserve(128, 5s);
  const auto waited = Clock::now() - t0;
  consumer.join();
  EXPECT_NE(p, nullptr);
  EXPECT_GE(waited, 40ms);
  EXPECT_LT(waited, 2s);
}

TEST(Ring, TwoThreadsExchange100kMessages) {
  constexpr uint64_t kMessages = 100000;
  auto ring = make_ring(64 * 1024);
  uint64_t sent_sum = 0, received_sum = 0;
  std::atomic<bool> producer_ok{true};
  std::thread producer([&] {
    RingWriter w(ring->view());
    std::mt19937_64 rng(11);
    for (uint64_t id = 0; id < kMessages; ++id) {
      const auto bytes = static_cast<uint32_t>(16 + 8 * (rng() % 256));
      uint8_t* p = w.reserve(bytes, 10s);
      if (p == nullptr) {
        producer_ok = false;
        return;
      }
      const MessageHeader h{bytes, static_cast<uint32_t>(MessageType::step), id};
      std::memcpy(p, &h, sizeof(h));
      for (uint32_t i = sizeof(h); i < bytes; ++i) {
        p[i] = static_cast<uint8_t>(rng());
        sent_sum = sent_sum * 31 + p[i];
      }
      w.publish();
    }
  });
  RingReader r(ring->view());
  uint64_t expected_id = 0;
  while (expected_id < kMessages) {
    ASSERT_TRUE(r.wait(10s)) << "after " << expected_id << " messages";
    bool corrupt = false;
    const MessageHeader* h = r.peek(corrupt);
    ASSERT_FALSE(corrupt);
    if (h == nullptr) continue;
    ASSERT_EQ(h->id, expected_id);
    const auto* p = reinterpret_cast<const uint8_t*>(h);
    for (uint32_t i = sizeof(MessageHeader); i < r.peeked_bytes(); ++i)
      received_sum = received_sum * 31 + p[i];
    r.consume();
    ++expected_id;
  }
  producer.join();
  EXPECT_TRUE(producer_ok);
  EXPECT_EQ(received_sum, sent_sum);
}

// The consumer sleeps in the futex (its waiting flag is set) and is woken by the publish, not by its timeout.
TEST(Ring, ASleepingConsumerIsWokenPromptly) {
  auto ring = make_ring(4096);
  RingWriter w(ring->view());
  std::vector<double> latencies_ms;
  for (int round = 0; round < 20; ++round) {
    std::atomic<int64_t> woke_ns{0};
    std::thread consumer([&] {
      RingReader r(ring->view());
      const bool got = r.wait(5s);
      woke_ns = Clock::now().time_since_epoch().count();
      bool corrupt = false;
      if (got && r.peek(corrupt) != nullptr) r.consume();
    });
    while (ring->consumer.waiting.load() == 0) std::this_thread::sleep_for(100us);
    std::this_thread::sleep_for(2ms);  // well into FUTEX_WAIT
    const auto sent = Clock::now();
    ASSERT_TRUE(send(w, 64, static_cast<uint64_t>(round)));
    consumer.join();
    latencies_ms.push_back((woke_ns - sent.time_since_epoch().count()) * 1e-6);
  }
  std::sort(latencies_ms.begin(), latencies_ms.end());
  EXPECT_LT(latencies_ms[latencies_ms.size() / 2], 5.0);
  EXPECT_LT(latencies_ms.back(), 500.0);  // a timeout would be 5000
  EXPECT_EQ(ring->consumer.waiting.load(), 0u);
}

// A wait with a spin window ahead sleeps in the futex until the window opens (its waiting flag set), spins
// through the window (flag clear), and takes a message published there; a message published before the
// window wakes it at once.
TEST(Ring, AWaitWithAWindowSleepsUntilItThenSpins) {
  auto ring = make_ring(4096);
  RingWriter w(ring->view());
  std::atomic<bool> got{false};
  const auto t0 = Clock::now();
  const SpinWindow window{t0 + 100ms, 300ms};
  std::thread consumer([&] {
    RingReader r(ring->view());
    got = r.wait(5s, window);
  });
  const auto flag_becomes = [&](uint32_t v, Clock::time_point until) {
    while (ring->consumer.waiting.load() != v && Clock::now() < until) std::this_thread::sleep_for(100us);
    return ring->consumer.waiting.load() == v;
  };
  EXPECT_TRUE(flag_becomes(1, t0 + 90ms)) << "asleep before the window";
  std::this_thread::sleep_until(t0 + 100ms);
  EXPECT_TRUE(flag_becomes(0, t0 + 350ms)) << "spinning inside it";
  ASSERT_TRUE(send(w, 64, 1));
  consumer.join();
  EXPECT_TRUE(got);
  EXPECT_LT(Clock::now() - t0, 1s);

  std::atomic<int64_t> woke_ns{0};
  const auto t1 = Clock::now();
  std::thread early([&] {
    RingReader r(ring->view());
    bool corrupt = false;
    if (r.peek(corrupt) != nullptr) r.consume();  // the first message
    got = r.wait(5s, SpinWindow{t1 + 2s, 100ms});
    woke_ns = (Clock::now() - t1).count();
  });
  std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(send(w, 64, 2));
  early.join();
  EXPECT_TRUE(got);
  EXPECT_LT(woke_ns.load(), std::chrono::nanoseconds(1s).count()) << "woken by the publish, not the window";
}

// A wait that starts inside its window (the message was expected sooner than the lead) spins through the
// rest of the window before it sleeps: its waiting flag stays clear until the window's end, then is set.
TEST(Ring, AWaitThatStartsInsideItsWindowSpinsToItsEnd) {
  auto ring = make_ring(4096);
  RingWriter w(ring->view());
  std::atomic<bool> got{false};
  const auto t0 = Clock::now();
  const SpinWindow window{t0 - 10ms, 310ms};  // open since 10 ms, ends at t0 + 300 ms
  std::thread consumer([&] {
    RingReader r(ring->view());
    got = r.wait(5s, window);
  });
  bool slept_early = false;
  while (Clock::now() < t0 + 250ms) {
    slept_early |= ring->consumer.waiting.load() != 0;
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_FALSE(slept_early) << "asleep inside its window";
  bool slept_after = false;
  for (const auto until = t0 + 2s; !slept_after && Clock::now() < until; std::this_thread::sleep_for(1ms))
    slept_after = ring->consumer.waiting.load() != 0;
  EXPECT_TRUE(slept_after) << "still spinning after its window";
  ASSERT_TRUE(send(w, 64, 1));
  consumer.join();
  EXPECT_TRUE(got);
}

// The nearer of the last two recorded waits sets the next window; none recorded, or cleared: the plain wait.
TEST(Ring, RecentWaitsExpectTheNearerOfTheLastTwo) {
  const auto t = Clock::now();
  RecentWaits waits;
  EXPECT_EQ(waits.window(t).length, 0ns);
  waits.record(1ms);
  EXPECT_EQ(waits.window(t).length, 0ns) << "one wait recorded: the other counts as none";
  waits.record(3ms);
  SpinWindow w = waits.window(t);
  EXPECT_EQ(w.from, expected_window(t, 1ms).from);
  EXPECT_EQ(w.length, expected_window(t, 1ms).length);
  waits.record(2ms);  // 1 ms drops out: the nearer of 3 and 2
  w = waits.window(t);
  EXPECT_EQ(w.from, t + 2ms - 310us);  // lead 250 us + 60 us
  EXPECT_EQ(w.length, 620us);
  waits.clear();
  EXPECT_EQ(waits.window(t).length, 0ns);
}

TEST(Ring, TheExpectedWindowLeadsByAnEighthWithinBoundsPlusTheTimerSlack) {
  const auto t = Clock::now();
  // 1 ms: lead 125 us + 60 us.
  SpinWindow w = expected_window(t, 1ms);
  EXPECT_EQ(w.from, t + 1ms - 185us);
  EXPECT_EQ(w.length, 370us);
  // 100 us: the lead's floor, 50 us; 100 ms: its ceiling, 500 us.
  w = expected_window(t, 100us);
  EXPECT_EQ(w.from, t + 100us - 110us);
  EXPECT_EQ(w.length, 220us);
  w = expected_window(t, 100ms);
  EXPECT_EQ(w.from, t + 100ms - 560us);
  EXPECT_EQ(w.length, 1120us);
  // Nothing expected: the plain wait.
  w = expected_window(t, 0ns);
  EXPECT_EQ(w.from, Clock::time_point{});
  EXPECT_EQ(w.length, 0ns);
}

TEST(Ring, AnIdleWaitUsesNoCpu) {
  auto ring = make_ring(4096);
  double cpu_ms = 0, wall_ms = 0;
  bool got = true;
  std::thread consumer([&] {
    RingReader r(ring->view());
    const double cpu0 = thread_cpu_ms();
    const auto t0 = Clock::now();
    got = r.wait(200ms);
    wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    cpu_ms = thread_cpu_ms() - cpu0;
  });
  consumer.join();
  EXPECT_FALSE(got);
  EXPECT_GE(wall_ms, 199.0);
  EXPECT_LT(wall_ms, 1000.0);
  EXPECT_LT(cpu_ms, 20.0);
}

TEST(Ring, AProducerWaitingForSpaceUsesNoCpu) {
  auto ring = make_ring(1024);
  RingWriter w(ring->view());
  for (uint64_t id = 0; id < 8; ++id) ASSERT_TRUE(send(w, 128, id, 0ns));
  double cpu_ms = 0;
  uint8_t* p = reinterpret_cast<uint8_t*>(1);
  std::thread producer([&] {
    const double cpu0 = thread_cpu_ms();
    p = w.reserve(128, 200ms);
    cpu_ms = thread_cpu_ms() - cpu0;
  });
  producer.join();
  EXPECT_EQ(p, nullptr);
  EXPECT_LT(cpu_ms, 20.0);
}

TEST(Ring, RejectsBadSizesAndMisuse) {
  auto ring = make_ring(1024);
  RingWriter w(ring->view());
  EXPECT_THROW(w.try_reserve(20), Error);   // not a multiple of 8
  EXPECT_THROW(w.try_reserve(8), Error);    // shorter than a header
  EXPECT_THROW(w.try_reserve(520), Error);  // over half the ring
  EXPECT_THROW(w.reserve(520, 1ms), Error);
  EXPECT_THROW(w.publish(), Error);  // nothing reserved
  uint8_t* p = w.try_reserve(64);
  ASSERT_NE(p, nullptr);
  fill_message(p, 32, 1);  // header disagrees with the reservation
  EXPECT_THROW(w.publish(), Error);
}

// A header in the ring as a broken or hostile producer might leave it.
struct Corruption {
  const char* what;
  uint64_t tail, head;
  uint32_t bytes, type;
};

TEST(Ring, DetectsCorruptHeaders) {
  constexpr uint64_t kCap = 1024;
  const uint32_t step = static_cast<uint32_t>(MessageType::step);
  const uint32_t padding = static_cast<uint32_t>(MessageType::padding);
  const Corruption cases[] = {
      {"length not a multiple of 8", 0, 24, 20, step},
      {"length zero", 0, 64, 0, step},
      {"shorter than a header", 0, 8, 8, step},
      {"longer than published", 0, 32, 64, step},
      {"longer than the largest message", 0, 600, 600, step},
      {"crossing the ring's end", 1008, 1008 + 64, 48, step},
      {"padding not ending at the ring's end", 0, 64, 32, padding},
      {"more published than the capacity", 0, kCap + 8, 16, step},
      {"a head behind the tail", 64, 32, 16, step},
      {"a misaligned tail", 4, 36, 16, step},
      {"a length of 4 GiB - 8", 0, 64, 0xFFFFFFF8u, step},
  };
  for (const Corruption& c : cases) {
    auto ring = make_ring(kCap);
    const uint32_t words[2] = {c.bytes, c.type};
    std::memcpy(ring->bytes() + (c.tail & (kCap - 1)), words, sizeof(words));
    ring->consumer.tail = c.tail;
    ring->producer.head = c.head;
    RingReader r(ring->view());
    bool corrupt = false;
    EXPECT_EQ(r.peek(corrupt), nullptr) << c.what;
    EXPECT_TRUE(corrupt) << c.what;
    EXPECT_EQ(ring->consumer.tail.load(), c.tail) << c.what;
    r.consume();
    EXPECT_EQ(ring->consumer.tail.load(), c.tail) << c.what;
  }
}

// A producer that finds the tail corrupted (ahead of its head) times out instead of overwriting anything.
TEST(Ring, AWriterFacingACorruptTailTimesOut) {
  auto ring = make_ring(1024);
  ring->producer.head = 64;
  ring->consumer.tail = 128;
  RingWriter w(ring->view());
  EXPECT_EQ(w.try_reserve(16), nullptr);
  EXPECT_EQ(w.reserve(16, 5ms), nullptr);
}

// Garbage in the other side's flags and futex words costs wake-ups, never a lost message or a hang.
TEST(Ring, GarbageInTheOtherSidesWaitWordsIsHarmless) {
  auto ring = make_ring(1024);
  RingWriter w(ring->view());
  RingReader r(ring->view());
  ring->consumer.waiting = 0xdeadbeef;  // as a hostile consumer
  ring->producer.waiting = 0xdeadbeef;  // as a hostile producer
  ring->consumer.seq = 77;
  for (uint64_t id = 0; id < 50; ++id) {
    ASSERT_TRUE(send(w, 64, id, 100ms));
    ASSERT_TRUE(r.wait(100ms));
    bool corrupt = false;
    const MessageHeader* h = r.peek(corrupt);
    ASSERT_NE(h, nullptr);
    EXPECT_TRUE(check_message(h, 64, id));
    r.consume();
  }
}

}  // namespace
}  // namespace dspark::host
