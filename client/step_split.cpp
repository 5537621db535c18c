#include "step_split.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "lib/host/protocol.hpp"

namespace dspark::client {
namespace {

constexpr uint64_t align8(uint64_t v) {
  return (v + 7) & ~uint64_t{7};
}

uint64_t wire_bytes(uint64_t resets, uint64_t contexts, uint64_t drafts) {
  return align8(sizeof(host::MessageHeader) + sizeof(host::StepRequest) + resets * sizeof(int32_t) +
                contexts * sizeof(host::ContextWire) + drafts * sizeof(host::DraftWire));
}

}  // namespace

uint64_t step_message_bytes(uint64_t resets, uint64_t contexts, uint64_t drafts, uint64_t rows,
                            uint32_t row_bytes) {
  return wire_bytes(resets, contexts, drafts) + align8(rows * row_bytes);
}

Outcome split_step(size_t n_resets, std::span<const dspark_context_block> ctx, size_t n_drafts,
                   const SplitLimits& lim, std::vector<MessagePlan>& out) {
  out.clear();
  const uint64_t need_first = step_message_bytes(n_resets, 0, 0, 0, lim.row_bytes);
  const uint64_t need_last = step_message_bytes(0, 0, n_drafts, 0, lim.row_bytes);
  const uint64_t need_row = step_message_bytes(0, 1, 0, 1, lim.row_bytes);
  if (std::max({need_first, need_last, need_row}) > lim.max_bytes || lim.max_rows < 1 ||
      std::max(n_resets, n_drafts) > lim.max_count)
    return failed(
        DSPARK_RESOURCE_EXHAUSTED,
        fmt::format("a step of {} resets and {} draft requests does not fit the request ring's {}-byte "
                    "messages",
                    n_resets, n_drafts, lim.max_bytes));
  MessagePlan cur;
  cur.resets = true;
  uint64_t cur_rows = 0;
  auto flush = [&] {
    out.push_back(std::move(cur));
    cur = MessagePlan{};
    cur_rows = 0;
  };
  for (uint32_t i = 0; i < ctx.size(); ++i) {
    const int32_t total = std::max(ctx[i].rows, 0);
    int32_t offset = 0;
    for (;;) {
      const uint64_t wires = wire_bytes(cur.resets ? n_resets : 0, cur.pieces.size() + 1, 0);
      // Rows that fit beside this message's wires (rows are bulk after the 8-aligned wires; max_bytes is a
      // multiple of 8, so the final padding never costs a row).
      const uint64_t by_bytes = wires < lim.max_bytes ? (lim.max_bytes - wires) / lim.row_bytes : 0;
      const uint64_t cap = std::min<uint64_t>(by_bytes, static_cast<uint64_t>(lim.max_rows));
      const uint64_t room = cap > cur_rows ? cap - cur_rows : 0;
      const bool wire_fits = wires + align8(cur_rows * lim.row_bytes) <= lim.max_bytes;
      const auto take = static_cast<int32_t>(std::min<uint64_t>(room, static_cast<uint64_t>(total - offset)));
      if (!wire_fits || cur.pieces.size() >= lim.max_count || (take == 0 && total > offset)) {
        flush();  // a fresh message always takes at least one row (checked above), so this ends
        continue;
      }
      cur.pieces.push_back({i, offset, take});
      offset += take;
      cur_rows += static_cast<uint64_t>(take);
      if (offset >= total) break;
    }
  }
  const uint64_t with_drafts =
      step_message_bytes(cur.resets ? n_resets : 0, cur.pieces.size(), n_drafts, cur_rows, lim.row_bytes);
  if (with_drafts > lim.max_bytes) flush();
  cur.drafts = true;
  flush();
  return {};
}

}  // namespace dspark::client
