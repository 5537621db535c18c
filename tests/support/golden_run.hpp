// A golden case (tests/support/golden_case.hpp) drafted on the CPU backend at a communicator's rank and size:
// its checkpoint loaded (this rank's shard), the rows of both slots inserted, the requests drafted, the
// traced tensors kept. Shared by the golden tests of every weight format, at tp = 1 and under mpirun.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/config/model_config.hpp"
#include "lib/model/drafter.hpp"
#include "lib/model/load_weights.hpp"
#include "tests/support/golden_case.hpp"
#include "tests/support/tensor_host.hpp"

namespace dspark::test {

struct GoldenRun {
  ModelConfig cfg;
  ShardPlan plan;
  DrafterWeights weights;
  std::unique_ptr<Drafter> drafter;
  DraftResult result;
  nlohmann::json expected;
  std::map<std::string, std::vector<float>>
      trace;  // the traced tensors `keep` accepted (every one without it)
};

inline void run_golden(const std::filesystem::path& dir, Backend& backend, Communicator& comm, GoldenRun& out,
                       const std::function<bool(const std::string&)>& keep = {}) {
  const Checkpoint ckpt(dir / "ckpt");
  out.cfg = load_model_config(ckpt.config_path());
  out.plan = make_shard_plan(out.cfg, comm.rank(), comm.size());
  DrafterOptions opt;
  opt.slots = 2;
  opt.max_batch = 4;
  out.weights = load_drafter_weights(ckpt, out.cfg, out.plan, backend);
  out.drafter = std::make_unique<Drafter>(out.cfg, out.weights, out.plan, backend, comm, opt);
  insert_golden_rows(*out.drafter, 2, dir);
  out.drafter->set_trace([&out, &backend, keep](const std::string& name, const Tensor& t) {
    if (!keep || keep(name)) out.trace[name] = to_floats(backend, t);
  });
  out.result = out.drafter->draft(golden_requests(dir));
  out.expected = golden_expected(dir);
}

// Every rank's ids and confidences are rank 0's, bit for bit.
inline void expect_every_rank_answers_alike(Communicator& comm, const DraftResult& r) {
  const size_t n = r.ids.size();
  std::vector<int32_t> ids(n * static_cast<size_t>(comm.size()));
  std::vector<float> conf(ids.size()), margin(ids.size());
  comm.all_gather(r.ids.data(), ids.data(), n * sizeof(int32_t));
  comm.all_gather(r.conf.data(), conf.data(), n * sizeof(float));
  comm.all_gather(r.margin.data(), margin.data(), n * sizeof(float));
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(ids[i], r.ids[i % n]) << i;
    EXPECT_EQ(conf[i], r.conf[i % n]) << i;
    EXPECT_EQ(margin[i], r.margin[i % n]) << i;
  }
}

}  // namespace dspark::test
