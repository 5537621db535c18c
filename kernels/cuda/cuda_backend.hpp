// The CUDA backend: the ops of model/backend.hpp on one GPU. Memory-bound shapes (T = 5 B rows) run in own
// kernels, one file per family; linear layers go through cuBLAS. Every kernel is deterministic
// (fixed reduction order, no atomics in sums), so replicated activations are bit-identical on every rank.
// Work is issued on the backend's stream, or on a side lane's stream between begin_side() and end_side()
// (each stream has its own cuBLAS handle and scratch, so no two share a buffer of the backend's);
// download() and synchronize() wait for all of them.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "lib/core/tuning.hpp"
#include "lib/model/backend.hpp"

namespace dspark {

namespace cuda {
struct AttentionArgs;
}

class CudaBackend final : public Backend {
 public:
  // Uses GPU `device` (cudaSetDevice) and a stream of its own. Throws dspark::Error when there is no such
  // GPU. `tuning` picks the optimisations (core/tuning.hpp); its pdl is process-wide
  // (cuda::set_programmatic_launch), so the last backend constructed sets it for all.
  explicit CudaBackend(int device, const Tuning& tuning = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  // The formats its linear ops run, without a device (dspark_inspect's report).
  static bool runs_format(WeightFormat f) {
    return f == WeightFormat::dense || f == WeightFormat::fp8_block || f == WeightFormat::fp4 ||
           f == WeightFormat::exl3;
  }
  bool supports_format(WeightFormat f) const override { return runs_format(f); }
  int device() const { return device_; }
  const Tuning& tuning() const { return tuning_; }
  // Replayed steps append their kernel start trace to "<file>.gpu<device>" (kernels/cuda/kernel_trace.hpp);
  // empty = no trace. Throws dspark::Error for a non-empty file unless the build records the trace
  // (-DDSPARK_KERNEL_TRACE=ON).
  void set_kernel_trace_file(const std::string& file);
  // The main stream: collectives, uploads, downloads and graph launches go here.
  cudaStream_t stream() const { return stream_; }

  Tensor alloc(DType dtype, const Shape& shape) override;
  void upload(const Tensor& dst, const void* src) override;
  void download(void* dst, const Tensor& src) override;
  // cudaHostAlloc'd, mapped: the same pointer on the host and in kernels (unified addressing).
  Tensor alloc_host(DType dtype, const Shape& shape) override;
  // A kernel (not a copy engine transfer): it reads or writes host memory over PCIe in the step's own
  // sequence, with programmatic launch like the rest of the step.
  void copy(const Tensor& src, const Tensor& dst) override;
  // Spins on the word (the kernel's PCIe write reaches it before the stream's completion reaches a
  // synchronising host), asking the stream every 100 us whether it failed or finished without writing it.
  void wait_for_word(const Tensor& word, int32_t value) override;
  // A kernel reading the rows over PCIe (as copy() does), inside a recording if there is one.
  void gather_host_rows(const Tensor& sources, const Tensor& dst) override;
  bool reads_in_place(const void* p) const override;
  void fill_i32(const Tensor& t, int32_t value) override;
  void zero(const Tensor& t) override;
  void synchronize() override;
  // Every fp8 block and fp4 matrix goes into its mma tiles (kernels/cuda/quant_tile.cuh, the only layout
  // the quantised kernels read). Every expert matrix (routed, all of a stage's or none, and shared) that the
  // tensor-core experts can read goes into bf16 mma tiles (kernels/cuda/mma_tile.cuh), in a buffer of its
  // own; the attention layers, the head and markov_head gain a copy in tiles for the few-row kernels. Nothing
  // without Tuning::weight_tiles; the head's copy only with Tuning::head_tiles.
  void prepare_weights(DrafterWeights& w) override;

  bool supports_graphs() const override { return true; }
  uint64_t device_memory_used() const override;  // cudaMemGetInfo: total - free
  void begin_capture() override;
  std::shared_ptr<void> end_capture() override;
  void replay(const std::shared_ptr<void>& graph) override;

  void begin_side(SideLane lane) override;
  void end_side() override;
  void join_side() override;

  // Codes for rows of `cols` in the QuantAct layout (kernels/cuda/quant_act.hpp) where the norm kernels can
  // write them (quant_act_out_fits); empty otherwise (act_codes_ops.cpp).
  ActCodes alloc_act_codes(int64_t rows, int64_t cols, int64_t block) override;
  void rms_norm_coded(const Tensor& x, const Tensor& w, float eps, const Tensor& out,
                      const ActCodes& codes) override;
  void hc_collapse_norm_coded(const Tensor& X, const Tensor& pre, const Tensor& w, float eps,
                              const Tensor& collapsed, const Tensor& normed, const ActCodes& codes) override;
  void linear_coded(const Tensor& x, const ActCodes& codes, const LinearWeight& w,
                    const Tensor& out) override;

  void embed(const Tensor& table, const Tensor& ids, const Tensor& out) override;
  void linear(const Tensor& x, const LinearWeight& w, const Tensor& out) override;
  void grouped_linear(const Tensor& x, const LinearWeight& w, int64_t groups, const Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override;
  void rope(const Tensor& x, const Tensor& pos, int64_t rope_dim, double theta, bool inverse) override;
  void kv_qdq(const Tensor& x, int64_t block) override;
  void kv_norm_rope_qdq(const Tensor& kv, const Tensor& w, float eps, const Tensor& pos, int64_t rope_dim,
                        double theta, int64_t block, const Tensor& out) override;
  void convert(const Tensor& src, const Tensor& dst) override;

  void hc_replicate(const Tensor& x, const Tensor& X) override;
  void hc_mixes(const Tensor& X, const HcMixWeights& w, const MixParams& p, const Tensor& pre,
                const Tensor& post, const Tensor& comb) override;
  void hc_collapse(const Tensor& X, const Tensor& pre, const Tensor& out) override;
  void hc_collapse_norm(const Tensor& X, const Tensor& pre, const Tensor& w, float eps,
                        const Tensor& collapsed, const Tensor& normed) override;
  void hc_expand(const Tensor& y, const Tensor& X, const Tensor& post, const Tensor& comb) override;
  // With peer memory (ex.peers()): the sum over the ranks' partials / the merge of their records inside
  // the kernel; otherwise Backend's default (the communicator's collective, then the op).
  void commit_markov(const Exchange& ex, const Tensor& requests, int64_t j, const Tensor& prev,
                     const MarkovOutputs& out) override;
  void sum_and_expand(const Exchange& ex, const Tensor& y, const Tensor& X, const Tensor& post,
                      const Tensor& comb) override;
  void convert_hc_expand(const Tensor& sum, const Tensor& y, const Tensor& X, const Tensor& post,
                         const Tensor& comb) override;

  void ring_write(const Tensor& ring_kv, const Tensor& ring_pos, const Tensor& kv, const Tensor& slots,
                  const Tensor& pos) override;
  // Every stage's wkv in one launch and every stage's KV rows into the rings in another (insert_ops.cpp).
  void insert_kv_rows(const Tensor& x, const ActCodes& x_codes, std::span<const InsertKvStage> stages,
                      const Tensor& pos, const Tensor& slots, const KvRowParams& p) override;
  void ring_clear(const Tensor& ring_pos, int64_t slot) override;

  void attention(const Tensor& q, const Tensor& block_kv, const Tensor& ring_kv, const Tensor& ring_pos,
                 const Tensor& requests, const Tensor& sink, int64_t k, const Tensor& out) override;
  void attention_inverse_rope(const Tensor& q, const Tensor& block_kv, const Tensor& ring_kv,
                              const Tensor& ring_pos, const Tensor& requests, const Tensor& sink, int64_t k,
                              const Tensor& pos, int64_t rope_dim, double theta, const Tensor& out) override;

  void moe_route(const Tensor& x, const Tensor& gate, const Tensor& bias, const RouteParams& p,
                 const Tensor& ids, const Tensor& weights) override;
  // x_codes (both): used by quantised experts whose activation block they have.
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

 private:
  struct Blas;     // cuBLAS handle and workspace
  struct Scratch;  // device scratch of the multi-pass ops (MoE h, Markov partials)
  // y = x W^T (groups = 1) or the block-diagonal grouped form through cuBLAS (bf16 x, bf16 W, fp32 compute).
  void gemm_bf16(const char* op, const Tensor& x, const LinearWeight& w, int64_t groups, int64_t rows,
                 const Tensor& out);
  // Packs the fp8 block and fp4 weights into their tiles (prepare_weights, whatever the Tuning).
  void prepare_quantised(DrafterWeights& w);
  void add_dequantised(LinearWeight& m);
  // y = x W^T for an fp8 block W in tiles: x quantised per block (SPEC §3), then the tiled product; codes:
  // x's codes (act_codes_usable), read instead of quantising x, or nullptr.
  void fp8_linear(const char* op, const Tensor& x, const LinearWeight& w, int64_t rows, const Tensor& out,
                  const ActCodes* codes = nullptr);
  // fp8_linear of several fp8 block weights of one shape and form on the same x (an insert's wkv of every
  // stage), x quantised once and the products in one launch; false, with nothing queued, where the weights
  // or outputs differ in shape, format or dtype (the caller then takes them one by one).
  bool fp8_linear_same_input(const char* op, const Tensor& x, const ActCodes* codes,
                             std::span<const LinearWeight* const> ws, std::span<const Tensor> outs,
                             int64_t rows);
  // The products of fp8_linear / fp8_linear_same_input, the weights' shapes already matched to each other.
  void fp8_products(const char* op, const Tensor& x, const ActCodes* codes,
                    std::span<const LinearWeight* const> ws, std::span<const Tensor> outs, int64_t rows);
  // The grouped product with an fp8 block W in tiles and x as it is (SPEC §3's wo_a rule).
  void fp8_grouped(const char* op, const Tensor& x, const LinearWeight& w, int64_t groups, int64_t rows,
                   const Tensor& out);
  // y = x W^T for an EXL3 W (SPEC §9): the input transform, the product decoding the trellis, the output
  // transform (exl3_ops.cpp).
  void exl3_linear(const char* op, const Tensor& x, const LinearWeight& w, int64_t rows, const Tensor& out);
  // The experts of a stage whose matrices are EXL3: the routed ones over the selected experts, the shared
  // one.
  void exl3_routed(const char* op, const Tensor& x, const Tensor& ids, const Tensor& weights,
                   const StageWeights& stage, float swiglu_limit, const Tensor& y);
  void exl3_shared(const char* op, const Tensor& x, const StageWeights& stage, float swiglu_limit,
                   const Tensor& out);
  // At least `bytes` of the current stream's device scratch (stream-ordered reuse: ops on one stream never
  // overlap; each stream has its own). Allocated in the constructor (64 MiB main, 1 MiB side); grows with a
  // cudaMalloc when a larger shape asks, which is refused during a graph capture. Outgrown buffers stay alive
  // until destruction, so queued work and captured graphs never point at freed memory.
  void* scratch(size_t bytes, const char* op);
  // kMaxStagingBytes of pinned host memory that small uploads and downloads copy through, once the transfer
  // that last used it has completed (page-locked copies are faster, and an upload can return before it
  // lands); nullptr above kMaxStagingBytes: those go straight from / to the caller's memory, where the driver
  // overlaps its own staging copy with the transfer (a whole copy into this buffer first would be serial).
  void* staging(size_t bytes, const char* op);
  static constexpr size_t kMaxStagingBytes = size_t{64} << 10;  // a draft step's upload and download: ~1 KB
  // The key splits of an attention launch (cuda::attention_splits) and, when it splits, their partials in the
  // current stream's scratch and its counters.
  void split_attention(cuda::AttentionArgs& a, const char* op);
  // The current stream's cuBLAS handle and scratch.
  Blas& blas() { return on_lane_ ? *on_lane_->blas : *blas_; }
  Scratch& current_scratch() { return on_lane_ ? *on_lane_->scratch : *scratch_; }
  void release() noexcept;

  int device_ = 0;
  Tuning tuning_;
  std::string kernel_trace_file_;  // empty: no trace
  cudaStream_t stream_ = nullptr;
  // A side branch's stream, its events and what the ops on it use (Backend::SideLane).
  struct Lane {
    cudaStream_t stream = nullptr;
    cudaEvent_t fork = nullptr;  // main -> lane: its work starts after the main work issued before it
    cudaEvent_t join = nullptr;  // lane -> main: its work issued so far
    bool pending = false;        // work recorded in join that the main stream has not waited for
    std::unique_ptr<Blas> blas;
    std::unique_ptr<Scratch> scratch;
  };
  // Where ops go: stream_, or on_lane_'s stream between begin_side() and end_side().
  cudaStream_t cur_ = nullptr;
  Lane* on_lane_ = nullptr;
  std::array<Lane, 2> lanes_;     // indexed by SideLane
  void* staging_ = nullptr;       // pinned, kMaxStagingBytes long (allocated at the first small transfer)
  cudaEvent_t staged_ = nullptr;  // recorded after the last transfer through staging_
  std::unique_ptr<Blas> blas_;
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace dspark
