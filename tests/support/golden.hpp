// Tests that read ../shared/golden skip (instead of failing) where the shared folder is not beside the
// checkout.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>

#define DSPARK_SKIP_WITHOUT_GOLDEN()                                                              \
  if (!std::filesystem::exists(std::filesystem::path(DSPARK_SHARED_DIR) / "golden" / "tiny-v41")) \
  GTEST_SKIP() << "no golden case under " << DSPARK_SHARED_DIR
