// Synthetic checkpoints in the released representation (SyntheticFormat::fp8): which tensors are fp8 block,
// fp4 or dense and with what stored shapes; the stored values decode, by the format definitions of SPEC §3
// (decoded here independently), to the bf16 checkpoint's values within each format's rounding bound; the
// bytes do not depend on chunking; the released config.json layout parses back; the loader and the CPU
// drafter take the result.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/checkpoint/synthetic.hpp"
#include "lib/checkpoint/tensor_table.hpp"
#include "lib/config/model_config.hpp"
#include "lib/core/block_quant.hpp"
#include "lib/core/error.hpp"
#include "lib/core/numeric.hpp"
#include "lib/model/drafter.hpp"
#include "lib/model/load_weights.hpp"
#include "tests/support/golden_case.hpp"
#include "tests/support/tiny_checkpoint.hpp"

namespace dspark {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// SPEC §3's decoders, written from the definitions (not lib/core's).
double e8m0(uint8_t b) {
  return std::ldexp(1.0, b - 127);
}
double e4m3(uint8_t b) {
  const int exp = (b >> 3) & 15, man = b & 7;
  const double mag = exp == 0 ? man * std::ldexp(1.0, -9) : (1.0 + man / 8.0) * std::ldexp(1.0, exp - 7);
  return (b & 0x80) ? -mag : mag;
}
double e2m1(uint8_t code) {
  static const double kMag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8) ? -kMag[code & 7] : kMag[code & 7];
}
// The scale byte of a block with largest magnitude amax and largest code max_code: 2^ceil(log2(amax / max)).
int expected_scale_byte(double amax, double max_code) {
  return static_cast<int>(std::ceil(std::log2(amax / max_code))) + 127;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <typename T>
std::vector<T> read_all(const Checkpoint& ck, const std::string& name) {
  const TensorInfo& info = ck.get(name);
  std::vector<T> v(info.nbytes / sizeof(T));
  ck.read(name, v.data());
  return v;
}

fs::path write(const std::string& name, SyntheticFormat f, ConfigLayout layout, SyntheticOptions opt = {}) {
  const fs::path dir = test::scratch_dir(name);
  opt.force = true;
  write_synthetic_checkpoint(synthetic_model_config(tiny_model_config(), f, layout), dir, opt);
  return dir;
}

constexpr uint64_t kSeed = 5;

class SyntheticFp8 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    bf16_ = write("bf16", SyntheticFormat::bf16, ConfigLayout::inference, {.seed = kSeed});
    fp8_ = write("fp8", SyntheticFormat::fp8, ConfigLayout::inference, {.seed = kSeed});
  }
  static fs::path bf16_, fp8_;
};
fs::path SyntheticFp8::bf16_, SyntheticFp8::fp8_;

TEST_F(SyntheticFp8, TheReleasedTensorsAreFp8BlockAndFp4) {
  const Checkpoint ck(fp8_);
  // The tiny config (H 256, q_lora 128, 8 heads of 128, 4 groups of 128, I 512, 8 experts, 3 stages) in
  // 32 x 32 blocks.
  auto expect = [&](const std::string& name, DType dt, const Shape& shape) {
    const TensorInfo* t = ck.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, dt) << name;
    EXPECT_EQ(t->shape, shape) << name;
  };
  expect("mtp.0.main_proj.weight", DType::f8_e4m3, {256, 768});
  expect("mtp.0.main_proj.scale", DType::f8_e8m0, {8, 24});
  expect("mtp.1.attn.wq_a.weight", DType::f8_e4m3, {128, 256});
  expect("mtp.1.attn.wq_a.scale", DType::f8_e8m0, {4, 8});
  expect("mtp.2.attn.wq_b.scale", DType::f8_e8m0, {32, 4});  // [1024, 128]
  expect("mtp.0.attn.wkv.scale", DType::f8_e8m0, {4, 8});    // [128, 256]
  expect("mtp.0.attn.wo_a.scale", DType::f8_e8m0, {16, 8});  // [512, 256]
  expect("mtp.0.attn.wo_b.scale", DType::f8_e8m0, {8, 16});  // [256, 512]
  expect("mtp.2.ffn.shared_experts.w2.scale", DType::f8_e8m0, {8, 16});
  expect("mtp.1.ffn.experts.3.w1.weight", DType::i8, {512, 128});  // [512, 256], two codes a byte
  expect("mtp.1.ffn.experts.3.w1.scale", DType::f8_e8m0, {512, 8});
  expect("mtp.1.ffn.experts.3.w2.weight", DType::i8, {256, 256});  // [256, 512]
  expect("mtp.1.ffn.experts.3.w2.scale", DType::f8_e8m0, {256, 16});
  expect("head.weight", DType::bf16, {1024, 256});
  expect("mtp.0.ffn.gate.weight", DType::bf16, {8, 256});
  expect("mtp.2.markov_head.head.weight", DType::bf16, {1024, 32});
  expect("mtp.0.hc_attn_fn", DType::f32, {24, 1024});
  EXPECT_FALSE(ck.has("head.scale"));

  // As the released checkpoint (golden/tiny-v41-fp8's README): 25 fp8 block and 72 fp4 weights, each with a
  // scale, beside the 46 dense tensors.
  int fp8 = 0, fp4 = 0, scales = 0;
  for (const std::string& n : ck.names()) {
    const DType d = ck.get(n).dtype;
    fp8 += d == DType::f8_e4m3;
    fp4 += d == DType::i8;
    scales += d == DType::f8_e8m0;
  }
  EXPECT_EQ(fp8, 25);
  EXPECT_EQ(fp4, 72);
  EXPECT_EQ(scales, 97);
  EXPECT_EQ(ck.names().size(), 143u + 97u);
}

TEST_F(SyntheticFp8, DenseTensorsAreTheBf16CheckpointsBytes) {
  const Checkpoint a(bf16_), b(fp8_);
  for (const char* name : {"embed.weight", "head.weight", "mtp.1.ffn.gate.weight", "mtp.0.hc_ffn_fn",
                           "mtp.2.confidence_head.proj.weight", "mtp.1.attn.attn_sink"})
    EXPECT_EQ(read_all<uint8_t>(a, name), read_all<uint8_t>(b, name)) << name;
}

TEST_F(SyntheticFp8, Fp8BlockValuesAreTheBf16ValuesWithinHalfAnE4m3Step) {
  const Checkpoint dense(bf16_), q(fp8_);
  for (const char* base : {"mtp.0.main_proj", "mtp.0.attn.wq_a", "mtp.1.attn.wq_b", "mtp.2.attn.wkv",
                           "mtp.1.attn.wo_a", "mtp.0.attn.wo_b", "mtp.2.ffn.shared_experts.w3"}) {
    const std::string b(base);
    const std::vector<bf16_t> w = read_all<bf16_t>(dense, b + ".weight");
    const std::vector<uint8_t> codes = read_all<uint8_t>(q, b + ".weight");
    const std::vector<uint8_t> sc = read_all<uint8_t>(q, b + ".scale");
    const int64_t rows = dense.get(b + ".weight").shape[0], cols = dense.get(b + ".weight").shape[1];
    const int64_t bc = cols / 32;
    ASSERT_EQ(codes.size(), w.size()) << b;
    ASSERT_EQ(static_cast<int64_t>(sc.size()), rows / 32 * bc) << b;
    for (int64_t br = 0; br < rows / 32; ++br)
      for (int64_t bcol = 0; bcol < bc; ++bcol) {
        double amax = 0;
        for (int64_t r = br * 32; r < br * 32 + 32; ++r)
          for (int64_t c = bcol * 32; c < bcol * 32 + 32; ++c)
            amax = std::max(amax, std::fabs(double(bf16_to_float(w[r * cols + c]))));
        const uint8_t byte = sc[br * bc + bcol];
        ASSERT_EQ(byte, expected_scale_byte(amax, 448.0)) << b << " block " << br << "," << bcol;
        const double s = e8m0(byte);
        for (int64_t r = br * 32; r < br * 32 + 32; ++r)
          for (int64_t c = bcol * 32; c < bcol * 32 + 32; ++c) {
            const double want = bf16_to_float(w[r * cols + c]), got = e4m3(codes[r * cols + c]) * s;
            // Half an e4m3 step: 3 mantissa bits give 2^-4 relative for normals, 2^-10 * s absolute below
            // the smallest normal (2^-6 * s).
            ASSERT_LE(std::fabs(got - want), std::max(std::fabs(want) * 0x1p-4, 0x1p-10 * s))
                << b << " [" << r << ", " << c << "]";
          }
      }
  }
}

TEST_F(SyntheticFp8, Fp4ValuesAreTheBf16ValuesWithinHalfAnE2m1Step) {
  const Checkpoint dense(bf16_), q(fp8_);
  for (const char* base : {"mtp.0.ffn.experts.0.w1", "mtp.1.ffn.experts.5.w3", "mtp.2.ffn.experts.7.w2"}) {
    const std::string b(base);
    const std::vector<bf16_t> w = read_all<bf16_t>(dense, b + ".weight");
    const std::vector<uint8_t> packed = read_all<uint8_t>(q, b + ".weight");
    const std::vector<uint8_t> sc = read_all<uint8_t>(q, b + ".scale");
    const int64_t rows = dense.get(b + ".weight").shape[0], cols = dense.get(b + ".weight").shape[1];
    ASSERT_EQ(static_cast<int64_t>(packed.size()), rows * cols / 2) << b;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < cols / 32; ++g) {
        double amax = 0;
        for (int64_t c = g * 32; c < g * 32 + 32; ++c)
          amax = std::max(amax, std::fabs(double(bf16_to_float(w[r * cols + c]))));
        const uint8_t byte = sc[r * (cols / 32) + g];
        ASSERT_EQ(byte, expected_scale_byte(amax, 6.0)) << b << " row " << r << " group " << g;
        const double s = e8m0(byte);
        for (int64_t c = g * 32; c < g * 32 + 32; ++c) {
          const uint8_t byte_c = packed[(r * cols + c) / 2];
          const uint8_t code = c % 2 == 0 ? (byte_c & 15) : (byte_c >> 4);  // low nibble = even element
          const double want = bf16_to_float(w[r * cols + c]), got = e2m1(code) * s;
          // Steps of 0.5 up to 2, 1 up to 4, 2 up to 6 (times s): half a step is at most max(s / 4, |w| / 4).
          ASSERT_LE(std::fabs(got - want), std::max(s / 4, std::fabs(want) / 4))
              << b << " [" << r << ", " << c << "]";
        }
      }
  }
}

TEST_F(SyntheticFp8, BytesDoNotDependOnChunksOrThreads) {
  SyntheticOptions opt{.seed = kSeed};
  opt.chunk_bytes = 5000;  // a few rows, not a whole number of 32-row blocks of any weight
  opt.threads = 3;
  const fs::path other = write("fp8-chunked", SyntheticFormat::fp8, ConfigLayout::inference, opt);
  EXPECT_TRUE(file_bytes(fp8_ / "model.safetensors") == file_bytes(other / "model.safetensors"));
}

TEST_F(SyntheticFp8, LoadsWithTheReleasedFormats) {
  const Checkpoint ck(fp8_);
  const ModelConfig cfg = load_model_config(ck.config_path());
  EXPECT_EQ(cfg.dtype, "fp8");
  EXPECT_EQ(cfg.expert_dtype, "fp4");
  EXPECT_EQ(cfg.quant_method, "fp8");
  EXPECT_EQ(cfg.weight_block_size, 32);
  CpuBackend be;
  const DrafterWeights w = load_drafter_weights(ck, cfg, make_shard_plan(cfg, 0, 1), be);
  EXPECT_EQ(w.main_proj.format, WeightFormat::fp8_block);
  EXPECT_EQ(w.stages[0].wq_a.format, WeightFormat::fp8_block);
  EXPECT_EQ(w.stages[1].wq_b.format, WeightFormat::fp8_block);
  EXPECT_EQ(w.stages[2].wkv.format, WeightFormat::fp8_block);
  EXPECT_EQ(w.stages[0].wo_a.format, WeightFormat::fp8_block);
  EXPECT_EQ(w.stages[1].wo_b.format, WeightFormat::fp8_block);
  EXPECT_EQ(w.stages[2].shared.w2.format, WeightFormat::fp8_block);
  EXPECT_EQ(w.stages[1].experts[6].w3.format, WeightFormat::fp4);
  EXPECT_EQ(w.head.format, WeightFormat::dense);
  EXPECT_EQ(w.stages[0].wq_b.block, 32);
  EXPECT_EQ(w.stages[0].wq_b.scale.shape, (Shape{32, 4}));
  EXPECT_EQ(w.stages[0].experts[0].w2.scale.shape, (Shape{256, 16}));
  // 9.58 MB of payload: the dense tensors as in bf16, each fp8 weight 1 byte + 1/1024 scale per element,
  // each fp4 one 1/2 + 1/32.
  EXPECT_LT(w.bytes, 10'000'000u);
}

TEST_F(SyntheticFp8, TheCpuDrafterDraftsOnIt) {
  const Checkpoint ck(fp8_);
  const ModelConfig cfg = load_model_config(ck.config_path());
  CpuBackend be;
  LocalCommunicator comm;
  const ShardPlan plan = make_shard_plan(cfg, 0, 1);
  DrafterOptions opt;
  opt.slots = 2;
  opt.max_batch = 2;
  Drafter d(cfg, load_drafter_weights(ck, cfg, plan, be), plan, be, comm, opt);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (int s = 0; s < 2; ++s) {
    std::vector<bf16_t> rows(static_cast<size_t>(20 * cfg.row_dim()));
    for (auto& v : rows) v = float_to_bf16(normal(rng));
    d.insert(s, 0, rows.data(), 20);
  }
  const std::vector<DraftRequest> reqs = {{0, 17, 20, -1, 0}, {1, 900, 20, -1, 0}};
  const DraftResult r = d.draft(reqs);
  ASSERT_EQ(r.ids.size(), 10u);
  for (size_t i = 0; i < r.ids.size(); ++i) {
    EXPECT_GE(r.ids[i], 0);
    EXPECT_LT(r.ids[i], cfg.vocab_size);
    EXPECT_TRUE(std::isfinite(r.conf[i]) && r.conf[i] > 0 && r.conf[i] < 1) << r.conf[i];
    EXPECT_TRUE(std::isfinite(r.margin[i]) && r.margin[i] >= 0) << r.margin[i];
  }
}

TEST(SyntheticReleaseLayout, Fp8ConfigJsonHasTheReleasedShapeAndParsesBack) {
  const fs::path dir = write("fp8-release", SyntheticFormat::fp8, ConfigLayout::release, {.seed = kSeed});
  std::ifstream in(dir / "config.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["architectures"][0], "DeepseekV41ForCausalLM");
  EXPECT_EQ(j["model_type"], "deepseek_v41");
  EXPECT_FALSE(j.contains("dim"));
  EXPECT_EQ(j["text_config"]["hidden_size"], 256);
  EXPECT_EQ(j["text_config"]["qk_rope_head_dim"], 32);
  EXPECT_EQ(j["text_config"]["sliding_window"], 16);
  EXPECT_EQ(j["text_config"]["num_nextn_predict_layers"], 3);
  EXPECT_EQ(j["quantization_config"]["quant_method"], "fp8");
  EXPECT_EQ(j["quantization_config"]["expert_dtype"], "fp4");
  EXPECT_EQ(j["quantization_config"]["weight_block_size"], nlohmann::json::parse("[32, 32]"));

  const Checkpoint ck(dir);
  const ModelConfig c = load_model_config(ck.config_path());
  EXPECT_EQ(c.layout, ConfigLayout::release);
  EXPECT_EQ(c.dtype, "fp8");
  EXPECT_EQ(c.expert_dtype, "fp4");
  EXPECT_EQ(c.dim, 256);
  EXPECT_EQ(c.window_size, 16);
  EXPECT_EQ(c.vocab_size, 1024);
  ModelConfig want = tiny_model_config();
  want.layout = ConfigLayout::release;
  want.dtype = "fp8";
  want.expert_dtype = "fp4";
  EXPECT_TRUE(c == want);
  CpuBackend be;
  EXPECT_EQ(load_drafter_weights(ck, c, make_shard_plan(c, 0, 1), be).stages[0].wkv.format,
            WeightFormat::fp8_block);
  // The tensors are those of the inference layout's checkpoint.
  const fs::path same =
      write("fp8-inference", SyntheticFormat::fp8, ConfigLayout::inference, {.seed = kSeed});
  EXPECT_TRUE(file_bytes(dir / "model.safetensors") == file_bytes(same / "model.safetensors"));
}

TEST(SyntheticReleaseLayout, Bf16ConfigJsonHasNoQuantMethodAndParsesBack) {
  const fs::path dir = write("bf16-release", SyntheticFormat::bf16, ConfigLayout::release);
  std::ifstream in(dir / "config.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_FALSE(j["quantization_config"].contains("quant_method"));
  const Checkpoint ck(dir);
  const ModelConfig c = load_model_config(ck.config_path());
  EXPECT_EQ(c.layout, ConfigLayout::release);
  EXPECT_EQ(c.dtype, "bf16");
  EXPECT_EQ(c.quant_method, "");
  CpuBackend be;
  EXPECT_EQ(load_drafter_weights(ck, c, make_shard_plan(c, 0, 1), be).stages[0].wkv.format,
            WeightFormat::dense);
}

TEST(SyntheticQuantized, AnFp4WeightNeedsWholeGroupsOf32Inputs) {
  ModelConfig cfg =
      synthetic_model_config(tiny_model_config(), SyntheticFormat::fp8, ConfigLayout::inference);
  cfg.moe_inter_dim = 496;  // w2 is [256, 496]: 496 inputs are not a multiple of 32
  const fs::path dir = test::scratch_root() / "fp4-496";
  try {
    write_synthetic_checkpoint(cfg, dir);
    ADD_FAILURE() << "written";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("'mtp.0.ffn.experts.0.w2'"));
    EXPECT_THAT(e.what(), HasSubstr("multiple of 32"));
  }
  EXPECT_FALSE(fs::exists(dir));
}

TEST(SyntheticQuantized, TheWeightRulesReproduceTheGoldenFp8Checkpoint) {
  // golden/tiny-v41-fp8 is golden/tiny-v41's dense weights quantised by an independent implementation: the
  // rules the writer applies (lib/core/block_quant) give the same bytes.
  const fs::path dense_dir = test::golden_case_dir("tiny-v41") / "ckpt";
  const fs::path fp8_dir = test::golden_case_dir("tiny-v41-fp8") / "ckpt";
  if (!fs::exists(dense_dir / "config.json") || !fs::exists(fp8_dir / "config.json"))
    GTEST_SKIP() << "no golden cases under " << DSPARK_SHARED_DIR;
  const Checkpoint dense(dense_dir), q(fp8_dir);
  int checked = 0;
  for (const std::string& name : q.names()) {
    if (!name.ends_with(".scale")) continue;
    const std::string base = name.substr(0, name.size() - 6);
    const TensorInfo& d = dense.get(base + ".weight");
    std::vector<float> w;
    for (bf16_t v : read_all<bf16_t>(dense, base + ".weight")) w.push_back(bf16_to_float(v));
    std::vector<uint8_t> codes(q.get(base + ".weight").nbytes), scales(q.get(name).nbytes);
    if (q.get(base + ".weight").dtype == DType::f8_e4m3)
      quantize_fp8_block(w.data(), d.shape[0], d.shape[1], 32, codes.data(), scales.data());
    else
      quantize_fp4(w.data(), d.shape[0], d.shape[1], codes.data(), scales.data());
    EXPECT_EQ(codes, read_all<uint8_t>(q, base + ".weight")) << base;
    EXPECT_EQ(scales, read_all<uint8_t>(q, name)) << base;
    ++checked;
  }
  EXPECT_EQ(checked, 25 + 72);
}

}  // namespace
}  // namespace dspark
