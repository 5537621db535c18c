// The golden case in the seed's EXL3 mix (shared/golden/tiny-v41-exl3: EXL3 head, main_proj, attention and
// experts, fp8 block wo_a) through the CUDA backend: its drafts agree with the CPU reference's on the same
// checkpoint (the rule of draft_compare.hpp), meet the README's rule (ids where the margins are clear, all
// of them here; confidences within 2e-2), and graph replays give the eager bits.
#include <gtest/gtest.h>

#include "tests/gpu/cuda_golden_fixture.hpp"
#include "tests/support/golden_exl3_rule.hpp"

namespace dspark {
namespace {

class CudaGoldenExl3 : public test::CudaGoldenCase {
 protected:
  CudaGoldenExl3() : CudaGoldenCase("tiny-v41-exl3") {}
};

TEST_F(CudaGoldenExl3, DraftsAgreeWithTheCpuReference) {
  // The README's bound for the later stages (stage 2's block_kv off by up to 7 % of max against another GEMM
  // order), which tests/model/test_golden_exl3.cpp holds the CPU to.
  expect_drafts_agree_with_the_cpu({.hidden_tol = 0.08});
}

TEST_F(CudaGoldenExl3, DraftsMeetTheGoldenRule) {
  test::expect_exl3_golden_rule(gpu_d_->draft(requests_), expected_);
}

TEST_F(CudaGoldenExl3, GraphReplaysEqualEagerDrafts) {
  expect_graph_replays_equal_eager();
}

}  // namespace
}  // namespace dspark
