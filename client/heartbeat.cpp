#include "heartbeat.hpp"

#include <chrono>

#include "lib/host/liveness.hpp"
#include "liveness.hpp"

namespace dspark::client {

Heartbeat::Heartbeat(std::atomic<uint64_t>& word) : word_(word) {
  word_.store(host::monotonic_ns(), std::memory_order_release);
  thread_ = std::thread([this] { run(); });
}

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
    word_.store(host::monotonic_ns(), std::memory_order_release);
    cv_.wait_for(lock, std::chrono::milliseconds(kHostHeartbeatPeriodMs), [this] { return stop_; });
  }
}

}  // namespace dspark::client
