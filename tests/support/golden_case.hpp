// The golden cases (shared/golden/tiny-v41 and tiny-v41-fp8, see their READMEs): its files, read the same way
// by the CPU and the GPU golden tests.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/core/npy.hpp"
#include "lib/core/numeric.hpp"
#include "lib/model/drafter.hpp"
#include "tests/support/golden.hpp"

namespace dspark::test {

inline const std::filesystem::path& golden_dir() {
  static const std::filesystem::path dir = golden_case_dir("tiny-v41");
  return dir;
}

inline bool have_golden(const std::filesystem::path& dir = golden_dir()) {
  return std::filesystem::exists(dir / "ckpt" / "config.json");
}

// rows_slot{s}.npy into slot s at positions 0.. (values exactly representable in bf16).
inline void insert_golden_rows(Drafter& d, int slots = 2, const std::filesystem::path& dir = golden_dir()) {
  for (int s = 0; s < slots; ++s) {
    const NpyArray rows = read_npy(dir / fmt::format("rows_slot{}.npy", s));
    std::vector<bf16_t> bits;
    for (float v : rows.to_float()) bits.push_back(float_to_bf16(v));
    d.insert(s, 0, bits.data(), rows.shape[0]);
  }
}

inline std::vector<DraftRequest> golden_requests(const std::filesystem::path& dir = golden_dir()) {
  std::vector<DraftRequest> out;
  std::ifstream in(dir / "requests.json");
  for (const auto& r : nlohmann::json::parse(in))
    out.push_back({r["slot"].get<int32_t>(), r["token"].get<int32_t>(), r["pos"].get<int32_t>(), -1,
                   r["k_out"].get<int32_t>()});
  return out;
}

inline nlohmann::json golden_expected(const std::filesystem::path& dir = golden_dir()) {
  std::ifstream in(dir / "expected.json");
  return nlohmann::json::parse(in);
}

// Largest |got - want| of a traced intermediate relative to the largest |want| of the tensor (the README's
// "within a few bf16 ulps": one ulp is 2^-8 relative). Infinite when the sizes differ.
inline double golden_relative_error(const std::string& name, const std::vector<float>& got,
                                    const std::filesystem::path& dir = golden_dir()) {
  const std::vector<float> want = read_npy(dir / "trace" / (name + ".npy")).to_float();
  if (got.size() != want.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(double(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  return diff / scale;
}

}  // namespace dspark::test
