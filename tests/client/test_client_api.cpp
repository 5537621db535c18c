// The C API against an in-process fake worker: attach, the model, draft round trips, steps, status
// pass-through.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <thread>
#include <utility>

#include "client/dspark_client.h"
#include "fake_worker.hpp"
#include "test_util.hpp"

namespace dspark::test {
namespace {

using namespace std::chrono_literals;

TEST(ClientApi, AttachDescribesTheModel) {
  const std::string name = unique_ring_name();
  FakeWorker w(name);
  Attached a(name, 5000);
  ASSERT_EQ(a.status, DSPARK_OK) << dspark_last_error(nullptr);
  EXPECT_EQ(w.host_pid(), getpid());
  EXPECT_EQ(w.attaches(), 1u);
  dspark_model_info m{};
  ASSERT_EQ(dspark_model(a.c, &m), DSPARK_OK);
  const host::ModelDescription f = fake_model();
  EXPECT_EQ(m.vocab_size, f.vocab_size);
  EXPECT_EQ(m.row_bytes, f.row_bytes);
  EXPECT_EQ(m.block_size, f.block_size);
  EXPECT_EQ(m.max_context_rows, f.max_context_rows);
  EXPECT_EQ(m.max_model_len, f.max_model_len);
  EXPECT_EQ(m.weight_formats, (1u << DSPARK_FORMAT_DENSE) | (1u << DSPARK_FORMAT_FP4));
  EXPECT_EQ(m.head_format, static_cast<uint32_t>(DSPARK_FORMAT_FP8_BLOCK));
  // The fake's taps (fake_taps): layers 7, 9, 8 in row order, noise token 998; a capacity of 2 gets the
  // first two and still the whole count.
  int32_t ids[4] = {-5, -5, -5, -5};
  uint32_t taps = 0;
  int32_t noise = 0;
  ASSERT_EQ(dspark_model_taps(a.c, ids, 4, &taps, &noise), DSPARK_OK) << dspark_last_error(a.c);
  EXPECT_EQ(taps, 3u);
  EXPECT_EQ(noise, 998);
  EXPECT_THAT(ids, ::testing::ElementsAre(7, 9, 8, -5));
  int32_t two[2] = {0, 0};
  ASSERT_EQ(dspark_model_taps(a.c, two, 2, &taps, nullptr), DSPARK_OK);
  EXPECT_EQ(taps, 3u);
  EXPECT_THAT(two, ::testing::ElementsAre(7, 9));
  EXPECT_EQ(dspark_model_taps(a.c, nullptr, 2, &taps, nullptr), DSPARK_INVALID_ARGUMENT);
  EXPECT_EQ(dspark_model_taps(nullptr, nullptr, 0, &taps, nullptr), DSPARK_INVALID_ARGUMENT);
  dspark_health h{};
  ASSERT_EQ(dspark_health_get(a.c, &h), DSPARK_OK) << dspark_last_error(a.c);
  EXPECT_EQ(h.state, DSPARK_SERVING);
  EXPECT_EQ(h.tp, 1u);
}

TEST(ClientApi, AttachRefusesAnotherProtocolVersion) {
  const std::string name = unique_ring_name();
  FakeOptions o;
  o.answer_version = host::kProtocolVersion + 1;
  FakeWorker w(name, o);
  dspark_client* c = nullptr;
  EXPECT_EQ(dspark_attach(name.c_str(), 5000, &c), DSPARK_INVALID_ARGUMENT);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(dspark_last_error(nullptr)).find("protocol version"), std::string::npos)
      << dspark_last_error(nullptr);
  EXPECT_TRUE(eventually([&] { return w.host_pid() == 0; }));  // released: the next host may attach
}

TEST(ClientApi, AttachPassesTheWorkersRefusal) {
  const std::string name = unique_ring_name();
  FakeOptions o;
  o.attach_status = Status::invalid_argument;  // what the real worker answers a wrong version with
  FakeWorker w(name, o);
  dspark_client* c = nullptr;
  EXPECT_EQ(dspark_attach(name.c_str(), 5000, &c), DSPARK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dspark_last_error(nullptr)).find("refuses"), std::string::npos);
  EXPECT_TRUE(eventually([&] { return w.host_pid() == 0; }));
}

TEST(ClientApi, AttachWaitsForServing) {
  const std::string name = unique_ring_name();
  FakeOptions o;
  o.initial_state = host::WorkerState::starting;
  FakeWorker w(name, o);
  std::thread later([&] {
    std::this_thread::sleep_for(300ms);
    w.set_state(host::WorkerState::serving);
  });
  const auto t0 = std::chrono::steady_clock::now();
  Attached a(name, 5000);
  later.join();
  ASSERT_EQ(a.status, DSPARK_OK) << dspark_last_error(nullptr);
  EXPECT_GE(seconds_since(t0), 0.25);
}

TEST(ClientApi, AttachToNothingTimesOut) {
  const std::string name = unique_ring_name();
  dspark_client* c = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(dspark_attach(name.c_str(), 200, &c), DSPARK_UNAVAILABLE);
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_NE(std::string(dspark_last_error(nullptr)).find(name), std::string::npos)
      << dspark_last_error(nullptr);
}

TEST(ClientApi, DraftRoundTrip) {
  const std::string name = unique_ring_name();
  FakeOptions o;
  o.stale_answers = true;  // every answer is preceded by one with a wrong id: the client must skip those
  FakeWorker w(name, o);
  Attached a(name, 5000);
  ASSERT_EQ(a.status, DSPARK_OK) << dspark_last_error(nullptr);
  const host::ModelDescription m = fake_model();
  const dspark_draft_request reqs[3] = {
      {0, 17, 40, -1, 0, 0, 0}, {3, 999, 7, 2, 2, 0, 0}, {7, 0, 0, -1, 1, 0, 0}};
  for (int margins : {1, 0}) {
    std::vector<int32_t> ids(3 * m.block_size, -1);
    std::vector<float> conf(ids.size(), -1), logit(ids.size(), -1), margin(ids.size(), -1);
    ASSERT_EQ(dspark_draft(a.c, reqs, 3, margins, {ids.data(), conf.data(), logit.data(), margin.data()}),
              DSPARK_OK)
        << dspark_last_error(a.c);
    for (int b = 0; b < 3; ++b)
      for (uint32_t j = 0; j < m.block_size; ++j) {
        const DraftRequest r{reqs[b].slot, reqs[b].token, reqs[b].pos, reqs[b].low, reqs[b].outputs};
        int32_t id = 0;
        float c = 0, l = 0, g = 0;
        fake_draft(m, r, margins != 0, j, id, c, l, g);
        const size_t i = static_cast<size_t>(b) * m.block_size + j;
        EXPECT_EQ(ids[i], id) << b << "," << j;
        EXPECT_EQ(conf[i], c);
        EXPECT_EQ(logit[i], l);
        EXPECT_EQ(margin[i], g);
      }
  }
  // NULL outputs are skipped.
  EXPECT_EQ(dspark_draft(a.c, reqs, 1, 1, {nullptr, nullptr, nullptr, nullptr}), DSPARK_OK);
}

// Sampled requests beside a greedy one: q per output, and the whole distributions of the one request that
// asked, in request then position order (the fake's values: fake_q, fake_distribution).
TEST(ClientApi, SampledStepsAnswerQAndTheAskedDistributions) {
  const std::string name = unique_ring_name();
  FakeWorker w(name);
  Attached a(name, 5000);
  ASSERT_EQ(a.status, DSPARK_OK) << dspark_last_error(nullptr);
  uint32_t max_distributions = 0;
  float max_temperature = 0;
  ASSERT_EQ(dspark_sampling_limits(a.c, &max_distributions, &max_temperature), DSPARK_OK);
  EXPECT_EQ(max_distributions, 2u);
  EXPECT_EQ(max_temperature, 100.0f);
  const host::ModelDescription m = fake_model();
  const uint32_t k = m.block_size, V = m.vocab_size;
  const dspark_draft_request reqs[3] = {
      {0, 17, 40, -1, 0, 0, 0}, {3, 999, 7, 2, 2, 0, 0}, {7, 0, 0, -1, 0, 0, 0}};
  const dspark_sampling sampling[3] = {{0.0f, 0, 0}, {0.7f, DSPARK_SAMPLE_DISTRIBUTION, 11}, {1.5f, 0, 5}};
  std::vector<int32_t> ids(3 * k, -1);
  std::vector<float> q(3 * k, -1), dist(2 * V, -1);
  std::vector<int32_t> rows(2, -1);
  uint32_t got = 99;
  ASSERT_EQ(dspark_step_sampled(a.c, nullptr, 0, nullptr, 0, reqs, sampling, 3, 0,
                                {ids.data(), nullptr, nullptr, nullptr},
                                {q.data(), dist.data(), rows.data(), 2, &got}),
            DSPARK_OK)
      << dspark_last_error(a.c);
  std::vector<DraftRequest> want;
  for (int b = 0; b < 3; ++b) {
    DraftRequest r{reqs[b].slot, reqs[b].token, reqs[b].pos, reqs[b].low, reqs[b].outputs};
    r.temperature = sampling[b].temperature;
    r.distribution = sampling[b].flags != 0;
    r.seed = sampling[b].seed;
    want.push_back(r);
  }
  EXPECT_EQ(q[0], 1.0f);          // greedy
  EXPECT_EQ(q[k + 0], 1.0f / 2);  // sampled, j = 0
  EXPECT_EQ(q[k + 1], 1.0f / 3);
  EXPECT_EQ(q[k + 2], 0.0f);  // past k' = 2
  EXPECT_EQ(q[2 * k + 4], 1.0f / 6);
  for (int b = 0; b < 3; ++b)
    for (uint32_t j = 0; j < k; ++j) EXPECT_EQ(q[b * k + j], fake_q(m, want[b], j)) << b << "," << j;
  ASSERT_EQ(got, 2u);
  EXPECT_THAT(rows, ::testing::ElementsAre(int32_t(k), int32_t(k + 1)));  // request 1, positions 0 and 1
  for (uint32_t r = 0; r < 2; ++r)
    for (uint32_t v = 0; v < V; v += 97)
      EXPECT_EQ(dist[r * V + v], fake_distribution(m, want[1], r, static_cast<int32_t>(v))) << r << "," << v;
  // Room for one row: the step fails naming both counts, the drafts still written.
  std::fill(ids.begin(), ids.end(), -1);
  EXPECT_EQ(dspark_step_sampled(a.c, nullptr, 0, nullptr, 0, reqs, sampling, 3, 0,
                                {ids.data(), nullptr, nullptr, nullptr},
                                {q.data(), dist.data(), rows.data(), 1, &got}),
            DSPARK_INVALID_ARGUMENT);
  EXPECT_THAT(dspark_last_error(a.c),
              ::testing::HasSubstr("holds 2 distribution rows; the output has room for 1"));
  EXPECT_EQ(got, 2u);
  EXPECT_NE(ids[0], -1);
  // Checked before anything is sent: a distribution of a greedy draft, a temperature past the limit, more
  // distributions than the worker serves, unknown flags.
  const auto refused = [&](std::array<dspark_sampling, 3> s) {
    const size_t steps = w.steps().size();
    const dspark_status st = dspark_step_sampled(a.c, nullptr, 0, nullptr, 0, reqs, s.data(), 3, 0,
                                                 {ids.data(), nullptr, nullptr, nullptr}, {});
    EXPECT_EQ(w.steps().size(), steps);
    return std::make_pair(st, std::string(dspark_last_error(a.c)));
  };
  EXPECT_THAT(refused({{{0.0f, DSPARK_SAMPLE_DISTRIBUTION, 0}, {}, {}}}).second,
              ::testing::HasSubstr("request 0: the whole distribution needs a temperature > 0"));
  EXPECT_THAT(refused({{{}, {}, {101.0f, 0, 0}}}).second,
              ::testing::HasSubstr("request 2: temperature 101 is above 100"));
  const auto three = refused({{{1.0f, DSPARK_SAMPLE_DISTRIBUTION, 0},
                               {1.0f, DSPARK_SAMPLE_DISTRIBUTION, 0},
                               {1.0f, DSPARK_SAMPLE_DISTRIBUTION, 0}}});
  EXPECT_EQ(three.first, DSPARK_RESOURCE_EXHAUSTED);
  EXPECT_THAT(three.second,
              ::testing::HasSubstr("3 requests ask for the whole distribution, over max_distributions 2"));
  EXPECT_THAT(refused({{{1.0f, 4, 0}, {}, {}}}).second, ::testing::HasSubstr("unknown sampling flags 0x4"));
  // Without sampling every request is greedy: q is 1 up to k'.
  ASSERT_EQ(
      dspark_step_sampled(a.c, nullptr, 0, nullptr, 0, reqs, nullptr, 3, 0,
                          {ids.data(), nullptr, nullptr, nullptr}, {q.data(), nullptr, nullptr, 0, &got}),
      DSPARK_OK)
      << dspark_last_error(a.c);
  EXPECT_EQ(got, 0u);
  EXPECT_EQ(q[k + 1], 1.0f);
  EXPECT_EQ(q[k + 2], 0.0f);
}

TEST(ClientApi, StepCarriesResetsContextAndDraftsInOneMessage) {
  const std::string name = unique_ring_name();
  FakeWorker w(name);
  Attached a(name, 5000);
  ASSERT_EQ(a.status, DSPARK_OK);
  const uint32_t rv = fake_model().row_bytes / 2;
  const auto r0 = make_rows(1, 0, 5, rv), r1 = make_rows(2, 10, 3, rv);
  const int32_t resets[2] = {4, 5};
  const dspark_context_block ctx[2] = {{1, 0, 5, r0.data()}, {2, 10, 3, r1.data()}};
  const dspark_draft_request req{1, 5, 5, -1, 0, 0, 0};
  std::vector<int32_t> ids(5);
  ASSERT_EQ(dspark_step(a.c, resets, 2, ctx, 2, &req, 1, 1, {ids.data(), nullptr, nullptr, nullptr}),
            DSPARK_OK)
      << dspark_last_error(a.c);
  const auto steps = w.steps();
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].resets, std::vector<int32_t>({4, 5}));
  ASSERT_EQ(steps[0].contexts.size(), 2u);
  EXPECT_EQ(steps[0].contexts[1].first_pos, 10);
  std::vector<uint16_t> all(r0);
  all.insert(all.end(), r1.begin(), r1.end());
  EXPECT_EQ(steps[0].rows, all);
  EXPECT_EQ(steps[0].drafts, 1u);
  dspark_stats s{};
  ASSERT_EQ(dspark_stats_get(a.c, &s), DSPARK_OK);
  EXPECT_EQ(s.steps, 1u);
  EXPECT_EQ(s.context_rows, 8u);
  EXPECT_EQ(s.resets, 2u);
  EXPECT_EQ(s.step_us_max, 3.5);
  // Version 6's part, as the fake worker fills it.
  dspark_serving_stats m{};
  dspark_stats again{};
  ASSERT_EQ(dspark_serving_stats_get(a.c, &again, &m), DSPARK_OK);
  EXPECT_EQ(again.context_rows, 8u);
  EXPECT_EQ(m.acceptance_reports, 3u);
  EXPECT_EQ(m.accepted_tokens, 7u);
  EXPECT_EQ(m.markov_lookups, 20u);
  EXPECT_EQ(m.markov_hits, 11u);
  ASSERT_EQ(m.hot_uncached, 2u);
  EXPECT_EQ(m.hot_tokens[0], 42);
  EXPECT_EQ(m.hot_seen[0], 9u);
  EXPECT_EQ(m.hot_tokens[1], 7);
  EXPECT_EQ(m.hot_seen[1], 4u);
  EXPECT_EQ(m.hot_tokens[2], 0);
  EXPECT_EQ(dspark_serving_stats_get(a.c, nullptr, nullptr), DSPARK_OK) << "both parts may be skipped";
}

TEST(ClientApi, LargeContextIsSplitIntoSeveralMessages) {
  const std::string name = unique_ring_name();
  FakeWorker w(name);
  Attached a(name, 5000);
  ASSERT_EQ(a.status, DSPARK_OK);
  const uint32_t rv = fake_model().row_bytes / 2;  // max_context_rows = 16 per message
  const auto r0 = make_rows(0, 0, 30, rv), r1 = make_rows(1, 100, 10, rv);
  const int32_t reset = 6;
  const dspark_context_block ctx[2] = {{0, 0, 30, r0.data()}, {1, 100, 10, r1.data()}};
  const dspark_draft_request reqs[2] = {{0, 1, 30, -1, 0, 0, 0}, {1, 2, 110, -1, 0, 0, 0}};
  std::vector<int32_t> ids(10);
  ASSERT_EQ(dspark_step(a.c, &reset, 1, ctx, 2, reqs, 2, 1, {ids.data(), nullptr, nullptr, nullptr}),
            DSPARK_OK)
      << dspark_last_error(a.c);
  const auto steps = w.steps();
  ASSERT_EQ(steps.size(), 3u);  // 40 rows: 16 + 16 + 8
  EXPECT_EQ(steps[0].resets, std::vector<int32_t>({6}));
  EXPECT_TRUE(steps[1].resets.empty());
  EXPECT_EQ(steps[0].drafts + steps[1].drafts, 0u);  // context-only first
  EXPECT_EQ(steps[2].drafts, 2u);                    // the last carries the drafts
  // The rows arrive in order, each block's positions continuing where the previous part stopped.
  std::vector<uint16_t> got, want(r0);
  want.insert(want.end(), r1.begin(), r1.end());
  int32_t next_pos[2] = {0, 100};
  for (const ReceivedStep& s : steps) {
    int64_t rows = 0;
    for (const ContextBlock& c : s.contexts) {
      EXPECT_EQ(c.first_pos, next_pos[c.slot]);
      next_pos[c.slot] += c.rows;
      rows += c.rows;
    }
    EXPECT_LE(rows, 16);
    got.insert(got.end(), s.rows.begin(), s.rows.end());
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(next_pos[0], 30);
  EXPECT_EQ(next_pos[1], 110);
  const DraftRequest r{1, 2, 110, -1, 0};
  int32_t id = 0;
  float c = 0, l = 0, g = 0;
  fake_draft(fake_model(), r, true, 4, id, c, l, g);
  EXPECT_EQ(ids[9], id);
}

TEST(ClientApi, SplitStepIsCheckedBeforeAnyPartIsSent) {
  const std::string name = unique_ring_name();
  FakeWorker w(name);
  Attached a(name, 5000);
  ASSERT_EQ(a.status, DSPARK_OK);
  const auto rows = make_rows(0, 0, 20, fake_model().row_bytes / 2);
  const dspark_context_block ctx{0, 0, 20, rows.data()};
  const dspark_draft_request bad{99, 1, 20, -1, 0, 0, 0};  // slot out of range
  EXPECT_EQ(dspark_step(a.c, nullptr, 0, &ctx, 1, &bad, 1, 1, {}), DSPARK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dspark_last_error(a.c)).find("slot 99"), std::string::npos) << dspark_last_error(a.c);
  EXPECT_TRUE(w.steps().empty());
}

TEST(ClientApi, WorkerStatusAndMessagePassThrough) {
  const std::string name = unique_ring_name();
  FakeWorker w(name);
  Attached a(name, 5000);
  ASSERT_EQ(a.status, DSPARK_OK);
  const dspark_draft_request bad{99, 1, 20, -1, 0, 0, 0};  // one message: the worker decides
  EXPECT_EQ(dspark_draft(a.c, &bad, 1, 1, {}), DSPARK_INVALID_ARGUMENT);
  EXPECT_STREQ(dspark_last_error(a.c), "fake: slot out of range");
  // The handle stays usable.
  const dspark_draft_request ok{1, 1, 20, -1, 0, 0, 0};
  EXPECT_EQ(dspark_draft(a.c, &ok, 1, 1, {}), DSPARK_OK) << dspark_last_error(a.c);
}

TEST(ClientApi, ArgumentErrorsNeedNoWorker) {
  EXPECT_EQ(dspark_reset(nullptr, nullptr, 0), DSPARK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dspark_last_error(nullptr)).find("NULL"), std::string::npos);
  EXPECT_EQ(dspark_attach("/x", 0, nullptr), DSPARK_INVALID_ARGUMENT);
  EXPECT_STREQ(dspark_status_name(DSPARK_RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED");
  dspark_detach(nullptr);

  const std::string name = unique_ring_name();
  FakeWorker w(name);
  Attached a(name, 5000);
  ASSERT_EQ(a.status, DSPARK_OK);
  EXPECT_EQ(dspark_context(a.c, 0, 0, nullptr, 3), DSPARK_INVALID_ARGUMENT);
  const uint16_t row[24] = {};
  EXPECT_EQ(dspark_context(a.c, 0, 0, row, 0), DSPARK_INVALID_ARGUMENT);
  const dspark_draft_request five[5] = {};
  EXPECT_EQ(dspark_draft(a.c, five, 5, 1, {}), DSPARK_RESOURCE_EXHAUSTED);  // max_batch 4
  EXPECT_TRUE(w.steps().empty());
  EXPECT_EQ(dspark_context(a.c, 0, 0, row, 1), DSPARK_OK) << dspark_last_error(a.c);
}

TEST(ClientApi, NegativeTimeoutsAreRefused) {
  dspark_client* none = nullptr;
  const std::string name = unique_ring_name();
  EXPECT_EQ(dspark_attach(name.c_str(), -1, &none), DSPARK_INVALID_ARGUMENT);
  EXPECT_EQ(none, nullptr);
  EXPECT_STREQ(dspark_last_error(nullptr), "dspark_attach: timeout_ms -1 is negative");
  EXPECT_EQ(dspark_set_timeout(nullptr, 100), DSPARK_INVALID_ARGUMENT);

  FakeWorker w(name);
  Attached a(name, 5000);
  ASSERT_EQ(a.status, DSPARK_OK);
  EXPECT_EQ(dspark_set_timeout(a.c, INT32_MIN), DSPARK_INVALID_ARGUMENT);
  EXPECT_STREQ(dspark_last_error(a.c),
               "dspark_set_timeout: timeout_ms -2147483648 is negative (the limit stays 30000 ms)");
  EXPECT_EQ(dspark_set_timeout(a.c, 0), DSPARK_OK);
  EXPECT_EQ(dspark_set_timeout(a.c, -5), DSPARK_INVALID_ARGUMENT);
  EXPECT_STREQ(dspark_last_error(a.c),
               "dspark_set_timeout: timeout_ms -5 is negative (the limit stays 0 ms)");
  EXPECT_EQ(dspark_set_timeout(a.c, INT32_MAX), DSPARK_OK);
  const uint16_t row[24] = {};
  EXPECT_EQ(dspark_context(a.c, 0, 0, row, 1), DSPARK_OK) << dspark_last_error(a.c);
}

TEST(ClientApi, SetMaxModelLen) {
  const std::string name = unique_ring_name();
  FakeWorker w(name);
  Attached a(name, 5000);
  ASSERT_EQ(a.status, DSPARK_OK);
  ASSERT_EQ(dspark_set_max_model_len(a.c, 100), DSPARK_OK);
  dspark_model_info m{};
  ASSERT_EQ(dspark_model(a.c, &m), DSPARK_OK);
  EXPECT_EQ(m.max_model_len, 100);
  EXPECT_EQ(dspark_set_max_model_len(a.c, 100000), DSPARK_INVALID_ARGUMENT);
  ASSERT_EQ(dspark_model(a.c, &m), DSPARK_OK);
  EXPECT_EQ(m.max_model_len, 100);
}

TEST(ClientApi, DetachReleasesTheHostSlot) {
  const std::string name = unique_ring_name();
  FakeWorker w(name);
  dspark_client* c = nullptr;
  ASSERT_EQ(dspark_attach(name.c_str(), 5000, &c), DSPARK_OK);
  EXPECT_EQ(w.host_pid(), getpid());
  dspark_detach(c);
  EXPECT_EQ(w.detaches(), 1u);
  EXPECT_EQ(w.host_pid(), 0);  // detach waits for the worker to end the session
  Attached again(name, 1000);  // so this process can attach again at once
  EXPECT_EQ(again.status, DSPARK_OK) << dspark_last_error(nullptr);
  EXPECT_EQ(w.attaches(), 2u);
}

}  // namespace
}  // namespace dspark::test
