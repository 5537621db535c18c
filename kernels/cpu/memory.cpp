// Host memory for the CPU backend.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/element.hpp"

namespace dspark {

Tensor CpuBackend::alloc(DType dtype, const Shape& shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  // 64-byte aligned, zero-filled: a fresh buffer never holds stale values.
  const size_t bytes = std::max<size_t>(64, (t.nbytes() + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, bytes);
  if (!p) fail("cpu backend: out of memory allocating {} bytes", bytes);
  std::memset(p, 0, bytes);
  t.owner = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.data = p;
  return t;
}

void CpuBackend::upload(const Tensor& dst, const void* src) {
  std::memcpy(dst.data, src, dst.nbytes());
}
void CpuBackend::download(void* dst, const Tensor& src) {
  std::memcpy(dst, src.data, src.nbytes());
}

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  if (src.nbytes() != dst.nbytes()) fail("copy: {} bytes into {}", src.nbytes(), dst.nbytes());
  std::memcpy(dst.data, src.data, src.nbytes());
}

void CpuBackend::gather_host_rows(const Tensor& sources, const Tensor& dst) {
  cpu::expect_dtype(sources, DType::i64, "gather_host_rows sources");
  const int64_t N = sources.numel();
  if (dst.shape.empty() || dst.dim(0) != N)
    fail("gather_host_rows: {} sources for rows {}", N, shape_str(dst.shape));
  const size_t row_bytes = N > 0 ? dst.nbytes() / static_cast<size_t>(N) : 0;
  const int64_t* src = sources.as<const int64_t>();
  char* out = static_cast<char*>(dst.data);
  for (int64_t r = 0; r < N; ++r)
    if (src[r] != 0)
      std::memcpy(out + static_cast<size_t>(r) * row_bytes, reinterpret_cast<const void*>(src[r]), row_bytes);
}

void CpuBackend::wait_for_word(const Tensor& word, int32_t value) {
  cpu::expect_dtype(word, DType::i32, "wait_for_word word");
  if (word.numel() != 1) fail("wait_for_word: one word expected, got {}", word.numel());
  // The ops ran as they were issued: the word is written or never will be.
  const int32_t found = word.as<int32_t>()[0];
  if (found != value)
    fail("wait_for_word: the sequence finished without writing {} (the word holds {})", value, found);
}

void CpuBackend::fill_i32(const Tensor& t, int32_t value) {
  cpu::expect_dtype(t, DType::i32, "fill_i32 target");
  std::fill_n(t.as<int32_t>(), t.numel(), value);
}

void CpuBackend::zero(const Tensor& t) {
  std::memset(t.data, 0, t.nbytes());
}

void CpuBackend::convert(const Tensor& src, const Tensor& dst) {
  if (src.numel() != dst.numel()) fail("convert: {} elements into {}", src.numel(), dst.numel());
  for (int64_t i = 0; i < src.numel(); ++i) cpu::store(dst, i, cpu::load(src, i));
}

}  // namespace dspark
