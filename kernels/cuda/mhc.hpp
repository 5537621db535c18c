// Manifold hyper-connections on X [T, hc, H] (mhc.cu): replicate, the mix coefficients, collapse, expand;
// their CudaBackend ops are in mhc_ops.cpp. Plain C++ (g++ and nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch_common.hpp"
#include "kernels/cuda/quant_act.hpp"
#include "lib/core/peer_view.hpp"

namespace dspark::cuda {

cudaError_t launch_hc_replicate(const void* x, Elt x_t, void* X, Elt X_t, int64_t T, int64_t hc, int64_t H,
                                cudaStream_t s);
constexpr int kMaxHc = 8;
cudaError_t launch_hc_mixes(const void* X, Elt X_t, int64_t T, int64_t hc, int64_t H, const float* fn,
                            const float* base, const float* scale, float norm_eps, float hc_eps,
                            int64_t sinkhorn_iters, float* pre, float* post, float* comb, cudaStream_t s);
cudaError_t launch_hc_collapse(const void* X, Elt X_t, const float* pre, void* out, Elt out_t, int64_t T,
                               int64_t hc, int64_t H, cudaStream_t s);
// y = sum rounded to y_t (stored), then launch_hc_expand with it, in one kernel (same bits).
cudaError_t launch_hc_expand_from_sum(const float* sum, void* y, Elt y_t, void* X, Elt X_t, const float* post,
                                      const float* comb, int64_t T, int64_t hc, int64_t H, cudaStream_t s);
// launch_hc_collapse, then launch_rms_norm of the collapsed rows with w into normed: one kernel for bf16 X
// and collapsed rows (H % 8 == 0, aligned), the two otherwise; the same bits either way. codes: where to
// write normed's activation quantisation too (as launch_rms_norm's).
cudaError_t launch_hc_collapse_norm(const void* X, Elt X_t, const float* pre, const void* w, Elt w_t,
                                    float eps, void* collapsed, Elt c_t, void* normed, Elt n_t, int64_t T,
                                    int64_t hc, int64_t H, cudaStream_t s, const QuantActOut& codes = {});
cudaError_t launch_hc_expand(const void* y, Elt y_t, void* X, Elt X_t, const float* post, const float* comb,
                             int64_t T, int64_t hc, int64_t H, cudaStream_t s);
// launch_hc_expand_from_sum of the sum over every rank's partial in peer memory (rank order; the ranks'
// [T, H] f32 buffers of `peers`), after the exchange's handshake (comm/peer_handshake.cuh).
cudaError_t launch_hc_expand_peer_sum(const PeerView& peers, void* y, Elt y_t, void* X, Elt X_t,
                                      const float* post, const float* comb, int64_t T, int64_t hc, int64_t H,
                                      cudaStream_t s);

}  // namespace dspark::cuda
