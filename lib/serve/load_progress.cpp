#include "lib/serve/load_progress.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "lib/model/shard_report.hpp"

namespace dspark {
namespace {

// Bytes per second as "512.00 MB/s"; an instant load (below a microsecond) counts as one microsecond.
std::string rate(uint64_t bytes, double seconds) {
  return format_bytes(static_cast<uint64_t>(static_cast<double>(bytes) / std::max(seconds, 1e-6))) + "/s";
}

}  // namespace

LoadProgress::LoadProgress(uint64_t total_bytes, std::chrono::milliseconds interval, Sink sink, Clock clock)
    : total_(total_bytes), interval_(interval), sink_(std::move(sink)), clock_(std::move(clock)) {
  start_ = last_line_ = clock_();
  sink_(fmt::format("loading weights: {} for this rank", format_bytes(total_)));
}

double LoadProgress::seconds_since_start() const {
  return std::chrono::duration<double>(clock_() - start_).count();
}

void LoadProgress::add(uint64_t bytes) {
  done_ += bytes;
  const auto now = clock_();
  if (finished_ || now - last_line_ < interval_) return;
  last_line_ = now;
  const double share = total_ == 0 ? 100.0 : 100.0 * static_cast<double>(done_) / static_cast<double>(total_);
  sink_(fmt::format("loading weights: {} of {} ({:.1f} %), {}", format_bytes(done_), format_bytes(total_),
                    share, rate(done_, seconds_since_start())));
}

void LoadProgress::finish() {
  if (finished_) return;
  finished_ = true;
  seconds_ = seconds_since_start();
  sink_(fmt::format("loaded weights: {} in {:.2f} s ({})", format_bytes(done_), seconds_,
                    rate(done_, seconds_)));
}

double LoadProgress::seconds() const {
  return finished_ ? seconds_ : seconds_since_start();
}

}  // namespace dspark
