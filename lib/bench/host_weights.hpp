// Synthetic drafter weights for a backend that computes on the host (dspark_bench --backend cpu): the
// checkpoint dspark_make_ckpt writes for the same seed and format, written to a private temporary directory
// and read back by the worker's own loader (load_drafter_weights), so the bench runs the bytes a worker
// would.
#pragma once

#include <cstdint>

#include "lib/bench/bench_format.hpp"
#include "lib/config/model_config.hpp"
#include "lib/model/backend.hpp"
#include "lib/model/shard_plan.hpp"
#include "lib/model/weights.hpp"

namespace dspark::bench {

// Collective-free: every rank writes and reads its own copy (the directory is removed before returning).
// cfg from config_for_format; fp8_head re-quantises the head at load as weights.head: fp8 does.
DrafterWeights load_host_weights(const ModelConfig& cfg, const ShardPlan& plan, Backend& backend,
                                 uint64_t seed, BenchFormat format, int rank);

}  // namespace dspark::bench
