// The drafter's tensors (SPEC §3): every name the model reads, its logical shape [out, in] from the model
// config and the dtype a dense checkpoint stores it in.
#pragma once

#include <string>
#include <vector>

#include "lib/config/model_config.hpp"
#include "lib/core/dtype.hpp"
#include "lib/core/tensor.hpp"
#include "lib/core/weight_format.hpp"

namespace dspark {

struct DrafterTensor {
  // For a linear weight, the base name ("mtp.0.attn.wq_a"): its representation is found from the tensors
  // present
  // ("<base>.weight" [+ "<base>.scale"], or "<base>.trellis"/".suh"/".svh"). Otherwise the full tensor name.
  std::string name;
  Shape shape;          // logical shape; [out, in] for linear weights
  DType dense_dtype;    // what a dense checkpoint stores (bf16, or f32 for hc_*, attn_sink, gate bias)
  bool linear = false;  // may be stored quantised (fp8 block, fp4, EXL3)
  bool routed_expert = false;
  std::string weight_name() const { return linear ? name + ".weight" : name; }
};

std::vector<DrafterTensor> drafter_tensors(const ModelConfig& c);

// The representation config.json says t is stored in (SPEC §3): `dtype` (the release's quant_method) governs
// the attention, shared-expert and main_proj linears, `expert_dtype` the routed experts (empty: as dtype);
// every tensor that is not a linear is dense.
WeightFormat configured_format(const DrafterTensor& t, const ModelConfig& c);

// Whether a checkpoint tensor belongs to the drafter (SPEC §3: "embed.", "head.", "mtp." names); the rest of
// a target checkpoint is never read. A filter for Checkpoint.
bool is_drafter_tensor(const std::string& name);

// The role of an EXL3 weight's base name in config.json's exl3_bits: "head", or its name within a stage with
// the routed experts taken together ("main_proj", "attn.wq_a", "ffn.shared_experts.w1", "ffn.experts").
std::string exl3_role(const std::string& base);

// Name helpers, so the loader and the checkpoint writer agree on one spelling.
std::string stage_prefix(int64_t stage);              // "mtp.{i}."
std::string expert_prefix(int64_t stage, int64_t e);  // "mtp.{i}.ffn.experts.{e}."
std::string shared_expert_prefix(int64_t stage);      // "mtp.{i}.ffn.shared_experts."

}  // namespace dspark
