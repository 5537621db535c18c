#include "heartbeat.hpp"

#include <chrono>

#include "lib/host/segment.hpp"
#include "liveness.hpp"

namespace dspark::client {

Heartbeat::Heartbeat(host::SegmentHeader& h, int32_t pid) : h_(h), pid_(pid), thread_([this] { run(); }) {}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Heartbeat::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (h_.host_pid.load(std::memory_order_acquire) == pid_)
      h_.host_heartbeat_ns.store(host::monotonic_ns(), std::memory_order_release);
    cv_.wait_for(lock, std::chrono::milliseconds(kHostHeartbeatPeriodMs), [this] { return stop_; });
  }
}

}  // namespace dspark::client
