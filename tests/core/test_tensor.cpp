// Tensor views: rows, reshaped and view move only the pointer and the shape, and refuse what does not fit.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "lib/core/error.hpp"
#include "lib/core/tensor.hpp"

namespace dspark {
namespace {

Tensor over(std::vector<int32_t>& buf, Shape shape) {
  Tensor t;
  t.dtype = DType::i32;
  t.shape = std::move(shape);
  t.data = buf.data();
  return t;
}

TEST(Tensor, RowsStartAtTheRowsFirstElement) {
  std::vector<int32_t> buf(12);
  const Tensor t = over(buf, {4, 3});
  const Tensor r = t.rows(1, 2);
  EXPECT_EQ(r.data, buf.data() + 3);
  EXPECT_EQ(r.shape, (Shape{2, 3}));
  EXPECT_THROW(t.rows(3, 2), Error);
}

TEST(Tensor, ViewReinterpretsBytesAtAnOffset) {
  std::vector<int32_t> buf(10);
  const Tensor t = over(buf, {10});
  const Tensor f = t.view(8, DType::f32, {2, 4});  // bytes 8 .. 40: elements 2 .. 9
  EXPECT_EQ(f.data, buf.data() + 2);
  EXPECT_EQ(f.dtype, DType::f32);
  EXPECT_EQ(f.numel(), 8);
  const Tensor h = t.view(36, DType::bf16, {2});  // the last 4 bytes as two bf16
  EXPECT_EQ(static_cast<char*>(h.data), reinterpret_cast<char*>(buf.data()) + 36);
  EXPECT_THROW(t.view(12, DType::f32, {8}), Error);  // 12 + 32 > 40
  EXPECT_THROW(t.view(41, DType::i32, {0}), Error);  // offset past the end
  EXPECT_NO_THROW(t.view(40, DType::i32, {0}));      // empty, at the very end
}

}  // namespace
}  // namespace dspark
