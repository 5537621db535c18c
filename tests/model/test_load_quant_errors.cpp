// A broken quantised checkpoint (copies of golden/tiny-v41-fp8 with one tensor edited) stops the load with an
// error that names the tensor and the file: NaN scale bytes, e4m3 NaN codes, a scale that does not fit its
// weight, fp4 where only fp8 may be, a governed linear stored otherwise.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/core/error.hpp"
#include "lib/core/numeric.hpp"
#include "lib/model/load_weights.hpp"
#include "tests/support/edited_checkpoint.hpp"
#include "tests/support/golden_case.hpp"
#include "tests/support/tiny_checkpoint.hpp"

namespace dspark {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

const fs::path kSource = test::golden_case_dir("tiny-v41-fp8") / "ckpt";

using test::load_error;

fs::path edited_copy(const std::string& name, const test::TensorEdit& edit) {
  return test::edited_checkpoint(kSource, "quant-" + name, edit);
}

class LoadQuantErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kSource / "config.json")) GTEST_SKIP() << "no golden case at " << kSource;
  }
};

TEST_F(LoadQuantErrors, TheUneditedCopyLoads) {
  EXPECT_EQ(load_error(edited_copy("ok", [](TensorSpec&, std::vector<uint8_t>&) { return true; })),
            "loaded without error");
}

TEST_F(LoadQuantErrors, ANanScaleByteIsRefused) {
  const fs::path dir = edited_copy("nan-scale", [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == "mtp.1.attn.wkv.scale") b[5] = 0xff;
    return true;
  });
  EXPECT_THAT(load_error(dir), AllOf(HasSubstr("'mtp.1.attn.wkv.scale'"), HasSubstr("model.safetensors"),
                                     HasSubstr("e8m0 NaN")));
}

TEST_F(LoadQuantErrors, AnE4m3NanCodeIsRefused) {
  for (uint8_t code : {uint8_t{0x7f}, uint8_t{0xff}}) {
    const fs::path dir = edited_copy("nan-code", [code](TensorSpec& s, std::vector<uint8_t>& b) {
      if (s.name == "mtp.0.attn.wq_a.weight") b[100] = code;
      return true;
    });
    EXPECT_THAT(load_error(dir), AllOf(HasSubstr("'mtp.0.attn.wq_a.weight'"), HasSubstr("e4m3 NaN code")));
  }
}

TEST_F(LoadQuantErrors, AScaleThatDoesNotFitItsWeightIsRefused) {
  const fs::path dir = edited_copy("scale-shape", [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == "mtp.0.attn.wkv.scale") {  // [4, 8] for a [128, 256] weight in 32 x 32 blocks
      s.shape = {4, 7};
      b.resize(28);
    }
    return true;
  });
  EXPECT_THAT(load_error(dir), AllOf(HasSubstr("'mtp.0.attn.wkv.scale'"), HasSubstr("[4, 7]"),
                                     HasSubstr("does not match its weight"), HasSubstr("[4, 8]")));
}

TEST_F(LoadQuantErrors, Fp4IsOnlyForRoutedExperts) {
  // The shared expert's w1 [512, 256] stored as packed e2m1 [512, 128] with per-32 scales [512, 8].
  const fs::path dir = edited_copy("fp4-shared", [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == "mtp.0.ffn.shared_experts.w1.weight") {
      s.dtype = DType::i8;
      s.shape = {512, 128};
      b.assign(512 * 128, 0x11);
    } else if (s.name == "mtp.0.ffn.shared_experts.w1.scale") {
      s.shape = {512, 8};
      b.assign(512 * 8, 127);
    }
    return true;
  });
  EXPECT_THAT(load_error(dir),
              AllOf(HasSubstr("'mtp.0.ffn.shared_experts.w1'"), HasSubstr("only for routed experts")));
}

TEST_F(LoadQuantErrors, AGovernedLinearStoredDenseIsRefused) {
  // config.json's dtype fp8 governs wkv: a dense bf16 wkv (no .scale) is an error naming it and the key.
  const fs::path dir = edited_copy("dense-wkv", [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == "mtp.2.attn.wkv.scale") return false;
    if (s.name == "mtp.2.attn.wkv.weight") {
      s.dtype = DType::bf16;
      b.assign(128 * 256 * 2, 0);
    }
    return true;
  });
  EXPECT_THAT(load_error(dir), AllOf(HasSubstr("'mtp.2.attn.wkv'"), HasSubstr("stored dense"),
                                     HasSubstr("config.json's dtype says fp8 block")));
}

TEST_F(LoadQuantErrors, ARoutedExpertInFp8WhereExpertDtypeSaysFp4IsRefused) {
  const fs::path dir = edited_copy("fp8-expert", [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == "mtp.1.ffn.experts.3.w2.weight") {  // [256, 512] as e4m3 codes, scales [8, 16]
      s.dtype = DType::f8_e4m3;
      s.shape = {256, 512};
      b.assign(256 * 512, 0x38);
    } else if (s.name == "mtp.1.ffn.experts.3.w2.scale") {
      s.shape = {8, 16};
      b.assign(8 * 16, 127);
    }
    return true;
  });
  EXPECT_THAT(load_error(dir), AllOf(HasSubstr("'mtp.1.ffn.experts.3.w2'"), HasSubstr("stored fp8 block"),
                                     HasSubstr("expert_dtype says fp4")));
}

}  // namespace
}  // namespace dspark
