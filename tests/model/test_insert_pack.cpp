// pack_insert_rows against hand-worked cases and against inserting the blocks one row at a time.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "lib/model/insert_pack.hpp"

namespace dspark {
namespace {

struct Row {
  int32_t slot, pos;
  int64_t src;
  bool operator==(const Row&) const = default;
};

std::vector<Row> pack(const std::vector<ContextBlock>& blocks, int64_t W) {
  std::vector<InsertRow> out;
  std::unordered_set<uint64_t> seen;
  pack_insert_rows(blocks, W, out, seen);
  std::vector<Row> rows;
  for (const InsertRow& r : out) rows.push_back({r.slot, r.pos, r.src});
  return rows;
}

TEST(InsertPack, OneBlockKeepsItsLastWindow) {
  // W = 4: positions 0..5 of slot 0; 0 and 1 are overwritten by 4 and 5.
  EXPECT_EQ(pack({{0, 0, 6}}, 4), (std::vector<Row>{{0, 2, 2}, {0, 3, 3}, {0, 4, 4}, {0, 5, 5}}));
}

TEST(InsertPack, SlotsDoNotShareEntries) {
  EXPECT_EQ(pack({{1, 0, 2}, {2, 0, 3}}, 4),
            (std::vector<Row>{{1, 0, 0}, {1, 1, 1}, {2, 0, 2}, {2, 1, 3}, {2, 2, 4}}));
}

TEST(InsertPack, ALaterBlockOverwritesAnEarlierOnesEntries) {
  // Slot 0: positions 0, 1, 2 (rows 0..2), then 4, 5 (rows 3, 4): entry 0 gets 4, entry 1 gets 5.
  EXPECT_EQ(pack({{0, 0, 3}, {0, 4, 2}}, 4), (std::vector<Row>{{0, 2, 2}, {0, 4, 3}, {0, 5, 4}}));
  // The same position twice: the second row.
  EXPECT_EQ(pack({{0, 3, 1}, {0, 3, 1}}, 4), (std::vector<Row>{{0, 3, 1}}));
  // An older position written after a newer one in the same entry: the older one stays (last written).
  EXPECT_EQ(pack({{0, 4, 1}, {0, 0, 1}}, 4), (std::vector<Row>{{0, 0, 1}}));
}

TEST(InsertPack, EmptyBlocksAndNoBlocks) {
  EXPECT_TRUE(pack({}, 4).empty());
  EXPECT_EQ(pack({{0, 7, 0}, {3, 1, 1}, {2, 9, 0}}, 4), (std::vector<Row>{{3, 1, 0}}));
}

TEST(InsertPack, LeavesTheRingsAsSequentialInsertsDo) {
  std::mt19937 rng(3);
  for (int round = 0; round < 300; ++round) {
    const int64_t W = 1 + rng() % 9;
    std::vector<ContextBlock> blocks(rng() % 6);
    for (ContextBlock& b : blocks)
      b = {static_cast<int32_t>(rng() % 3), static_cast<int32_t>(rng() % 30),
           static_cast<int32_t>(rng() % 14)};
    // Row by row, block by block: (slot, entry) -> (pos, src).
    std::map<std::pair<int32_t, int64_t>, std::pair<int32_t, int64_t>> sequential, packed;
    int64_t src = 0;
    for (const ContextBlock& b : blocks)
      for (int32_t r = 0; r < b.rows; ++r, ++src)
        sequential[{b.slot, (b.first_pos + r) % W}] = {b.first_pos + r, src};
    const std::vector<Row> rows = pack(blocks, W);
    for (const Row& r : rows) {
      EXPECT_TRUE(packed.emplace(std::pair{r.slot, r.pos % W}, std::pair{r.pos, r.src}).second)
          << "round " << round << ": an entry written twice";
    }
    EXPECT_EQ(packed, sequential) << "round " << round;
    for (size_t i = 1; i < rows.size(); ++i) EXPECT_LT(rows[i - 1].src, rows[i].src) << "step order";
  }
}

}  // namespace
}  // namespace dspark
