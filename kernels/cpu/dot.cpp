// The CPU kernels' dot product. Its order is fixed by n alone: lane j (0..15) adds a[i] b[i] for the i = j
// mod 16 in index order; then lanes j and j + 8 are added, then j and j + 4, j and j + 2, j and j + 1 (a
// tree). Every product and sum is rounded to fp32 (no contraction: the CPU backend is compiled with
// -ffp-contract=off), so the result has the same bits on any x86-64. The vector builds (chosen once, by what
// the CPU has) keep a row's 16 lanes in one AVX-512 register or two AVX2 ones and run several rows against
// one b at a time; the portable build is the plain loops. b may be bf16 (each value exactly its fp32 value,
// widened in registers): no fp32 copy of a weight row is made.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <utility>

#include "kernels/cpu/element.hpp"

namespace dspark::cpu {
namespace {

constexpr int kLanes = 16;

inline float value(const float* b, int64_t i) {
  return b[i];
}
inline float value(const uint16_t* b, int64_t i) {
  return std::bit_cast<float>(static_cast<uint32_t>(b[i]) << 16);
}

// Lanes l[0..16) after the vector part: the rest of the row in index order, then the tree.
template <class B>
float finish(float* l, const float* a, const B* b, int64_t i, int64_t n) {
  for (int j = 0; i + j < n; ++j) l[j] += a[i + j] * value(b, i + j);
  for (int s = kLanes / 2; s > 0; s /= 2)
    for (int j = 0; j < s; ++j) l[j] += l[j + s];
  return l[0];
}

template <class B>
void dot_rows_portable(const float* const* a, int64_t m, const B* b, int64_t n, float* out) {
  for (int64_t r = 0; r < m; ++r) {
    float l[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int j = 0; j < kLanes; ++j) l[j] += a[r][i + j] * value(b, i + j);
    out[r] = finish(l, a[r], b, i, n);
  }
}

// ---- AVX2: lanes 0..7 of row r in lo[r], 8..15 in hi[r]

__attribute__((target("avx2"))) inline __m256 load8(const float* b, int64_t i) {
  return _mm256_loadu_ps(b + i);
}
__attribute__((target("avx2"))) inline __m256 load8(const uint16_t* b, int64_t i) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

template <int R, class B>
__attribute__((target("avx2"))) void group_avx2(const float* const* a, const B* b, int64_t n, float* out) {
  __m256 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m256 b0 = load8(b, i), b1 = load8(b, i + 8);
    for (int r = 0; r < R; ++r) {
      lo[r] = _mm256_add_ps(lo[r], _mm256_mul_ps(_mm256_loadu_ps(a[r] + i), b0));
      hi[r] = _mm256_add_ps(hi[r], _mm256_mul_ps(_mm256_loadu_ps(a[r] + i + 8), b1));
    }
  }
  for (int r = 0; r < R; ++r) {
    if (i == n) {  // the tree in registers: the same pairs as finish's loops
      const __m256 s8 = _mm256_add_ps(lo[r], hi[r]);                                           // j + 8
      const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));  // j + 4
      const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                                 // j + 2
      out[r] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));                             // j + 1
      continue;
    }
    alignas(32) float l[kLanes];
    _mm256_store_ps(l, lo[r]);
    _mm256_store_ps(l + 8, hi[r]);
    out[r] = finish(l, a[r], b, i, n);
  }
}

template <class B>
__attribute__((target("avx2"))) void rows_avx2(const float* const* a, int64_t m, const B* b, int64_t n,
                                               float* out) {
  int64_t r = 0;
  for (; r + 4 <= m; r += 4) group_avx2<4>(a + r, b, n, out + r);
  if (m - r >= 2) group_avx2<2>(a + r, b, n, out + r), r += 2;
  if (m - r >= 1) group_avx2<1>(a + r, b, n, out + r);
}

// ---- AVX-512: row r's 16 lanes in acc[r]

__attribute__((target("avx512f,avx512dq"))) inline __m512 load16(const float* b, int64_t i) {
  return _mm512_loadu_ps(b + i);
}
__attribute__((target("avx512f,avx512dq"))) inline __m512 load16(const uint16_t* b, int64_t i) {
  // The zero-masked forms: GCC 12's unmasked ones start from an "undefined" register it then warns about.
  const __m512i w =
      _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i)));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, w, 16));
}

template <int R, class B>
__attribute__((target("avx512f,avx512dq"))) void group_avx512(const float* const* a, const B* b, int64_t n,
                                                              float* out) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m512 bv = load16(b, i);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_loadu_ps(a[r] + i), bv));
  }
  for (int r = 0; r < R; ++r) {
    if (i == n) {  // the tree in registers: the same pairs as finish's loops
      const __m256 s8 = _mm256_add_ps(_mm512_extractf32x8_ps(acc[r], 0), _mm512_extractf32x8_ps(acc[r], 1));
      const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
      const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
      out[r] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
      continue;
    }
    alignas(64) float l[kLanes];
    _mm512_store_ps(l, acc[r]);
    out[r] = finish(l, a[r], b, i, n);
  }
}

// Up to 16 rows in one pass (16 accumulators and b in 17 of the 32 registers): a step's T = B k rows read
// each weight row once.
template <class B, size_t... R>
constexpr auto avx512_groups(std::index_sequence<R...>) {
  return std::array<void (*)(const float* const*, const B*, int64_t, float*), sizeof...(R)>{
      &group_avx512<static_cast<int>(R) + 1, B>...};
}

template <class B>
void rows_avx512(const float* const* a, int64_t m, const B* b, int64_t n, float* out) {
  static constexpr auto kGroup = avx512_groups<B>(std::make_index_sequence<16>{});
  for (int64_t r = 0; r < m; r += 16) {
    const int64_t rows = std::min<int64_t>(16, m - r);
    kGroup[static_cast<size_t>(rows - 1)](a + r, b, n, out + r);
  }
}

enum class Build { portable, avx2, avx512 };
const Build kBuild = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") ? Build::avx512
                     : __builtin_cpu_supports("avx2")                                        ? Build::avx2
                                                      : Build::portable;

template <class B>
void dispatch(const float* const* a, int64_t m, const B* b, int64_t n, float* out) {
  switch (kBuild) {
    case Build::avx512:
      return rows_avx512(a, m, b, n, out);
    case Build::avx2:
      return rows_avx2(a, m, b, n, out);
    case Build::portable:
      return dot_rows_portable(a, m, b, n, out);
  }
}

}  // namespace

void dot_rows(const float* const* a, int64_t m, const float* b, int64_t n, float* out) {
  dispatch(a, m, b, n, out);
}

void dot_rows(const float* const* a, int64_t m, const uint16_t* b, int64_t n, float* out) {
  dispatch(a, m, b, n, out);
}

float dot(const float* a, const float* b, int64_t n) {
  float out = 0.0f;
  dot_rows(&a, 1, b, n, &out);
  return out;
}

}  // namespace dspark::cpu
