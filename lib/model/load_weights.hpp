// Loads one rank's part of the drafter from a checkpoint into backend memory, checking every tensor against
// the tensor table (SPEC §3) first. Sharded tensors are read as row or column ranges: a rank never reads
// bytes of another rank's shard.
#pragma once

#include "lib/checkpoint/checkpoint.hpp"
#include "lib/config/model_config.hpp"
#include "lib/model/backend.hpp"
#include "lib/model/shard_plan.hpp"
#include "lib/model/weights.hpp"

namespace dspark {

// Throws dspark::Error naming the tensor and its file: missing tensor, shape disagreeing with config.json,
// wrong dtype, or a weight representation this build cannot run yet (fp8 block, fp4, EXL3).
DrafterWeights load_drafter_weights(const Checkpoint& ckpt, const ModelConfig& cfg, const ShardPlan& plan,
                                    Backend& backend);

// The representation a linear weight is stored in, found from the tensors present ("<base>.weight" dense or
// with
// "<base>.scale", "<base>.trellis"). Throws when none is present.
WeightFormat detect_weight_format(const Checkpoint& ckpt, const std::string& base);

}  // namespace dspark
