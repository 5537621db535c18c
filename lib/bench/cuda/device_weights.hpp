// Synthetic drafter weights generated directly in GPU memory (dspark_bench): every tensor of
// drafter_tensors(cfg), this rank's part of it (tensor_split), filled on the device with the values a
// synthetic checkpoint of the same seed holds (lib/checkpoint/synthetic.hpp), quantised there when the
// format says so, then assembled into the same DrafterWeights that load_drafter_weights builds from a
// checkpoint.
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/cuda/cuda_backend.hpp"
#include "lib/bench/bench_format.hpp"
#include "lib/config/model_config.hpp"
#include "lib/model/shard_plan.hpp"
#include "lib/model/weights.hpp"

namespace dspark::bench {

struct GenerationProgress {
  size_t tensors_done = 0, tensors_total = 0;
  uint64_t bytes_done = 0, bytes_total = 0;  // this rank's bytes
};
using GenerationProgressFn = std::function<void(const GenerationProgress&)>;

// Collective-free: every rank generates its own part (cfg from config_for_format). Synchronises the backend's
// stream before returning.
DrafterWeights generate_device_weights(const ModelConfig& cfg, const ShardPlan& plan, CudaBackend& backend,
                                       uint64_t seed, BenchFormat format = BenchFormat::bf16,
                                       const GenerationProgressFn& progress = {});

}  // namespace dspark::bench
