#include "lib/core/tensor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lib/core/error.hpp"

namespace dspark {

Tensor Tensor::rows(int64_t row0, int64_t n) const {
  const int64_t lead = shape.empty() ? 1 : shape[0];
  if (row0 < 0 || n < 0 || row0 + n > lead)
    fail("tensor rows [{}, {}) out of range {}", row0, row0 + n, shape_str(shape));
  Tensor v = *this;
  const int64_t row_elems = lead == 0 ? 0 : numel() / lead;
  v.data = static_cast<char*>(data) + static_cast<size_t>(row0 * row_elems) * dtype_size(dtype);
  v.shape[0] = n;
  return v;
}

Tensor Tensor::reshaped(Shape s) const {
  if (shape_numel(s) != numel()) fail("cannot view {} as {}", shape_str(shape), shape_str(s));
  Tensor v = *this;
  v.shape = std::move(s);
  return v;
}

Tensor Tensor::view(size_t offset, DType dt, Shape s) const {
  const size_t bytes = static_cast<size_t>(shape_numel(s)) * dtype_size(dt);
  if (offset > nbytes() || bytes > nbytes() - offset)
    fail("tensor view of {} {} at byte {} does not fit in {} bytes", dtype_name(dt), shape_str(s), offset,
         nbytes());
  Tensor v = *this;
  v.data = static_cast<char*>(data) + offset;
  v.dtype = dt;
  v.shape = std::move(s);
  return v;
}

std::string shape_str(const Shape& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

}  // namespace dspark
