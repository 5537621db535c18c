// What the exchanges cost a draft step (dspark_bench --exchange-cost): the draft of each batch size on a
// drafter whose communicator is a LocalExchangeCommunicator, timed with its exchanges replaced by local
// copies of what they gave, beside the real drafter's draft of the same batch. Whatever path the real step
// exchanges through (NCCL's collectives, or the peer kernels' handshakes and remote reads), the difference is
// what the exchanges cost it, less the copies' own cost: at tp 1, where the exchanges do nothing, the
// difference is that cost alone (negative).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "lib/api/draft_types.hpp"
#include "lib/bench/bench_run.hpp"
#include "lib/bench/local_exchanges.hpp"
#include "lib/model/drafter.hpp"

namespace dspark::bench {

// Collective. `bench` runs on `drafter`, whose communicator is `lx`, before its capture_graphs(): fills the
// slots' context, learns every batch's exchanges from one eager draft each, records the drafter's graphs with
// the exchanges local, then times a "draft_local" row per batch. Fails when a local draft is not the draft
// it learned from, bit for bit, or when no exchange went through the local copies. `real`: the real
// drafter's answer per batch (rank 0's), for drafts_match_real (it differs only where the wrapped
// communicator's sums round otherwise than the real step's path, e.g. NCCL's order at tp > 2 against the
// peer kernels' rank order).
std::vector<Measurement> local_exchange_drafts(Bench& bench, Drafter& drafter, LocalExchangeCommunicator& lx,
                                               const std::vector<int64_t>& batches,
                                               const std::map<int64_t, DraftResult>& real);

// Fills local's exchange fields from the real draft row of the same batch: the exchanges a step of k
// positions and `stages` stages makes (two sums per stage, one argmax exchange per position), and the
// difference of the medians, of the replays where both rows have one, else of the whole calls.
void set_exchange_cost(Measurement& local, const Measurement& real, int64_t stages, int64_t k);

// Whether two answers carry the same drafts: ids, margins and confidences, bit for bit.
bool same_drafts(const DraftResult& a, const DraftResult& b);

}  // namespace dspark::bench
