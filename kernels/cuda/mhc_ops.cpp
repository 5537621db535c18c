// The mHC ops of CudaBackend (kernels: mhc.cu): replicate, mixes, collapse (and its fused norm), expand (and
// its fused convert / tp = 2 peer sum): shape / dtype checks, then launches.
#include <limits>

#include "kernels/cuda/act_codes.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/mhc.hpp"

namespace dspark {

using cuda::check;
using cuda::elt;
using cuda::expect_dtype;
using cuda::expect_numel;
using cuda::expect_rank;

namespace {

void check_hc(const Tensor& X, const char* op) {
  expect_rank(X, 3, op, "X");
  if (X.dim(1) < 1 || X.dim(1) > cuda::kMaxHc)
    fail("cuda {}: hc = {} outside [1, {}]", op, X.dim(1), cuda::kMaxHc);
}

// The operands of an expand into X [T, hc, H]: y [T, H], post [T, hc] and comb [T, hc, hc] fp32.
void check_expand(const Tensor& y, const Tensor& X, const Tensor& post, const Tensor& comb, const char* op) {
  check_hc(X, op);
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2);
  expect_numel(y, T * H, op, "y");
  expect_dtype(post, DType::f32, op, "post");
  expect_dtype(comb, DType::f32, op, "comb");
  expect_numel(post, T * hc, op, "post");
  expect_numel(comb, T * hc * hc, op, "comb");
}

}  // namespace

void CudaBackend::hc_replicate(const Tensor& x, const Tensor& X) {
  const char* op = "hc_replicate";
  check_hc(X, op);
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2);
  expect_numel(x, T * H, op, "x");
  check(cuda::launch_hc_replicate(x.data, elt(x, op, "x"), X.data, elt(X, op, "X"), T, hc, H, cur_), op);
}

void CudaBackend::hc_mixes(const Tensor& X, const HcMixWeights& w, const MixParams& p, const Tensor& pre,
                           const Tensor& post, const Tensor& comb) {
  const char* op = "hc_mixes";
  check_hc(X, op);
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2), nmix = (2 + hc) * hc;
  if (T > std::numeric_limits<int32_t>::max()) fail("cuda hc_mixes: {} rows", T);
  expect_dtype(w.fn, DType::f32, op, "fn");
  expect_dtype(w.base, DType::f32, op, "base");
  expect_dtype(w.scale, DType::f32, op, "scale");
  expect_numel(w.fn, nmix * hc * H, op, "fn");
  expect_numel(w.base, nmix, op, "base");
  if (w.scale.numel() < 3) fail("cuda hc_mixes: scale {} must hold 3 values", shape_str(w.scale.shape));
  for (const Tensor* t : {&pre, &post, &comb}) expect_dtype(*t, DType::f32, op, "pre/post/comb");
  expect_numel(pre, T * hc, op, "pre");
  expect_numel(post, T * hc, op, "post");
  expect_numel(comb, T * hc * hc, op, "comb");
  check(cuda::launch_hc_mixes(X.data, elt(X, op, "X"), T, hc, H, w.fn.as<const float>(),
                              w.base.as<const float>(), w.scale.as<const float>(), p.norm_eps, p.hc_eps,
                              p.sinkhorn_iters, pre.as<float>(), post.as<float>(), comb.as<float>(), cur_),
        op);
}

void CudaBackend::hc_collapse(const Tensor& X, const Tensor& pre, const Tensor& out) {
  const char* op = "hc_collapse";
  check_hc(X, op);
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2);
  expect_dtype(pre, DType::f32, op, "pre");
  expect_numel(pre, T * hc, op, "pre");
  expect_numel(out, T * H, op, "out");
  check(cuda::launch_hc_collapse(X.data, elt(X, op, "X"), pre.as<const float>(), out.data,
                                 elt(out, op, "out"), T, hc, H, cur_),
        op);
}

void CudaBackend::hc_collapse_norm(const Tensor& X, const Tensor& pre, const Tensor& w, float eps,
                                   const Tensor& collapsed, const Tensor& normed) {
  hc_collapse_norm_coded(X, pre, w, eps, collapsed, normed, {});
}

void CudaBackend::hc_collapse_norm_coded(const Tensor& X, const Tensor& pre, const Tensor& w, float eps,
                                         const Tensor& collapsed, const Tensor& normed,
                                         const ActCodes& codes) {
  const char* op = "hc_collapse_norm";
  check_hc(X, op);
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2);
  expect_dtype(pre, DType::f32, op, "pre");
  expect_numel(pre, T * hc, op, "pre");
  expect_numel(w, H, op, "weight");
  expect_numel(collapsed, T * H, op, "collapsed");
  expect_numel(normed, T * H, op, "normed");
  if (!codes.empty()) expect_dtype(normed, DType::bf16, op, "normed (with activation codes)");
  check(cuda::launch_hc_collapse_norm(X.data, elt(X, op, "X"), pre.as<const float>(), w.data,
                                      elt(w, op, "weight"), eps, collapsed.data,
                                      elt(collapsed, op, "collapsed"), normed.data, elt(normed, op, "normed"),
                                      T, hc, H, cur_, cuda::codes_out(codes, T, H, op)),
        op);
}

void CudaBackend::hc_expand(const Tensor& y, const Tensor& X, const Tensor& post, const Tensor& comb) {
  const char* op = "hc_expand";
  check_expand(y, X, post, comb, op);
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2);
  check(cuda::launch_hc_expand(y.data, elt(y, op, "y"), X.data, elt(X, op, "X"), post.as<const float>(),
                               comb.as<const float>(), T, hc, H, cur_),
        op);
}

void CudaBackend::convert_hc_expand(const Tensor& sum, const Tensor& y, const Tensor& X, const Tensor& post,
                                    const Tensor& comb) {
  const char* op = "convert_hc_expand";
  check_expand(y, X, post, comb, op);
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2);
  expect_dtype(sum, DType::f32, op, "sum");
  expect_numel(sum, T * H, op, "sum");
  check(
      cuda::launch_hc_expand_from_sum(sum.as<const float>(), y.data, elt(y, op, "y"), X.data, elt(X, op, "X"),
                                      post.as<const float>(), comb.as<const float>(), T, hc, H, cur_),
      op);
}

void CudaBackend::sum_and_expand(const Exchange& ex, const Tensor& y, const Tensor& X, const Tensor& post,
                                 const Tensor& comb) {
  const PeerView* peers = ex.peers();
  if (peers == nullptr) return Backend::sum_and_expand(ex, y, X, post, comb);
  const char* op = "sum_and_expand";
  check_expand(y, X, post, comb, op);
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2);
  const Tensor& partial = ex.buffer();
  expect_dtype(partial, DType::f32, op, "partial");
  if (partial.shape.empty() || partial.shape.back() != H || partial.numel() < T * H)
    fail("cuda {}: {} rows of {} against a partial {}", op, T, H, shape_str(partial.shape));
  check(cuda::launch_hc_expand_peer_sum(*peers, y.data, elt(y, op, "y"), X.data, elt(X, op, "X"),
                                        post.as<const float>(), comb.as<const float>(), T, hc, H, cur_),
        op);
}

}  // namespace dspark
