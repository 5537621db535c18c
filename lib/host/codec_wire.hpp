// Internal to the codec: a bounds-checked reader and a plain writer over message bytes. Values are copied
// with memcpy (messages have no alignment guarantee once copied out of the ring).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "lib/api/status.hpp"
#include "lib/host/protocol.hpp"

namespace dspark::host::wire {

inline uint64_t pad8(uint64_t n) {
  return (n + (kMessageAlign - 1)) & ~uint64_t{kMessageAlign - 1};
}

template <typename... Args>
StatusOr invalid(fmt::format_string<Args...> f, Args&&... args) {
  return {Status::invalid_argument, fmt::format(f, std::forward<Args>(args)...)};
}

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  uint64_t left() const { return bytes_.size() - off_; }
  uint64_t offset() const { return off_; }

  template <typename T>
  bool get(T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (left() < sizeof(T)) return false;
    std::memcpy(&v, bytes_.data() + off_, sizeof(T));
    off_ += sizeof(T);
    return true;
  }
  // `n` bytes, or nullptr when fewer are left.
  const uint8_t* take(uint64_t n) {
    if (left() < n) return nullptr;
    const uint8_t* p = bytes_.data() + off_;
    off_ += n;
    return p;
  }
  // Skips the padding to the next multiple of 8; false when it is missing or not zero (a re-encode writes
  // zeros).
  bool pad() {
    const uint64_t n = pad8(off_) - off_;
    const uint8_t* p = take(n);
    if (p == nullptr) return false;
    for (uint64_t i = 0; i < n; ++i)
      if (p[i] != 0) return false;
    return true;
  }

 private:
  std::span<const uint8_t> bytes_;
  uint64_t off_ = 0;
};

class Writer {
 public:
  explicit Writer(uint8_t* dst) : dst_(dst) {}
  uint64_t offset() const { return off_; }

  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    std::memcpy(dst_ + off_, &v, sizeof(T));
    off_ += sizeof(T);
  }
  void bytes(const void* p, uint64_t n) {
    if (n != 0) std::memcpy(dst_ + off_, p, n);
    off_ += n;
  }
  void zeros(uint64_t n) {
    if (n != 0) std::memset(dst_ + off_, 0, n);
    off_ += n;
  }
  void pad() { zeros(pad8(off_) - off_); }

 private:
  uint8_t* dst_;
  uint64_t off_ = 0;
};

}  // namespace dspark::host::wire
