// The header-only C++ wrapper (client/dspark_client.hpp) over the C API.
#include <gtest/gtest.h>

#include <cstring>

#include "client/dspark_client.hpp"
#include "fake_worker.hpp"
#include "test_util.hpp"

namespace dspark::test {
namespace {

TEST(ClientWrapper, RoundTripAndErrors) {
  const std::string name = unique_ring_name();
  FakeWorker w(name);
  Client c(name, 5000);
  EXPECT_EQ(c.model().block_size, 5u);
  EXPECT_EQ(c.row_values(), 24u);
  const auto rows = make_rows(3, 0, 4, c.row_values());
  c.context(3, 0, rows);
  c.reset(std::vector<int32_t>{1, 2});
  const dspark_draft_request reqs[2] = {{3, 7, 4, -1, 0, 0, 0}, {1, 8, 0, -1, 3, 0, 0}};
  const DraftBatch b = c.draft(reqs, false);
  ASSERT_EQ(b.n, 2u);
  ASSERT_EQ(b.k, 5u);
  for (uint32_t i = 0; i < 2; ++i)
    for (uint32_t j = 0; j < 5; ++j) {
      int32_t id = 0;
      float cf = 0, l = 0, g = 0;
      fake_draft(fake_model(), {reqs[i].slot, reqs[i].token, reqs[i].pos, reqs[i].low, reqs[i].outputs},
                 false, j, id, cf, l, g);
      EXPECT_EQ(b.id(i, j), id);
      EXPECT_EQ(b.margin[i * 5 + j], 0.0f);
    }
  const Context ctx{0, 0, 4, rows.data()};
  const DraftBatch s = c.step({}, {&ctx, 1}, {reqs, 1});
  EXPECT_EQ(s.n, 1u);
  EXPECT_EQ(c.stats().context_rows, 8u);
  EXPECT_EQ(c.health().state, DSPARK_SERVING);

  try {
    c.set_max_model_len(1 << 30);
    FAIL() << "expected a ClientError";
  } catch (const ClientError& e) {
    EXPECT_EQ(e.status(), DSPARK_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("INVALID_ARGUMENT"), std::string::npos);
  }
  EXPECT_THROW(c.context(0, 0, std::vector<uint16_t>(5)), ClientError);  // not whole rows
  try {
    c.set_timeout(-1);
    FAIL() << "expected a ClientError";
  } catch (const ClientError& e) {
    EXPECT_EQ(e.status(), DSPARK_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("timeout_ms -1 is negative"), std::string::npos) << e.what();
  }

  Client moved = std::move(c);
  EXPECT_FALSE(c.attached());
  EXPECT_TRUE(moved.attached());
  moved.detach();
  EXPECT_EQ(w.host_pid(), 0);
  EXPECT_THROW(Client("/dspark-test-no-such-ring", 100), ClientError);
  try {
    Client negative(unique_ring_name(), -1);
    FAIL() << "expected a ClientError";
  } catch (const ClientError& e) {
    EXPECT_EQ(e.status(), DSPARK_INVALID_ARGUMENT);
  }
}

// Sized contexts through step: three whole rows arrive; five values (not whole rows of 24) are refused before
// anything is sent.
TEST(ClientWrapper, SizedContextRowsGoThroughStepAndPartRowsAreRefused) {
  const std::string name = unique_ring_name();
  FakeWorker w(name);
  Client c(name, 5000);
  const std::vector<uint16_t> rows = make_rows(2, 0, 3, c.row_values());
  const ContextRows ctx{2, 0, rows};
  EXPECT_EQ(c.step({}, {&ctx, 1}, {}).n, 0u);
  EXPECT_EQ(c.stats().context_rows, 3u);
  const std::vector<uint16_t> part(rows.begin(), rows.begin() + 5);
  const ContextRows bad{2, 3, part};
  try {
    c.step({}, {&bad, 1}, {});
    FAIL() << "expected a ClientError";
  } catch (const ClientError& e) {
    EXPECT_EQ(e.status(), DSPARK_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("5 bf16 values are not whole rows of 24"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(c.stats().context_rows, 3u);
}

float float_of(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Hand cases of round to nearest, ties to even, on the 16 dropped bits.
TEST(ClientWrapper, ToBf16RoundsToNearestEvenAndKeepsNaNs) {
  EXPECT_EQ(to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(to_bf16(float_of(0x3f808000u)), 0x3f80);  // halfway, the even one below
  EXPECT_EQ(to_bf16(float_of(0x3f818000u)), 0x3f82);  // halfway, the even one above
  EXPECT_EQ(to_bf16(float_of(0x3f808001u)), 0x3f81);  // past halfway
  EXPECT_EQ(to_bf16(float_of(0x3f80ffffu)), 0x3f81);
  EXPECT_EQ(to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(to_bf16(float_of(0x7f800000u)), 0x7f80);  // inf
  EXPECT_EQ(to_bf16(float_of(0xff800000u)), 0xff80);  // -inf
  EXPECT_EQ(to_bf16(float_of(0x7f7fffffu)), 0x7f80);  // the largest float rounds to inf
  EXPECT_EQ(to_bf16(float_of(0x7f800001u)), 0x7fc0);  // a NaN whose payload truncation would make inf
  EXPECT_EQ(to_bf16(float_of(0xffa00000u)), 0xffe0);
}

TEST(ClientWrapper, SpansViewVectorsArraysAndPointerRanges) {
  const std::vector<int32_t> v{4, 5, 6};
  const int32_t a[2] = {7, 8};
  const Span<int32_t> sv(v), sa(a), sp(v.data() + 1, 2);
  EXPECT_EQ(sv.size(), 3u);
  EXPECT_EQ(sv.data(), v.data());
  EXPECT_EQ(sa.size(), 2u);
  EXPECT_EQ(sa[1], 8);
  EXPECT_EQ(sp[0], 5);
  EXPECT_EQ(Span<int32_t>().size(), 0u);
}

}  // namespace
}  // namespace dspark::test
