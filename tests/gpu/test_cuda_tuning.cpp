// The CudaBackend's Tuning takes effect: weight_tiles and head_tiles leave out the tiles they turn off, pdl
// off launches without programmatic dependent launch (no programmatic edge in a captured step), and a kernel
// trace file is refused by builds that do not record the trace.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "kernels/cuda/kernel_trace.hpp"
#include "kernels/cuda/launch_policy.hpp"
#include "lib/core/error.hpp"
#include "lib/core/tuning.hpp"
#include "tests/gpu/cuda_op_harness.hpp"

namespace dspark {
namespace {

using CudaOps = test::CudaOps;

// A tileable bf16 [rows, cols] matrix (16-row tiles of 32-column chunks); its values do not matter here.
LinearWeight tileable(Backend& be, const char* name, int64_t rows = 32, int64_t cols = 64) {
  return dense_linear(name, be.alloc(DType::bf16, {rows, cols}));
}

TEST_F(CudaOps, TuningLeavesOutTheTilesItTurnsOff) {
  struct Case {
    Tuning tuning;
    bool experts, attention, head, markov;  // in tiles / with a tiled copy
  };
  const Case cases[] = {{Tuning{}, true, true, true, true},
                        {Tuning{.head_tiles = false}, true, true, false, true},
                        {Tuning{.weight_tiles = false}, false, false, false, false},
                        {Tuning{.weight_tiles = false, .head_tiles = false}, false, false, false, false}};
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c.tuning));
    CudaBackend be(0, c.tuning);
    EXPECT_EQ(be.tuning(), c.tuning);
    DrafterWeights w;
    w.stages.resize(1);
    StageWeights& st = w.stages[0];
    st.experts.push_back({tileable(be, "w1"), tileable(be, "w3"), tileable(be, "w2", 64, 32)});
    st.wo_a = tileable(be, "wo_a");
    w.head = tileable(be, "head");
    w.markov_head = be.alloc(DType::bf16, {32, 64});
    be.prepare_weights(w);
    for (const LinearWeight* m : {&st.experts[0].w1, &st.experts[0].w3, &st.experts[0].w2})
      EXPECT_EQ(m->format == WeightFormat::bf16_mma_tiles, c.experts) << m->name;
    EXPECT_EQ(!st.wo_a.tiles.empty(), c.attention);
    EXPECT_EQ(!w.head.tiles.empty(), c.head);
    EXPECT_EQ(w.head.format, WeightFormat::dense) << "the head keeps its row-major matrix either way";
    EXPECT_EQ(!w.markov_head_tiles.empty(), c.markov);
  }
}

// Programmatic edges in a recording of two fills on `be`'s stream (the stream order between two kernels
// launched with the programmatic attribute becomes one).
size_t programmatic_edges(CudaBackend& be) {
  const Tensor t = be.alloc(DType::i32, {1000});
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(be.stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  be.fill_i32(t, 1);
  be.fill_i32(t, 2);
  EXPECT_EQ(cudaStreamEndCapture(be.stream(), &graph), cudaSuccess);
  size_t n = 0;
  EXPECT_EQ(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  EXPECT_EQ(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n), cudaSuccess);
  (void)cudaGraphDestroy(graph);
  size_t programmatic = 0;
  for (const cudaGraphEdgeData& e : data) programmatic += e.type == cudaGraphDependencyTypeProgrammatic;
  return programmatic;
}

TEST_F(CudaOps, TuningPdlOffLaunchesWithoutProgrammaticDependentLaunch) {
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  // sm_90's launches need the GPU and kernels built for it (a compute_80 PTX build has them compiled out).
  const bool supported = major >= 9 && cuda::kernels_ptx_version() >= 90;
  // The policy is process-wide: the latest backend constructed sets it.
  EXPECT_EQ(cuda::programmatic_launch(), supported) << "on by default where the GPU has it";
  {
    CudaBackend off(0, Tuning{.pdl = false});
    EXPECT_FALSE(cuda::programmatic_launch());
    EXPECT_EQ(programmatic_edges(off), 0u);
  }
  CudaBackend on(0);
  EXPECT_EQ(cuda::programmatic_launch(), supported);
  if (supported) {
    EXPECT_GE(programmatic_edges(on), 1u);
  }
}

TEST_F(CudaOps, KernelTraceFileNeedsATraceBuild) {
  EXPECT_NO_THROW(gpu_->set_kernel_trace_file(""));
  const std::string file = ::testing::TempDir() + "dspark_kernel_trace_test";
  if (cuda::kernel_trace_built()) {
    EXPECT_NO_THROW(gpu_->set_kernel_trace_file(file));
    gpu_->set_kernel_trace_file("");
    return;
  }
  try {
    gpu_->set_kernel_trace_file(file);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("-DDSPARK_KERNEL_TRACE=ON"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dspark
