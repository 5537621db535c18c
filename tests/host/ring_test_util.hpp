// Test helpers for rings: a ring in private memory and messages whose payload is a function of their id.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "lib/host/protocol.hpp"
#include "lib/host/ring.hpp"

namespace dspark::host::test {

struct LocalRing {
  explicit LocalRing(uint64_t capacity) : data(capacity / sizeof(uint64_t)) {}
  RingProducerControl producer{};
  RingConsumerControl consumer{};
  std::vector<uint64_t> data;  // 8-aligned, as ring data is in an area
  RingView view() {
    return {&producer, &consumer, reinterpret_cast<uint8_t*>(data.data()), data.size() * sizeof(uint64_t)};
  }
  uint8_t* bytes() { return reinterpret_cast<uint8_t*>(data.data()); }
};

inline std::unique_ptr<LocalRing> make_ring(uint64_t capacity) {
  return std::make_unique<LocalRing>(capacity);
}

inline uint8_t pattern(uint64_t id, uint32_t i) {
  return static_cast<uint8_t>((id * 0x9E3779B97F4A7C15ull + i * 131u) >> 29);
}

// Fills a reserved message: header, then the id's pattern.
inline void fill_message(uint8_t* p, uint32_t bytes, uint64_t id) {
  const MessageHeader h{bytes, static_cast<uint32_t>(MessageType::step), id};
  std::memcpy(p, &h, sizeof(h));
  for (uint32_t i = sizeof(h); i < bytes; ++i) p[i] = pattern(id, i);
}

// True when the message is the one fill_message wrote for (bytes, id).
inline bool check_message(const MessageHeader* h, uint32_t bytes, uint64_t id) {
  if (h->bytes != bytes || h->id != id || h->type != static_cast<uint32_t>(MessageType::step)) return false;
  const auto* p = reinterpret_cast<const uint8_t*>(h);
  for (uint32_t i = sizeof(MessageHeader); i < bytes; ++i)
    if (p[i] != pattern(id, i)) return false;
  return true;
}

inline bool send(RingWriter& w, uint32_t bytes, uint64_t id,
                 std::chrono::nanoseconds timeout = std::chrono::seconds(10)) {
  uint8_t* p = w.reserve(bytes, timeout);
  if (p == nullptr) return false;
  fill_message(p, bytes, id);
  w.publish();
  return true;
}

}  // namespace dspark::host::test
