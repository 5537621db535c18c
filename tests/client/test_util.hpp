// Small helpers of the client tests: unique ring names, timing, deterministic context rows.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "client/dspark_client.h"

namespace dspark::test {

inline std::string unique_ring_name() {
  static std::atomic<int> n{0};
  return "/dspark-test-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

// Whether done() becomes true within `limit` (polled every millisecond).
template <typename Done>
bool eventually(Done done, std::chrono::milliseconds limit = std::chrono::seconds(2)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Row r of a send: every value encodes (slot, position, index), so misplaced or reordered rows show.
inline std::vector<uint16_t> make_rows(int32_t slot, int32_t first_pos, int32_t rows, uint32_t row_values) {
  std::vector<uint16_t> v(static_cast<size_t>(rows) * row_values);
  for (int32_t r = 0; r < rows; ++r)
    for (uint32_t i = 0; i < row_values; ++i)
      v[static_cast<size_t>(r) * row_values + i] =
          static_cast<uint16_t>(slot * 4099 + (first_pos + r) * 37 + static_cast<int32_t>(i));
  return v;
}

// RAII over a C handle for tests that need the raw API.
struct Attached {
  dspark_client* c = nullptr;
  dspark_status status = DSPARK_INTERNAL;
  Attached(const std::string& name, int32_t timeout_ms) {
    status = dspark_attach(name.c_str(), timeout_ms, &c);
  }
  ~Attached() { dspark_detach(c); }
  Attached(const Attached&) = delete;
  Attached& operator=(const Attached&) = delete;
};

}  // namespace dspark::test
