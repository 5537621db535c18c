// dspark_bench's report (lib/bench/report.cpp): an insert's host-link copy in the JSON and in the lines after
// the table, and nothing of it where the backend copied no rows (the CPU backend).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/bench/report.hpp"

namespace dspark::bench {
namespace {

Measurement insert_row(int64_t rows, double median_us, double replay_us, double floor_us) {
  Measurement m;
  m.kind = "insert";
  m.size = rows;
  m.latency = {median_us, median_us + 10.0};
  m.replay = {replay_us, replay_us + 5.0};
  m.floor_us = floor_us;
  return m;
}

TEST(BenchReport, InsertsCarryTheirHostLinkCopyWhereTheyHaveOne) {
  RunInfo info;
  info.format = "fp8";
  // 16 rows of 30720 bytes in 16.384 us: 30.0 GB/s; with the floor of 28.6 us, 44.984 us.
  Measurement linked = insert_row(16, 115.0, 101.0, 28.6);
  linked.host_link = {16.384, 20.0};
  linked.host_link_bytes = 16 * 30720;
  const Measurement unlinked = insert_row(1, 69.6, 57.9, 28.6);
  const nlohmann::json j = to_json(info, {linked, unlinked});
  const nlohmann::json& a = j["measurements"][0];
  EXPECT_EQ(a["rows"], 16);
  EXPECT_DOUBLE_EQ(a["host_link_us"].get<double>(), 16.384);
  EXPECT_DOUBLE_EQ(a["host_link_p99_us"].get<double>(), 20.0);
  EXPECT_EQ(a["host_link_bytes"].get<uint64_t>(), 491520u);
  EXPECT_NEAR(a["ratio_to_floor"].get<double>(), 115.0 / 28.6, 1e-12);
  EXPECT_FALSE(j["measurements"][1].contains("host_link_us"));

  testing::internal::CaptureStdout();
  print_insert_links({linked, unlinked});
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("rows 16   link    16.4 (   20.0)   30.0 GB/s | link + floor    45.0"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("| replay   101.0 | insert   115.0"), std::string::npos) << out;
  EXPECT_EQ(out.find("rows 1 "), std::string::npos) << "the insert without a link copy has no line:\n" << out;

  testing::internal::CaptureStdout();
  print_insert_links({unlinked});
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
}

}  // namespace
}  // namespace dspark::bench
