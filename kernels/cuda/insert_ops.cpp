// CudaBackend::insert_kv_rows: an insert's KV rows of every stage in two launches where the shapes allow
// (every stage's wkv in one few-row tiles launch, bf16 or fp8, then every stage's KV norm, RoPE and QDQ
// written straight into its ring), else stage by stage through the separate ops. Either way the same bits.
#include <algorithm>
#include <limits>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/linear_tiles.hpp"
#include "kernels/cuda/norm_rope.hpp"
#include "kernels/cuda/quant_linear.hpp"
#include "kernels/cuda/rope_host.hpp"
#include "kernels/cuda/weight_tiles.hpp"

namespace dspark {

using cuda::check;
using cuda::elt;

namespace {

// Whether every stage's wkv takes the few-row tiles kernel (dense_ops.cpp's rule for one layer) with one
// shape, into bf16 kv rows.
bool wkv_in_one_launch(const Tensor& x, std::span<const InsertKvStage> stages, int64_t rows) {
  if (stages.size() > static_cast<size_t>(cuda::kLinearTilesMaxMatrices) || x.dtype != DType::bf16 ||
      !cuda::aligned16(x.data) || rows > cuda::kLinearTilesMaxRows)
    return false;
  const LinearWeight& first = *stages.front().wkv;
  if (x.shape.empty() || x.shape.back() != first.in || x.numel() != rows * first.in)
    return false;  // linear() names it
  for (const InsertKvStage& st : stages) {
    const LinearWeight& w = *st.wkv;
    if (w.format != WeightFormat::dense || w.tiles.empty() || w.out != first.out || w.in != first.in ||
        w.out % cuda::kMmaTileRows != 0 || w.in % cuda::kMmaTileCols != 0 || st.kv.dtype != DType::bf16 ||
        st.kv.numel() != rows * w.out)
      return false;
  }
  return true;
}

// Whether every stage's norm, RoPE, QDQ and ring write fit the fused kernel: bf16 rows and rings of one
// shape.
bool rows_to_rings_in_one_launch(std::span<const InsertKvStage> stages, int64_t rows, int64_t d,
                                 const KvRowParams& p) {
  if (stages.size() > static_cast<size_t>(cuda::kMaxKvRingStages) || p.block < 1 || d % p.block != 0 ||
      cuda::kv_norm_rope_qdq_smem_bytes(d) > 48 * 1024 || p.rope_dim <= 0 || p.rope_dim > d ||
      p.rope_dim % 2 != 0 || p.rope_dim / 2 > cuda::kMaxRopeHalf)
    return false;
  const InsertKvStage& first = stages.front();
  for (const InsertKvStage& st : stages) {
    if (st.kv.dtype != DType::bf16 || st.kv.shape.size() != 2 || st.kv.dim(0) != rows || st.kv.dim(1) != d ||
        st.ring_kv.dtype != DType::bf16 || st.ring_kv.shape != first.ring_kv.shape ||
        st.ring_kv.dim(2) != d || st.ring_pos.dtype != DType::i32 ||
        st.ring_pos.shape != first.ring_pos.shape || st.ring_pos.dim(1) != st.ring_kv.dim(1) ||
        st.kv_norm.dtype != first.kv_norm.dtype || st.kv_norm.numel() != d)
      return false;
  }
  return true;
}

}  // namespace

void CudaBackend::insert_kv_rows(const Tensor& x, const ActCodes& x_codes,
                                 std::span<const InsertKvStage> stages, const Tensor& pos,
                                 const Tensor& slots, const KvRowParams& p) {
  const char* op = "insert_kv_rows";
  if (stages.empty()) return;
  const int64_t d = stages.front().wkv->out, rows = d > 0 ? stages.front().kv.numel() / d : 0;
  if (rows == 0) return;
  if (wkv_in_one_launch(x, stages, rows)) {
    const void* w[cuda::kLinearTilesMaxMatrices];
    void* out[cuda::kLinearTilesMaxMatrices];
    for (size_t i = 0; i < stages.size(); ++i) {
      w[i] = stages[i].wkv->tiles.data;
      out[i] = stages[i].kv.data;
    }
    check(cuda::launch_linear_tiles_multi(x.data, rows, 1, w, static_cast<int>(stages.size()), d,
                                          stages.front().wkv->in, out, cuda::Elt::bf16, cur_),
          op);
  } else {
    const LinearWeight* wkv[cuda::kFp8LinearMaxMatrices];
    Tensor kv[cuda::kFp8LinearMaxMatrices];
    const size_t n = std::min(stages.size(), static_cast<size_t>(cuda::kFp8LinearMaxMatrices));
    for (size_t i = 0; i < n; ++i) wkv[i] = stages[i].wkv, kv[i] = stages[i].kv;
    if (stages.size() > n || !fp8_linear_same_input(op, x, &x_codes, {wkv, n}, {kv, n}, rows))
      for (const InsertKvStage& st : stages) linear_coded(x, x_codes, *st.wkv, st.kv);
  }
  if (!rows_to_rings_in_one_launch(stages, rows, d, p) || pos.dtype != DType::i32 ||
      slots.dtype != DType::i32 || pos.numel() < rows || slots.numel() < rows ||
      rows > std::numeric_limits<int32_t>::max()) {
    for (const InsertKvStage& st : stages) {
      kv_norm_rope_qdq(st.kv, st.kv_norm, p.eps, pos, p.rope_dim, p.theta, p.block, st.kv_n);
      ring_write(st.ring_kv, st.ring_pos, st.kv_n, slots, pos);
    }
    return;
  }
  cuda::KvRingStages k{};
  for (size_t i = 0; i < stages.size(); ++i) {
    k.kv[i] = stages[i].kv.data;
    k.norm[i] = stages[i].kv_norm.data;
    k.ring_kv[i] = stages[i].ring_kv.as<uint16_t>();
    k.ring_pos[i] = stages[i].ring_pos.as<int32_t>();
  }
  const Tensor& ring = stages.front().ring_kv;
  check(cuda::launch_kv_rows_to_rings(
            k, static_cast<int>(stages.size()), cuda::Elt::bf16, elt(stages.front().kv_norm, op, "kv_norm"),
            p.eps, pos.as<const int32_t>(), slots.as<const int32_t>(), rows, ring.dim(0), ring.dim(1), d,
            p.rope_dim, cuda::rope_freqs(p.rope_dim, p.theta), p.block, cur_),
        op);
}

}  // namespace dspark
