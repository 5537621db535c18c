// The host interface end to end: a real `mpirun -np N dspark_worker` process serving a client over its socket
// and shared memory. Answers are checked against the drafter run in this process on the same inputs (tp = 1:
// the same bits; tp = 2: SPEC §5's rule), bad inputs against "nothing changed", and the liveness paths: a
// host that dies, a worker that dies, SIGTERM.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "client/dspark_client.hpp"
#include "comm/communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/model/drafter.hpp"
#include "lib/model/load_weights.hpp"
#include "tests/support/worker_process.hpp"

namespace dspark {
namespace {

constexpr int kRowValues = 3 * 256;  // tiny config: 3 taps of H = 256

std::string ring_name(const char* what) {
  return "/dspark-e2e-" + std::to_string(::getpid()) + "-" + what;
}

std::vector<uint16_t> rows(int64_t first, int64_t n, unsigned seed) {
  std::vector<uint16_t> v(static_cast<size_t>(n * kRowValues));
  for (int64_t p = 0; p < n; ++p) {
    std::mt19937 g(seed * 7919u + static_cast<unsigned>(first + p));
    std::normal_distribution<float> normal;
    for (int i = 0; i < kRowValues; ++i)
      v[static_cast<size_t>(p * kRowValues + i)] = float_to_bf16(normal(g));
  }
  return v;
}

// The same drafter in this process (tp = 1, CPU), for reference answers.
struct Reference {
  CpuBackend be;
  LocalCommunicator comm;
  std::unique_ptr<Drafter> drafter;
  explicit Reference(const LoadOptions& load = {}) {
    const Checkpoint ckpt(test::tiny_checkpoint());
    const ModelConfig cfg = load_model_config(ckpt.config_path());
    const ShardPlan plan = make_shard_plan(cfg, 0, 1);
    DrafterOptions o;
    o.slots = 4;
    o.max_batch = 4;
    o.max_model_len = 512;
    drafter =
        std::make_unique<Drafter>(cfg, load_drafter_weights(ckpt, cfg, plan, be, load), plan, be, comm, o);
  }
};

dspark_draft_request req(int32_t slot, int32_t token, int32_t pos, int32_t outputs = 0, int32_t low = -1) {
  return {slot, token, pos, low, outputs, 0, 0};
}

class WorkerHost : public ::testing::TestWithParam<int> {
 protected:
  int ranks() const { return GetParam(); }
};

TEST_P(WorkerHost, EveryOperationRoundTrips) {
  test::WorkerProcess worker(ranks(), ring_name("ops") + std::to_string(ranks()));
  Client c(worker.ring(), 60000);
  const dspark_model_info m = c.model();
  EXPECT_EQ(m.vocab_size, 1024u);
  EXPECT_EQ(m.hidden, 256u);
  EXPECT_EQ(m.taps, 3u);
  EXPECT_EQ(m.row_bytes, 1536u);
  EXPECT_EQ(m.block_size, 5u);
  EXPECT_EQ(m.window, 16u);
  EXPECT_EQ(m.slots, 4u);
  EXPECT_EQ(m.max_batch, 4u);
  EXPECT_EQ(m.max_context_rows, 64u);
  EXPECT_EQ(m.tp, static_cast<uint32_t>(ranks()));
  EXPECT_EQ(m.max_model_len, 512);
  EXPECT_EQ(m.weight_formats, 1u << DSPARK_FORMAT_DENSE);  // the tiny checkpoint is dense throughout
  EXPECT_EQ(m.head_format, static_cast<uint32_t>(DSPARK_FORMAT_DENSE));
  // The tiny preset's dspark_target_layer_ids and dspark_noise_token_id (its config.json).
  EXPECT_EQ(c.tapped_layers(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(c.noise_token(), 1000);
  EXPECT_EQ(c.health().state, static_cast<uint32_t>(DSPARK_SERVING));

  Reference ref;
  // Context in one call (slot 0) and through a combined step (slot 1), 100 rows: more than one message.
  const std::vector<uint16_t> r0 = rows(0, 100, 1), r1 = rows(0, 30, 2);
  c.context(0, 0, r0);
  ref.drafter->insert(0, 0, r0.data(), 100);
  ref.drafter->insert(1, 0, r1.data(), 30);
  const std::vector<dspark_draft_request> batch = {req(0, 17, 100), req(1, 900, 30, 3),
                                                   req(0, 4, 100, 5, 95)};
  const Context ctx{1, 0, 30, r1.data()};
  const DraftBatch got = c.step({}, std::span(&ctx, 1), batch);
  std::vector<DraftRequest> rb;
  for (const auto& r : batch) rb.push_back({r.slot, r.token, r.pos, r.low, r.outputs});
  const DraftResult want = ref.drafter->draft(rb);
  ASSERT_EQ(got.n, 3u);
  ASSERT_EQ(got.k, 5u);
  for (uint32_t b = 0; b < got.n; ++b) {
    for (uint32_t j = 0; j < got.k; ++j) {
      const size_t i = b * got.k + j;
      if (ranks() == 1) {  // the same code on the same inputs: the same bits
        EXPECT_EQ(got.ids[i], want.ids[i]) << b << "," << j;
        EXPECT_EQ(got.conf[i], want.conf[i]) << b << "," << j;
        EXPECT_EQ(got.margin[i], want.margin[i]) << b << "," << j;
        EXPECT_EQ(got.conf_logit[i], want.conf_logit[i]) << b << "," << j;
      } else {
        EXPECT_NEAR(got.conf[i], want.conf[i], 0.1) << b << "," << j;
      }
    }
  }
  // Draft without margins: zeros there, the same tokens.
  const DraftBatch nomargin = c.draft(std::span(batch).first(1), false);
  for (uint32_t j = 0; j < 5; ++j) {
    EXPECT_EQ(nomargin.margin[j], 0.0f);
    EXPECT_EQ(nomargin.ids[j], got.ids[j]);
  }
  // Reset: slot 0 drafts like a slot never written.
  const int32_t zero = 0;
  c.reset(std::span(&zero, 1));
  const DraftBatch empty = c.draft(std::vector{req(0, 17, 100), req(3, 17, 100)});
  for (uint32_t j = 0; j < 5; ++j) EXPECT_EQ(empty.conf[j], empty.conf[5 + j]) << j;
  // set_max_model_len lowers the limit: a position past it is refused, one inside still served.
  c.set_max_model_len(64);
  EXPECT_THROW(c.draft(std::vector{req(1, 3, 80)}), ClientError);
  EXPECT_NO_THROW(c.draft(std::vector{req(1, 3, 30)}));
  const dspark_stats s = c.stats();
  EXPECT_GE(s.steps, 5u);
  EXPECT_EQ(s.context_rows, 130u);
  EXPECT_GE(s.drafts, 6u);
  EXPECT_EQ(s.hosts_attached, 1u);
  EXPECT_GT(s.step_us_p50, 0.0);
  EXPECT_EQ(c.health().steps, s.steps);
}

// Sampled requests beside a greedy one through the ring: the draws and q of the in-process drafter (tp = 1:
// the same bits; tp = 2: the same draws outside near ties, SPEC §5), the asked distribution a probability
// vector holding q at each drafted token, and a replay of the same seeds drawing the same tokens.
TEST_P(WorkerHost, SampledDraftsAnswerTheirDrawQAndDistribution) {
  test::WorkerProcess worker(ranks(), ring_name("sampled") + std::to_string(ranks()));
  Client c(worker.ring(), 60000);
  EXPECT_EQ(c.max_distributions(), 1u);  // the config's default
  Reference ref;
  const std::vector<uint16_t> r0 = rows(0, 100, 1);
  c.context(0, 0, r0);
  ref.drafter->insert(0, 0, r0.data(), 100);
  const std::vector<dspark_draft_request> batch = {req(0, 17, 100), req(0, 17, 100), req(0, 4, 100, 3)};
  const std::vector<dspark_sampling> sampling = {
      {0.0f, 0, 0}, {0.8f, DSPARK_SAMPLE_DISTRIBUTION, 42}, {1.5f, 0, 0xfedcba9876543210ull}};
  const DraftBatch got = c.step_sampled({}, {}, batch, sampling);
  std::vector<DraftRequest> rb;
  for (size_t b = 0; b < batch.size(); ++b) {
    const auto& r = batch[b];
    DraftRequest d{r.slot, r.token, r.pos, r.low, r.outputs};
    d.temperature = sampling[b].temperature;
    d.distribution = sampling[b].flags != 0;
    d.seed = sampling[b].seed;
    rb.push_back(d);
  }
  const DraftResult want = ref.drafter->draft(rb);
  ASSERT_EQ(got.n, 3u);
  const uint32_t k = got.k, V = got.vocab;
  ASSERT_EQ(V, 1024u);
  ASSERT_EQ(got.distribution_rows, (std::vector<int32_t>{5, 6, 7, 8, 9}));  // request 1, positions 0 to 4
  ASSERT_EQ(got.distribution.size(), 5u * V);
  for (uint32_t b = 0; b < got.n; ++b)
    for (uint32_t j = 0; j < k; ++j) {
      const size_t i = b * k + j;
      if (ranks() == 1) {
        EXPECT_EQ(got.ids[i], want.ids[i]) << b << "," << j;
        EXPECT_EQ(got.q[i], want.q[i]) << b << "," << j;
      } else {
        EXPECT_NEAR(got.q[i], want.q[i], 1e-3) << b << "," << j;
      }
      if (b == 0) {
        EXPECT_EQ(got.q[i], 1.0f) << j;  // greedy
      }
      if (b == 2 && j >= 3) {
        EXPECT_EQ(got.q[i], 0.0f);  // past k'
      }
    }
  for (uint32_t r = 0; r < 5; ++r) {
    const float* row = got.distribution.data() + size_t{r} * V;
    double sum = 0;
    for (uint32_t v = 0; v < V; ++v) {
      ASSERT_GE(row[v], 0.0f);
      sum += row[v];
    }
    EXPECT_NEAR(sum, 1.0, 1e-5) << r;
    EXPECT_NEAR(row[got.ids[k + r]], got.q[k + r], 1e-6 * std::max(1.0f, got.q[k + r])) << r;
    if (ranks() == 1) {
      for (uint32_t v = 0; v < V; v += 61) EXPECT_EQ(row[v], want.distribution[size_t{r} * V + v]) << r;
    }
  }
  const DraftBatch again = c.step_sampled({}, {}, batch, sampling);
  EXPECT_EQ(again.ids, got.ids);
  EXPECT_EQ(again.q, got.q);
}

TEST_P(WorkerHost, BadInputsAnswerTheirStatusAndChangeNothing) {
  test::WorkerProcess worker(ranks(), ring_name("bad") + std::to_string(ranks()));
  Client c(worker.ring(), 60000);
  const std::vector<uint16_t> r = rows(0, 20, 3);
  c.context(2, 0, r);
  const std::vector<dspark_draft_request> probe = {req(2, 5, 20)};
  const DraftBatch before = c.draft(probe);
  auto status_of = [&](auto&& call) {
    try {
      call();
    } catch (const ClientError& e) {
      return e.status();
    }
    return DSPARK_OK;
  };
  const std::vector<uint16_t> one = rows(20, 1, 3);
  EXPECT_EQ(status_of([&] { c.draft(std::vector{req(4, 5, 20)}); }), DSPARK_INVALID_ARGUMENT);     // bad slot
  EXPECT_EQ(status_of([&] { c.draft(std::vector{req(2, 1024, 20)}); }), DSPARK_INVALID_ARGUMENT);  // token
  EXPECT_EQ(status_of([&] { c.draft(std::vector{req(2, 5, 512)}); }), DSPARK_INVALID_ARGUMENT);    // position
  EXPECT_EQ(status_of([&] { c.draft(std::vector{req(2, 5, 20, 6)}); }), DSPARK_INVALID_ARGUMENT);  // k' > k
  EXPECT_EQ(status_of([&] { c.draft(std::vector(5, req(2, 5, 20))); }), DSPARK_RESOURCE_EXHAUSTED);  // batch
  EXPECT_EQ(status_of([&] { c.context(2, 510, rows(510, 3, 3)); }), DSPARK_INVALID_ARGUMENT);  // past end
  // A step whose draft is bad is rejected whole: its context rows and resets are not applied either.
  const int32_t two = 2;
  const Context ctx{2, 20, 1, one.data()};
  EXPECT_EQ(status_of([&] { c.step(std::span(&two, 1), std::span(&ctx, 1), std::vector{req(2, 5, 21, 9)}); }),
            DSPARK_INVALID_ARGUMENT);
  const DraftBatch after = c.draft(probe);
  EXPECT_EQ(after.ids, before.ids);
  EXPECT_EQ(after.conf, before.conf);
  EXPECT_EQ(after.margin, before.margin);
  EXPECT_EQ(c.stats().rejected_messages, 6u);  // the batch over max_batch never left the client
}

INSTANTIATE_TEST_SUITE_P(Ranks, WorkerHost, ::testing::Values(1, 2));

TEST(WorkerHeadFp8, TheModelDescriptionReportsTheRequantisedHeadAndTheDraftsUseIt) {
  test::WorkerProcess worker(1, ring_name("head-fp8"), "weights:\n  head: fp8\n");
  Client c(worker.ring(), 60000);
  const dspark_model_info m = c.model();
  EXPECT_EQ(m.head_format, static_cast<uint32_t>(DSPARK_FORMAT_FP8_BLOCK));
  EXPECT_EQ(m.weight_formats, (1u << DSPARK_FORMAT_DENSE) | (1u << DSPARK_FORMAT_FP8_BLOCK));
  // The answers are those of this process's drafter loaded with the same option (tp = 1: the same bits).
  LoadOptions fp8;
  fp8.head_fp8 = true;
  Reference ref(fp8);
  const std::vector<uint16_t> r0 = rows(0, 40, 3);
  c.context(0, 0, r0);
  ref.drafter->insert(0, 0, r0.data(), 40);
  const std::vector<dspark_draft_request> batch = {req(0, 77, 40)};
  const DraftBatch got = c.draft(batch);
  const DraftResult want = ref.drafter->draft(std::vector<DraftRequest>{{0, 77, 40, -1, 0}});
  for (uint32_t j = 0; j < got.k; ++j) {
    EXPECT_EQ(got.ids[j], want.ids[j]) << j;
    EXPECT_EQ(got.margin[j], want.margin[j]) << j;
  }
}

TEST(WorkerLiveness, ALostHostsSlotsAreResetAndANewHostAttaches) {
  test::WorkerProcess worker(1, ring_name("lost"));
  { Client warmup(worker.ring(), 60000); }  // the worker serves before the child starts
  const pid_t child = fork();
  if (child == 0) {  // a host that writes context into slot 1 and dies without detaching
    try {
      Client c(worker.ring(), 10000);
      c.context(1, 0, rows(0, 12, 4));
      ::kill(::getpid(), SIGKILL);
    } catch (...) {
    }
    _exit(3);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child host did not reach its context send";
  // The kernel closed the dead host's socket: the worker ends its session at once and admits the next host.
  Client c(worker.ring(), 10000);
  const DraftBatch b = c.draft(std::vector{req(1, 9, 12), req(3, 9, 12)});
  for (uint32_t j = 0; j < 5; ++j) EXPECT_EQ(b.conf[j], b.conf[5 + j]) << "slot 1 was not reset";
  const dspark_stats s = c.stats();
  EXPECT_EQ(s.hosts_lost, 1u);
  EXPECT_EQ(s.hosts_attached, 3u);
}

TEST(WorkerLiveness, ASecondHostIsRefusedWhileTheFirstIsAlive) {
  test::WorkerProcess worker(1, ring_name("second"));
  Client first(worker.ring(), 60000);
  dspark_client* second = nullptr;
  EXPECT_EQ(dspark_attach(worker.ring().c_str(), 500, &second), DSPARK_UNAVAILABLE);
  EXPECT_EQ(second, nullptr);
  EXPECT_NE(std::string(dspark_last_error(nullptr)).find("attached"), std::string::npos)
      << dspark_last_error(nullptr);
  first.detach();
  Client third(worker.ring(), 10000);  // a clean detach ends the session at once
  EXPECT_EQ(third.health().state, static_cast<uint32_t>(DSPARK_SERVING));
}

TEST(WorkerLiveness, AWorkerThatDiesIsSeenAsUnavailable) {
  test::WorkerProcess worker(2, ring_name("dies"));
  Client c(worker.ring(), 60000);
  c.context(0, 0, rows(0, 8, 5));
  ASSERT_TRUE(worker.signal_ranks(SIGKILL));
  worker.wait_exit(std::chrono::seconds(10));
  c.set_timeout(20000);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    c.draft(std::vector{req(0, 1, 8)});
    ADD_FAILURE() << "answered after the worker died";
  } catch (const ClientError& e) {
    EXPECT_EQ(e.status(), DSPARK_UNAVAILABLE) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5))
      << "noticed only by the call timeout";
}

TEST(WorkerLiveness, SigtermDrainsTheStepInFlightAndEveryRankExitsZero) {
  test::WorkerProcess worker(2, ring_name("term"));
  Client c(worker.ring(), 60000);
  c.context(0, 0, rows(0, 40, 6));
  // A step in flight when the ranks get SIGTERM is still answered.
  std::thread host([&] {
    const DraftBatch b = c.draft(std::vector(4, req(0, 7, 40)));
    EXPECT_EQ(b.n, 4u);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_TRUE(worker.signal_ranks(SIGTERM));
  host.join();
  EXPECT_EQ(worker.wait_exit(std::chrono::seconds(20)), 0);
  try {
    c.health();
    ADD_FAILURE() << "a stopped worker answered";
  } catch (const ClientError& e) {
    EXPECT_EQ(e.status(), DSPARK_UNAVAILABLE);
  }
}

}  // namespace
}  // namespace dspark
