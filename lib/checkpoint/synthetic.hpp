// Synthetic drafter checkpoints (dspark_make_ckpt): every tensor of drafter_tensors(cfg) with deterministic
// values drawn so that activations stay O(1), each linear in the representation its config says (dense, or
// the released fp8 block / fp4: the bf16 values quantised, synthetic_quantized.hpp). Values come from a
// counter-based generator keyed by (seed, tensor name, element index), so any slice of any tensor can be
// produced on its own: output bytes do not depend on chunking or threading, and a 31 GB V4.1 checkpoint is
// streamed to disk in small chunks.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "lib/checkpoint/tensor_table.hpp"
#include "lib/config/model_config.hpp"

namespace dspark {

// How a synthetic checkpoint stores its linears: bf16 every one dense; fp8 the released format (SPEC §3):
// attention, shared-expert and main_proj linears fp8 block, routed experts fp4, everything else dense; exl3
// the seed's EXL3 mix (synthetic_exl3.hpp: the head, main_proj, attention but wo_a and both kinds of experts
// as trellises, wo_a fp8 block, the rest dense).
enum class SyntheticFormat { bf16, fp8, exl3 };

// cfg with the keys that say how its linears are stored set for `format`, to be written in `layout`: bf16
// sets dtype bf16 and no expert_dtype; fp8 sets dtype fp8, expert_dtype fp4 and quantization_config's
// quant_method fp8, fmt e4m3, scale_fmt ue8m0 (the block size stays cfg's). The released layout has no dtype
// key (its quant_method fp8 means fp8 linears), so a bf16 config in that layout has no quant_method. exl3
// sets quant_method exl3 with `codebook` (mul1, mcg or 3inst), bits 2, head_bits 6 and exl3_bits the seed's
// mix with `exl3_bits`' roles replaced, and the fp8 keys for wo_a.
ModelConfig synthetic_model_config(ModelConfig cfg, SyntheticFormat format, ConfigLayout layout,
                                   const std::string& codebook,
                                   const std::map<std::string, int64_t>& exl3_bits);
// The same with exl3's codebook mul1 and the seed's bits.
ModelConfig synthetic_model_config(ModelConfig cfg, SyntheticFormat format, ConfigLayout layout);

struct SyntheticOptions {
  uint64_t seed = 0;
  // A new shard starts before a tensor that would take the current one past this size (a larger tensor gets a
  // shard of its own). One shard is written as model.safetensors, several as model-0000i-of-0000n.safetensors
  // plus model.safetensors.index.json.
  uint64_t max_shard_bytes = 4'000'000'000;
  // Writing into a non-empty directory is refused unless force is set; then config.json, the index and
  // model*.safetensors found there are removed first (other files are left alone).
  bool force = false;
  size_t chunk_bytes =
      size_t{16} << 20;  // generated and written at a time (whole blocks of a quantised weight)
  int threads = 0;       // generator threads per chunk; 0 = hardware concurrency, at most 16
};

struct SyntheticProgress {
  size_t tensors_done = 0, tensors_total = 0;
  uint64_t bytes_done = 0, bytes_total = 0;
};
using SyntheticProgressFn = std::function<void(const SyntheticProgress&)>;

// Each tensor's values are mean + std * z with z of unit variance (see synthetic.cpp for the choices).
struct SyntheticInit {
  float mean = 0.0f;
  float std = 1.0f;
};
// Throws for a tensor name it has no rule for, so a new tensor in the table forces a decision here.
SyntheticInit synthetic_init(const DrafterTensor& t);

// Elements [elem0, elem0 + count) of tensor t (row-major) for `seed`, stored as t.dense_dtype into dst.
void synthetic_values(const DrafterTensor& t, uint64_t seed, int64_t elem0, int64_t count, void* dst);

struct SyntheticResult {
  std::vector<std::filesystem::path> files;  // the safetensors files, in shard order
  size_t tensors = 0;  // stored tensors: a quantised weight counts its .weight and its .scale
  uint64_t bytes = 0;  // tensor payload bytes
};
// Writes config.json (in cfg.layout: model_config_to_json or model_config_to_release_json) and the tensors
// into `out` (created when absent), each linear as configured_format(t, cfg) says: dense as its table dtype;
// fp8 block as "<name>.weight" F8_E4M3 + "<name>.scale" F8_E8M0 per B x B block (B =
// cfg.weight_block_size); fp4 as "<name>.weight" I8 (two e2m1 codes a byte) + "<name>.scale" F8_E8M0 per 32
// inputs; in an exl3 config (quant_method exl3) the seed's mix, each trellis with its parts
// (synthetic_exl3_parts). A weight and its parts go into the same shard. config.json is written last, so an
// interrupted run leaves a directory that Checkpoint refuses to open.
SyntheticResult write_synthetic_checkpoint(const ModelConfig& cfg, const std::filesystem::path& out,
                                           const SyntheticOptions& opt = {},
                                           const SyntheticProgressFn& progress = {});

}  // namespace dspark
