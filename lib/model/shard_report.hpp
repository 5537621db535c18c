// What each rank of a tp = N split holds (SPEC §5), tensor by tensor and in bytes, without reading any tensor
// data: the plan's ranges, every drafter tensor's split per rank, per-rank replicated / sharded totals and
// bytes by representation (weight and scale parts), and whether a backend runs every representation.
// dspark_inspect prints it; tests hold the loader to it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
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
  uint64_t bytes = 0;        // every stored part held
  uint64_t scale_bytes = 0;  // of which the ".scale" part (fp8 block, fp4)
};

struct TensorReport {
  std::string name;  // the stored name (DrafterTensor::weight_name(); "<name>.trellis" for EXL3)
  Shape shape;       // logical shape
  DType dtype = DType::bf16;
  WeightFormat format = WeightFormat::dense;
  std::vector<TensorShard> shards;  // one per rank
  bool sharded() const { return !shards.empty() && shards[0].split.kind != TensorSplit::Kind::replicated; }
};

// Bytes of one representation: its weight parts and its scale parts (fp8 block and fp4 only).
struct PartBytes {
  uint64_t weight = 0;
  uint64_t scale = 0;
  uint64_t total() const { return weight + scale; }
};

struct RankBytes {
  uint64_t replicated = 0;
  uint64_t sharded = 0;
  std::map<WeightFormat, PartBytes> formats;  // the representations present; every tensor that is not a
                                              // linear counts as dense
  uint64_t total() const { return replicated + sharded; }
};

// Whether a backend runs every tensor's representation as stored.
struct BackendFit {
  std::string backend;  // its name ("cpu", "cuda")
  bool built = true;    // false: this build has no such backend
  std::string tensor;   // the first tensor (table order) stored in a format it does not run; "" if none
  WeightFormat format = WeightFormat::dense;  // that tensor's format
  size_t tensors_not_run = 0;                 // how many tensors are stored so
  bool runs() const { return built && tensor.empty(); }
  std::string reason() const;  // why it cannot run the checkpoint; "" when it can
};

struct ShardReport {
  int ranks = 1;
  std::string refusal;           // make_shard_plan's reason when the model cannot be split; then nothing else
  std::vector<ShardPlan> plans;  // one per rank
  std::vector<TensorReport> tensors;
  std::vector<RankBytes> bytes;       // one per rank
  std::optional<BackendFit> backend;  // set by check_backend
  bool ok() const { return refusal.empty(); }
};

// Without a checkpoint, every tensor is counted in its table dtype (dense). With one, in the dtype and
// representation its safetensors header gives: an fp8 block or fp4 weight counts the bytes of its weight and
// scale parts that the loader reads (stored_part_split); an EXL3 weight the parts the loader reads: its
// trellis tiles and, of suh and svh (or the legacy su and sv), the split side's slice and the other whole.
// Throws, naming the tensor, when the checkpoint lacks a tensor or stores a dense one in another shape.
ShardReport make_shard_report(const ModelConfig& cfg, int ranks, const Checkpoint* ckpt = nullptr);

// Records in r whether the backend `name` runs every tensor's representation: `runs` says it per format, and
// an empty `runs` means the build has no such backend. Nothing to check when the split was refused.
void check_backend(ShardReport& r, const std::string& name, const std::function<bool(WeightFormat)>& runs);

nlohmann::ordered_json shard_report_json(const ShardReport& r);

// Human-readable: the plan's ranges per rank, with `tensors` every tensor's split per rank, then each rank's
// bytes, its bytes by representation, and the backend check when there is one. A refused split gives the
// reason.
std::string shard_report_table(const ShardReport& r, bool tensors);

// "512 B" / "3.07 kB" / "12.58 MB" / "31.04 GB" (decimal units).
std::string format_bytes(uint64_t bytes);

}  // namespace dspark
