// The mixture-of-experts ops of CudaBackend (kernels: moe_route.cu, moe_experts.cu): shape / dtype checks,
// the stage's expert matrices as an ExpertSet, then launches; EXL3 experts go to exl3_ops.cpp.
#include <optional>
#include <utility>

#include "kernels/cuda/act_codes.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/moe.hpp"

namespace dspark {

using cuda::check;
using cuda::Elt;
using cuda::elt;
using cuda::expect_dtype;
using cuda::expect_numel;
using cuda::expect_rank;

namespace {

// Elements of w's stored weight part (fp4: two per byte).
int64_t stored_weight_shape_numel(const LinearWeight& w) {
  return w.format == WeightFormat::fp4_mma_tiles ? w.out * w.in / 2 : w.out * w.in;
}

cuda::ExpertKind kind_of(WeightFormat f) {
  return f == WeightFormat::fp8_mma_tiles   ? cuda::ExpertKind::fp8
         : f == WeightFormat::fp4_mma_tiles ? cuda::ExpertKind::fp4
                                            : cuda::ExpertKind::bf16;
}

// One expert matrix [rows, cols] of an ExpertSet; its dtype must agree with the set's, and its layout
// (row-major, bf16 mma tiles or a quantised format's tiles) with `layout`'s, the first matrix's.
const void* expert_matrix(const LinearWeight& w, int64_t rows, int64_t cols, Elt* t, bool first,
                          const LinearWeight& layout, const char* op) {
  if (w.format == WeightFormat::fp8_block || w.format == WeightFormat::fp4)
    fail("cuda {}: {} weight '{}' is still row-major: the backend's prepare_weights puts it in tiles", op,
         weight_format_name(w.format), w.name);
  if (w.format != WeightFormat::dense && w.format != WeightFormat::bf16_mma_tiles &&
      w.format != WeightFormat::fp8_mma_tiles && w.format != WeightFormat::fp4_mma_tiles)
    fail("cuda {}: weight '{}' is {}, which the experts do not run", op, w.name,
         weight_format_name(w.format));
  if (w.format != layout.format || w.block != layout.block)
    fail("cuda {}: weight '{}' is {}, '{}' is {}: one launch reads one layout", op, w.name,
         weight_format_name(w.format), layout.name, weight_format_name(layout.format));
  if (w.out != rows || w.in != cols || w.weight.numel() != stored_weight_shape_numel(w))
    fail("cuda {}: weight '{}' [{}, {}] ({}) must be [{}, {}]", op, w.name, w.out, w.in,
         shape_str(w.weight.shape), rows, cols);
  if (kind_of(w.format) != cuda::ExpertKind::bf16) {
    cuda::expect_data(w.scale, op, "scale");
    return w.weight.data;
  }
  const Elt e = elt(w.weight, op, w.name.c_str());
  if (first)
    *t = e;
  else if (e != *t)
    fail("cuda {}: weight '{}' is {}, other experts' are not", op, w.name, dtype_name(w.weight.dtype));
  return w.weight.data;
}

// A stage's routed experts as an ExpertSet (the shared expert's fields unset).
cuda::ExpertSet routed_set(const StageWeights& stage, int64_t H, const char* op) {
  const int64_t E = static_cast<int64_t>(stage.experts.size());
  if (E > cuda::kMaxExperts) fail("cuda {}: {} experts (at most {})", op, E, cuda::kMaxExperts);
  cuda::ExpertSet es{};
  es.E = E;
  es.I = E > 0 ? stage.experts[0].w1.out : 0;
  for (int64_t e = 0; e < E; ++e) {
    const ExpertWeights& ew = stage.experts[static_cast<size_t>(e)];
    const LinearWeight& layout = stage.experts[0].w1;  // every matrix in expert 0's w1's layout
    es.w1[e] = expert_matrix(ew.w1, es.I, H, &es.w1_t, e == 0, layout, op);
    es.w3[e] = expert_matrix(ew.w3, es.I, H, &es.w3_t, e == 0, layout, op);
    es.w2[e] = expert_matrix(ew.w2, H, es.I, &es.w2_t, e == 0, layout, op);
    es.w1_scale[e] = ew.w1.scale.data;
    es.w3_scale[e] = ew.w3.scale.data;
    es.w2_scale[e] = ew.w2.scale.data;
  }
  if (es.w1_t != es.w3_t) fail("cuda {}: w1 and w3 of the experts must have one dtype", op);
  es.tiles = E > 0 && stage.experts[0].w1.format == WeightFormat::bf16_mma_tiles;
  es.kind = E > 0 ? kind_of(stage.experts[0].w1.format) : cuda::ExpertKind::bf16;
  es.block = es.kind == cuda::ExpertKind::fp8 ? stage.experts[0].w1.block : 0;
  es.act_block = E > 0 ? stage.experts[0].w1.block : 0;
  return es;
}

// A stage's shared expert as an ExpertSet (no routed experts).
cuda::ExpertSet shared_set(const StageWeights& stage, int64_t H, const char* op) {
  cuda::ExpertSet es{};
  es.I_shared = stage.shared.w1.out;
  const LinearWeight& layout = stage.shared.w1;
  es.shared_w1 = expert_matrix(stage.shared.w1, es.I_shared, H, &es.shared_w1_t, true, layout, op);
  es.shared_w3 = expert_matrix(stage.shared.w3, es.I_shared, H, &es.shared_w3_t, true, layout, op);
  es.shared_w2 = expert_matrix(stage.shared.w2, H, es.I_shared, &es.shared_w2_t, true, layout, op);
  if (es.shared_w1_t != es.shared_w3_t)
    fail("cuda {}: w1 and w3 of the shared expert must have one dtype", op);
  es.shared_tiles = layout.format == WeightFormat::bf16_mma_tiles;
  es.shared_kind = kind_of(layout.format);
  es.shared_w1_scale = stage.shared.w1.scale.data;
  es.shared_w3_scale = stage.shared.w3.scale.data;
  es.shared_w2_scale = stage.shared.w2.scale.data;
  es.shared_block = es.shared_kind == cuda::ExpertKind::fp8 ? layout.block : 0;
  es.shared_act_block = layout.block;
  return es;
}

// Experts in mma tiles (bf16 or quantised) run on the tensor cores only: x bf16, its rows 16-byte aligned.
void expect_tiles_input(const Tensor& x, const char* op) {
  if (x.dtype != DType::bf16 || !cuda::aligned16(x.data))
    fail("cuda {}: the experts are in mma tiles, which need x bf16 and 16-byte aligned (x is {})", op,
         dtype_name(x.dtype));
}

// Rows of an activation x [T, H] (T = 0 for an empty one).
int64_t rows_of(const Tensor& x, const char* op) {
  if (x.shape.empty()) fail("cuda {}: x has no shape", op);
  const int64_t H = x.shape.back();
  return H > 0 ? x.numel() / H : 0;
}

}  // namespace

void CudaBackend::moe_route(const Tensor& x, const Tensor& gate, const Tensor& bias, const RouteParams& p,
                            const Tensor& ids, const Tensor& weights) {
  const char* op = "moe_route";
  expect_rank(gate, 2, op, "gate");
  const int64_t E = gate.dim(0), H = gate.dim(1);
  if (H < 1 || x.numel() % H != 0) fail("cuda moe_route: x {} is not rows of {}", shape_str(x.shape), H);
  const int64_t T = x.numel() / H;
  if (p.top_k < 1 || p.top_k > E || p.top_k > cuda::kMaxTopK)
    fail("cuda moe_route: top_k {} outside [1, min({}, {})]", p.top_k, E, cuda::kMaxTopK);
  if (E > cuda::kMaxExperts) fail("cuda moe_route: {} experts (at most {})", E, cuda::kMaxExperts);
  expect_dtype(bias, DType::f32, op, "bias");
  expect_numel(bias, E, op, "bias");
  expect_dtype(ids, DType::i32, op, "ids");
  expect_dtype(weights, DType::f32, op, "weights");
  expect_numel(ids, T * p.top_k, op, "ids");
  expect_numel(weights, T * p.top_k, op, "weights");
  float* scores = static_cast<float*>(scratch(static_cast<size_t>(T * E) * sizeof(float), op));
  check(cuda::launch_moe_route(x.data, elt(x, op, "x"), gate.data, elt(gate, op, "gate"),
                               bias.as<const float>(), T, E, H, p.top_k, p.route_scale, p.gate_temp,
                               p.normalize, scores, ids.as<int32_t>(), weights.as<float>(), cur_),
        op);
}

void CudaBackend::moe_shared_expert(const Tensor& x, const ActCodes& x_codes, const StageWeights& stage,
                                    float swiglu_limit, const Tensor& out) {
  const char* op = "moe_shared_expert";
  const int64_t T = rows_of(x, op), H = x.shape.back();
  if (T == 0) return;
  expect_dtype(out, DType::f32, op, "out");
  expect_numel(out, T * H, op, "out");
  if (stage.shared.w1.format == WeightFormat::exl3) {
    exl3_shared(op, x, stage, swiglu_limit, out);
    return;
  }
  const cuda::ExpertSet es = shared_set(stage, H, op);
  const bool quantised = es.shared_kind != cuda::ExpertKind::bf16;
  if (es.shared_tiles || quantised) expect_tiles_input(x, op);
  void* buf = scratch(cuda::moe_shared_scratch_bytes(T, es.I_shared, H, quantised), op);
  const std::optional<cuda::QuantAct> codes =
      quantised ? cuda::usable_codes(x_codes, T, H, es.shared_act_block) : std::nullopt;
  check(cuda::launch_moe_shared(x.data, elt(x, op, "x"), codes ? &*codes : nullptr, T, H, es, swiglu_limit,
                                buf, out.as<float>(), cur_),
        op);
}

void CudaBackend::moe_routed_experts(const Tensor& x, const ActCodes& x_codes, const Tensor& ids,
                                     const Tensor& weights, const StageWeights& stage, float swiglu_limit,
                                     const Tensor& y) {
  const char* op = "moe_routed_experts";
  const int64_t T = rows_of(x, op), H = x.shape.back();
  if (T == 0) return;
  expect_dtype(ids, DType::i32, op, "ids");
  expect_dtype(weights, DType::f32, op, "weights");
  expect_dtype(y, DType::f32, op, "y");
  if (ids.numel() % T != 0) fail("cuda {}: ids {} are not {} rows", op, shape_str(ids.shape), T);
  const int64_t top_k = ids.numel() / T;
  if (top_k > cuda::kMaxTopK) fail("cuda {}: top_k {} over {}", op, top_k, cuda::kMaxTopK);
  expect_numel(weights, T * top_k, op, "weights");
  expect_numel(y, T * top_k * H, op, "y");
  if (!stage.experts.empty() && stage.experts[0].w1.format == WeightFormat::exl3) {
    exl3_routed(op, x, ids, weights, stage, swiglu_limit, y);
    return;
  }
  const cuda::ExpertSet es = routed_set(stage, H, op);
  const bool quantised = es.kind != cuda::ExpertKind::bf16;
  if (es.tiles || quantised) expect_tiles_input(x, op);
  void* buf = scratch(cuda::moe_routed_scratch_bytes(T, top_k, es.E, es.I, H, quantised), op);
  const std::optional<cuda::QuantAct> codes =
      quantised ? cuda::usable_codes(x_codes, T, H, es.act_block) : std::nullopt;
  check(cuda::launch_moe_routed(x.data, elt(x, op, "x"), codes ? &*codes : nullptr, ids.as<const int32_t>(),
                                weights.as<const float>(), T, H, top_k, es, swiglu_limit, buf, y.as<float>(),
                                cur_),
        op);
}

void CudaBackend::moe_combine(const Tensor& ids, const Tensor& y, const Tensor& shared, int64_t n_experts,
                              const Tensor& out) {
  const char* op = "moe_combine";
  expect_dtype(ids, DType::i32, op, "ids");
  for (const auto& [t, name] : {std::pair{&y, "y"}, {&shared, "shared"}, {&out, "out"}})
    expect_dtype(*t, DType::f32, op, name);
  const int64_t T = rows_of(out, op), H = out.shape.back();
  if (T == 0) return;
  if (ids.numel() % T != 0) fail("cuda moe_combine: ids {} are not {} rows", shape_str(ids.shape), T);
  const int64_t top_k = ids.numel() / T;
  if (top_k > cuda::kMaxTopK) fail("cuda moe_combine: top_k {} over {}", top_k, cuda::kMaxTopK);
  expect_numel(y, T * top_k * H, op, "y");
  expect_numel(shared, T * H, op, "shared");
  check(cuda::launch_moe_combine(ids.as<const int32_t>(), T, H, top_k, n_experts, y.as<const float>(),
                                 shared.as<const float>(), out.as<float>(), cur_),
        op);
}

}  // namespace dspark
