// The EXL3 decoder (SPEC §9) against hand-built streams, identities of the format and the golden decoder
// vectors (`../shared/golden/tiny-v41-exl3/exl3_vectors.json`, from an implementation checked against
// exllamav3's own kernels).
#include "lib/core/exl3.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "lib/core/error.hpp"
#include "tests/support/golden.hpp"

namespace dspark {
namespace {

std::vector<int16_t> random_tile(int K, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<int16_t> t(static_cast<size_t>(16 * K));
  for (int16_t& v : t) v = static_cast<int16_t>(g());
  return t;
}

// Stream bits [first, first + n) of a tile read by hand from its words (most significant bit first).
uint32_t bits(const std::vector<int16_t>& tile, int64_t first, int n) {
  const int64_t L = static_cast<int64_t>(tile.size()) * 16;
  uint32_t v = 0;
  for (int64_t b = first; b < first + n; ++b) {
    const int64_t at = ((b % L) + L) % L;
    const auto w = static_cast<size_t>(at / 32);
    const uint32_t word = static_cast<uint16_t>(tile[2 * w]) |
                          static_cast<uint32_t>(static_cast<uint16_t>(tile[2 * w + 1])) << 16;
    v = (v << 1) | ((word >> (31 - at % 32)) & 1u);
  }
  return v;
}

nlohmann::json vectors() {
  std::ifstream f(DSPARK_SHARED_DIR "/golden/tiny-v41-exl3/exl3_vectors.json");
  EXPECT_TRUE(f.good()) << "exl3_vectors.json";
  return nlohmann::json::parse(f);
}

TEST(Exl3, CodebooksAreNamedAsConfigJsonNamesThem) {
  EXPECT_EQ(exl3_codebook_named("3inst"), Exl3Codebook::inst3);
  EXPECT_EQ(exl3_codebook_named("mcg"), Exl3Codebook::mcg);
  EXPECT_EQ(exl3_codebook_named("mul1"), Exl3Codebook::mul1);
  EXPECT_THROW(exl3_codebook_named("int8"), Error);
}

TEST(Exl3, TheFirstStateWrapsAroundTheStream) {
  // K = 8: state 0 is stream bits [-8, 8): the last word's low byte, then the first word's high byte.
  std::vector<int16_t> tile(128, 0);
  tile[1] = static_cast<int16_t>(0xABCD);    // stream bits 0..15
  tile[126] = static_cast<int16_t>(0x0012);  // the last 16 stream bits
  EXPECT_EQ(exl3_state(tile, 8, 0), 0x12AB);
  EXPECT_EQ(exl3_state(tile, 8, 1), 0xABCD);
  EXPECT_EQ(exl3_state(tile, 8, 2), 0xCD00);
}

TEST(Exl3, StatesAreAShiftRegisterOfKBitsPerElement) {
  for (int K = 1; K <= 8; ++K) {
    const std::vector<int16_t> tile = random_tile(K, 100u + static_cast<unsigned>(K));
    for (int t = 0; t < 256; ++t) {
      const uint32_t code = bits(tile, int64_t{t} * K, K);
      const uint16_t prev = exl3_state(tile, K, (t + 255) % 256);
      EXPECT_EQ(exl3_state(tile, K, t), static_cast<uint16_t>((prev << K) | code)) << K << " " << t;
    }
  }
}

TEST(Exl3, EveryTileElementHasItsOwnPlace) {
  std::vector<int> seen(256, 0);
  for (int t = 0; t < 256; ++t) {
    const Exl3Place p = exl3_place(t);
    ++seen[static_cast<size_t>(p.row * 16 + p.col)];
  }
  for (int n : seen) EXPECT_EQ(n, 1);
  EXPECT_EQ(exl3_place(0).row, 0);
  EXPECT_EQ(exl3_place(2).row, 8);   // j = 2: row r0 + 8
  EXPECT_EQ(exl3_place(4).col, 8);   // j = 4: column c0 + 8
  EXPECT_EQ(exl3_place(8).row, 2);   // lane 1: r0 = 2
  EXPECT_EQ(exl3_place(32).col, 1);  // lane 4: c0 = 1
}

TEST(Exl3, CodebookTablesHaveTheirPublishedStatistics) {
  DSPARK_SKIP_WITHOUT_GOLDEN_CASE("tiny-v41-exl3");
  const nlohmann::json v = vectors();
  for (const char* name : {"3inst", "mcg", "mul1"}) {
    const nlohmann::json& want = v["codebooks"][name];
    double sum = 0, sq = 0, lo = 1e9, hi = -1e9;
    for (uint32_t s = 0; s < 65536; ++s) {
      const double w = f16_to_float(exl3_weight(static_cast<uint16_t>(s), exl3_codebook_named(name)));
      sum += w;
      sq += w * w;
      lo = std::min(lo, w);
      hi = std::max(hi, w);
    }
    const double mean = sum / 65536, sd = std::sqrt(sq / 65536 - mean * mean);
    EXPECT_NEAR(mean, want["mean"].get<double>(), 1e-9) << name;
    EXPECT_NEAR(sd, want["std"].get<double>(), 1e-6) << name;
    EXPECT_EQ(lo, want["min"].get<double>()) << name;
    EXPECT_EQ(hi, want["max"].get<double>()) << name;
    const std::vector<int> first = want["first8_f16_bits"];
    for (size_t s = 0; s < first.size(); ++s)
      EXPECT_EQ(exl3_weight(static_cast<uint16_t>(s), exl3_codebook_named(name)), first[s])
          << name << " " << s;
  }
  // SPEC §9's figures, to its rounding.
  EXPECT_NEAR(v["codebooks"]["3inst"]["std"].get<double>(), 1.24371, 1e-5);
  EXPECT_NEAR(v["codebooks"]["mul1"]["std"].get<double>(), 1.00031, 1e-5);
}

TEST(Exl3, GoldenTilesDecodeToTheirStatesAndWeights) {
  DSPARK_SKIP_WITHOUT_GOLDEN_CASE("tiny-v41-exl3");
  const nlohmann::json v = vectors();
  ASSERT_EQ(v["tiles"].size(), 24u);
  for (const nlohmann::json& t : v["tiles"]) {
    const int K = t["K"];
    const std::vector<int16_t> tile = t["trellis_i16"];
    const std::vector<int> states = t["states"];
    for (int e = 0; e < 256; ++e) ASSERT_EQ(exl3_state(tile, K, e), states[static_cast<size_t>(e)]) << K;
    std::vector<f16_t> got(256);
    exl3_decode_tile(tile, K, exl3_codebook_named(t["codebook"].get<std::string>()), got);
    const std::vector<std::vector<int>> want = t["w_dec_f16_bits"];
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c)
        EXPECT_EQ(got[static_cast<size_t>(r * 16 + c)], want[static_cast<size_t>(r)][static_cast<size_t>(c)])
            << t["codebook"] << " K " << K << " at " << r << "," << c;
  }
}

TEST(Exl3, TheHadamardButterflyTwiceIs128TimesTheIdentity) {
  for (int i = 0; i < 128; ++i) {
    std::array<float, 128> e{};
    e[static_cast<size_t>(i)] = 1.0f;
    fwht128(e);
    for (float x : e) ASSERT_EQ(std::abs(x), 1.0f);  // a Sylvester row: +-1 everywhere
    fwht128(e);
    for (int j = 0; j < 128; ++j) EXPECT_EQ(e[static_cast<size_t>(j)], j == i ? 128.0f : 0.0f);
  }
}

TEST(Exl3, GoldenLinearsGiveTheirTransformedInputExactlyAndTheirOutputWithinFp32Rounding) {
  DSPARK_SKIP_WITHOUT_GOLDEN_CASE("tiny-v41-exl3");
  const nlohmann::json v = vectors();
  ASSERT_EQ(v["linears"].size(), 3u);
  for (const nlohmann::json& l : v["linears"]) {
    const int64_t in = l["in"], out = l["out"];
    const int K = l["K"];
    const std::vector<int16_t> trellis = l["trellis_i16"];
    const std::vector<f16_t> suh = l["suh_f16_bits"], svh = l["svh_f16_bits"];
    std::vector<f16_t> w(static_cast<size_t>(in * out));
    exl3_decode(trellis, in, out, K, exl3_codebook_named(l["codebook"].get<std::string>()), w);
    const std::vector<std::vector<int>> xs = l["x_bf16_bits"], had = l["x_had_f16_bits"];
    const std::vector<std::vector<double>> ys = l["y_f32"];
    for (size_t row = 0; row < xs.size(); ++row) {
      std::vector<float> x(static_cast<size_t>(in)), y(static_cast<size_t>(out));
      for (int64_t i = 0; i < in; ++i)
        x[static_cast<size_t>(i)] = bf16_to_float(static_cast<bf16_t>(xs[row][static_cast<size_t>(i)]));
      std::vector<f16_t> x_had(static_cast<size_t>(in));
      exl3_forward(x, suh, w, svh, y, x_had);
      for (int64_t i = 0; i < in; ++i)
        EXPECT_EQ(x_had[static_cast<size_t>(i)], had[row][static_cast<size_t>(i)]) << i;
      double scale = 0;
      for (double t : ys[row]) scale = std::max(scale, std::abs(t));
      for (int64_t o = 0; o < out; ++o)
        EXPECT_NEAR(y[static_cast<size_t>(o)], ys[row][static_cast<size_t>(o)], 1e-5 * std::max(1.0, scale))
            << l["codebook"] << " row " << row << " out " << o;
    }
  }
}

// The transform-domain forward against decode-then-dense: W_real = diag(suh) H W_dec H diag(svh) (H the
// scaled 128-point Hadamard blocks) applied in double to the fp16 input, within the rounding of the forward's
// two fp16 intermediates.
TEST(Exl3, TheForwardIsTheDenseProductOfTheTransformedWeights) {
  DSPARK_SKIP_WITHOUT_GOLDEN_CASE("tiny-v41-exl3");
  const nlohmann::json v = vectors();
  for (const nlohmann::json& l : v["linears"]) {
    const int64_t in = l["in"], out = l["out"];
    const std::vector<int16_t> trellis = l["trellis_i16"];
    const std::vector<f16_t> suh = l["suh_f16_bits"], svh = l["svh_f16_bits"];
    std::vector<f16_t> w(static_cast<size_t>(in * out));
    exl3_decode(trellis, in, out, l["K"], exl3_codebook_named(l["codebook"].get<std::string>()), w);
    const auto hadamard = [](int64_t a, int64_t b) {  // the scaled Sylvester entry of one 128-block
      if (a / 128 != b / 128) return 0.0;
      return (__builtin_popcountll(static_cast<uint64_t>((a % 128) & (b % 128))) % 2 ? -1.0 : 1.0) /
             std::sqrt(128.0);
    };
    const std::vector<std::vector<int>> xs = l["x_bf16_bits"];
    std::vector<float> x(static_cast<size_t>(in)), y(static_cast<size_t>(out));
    for (int64_t i = 0; i < in; ++i)
      x[static_cast<size_t>(i)] = bf16_to_float(static_cast<bf16_t>(xs[0][static_cast<size_t>(i)]));
    exl3_forward(x, suh, w, svh, y);
    // u = (x16 suh) H, z = u W_dec, y = z H svh.
    std::vector<double> u(static_cast<size_t>(in), 0.0), z(static_cast<size_t>(out), 0.0);
    for (int64_t j = 0; j < in; ++j)
      for (int64_t i = 0; i < in; ++i)
        u[static_cast<size_t>(j)] +=
            round_f16(x[static_cast<size_t>(i)]) * f16_to_float(suh[static_cast<size_t>(i)]) * hadamard(i, j);
    for (int64_t i = 0; i < in; ++i)
      for (int64_t o = 0; o < out; ++o)
        z[static_cast<size_t>(o)] +=
            u[static_cast<size_t>(i)] * f16_to_float(w[static_cast<size_t>(i * out + o)]);
    double scale = 0;
    std::vector<double> dense(static_cast<size_t>(out), 0.0);
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t c = 0; c < out; ++c)
        dense[static_cast<size_t>(o)] += z[static_cast<size_t>(c)] * hadamard(c, o);
      dense[static_cast<size_t>(o)] *= f16_to_float(svh[static_cast<size_t>(o)]);
      scale = std::max(scale, std::abs(dense[static_cast<size_t>(o)]));
    }
    for (int64_t o = 0; o < out; ++o)
      EXPECT_NEAR(y[static_cast<size_t>(o)], dense[static_cast<size_t>(o)], 4e-3 * scale) << o;
  }
}

// A 128-aligned shard of the trellis (an output split: tiles of dim 1; an input split: dim 0) decodes to the
// slice of the whole decode, bit for bit.
// The transposed layout holds the same values, W_dec[i, o] at row o.
TEST(Exl3, TheOutInLayoutIsTheTransposeOfTheInOutOne) {
  const int K = 2, in = 128, out = 256;
  std::mt19937 g(7);
  std::vector<int16_t> trellis(static_cast<size_t>(in / 16 * out / 16 * 16 * K));
  for (int16_t& t : trellis) t = static_cast<int16_t>(g());
  std::vector<f16_t> io(static_cast<size_t>(in * out)), oi(io.size());
  exl3_decode(trellis, in, out, K, Exl3Codebook::mcg, io);
  exl3_decode(trellis, in, out, K, Exl3Codebook::mcg, oi, Exl3Layout::out_in);
  for (int i = 0; i < in; ++i)
    for (int o = 0; o < out; ++o)
      ASSERT_EQ(oi[static_cast<size_t>(o * in + i)], io[static_cast<size_t>(i * out + o)]) << i << " " << o;
}

TEST(Exl3, AShardDecodesToTheSliceOfTheWholeDecode) {
  const int K = 3, in = 256, out = 256, per = 16 * K;
  std::mt19937 g(5);
  std::vector<int16_t> trellis(static_cast<size_t>(in / 16 * out / 16 * per));
  for (int16_t& t : trellis) t = static_cast<int16_t>(g());
  std::vector<f16_t> whole(static_cast<size_t>(in * out));
  exl3_decode(trellis, in, out, K, Exl3Codebook::mul1, whole);
  // Output columns [128, 256): tiles 8..15 of dim 1 in every row of tiles.
  std::vector<int16_t> cols;
  for (int ti = 0; ti < in / 16; ++ti)
    cols.insert(cols.end(), trellis.begin() + (ti * 16 + 8) * per, trellis.begin() + (ti * 16 + 16) * per);
  std::vector<f16_t> part(static_cast<size_t>(in * 128));
  exl3_decode(cols, in, 128, K, Exl3Codebook::mul1, part);
  for (int r = 0; r < in; ++r)
    for (int c = 0; c < 128; ++c)
      ASSERT_EQ(part[static_cast<size_t>(r * 128 + c)], whole[static_cast<size_t>(r * out + 128 + c)]);
  // Input rows [0, 128): the first 8 rows of tiles.
  const std::vector<int16_t> rows(trellis.begin(), trellis.begin() + 8 * 16 * per);
  exl3_decode(rows, 128, out, K, Exl3Codebook::mul1, part);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin()));
}

TEST(Exl3, MalformedShapesAndBitWidthsAreRefusedNamingThem) {
  const std::vector<int16_t> tile = random_tile(2, 7);
  EXPECT_THROW(exl3_state(tile, 0, 0), Error);
  EXPECT_THROW(exl3_state(tile, 9, 0), Error);
  EXPECT_THROW(exl3_state(tile, 3, 0), Error);  // 32 values are a K = 2 tile
  std::vector<f16_t> w(24 * 16);
  try {
    exl3_decode(std::vector<int16_t>(32, 0), 24, 16, 2, Exl3Codebook::mul1, w);
    ADD_FAILURE() << "24 rows decoded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("24 x 16 is not made of 16 x 16 tiles"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dspark
