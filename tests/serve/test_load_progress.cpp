// LoadProgress: the first line, progress lines no more often than the interval, the final line once.
#include "lib/serve/load_progress.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dspark {
namespace {

using std::chrono::milliseconds;
using ::testing::ElementsAre;

struct Fixture {
  std::chrono::steady_clock::time_point now{};
  std::vector<std::string> lines;
  LoadProgress make(uint64_t total) {
    return LoadProgress(
        total, milliseconds(2000), [this](const std::string& l) { lines.push_back(l); },
        [this] { return now; });
  }
};

TEST(LoadProgress, LinesAtMostOncePerIntervalThenTheFinalLine) {
  Fixture f;
  LoadProgress p = f.make(4'000'000'000);
  f.now += milliseconds(500);
  p.add(1'000'000'000);  // 0.5 s: too soon
  f.now += milliseconds(1500);
  p.add(1'000'000'000);  // 2 s: a line
  f.now += milliseconds(1000);
  p.add(500'000'000);  // 1 s after the last line: none
  f.now += milliseconds(1000);
  p.add(500'000'000);  // 2 s after it: a line
  f.now += milliseconds(1000);
  p.add(1'000'000'000);
  p.finish();
  p.finish();  // once
  EXPECT_EQ(p.done(), 4'000'000'000u);
  EXPECT_THAT(f.lines, ElementsAre("loading weights: 4.00 GB for this rank",
                                   "loading weights: 2.00 GB of 4.00 GB (50.0 %), 1.00 GB/s",
                                   "loading weights: 3.00 GB of 4.00 GB (75.0 %), 750.00 MB/s",
                                   "loaded weights: 4.00 GB in 5.00 s (800.00 MB/s)"));
}

TEST(LoadProgress, AnInstantLoadHasAFiniteRate) {
  Fixture f;
  LoadProgress p = f.make(999);
  p.add(999);
  p.finish();
  EXPECT_THAT(f.lines, ElementsAre("loading weights: 999 B for this rank",
                                   "loaded weights: 999 B in 0.00 s (999.00 MB/s)"));
}

}  // namespace
}  // namespace dspark
