// CudaBackend::prepare_weights: the expert matrices into bf16 mma tiles, which the tensor-core experts stream
// from DRAM faster than row-major rows (contiguous 512-byte warp loads instead of 64-byte runs).
#include <cstdlib>
#include <string>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/launch.hpp"

namespace dspark {

using cuda::check;

namespace {

bool tileable(const LinearWeight& w) {
  return w.format == WeightFormat::dense && w.weight.dtype == DType::bf16 && w.weight.data != nullptr &&
         w.weight.numel() == w.out * w.in && w.out % cuda::kMmaTileRows == 0 &&
         w.in % cuda::kMmaTileCols == 0;
}

bool tileable(const ExpertWeights& e) {
  return tileable(e.w1) && tileable(e.w3) && tileable(e.w2);
}

}  // namespace

void CudaBackend::prepare_weights(DrafterWeights& w) {
  const char* op = "prepare_weights";
  // DSPARK_WEIGHT_TILES=0 keeps every matrix row-major (A/B measurements; the results are the same bits).
  if (const char* env = std::getenv("DSPARK_WEIGHT_TILES"); env != nullptr && std::string(env) == "0") return;
  // A new buffer per matrix, the old one released once the copy has run: one matrix's worth of extra memory.
  const auto to_tiles = [&](LinearWeight& m) {
    Tensor tiles = alloc(DType::bf16, {m.out, m.in});
    check(cuda::launch_pack_mma_tiles(m.weight.data, tiles.data, m.out, m.in, stream_), op);
    check(cudaStreamSynchronize(stream_), op);
    m.weight = std::move(tiles);
    m.format = WeightFormat::bf16_mma_tiles;
  };
  for (StageWeights& st : w.stages) {
    bool routed = !st.experts.empty();
    for (const ExpertWeights& e : st.experts) routed = routed && tileable(e);
    if (routed)
      for (ExpertWeights& e : st.experts)
        for (LinearWeight* m : {&e.w1, &e.w3, &e.w2}) to_tiles(*m);
    if (tileable(st.shared))
      for (LinearWeight* m : {&st.shared.w1, &st.shared.w3, &st.shared.w2}) to_tiles(*m);
  }
}

}  // namespace dspark
