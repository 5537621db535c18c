#include "lib/checkpoint/synthetic_exl3.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "lib/checkpoint/synthetic_random.hpp"
#include "lib/core/error.hpp"
#include "lib/core/numeric.hpp"

namespace dspark {
namespace {

// exllamav3's marker values (their presence selects the codebook; the loader does not read them).
constexpr uint32_t kMul1Marker = 0x83DCD12Du, kMcgMarker = 0xCBAC1FEDu;

// The codebooks' standard deviations over all 65536 states (SPEC §9).
double codebook_std(const std::string& codebook) {
  if (codebook == "mcg") return 1.24411;
  if (codebook == "3inst") return 1.24371;
  return 1.00031;
}

}  // namespace

std::map<std::string, int64_t> seed_exl3_bits() {
  return {{"head", 6},
          {"main_proj", 5},
          {"attn.wq_a", 4},
          {"attn.wkv", 4},
          {"attn.wq_b", 4},
          {"attn.wo_b", 4},
          {"ffn.shared_experts.w1", 4},
          {"ffn.shared_experts.w3", 4},
          {"ffn.shared_experts.w2", 4},
          {"ffn.experts", 2}};
}

bool synthetic_exl3_tensor(const DrafterTensor& t) {
  if (t.name == "head.weight") return true;
  return t.linear && !t.name.ends_with(".attn.wo_a");
}

std::string synthetic_exl3_base(const DrafterTensor& t) {
  return t.name == "head.weight" ? std::string("head") : t.name;
}

int64_t synthetic_exl3_bits(const DrafterTensor& t, const ModelConfig& cfg) {
  const std::string base = synthetic_exl3_base(t);
  if (const auto it = cfg.exl3.role_bits.find(exl3_role(base)); it != cfg.exl3.role_bits.end())
    return it->second;
  const int64_t k = base == "head" && cfg.exl3.head_bits != 0 ? cfg.exl3.head_bits : cfg.exl3.bits;
  if (k < 1 || k > 8)
    fail("synthetic checkpoint: tensor '{}': no bits per weight (quantization_config.bits or exl3_bits.{})",
         base, exl3_role(base));
  return k;
}

std::vector<TensorSpec> synthetic_exl3_parts(const DrafterTensor& t, const ModelConfig& cfg) {
  const int64_t out = t.shape[0], in = t.shape[1], K = synthetic_exl3_bits(t, cfg);
  if (in % 128 != 0 || out % 128 != 0)
    fail(
        "synthetic checkpoint: tensor '{}': EXL3 needs inputs and outputs in multiples of 128, it is [{}, "
        "{}]",
        t.name, out, in);
  const std::string base = synthetic_exl3_base(t);
  std::vector<TensorSpec> parts = {{base + ".trellis", DType::i16, {in / 16, out / 16, 16 * K}},
                                   {base + ".suh", DType::f16, {in}},
                                   {base + ".svh", DType::f16, {out}}};
  if (cfg.exl3.codebook != "3inst")
    parts.push_back({base + "." + (cfg.exl3.codebook == "mcg" ? "mcg" : "mul1"), DType::i32, {}});
  return parts;
}

void synthetic_trellis_rows(const DrafterTensor& t, const ModelConfig& cfg, uint64_t seed, int64_t row0,
                            int64_t rows, int16_t* dst, int threads) {
  const std::string name = synthetic_exl3_base(t) + ".trellis";
  const int64_t per_row = t.shape[0] / 16 * 16 * synthetic_exl3_bits(t, cfg);  // int16 per tile row
  const uint64_t key = synthetic::tensor_key(seed, name);
  const auto fill = [&](int64_t e0, int64_t e1) {  // four int16 from each 64 random bits
    for (int64_t e = e0; e < e1; ++e) {
      const uint64_t bits = synthetic::element_bits(key, (row0 * per_row + e) / 4);
      dst[e] = static_cast<int16_t>(static_cast<uint16_t>(bits >> (16 * ((row0 * per_row + e) % 4))));
    }
  };
  const int64_t count = rows * per_row;
  const int64_t n = std::clamp<int64_t>(count / (int64_t{1} << 18), 1, std::max(threads, 1));
  if (n == 1) return fill(0, count);
  std::vector<std::jthread> pool;
  for (int64_t k = 0; k < n; ++k) pool.emplace_back(fill, count * k / n, count * (k + 1) / n);
}

std::vector<uint8_t> synthetic_exl3_part(const DrafterTensor& t, const ModelConfig& cfg,
                                         const TensorSpec& part, uint64_t seed) {
  if (part.dtype == DType::i32) {  // the codebook marker
    const uint32_t v = part.name.ends_with(".mcg") ? kMcgMarker : kMul1Marker;
    std::vector<uint8_t> b(sizeof(v));
    std::memcpy(b.data(), &v, sizeof(v));
    return b;
  }
  const bool input = part.name.ends_with(".suh");
  if (!input && !part.name.ends_with(".svh"))
    fail("synthetic checkpoint: '{}' is not an EXL3 scale", part.name);
  const int64_t n = part.shape[0];
  // suh carries 1 / (sqrt(in) * std) so that x' W_dec has the input's scale; the output transform keeps it.
  const double a =
      input ? 1.0 / (std::sqrt(static_cast<double>(t.shape[1])) * codebook_std(cfg.exl3.codebook)) : 1.0;
  const uint64_t key = synthetic::tensor_key(seed, part.name);
  std::vector<uint8_t> b(static_cast<size_t>(n) * sizeof(f16_t));
  auto* v = reinterpret_cast<f16_t*>(b.data());
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t bits = synthetic::element_bits(key, i);
    const double u = static_cast<double>(bits >> 11) * 0x1.0p-53;                // uniform [0, 1)
    const double m = std::exp(0.7 * u - 0.35) * ((bits & 1) != 0 ? -1.0 : 1.0);  // sign from the low bit
    v[i] = float_to_f16(static_cast<float>(a * m));
  }
  return b;
}

}  // namespace dspark
