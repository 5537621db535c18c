// A typed, shaped view of a buffer owned by a backend (host memory on the CPU backend, device memory on
// CUDA). The model code passes Tensors between backend ops and never dereferences them itself.
#pragma once

#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "lib/core/dtype.hpp"

namespace dspark {

using Shape = std::vector<int64_t>;

inline int64_t shape_numel(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, [](int64_t a, int64_t b) { return a * b; });
}
std::string shape_str(const Shape& s);  // "[2, 5, 256]"

struct Tensor {
  DType dtype = DType::f32;
  Shape shape;
  void* data = nullptr;
  std::shared_ptr<void> owner;  // keeps the allocation alive; empty for views

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim(size_t i) const { return shape.at(i); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // Rows [row0, row0 + n) of the leading dimension, sharing the storage (valid for device memory too: only
  // the pointer moves).
  Tensor rows(int64_t row0, int64_t n) const;
  // The same bytes under another shape of equal element count.
  Tensor reshaped(Shape s) const;
  // A [dtype, shape] tensor at byte `offset` of this one's storage (it must fit inside), e.g. several small
  // inputs carved out of one buffer that a single copy fills.
  Tensor view(size_t offset, DType dtype, Shape shape) const;
};

}  // namespace dspark
