// Test helper: the experts' whole output (shared expert, routed experts, combine) in the drafter's order.
#pragma once

#include <cstdint>

#include "lib/core/tensor.hpp"
#include "lib/model/backend.hpp"
#include "lib/model/weights.hpp"

namespace dspark::test {

// out f32 [T, H] = the routed choices' outputs in ascending expert id, then the shared expert's.
inline void moe_experts(Backend& be, const Tensor& x, const Tensor& ids, const Tensor& weights,
                        const StageWeights& stage, float swiglu_limit, const Tensor& out) {
  const int64_t H = x.shape.back(), T = x.numel() / H, top_k = ids.numel() / T;
  const Tensor shared = be.alloc(DType::f32, {T, H}), routed = be.alloc(DType::f32, {T, top_k, H});
  be.moe_shared_expert(x, {}, stage, swiglu_limit, shared);
  be.moe_routed_experts(x, {}, ids, weights, stage, swiglu_limit, routed);
  be.moe_combine(ids, routed, shared, static_cast<int64_t>(stage.experts.size()), out);
}

}  // namespace dspark::test
