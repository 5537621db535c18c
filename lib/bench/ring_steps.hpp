// dspark_bench --iteration through the host interface (SPEC §7), in one process: rank 0 serves the bench's
// drafter on a ring of its own (the worker's HostServer, on a private socket) while a thread of it attaches
// as the host through the C++ client, as an engine does, and sends per batch size the step Bench::step times
// (the same plan: rows, slots, positions and anchors), timing each dspark_step round trip. Every rank runs
// the worker's step loop meanwhile. So the ring's cost is the difference from the `step` row of the same
// run: the same drafter, traffic and build, measured, not guessed.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"
#include "lib/bench/bench_run.hpp"
#include "lib/model/drafter.hpp"

namespace dspark::bench {

struct RingStepOptions {
  std::vector<int64_t> batches;  // each <= the drafter's max batch and slots
  // The cuda backend leaves rank 0's cores idle between steps: the server spins through the window of a
  // step's expected arrival, as the worker does there (DSPARK_RING_SPIN_AHEAD overrides either way).
  bool cuda_backend = false;
};

// Collective. Returns, on rank 0, a "step_ring" measurement per batch size (latency: the round trips; bytes
// and floor: the step's); empty on the other ranks. Each batch's drafts through the ring must equal, bit for
// bit, those of the same plan run by execute_step directly (else it fails naming the first difference). Run
// it after the other measurements: the host's detach resets the slots its steps wrote.
std::vector<Measurement> ring_steps(Bench& bench, Drafter& drafter, Communicator& comm,
                                    const RingStepOptions& options);

}  // namespace dspark::bench
