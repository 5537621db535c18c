// The Markov bias cache (SPEC §4): the token book's counts and ranking, the token file's format and errors,
// the CPU backend's cached path against the computed one (the same bits) and its bias rows against a float64
// formulation, and whole drafts with a cache against drafts without.
#include <gtest/gtest.h>

#include <bit>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <unistd.h>

#include "comm/communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/core/error.hpp"
#include "lib/core/numeric.hpp"
#include "lib/model/drafter.hpp"
#include "lib/model/load_weights.hpp"
#include "lib/model/markov_cache.hpp"
#include "tests/support/tiny_checkpoint.hpp"

namespace dspark {
namespace {

using Hot = std::vector<std::pair<int32_t, uint64_t>>;

TEST(MarkovTokenBook, CountsLookupsHitsAndRanksTheTokens) {
  MarkovTokenBook book(10, {2, 7});
  for (const int32_t t : {5, 2, 5, 9, 2, 5, 7, 9, -1, 10}) book.count(t);
  EXPECT_EQ(book.lookups(), 8u) << "-1 and 10 are outside [0, 10)";
  EXPECT_EQ(book.hits(), 3u) << "2, 2 and 7";
  EXPECT_TRUE(book.cached(7));
  EXPECT_FALSE(book.cached(5));
  EXPECT_EQ(book.hottest(3, false), (Hot{{5, 3}, {2, 2}, {9, 2}})) << "equal counts: the lower id first";
  EXPECT_EQ(book.hottest(10, true), (Hot{{5, 3}, {9, 2}}));
}

class TokenFile : public ::testing::Test {
 protected:
  std::filesystem::path write(const std::string& text) {
    std::ofstream(path_) << text;
    return path_;
  }
  std::string error_of(const std::string& text, int64_t vocab = 100) {
    try {
      read_markov_cache_tokens(write(text), vocab, 1000);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  // A file of its own per test process (ctest runs the cases in parallel).
  std::filesystem::path path_ = std::filesystem::temp_directory_path() /
                                fmt::format("dspark_markov_tokens_{}_{}.txt", getpid(),
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
  void TearDown() override { std::filesystem::remove(path_); }
};

TEST_F(TokenFile, ReadsIdsCommentsAndCountColumnsUpToTheRows) {
  EXPECT_EQ(read_markov_cache_tokens(write("# hot\n5 12\n\n  7\n3 # third\n99\n"), 100, 1000),
            (std::vector<int32_t>{5, 7, 3, 99}));
  EXPECT_EQ(read_markov_cache_tokens(write("5\n7\n3\n"), 100, 2), (std::vector<int32_t>{5, 7}));
}

TEST_F(TokenFile, RefusesBadIdsDuplicatesAndMissingFilesNamingTheLine) {
  EXPECT_NE(error_of("5\n100\n").find("line 2: '100' is not a token id in [0, 100)"), std::string::npos)
      << error_of("5\n100\n");
  EXPECT_NE(error_of("5\n-3\n").find("line 2: '-3'"), std::string::npos);
  EXPECT_NE(error_of("5x\n").find("line 1: '5x'"), std::string::npos);
  EXPECT_NE(error_of("5\n6\n5\n").find("line 3: token 5 is listed twice"), std::string::npos);
  EXPECT_THROW(read_markov_cache_tokens("/nonexistent/tokens.txt", 100, 10), Error);
}

TEST_F(TokenFile, AHotTokensFileReadsBackInItsOrder) {
  write_markov_cache_tokens(path_, {{42, 9}, {7, 3}, {13, 1}});
  EXPECT_EQ(read_markov_cache_tokens(path_, 100, 1000), (std::vector<int32_t>{42, 7, 13}));
}

Tensor put_f32(Backend& be, const Shape& s, const std::vector<float>& v) {
  Tensor t = be.alloc(DType::f32, s);
  be.upload(t, v.data());
  return t;
}
Tensor put_bf16(Backend& be, const Shape& s, const std::vector<float>& v) {
  std::vector<bf16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = float_to_bf16(v[i]);
  Tensor t = be.alloc(DType::bf16, s);
  be.upload(t, b.data());
  return t;
}
Tensor put_i32(Backend& be, const Shape& s, const std::vector<int32_t>& v) {
  Tensor t = be.alloc(DType::i32, s);
  be.upload(t, v.data());
  return t;
}

TEST(MarkovCacheCpu, BiasRowsMatchAFloat64DotAndTheCachedPathHasTheComputedBits) {
  CpuBackend be;
  std::mt19937 g(5);
  std::normal_distribution<float> n;
  const int64_t V = 50, Vr = 40, R = 24, B = 4, k = 3;
  std::vector<float> head(static_cast<size_t>(Vr * R)), embed(static_cast<size_t>(V * R)),
      logits(static_cast<size_t>(B * k * Vr));
  for (float& x : head) x = round_bf16(n(g) * 0.2f);
  for (float& x : embed) x = round_bf16(n(g));
  for (float& x : logits) x = n(g);
  const Tensor ht = put_bf16(be, {Vr, R}, head), et = put_bf16(be, {V, R}, embed);
  const std::vector<int32_t> cached = {3, 17, 41};
  Tensor rows = be.alloc(DType::f32, {3, Vr});
  be.markov_bias_rows(ht, Tensor{}, et, put_i32(be, {3}, cached), rows);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t v = 0; v < Vr; ++v) {
      double want = 0;
      for (int64_t r = 0; r < R; ++r)
        want += double(head[static_cast<size_t>(v * R + r)]) * embed[static_cast<size_t>(cached[i] * R + r)];
      EXPECT_NEAR(rows.as<float>()[i * Vr + v], want, 1e-5 * (1 + std::fabs(want))) << i << " " << v;
    }
  std::vector<int32_t> slot(static_cast<size_t>(V), -1);
  for (size_t i = 0; i < cached.size(); ++i) slot[static_cast<size_t>(cached[i])] = static_cast<int32_t>(i);
  const MarkovCache cache{rows, put_i32(be, {V}, slot)};
  // Requests: two cached prev tokens, one not, one past its outputs; then every live one cached.
  for (const std::vector<int32_t>& prev :
       {std::vector<int32_t>{17, 8, 3, 41}, std::vector<int32_t>{41, 3, 17, 9}}) {
    std::vector<int32_t> req(static_cast<size_t>(B * kReqFields), 0);
    for (int64_t b = 0; b < B; ++b) req[static_cast<size_t>(b * kReqFields + kReqOutputs)] = b == 3 ? 1 : k;
    // Requests 1 and 2 draw (tau 0.9, seeds 5 and 6): a cached row gives their draws the same bits too.
    std::vector<int32_t> sampling(static_cast<size_t>(B * kSampleFields), 0);
    for (int64_t b = 1; b <= 2; ++b) {
      sampling[static_cast<size_t>(b * kSampleFields + kSampleTemperature)] = std::bit_cast<int32_t>(0.9f);
      sampling[static_cast<size_t>(b * kSampleFields + kSampleSeedLow)] = static_cast<int32_t>(4 + b);
    }
    for (int64_t j = 0; j < k; ++j) {
      Tensor with = be.alloc(DType::i32, {B, kMarkovRecordWords}),
             without = be.alloc(DType::i32, {B, kMarkovRecordWords});
      const Tensor lt = put_f32(be, {B * k, Vr}, logits), pt = put_i32(be, {B}, prev),
                   rt = put_i32(be, {B, kReqFields}, req), st = put_i32(be, {B, kSampleFields}, sampling);
      be.markov_top2(lt, ht, Tensor{}, et, pt, rt, st, j, k, 100, cache, with);
      be.markov_top2(lt, ht, Tensor{}, et, pt, rt, st, j, k, 100, MarkovCache{}, without);
      for (int64_t i = 0; i < B * kMarkovRecordWords; ++i)
        ASSERT_EQ(with.as<int32_t>()[i], without.as<int32_t>()[i]) << "j " << j << " word " << i;
    }
  }
}

class MarkovCacheDrafter : public ::testing::Test {
 protected:
  std::unique_ptr<Drafter> make(std::vector<int32_t> cache_tokens, int64_t cache_rows = 0) {
    const Checkpoint ckpt(test::tiny_checkpoint());
    cfg_ = load_model_config(ckpt.config_path());
    const ShardPlan plan = make_shard_plan(cfg_, 0, 1);
    DrafterOptions opt;
    opt.slots = 4;
    opt.max_batch = 4;
    opt.markov_cache_tokens = std::move(cache_tokens);
    opt.markov_cache_rows = cache_rows;
    auto d = std::make_unique<Drafter>(cfg_, load_drafter_weights(ckpt, cfg_, plan, backend_), plan, backend_,
                                       comm_, opt);
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    std::vector<bf16_t> rows(static_cast<size_t>(20 * cfg_.row_dim()));
    for (auto& v : rows) v = float_to_bf16(normal(rng));
    for (int32_t s = 0; s < 4; ++s) d->insert(s, 0, rows.data(), 20);
    return d;
  }
  std::vector<DraftRequest> requests() const {
    const int32_t k = static_cast<int32_t>(cfg_.block_size);
    return {{0, 17, 20, -1, k}, {1, 300, 20, -1, 2}, {2, 17, 20, -1, k}, {3, 999, 20, -1, 1}};
  }
  CpuBackend backend_;
  LocalCommunicator comm_;
  ModelConfig cfg_;
};

TEST_F(MarkovCacheDrafter, DraftsWithTheCacheEqualDraftsWithoutAndCountItsHits) {
  const DraftResult plain = make({})->draft(requests(), true);
  const std::vector<DraftRequest> reqs = requests();
  std::vector<int32_t> all(static_cast<size_t>(cfg_.vocab_size));
  for (size_t t = 0; t < all.size(); ++t) all[t] = static_cast<int32_t>(all.size() - 1 - t);
  // Some tokens (the anchors 17 and 999), and every token (no position reads markov_head).
  for (const std::vector<int32_t>& tokens : {std::vector<int32_t>{999, 17}, all}) {
    SCOPED_TRACE(testing::Message() << tokens.size() << " cached tokens");
    std::unique_ptr<Drafter> d = make(tokens);
    const DraftResult r = d->draft(reqs, true);
    EXPECT_EQ(r.ids, plain.ids);
    EXPECT_EQ(r.conf, plain.conf);
    EXPECT_EQ(r.margin, plain.margin);
    // Hand count: position j of request b looks up the anchor (j = 0) or its output j - 1.
    int64_t lookups = 0, hits = 0;
    const std::set<int32_t> set(tokens.begin(), tokens.end());
    for (size_t b = 0; b < reqs.size(); ++b)
      for (int32_t j = 0; j < reqs[b].outputs; ++j) {
        const int32_t prev = j == 0 ? reqs[b].anchor_token : r.ids[b * cfg_.block_size + j - 1];
        ++lookups;
        hits += set.count(prev);
      }
    EXPECT_EQ(r.markov_lookups, lookups);
    EXPECT_EQ(r.markov_hits, hits);
    EXPECT_EQ(lookups, 2 * cfg_.block_size + 3);
    EXPECT_GE(hits, tokens.size() == all.size() ? lookups : 3) << "the anchors 17, 17 and 999 at least";
    EXPECT_EQ(d->markov_tokens().lookups(), static_cast<uint64_t>(lookups));
    EXPECT_EQ(d->markov_tokens().hits(), static_cast<uint64_t>(hits));
  }
}

TEST_F(MarkovCacheDrafter, RefillingTheCacheChangesTheHitsNotTheDrafts) {
  const DraftResult plain = make({})->draft(requests(), true);
  std::unique_ptr<Drafter> d = make({}, 4);  // room for 4 rows, none filled
  EXPECT_EQ(d->draft(requests(), true).markov_hits, 0);
  d->set_markov_cache({999, 17, 300});
  const DraftResult r = d->draft(requests(), true);
  EXPECT_EQ(r.ids, plain.ids);
  EXPECT_EQ(r.margin, plain.margin);
  EXPECT_GE(r.markov_hits, 4) << "the anchors 17, 300, 17 and 999";
  d->set_markov_cache({});
  EXPECT_EQ(d->draft(requests(), true).markov_hits, 0);
  EXPECT_THROW(d->set_markov_cache({1, 2, 3, 4, 5}), Error) << "more tokens than rows";
  EXPECT_EQ(d->markov_tokens().lookups(), static_cast<uint64_t>(3 * (2 * cfg_.block_size + 3)));
}

TEST_F(MarkovCacheDrafter, RefusesTokensOutsideTheVocabularyAndRepeats) {
  EXPECT_THROW(make({5, static_cast<int32_t>(tiny_model_config().vocab_size)}), Error);
  EXPECT_THROW(make({5, 7, 5}), Error);
}

}  // namespace
}  // namespace dspark
