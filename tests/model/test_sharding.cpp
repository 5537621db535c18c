// Tensor parallelism's split (SPEC §5): the plan on hand cases, the bytes each rank reads, what its shards
// hold and the shard report. Expected numbers come from the config's closed forms written out here, never
// from tensor_split or the report, so the code under test cannot agree with itself by construction.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/core/error.hpp"
#include "lib/model/load_weights.hpp"
#include "lib/model/shard_plan.hpp"
#include "lib/model/shard_report.hpp"
#include "tests/support/tiny_checkpoint.hpp"

namespace dspark {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Span = std::pair<int64_t, int64_t>;

Span span(const Range& r) {
  return {r.begin, r.end};
}

// One field of the plan of every rank, e.g. spans(cfg, 3, &ShardPlan::inter).
std::vector<Span> spans(const ModelConfig& cfg, int ranks, Range ShardPlan::*field) {
  std::vector<Span> out;
  for (int r = 0; r < ranks; ++r) out.push_back(span(make_shard_plan(cfg, r, ranks).*field));
  return out;
}

std::string refusal(const ModelConfig& cfg, int ranks) {
  try {
    for (int r = 0; r < ranks; ++r) make_shard_plan(cfg, r, ranks);
  } catch (const Error& e) {
    return e.what();
  }
  return "no refusal";
}

TEST(SplitEven, LowerPartsTakeTheRemainder) {
  EXPECT_EQ(span(split_even(4, 0, 3)), Span(0, 2));
  EXPECT_EQ(span(split_even(4, 1, 3)), Span(2, 3));
  EXPECT_EQ(span(split_even(4, 2, 3)), Span(3, 4));
  EXPECT_EQ(span(split_even(505, 0, 2)), Span(0, 253));
  EXPECT_EQ(span(split_even(505, 1, 2)), Span(253, 505));
  EXPECT_EQ(span(split_even(8, 3, 4)), Span(6, 8));
  EXPECT_EQ(span(split_even(7, 0, 1)), Span(0, 7));
}

TEST(ShardPlan, TinyConfigSplitsEvenly) {
  const ModelConfig cfg = tiny_model_config();  // 8 heads, 4 groups, I 512, vocab 1024
  for (int n : {1, 2, 4}) {
    SCOPED_TRACE(n);
    for (int r = 0; r < n; ++r) {
      const ShardPlan p = make_shard_plan(cfg, r, n);
      EXPECT_EQ(p.rank, r);
      EXPECT_EQ(p.ranks, n);
      EXPECT_EQ(span(p.heads), Span(r * 8 / n, (r + 1) * 8 / n));
      EXPECT_EQ(span(p.groups), Span(r * 4 / n, (r + 1) * 4 / n));
      EXPECT_EQ(span(p.inter), Span(r * 512 / n, (r + 1) * 512 / n));
      EXPECT_EQ(span(p.shared_inter), Span(r * 512 / n, (r + 1) * 512 / n));
      EXPECT_EQ(span(p.vocab), Span(r * 1024 / n, (r + 1) * 1024 / n));
    }
  }
}

TEST(ShardPlan, UnevenUnitsGoToTheLowerRanks) {
  ModelConfig cfg = tiny_model_config();
  cfg.n_heads = 12;  // so that heads and groups divide by 3
  cfg.o_groups = 3;
  // I 512 = 4 units of 128; vocab 1024 = 4 tiles of 256.
  EXPECT_THAT(spans(cfg, 3, &ShardPlan::inter), ElementsAre(Span(0, 256), Span(256, 384), Span(384, 512)));
  EXPECT_THAT(spans(cfg, 3, &ShardPlan::shared_inter),
              ElementsAre(Span(0, 256), Span(256, 384), Span(384, 512)));
  EXPECT_THAT(spans(cfg, 3, &ShardPlan::vocab), ElementsAre(Span(0, 512), Span(512, 768), Span(768, 1024)));
  EXPECT_THAT(spans(cfg, 3, &ShardPlan::heads), ElementsAre(Span(0, 4), Span(4, 8), Span(8, 12)));
}

TEST(ShardPlan, PartialLastVocabTileGoesToTheLastRank) {
  ModelConfig cfg = tiny_model_config();
  cfg.vocab_size = 1000;  // 3 full tiles and one of 232 columns
  EXPECT_THAT(spans(cfg, 2, &ShardPlan::vocab), ElementsAre(Span(0, 512), Span(512, 1000)));
}

TEST(ShardPlan, V41DefaultsAtTp2) {
  const ModelConfig cfg;  // vocab 129280 = 505 tiles, 64 heads, 8 groups, I 2304 = 18 units
  EXPECT_THAT(spans(cfg, 2, &ShardPlan::vocab), ElementsAre(Span(0, 64768), Span(64768, 129280)));
  EXPECT_THAT(spans(cfg, 2, &ShardPlan::heads), ElementsAre(Span(0, 32), Span(32, 64)));
  EXPECT_THAT(spans(cfg, 2, &ShardPlan::groups), ElementsAre(Span(0, 4), Span(4, 8)));
  EXPECT_THAT(spans(cfg, 2, &ShardPlan::inter), ElementsAre(Span(0, 1152), Span(1152, 2304)));
}

TEST(ShardPlan, RefusalsGiveTheReason) {
  const ModelConfig tiny = tiny_model_config();
  EXPECT_THAT(refusal(tiny, 3), HasSubstr("8 attention heads"));
  ModelConfig groups = tiny;
  groups.n_heads = 16;  // heads split over 8, groups (4) do not
  EXPECT_THAT(refusal(groups, 8), HasSubstr("4 output groups"));
  ModelConfig inter = tiny;
  inter.moe_inter_dim = 320;
  EXPECT_THAT(refusal(inter, 2), AllOf(HasSubstr("moe_inter_dim (320)"), HasSubstr("multiple of 128")));
  EXPECT_EQ(refusal(inter, 1), "no refusal");  // nothing is cut at N = 1
  ModelConfig few = tiny;
  few.moe_inter_dim = 256;  // 2 units for 4 ranks
  EXPECT_THAT(refusal(few, 4), AllOf(HasSubstr("moe_inter_dim (256)"), HasSubstr("only 2 units")));
  ModelConfig vocab = tiny;
  vocab.vocab_size = 700;  // 3 tiles for 4 ranks
  EXPECT_THAT(refusal(vocab, 4), AllOf(HasSubstr("vocab_size (700)"), HasSubstr("only 3 units")));
}

// Bytes one rank of N holds, written out from SPEC §3's shapes for a dense checkpoint in the table dtypes.
// Only for even splits (N divides heads, groups, the 128-channel units and the 256-column tiles).
struct Expected {
  uint64_t replicated = 0;
  uint64_t sharded = 0;
  uint64_t total() const { return replicated + sharded; }
};
Expected expected_bytes(const ModelConfig& c, int n) {
  EXPECT_EQ(c.n_heads % n, 0);
  EXPECT_EQ(c.o_groups % n, 0);
  EXPECT_EQ(c.moe_inter_dim % (128 * n), 0);
  EXPECT_EQ(c.vocab_size % (256 * n), 0);
  const uint64_t H = c.dim, V = c.vocab_size, d = c.head_dim, nh = c.n_heads, q = c.q_lora_rank;
  const uint64_t G = c.o_groups, L = c.o_lora_rank, I = c.moe_inter_dim, Is = I * c.n_shared_experts;
  const uint64_t E = c.n_routed_experts, S = c.n_mtp_layers, R = c.markov_rank, hc = c.hc_mult;
  const uint64_t mix = (2 + hc) * hc, taps = c.target_layer_ids.size(), N = n, bf16 = 2, f32 = 4;
  Expected x;
  const uint64_t per_stage = 2 * H * bf16                          // attn_norm, ffn_norm
                             + 2 * (mix * hc * H + mix + 3) * f32  // hc_{attn,ffn}_{fn,base,scale}
                             + (q * H + q + d * H + d) * bf16      // wq_a, q_norm, wkv, kv_norm
                             + E * H * bf16 + E * f32;             // gate, gate bias
  x.replicated = V * H * bf16                                      // embed
                 + (H * taps * H + H) * bf16                       // main_proj, main_norm
                 + S * per_stage + (H + V * R + H + R) * bf16;     // norm, markov embed, confidence
  const uint64_t heads = nh / N, groups = G / N, inter = I / N, shared = Is / N, vocab = V / N;
  x.sharded = S * (heads * d * q * bf16 + heads * f32                          // wq_b rows, attn_sink
                   + groups * L * (nh * d / G) * bf16 + H * groups * L * bf16  // wo_a rows, wo_b columns
                   + E * 3 * inter * H * bf16 + 3 * shared * H * bf16)         // routed and shared experts
              + vocab * H * bf16 + vocab * R * bf16;                           // head, markov head
  return x;
}

class ShardBytes : public ::testing::TestWithParam<int> {};

TEST_P(ShardBytes, EachRankReadsAndHoldsExactlyItsShare) {
  const int n = GetParam();
  Checkpoint ckpt(test::tiny_checkpoint());  // not const: its read counter is reset
  const ModelConfig cfg = load_model_config(ckpt.config_path());
  const Expected whole = expected_bytes(cfg, 1), part = expected_bytes(cfg, n);
  uint64_t stored = 0;  // the closed forms against the headers: the tiny checkpoint holds only the drafter
  for (const std::string& name : ckpt.names()) stored += ckpt.get(name).nbytes;
  ASSERT_EQ(whole.total(), stored);
  uint64_t sharded_sum = 0;
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE(r);
    CpuBackend be;
    ckpt.reset_bytes_read();
    const DrafterWeights w = load_drafter_weights(ckpt, cfg, make_shard_plan(cfg, r, n), be);
    EXPECT_EQ(ckpt.bytes_read(), part.total());
    EXPECT_EQ(w.bytes, part.total());
    const uint64_t sharded = ckpt.bytes_read() - part.replicated;
    EXPECT_EQ(sharded * static_cast<uint64_t>(n), whole.sharded);  // splits are even here: exactly 1/N
    sharded_sum += sharded;
  }
  EXPECT_EQ(sharded_sum, whole.sharded);
}

TEST_P(ShardBytes, ReportTotalsMatchTheClosedForms) {
  const int n = GetParam();
  Checkpoint ckpt(test::tiny_checkpoint());  // not const: its read counter is reset
  const ModelConfig cfg = load_model_config(ckpt.config_path());
  const Expected part = expected_bytes(cfg, n);
  ckpt.reset_bytes_read();
  const ShardReport with_ckpt = make_shard_report(cfg, n, &ckpt);
  EXPECT_EQ(ckpt.bytes_read(), 0u);  // headers only
  const ShardReport from_table = make_shard_report(cfg, n);
  for (const ShardReport* rep : {&with_ckpt, &from_table}) {
    ASSERT_TRUE(rep->ok()) << rep->refusal;
    ASSERT_EQ(rep->bytes.size(), static_cast<size_t>(n));
    EXPECT_EQ(rep->tensors.size(), drafter_tensors(cfg).size());
    for (const RankBytes& b : rep->bytes) {
      EXPECT_EQ(b.replicated, part.replicated);
      EXPECT_EQ(b.sharded, part.sharded);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tp, ShardBytes, ::testing::Values(1, 2, 4));

// Bytes [col0, col0 + cols) of every row of a [rows, row_cols] tensor of 2-byte elements.
std::vector<uint8_t> slice_cols(const std::vector<uint8_t>& whole, int64_t row_cols, int64_t col0,
                                int64_t cols) {
  const size_t es = 2, rows = whole.size() / es / static_cast<size_t>(row_cols);
  std::vector<uint8_t> out;
  for (size_t r = 0; r < rows; ++r) {
    const auto* row = whole.data() + (r * static_cast<size_t>(row_cols) + static_cast<size_t>(col0)) * es;
    out.insert(out.end(), row, row + static_cast<size_t>(cols) * es);
  }
  return out;
}

// Rows [row0, row0 + rows) of a tensor whose rows are `row_bytes` long.
std::vector<uint8_t> slice_rows(const std::vector<uint8_t>& whole, size_t row_bytes, int64_t row0,
                                int64_t rows) {
  const auto* first = whole.data() + static_cast<size_t>(row0) * row_bytes;
  return {first, first + static_cast<size_t>(rows) * row_bytes};
}

TEST(ShardContents, Rank1Of2HoldsTheSlicesOfTheWholeTensors) {
  const Checkpoint ckpt(test::tiny_checkpoint());
  const ModelConfig cfg = load_model_config(ckpt.config_path());
  CpuBackend be;
  const DrafterWeights w = load_drafter_weights(ckpt, cfg, make_shard_plan(cfg, 1, 2), be);
  auto whole = [&](const std::string& name) {
    std::vector<uint8_t> b(ckpt.get(name).nbytes);
    ckpt.read(name, b.data());
    return b;
  };
  auto held = [&](const Tensor& t) {
    std::vector<uint8_t> b(t.nbytes());
    be.download(b.data(), t);
    return b;
  };
  const int64_t H = cfg.dim, d = cfg.head_dim, q = cfg.q_lora_rank, nh = cfg.n_heads, R = cfg.markov_rank;
  const int64_t GL = cfg.o_groups * cfg.o_lora_rank, I = cfg.moe_inter_dim, V = cfg.vocab_size;
  const size_t bf16 = 2;

  // Column shards: the second half of every row.
  EXPECT_EQ(held(w.stages[0].wo_b.weight), slice_cols(whole("mtp.0.attn.wo_b.weight"), GL, GL / 2, GL / 2));
  EXPECT_EQ(held(w.stages[1].experts[3].w2.weight),
            slice_cols(whole("mtp.1.ffn.experts.3.w2.weight"), I, I / 2, I / 2));
  EXPECT_EQ(held(w.stages[2].shared.w2.weight),
            slice_cols(whole("mtp.2.ffn.shared_experts.w2.weight"), I, I / 2, I / 2));
  // Row shards: the second half of the rows.
  EXPECT_EQ(held(w.stages[0].wq_b.weight),
            slice_rows(whole("mtp.0.attn.wq_b.weight"), q * bf16, nh / 2 * d, nh / 2 * d));
  EXPECT_EQ(held(w.stages[0].attn_sink), slice_rows(whole("mtp.0.attn.attn_sink"), 4, nh / 2, nh / 2));
  EXPECT_EQ(held(w.stages[1].wo_a.weight),
            slice_rows(whole("mtp.1.attn.wo_a.weight"), nh * d / cfg.o_groups * bf16, GL / 2, GL / 2));
  EXPECT_EQ(held(w.stages[2].experts[7].w1.weight),
            slice_rows(whole("mtp.2.ffn.experts.7.w1.weight"), H * bf16, I / 2, I / 2));
  EXPECT_EQ(held(w.head.weight), slice_rows(whole("head.weight"), H * bf16, V / 2, V / 2));
  EXPECT_EQ(held(w.markov_head), slice_rows(whole("mtp.2.markov_head.head.weight"), R * bf16, V / 2, V / 2));
  // Replicated: whole.
  EXPECT_EQ(held(w.embed), whole("embed.weight"));
  EXPECT_EQ(held(w.stages[0].wkv.weight), whole("mtp.0.attn.wkv.weight"));
}

TEST(ShardReport, RefusalCarriesTheReason) {
  const ShardReport rep = make_shard_report(tiny_model_config(), 3);
  EXPECT_FALSE(rep.ok());
  EXPECT_THAT(rep.refusal, HasSubstr("8 attention heads"));
  EXPECT_TRUE(rep.tensors.empty());
  EXPECT_THAT(shard_report_table(rep, true), HasSubstr("8 attention heads"));
  const auto j = shard_report_json(rep);
  EXPECT_EQ(j["ok"], false);
  EXPECT_THAT(j["error"].get<std::string>(), HasSubstr("8 attention heads"));
}

TEST(ShardReport, TableAndJsonShowEachTensorsSplit) {
  const ShardReport rep = make_shard_report(tiny_model_config(), 2);
  const std::string table = shard_report_table(rep, true);
  EXPECT_THAT(table, HasSubstr("rows [0, 512) | rows [512, 1024)"));  // wq_b: 4 heads of 128 each
  EXPECT_THAT(table, HasSubstr("cols [0, 256) | cols [256, 512)"));   // wo_b, w2
  EXPECT_THAT(shard_report_table(rep, false), ::testing::Not(HasSubstr("mtp.0.attn.wq_b.weight")));
  const auto j = shard_report_json(rep);
  ASSERT_EQ(j["ranks"].size(), 2u);
  EXPECT_EQ(j["ranks"][1]["vocab"], nlohmann::json::array({512, 1024}));
  EXPECT_EQ(j["ranks"][1]["total_bytes"], rep.bytes[1].total());
  bool found = false;
  for (const auto& t : j["tensors"])
    if (t["name"] == "mtp.0.attn.wq_b.weight") {
      found = true;
      EXPECT_EQ(t["shards"][1]["kind"], "rows");
      EXPECT_EQ(t["shards"][1]["begin"], 512);
      EXPECT_EQ(t["shards"][1]["bytes"], 512 * 128 * 2);
    }
  EXPECT_TRUE(found);
}

// A copy of the tiny checkpoint with wq_b stored as f32 and wo_a as fp8 blocks (weight + e8m0 scale): the
// report counts what the headers say.
std::filesystem::path mixed_dtype_copy() {
  const Checkpoint src(test::tiny_checkpoint());
  const auto dir = test::scratch_dir("mixed-dtypes");
  std::filesystem::copy_file(src.config_path(), dir / "config.json");
  std::vector<TensorSpec> specs;
  for (const std::string& n : src.names()) {
    const TensorInfo& info = src.get(n);
    if (n == "mtp.0.attn.wq_b.weight") {
      specs.push_back({n, DType::f32, info.shape});
    } else if (n == "mtp.0.attn.wo_a.weight") {
      specs.push_back({n, DType::f8_e4m3, info.shape});
      specs.push_back({"mtp.0.attn.wo_a.scale", DType::f8_e8m0, {info.shape[0] / 32, info.shape[1] / 32}});
    } else {
      specs.push_back({n, info.dtype, info.shape});
    }
  }
  SafetensorsWriter out(dir / "model.safetensors", specs);
  for (const TensorSpec& s : specs) {
    std::vector<uint8_t> bytes(static_cast<size_t>(shape_numel(s.shape)) * dtype_size(s.dtype));
    if (src.has(s.name) && src.get(s.name).dtype == s.dtype) src.read(s.name, bytes.data());
    out.write(s.name, bytes.data(), bytes.size());
  }
  out.finish();
  return dir;
}

TEST(ShardReport, CountsTheDtypesTheCheckpointStores) {
  const Checkpoint ckpt(mixed_dtype_copy());
  const ModelConfig cfg = load_model_config(ckpt.config_path());
  const Expected dense = expected_bytes(cfg, 2);
  const ShardReport rep = make_shard_report(cfg, 2, &ckpt);
  ASSERT_TRUE(rep.ok()) << rep.refusal;
  const uint64_t wq_b = 512 * 128;               // elements of one rank's wq_b rows
  const uint64_t wo_a = 256 * 256 + 16 * 8 / 2;  // fp8 bytes of 256 of 512 rows, half the [16, 8] scales
  for (const RankBytes& b : rep.bytes) {
    EXPECT_EQ(b.replicated, dense.replicated);
    EXPECT_EQ(b.sharded, dense.sharded + wq_b * (4 - 2) - 256 * 256 * 2 + wo_a);
  }
  for (const TensorReport& t : rep.tensors)
    if (t.name == "mtp.0.attn.wo_a.weight") {
      EXPECT_EQ(t.format, WeightFormat::fp8_block);
      EXPECT_EQ(t.dtype, DType::f8_e4m3);
    }
  EXPECT_THAT(shard_report_table(rep, true), HasSubstr("float8_e4m3fn (fp8 block)"));
}

// The tiny model in the released format (fp8 block linears, fp4 routed experts, 32 x 32 blocks) at tp = n:
// each rank's bytes by representation, weight and scale parts, from the tiny config's shapes.
std::map<WeightFormat, PartBytes> expected_fp8_bytes(const ModelConfig& c, int n) {
  const uint64_t H = c.dim, V = c.vocab_size, d = c.head_dim, nh = c.n_heads, q = c.q_lora_rank;
  const uint64_t G = c.o_groups, L = c.o_lora_rank, I = c.moe_inter_dim, E = c.n_routed_experts;
  const uint64_t S = c.n_mtp_layers, R = c.markov_rank, mix = (2 + c.hc_mult) * c.hc_mult, N = n;
  const uint64_t bf16 = 2, f32 = 4, B = 32;
  const uint64_t heads = nh / N, gl = G * L / N, inter = I / N, vocab = V / N, gin = nh * d / G;
  std::map<WeightFormat, PartBytes> x;
  x[WeightFormat::dense].weight = V * H * bf16 + vocab * H * bf16                          // embed, head rows
                                  + H * bf16                                               // main_norm
                                  + S * (2 * H * bf16 + 2 * (mix * 4 * H + mix + 3) * f32  // norms, hc_*
                                         + (q + d) * bf16 + heads * f32                    // q/kv norm, sink
                                         + E * H * bf16 + E * f32)                         // gate, bias
                                  + H * bf16 + V * R * bf16 + vocab * R * bf16 + (H + R) * bf16;
  // One byte per element; one scale byte per 32 x 32 block of the rank's rows / columns.
  x[WeightFormat::fp8_block] = {
      H * 3 * H + S * (q * H + heads * d * q + d * H + gl * gin + H * gl + 3 * inter * H),
      (H / B) * (3 * H / B) + S * ((q / B) * (H / B) + (heads * d / B) * (q / B) + (d / B) * (H / B) +
                                   (gl / B) * (gin / B) + (H / B) * (gl / B) + 3 * (inter / B) * (H / B))};
  // Half a byte per element; one scale byte per 32 inputs of a row.
  x[WeightFormat::fp4] = {S * E * 3 * inter * H / 2, S * E * 3 * inter * H / 32};
  return x;
}

class Fp8ShardBytes : public ::testing::TestWithParam<int> {};

TEST_P(Fp8ShardBytes, TheReportCountsWeightAndScalePartsAndTheLoaderReadsThem) {
  const int n = GetParam();
  Checkpoint ckpt(test::tiny_fp8_checkpoint());
  const ModelConfig cfg = load_model_config(ckpt.config_path());
  const std::map<WeightFormat, PartBytes> want = expected_fp8_bytes(cfg, n);
  if (n == 1) {  // the whole checkpoint: the headers' payload
    uint64_t stored = 0;
    for (const std::string& name : ckpt.names()) stored += ckpt.get(name).nbytes;
    uint64_t sum = 0;
    for (const auto& [f, p] : want) sum += p.total();
    EXPECT_EQ(sum, stored);
  }
  if (n == 2) {  // worked out by hand for one rank of two
    EXPECT_EQ(want.at(WeightFormat::dense).weight, 1493848u);
    EXPECT_EQ(want.at(WeightFormat::fp8_block).weight, 1572864u);  // 196608 main_proj + 3 * 458752
    EXPECT_EQ(want.at(WeightFormat::fp8_block).scale, 1536u);      // 192 + 3 * 448
    EXPECT_EQ(want.at(WeightFormat::fp4).weight, 2359296u);        // 24 experts * 3 * 256 * 256 / 2
    EXPECT_EQ(want.at(WeightFormat::fp4).scale, 147456u);
  }
  const ShardReport rep = make_shard_report(cfg, n, &ckpt);
  ASSERT_TRUE(rep.ok()) << rep.refusal;
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE(r);
    const RankBytes& b = rep.bytes[static_cast<size_t>(r)];
    ASSERT_EQ(b.formats.size(), 3u);
    for (const auto& [f, p] : want) {
      EXPECT_EQ(b.formats.at(f).weight, p.weight) << weight_format_name(f);
      EXPECT_EQ(b.formats.at(f).scale, p.scale) << weight_format_name(f);
    }
    CpuBackend be;
    ckpt.reset_bytes_read();
    const DrafterWeights w = load_drafter_weights(ckpt, cfg, make_shard_plan(cfg, r, n), be);
    EXPECT_EQ(ckpt.bytes_read(), b.total());
    EXPECT_EQ(w.bytes, b.total());
  }
  const auto j = shard_report_json(rep);
  EXPECT_EQ(j["ranks"][0]["formats"]["fp8_block"]["scale_bytes"], want.at(WeightFormat::fp8_block).scale);
  EXPECT_EQ(j["ranks"][0]["formats"]["fp4"]["weight_bytes"], want.at(WeightFormat::fp4).weight);
  EXPECT_EQ(j["ranks"][0]["formats"]["dense"]["scale_bytes"], 0u);
}

INSTANTIATE_TEST_SUITE_P(Tp, Fp8ShardBytes, ::testing::Values(1, 2, 4));

TEST(ShardReport, TheTableGivesBytesByFormatAtTp2) {
  const Checkpoint ckpt(test::tiny_fp8_checkpoint());
  const ShardReport rep = make_shard_report(load_model_config(ckpt.config_path()), 2, &ckpt);
  const std::string table = shard_report_table(rep, false);
  EXPECT_THAT(table, HasSubstr("rank  dense    fp8 block          fp4"));
  EXPECT_THAT(table, HasSubstr("1     1.49 MB  1.57 MB + 1.54 kB  2.36 MB + 147.46 kB"));
}

TEST(ShardReport, TheBackendCheckNamesTheFirstTensorItCannotRun) {
  const Checkpoint ckpt(test::tiny_fp8_checkpoint());
  ShardReport rep = make_shard_report(load_model_config(ckpt.config_path()), 2, &ckpt);
  check_backend(rep, "cpu", CpuBackend::runs_format);
  ASSERT_TRUE(rep.backend);
  EXPECT_TRUE(rep.backend->runs());
  EXPECT_THAT(shard_report_table(rep, false),
              HasSubstr("backend cpu: runs every tensor as stored (dense, fp8 block, fp4)"));
  EXPECT_EQ(shard_report_json(rep)["backend"]["runs"], true);

  // A backend of dense weights only (the cuda backend's formats so far): main_proj is the first quantised
  // tensor of the table (after embed and head); 25 fp8 block and 72 fp4 tensors in all.
  check_backend(rep, "dense-only", [](WeightFormat f) { return f == WeightFormat::dense; });
  EXPECT_FALSE(rep.backend->runs());
  EXPECT_EQ(rep.backend->tensor, "mtp.0.main_proj.weight");
  EXPECT_EQ(rep.backend->format, WeightFormat::fp8_block);
  EXPECT_EQ(rep.backend->tensors_not_run, 97u);
  EXPECT_THAT(rep.backend->reason(), AllOf(HasSubstr("'mtp.0.main_proj.weight'"), HasSubstr("fp8 block"),
                                           HasSubstr("dense-only backend does not run")));
  EXPECT_THAT(shard_report_table(rep, false), HasSubstr("backend dense-only: cannot run this checkpoint"));
  const auto j = shard_report_json(rep);
  EXPECT_EQ(j["backend"]["runs"], false);
  EXPECT_EQ(j["backend"]["tensor"], "mtp.0.main_proj.weight");
  EXPECT_EQ(j["backend"]["format"], "fp8_block");
  EXPECT_EQ(j["backend"]["tensors_not_run"], 97);

  // A backend this build lacks.
  check_backend(rep, "cuda", {});
  EXPECT_FALSE(rep.backend->runs());
  EXPECT_FALSE(rep.backend->built);
  EXPECT_THAT(rep.backend->reason(), HasSubstr("this build has no cuda backend"));
  EXPECT_EQ(shard_report_json(rep)["backend"]["built"], false);
}

}  // namespace
}  // namespace dspark
