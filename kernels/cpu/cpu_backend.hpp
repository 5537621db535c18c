// The reference backend: plain loops over host memory, a readable transcription of SPEC §4. It is what the
// CUDA backend is tested against, so it favours clarity over speed: every op reads bf16 activations,
// accumulates in fp32 in a fixed order and rounds its result once.
#pragma once

#include "lib/model/backend.hpp"

namespace dspark {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  // The formats its linear ops run, without an instance (dspark_inspect's report).
  static bool runs_format(WeightFormat f) {
    return f == WeightFormat::dense || f == WeightFormat::fp8_block || f == WeightFormat::fp4 ||
           f == WeightFormat::exl3;
  }
  bool supports_format(WeightFormat f) const override { return runs_format(f); }

  Tensor alloc(DType dtype, const Shape& shape) override;
  void upload(const Tensor& dst, const void* src) override;
  void download(void* dst, const Tensor& src) override;
  Tensor alloc_host(DType dtype, const Shape& shape) override { return alloc(dtype, shape); }
  void copy(const Tensor& src, const Tensor& dst) override;
  void wait_for_word(const Tensor& word, int32_t value) override;
  void gather_host_rows(const Tensor& sources, const Tensor& dst) override;
  bool reads_in_place(const void* /*p*/) const override { return true; }
  void fill_i32(const Tensor& t, int32_t value) override;
  void zero(const Tensor& t) override;
  void synchronize() override {}
  // Decodes every EXL3 trellis once (LinearWeight::dequantised: W_dec transposed, f16 [out, in]).
  void prepare_weights(DrafterWeights& w) override;

  void embed(const Tensor& table, const Tensor& ids, const Tensor& out) override;
  void linear(const Tensor& x, const LinearWeight& w, const Tensor& out) override;
  void grouped_linear(const Tensor& x, const LinearWeight& w, int64_t groups, const Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override;
  void rope(const Tensor& x, const Tensor& pos, int64_t rope_dim, double theta, bool inverse) override;
  void kv_qdq(const Tensor& x, int64_t block) override;
  void convert(const Tensor& src, const Tensor& dst) override;

  void hc_replicate(const Tensor& x, const Tensor& X) override;
  void hc_mixes(const Tensor& X, const HcMixWeights& w, const MixParams& p, const Tensor& pre,
                const Tensor& post, const Tensor& comb) override;
  void hc_collapse(const Tensor& X, const Tensor& pre, const Tensor& out) override;
  void hc_expand(const Tensor& y, const Tensor& X, const Tensor& post, const Tensor& comb) override;

  void ring_write(const Tensor& ring_kv, const Tensor& ring_pos, const Tensor& kv, const Tensor& slots,
                  const Tensor& pos) override;
  void ring_clear(const Tensor& ring_pos, int64_t slot) override;

  void attention(const Tensor& q, const Tensor& block_kv, const Tensor& ring_kv, const Tensor& ring_pos,
                 const Tensor& requests, const Tensor& sink, int64_t k, const Tensor& out) override;

  void moe_route(const Tensor& x, const Tensor& gate, const Tensor& bias, const RouteParams& p,
                 const Tensor& ids, const Tensor& weights) override;
  // x_codes: always empty here (the CPU keeps no activation codes; each product quantises its rows).
  void moe_shared_expert(const Tensor& x, const ActCodes& x_codes, const StageWeights& stage,
                         float swiglu_limit, const Tensor& out) override;
  void moe_routed_experts(const Tensor& x, const ActCodes& x_codes, const Tensor& ids, const Tensor& weights,
                          const StageWeights& stage, float swiglu_limit, const Tensor& y) override;
  void moe_combine(const Tensor& ids, const Tensor& y, const Tensor& shared, int64_t n_experts,
                   const Tensor& out) override;

  void markov_top2(const Tensor& logits, const Tensor& markov_head, const Tensor& markov_head_tiles,
                   const Tensor& markov_embed, const Tensor& prev, const Tensor& requests,
                   const Tensor& sampling, int64_t j, int64_t k, int64_t vocab_offset,
                   const MarkovCache& cache, const Tensor& cand) override;
  void markov_bias_rows(const Tensor& markov_head, const Tensor& markov_head_tiles,
                        const Tensor& markov_embed, const Tensor& tokens, const Tensor& out) override;
  void markov_commit(const Tensor& cand, const Tensor& requests, int64_t j, const Tensor& prev,
                     const MarkovOutputs& out) override;
  void draft_distribution(const Tensor& logits, const Tensor& bias, const Tensor& rows,
                          const Tensor& sampling, const Tensor& norm, int64_t k, int64_t vocab_offset,
                          const Tensor& out) override;
  void confidence(const Tensor& h, const Tensor& markov_embed, const Tensor& proj, const Tensor& anchor,
                  const Tensor& ids, const Tensor& requests, int64_t k, const Tensor& conf,
                  const Tensor& conf_logit) override;
};

}  // namespace dspark
