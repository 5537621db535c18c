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

// A 16-bit float (bf16, f16) is not finite when its magnitude bits (all but the sign) are at least
// infinity's. Those magnitudes are non-negative int16_t, so a chunk's test is one signed maximum: two vector
// operations an element group (and, max) instead of the compare's four. Built for AVX2 beside the baseline,
// the processor's choice made once at load (GCC's target_clones).
constexpr size_t kChunk16 = 2048;  // elements: 4 KiB
__attribute__((target_clones("avx2", "default"))) int16_t chunk_max_magnitude16(const unsigned char* p) {
  int16_t m = 0;
  for (size_t j = 0; j < kChunk16; ++j) {
    uint16_t v;
    std::memcpy(&v, p + 2 * j, 2);
    const auto x = static_cast<int16_t>(v & 0x7fffu);
    m = x > m ? x : m;
  }
  return m;
}

int64_t scan16(const unsigned char* p, int64_t count, uint16_t inf) {
  int64_t i = 0;
  while (i + static_cast<int64_t>(kChunk16) <= count &&
         chunk_max_magnitude16(p + static_cast<size_t>(i) * 2) < static_cast<int16_t>(inf))
    i += static_cast<int64_t>(kChunk16);
  for (; i < count; ++i) {
    uint16_t v;
    std::memcpy(&v, p + static_cast<size_t>(i) * 2, 2);
    if ((v & 0x7fffu) >= inf) return i;
  }
  return -1;
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

constexpr uint16_t kBf16Inf = 0x7f80u, kF16Inf = 0x7c00u;  // magnitude bits of +Inf

}  // namespace

int64_t first_non_finite(DType dtype, const void* data, int64_t count) {
  const auto* p = static_cast<const unsigned char*>(data);
  switch (dtype) {
    case DType::bf16:
      return scan16(p, count, kBf16Inf);
    case DType::f16:
      return scan16(p, count, kF16Inf);
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
  constexpr auto kChunk = static_cast<int64_t>(kChunk16);
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  int64_t i = 0;
  for (; i + kChunk <= count; i += kChunk) {
    unsigned char* piece = d + static_cast<size_t>(i) * 2;
    std::memcpy(piece, s + static_cast<size_t>(i) * 2, kChunk16 * 2);
    if (chunk_max_magnitude16(piece) >= static_cast<int16_t>(kBf16Inf)) break;
  }
  // The rest of the values, and the piece that holds the first non-finite one (where it lies in it).
  std::memcpy(d + static_cast<size_t>(i) * 2, s + static_cast<size_t>(i) * 2,
              static_cast<size_t>(count - i) * 2);
  const int64_t at = scan16(d + static_cast<size_t>(i) * 2, count - i, kBf16Inf);
  return at < 0 ? -1 : i + at;
}

}  // namespace dspark
