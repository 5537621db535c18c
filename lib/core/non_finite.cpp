#include "lib/core/non_finite.hpp"

#include <cstddef>
#include <cstring>

namespace dspark {
namespace {

// An element is not finite when (bits & mask) == value. The scan ORs that test over fixed-size chunks, a loop
// GCC vectorises at -O2 (known trip count, unsigned accumulator, size_t index: -fopt-info-vec reports it),
// and looks for the exact element only in the chunk that has one.
template <typename U>
bool chunk_has(const unsigned char* p, U mask, U value) {
  constexpr size_t kChunk = 4096 / sizeof(U);
  U acc = 0;
  for (size_t j = 0; j < kChunk; ++j) {
    U v;
    std::memcpy(&v, p + j * sizeof(U), sizeof(U));
    acc |= static_cast<U>((v & mask) == value);
  }
  return acc != 0;
}

template <typename U>
int64_t scan(const unsigned char* p, int64_t count, U mask, U value) {
  constexpr int64_t kChunk = 4096 / sizeof(U);
  int64_t i = 0;
  while (i + kChunk <= count && !chunk_has<U>(p + static_cast<size_t>(i) * sizeof(U), mask, value))
    i += kChunk;
  for (; i < count; ++i) {
    U v;
    std::memcpy(&v, p + static_cast<size_t>(i) * sizeof(U), sizeof(U));
    if (static_cast<U>(v & mask) == value) return i;
  }
  return -1;
}

constexpr uint16_t kBf16ExponentMask = 0x7f80u;  // all ones: NaN or +-Inf

}  // namespace

int64_t first_non_finite(DType dtype, const void* data, int64_t count) {
  const auto* p = static_cast<const unsigned char*>(data);
  switch (dtype) {
    case DType::bf16:
      return scan<uint16_t>(p, count, kBf16ExponentMask, kBf16ExponentMask);
    case DType::f16:
      return scan<uint16_t>(p, count, 0x7c00u, 0x7c00u);
    case DType::f32:
      return scan<uint32_t>(p, count, 0x7f800000u, 0x7f800000u);
    case DType::f8_e4m3:
      return scan<uint8_t>(p, count, 0x7fu, 0x7fu);
    case DType::f8_e8m0:
      return scan<uint8_t>(p, count, 0xffu, 0xffu);
    default:
      return -1;
  }
}

int64_t copy_bf16_first_non_finite(void* dst, const void* src, int64_t count) {
  constexpr int64_t kChunk = 4096 / sizeof(uint16_t);
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  int64_t i = 0;
  for (; i + kChunk <= count; i += kChunk) {
    unsigned char* piece = d + static_cast<size_t>(i) * sizeof(uint16_t);
    std::memcpy(piece, s + static_cast<size_t>(i) * sizeof(uint16_t), kChunk * sizeof(uint16_t));
    if (chunk_has<uint16_t>(piece, kBf16ExponentMask, kBf16ExponentMask)) break;
  }
  // The rest of the values, and the piece that holds the first non-finite one (where it lies in it).
  std::memcpy(d + static_cast<size_t>(i) * sizeof(uint16_t), s + static_cast<size_t>(i) * sizeof(uint16_t),
              static_cast<size_t>(count - i) * sizeof(uint16_t));
  const int64_t at = scan<uint16_t>(d + static_cast<size_t>(i) * sizeof(uint16_t), count - i,
                                    kBf16ExponentMask, kBf16ExponentMask);
  return at < 0 ? -1 : i + at;
}

}  // namespace dspark
