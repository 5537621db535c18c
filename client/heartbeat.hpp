// Internal: the host's heartbeat thread. The worker drops a host whose host_heartbeat_ns stops moving, so it
// is refreshed by its own thread, whatever the host's threads are doing between calls.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace dspark::client {

class Heartbeat {
 public:
  // Stamps `word` (the host area's host_heartbeat_ns) now and then every period.
  explicit Heartbeat(std::atomic<uint64_t>& word);
  ~Heartbeat();  // stops and joins
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  void run();
  std::atomic<uint64_t>& word_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dspark::client
