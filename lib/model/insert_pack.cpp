#include "lib/model/insert_pack.hpp"

#include <algorithm>

namespace dspark {

void pack_insert_rows(std::span<const ContextBlock> blocks, int64_t W, std::vector<InsertRow>& out,
                      std::unordered_set<uint64_t>& seen) {
  out.clear();
  seen.clear();
  int64_t end = 0;
  for (const ContextBlock& b : blocks) end += b.rows;
  // Backwards, so that the first row met for an entry is the last one written there.
  for (size_t i = blocks.size(); i-- > 0;) {
    const ContextBlock& b = blocks[i];
    end -= b.rows;
    // Within a block, only its last W rows can survive (consecutive positions: W distinct entries).
    const int64_t from = std::max<int64_t>(0, b.rows - W);
    for (int64_t r = b.rows; r-- > from;) {
      const int64_t pos = b.first_pos + r;
      const uint64_t entry =
          (static_cast<uint64_t>(static_cast<uint32_t>(b.slot)) << 32) | static_cast<uint64_t>(pos % W);
      if (seen.insert(entry).second) out.push_back({b.slot, static_cast<int32_t>(pos), end + r});
    }
  }
  std::reverse(out.begin(), out.end());
}

}  // namespace dspark
