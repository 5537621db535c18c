#include "model/load_weights.hpp"

#include <string_view>
#include <vector>

#include "checkpoint/tensor_table.hpp"
#include "core/error.hpp"
#include "model/assemble_weights.hpp"
#include "model/tensor_split.hpp"

namespace dspark {
namespace {

bool is_float_dense(DType t) {
  return t == DType::bf16 || t == DType::f16 || t == DType::f32;
}

// Existence, representation, shape and dtype of one table entry.
void check_tensor(const Checkpoint& ckpt, const DrafterTensor& t) {
  if (t.linear) {
    const WeightFormat f = detect_weight_format(ckpt, t.name);
    if (f != WeightFormat::dense) {
      const TensorInfo* info = ckpt.find(t.name + (f == WeightFormat::exl3 ? ".trellis" : ".weight"));
      fail("tensor '{}' in {}: {} weights are not supported yet (dense bf16/f16/f32 only)", t.name,
           info ? info->file.string() : ckpt.dir().string(), weight_format_name(f));
    }
  }
  const std::string name = t.weight_name();
  const TensorInfo* info = ckpt.find(name);
  if (!info) fail("checkpoint {}: tensor '{}' is missing", ckpt.dir().string(), name);
  if (info->shape != t.shape)
    fail("tensor '{}' in {}: shape {} but config.json implies {}", name, info->file.string(),
         shape_str(info->shape), shape_str(t.shape));
  const bool ok = t.linear ? is_float_dense(info->dtype) : info->dtype == t.dense_dtype;
  if (!ok)
    fail("tensor '{}' in {}: dtype {}, expected {}", name, info->file.string(), dtype_name(info->dtype),
         t.linear ? std::string_view("bf16, f16 or f32") : dtype_name(t.dense_dtype));
}

// Reads, for one tensor of the table, the part this rank owns (tensor_split) and uploads it.
class Loader {
 public:
  Loader(const Checkpoint& ckpt, const ModelConfig& cfg, const ShardPlan& plan, Backend& backend)
      : ckpt_(ckpt), cfg_(cfg), plan_(plan), backend_(backend) {}

  Tensor tensor(const DrafterTensor& t) {
    const TensorInfo& info = *ckpt_.find(t.weight_name());
    const TensorSplit split = tensor_split(t, cfg_, plan_);
    Shape shape = info.shape;
    if (split.kind == TensorSplit::Kind::cols)
      shape[1] = split.count;
    else
      shape[0] = split.count;
    Tensor dst = backend_.alloc(info.dtype, shape);
    std::vector<uint8_t> host(dst.nbytes());
    if (split.kind == TensorSplit::Kind::cols)
      ckpt_.read_cols(info.name, split.begin, split.count, host.data());
    else
      ckpt_.read_rows(info.name, split.begin, split.count, host.data());
    backend_.upload(dst, host.data());
    return dst;
  }

 private:
  const Checkpoint& ckpt_;
  const ModelConfig& cfg_;
  const ShardPlan& plan_;
  Backend& backend_;
};

}  // namespace

WeightFormat detect_weight_format(const Checkpoint& ckpt, const std::string& base) {
  if (ckpt.has(base + ".trellis")) return WeightFormat::exl3;
  const TensorInfo* w = ckpt.find(base + ".weight");
  if (!w) fail("checkpoint {}: tensor '{}.weight' is missing", ckpt.dir().string(), base);
  if (ckpt.has(base + ".scale")) {
    if (w->dtype == DType::f8_e4m3) return WeightFormat::fp8_block;
    if (w->dtype == DType::i8 || w->dtype == DType::u8) return WeightFormat::fp4;
    fail("tensor '{}.weight' in {}: has a .scale but dtype {} is neither fp8 nor packed fp4", base,
         w->file.string(), dtype_name(w->dtype));
  }
  return WeightFormat::dense;
}

DrafterWeights load_drafter_weights(const Checkpoint& ckpt, const ModelConfig& cfg, const ShardPlan& plan,
                                    Backend& backend) {
  for (const DrafterTensor& t : drafter_tensors(cfg))
    check_tensor(ckpt, t);  // the whole table before any read
  Loader load(ckpt, cfg, plan, backend);
  return assemble_drafter_weights(cfg, [&](const DrafterTensor& t) { return load.tensor(t); });
}

}  // namespace dspark
