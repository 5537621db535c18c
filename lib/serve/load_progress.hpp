// A rank's weight-loading progress for its log: a first line with the bytes this rank will read, then bytes
// loaded, share and rate at most once per interval, and a final line with the time and the mean rate. A large
// checkpoint takes minutes to load; these lines say that a starting worker is moving and how fast.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace dspark {

class LoadProgress {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  using Sink = std::function<void(const std::string& line)>;

  // Writes the first line to `sink` at once. `clock` is injectable for tests.
  LoadProgress(
      uint64_t total_bytes, std::chrono::milliseconds interval, Sink sink,
      Clock clock = [] { return std::chrono::steady_clock::now(); });

  // `bytes` more have been read and uploaded; writes a progress line when `interval` has passed since the
  // last line.
  void add(uint64_t bytes);
  // Writes the final line (once; later calls do nothing).
  void finish();

  uint64_t done() const { return done_; }
  // Seconds from the start to finish() (to now before it).
  double seconds() const;

 private:
  double seconds_since_start() const;

  uint64_t total_;
  uint64_t done_ = 0;
  std::chrono::milliseconds interval_;
  Sink sink_;
  Clock clock_;
  std::chrono::steady_clock::time_point start_, last_line_;
  bool finished_ = false;
  double seconds_ = 0;  // at finish()
};

}  // namespace dspark
