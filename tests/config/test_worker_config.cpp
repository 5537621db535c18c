// Worker YAML parsing: a full example, defaults, path resolution, the shipped config, and errors that name
// the dotted key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "lib/config/worker_config.hpp"
#include "lib/core/error.hpp"

namespace dspark {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::EndsWith;
using ::testing::HasSubstr;

// The message of the Error that parsing `yaml` throws ("" when it does not throw).
std::string parse_error(const std::string& yaml) {
  try {
    parse_worker_config(yaml, "/base");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(WorkerConfig, FullExample) {
  const WorkerConfig c = parse_worker_config(R"(
checkpoint: /models/v41-flash
backend: cuda
slots: 64
max_batch: 32
max_model_len: 65536
max_context_rows: 512
ring: {name: /dspark-0, group: dspark, socket_dir: run}
graphs:
  enabled: true
  batch_sizes: [1, 4, 32]
  insert_rows: [8, 512]
device_map: [3, 2, 1, 0]
weights: {head: fp8}
logging: {level: debug, dir: logs}
health: {host_timeout_ms: 250, max_failed_steps: 5, step_timeout_ms: 100, exchange_timeout_ms: 40}
tuning: {pdl: false, weight_tiles: false, head_tiles: false, peer_sum: false, bf16_copies: false}
debug: {check_replicated: true, kernel_trace_file: trace/k}
)",
                                             "/etc/dspark");
  EXPECT_EQ(c.checkpoint, fs::path("/models/v41-flash"));
  EXPECT_EQ(c.backend, BackendKind::cuda);
  EXPECT_EQ(c.slots, 64);
  EXPECT_EQ(c.max_batch, 32);
  EXPECT_EQ(c.max_model_len, 65536);
  EXPECT_EQ(c.max_context_rows, 512);
  EXPECT_EQ(c.ring.name, "/dspark-0");
  EXPECT_EQ(c.ring.group, "dspark");
  EXPECT_EQ(c.ring.socket_dir, fs::path("/etc/dspark/run"));
  EXPECT_TRUE(c.graphs.enabled);
  EXPECT_EQ(c.graphs.batch_sizes, (std::vector<int64_t>{1, 4, 32}));
  EXPECT_EQ(c.graphs.insert_rows, (std::vector<int64_t>{8, 512}));
  EXPECT_EQ(c.device_map, (std::vector<int64_t>{3, 2, 1, 0}));
  EXPECT_EQ(c.weights.head, "fp8");
  EXPECT_EQ(c.logging.level, "debug");
  EXPECT_EQ(c.logging.dir, fs::path("/etc/dspark/logs"));
  EXPECT_EQ(c.health.host_timeout_ms, 250);
  EXPECT_EQ(c.health.max_failed_steps, 5);
  EXPECT_EQ(c.health.step_timeout_ms, 100);
  EXPECT_EQ(c.health.exchange_timeout_ms, 40);
  EXPECT_EQ(c.tuning, (Tuning{.pdl = false,
                              .weight_tiles = false,
                              .head_tiles = false,
                              .peer_sum = false,
                              .bf16_copies = false}));
  EXPECT_TRUE(c.debug.check_replicated);
  EXPECT_EQ(c.debug.kernel_trace_file, fs::path("/etc/dspark/trace/k"));
}

TEST(WorkerConfig, Defaults) {
  const WorkerConfig c = parse_worker_config("checkpoint: /ckpt\n");
  const WorkerConfig d;
  EXPECT_EQ(c.backend, BackendKind::cpu);
  EXPECT_EQ(c.slots, d.slots);
  EXPECT_EQ(c.max_batch, d.max_batch);
  EXPECT_EQ(c.max_model_len, d.max_model_len);
  EXPECT_EQ(c.max_context_rows, d.max_context_rows);
  EXPECT_EQ(c.ring.name, "/dspark-" + std::to_string(::getuid()));
  EXPECT_TRUE(c.ring.group.empty());  // owner-only
  EXPECT_TRUE(c.ring.socket_dir.empty());
  EXPECT_EQ(c.graphs.enabled, d.graphs.enabled);
  EXPECT_EQ(c.graphs.batch_sizes, d.graphs.batch_sizes);
  EXPECT_EQ(c.graphs.insert_rows, d.graphs.insert_rows);
  EXPECT_TRUE(c.device_map.empty());
  EXPECT_EQ(c.weights.head, "keep");
  EXPECT_EQ(c.logging.level, "info");
  EXPECT_TRUE(c.logging.dir.empty());
  EXPECT_EQ(c.health.host_timeout_ms, d.health.host_timeout_ms);
  EXPECT_EQ(c.health.max_failed_steps, d.health.max_failed_steps);
  EXPECT_EQ(c.health.step_timeout_ms, 30000);
  EXPECT_EQ(c.health.exchange_timeout_ms, 10000);
  EXPECT_FALSE(c.debug.check_replicated);
  EXPECT_TRUE(c.debug.kernel_trace_file.empty());
  EXPECT_EQ(c.metrics.port, 0);  // off
  EXPECT_EQ(c.metrics.bind, "127.0.0.1");
  EXPECT_EQ(c.markov_cache.rows, 0);  // no cache
  EXPECT_TRUE(c.markov_cache.tokens_file.empty());
  EXPECT_TRUE(c.markov_cache.hot_tokens_file.empty());
  // Every optimisation on unless the config turns it off.
  EXPECT_EQ(c.tuning, Tuning{});
  EXPECT_TRUE(c.tuning.pdl);
  EXPECT_TRUE(c.tuning.weight_tiles);
  EXPECT_TRUE(c.tuning.head_tiles);
  EXPECT_TRUE(c.tuning.peer_sum);
  EXPECT_TRUE(c.tuning.bf16_copies);
}

TEST(WorkerConfig, TuningSwitchesEachOverrideOnlyTheirOwn) {
  const auto parsed = [](const std::string& line) {
    return parse_worker_config("checkpoint: /c\ntuning:\n  " + line + "\n").tuning;
  };
  EXPECT_EQ(parsed("pdl: false"), (Tuning{.pdl = false}));
  EXPECT_EQ(parsed("weight_tiles: false"), (Tuning{.weight_tiles = false}));
  EXPECT_EQ(parsed("head_tiles: false"), (Tuning{.head_tiles = false}));
  EXPECT_EQ(parsed("peer_sum: false"), (Tuning{.peer_sum = false}));
  EXPECT_EQ(parsed("bf16_copies: false"), (Tuning{.bf16_copies = false}));
  EXPECT_EQ(parsed("pdl: true"), Tuning{});
  EXPECT_EQ(parse_worker_config("checkpoint: /c\ntuning:\n").tuning, Tuning{});
}

TEST(WorkerConfig, MarkovCacheKeysAreReadAndChecked) {
  const WorkerConfig c = parse_worker_config(
      "checkpoint: /c\nmarkov_cache: {rows: 4096, tokens_file: hot.txt, hot_tokens_file: /var/seen.txt}\n",
      "/etc/dspark");
  EXPECT_EQ(c.markov_cache.rows, 4096);
  EXPECT_EQ(c.markov_cache.tokens_file, "/etc/dspark/hot.txt") << "relative to the YAML file's folder";
  EXPECT_EQ(c.markov_cache.hot_tokens_file, "/var/seen.txt");
  EXPECT_THAT(parse_error("checkpoint: /c\nmarkov_cache: {rows: -1}\n"), HasSubstr("markov_cache.rows"));
  EXPECT_THAT(parse_error("checkpoint: /c\nmarkov_cache: {rows: 2000000}\n"), HasSubstr("markov_cache.rows"));
  EXPECT_THAT(parse_error("checkpoint: /c\nmarkov_cache: {tokens_file: \"\"}\n"),
              HasSubstr("markov_cache.tokens_file: must be a non-empty path"));
  EXPECT_THAT(parse_error("checkpoint: /c\nmarkov_cache: {size: 3}\n"),
              HasSubstr("markov_cache.size: unknown key"));
}

TEST(WorkerConfig, SamplingMaxDistributionsIsReadAndBoundedByTheBatch) {
  EXPECT_EQ(parse_worker_config("checkpoint: /c\n").sampling.max_distributions, 1);
  EXPECT_EQ(parse_worker_config("checkpoint: /c\nmax_batch: 8\nsampling: {max_distributions: 8}\n")
                .sampling.max_distributions,
            8);
  EXPECT_EQ(
      parse_worker_config("checkpoint: /c\nsampling: {max_distributions: 0}\n").sampling.max_distributions,
      0);
  EXPECT_THAT(parse_error("checkpoint: /c\nmax_batch: 4\nsampling: {max_distributions: 5}\n"),
              HasSubstr("sampling.max_distributions (5) must be at most max_batch (4)"));
  EXPECT_THAT(parse_error("checkpoint: /c\nsampling: {max_distributions: -1}\n"),
              HasSubstr("sampling.max_distributions"));
  EXPECT_THAT(parse_error("checkpoint: /c\nsampling: {rows: 3}\n"), HasSubstr("sampling.rows: unknown key"));
}

TEST(WorkerConfig, TuningIsValidatedStrictly) {
  EXPECT_THAT(parse_error("checkpoint: /c\ntuning: {pdl: false, nccl_windows: true}\n"),
              HasSubstr("tuning.nccl_windows: unknown key"));
  EXPECT_THAT(parse_error("checkpoint: /c\ntuning: {weight_tiles: experts}\n"),
              HasSubstr("tuning.weight_tiles: must be true or false (got 'experts')"));
  EXPECT_THAT(parse_error("checkpoint: /c\ntuning: {pdl: 0}\n"),
              HasSubstr("tuning.pdl: must be true or false"));
  EXPECT_THAT(parse_error("checkpoint: /c\ntuning: {peer_sum: \"false\"}\n"),
              HasSubstr("tuning.peer_sum: must be true or false"));
  EXPECT_THAT(parse_error("checkpoint: /c\ntuning: [pdl]\n"), HasSubstr("tuning: must be a mapping"));
  EXPECT_THAT(parse_error("checkpoint: /c\ndebug: {kernel_trace_file: ''}\n"),
              HasSubstr("debug.kernel_trace_file: must be a non-empty path"));
}

TEST(WorkerConfig, TuningDescribesEverySwitch) {
  EXPECT_EQ(describe(Tuning{}), "pdl on, weight_tiles on, head_tiles on, peer_sum on, bf16_copies on");
  EXPECT_EQ(describe(Tuning{.head_tiles = false, .peer_sum = false}),
            "pdl on, weight_tiles on, head_tiles off, peer_sum off, bf16_copies on");
}

// Two users' workers on one host must not claim the same socket: the default name carries the uid, and a
// config that names no ring gets it (an explicit name is kept as written).
TEST(WorkerConfig, DefaultRingNameCarriesTheUid) {
  const std::string uid = std::to_string(::getuid());
  EXPECT_EQ(default_ring_name(), "/dspark-" + uid);
  EXPECT_EQ(parse_worker_config("checkpoint: /c\nring: {group: g}\n").ring.name, "/dspark-" + uid);
  EXPECT_EQ(parse_worker_config("checkpoint: /c\nring: {name: /shared-ring}\n").ring.name, "/shared-ring");
}

TEST(WorkerConfig, NullValuesAndSectionsKeepDefaults) {
  const WorkerConfig c = parse_worker_config("checkpoint: /ckpt\ngraphs:\nlogging:\n  dir:\nslots: ~\n");
  EXPECT_EQ(c.slots, WorkerConfig{}.slots);
  EXPECT_TRUE(c.logging.dir.empty());
  EXPECT_EQ(c.graphs.batch_sizes, WorkerConfig{}.graphs.batch_sizes);
}

TEST(WorkerConfig, DefaultBucketsAreClippedToTheLimits) {
  const WorkerConfig c = parse_worker_config("checkpoint: /c\nmax_batch: 6\nmax_context_rows: 20\n");
  EXPECT_EQ(c.graphs.batch_sizes, (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(c.graphs.insert_rows, (std::vector<int64_t>{1, 8, 16}));
}

TEST(WorkerConfig, StepPairsAreListedOrDerivedFromTheBuckets) {
  const WorkerConfig c = parse_worker_config("checkpoint: /c\ngraphs: {steps: [[8, 1], [32, 4]]}\n");
  EXPECT_EQ(*c.graphs.steps, (std::vector<std::pair<int64_t, int64_t>>{{8, 1}, {32, 4}}));
  EXPECT_TRUE(parse_worker_config("checkpoint: /c\ngraphs: {steps: []}\n").graphs.steps->empty());
  EXPECT_FALSE(parse_worker_config("checkpoint: /c\n").graphs.steps.has_value());
  // k = 5: B sequences send B .. 6 B rows. B = 1: 1..6 rows, buckets 1 and 8; B = 2: 2..12, buckets 8 and 16;
  // B = 4: 4..24, 8, 16, 32; B = 8: 8..48, 8 .. 64; B = 16: 16..96, 16 .. 128.
  const std::vector<std::pair<int64_t, int64_t>> expected = {
      {1, 1},  {8, 1},  {8, 2},  {16, 2},  {8, 4},   {16, 4},  {32, 4},  {8, 8},
      {16, 8}, {32, 8}, {64, 8}, {16, 16}, {32, 16}, {64, 16}, {128, 16}};
  EXPECT_EQ(default_step_pairs(WorkerConfig{}.graphs, 5), expected);
  WorkerConfig::Graphs g;
  g.batch_sizes = {3};
  g.insert_rows = {2, 4, 40};
  EXPECT_EQ(default_step_pairs(g, 1), (std::vector<std::pair<int64_t, int64_t>>{{4, 3}, {40, 3}}));  // 3..6
  g.insert_rows = {1, 2};
  EXPECT_TRUE(default_step_pairs(g, 1).empty());  // no bucket holds 3 rows
}

TEST(WorkerConfig, RelativePathsResolveAgainstBaseDir) {
  EXPECT_EQ(parse_worker_config("checkpoint: ../out/ckpt\n", "/srv/dspark/configs").checkpoint,
            fs::path("/srv/dspark/out/ckpt"));
  EXPECT_EQ(parse_worker_config("checkpoint: ckpt\n", "/srv").checkpoint, fs::path("/srv/ckpt"));
  EXPECT_EQ(parse_worker_config("checkpoint: /abs/ckpt\n", "/srv").checkpoint, fs::path("/abs/ckpt"));

  // load_worker_config resolves against the YAML file's own folder.
  const fs::path dir =
      fs::temp_directory_path() / ("dspark_test_worker_config_" + std::to_string(::getpid()));
  fs::create_directories(dir / "configs");
  std::ofstream(dir / "configs" / "w.yaml") << "checkpoint: ../out/tiny-ckpt\n";
  const WorkerConfig c = load_worker_config(dir / "configs" / "w.yaml");
  EXPECT_EQ(c.checkpoint, (dir / "out" / "tiny-ckpt").lexically_normal());
  fs::remove_all(dir);
}

TEST(WorkerConfig, ShippedTinyCpuConfigParses) {
  const WorkerConfig c = load_worker_config(DSPARK_CONFIGS_DIR "/tiny-cpu.yaml");
  EXPECT_EQ(c.backend, BackendKind::cpu);
  EXPECT_EQ(c.slots, 8);
  EXPECT_EQ(c.max_batch, 8);
  EXPECT_EQ(c.ring.name, default_ring_name());  // per user: the README's client attaches without --ring
  EXPECT_TRUE(c.ring.group.empty());
  EXPECT_TRUE(c.checkpoint.is_absolute() || c.checkpoint.string().starts_with("../"));
  EXPECT_THAT(c.checkpoint.string(), EndsWith("out/tiny-ckpt"));
  EXPECT_EQ(c.checkpoint, (fs::path(DSPARK_CONFIGS_DIR) / "../out/tiny-ckpt").lexically_normal());
}

TEST(WorkerConfig, ShippedTinyCudaConfigSpellsOutTheDefaultTuning) {
  const WorkerConfig c = load_worker_config(DSPARK_CONFIGS_DIR "/tiny-cuda.yaml");
  EXPECT_EQ(c.backend, BackendKind::cuda);
  EXPECT_EQ(c.tuning, Tuning{});
}

TEST(WorkerConfig, ShippedV41ReleaseConfigPointsAtTheDownloadedDirectory) {
  const WorkerConfig c = load_worker_config(DSPARK_CONFIGS_DIR "/v41-flash-release.yaml");
  EXPECT_EQ(c.checkpoint, fs::path("/models/DeepSeek-V4.1-Flash"));
  EXPECT_EQ(c.backend, BackendKind::cuda);
  EXPECT_EQ(c.slots, 64);
  EXPECT_EQ(c.max_batch, 16);
  EXPECT_EQ(c.max_model_len, 1048576);
  EXPECT_EQ(c.max_context_rows, 1024);
  EXPECT_EQ(c.graphs.batch_sizes, (std::vector<int64_t>{1, 2, 4, 8, 16}));
  EXPECT_EQ(c.weights.head, "keep");
  EXPECT_EQ(c.ring.name, default_ring_name());
  EXPECT_EQ(c.tuning, Tuning{});
}

TEST(WorkerConfig, RingNamesAndPaths) {
  for (const char* n : {"/dspark-0", "dspark-0", "/run/dspark/w.sock"})
    EXPECT_EQ(parse_worker_config(std::string("checkpoint: /c\nring: {name: ") + n + "}\n").ring.name, n);
}

// ring.mode let any mode through (0666 gave every user the segment): its replacement names a group.
TEST(WorkerConfig, RingModeIsRefusedNamingWhatReplacedIt) {
  for (const char* m : {"0600", "0666"})
    EXPECT_THAT(parse_error(std::string("checkpoint: /c\nring: {mode: ") + m + "}\n"),
                AllOf(HasSubstr("ring.mode: is not a key any more"), HasSubstr("ring.group: <name>")))
        << m;
}

TEST(WorkerConfig, HostTimeoutIsBounded) {
  EXPECT_EQ(parse_worker_config("checkpoint: /c\nhealth: {host_timeout_ms: 100}\n").health.host_timeout_ms,
            100);
  EXPECT_EQ(parse_worker_config("checkpoint: /c\nhealth: {host_timeout_ms: 600000}\n").health.host_timeout_ms,
            600000);
}

TEST(WorkerConfig, ExchangeTimeoutStaysBelowTheStepBound) {
  const auto exchange = [](const std::string& health) {
    return parse_worker_config("checkpoint: /c\nhealth: " + health + "\n").health.exchange_timeout_ms;
  };
  // Unset: 10 s, or half the step bound when that is shorter.
  EXPECT_EQ(exchange("{step_timeout_ms: 60000}"), 10000);
  EXPECT_EQ(exchange("{step_timeout_ms: 8000}"), 4000);
  EXPECT_EQ(exchange("{step_timeout_ms: 100}"), 50);
  EXPECT_EQ(exchange("{exchange_timeout_ms: 10, step_timeout_ms: 100}"), 10);
  EXPECT_EQ(exchange("{exchange_timeout_ms: 29999}"), 29999);
  for (const char* bad :
       {"{exchange_timeout_ms: 30000}", "{exchange_timeout_ms: 600, step_timeout_ms: 500}"}) {
    try {
      exchange(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("health.exchange_timeout_ms"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("must be below health.step_timeout_ms"), std::string::npos)
          << e.what();
    }
  }
}

TEST(WorkerConfig, MetricsPortAndBind) {
  const WorkerConfig c = parse_worker_config("checkpoint: /c\nmetrics: {port: 9400, bind: 0.0.0.0}\n");
  EXPECT_EQ(c.metrics.port, 9400);
  EXPECT_EQ(c.metrics.bind, "0.0.0.0");
  EXPECT_EQ(parse_worker_config("checkpoint: /c\nmetrics: {port: 65535}\n").metrics.port, 65535);
  const std::pair<std::string, std::string> cases[] = {
      {"metrics: {port: -1}", "metrics.port: must be an integer in [0, 65535] (got -1)"},
      {"metrics: {port: 65536}", "metrics.port: must be an integer in [0, 65535] (got 65536)"},
      {"metrics: {port: http}", "metrics.port: must be an integer in [0, 65535] (got 'http')"},
      {"metrics: {bind: localhost}",
       "metrics.bind: must be an IPv4 address such as 127.0.0.1 (got 'localhost')"},
      {"metrics: {bind: '::1'}", "metrics.bind: must be an IPv4 address such as 127.0.0.1 (got '::1')"},
      {"metrics: {path: /x}", "metrics.path: unknown key"},
  };
  for (const auto& [yaml, msg] : cases)
    EXPECT_THAT(parse_error("checkpoint: /c\n" + yaml + "\n"), HasSubstr(msg)) << yaml;
}

TEST(WorkerConfig, CheckpointIsRequired) {
  EXPECT_THAT(parse_error(""), HasSubstr("checkpoint: required"));
  EXPECT_THAT(parse_error("slots: 4\n"), HasSubstr("checkpoint: required"));
  EXPECT_THAT(parse_error("checkpoint: ''\n"), HasSubstr("checkpoint: must be a non-empty path"));
}

TEST(WorkerConfig, UnknownKeysNameTheDottedPath) {
  EXPECT_THAT(parse_error("checkpoint: /c\ngraphs:\n  bucket: [1]\n"),
              HasSubstr("graphs.bucket: unknown key"));
  EXPECT_THAT(parse_error("checkpoint: /c\nslot: 4\n"), HasSubstr("slot: unknown key"));
  EXPECT_THAT(parse_error("checkpoint: /c\nring: {name: /x, perms: 0600}\n"),
              HasSubstr("ring.perms: unknown key"));
  EXPECT_THAT(parse_error("checkpoint: /c\nslots: 4\nslots: 5\n"), HasSubstr("slots: repeated key"));
}

TEST(WorkerConfig, ErrorsCarryTheLine) {
  EXPECT_THAT(parse_error("checkpoint: /c\n\ngraphs:\n  bucket: [1]\n"), HasSubstr("(line 4)"));
}

TEST(WorkerConfig, WrongTypesNameTheKey) {
  EXPECT_THAT(parse_error("checkpoint: /c\nslots: eight\n"), HasSubstr("slots: must be a positive integer"));
  EXPECT_THAT(parse_error("checkpoint: /c\nslots: \"8\"\n"), HasSubstr("slots: must be a positive integer"));
  EXPECT_THAT(parse_error("checkpoint: /c\nslots: 8.5\n"), HasSubstr("slots: must be a positive integer"));
  EXPECT_THAT(parse_error("checkpoint: /c\nslots: [8]\n"), HasSubstr("slots: must be a positive integer"));
  EXPECT_THAT(parse_error("checkpoint: /c\ngraphs: {enabled: 1}\n"),
              HasSubstr("graphs.enabled: must be true or false"));
  EXPECT_THAT(parse_error("checkpoint: /c\ngraphs: {enabled: yes}\n"),
              HasSubstr("graphs.enabled: must be true or false"));
  EXPECT_THAT(parse_error("checkpoint: /c\ngraphs: {batch_sizes: 4}\n"),
              HasSubstr("graphs.batch_sizes: must be a list of integers"));
  EXPECT_THAT(parse_error("checkpoint: /c\ngraphs: [1, 2]\n"), HasSubstr("graphs: must be a mapping"));
  EXPECT_THAT(parse_error("checkpoint: [a, b]\n"), HasSubstr("checkpoint: must be a string"));
  EXPECT_THAT(parse_error("- checkpoint: /c\n"), HasSubstr("the top level: must be a mapping"));
  EXPECT_THAT(parse_error("checkpoint: /c\ndevice_map: [0, x]\n"),
              HasSubstr("device_map[1]: must be a GPU index"));
}

TEST(WorkerConfig, ValuesOutOfRangeNameTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"graphs: {batch_sizes: [1, 2, 0]}", "graphs.batch_sizes[2]: must be a positive integer"},
      {"graphs: {batch_sizes: [1, 4, 2]}", "graphs.batch_sizes[2]: must be larger than the previous size 4"},
      {"graphs: {batch_sizes: [1, 32]}", "graphs.batch_sizes[1]: must be <= max_batch 16"},
      {"max_context_rows: 64\ngraphs: {insert_rows: [1, 128]}",
       "graphs.insert_rows[1]: must be <= max_context_rows 64"},
      {"graphs: {steps: [[16, 2], [12, 2]]}", "graphs.steps[1]: rows 12 is not one of graphs.insert_rows"},
      {"graphs: {steps: [[16, 3]]}",
       "graphs.steps[0]: batch 3 is not one of graphs.batch_sizes [1, 2, 4, 8, 16]"},
      {"graphs: {steps: [[16]]}", "graphs.steps[0]: must be a [rows, batch] pair"},
      {"graphs: {steps: [[16, 0]]}", "graphs.steps[0][1]: must be a positive integer"},
      {"graphs: {steps: 16}", "graphs.steps: must be a list of [rows, batch] pairs"},
      {"slots: 0", "slots: must be a positive integer (got 0)"},
      {"max_batch: -1", "max_batch: must be a positive integer"},
      {"max_model_len: 4294967296", "max_model_len: must be <= 2147483647"},
      {"max_context_rows: 0", "max_context_rows: must be a positive integer"},
      // Values past the type a field is narrowed to are refused, not wrapped (4294967297 was 1 as uint32).
      {"max_context_rows: 4294967297", "max_context_rows: must be <= 2147483647 (got 4294967297)"},
      {"max_context_rows: 2147483648", "max_context_rows: must be <= 2147483647 (got 2147483648)"},
      {"slots: 65537", "slots: must be <= 65536 (got 65537)"},
      {"slots: 4294967304", "slots: must be <= 65536 (got 4294967304)"},
      {"max_batch: 65537", "max_batch: must be <= 65536 (got 65537)"},
      {"max_model_len: 2147483648", "max_model_len: must be <= 2147483647 (got 2147483648)"},
      {"max_batch: 99999999999999999999",
       "max_batch: must be a positive integer (got '99999999999999999999', beyond 64 bits)"},
      {"device_map: [2147483648]", "device_map[0]: must be a GPU index <= 2147483647 (got 2147483648)"},
      {"health: {max_failed_steps: 4294967296}",
       "health.max_failed_steps: must be <= 2147483647 (got 4294967296)"},
      {"backend: tpu", "backend: must be one of cpu | cuda (got 'tpu')"},
      {"ring: {name: a/b}",
       "ring.name: must be a name (like /dspark-0 or dspark-0) or an absolute socket path"},
      {"ring: {name: /}", "ring.name: must be a name"},
      {"ring: {name: ''}", "ring.name: must be a name"},
      {"ring: {group: ''}", "ring.group: must be a group name"},
      {"ring: {socket_dir: ''}", "ring.socket_dir: must be a non-empty path"},
      {"device_map: [0, -1]", "device_map[1]: must be a GPU index >= 0"},
      {"weights: {head: fp4}", "weights.head: must be one of keep | fp8"},
      {"logging: {level: verbose}", "logging.level: must be one of trace"},
      {"health: {host_timeout_ms: 0}", "health.host_timeout_ms: must be an integer in [100, 600000] (got 0)"},
      {"health: {host_timeout_ms: 99}",
       "health.host_timeout_ms: must be an integer in [100, 600000] (got 99)"},
      {"health: {host_timeout_ms: 600001}",
       "health.host_timeout_ms: must be an integer in [100, 600000] (got 600001)"},
      {"health: {host_timeout_ms: 9223372036854775807}",
       "health.host_timeout_ms: must be an integer in [100, 600000] (got 9223372036854775807)"},
      {"health: {max_failed_steps: 0}", "health.max_failed_steps: must be a positive integer"},
      {"health: {exchange_timeout_ms: 9}",
       "health.exchange_timeout_ms: must be an integer in [10, 3600000] (got 9)"},
      {"health: {step_timeout_ms: 99}",
       "health.step_timeout_ms: must be an integer in [100, 3600000] (got 99)"},
      {"health: {step_timeout_ms: 3600001}",
       "health.step_timeout_ms: must be an integer in [100, 3600000] (got 3600001)"},
      {"health: {step_timeout_ms: 4294967297}",
       "health.step_timeout_ms: must be an integer in [100, 3600000] (got 4294967297)"},
      {"health: {step_timeout_ms: 1e4}",
       "health.step_timeout_ms: must be an integer in [100, 3600000] (got '1e4')"},
  };
  for (const auto& [yaml, msg] : cases) {
    EXPECT_THAT(parse_error("checkpoint: /c\n" + yaml + "\n"), HasSubstr(msg)) << yaml;
  }
}

TEST(WorkerConfig, IntegersAtTheirUpperBoundsAreAccepted) {
  const WorkerConfig c = parse_worker_config(
      "checkpoint: /c\nslots: 65536\nmax_batch: 65536\nmax_context_rows: 2147483647\n"
      "max_model_len: 2147483647\ndevice_map: [2147483647]\nhealth: {max_failed_steps: 2147483647}\n");
  EXPECT_EQ(c.slots, 65536);
  EXPECT_EQ(c.max_batch, 65536);
  EXPECT_EQ(c.max_context_rows, 2147483647);
  EXPECT_EQ(c.max_model_len, 2147483647);
  EXPECT_EQ(c.device_map, std::vector<int64_t>{2147483647});
  EXPECT_EQ(c.health.max_failed_steps, 2147483647);
}

TEST(WorkerConfig, SyntaxAndFileErrors) {
  EXPECT_THAT(parse_error("checkpoint: [unclosed\n"), HasSubstr("invalid YAML"));
  try {
    load_worker_config("/nonexistent/dspark.yaml");
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/dspark.yaml: cannot open"));
  }
}

}  // namespace
}  // namespace dspark
