// A NaN or an infinity in any float weight of a checkpoint fails the load, naming the tensor, the file and
// the first bad element; the largest finite values load.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "lib/core/numeric.hpp"
#include "tests/support/edited_checkpoint.hpp"
#include "tests/support/golden.hpp"
#include "tests/support/tiny_checkpoint.hpp"

namespace dspark {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// Element i of a bf16 / f32 tensor's bytes set to `bits`.
void put16(std::vector<uint8_t>& b, size_t i, uint16_t bits) {
  std::memcpy(b.data() + 2 * i, &bits, 2);
}
void put32(std::vector<uint8_t>& b, size_t i, uint32_t bits) {
  std::memcpy(b.data() + 4 * i, &bits, 4);
}

fs::path edited(const std::string& name, const test::TensorEdit& edit) {
  return test::edited_checkpoint(test::tiny_checkpoint(), name, edit);
}

TEST(LoadNonFinite, ANanAndAnInfInABf16WeightFailNamingTheTensorAndTheFirst) {
  const fs::path dir = edited("nan-inf", [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == "mtp.1.ffn.experts.3.w2.weight") {
      EXPECT_EQ(s.dtype, DType::bf16);
      put16(b, 1234, 0x7f80);  // +Inf
      put16(b, 5000, 0x7fc0);  // NaN
    }
    return true;
  });
  EXPECT_THAT(test::load_error(dir),
              AllOf(HasSubstr("tensor 'mtp.1.ffn.experts.3.w2.weight'"), HasSubstr("model.safetensors"),
                    HasSubstr("element 1234 of this rank's part is not finite (bf16 bits 0x7f80")));
}

TEST(LoadNonFinite, ANanAloneIsNamedAtItsElement) {
  const fs::path dir = edited("nan", [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == "embed.weight") put16(b, 777, 0xffc1);  // a negative NaN with payload
    return true;
  });
  EXPECT_THAT(test::load_error(dir),
              AllOf(HasSubstr("tensor 'embed.weight'"), HasSubstr("element 777"), HasSubstr("bits 0xffc1")));
}

TEST(LoadNonFinite, AnInfInAnExl3ScaleVectorIsRefused) {
  DSPARK_SKIP_WITHOUT_GOLDEN_CASE("tiny-v41-exl3");
  // An EXL3 weight's svh (F16 [out]) scales every output: an infinity there is refused like a weight's.
  const fs::path dir = test::edited_checkpoint(DSPARK_SHARED_DIR "/golden/tiny-v41-exl3/ckpt", "exl3-svh-inf",
                                               [](TensorSpec& s, std::vector<uint8_t>& b) {
                                                 if (s.name == "mtp.0.attn.wq_b.svh") {
                                                   EXPECT_EQ(s.dtype, DType::f16);
                                                   put16(b, 42, 0xfc00);  // -Inf
                                                 }
                                                 return true;
                                               });
  EXPECT_THAT(test::load_error(dir), AllOf(HasSubstr("tensor 'mtp.0.attn.wq_b.svh'"),
                                           HasSubstr("element 42 of this rank's part is not finite (f16 bits "
                                                     "0xfc00")));
}

TEST(LoadNonFinite, AnInfInAnF32TensorIsRefused) {
  const fs::path dir = edited("f32-inf", [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == "mtp.2.attn.attn_sink") {
      EXPECT_EQ(s.dtype, DType::f32);
      put32(b, 3, 0xff800000u);  // -Inf
    }
    return true;
  });
  EXPECT_THAT(test::load_error(dir), AllOf(HasSubstr("tensor 'mtp.2.attn.attn_sink'"),
                                           HasSubstr("element 3 of this rank's part is not finite (f32 bits "
                                                     "0xff800000")));
}

TEST(LoadNonFinite, TheLargestFiniteValuesLoad) {
  const fs::path dir = edited("largest", [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == "mtp.0.attn.wq_a.weight") {
      put16(b, 0, 0x7f7f);  // +3.39e38, the largest finite bf16
      put16(b, 1, 0xff7f);  // and its negative
      EXPECT_EQ(bf16_to_float(0x7f7f), 3.3895313892515355e38f);
    }
    if (s.name == "mtp.0.attn.attn_sink") put32(b, 0, 0x7f7fffffu);  // FLT_MAX
    return true;
  });
  EXPECT_EQ(test::load_error(dir), "loaded without error");
}

}  // namespace
}  // namespace dspark
