// What each rank of a tp = N split holds (SPEC §5), tensor by tensor and in bytes, without reading any tensor
// data: the plan's ranges, every drafter tensor's split per rank, and per-rank replicated / sharded totals.
// dspark_inspect prints it; tests hold the loader to it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "lib/checkpoint/checkpoint.hpp"
#include "lib/config/model_config.hpp"
#include "lib/model/shard_plan.hpp"
#include "lib/model/tensor_split.hpp"
#include "lib/model/weights.hpp"

namespace dspark {

struct TensorShard {
  TensorSplit split;
  uint64_t bytes = 0;
};

struct TensorReport {
  std::string name;  // the stored name (DrafterTensor::weight_name())
  Shape shape;       // logical shape
  DType dtype = DType::bf16;
  WeightFormat format = WeightFormat::dense;
  std::vector<TensorShard> shards;  // one per rank
  bool sharded() const { return !shards.empty() && shards[0].split.kind != TensorSplit::Kind::replicated; }
};

struct RankBytes {
  uint64_t replicated = 0;
  uint64_t sharded = 0;
  uint64_t total() const { return replicated + sharded; }
};

struct ShardReport {
  int ranks = 1;
  std::string refusal;           // make_shard_plan's reason when the model cannot be split; then nothing else
  std::vector<ShardPlan> plans;  // one per rank
  std::vector<TensorReport> tensors;
  std::vector<RankBytes> bytes;  // one per rank
  bool ok() const { return refusal.empty(); }
};

// Without a checkpoint, every tensor is counted in its table dtype (dense). With one, in the dtype and
// representation its safetensors header gives; a quantised weight (fp8 block, fp4, EXL3) counts its share of
// all its stored parts (weight, scales, ...) in proportion to the rows / columns held, rounded up. Throws,
// naming the tensor, when the checkpoint lacks a tensor or stores a dense one in another shape.
ShardReport make_shard_report(const ModelConfig& cfg, int ranks, const Checkpoint* ckpt = nullptr);

nlohmann::ordered_json shard_report_json(const ShardReport& r);

// Human-readable: the plan's ranges per rank, with `tensors` every tensor's split per rank, then each rank's
// bytes. A refused split gives the reason.
std::string shard_report_table(const ShardReport& r, bool tensors);

// "12.58 MB" / "31.04 GB" (decimal units).
std::string format_bytes(uint64_t bytes);

}  // namespace dspark
