// The drafter's weights as one rank holds them: replicated tensors whole, sharded ones cut by the ShardPlan.
// Every Tensor lives in the backend's memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/core/exl3.hpp"
#include "lib/core/tensor.hpp"
#include "lib/core/weight_format.hpp"

namespace dspark {

// One linear layer y = x W^T with W [out, in] (this rank's part of it).
struct LinearWeight {
  std::string name;  // base name in the checkpoint, for messages
  WeightFormat format = WeightFormat::dense;
  int64_t out = 0;
  int64_t in = 0;
  // dense [out, in]; fp8 e4m3 [out, in]; fp4 [out, in/2] (stored_weight_shape); EXL3: the trellis, i16
  // [in/16, out/16, 16 bits] (SPEC §9).
  Tensor weight;
  // Optional, dense bf16 only: the same matrix in bf16 mma tiles, made by the CUDA backend's prepare_weights
  // for its few-row path (weight stays for the others); empty otherwise.
  Tensor tiles;
  // Optional, fp8 block only: the same matrix dequantised to bf16 [out, in], row-major (each code times its
  // block's power-of-two scale, exact in bf16), made by the CUDA backend's prepare_weights for main_proj and
  // wkv (the insert's products): a product of at least kDequantisedMinRows rows reads it (the activations
  // quantised as SPEC §3 says, then dequantised, exactly, to bf16) through a bf16 matrix product instead of
  // the few-row kernel. EXL3: the trellis decoded, W_dec transposed to f16 [out, in] (row o holds output o's
  // weights in the transform domain), made by the CPU backend's prepare_weights. Empty otherwise.
  Tensor dequantised;
  Tensor scale;       // fp8 block / fp4: e8m0 scales, stored_scale_shape(format, out, in, block); else empty
  int64_t block = 0;  // fp8 block: B, the block edge (also the activation block of fp8 and fp4 linears)
  // EXL3 only: the input and output scales, f16 [in] and [out] (a legacy checkpoint's sign bits as +-1), the
  // bits per weight K and the codebook.
  Tensor suh, svh;
  int64_t bits = 0;
  Exl3Codebook codebook = Exl3Codebook::mul1;
};

// The bytes a linear's stored parts hold (weight, scale, EXL3's suh and svh; no backend copies).
inline uint64_t linear_bytes(const LinearWeight& l) {
  uint64_t n = 0;
  for (const Tensor* t : {&l.weight, &l.scale, &l.suh, &l.svh})
    if (!t->empty()) n += t->nbytes();
  return n;
}

// The fewest rows of a product that reads LinearWeight::dequantised where it exists (fewer rows: the
// few-row kernel on the fp8 codes, which reads half the bytes).
constexpr int64_t kDequantisedMinRows = 17;

// A dense [out, in] linear over `weight` (its two dimensions).
inline LinearWeight dense_linear(std::string name, Tensor weight) {
  LinearWeight l;
  l.name = std::move(name);
  l.out = weight.dim(0);
  l.in = weight.dim(1);
  l.weight = std::move(weight);
  return l;
}

struct ExpertWeights {
  LinearWeight w1, w3, w2;  // gate [I_r, H], up [I_r, H], down [H, I_r]
};

// Mix projection of one mHC half: fn [(2+hc)*hc, hc*H], base [(2+hc)*hc], scale [3], all f32.
struct HcMixWeights {
  Tensor fn, base, scale;
};

struct StageWeights {
  Tensor attn_norm, ffn_norm;
  HcMixWeights hc_attn, hc_ffn;
  LinearWeight wq_a, wq_b, wkv, wo_a, wo_b;  // wq_b: this rank's heads; wo_a: its groups; wo_b: their inputs
  Tensor q_norm, kv_norm;
  Tensor attn_sink;                    // [heads of this rank] f32
  Tensor gate;                         // [E, H] bf16
  Tensor gate_bias;                    // [E] f32
  std::vector<ExpertWeights> experts;  // every routed expert, this rank's intermediate channels
  ExpertWeights shared;                // this rank's intermediate channels
};

struct DrafterWeights {
  Tensor embed;  // [V, H]
  LinearWeight main_proj;
  Tensor main_norm;
  std::vector<StageWeights> stages;
  Tensor final_norm;
  LinearWeight head;         // [V_r, H] vocabulary columns of this rank
  Tensor markov_embed;       // [V, R] replicated
  Tensor markov_head;        // [V_r, R]
  Tensor markov_head_tiles;  // a copy in bf16 mma tiles, made by the CUDA backend's prepare_weights
  Tensor confidence_proj;    // [1, H + R]
  uint64_t bytes = 0;        // weight bytes held by this rank
};

// Calls fn on every linear weight of the drafter: main_proj, the head, and each stage's attention and expert
// linears.
template <class Fn>
void for_each_linear(DrafterWeights& w, Fn&& fn) {
  fn(w.main_proj);
  fn(w.head);
  for (StageWeights& st : w.stages) {
    for (LinearWeight* m : {&st.wq_a, &st.wq_b, &st.wkv, &st.wo_a, &st.wo_b}) fn(*m);
    for (ExpertWeights& e : st.experts)
      for (LinearWeight* m : {&e.w1, &e.w3, &e.w2}) fn(*m);
    for (LinearWeight* m : {&st.shared.w1, &st.shared.w3, &st.shared.w2}) fn(*m);
  }
}

}  // namespace dspark
