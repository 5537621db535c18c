// Few-row linear layers with fp8 block weights (a draft step's T = 5B rows, inserts' up to 80 a launch) on
// the tensor cores, from weights in fp8 mma tiles (quant_tile.cuh): every warp load is 512 contiguous bytes,
// the rows ride along as the product's columns in passes of 8 held together, so each weight byte is read
// once. Block (matrix, tile of 16 rows, part s of S): its 8 warps split the part's chunks; their partial
// tiles are added in warp order and, when S > 1 (a layer with too few tiles to fill the GPU), the S blocks of
// a cluster hand theirs to block 0 through distributed shared memory, which adds them in part order. No
// atomics: the bits depend only on the shapes. A launch may carry several matrices of one shape on one input.
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/quant_linear.hpp"
#include "kernels/cuda/quant_tile.cuh"
#include "kernels/cuda/tile_place.cuh"
#include "kernels/cuda/tile_sum.cuh"

namespace dspark::cuda {
namespace {

struct Args {
  QuantAct xq;          // quantised x [T, K] (the fp8 product)
  const uint16_t* xb;   // bf16 x [T, G K] (the grouped wo_a product)
  int64_t T, x_stride;  // rows, and elements between xb's rows (G K)
  // The launch's matrices, one after the other in the grid, all of one shape:
  const uint8_t* w[kFp8LinearMaxMatrices];   // [G out_g, K] in fp8 mma tiles
  const uint8_t* ws[kFp8LinearMaxMatrices];  // block scales [ceil(N / B), K / B]
  void* out[kFp8LinearMaxMatrices];          // [T, N]
  int64_t N, K;
  Elt out_t;
  TileGrid grid;
  int block_shift;  // log2(B / 32): a chunk's block column is chunk >> block_shift, a row's row >> (5 + it)
};

// Chunks whose loads a warp has in flight (2 KiB of weights): fewer when many passes hold their
// activations too.
__host__ __device__ constexpr int ahead_for(int NP) {
  return NP <= 2 ? 4 : NP <= 4 ? 2 : 1;
}

// Blocks per SM the registers must leave room for (0: ptxas's choice). Two and three passes of quantised rows
// fit three under 85 registers without spilling (two otherwise), so that a 320-tile product runs in one wave.
__host__ __device__ constexpr int min_blocks_for(int NP, bool bf16_act) {
  return !bf16_act && (NP == 2 || NP == 3) ? 3 : 0;
}

template <int NP, bool kBf16Act>
__global__ void __launch_bounds__(kThreads, min_blocks_for(NP, kBf16Act)) fp8_linear_kernel(Args a) {
  // The block's place and pointers come from the launch alone: worked out before the wait.
  const TilePlace at = tile_place(a.grid);
  const int gi = static_cast<int>(threadIdx.x) % 32 / 4, row_shift = 5 + a.block_shift;
  const uint8_t* tile = a.w[at.m] + at.row0 * a.K;
  const uint8_t* wscale = a.ws[at.m] + (at.row0 >> row_shift) * (a.K >> row_shift);
  float acc[NP][4] = {};
  if constexpr (kBf16Act) {
    const uint16_t* xb[NP];
#pragma unroll
    for (int p = 0; p < NP; ++p) {
      const int64_t t = p * kMmaCols + gi;
      xb[p] = t < a.T ? a.xb + t * a.x_stride + at.group * a.K : nullptr;
    }
    wait_for_previous_kernels();
    fp8_bf16_tile_dots<NP, ahead_for(NP)>(tile, wscale, a.block_shift, xb, at.c0, at.c1, acc);
  } else {
    const uint8_t* xq[NP];
    const float* xs[NP];
#pragma unroll
    for (int p = 0; p < NP; ++p) {
      const int64_t t = p * kMmaCols + gi;
      xq[p] = t < a.T ? a.xq.codes + t * a.K : nullptr;
      xs[p] = a.xq.scales + (t < a.T ? t : 0) * a.grid.chunks;
    }
    const uint8_t* const w[1] = {tile};
    const uint8_t* const wsc[1] = {wscale};
    float acc1[1][NP][4] = {};
    wait_for_previous_kernels();
    quant_tile_dots<QuantKind::fp8, 1, NP, ahead_for(NP)>(w, wsc, a.block_shift, xq, xs, at.c0, at.c1, acc1);
#pragma unroll
    for (int p = 0; p < NP; ++p)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[p][i] = acc1[0][p][i];
  }
  __shared__ float part[kWarps][NP][kMmaRows * kMmaCols];
  cluster_sum_store<NP>(acc, part, a.grid.splits(), at.s, at.row0, a.T, a.N, a.out[at.m], a.out_t);
}

template <bool kBf16Act>
cudaError_t launch_passes(Args a, int64_t out_g, int64_t B, int matrices, cudaStream_t s) {
  a.grid = plan_tile_grid(a.N, out_g, a.K);
  a.block_shift = fp8_block_shift(B);
  const int64_t np = (a.T + kMmaCols - 1) / kMmaCols;
  const dim3 grid(a.grid.blocks(matrices));
  const unsigned cl = static_cast<unsigned>(a.grid.splits());
  const auto launch = [&](auto kernel) { return launch_clustered(kernel, grid, kThreads, 0, s, cl, a); };
  if (np <= 1) return launch(fp8_linear_kernel<1, kBf16Act>);
  if (np <= 2) return launch(fp8_linear_kernel<2, kBf16Act>);
  if (np <= 3) return launch(fp8_linear_kernel<3, kBf16Act>);
  if (np <= 4) return launch(fp8_linear_kernel<4, kBf16Act>);
  if (np <= 6) return launch(fp8_linear_kernel<6, kBf16Act>);
  if (np <= 8) return launch(fp8_linear_kernel<8, kBf16Act>);
  return launch(fp8_linear_kernel<10, kBf16Act>);
}
static_assert(kQuantLinearMaxRows == 10 * kMmaCols, "the largest pass count instantiated");

bool fp8_shapes(int64_t T, int64_t out_g, int64_t K, int64_t B, const void* w, const void* ws) {
  // A chunk lies in one block column and a tile in one block row: B 32 times a power of two.
  return T > 0 && T <= kQuantLinearMaxRows && out_g > 0 && out_g % kMmaRows == 0 && K > 0 &&
         K % kMmaChunk == 0 && B > 0 && B % kMmaChunk == 0 && ((B / kMmaChunk) & (B / kMmaChunk - 1)) == 0 &&
         K % B == 0 && aligned16(w) && ws != nullptr;
}

}  // namespace

cudaError_t launch_fp8_linear(QuantAct x, int64_t T, const void* w_tiles, const uint8_t* w_scales, int64_t N,
                              int64_t K, int64_t B, void* out, Elt out_t, cudaStream_t s) {
  return launch_fp8_linear_multi(x, T, &w_tiles, &w_scales, 1, N, K, B, &out, out_t, s);
}

cudaError_t launch_fp8_linear_multi(QuantAct x, int64_t T, const void* const* w_tiles,
                                    const uint8_t* const* w_scales, int matrices, int64_t N, int64_t K,
                                    int64_t B, void* const* out, Elt out_t, cudaStream_t s) {
  if (matrices < 1 || matrices > kFp8LinearMaxMatrices || out_t == Elt::f16 || x.codes == nullptr)
    return cudaErrorInvalidValue;
  Args a{};
  for (int m = 0; m < matrices; ++m) {
    if (!fp8_shapes(T, N, K, B, w_tiles[m], w_scales[m]) || out[m] == nullptr) return cudaErrorInvalidValue;
    a.w[m] = static_cast<const uint8_t*>(w_tiles[m]);
    a.ws[m] = w_scales[m];
    a.out[m] = out[m];
  }
  a.xq = x;
  a.T = T;
  a.N = N;
  a.K = K;
  a.out_t = out_t;
  return launch_passes<false>(a, N, B, matrices, s);
}

cudaError_t launch_fp8_grouped_bf16(const void* x, int64_t T, int64_t groups, const void* w_tiles,
                                    const uint8_t* w_scales, int64_t out_g, int64_t K, int64_t B, void* out,
                                    Elt out_t, cudaStream_t s) {
  if (groups < 1 || !fp8_shapes(T, out_g, K, B, w_tiles, w_scales) || out_t == Elt::f16 || !aligned16(x) ||
      out_g % B != 0)
    return cudaErrorInvalidValue;
  Args a{};
  a.xb = static_cast<const uint16_t*>(x);
  a.T = T;
  a.x_stride = groups * K;
  a.w[0] = static_cast<const uint8_t*>(w_tiles);
  a.ws[0] = w_scales;
  a.out[0] = out;
  a.N = groups * out_g;
  a.K = K;
  a.out_t = out_t;
  return launch_passes<true>(a, out_g, B, 1, s);
}

}  // namespace dspark::cuda
