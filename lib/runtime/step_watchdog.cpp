#include "lib/runtime/step_watchdog.hpp"

namespace dspark {

StepWatchdog::StepWatchdog(std::chrono::milliseconds timeout, Expired on_expired)
    : timeout_(timeout), on_expired_(std::move(on_expired)) {
  thread_ = std::thread([this] { watch(); });
}

StepWatchdog::~StepWatchdog() {
  {
    std::lock_guard lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StepWatchdog::arm(uint64_t step_id) {
  {
    std::lock_guard lock(mu_);
    armed_ = true;
    step_ = step_id;
    started_ = std::chrono::steady_clock::now();
  }
  cv_.notify_all();
}

void StepWatchdog::disarm() {
  std::lock_guard lock(mu_);
  armed_ = false;
}

void StepWatchdog::watch() {
  std::unique_lock lock(mu_);
  while (!quit_ && !fired_) {
    if (!armed_) {
      cv_.wait(lock, [this] { return quit_ || armed_; });
      continue;
    }
    const auto started = started_;
    // Woken early by a disarm + re-arm (a new start) or quit; otherwise the step is over its time.
    if (cv_.wait_until(lock, started + timeout_, [&] { return quit_ || !armed_ || started_ != started; }))
      continue;
    fired_ = true;
    const uint64_t step = step_;
    const auto ran =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    lock.unlock();
    on_expired_(step, ran);
    return;
  }
}

}  // namespace dspark
