// dspark_bench's output: the table on stdout and the same figures as JSON.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "lib/bench/bench_run.hpp"
#include "lib/core/tuning.hpp"

namespace dspark::bench {

struct RunInfo {
  std::string preset;
  std::string format = "bf16";   // the weights' format (bench_format_name)
  std::string backend = "cuda";  // cuda or cpu
  std::string device;            // rank 0's GPU, or "host CPU"
  int tp = 1;
  double bandwidth = 0;          // bytes/s, measured on rank 0
  uint64_t copy_bytes = 0;       // size of the copy that measured it
  std::string bandwidth_method;  // BenchClock::bandwidth_method
  uint64_t weight_bytes = 0;     // weights held by rank 0
  int64_t k = 0;
  int iters = 0;
  bool graphs = true;        // draft steps replay a recorded CUDA graph (after the first call of each shape)
  Tuning tuning;             // the optimisations the run had on (--pdl, --weight-tiles, ...)
  std::string kernel_trace;  // --kernel-trace's file, empty without
  bool peer_exchange = false;  // the step exchanges through peer buffers (Drafter::peer_exchange)
};

void print_header(const RunInfo& info);
void print_table_head();
void print_row(const RunInfo& info, const Measurement& m);
// The exchanges' cost per batch, from the draft_local rows (after set_exchange_cost); nothing without them.
void print_exchange_costs(const RunInfo& info, const std::vector<Measurement>& rows);
// Where the step_ring rows' round trips go: the way to the drafter, its call, the way back; nothing without
// them.
void print_ring_split(const std::vector<Measurement>& rows);
// The inserts' rows over the host link (their copy alone) beside the insert, its replay and its floor;
// nothing where the backend copies no rows to a device.
void print_insert_links(const std::vector<Measurement>& rows);
nlohmann::json to_json(const RunInfo& info, const std::vector<Measurement>& rows);

}  // namespace dspark::bench
