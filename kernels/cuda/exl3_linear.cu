// The EXL3 linear (SPEC §9) in three launches: the input transform of every row (a warp per 128-block, the
// reference's bits), the product of x' with W_dec decoded tile by tile in registers (fp16 mma, fp32
// accumulation, partial sums per k split), and the splits' sum in split order followed by the output
// transform. The product streams each run of tiles of a trellis row once per pass of up to 40 rows, through a
// warp-private cp.async pipeline.
#include <cuda_fp16.h>

#include "kernels/cuda/exl3_decode.cuh"
#include "kernels/cuda/moe_units.cuh"

namespace dspark::cuda {
namespace {

constexpr int kGemmWarps = 4;    // warps of a product block, splitting its k range
constexpr int kBlockRows = 128;  // a Hadamard block
constexpr int kRowWarps = 8;     // 128-blocks per block of the transform kernels

__device__ __forceinline__ void load_bf16x4(const uint16_t* p, float (&v)[4]) {
  const uint2 q = *reinterpret_cast<const uint2*>(p);
  v[0] = bf16_bits_to_float(static_cast<uint16_t>(q.x));
  v[1] = bf16_bits_to_float(static_cast<uint16_t>(q.x >> 16));
  v[2] = bf16_bits_to_float(static_cast<uint16_t>(q.y));
  v[3] = bf16_bits_to_float(static_cast<uint16_t>(q.y >> 16));
}

// Block (8 128-blocks, pair p, matrix m).
__global__ void __launch_bounds__(kRowWarps * 32)
    exl3_transform_rows_kernel(const uint16_t* x, int64_t x_stride, int64_t C, const int32_t* ids, int64_t E,
                               int64_t P, int64_t in, int mat0, const __grid_constant__ Exl3Table table,
                               uint16_t* xh) {
  wait_for_previous_kernels();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t b = blockIdx.x * static_cast<int64_t>(kRowWarps) + warp, p = blockIdx.y;
  const int m = static_cast<int>(blockIdx.z);
  if (b * kBlockRows >= in) return;
  const int32_t e = ids ? ids[p] : -1;
  if (ids && (e < 0 || e >= E)) return;
  const int64_t i0 = b * kBlockRows + 4 * lane;
  float v[4];
  load_bf16x4(x + (p / C) * x_stride + i0, v);
  const auto* suh = static_cast<const uint16_t*>(table.suh[mat0 + m][e + 1]);
  const uint2 h = exl3_input_block(v, suh + i0, lane);
  *reinterpret_cast<uint2*>(xh + (m * P + p) * in + i0) = h;
}

// Tiles (16 outputs each) of a product block: a whole 128-output Hadamard block for up to two groups of 8
// rows, half of one for more (their accumulators would not fit).
template <int R>
constexpr int kBlockTiles = R <= 2 ? 8 : 4;
// Up to two groups of rows stage their x' with the trellis (its loads would otherwise stall each row); more
// groups load theirs from L1 / L2 beside the mma work of their passes.
template <int R>
constexpr bool kStagesX = R <= 2;
// Bytes of one pipeline stage (a trellis row of the block's tiles, and x' for its 16 inputs when staged) and
// the stages a warp has in flight (a power of 2): 8, or 4 for the larger stages, which keeps a block's shared
// memory under the 48 KiB a launch gets without asking.
template <int K, int R>
constexpr int kStageBytes = kBlockTiles<R> * 32 * K + (kStagesX<R> ? 8 * R * 32 : 0);
template <int K, int R>
constexpr int kStages = kStageBytes<K, R> <= 1280 ? 8 : 4;

// Block (16 kBlockTiles outputs, k split, unit u x matrix m): for each pass of up to 8R of the unit's pairs,
// every warp multiplies its share of the split's trellis rows, tile by tile, into fp32 accumulators; the four
// warps' sums are added in warp order and stored as the split's partial. A pipeline stage holds one trellis
// row of the block's tiles (and the pass's x' for those 16 inputs, kStagesX), so the loads' latency is
// hidden.
template <Exl3Cb kCb, int K, int R>
__global__ void __launch_bounds__(kGemmWarps * 32)
    exl3_gemm_kernel(const uint16_t* xh, int64_t P, MoeGroups g, int mat0, int M, Exl3Shape sh,
                     int64_t splits, const __grid_constant__ Exl3Table table, float* part) {
  constexpr int NT = kBlockTiles<R>, kDepth = kStages<K, R>, kBytes = kStageBytes<K, R>;
  constexpr bool kStagedX = kStagesX<R>;
  constexpr int kTileBytes = 32 * K, kWBytes = NT * kTileBytes, kXBytes = 8 * R * 32;
  constexpr int kWChunks = kWBytes / 16, kXChunks = kXBytes / 16;
  static_assert(
      size_t{kGemmWarps} * kDepth * kBytes + sizeof(float) * (kGemmWarps - 1) * R * 32 * 4 <= 48 * 1024,
      "a block's shared memory");
  constexpr int kXPerLane = (kXChunks + 31) / 32;
  wait_for_previous_kernels();
  extern __shared__ uint4 exl3_stages[];
  __shared__ float red[kGemmWarps - 1][R][32][4];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t u = blockIdx.z / M;
  const int m = static_cast<int>(blockIdx.z % M);
  if (u >= g.count()) return;
  const int32_t e = g.expert(u);
  const Exl3LaneWindow lw = exl3_lane_window<K>(lane);
  const int64_t ktiles = sh.in / 16, tn0 = blockIdx.x * int64_t{NT};
  const int64_t per_split = (ktiles + splits - 1) / splits, ks0 = blockIdx.y * per_split;
  const int64_t ks1 = ks0 + per_split < ktiles ? ks0 + per_split : ktiles;
  const int64_t per_warp = (per_split + kGemmWarps - 1) / kGemmWarps;
  const int64_t k0 = ks0 + warp * per_warp < ks1 ? ks0 + warp * per_warp : ks1;
  const int64_t k1 = k0 + per_warp < ks1 ? k0 + per_warp : ks1;
  const int64_t row_bytes = sh.out / 16 * kTileBytes;  // one trellis row
  const char* const wsrc = static_cast<const char*>(table.trellis[mat0 + m][e + 1]) + tn0 * kTileBytes;
  char* const buf = reinterpret_cast<char*>(exl3_stages) + warp * kDepth * kBytes;
  const int gi = lane / 4, q = lane % 4;
  const int32_t begin = g.begin(u), end = g.begin(u + 1);
  for (int32_t p0 = begin; p0 < end; p0 += 8 * R) {
    const int np = end - p0 < 8 * R ? end - p0 : 8 * R;
    // Staged: this lane's x' chunks of a stage, chunk c half c % 2 of row c / 2. Else: B's rows from memory,
    // column gi of each group of 8 pairs. Past the pass: its first pair.
    const uint16_t* xsrc[kXPerLane];
    const uint32_t* xr[R];
#pragma unroll
    for (int i = 0; i < kXPerLane; ++i) {
      const int c = lane + 32 * i, row = c / 2 < np ? c / 2 : 0;
      xsrc[i] = xh + (m * P + g.pair(p0 + row)) * sh.in + 8 * (c % 2);
    }
#pragma unroll
    for (int rg = 0; rg < R; ++rg) {
      const int row = 8 * rg + gi < np ? 8 * rg + gi : 0;
      xr[rg] = reinterpret_cast<const uint32_t*>(xh + (m * P + g.pair(p0 + row)) * sh.in) + q;
    }
    const auto issue = [&](int64_t kt) {
      if (kt < k1) {
        char* dst = buf + (static_cast<int>(kt - k0) & (kDepth - 1)) * kBytes;
        const char* src = wsrc + kt * row_bytes;
        for (int c = lane; c < kWChunks; c += 32) cp_async_16(dst + 16 * c, src + 16 * c);
        if constexpr (kStagedX) {
#pragma unroll
          for (int i = 0; i < kXPerLane; ++i)
            if (lane + 32 * i < kXChunks)
              cp_async_16(dst + kWBytes + 16 * (lane + 32 * i), xsrc[i] + kt * 16);
        }
      }
      cp_async_commit();  // an empty group past the end keeps the count of groups per row fixed
    };
    float acc[NT][R][4] = {};
#pragma unroll
    for (int i = 0; i < kDepth - 1; ++i) issue(k0 + i);
    for (int64_t kt = k0; kt < k1; ++kt) {
      issue(kt + kDepth - 1);
      cp_async_wait<kDepth - 1>();
      __syncwarp();
      const char* stage = buf + (static_cast<int>(kt - k0) & (kDepth - 1)) * kBytes;
      const auto* words = reinterpret_cast<const uint32_t*>(stage);
      const auto* xs = reinterpret_cast<const uint32_t*>(stage + kWBytes);  // [8R rows][8 words]
      uint32_t b[R][2];
#pragma unroll
      for (int rg = 0; rg < R; ++rg) {
        if constexpr (kStagedX) {
          b[rg][0] = xs[(8 * rg + gi) * 8 + q];      // inputs 2q, 2q + 1 of row gi
          b[rg][1] = xs[(8 * rg + gi) * 8 + q + 4];  // 2q + 8, 2q + 9
        } else if (8 * rg < np) {
          b[rg][0] = __ldg(xr[rg] + kt * 8);
          b[rg][1] = __ldg(xr[rg] + kt * 8 + 4);
        }
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        uint32_t a[4];
        exl3_tile_fragment<kCb, K>(words + t * 8 * K, lw, a);
#pragma unroll
        for (int rg = 0; rg < R; ++rg)
          if (8 * rg < np) mma_f16_16x8x16(acc[t][rg], a, b[rg][0], b[rg][1]);
      }
      __syncwarp();  // the stage is refilled by the next row's issue
    }
    cp_async_wait<0>();
    // C fragment: output 16 tile + gi (+ 8 for c >= 2), pair 2q (+ 1 for odd c) of its group.
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (warp > 0)
#pragma unroll
        for (int rg = 0; rg < R; ++rg)
#pragma unroll
          for (int c = 0; c < 4; ++c) red[warp - 1][rg][lane][c] = acc[t][rg][c];
      __syncthreads();
      if (warp == 0)
#pragma unroll
        for (int rg = 0; rg < R; ++rg)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int row = 8 * rg + 2 * q + (c & 1);
            if (row >= np) continue;
            float v = acc[t][rg][c];
#pragma unroll
            for (int w = 0; w < kGemmWarps - 1; ++w) v += red[w][rg][lane][c];
            const int64_t o = (tn0 + t) * 16 + gi + 8 * (c >> 1);
            part[((blockIdx.y * M + m) * P + g.pair(p0 + row)) * sh.out + o] = v;
          }
      __syncthreads();
    }
  }
}

// Block (8 128-blocks of outputs, row t): y = the output transform of the splits' sum (split order).
__global__ void __launch_bounds__(kRowWarps * 32)
    exl3_finish_linear_kernel(const float* part, int64_t S, int64_t T, int64_t out, const uint16_t* svh,
                              void* y, Elt y_t) {
  wait_for_previous_kernels();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t b = blockIdx.x * static_cast<int64_t>(kRowWarps) + warp, t = blockIdx.y;
  if (b * kBlockRows >= out) return;
  const int64_t o0 = b * kBlockRows + 4 * lane;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t s = 0; s < S; ++s) {
    const float4 pv = *reinterpret_cast<const float4*>(part + (s * T + t) * out + o0);
    v[0] += pv.x, v[1] += pv.y, v[2] += pv.z, v[3] += pv.w;
  }
  exl3_output_block(v, svh + o0, lane);
  if (y_t == Elt::f32) {
    *reinterpret_cast<float4*>(static_cast<float*>(y) + t * out + o0) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    uint16_t h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      h[i] = y_t == Elt::bf16 ? float_to_bf16_bits(v[i]) : __half_as_ushort(__float2half_rn(v[i]));
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(y) + t * out + o0) =
        make_uint2(h[0] | static_cast<uint32_t>(h[1]) << 16, h[2] | static_cast<uint32_t>(h[3]) << 16);
  }
}

bool valid_shape(const Exl3Shape& sh) {
  return sh.in > 0 && sh.out > 0 && sh.in % kBlockRows == 0 && sh.out % kBlockRows == 0 && sh.K >= 1 &&
         sh.K <= 8;
}

template <Exl3Cb kCb, int K, int R>
cudaError_t launch_gemm(const uint16_t* xh, int64_t P, MoeGroups g, int64_t U, int mat0, int M, Exl3Shape sh,
                        const Exl3Table& table, float* part, cudaStream_t s) {
  const int64_t S = exl3_splits(sh.in, sh.out, U * M, P * M);
  const dim3 grid(static_cast<unsigned>(sh.out / (16 * kBlockTiles<R>)), static_cast<unsigned>(S),
                  static_cast<unsigned>(U * M));
  constexpr size_t kSmem = size_t{kGemmWarps} * kStages<K, R> * kStageBytes<K, R>;
  return launch_kernel(exl3_gemm_kernel<kCb, K, R>, grid, kGemmWarps * 32, kSmem, s, xh, P, g, mat0, M, sh, S,
                       table, part);
}

// One instantiation per (codebook, K, rows of a pass): 8, 16 or 40.
template <Exl3Cb kCb, int K>
cudaError_t launch_gemm_k(const uint16_t* xh, int64_t P, MoeGroups g, int64_t U, int64_t unit_rows, int mat0,
                          int M, Exl3Shape sh, const Exl3Table& table, float* part, cudaStream_t s) {
  if (unit_rows <= 8) return launch_gemm<kCb, K, 1>(xh, P, g, U, mat0, M, sh, table, part, s);
  if (unit_rows <= 16) return launch_gemm<kCb, K, 2>(xh, P, g, U, mat0, M, sh, table, part, s);
  return launch_gemm<kCb, K, 5>(xh, P, g, U, mat0, M, sh, table, part, s);
}
template <Exl3Cb kCb>
cudaError_t launch_gemm_cb(const uint16_t* xh, int64_t P, MoeGroups g, int64_t U, int64_t unit_rows, int mat0,
                           int M, Exl3Shape sh, const Exl3Table& table, float* part, cudaStream_t s) {
  switch (sh.K) {
    case 1:
      return launch_gemm_k<kCb, 1>(xh, P, g, U, unit_rows, mat0, M, sh, table, part, s);
    case 2:
      return launch_gemm_k<kCb, 2>(xh, P, g, U, unit_rows, mat0, M, sh, table, part, s);
    case 3:
      return launch_gemm_k<kCb, 3>(xh, P, g, U, unit_rows, mat0, M, sh, table, part, s);
    case 4:
      return launch_gemm_k<kCb, 4>(xh, P, g, U, unit_rows, mat0, M, sh, table, part, s);
    case 5:
      return launch_gemm_k<kCb, 5>(xh, P, g, U, unit_rows, mat0, M, sh, table, part, s);
    case 6:
      return launch_gemm_k<kCb, 6>(xh, P, g, U, unit_rows, mat0, M, sh, table, part, s);
    case 7:
      return launch_gemm_k<kCb, 7>(xh, P, g, U, unit_rows, mat0, M, sh, table, part, s);
    case 8:
      return launch_gemm_k<kCb, 8>(xh, P, g, U, unit_rows, mat0, M, sh, table, part, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

int64_t exl3_splits(int64_t in, int64_t out, int64_t jobs, int64_t partial_rows) {
  // About 8 blocks of 4 warps per SM of an H200 over all the launch's matrices (counted as 128-output
  // blocks, whatever a launch's rows), each warp with at least 4 trellis rows of its split, and the partials
  // within 64 MiB (an insert of many rows needs no split to fill the GPU).
  constexpr int64_t kTargetBlocks = 1056, kPartialBytes = int64_t{64} << 20;
  const int64_t blocks = out / 128 * (jobs > 0 ? jobs : 1), ktiles = in / 16;
  int64_t S = (kTargetBlocks + blocks - 1) / (blocks > 0 ? blocks : 1);
  const int64_t most = ktiles / (4 * kGemmWarps), per_split = (partial_rows > 0 ? partial_rows : 1) * out * 4;
  if (S > most) S = most;
  if (S > kPartialBytes / per_split) S = kPartialBytes / per_split;
  return S < 1 ? 1 : S;
}

cudaError_t launch_exl3_transform_rows(const void* x, int64_t x_stride, int64_t P, int64_t C,
                                       const int32_t* ids, int64_t E, int64_t in, int mat0, int M,
                                       const Exl3Table& table, uint16_t* xh, cudaStream_t s) {
  if (P <= 0) return cudaSuccess;
  if (in % kBlockRows != 0 || x_stride % 4 != 0 || reinterpret_cast<uintptr_t>(x) % 8 != 0 || C < 1 ||
      M < 1 || mat0 + M > kExl3Mats)
    return cudaErrorInvalidValue;
  const dim3 grid(grid_for(in / kBlockRows, kRowWarps), static_cast<unsigned>(P), static_cast<unsigned>(M));
  return launch_kernel(exl3_transform_rows_kernel, grid, kRowWarps * 32, 0, s,
                       static_cast<const uint16_t*>(x), x_stride, C, ids, E, P, in, mat0, table, xh);
}

cudaError_t launch_exl3_gemm(const uint16_t* xh, int64_t P, int32_t* units, int64_t U, int32_t shared_rows,
                             int64_t unit_rows, int mat0, int M, Exl3Shape sh, const Exl3Table& table,
                             float* part, cudaStream_t s) {
  if (P <= 0 || U <= 0) return cudaSuccess;
  const MoeGroups g{units, units ? U : 0, shared_rows};
  if (!valid_shape(sh) || M < 1 || mat0 + M > kExl3Mats) return cudaErrorInvalidValue;
  if (sh.codebook == Exl3Cb::mul1)
    return launch_gemm_cb<Exl3Cb::mul1>(xh, P, g, U, unit_rows, mat0, M, sh, table, part, s);
  if (sh.codebook == Exl3Cb::mcg)
    return launch_gemm_cb<Exl3Cb::mcg>(xh, P, g, U, unit_rows, mat0, M, sh, table, part, s);
  return launch_gemm_cb<Exl3Cb::inst3>(xh, P, g, U, unit_rows, mat0, M, sh, table, part, s);
}

size_t exl3_linear_scratch_bytes(int64_t T, int64_t in, int64_t out) {
  return align256(T * in * 2) + static_cast<size_t>(exl3_splits(in, out, 1, T) * T * out * 4);
}

cudaError_t launch_exl3_linear(const void* x, int64_t T, int64_t x_stride, const void* trellis,
                               const void* suh, const void* svh, Exl3Shape sh, void* out, Elt out_t,
                               void* scratch, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  if (!valid_shape(sh) || !aligned16(trellis) || reinterpret_cast<uintptr_t>(suh) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(svh) % 8 != 0 || !aligned16(out) || !aligned16(scratch))
    return cudaErrorInvalidValue;
  Exl3Table table{};
  table.trellis[0][0] = trellis;
  table.suh[0][0] = suh;
  table.svh[0][0] = svh;
  auto* xh = static_cast<uint16_t*>(scratch);
  auto* part = reinterpret_cast<float*>(static_cast<char*>(scratch) + align256(T * sh.in * 2));
  cudaError_t err = launch_exl3_transform_rows(x, x_stride, T, 1, nullptr, 0, sh.in, 0, 1, table, xh, s);
  if (err != cudaSuccess) return err;
  err = launch_exl3_gemm(xh, T, nullptr, 1, static_cast<int32_t>(T), T, 0, 1, sh, table, part, s);
  if (err != cudaSuccess) return err;
  const dim3 grid(grid_for(sh.out / kBlockRows, kRowWarps), static_cast<unsigned>(T));
  return launch_kernel(exl3_finish_linear_kernel, grid, kRowWarps * 32, 0, s, part,
                       exl3_splits(sh.in, sh.out, 1, T), T, sh.out, static_cast<const uint16_t*>(svh), out,
                       out_t);
}

}  // namespace dspark::cuda
