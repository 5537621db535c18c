// Loads one rank's part of the drafter from a checkpoint into backend memory, checking every tensor against
// the tensor table (SPEC §3) first. Sharded tensors are read as row or column ranges: a rank never reads
// bytes of another rank's shard.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "lib/checkpoint/checkpoint.hpp"
#include "lib/checkpoint/tensor_table.hpp"
#include "lib/config/model_config.hpp"
#include "lib/model/backend.hpp"
#include "lib/model/shard_plan.hpp"
#include "lib/model/weights.hpp"

namespace dspark {

// What a load may change in the stored weights (SPEC §3's load-time options).
struct LoadOptions {
  // Re-quantise the dense head to fp8 block (requantize_fp8_block, B = quantization_config.weight_block_size)
  // on each rank from its own vocabulary rows, which must then start on a B-row block: the worker config's
  // weights.head: fp8.
  bool head_fp8 = false;
  // Called after each stored part is read and uploaded, with its size in bytes: the worker's progress log.
  std::function<void(uint64_t bytes)> on_read;
};

// Throws dspark::Error naming the tensor and its file: missing tensor, shape disagreeing with config.json,
// wrong dtype, a weight representation the backend does not run, or an option it cannot apply.
DrafterWeights load_drafter_weights(const Checkpoint& ckpt, const ModelConfig& cfg, const ShardPlan& plan,
                                    Backend& backend, const LoadOptions& options = {});

// The representation a linear weight is stored in, found from the tensors present ("<base>.weight" dense or
// with
// "<base>.scale", "<base>.trellis"). Throws when none is present.
WeightFormat detect_weight_format(const Checkpoint& ckpt, const std::string& base);
// A plain entry ("head.weight") stored as an EXL3 trellis instead ("head.trellis", as exllamav3 converts the
// head): its base name, else empty.
std::string exl3_stored_plain(const Checkpoint& ckpt, const DrafterTensor& t);

}  // namespace dspark
