// StepWatchdog: a step armed past its bound is reported once, with its id and how long it ran; steps that end
// in time, re-arms and a destroyed watchdog report nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "lib/runtime/step_watchdog.hpp"

namespace dspark {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Record {
  std::atomic<int> fired{0};
  std::atomic<uint64_t> step{0};
  std::atomic<int64_t> ran_ms{-1};
  StepWatchdog::Expired callback() {
    return [this](uint64_t s, std::chrono::milliseconds ran) {
      step = s;
      ran_ms = ran.count();
      ++fired;
    };
  }
  bool wait_fired(std::chrono::milliseconds limit) const {
    const auto end = Clock::now() + limit;
    while (fired == 0 && Clock::now() < end) std::this_thread::sleep_for(1ms);
    return fired > 0;
  }
};

TEST(StepWatchdog, AStepPastItsBoundIsReportedOnceWithItsIdAndTime) {
  Record r;
  StepWatchdog w(50ms, r.callback());
  const auto t0 = Clock::now();
  w.arm(7);
  ASSERT_TRUE(r.wait_fired(5s));
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  EXPECT_EQ(r.step, 7u);
  EXPECT_GE(r.ran_ms, 50);
  EXPECT_GE(waited, 50);
  // Reported once: the watchdog stops watching after it fired (the caller ends the process).
  w.disarm();
  w.arm(8);
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(r.fired, 1);
}

TEST(StepWatchdog, StepsThatEndInTimeAreNotReported) {
  Record r;
  {
    StepWatchdog w(200ms, r.callback());
    for (uint64_t s = 1; s <= 10; ++s) {
      w.arm(s);
      std::this_thread::sleep_for(20ms);
      w.disarm();
    }
    std::this_thread::sleep_for(300ms);  // idle (disarmed) for longer than the bound
  }
  EXPECT_EQ(r.fired, 0);
}

TEST(StepWatchdog, ANewStepRestartsTheClock) {
  Record r;
  StepWatchdog w(150ms, r.callback());
  w.arm(1);
  std::this_thread::sleep_for(100ms);
  w.arm(2);  // step 1 ended without a disarm; step 2 has its own 150 ms
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(r.fired, 0);  // 200 ms after step 1 began, 100 ms into step 2
  ASSERT_TRUE(r.wait_fired(5s));
  EXPECT_EQ(r.step, 2u);
  EXPECT_GE(r.ran_ms, 150);
}

TEST(StepWatchdog, DestroyingAnArmedWatchdogReportsNothingAndReturnsAtOnce) {
  Record r;
  const auto t0 = Clock::now();
  {
    StepWatchdog w(10s, r.callback());
    w.arm(3);
  }
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_EQ(r.fired, 0);
}

}  // namespace
}  // namespace dspark
