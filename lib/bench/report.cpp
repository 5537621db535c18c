#include "lib/bench/report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>

namespace dspark::bench {
namespace {

constexpr double kGB = 1e9;

std::string config_name(const RunInfo& info, const Measurement& m) {
  const char* f = info.format == "fp8 + fp8 head" ? "fp8h" : info.format.c_str();
  if (m.kind == "draft") return fmt::format("{} tp{} B={} draft", f, info.tp, m.size);
  if (m.kind == "draft_cached") return fmt::format("{} tp{} B={} draft cached", f, info.tp, m.size);
  if (m.kind == "draft_sampled") return fmt::format("{} tp{} B={} draft sampled", f, info.tp, m.size);
  if (m.kind == "draft_sampled_q") return fmt::format("{} tp{} B={} draft sampled+q", f, info.tp, m.size);
  if (m.kind == "step") return fmt::format("{} tp{} B={} step", f, info.tp, m.size);
  if (m.kind == "step2") return fmt::format("{} tp{} B={} ins+draft", f, info.tp, m.size);
  if (m.kind == "step_ring") return fmt::format("{} tp{} B={} step ring", f, info.tp, m.size);
  if (m.kind == "draft_local") return fmt::format("{} tp{} B={} draft local-x", f, info.tp, m.size);
  return fmt::format("{} tp{} insert {} row{}", f, info.tp, m.size, m.size == 1 ? "" : "s");
}

std::string experts_str(const Measurement& m) {
  if (m.experts.empty()) return "-";
  return fmt::format("{}", fmt::join(m.experts, "/"));
}

}  // namespace

void print_header(const RunInfo& info) {
  fmt::print(
      "dspark_bench: DSpark drafter, preset {}, tp {}, k = {}, synthetic {} weights ({:.2f} GB on rank 0)\n",
      info.preset, info.tp, info.k, info.format, static_cast<double>(info.weight_bytes) / kGB);
  fmt::print(
      "backend {}; device (rank 0): {}; measured bandwidth {:.1f} GB/s ({:.2f} GiB {}, read + written)\n",
      info.backend, info.device, info.bandwidth / kGB, static_cast<double>(info.copy_bytes) / (1u << 30),
      info.bandwidth_method);
  const bool cuda = info.backend == "cuda";
  fmt::print(
      "{}; a draft step is one Drafter::draft call (planning, the step{}); {} timed calls after warm-up, "
      "rank 0's numbers\n",
      info.graphs
          ? "draft steps and inserts replay CUDA graphs recorded at start-up (Drafter::capture_graphs)"
      : cuda ? "eager: no CUDA graphs"
             : "eager: the CPU backend computes each call before it returns",
      cuda ? " with the copies of its requests and answer through mapped host memory, the wait for it"
           : " and its answer",
      info.iters);
  if (info.graphs)
    fmt::print(
        "replay_us: the draft step's (or an insert chunk's) recording replayed alone, its copies included: "
        "device time on rank 0's stream from before the graph launch to its end (no planning or staging, no "
        "host wait)\n");
  if (info.backend == "cuda")
    fmt::print(
        "tuning: {}{}\n", describe(info.tuning),
        info.kernel_trace.empty() ? "" : fmt::format("; kernel trace to {}.gpu<device>", info.kernel_trace));
  if (info.tp > 1 && info.peer_exchange)
    fmt::print(
        "the step sums and exchanges through peer buffers inside its kernels (--peer-sum false for NCCL): "
        "coll_* columns are what NCCL's collectives would cost it (--exchange-cost: what its own exchanges "
        "cost it)\n");
  fmt::print(
      "floor = weight bytes the call reads on this rank / measured bandwidth (collectives not included)\n\n");
}

void print_table_head() {
  fmt::print("{:<27} {:>10} {:>10} {:>10} {:>8} {:>10} {:>8} {:>9} {:>11} {:>9} {:>7} {:>10}\n", "config",
             "median_us", "p99_us", "floor_us", "x_floor", "replay_us", "replay_x", "weight_GB", "experts",
             "coll_us", "coll_%", "coll_g_us");
}

void print_row(const RunInfo& info, const Measurement& m) {
  const double ratio = m.floor_us > 0 ? m.latency.median_us / m.floor_us : 0.0;
  const double share = m.latency.median_us > 0 ? 100.0 * m.collectives_us / m.latency.median_us : 0.0;
  const double replay_ratio = m.floor_us > 0 ? m.replay.median_us / m.floor_us : 0.0;
  fmt::print(
      "{:<27} {:>10.1f} {:>10.1f} {:>10.1f} {:>8.2f} {:>10.1f} {:>8.2f} {:>9.3f} {:>11} {:>9.1f} {:>6.1f}% "
      "{:>10.1f}\n",
      config_name(info, m), m.latency.median_us, m.latency.p99_us, m.floor_us, ratio, m.replay.median_us,
      replay_ratio, static_cast<double>(m.bytes.total()) / kGB, experts_str(m), m.collectives_us, share,
      m.collectives_graph_us);
  std::fflush(stdout);
}

void print_exchange_costs(const RunInfo& info, const std::vector<Measurement>& rows) {
  bool any = false;
  for (const Measurement& m : rows) {
    if (m.kind != "draft_local") continue;
    if (!any)
      fmt::print(
          "\nexchanges in the draft step ({}): the draft less the same draft with its exchanges replaced by "
          "local copies of their results (draft local-x rows), {}\n",
          info.tp == 1         ? "tp 1: nothing crosses ranks, so this is the local copies' own cost"
          : info.peer_exchange ? "through peer buffers inside its kernels"
                               : "through the communicator's collectives",
          m.exchanges_by_replay ? "replay medians" : "whole-call medians");
    any = true;
    fmt::print(
        "  B={:<3} {:>9.1f} us for {} exchanges, {:>7.2f} us each{}\n", m.size, m.exchanges_us, m.exchanges,
        m.exchanges > 0 ? m.exchanges_us / static_cast<double>(m.exchanges) : 0.0,
        m.drafts_match_real ? "" : " (its drafts differ from the real step's: the sums rounded otherwise)");
  }
  std::fflush(stdout);
}

void print_ring_split(const std::vector<Measurement>& rows) {
  const auto is_ring = [](const Measurement& m) { return m.kind == "step_ring"; };
  if (std::none_of(rows.begin(), rows.end(), is_ring)) return;
  fmt::print(
      "\nthe ring's round trips in three parts, each part's median (p99), us:\n"
      "  to the drafter: the request written, the worker's wake-up, decode, checks, plan\n"
      "  drafter: its step call; back: the answer encoded, the host's wake-up, decode\n");
  for (const Measurement& m : rows) {
    if (!is_ring(m)) continue;
    fmt::print("  B={:<3} round trip {:>9.1f} | to the drafter {:>7.1f} ({:>7.1f})", m.size,
               m.latency.median_us, m.ring_to_drafter.median_us, m.ring_to_drafter.p99_us);
    fmt::print(" | drafter {:>9.1f} ({:>9.1f}) | back {:>7.1f} ({:>7.1f})\n", m.ring_drafter.median_us,
               m.ring_drafter.p99_us, m.ring_from_drafter.median_us, m.ring_from_drafter.p99_us);
  }
  std::fflush(stdout);
}

void print_insert_links(const std::vector<Measurement>& rows) {
  const auto linked = [](const Measurement& m) { return m.kind == "insert" && m.host_link.median_us > 0; };
  if (std::none_of(rows.begin(), rows.end(), linked)) return;
  fmt::print(
      "\nthe inserts' rows over the host link: one copy of them from page-locked host memory to the GPU, "
      "median (p99), beside\nthat copy plus the insert's floor, the insert's replay and the insert, us:\n");
  for (const Measurement& m : rows) {
    if (!linked(m)) continue;
    fmt::print("  rows {:<4} link {:>7.1f} ({:>7.1f}) {:>6.1f} GB/s | link + floor {:>7.1f}", m.size,
               m.host_link.median_us, m.host_link.p99_us,
               static_cast<double>(m.host_link_bytes) / (m.host_link.median_us * 1e3),
               m.host_link.median_us + m.floor_us);
    fmt::print(" | replay {:>7.1f} | insert {:>7.1f}\n", m.replay.median_us, m.latency.median_us);
  }
  std::fflush(stdout);
}

nlohmann::json to_json(const RunInfo& info, const std::vector<Measurement>& rows) {
  nlohmann::json out = {
      {"preset", info.preset},
      {"format", info.format},
      {"backend", info.backend},
      {"device", info.device},
      {"tp", info.tp},
      {"k", info.k},
      {"iters", info.iters},
      {"bandwidth_bytes_per_s", info.bandwidth},
      {"bandwidth_copy_bytes", info.copy_bytes},
      {"bandwidth_method", info.bandwidth_method},
      {"weight_bytes_rank0", info.weight_bytes},
      {"cuda_graphs", info.graphs},
      {"tuning",
       {{"pdl", info.tuning.pdl},
        {"weight_tiles", info.tuning.weight_tiles},
        {"head_tiles", info.tuning.head_tiles},
        {"peer_sum", info.tuning.peer_sum},
        {"bf16_copies", info.tuning.bf16_copies}}},
      {"kernel_trace", info.kernel_trace.empty() ? nlohmann::json() : nlohmann::json(info.kernel_trace)},
      {"peer_exchange", info.peer_exchange},
      {"draft_median_is_whole_call", true},
      {"measurements", nlohmann::json::array()}};
  for (const Measurement& m : rows) {
    const double ratio = m.floor_us > 0 ? m.latency.median_us / m.floor_us : 0.0;
    const double share = m.latency.median_us > 0 ? m.collectives_us / m.latency.median_us : 0.0;
    const double replay_ratio = m.floor_us > 0 ? m.replay.median_us / m.floor_us : 0.0;
    out["measurements"].push_back({{"kind", m.kind},
                                   {"tp", info.tp},
                                   {m.kind == "insert" ? "rows" : "batch", m.size},
                                   {"median_us", m.latency.median_us},
                                   {"p99_us", m.latency.p99_us},
                                   {"floor_us", m.floor_us},
                                   {"ratio_to_floor", ratio},
                                   {"replay_median_us", m.replay.median_us},
                                   {"replay_p99_us", m.replay.p99_us},
                                   {"replay_ratio_to_floor", replay_ratio},
                                   {"weight_bytes", m.bytes.total()},
                                   {"weight_bytes_by_part",
                                    {{"dense", m.bytes.dense},
                                     {"routed_experts", m.bytes.experts},
                                     {"head", m.bytes.head},
                                     {"markov", m.bytes.markov},
                                     {"embed", m.bytes.embed}}},
                                   {"distinct_experts_per_stage", m.experts},
                                   {"all_reduce_us", m.all_reduce_us},
                                   {"argmax_exchange_us", m.exchange_us},
                                   {"collectives_us", m.collectives_us},
                                   {"collectives_graph_us", m.collectives_graph_us},
                                   {"collectives_share", share}});
    if (m.kind == "draft_local") {
      nlohmann::json& j = out["measurements"].back();
      j["exchanges_us"] = m.exchanges_us;
      j["exchanges_per_step"] = m.exchanges;
      j["per_exchange_us"] = m.exchanges > 0 ? m.exchanges_us / static_cast<double>(m.exchanges) : 0.0;
      j["exchanges_timed_by"] = m.exchanges_by_replay ? "replay" : "call";
      j["drafts_match_real"] = m.drafts_match_real;
    }
    if (m.kind == "insert" && m.host_link.median_us > 0) {
      nlohmann::json& j = out["measurements"].back();
      j["host_link_us"] = m.host_link.median_us;
      j["host_link_p99_us"] = m.host_link.p99_us;
      j["host_link_bytes"] = m.host_link_bytes;
    }
    if (m.kind == "step_ring") {
      nlohmann::json& j = out["measurements"].back();
      for (const auto& [name, st] :
           {std::pair{"ring_to_drafter", &m.ring_to_drafter}, std::pair{"ring_drafter", &m.ring_drafter},
            std::pair{"ring_from_drafter", &m.ring_from_drafter}}) {
        j[std::string(name) + "_median_us"] = st->median_us;
        j[std::string(name) + "_p99_us"] = st->p99_us;
      }
    }
  }
  return out;
}

}  // namespace dspark::bench
