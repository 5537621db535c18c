#include "lib/serve/model_description.hpp"

#include <utility>
#include <vector>

namespace dspark {

host::ModelDescription describe_model(const ModelConfig& m, const ServedLimits& limits) {
  host::ModelDescription d{};
  d.vocab_size = static_cast<uint32_t>(m.vocab_size);
  d.hidden = static_cast<uint32_t>(m.dim);
  d.taps = static_cast<uint32_t>(m.n_taps());
  d.row_bytes = static_cast<uint32_t>(m.row_dim() * 2);
  d.block_size = static_cast<uint32_t>(m.block_size);
  d.window = static_cast<uint32_t>(m.window_size);
  d.slots = static_cast<uint32_t>(limits.slots);
  d.max_batch = static_cast<uint32_t>(limits.max_batch);
  d.max_context_rows = static_cast<uint32_t>(limits.max_context_rows);
  d.tp = static_cast<uint32_t>(limits.tp);
  d.max_model_len = limits.max_model_len;
  return d;
}

host::ModelTaps describe_taps(const ModelConfig& m) {
  host::ModelTaps t{};
  t.noise_token = static_cast<int32_t>(m.noise_token_id);
  t.layers = static_cast<uint32_t>(m.target_layer_ids.size());
  for (size_t i = 0; i < m.target_layer_ids.size() && i < host::kMaxTappedLayers; ++i)
    t.layer_ids[i] = static_cast<int32_t>(m.target_layer_ids[i]);
  return t;
}

uint32_t format_code(WeightFormat f) {
  switch (f) {
    case WeightFormat::dense:
    case WeightFormat::bf16_mma_tiles:
      return host::kFormatDense;
    case WeightFormat::fp8_block:
    case WeightFormat::fp8_mma_tiles:
      return host::kFormatFp8Block;
    case WeightFormat::fp4:
    case WeightFormat::fp4_mma_tiles:
      return host::kFormatFp4;
    case WeightFormat::exl3:
      return host::kFormatExl3;
  }
  return host::kFormatDense;
}

LoadedFormats loaded_formats(const DrafterWeights& w) {
  LoadedFormats out;
  std::vector<const LinearWeight*> all = {&w.main_proj, &w.head};
  for (const StageWeights& s : w.stages) {
    for (const LinearWeight* l :
         {&s.wq_a, &s.wq_b, &s.wkv, &s.wo_a, &s.wo_b, &s.shared.w1, &s.shared.w2, &s.shared.w3})
      all.push_back(l);
    for (const ExpertWeights& e : s.experts) all.insert(all.end(), {&e.w1, &e.w2, &e.w3});
  }
  for (const LinearWeight* l : all) out.bits |= 1u << format_code(l->format);
  for (const auto& [code, name] :
       {std::pair{host::kFormatDense, "dense"}, std::pair{host::kFormatFp8Block, "fp8 block"},
        std::pair{host::kFormatFp4, "fp4"}, std::pair{host::kFormatExl3, "EXL3"}})
    if (out.bits & (1u << code)) out.names += (out.names.empty() ? "" : ", ") + std::string(name);
  return out;
}

}  // namespace dspark
