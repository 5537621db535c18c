#include "lib/checkpoint/synthetic_quantized.hpp"

#include <algorithm>
#include <thread>
#include <vector>

#include "lib/checkpoint/synthetic.hpp"
#include "lib/core/block_quant.hpp"
#include "lib/core/error.hpp"
#include "lib/core/numeric.hpp"

namespace dspark {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// What one quantisation unit (a scale's rows: B for fp8 block, 1 for fp4) of an [out, in] weight takes.
struct Layout {
  int64_t unit_rows;         // rows sharing a scale row
  int64_t weight_row_bytes;  // stored bytes of one weight row
  int64_t scale_unit_bytes;  // scale bytes of one unit
};

Layout layout_of(WeightFormat f, int64_t in, int64_t block) {
  if (f == WeightFormat::fp8_block) return {block, in, ceil_div(in, block)};
  return {1, in / 2, in / kFp4Block};
}

// Rows [r0, r1) (whole units, relative to the range's first row row0) quantised into the range's buffers,
// at most about kScratch source values at a time.
void quantize_rows(const DrafterTensor& t, WeightFormat f, int64_t block, uint64_t seed, int64_t row0,
                   int64_t r0, int64_t r1, uint8_t* weight, uint8_t* scale) {
  constexpr int64_t kScratch = int64_t{1} << 16;
  const int64_t in = t.shape[1];
  const Layout L = layout_of(f, in, block);
  const int64_t step = std::max<int64_t>(1, kScratch / (L.unit_rows * in)) * L.unit_rows;
  std::vector<bf16_t> raw;
  std::vector<float> w;
  for (int64_t a = r0; a < r1; a += step) {
    const int64_t n = std::min(step, r1 - a);
    raw.resize(static_cast<size_t>(n * in));
    w.resize(raw.size());
    synthetic_values(t, seed, (row0 + a) * in, n * in, raw.data());
    std::transform(raw.begin(), raw.end(), w.begin(), bf16_to_float);
    uint8_t* wq = weight + a * L.weight_row_bytes;
    uint8_t* sc = scale + a / L.unit_rows * L.scale_unit_bytes;
    if (f == WeightFormat::fp8_block)
      quantize_fp8_block(w.data(), n, in, block, wq, sc);
    else
      quantize_fp4(w.data(), n, in, wq, sc);
  }
}

}  // namespace

void synthetic_quantized_rows(const DrafterTensor& t, WeightFormat f, int64_t block, uint64_t seed,
                              int64_t row0, int64_t rows, uint8_t* weight, uint8_t* scale, int threads) {
  if (f != WeightFormat::fp8_block && f != WeightFormat::fp4)
    fail("synthetic checkpoint: tensor '{}': {} is not a quantised format it writes", t.name,
         weight_format_name(f));
  if (!t.linear || t.shape.size() != 2 || t.dense_dtype != DType::bf16)
    fail("synthetic checkpoint: tensor '{}' is not a bf16 linear weight and cannot be stored {}",
         t.weight_name(), weight_format_name(f));
  const int64_t out = t.shape[0], in = t.shape[1];
  if (f == WeightFormat::fp4 && in % kFp4Block != 0)
    fail("synthetic checkpoint: tensor '{}': fp4 needs a multiple of {} inputs, it has {}", t.name, kFp4Block,
         in);
  if (block <= 0) fail("synthetic checkpoint: tensor '{}': block size {} is not positive", t.name, block);
  const Layout L = layout_of(f, in, block);
  if (row0 < 0 || rows < 0 || row0 + rows > out || row0 % L.unit_rows != 0 ||
      (rows % L.unit_rows != 0 && row0 + rows != out))
    fail("synthetic checkpoint: tensor '{}': rows [{}, {}) of {} do not fall on its {}-row blocks", t.name,
         row0, row0 + rows, out, L.unit_rows);

  constexpr int64_t kMinPerThread = int64_t{1} << 16;  // source values
  const int64_t units = ceil_div(rows, L.unit_rows);
  const int64_t n = std::clamp<int64_t>(std::min(rows * in / kMinPerThread, units), 1, std::max(threads, 1));
  if (n == 1) return quantize_rows(t, f, block, seed, row0, 0, rows, weight, scale);
  std::vector<std::jthread> pool;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t b = std::min(rows, units * k / n * L.unit_rows);
    const int64_t e = std::min(rows, units * (k + 1) / n * L.unit_rows);
    pool.emplace_back([&, b, e] { quantize_rows(t, f, block, seed, row0, b, e, weight, scale); });
  }
}

}  // namespace dspark
