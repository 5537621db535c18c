// Internal: the host's heartbeat thread. The worker drops a host whose host_heartbeat_ns stops moving, so it
// is refreshed by its own thread, whatever the host's threads are doing between calls.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "lib/host/protocol.hpp"

namespace dspark::client {

class Heartbeat {
 public:
  // Refreshes h.host_heartbeat_ns every period while h.host_pid is `pid` (never another host's heartbeat).
  Heartbeat(host::SegmentHeader& h, int32_t pid);
  ~Heartbeat();  // stops and joins
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  void run();
  host::SegmentHeader& h_;
  int32_t pid_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dspark::client
