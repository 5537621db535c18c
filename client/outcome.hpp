// Internal: the result of a client operation (a C status and its reason) and per-call deadlines.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "dspark_client.h"
#include "lib/api/status.hpp"

namespace dspark::client {

struct Outcome {
  dspark_status status = DSPARK_OK;
  std::string message;
  bool ok() const { return status == DSPARK_OK; }
};

inline Outcome failed(dspark_status s, std::string message) {
  return {s, std::move(message)};
}

// The wire carries dspark::Status; the C enum uses the same numbers (anything else is the worker's bug).
inline dspark_status to_c_status(Status s) {
  static_assert(static_cast<int>(Status::invalid_argument) == DSPARK_INVALID_ARGUMENT);
  static_assert(static_cast<int>(Status::resource_exhausted) == DSPARK_RESOURCE_EXHAUSTED);
  static_assert(static_cast<int>(Status::unavailable) == DSPARK_UNAVAILABLE);
  static_assert(static_cast<int>(Status::internal) == DSPARK_INTERNAL);
  const auto v = static_cast<uint32_t>(s);
  return v <= DSPARK_INTERNAL ? static_cast<dspark_status>(v) : DSPARK_INTERNAL;
}

// One deadline per API call: a step split into several messages shares it.
class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Deadline(int32_t timeout_ms)
      : ms_(std::max<int32_t>(timeout_ms, 0)), end_(Clock::now() + std::chrono::milliseconds(ms_)) {}
  std::chrono::nanoseconds left() const {
    return std::max<std::chrono::nanoseconds>(end_ - Clock::now(), std::chrono::nanoseconds::zero());
  }
  bool expired() const { return Clock::now() >= end_; }
  int32_t ms() const { return ms_; }

 private:
  int32_t ms_;
  Clock::time_point end_;
};

}  // namespace dspark::client
