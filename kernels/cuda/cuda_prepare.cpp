// CudaBackend::prepare_weights: fp8 block and fp4 weights into their mma tiles (quant_tile.cuh); the bf16
// expert matrices into bf16 mma tiles, which the tensor-core experts stream
// from DRAM faster than row-major rows (contiguous 512-byte warp loads instead of 64-byte runs); copies in
// tiles of the attention layers' matrices, of the head and of markov_head; bf16 copies of an fp8 main_proj
// and wkv.
#include <spdlog/spdlog.h>

#include <vector>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/quant_linear.hpp"
#include "kernels/cuda/weight_tiles.hpp"

namespace dspark {

using cuda::check;

namespace {

bool tileable(const LinearWeight& w) {
  return w.format == WeightFormat::dense && w.weight.dtype == DType::bf16 && w.weight.data != nullptr &&
         w.weight.numel() == w.out * w.in && w.out % cuda::kMmaTileRows == 0 &&
         w.in % cuda::kMmaTileCols == 0;
}

bool tileable(const Tensor& m) {  // a bf16 matrix
  return m.dtype == DType::bf16 && m.data != nullptr && m.shape.size() == 2 &&
         m.dim(0) % cuda::kMmaTileRows == 0 && m.dim(1) % cuda::kMmaTileCols == 0;
}

bool tileable(const ExpertWeights& e) {
  return tileable(e.w1) && tileable(e.w3) && tileable(e.w2);
}

}  // namespace

// An fp8 block matrix also dequantised to bf16 (Tuning::bf16_copies), from its row-major codes, when every
// block scale keeps the copy exact; a scale outside that range leaves the copy out (logged).
void CudaBackend::add_dequantised(LinearWeight& m) {
  const char* op = "prepare_weights";
  if (!tuning_.bf16_copies || m.format != WeightFormat::fp8_block || m.block <= 0) return;
  cuda::expect_data(m.weight, op, "weight");
  cuda::expect_data(m.scale, op, "scale");
  std::vector<uint8_t> scales(static_cast<size_t>(m.scale.numel()));
  check(cudaMemcpyAsync(scales.data(), m.scale.data, scales.size(), cudaMemcpyDeviceToHost, stream_), op);
  check(cudaStreamSynchronize(stream_), op);
  for (const uint8_t e : scales)
    if (!cuda::fp8_dequantised_exact_scale(e)) {
      spdlog::info("{}: no bf16 copy (a block scale 2^{} is outside the range where it is exact)", m.name,
                   static_cast<int>(e) - 127);
      return;
    }
  m.dequantised = alloc(DType::bf16, {m.out, m.in});
  check(cuda::launch_dequantize_fp8_block(m.weight.data, m.scale.data, m.out, m.in, m.block,
                                          m.dequantised.data, stream_),
        op);
}

// fp8 block and fp4 weights into their mma tiles (the only layout the quantised kernels read), each old
// buffer released once its copy has run.
void CudaBackend::prepare_quantised(DrafterWeights& w) {
  const char* op = "prepare_weights";
  // The insert's products (main_proj, wkv: up to max_insert_rows rows) read bf16 copies from
  // kDequantisedMinRows rows on.
  add_dequantised(w.main_proj);
  for (StageWeights& st : w.stages) add_dequantised(st.wkv);
  for_each_linear(w, [&](LinearWeight& m) {
    if (m.format != WeightFormat::fp8_block && m.format != WeightFormat::fp4) return;
    if (m.out % cuda::kMmaTileRows != 0 || m.in % cuda::kMmaTileCols != 0)
      fail("cuda: {} weight '{}' is [{}, {}]; its kernels need rows a multiple of {} and columns of {}",
           weight_format_name(m.format), m.name, m.out, m.in, cuda::kMmaTileRows, cuda::kMmaTileCols);
    cuda::expect_data(m.weight, op, "weight");
    cuda::expect_data(m.scale, op, "scale");
    Tensor tiles = alloc(m.weight.dtype, m.weight.shape);
    if (m.format == WeightFormat::fp8_block) {
      check(cuda::launch_pack_fp8_tiles(m.weight.data, tiles.data, m.out, m.in, stream_), op);
      m.format = WeightFormat::fp8_mma_tiles;
    } else {
      Tensor scales = alloc(m.scale.dtype, m.scale.shape);
      check(cuda::launch_pack_fp4_tiles(m.weight.data, tiles.data, m.scale.data, scales.data, m.out, m.in,
                                        stream_),
            op);
      check(cudaStreamSynchronize(stream_), op);
      m.scale = std::move(scales);
      m.format = WeightFormat::fp4_mma_tiles;
    }
    check(cudaStreamSynchronize(stream_), op);
    m.weight = std::move(tiles);
  });
}

void CudaBackend::prepare_weights(DrafterWeights& w) {
  const char* op = "prepare_weights";
  prepare_quantised(w);
  // Tuning::weight_tiles off keeps every matrix row-major only (the experts' results are the same bits either
  // way), to measure what the tiles buy.
  if (!tuning_.weight_tiles) return;
  const auto packed_matrix = [&](const void* data, int64_t rows, int64_t cols) {  // in a buffer of its own
    Tensor tiles = alloc(DType::bf16, {rows, cols});
    check(cuda::launch_pack_mma_tiles(data, tiles.data, rows, cols, stream_), op);
    return tiles;
  };
  const auto packed = [&](const LinearWeight& m) { return packed_matrix(m.weight.data, m.out, m.in); };
  // The experts' matrices are replaced, each old one released once its copy has run: one matrix's worth of
  // extra memory.
  const auto to_tiles = [&](LinearWeight& m) {
    Tensor tiles = packed(m);
    check(cudaStreamSynchronize(stream_), op);
    m.weight = std::move(tiles);
    m.format = WeightFormat::bf16_mma_tiles;
  };
  // The draft step's attention layers and the insert's main_proj keep their row-major matrix (cuBLAS, many
  // rows) and gain a copy in tiles (launch_linear_tiles, a few rows): about 3 % more weight memory at V4.1's
  // sizes.
  const auto add_tiles = [&](LinearWeight& m) {
    if (tileable(m)) m.tiles = packed(m);
  };
  add_tiles(w.main_proj);
  for (StageWeights& st : w.stages) {
    for (LinearWeight* m : {&st.wq_a, &st.wq_b, &st.wkv, &st.wo_a, &st.wo_b}) add_tiles(*m);
    bool routed = !st.experts.empty();
    for (const ExpertWeights& e : st.experts) routed = routed && tileable(e);
    if (routed)
      for (ExpertWeights& e : st.experts)
        for (LinearWeight* m : {&e.w1, &e.w3, &e.w2}) to_tiles(*m);
    if (tileable(st.shared))
      for (LinearWeight* m : {&st.shared.w1, &st.shared.w3, &st.shared.w2}) to_tiles(*m);
  }
  // The head too (the step's largest matrix, 663 MB per GPU at tp 2), which cuBLAS read at 3.8 TB/s and the
  // few-row kernel at 4.4 (ncu): a copy of 4 % of the weights, which Tuning::head_tiles off leaves out.
  if (tuning_.head_tiles) add_tiles(w.head);
  // markov_head, read at every Markov position (from L2 after the first): a copy in tiles for the tensor-core
  // Markov kernel (512 contiguous bytes per warp load instead of 16 runs of 64).
  if (tileable(w.markov_head))
    w.markov_head_tiles = packed_matrix(w.markov_head.data, w.markov_head.dim(0), w.markov_head.dim(1));
  check(cudaStreamSynchronize(stream_), op);
}

}  // namespace dspark
