// Where the golden cases are (shared/golden/<name>, see their READMEs). Tests that read one skip (instead of
// failing) where the shared folder is not beside the checkout (and -DDSPARK_SHARED_DIR names no other).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace dspark::test {

// A golden case's folder: "tiny-v41" (dense), "tiny-v41-fp8" (the released fp8 / fp4 format), "tiny-v41-exl3"
// (the seed's EXL3 mix).
inline std::filesystem::path golden_case_dir(const std::string& name) {
  return std::filesystem::path(DSPARK_SHARED_DIR) / "golden" / name;
}

}  // namespace dspark::test

// Returns from the calling test as skipped, naming the folder, where the golden case `name` is missing.
#define DSPARK_SKIP_WITHOUT_GOLDEN_CASE(name)                                           \
  if (const std::filesystem::path golden_case_ = ::dspark::test::golden_case_dir(name); \
      !std::filesystem::exists(golden_case_))                                           \
  GTEST_SKIP() << "no golden case at " << golden_case_

#define DSPARK_SKIP_WITHOUT_GOLDEN() DSPARK_SKIP_WITHOUT_GOLDEN_CASE("tiny-v41")
