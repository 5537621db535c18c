// The CudaBackend ops that run memory.cu's kernels: copy (a kernel, also to and from mapped host memory),
// fill_i32, convert and embed.
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/memory.hpp"

namespace dspark {

using cuda::check;
using cuda::elt;

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  if (src.nbytes() != dst.nbytes()) fail("cuda copy: {} bytes into {}", src.nbytes(), dst.nbytes());
  if (src.nbytes() == 0) return;
  cuda::expect_data(src, "copy", "src");
  cuda::expect_data(dst, "copy", "dst");
  cudaPointerAttributes dst_attr{};
  check(cudaPointerGetAttributes(&dst_attr, dst.data), "copy");
  const bool into_host = dst_attr.type == cudaMemoryTypeHost;
  check(cuda::launch_copy(src.data, dst.data, static_cast<int64_t>(src.nbytes()), into_host, cur_), "copy");
}

void CudaBackend::gather_host_rows(const Tensor& sources, const Tensor& dst) {
  const char* op = "gather_host_rows";
  cuda::expect_dtype(sources, DType::i64, op, "sources");
  const int64_t N = sources.numel();
  if (dst.shape.empty() || dst.dim(0) != N)
    fail("cuda {}: {} sources for rows {}", op, N, shape_str(dst.shape));
  if (N == 0 || dst.nbytes() == 0) return;
  cuda::expect_data(dst, op, "dst");
  check(cuda::launch_gather_rows(sources.as<const uint64_t>(), dst.data, N,
                                 static_cast<int64_t>(dst.nbytes()) / N, cur_),
        op);
}

void CudaBackend::fill_i32(const Tensor& t, int32_t value) {
  cuda::expect_dtype(t, DType::i32, "fill_i32", "target");
  check(cuda::launch_fill_i32(t.as<int32_t>(), t.numel(), value, cur_), "fill_i32");
}

void CudaBackend::convert(const Tensor& src, const Tensor& dst) {
  if (src.numel() != dst.numel()) fail("cuda convert: {} elements into {}", src.numel(), dst.numel());
  check(cuda::launch_convert(src.data, cuda::elt(src, "convert", "src"), dst.data,
                             cuda::elt(dst, "convert", "dst"), src.numel(), cur_),
        "convert");
}

void CudaBackend::embed(const Tensor& table, const Tensor& ids, const Tensor& out) {
  const char* op = "embed";
  cuda::expect_rank(table, 2, op, "table");
  cuda::expect_dtype(ids, DType::i32, op, "ids");
  const int64_t V = table.dim(0), H = table.dim(1), T = ids.numel();
  cuda::expect_numel(out, T * H, op, "out");
  check(cuda::launch_embed(table.data, elt(table, op, "table"), V, H, ids.as<const int32_t>(), T, out.data,
                           elt(out, op, "out"), cur_),
        op);
}

}  // namespace dspark
