// The worker's YAML configuration (SPEC §6): what to load, where to run, the serving limits.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "lib/core/tuning.hpp"

namespace dspark {

enum class BackendKind { cpu, cuda };

// The range of health.step_timeout_ms.
constexpr int64_t kMinStepTimeoutMs = 100;
constexpr int64_t kMaxStepTimeoutMs = 3600000;
// The lower end of health.exchange_timeout_ms, and its default (capped at half the step bound when unset).
constexpr int64_t kMinExchangeTimeoutMs = 10;
constexpr int64_t kDefaultExchangeTimeoutMs = 10000;
// health.host_timeout_ms: long enough for a host's 100 ms heartbeat, short enough that a stopped host is
// released within minutes.
constexpr int64_t kMinHostTimeoutMs = 100;
constexpr int64_t kMaxHostTimeoutMs = 600000;

// The default ring.name, "/dspark-<uid>" of the calling user: two users' workers on one host never claim the
// same socket (the client CLI attaches to the same default).
std::string default_ring_name();

struct WorkerConfig {
  std::filesystem::path checkpoint;  // required; relative paths resolve against the YAML file's folder
  BackendKind backend = BackendKind::cpu;
  int64_t slots = 8;                // sequences held at once
  int64_t max_batch = 16;           // draft requests per step
  int64_t max_model_len = 1 << 20;  // positions are clamped to max_model_len - 1
  int64_t max_context_rows = 1024;  // context rows per step
  struct Ring {
    std::string name = default_ring_name();  // a bare name (<socket_dir>/<name>.sock) or a socket path
    std::string group;                       // its members may attach too ("" = the worker's uid only)
    std::filesystem::path socket_dir;        // "" = $XDG_RUNTIME_DIR/dspark, else /tmp/dspark-<uid>
  } ring;
  struct Graphs {
    bool enabled = true;
    std::vector<int64_t> batch_sizes = {1, 2, 4, 8, 16};
    std::vector<int64_t> insert_rows = {1, 8, 16, 32, 64, 128};
    // (insert rows bucket, batch size) pairs recorded as one step with its inserts; unset: derived from the
    // model (step_graph_pairs in lib/serve/worker.cpp).
    std::optional<std::vector<std::pair<int64_t, int64_t>>> steps;
  } graphs;
  std::vector<int64_t> device_map;  // rank -> GPU; empty = local rank
  struct Weights {
    std::string head = "keep";  // keep | fp8: re-quantise the bf16 head at load
  } weights;
  struct Logging {
    std::string level = "info";  // trace | debug | info | warn | error | off
    std::filesystem::path dir;   // one file per rank when set
  } logging;
  struct Health {
    int64_t host_timeout_ms = 5000;  // kMinHostTimeoutMs..kMaxHostTimeoutMs
    int64_t max_failed_steps = 3;
    // A step running longer on any rank ends the worker (exit status 2: a rank or device stopped answering).
    int64_t step_timeout_ms = 30000;
    // How long a peer-memory exchange waits for a rank before the step fails with INTERNAL on the ranks
    // still running (below step_timeout_ms, so that a late rank that comes back finds the worker serving).
    int64_t exchange_timeout_ms = kDefaultExchangeTimeoutMs;
  } health;
  struct Metrics {
    int64_t port = 0;                // rank 0's Prometheus endpoint, http://<bind>:<port>/metrics; 0 = off
    std::string bind = "127.0.0.1";  // an IPv4 address of this host: local only by default
  } metrics;
  // The Markov bias cache (SPEC §4): each rank keeps the bias rows of up to `rows` previous tokens, those of
  // tokens_file (the first `rows` of them), V_r x 4 bytes each.
  struct MarkovCache {
    int64_t rows = 0;                       // 0: no cache
    std::filesystem::path tokens_file;      // unset: markov_cache_tokens.txt beside the checkpoint
    std::filesystem::path hot_tokens_file;  // written at shutdown: the tokens seen, most first; unset: none
  } markov_cache;
  // Sampled drafts (SPEC §4): draft requests per step that may ask for their whole draft distribution (each
  // takes k x V x 4 bytes of the answer and of every rank's workspace); at most max_batch.
  struct Sampling {
    int64_t max_distributions = 1;
  } sampling;
  Tuning tuning;  // the cuda backend's optimisation switches (core/tuning.hpp)
  struct Debug {
    bool check_replicated = false;  // hash replicated activations across ranks every step
    // Where a -DDSPARK_KERNEL_TRACE=ON build appends its kernel start trace (kernels/cuda/kernel_trace.hpp);
    // empty = none. The worker refuses it on other builds.
    std::filesystem::path kernel_trace_file;
  } debug;
};

// The step pairs recorded when graphs.steps is unset: what an engine's steps hit. B sequences with 1 to k + 1
// accepted rows each send B .. B (k + 1) rows: for each recorded batch size B, every insert bucket of at
// least B rows up to the smallest one >= B (k + 1).
std::vector<std::pair<int64_t, int64_t>> default_step_pairs(const WorkerConfig::Graphs& g,
                                                            int64_t block_size);

// Errors name the key (dotted path, e.g. "graphs.batch_sizes[2]"): unknown keys, wrong types, values out of
// range.
WorkerConfig parse_worker_config(const std::string& yaml_text, const std::filesystem::path& base_dir = ".");
WorkerConfig load_worker_config(const std::filesystem::path& path);

}  // namespace dspark
