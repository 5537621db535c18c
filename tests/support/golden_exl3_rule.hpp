// The comparison rule of the golden case in the seed's EXL3 mix (shared/golden/tiny-v41-exl3, its README):
// ids at every position whose expected margin, and every earlier position's, exceeds 1e-3; confidences
// within 2e-2 there. Shared by the tp = 1 test and the tp = N MPI test.
#pragma once

#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "lib/api/draft_types.hpp"

namespace dspark::test {

inline void expect_exl3_golden_rule(const DraftResult& got, const nlohmann::json& expected) {
  const auto& ids = expected["ids"];
  const size_t B = ids.size(), k = ids[0].size();
  ASSERT_EQ(got.ids.size(), B * k);
  for (size_t b = 0; b < B; ++b)
    for (size_t j = 0; j < k; ++j) {
      if (expected["margin"][b][j].get<double>() <= 1e-3) break;  // this position and the later ones are free
      const size_t i = b * k + j;
      EXPECT_EQ(got.ids[i], ids[b][j].get<int32_t>()) << "request " << b << " position " << j;
      EXPECT_NEAR(got.conf[i], expected["conf"][b][j].get<double>(), 2e-2)
          << "request " << b << " position " << j;
    }
}

}  // namespace dspark::test
