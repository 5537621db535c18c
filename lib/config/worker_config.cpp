#include "lib/config/worker_config.hpp"

#include <yaml-cpp/yaml.h>

#include <arpa/inet.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <charconv>
#include <cstdint>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

#include "lib/core/error.hpp"

// Only the Node API common to yaml-cpp 0.7 and 0.8 is used (Type/IsX, Scalar, Tag, Mark, iteration); scalars
// are converted here rather than with as<T>() so that types are strict (no "yes" for true, no "8" for 8) and
// every error names the dotted key.
namespace dspark {
namespace {

class Ctx {
 public:
  explicit Ctx(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void bad(const std::string& key, const YAML::Node& n, std::string_view what) const {
    const YAML::Mark m = n.Mark();
    if (m.line >= 0) fail("{}: {}: {} (line {})", source_, key, what, m.line + 1);
    fail("{}: {}: {}", source_, key, what);
  }

  // A plain (unquoted) scalar's text; quoted strings are strings, never numbers or booleans.
  std::string plain(const YAML::Node& n, const std::string& key, std::string_view expected) const {
    if (!n.IsScalar() || n.Tag() == "!") bad(key, n, fmt::format("must be {}", expected));
    return n.Scalar();
  }

  int64_t integer(const YAML::Node& n, const std::string& key,
                  std::string_view expected = "an integer") const {
    const std::string s = plain(n, key, expected);
    const char* b = s.data() + (s.size() > 1 && s[0] == '+' ? 1 : 0);
    int64_t v = 0;
    auto [end, ec] = std::from_chars(b, s.data() + s.size(), v);
    if (ec == std::errc::result_out_of_range && end == s.data() + s.size())
      bad(key, n, fmt::format("must be {} (got '{}', beyond 64 bits)", expected, s));
    if (ec != std::errc() || end != s.data() + s.size())
      bad(key, n, fmt::format("must be {} (got '{}')", expected, s));
    return v;
  }
  int64_t positive(const YAML::Node& n, const std::string& key) const {
    const int64_t v = integer(n, key, "a positive integer");
    if (v <= 0) bad(key, n, fmt::format("must be a positive integer (got {})", v));
    return v;
  }
  int64_t within(const YAML::Node& n, const std::string& key, int64_t lo, int64_t hi) const {
    const int64_t v = integer(n, key, fmt::format("an integer in [{}, {}]", lo, hi));
    if (v < lo || v > hi) bad(key, n, fmt::format("must be an integer in [{}, {}] (got {})", lo, hi, v));
    return v;
  }
  // 1 .. hi: every integer of the config has an upper bound, so none can wrap where it is narrowed (the
  // model description's uint32 fields, int32 slots and rows on the wire).
  int64_t positive_at_most(const YAML::Node& n, const std::string& key, int64_t hi) const {
    const int64_t v = positive(n, key);
    if (v > hi) bad(key, n, fmt::format("must be <= {} (got {})", hi, v));
    return v;
  }
  bool boolean(const YAML::Node& n, const std::string& key) const {
    const std::string s = plain(n, key, "true or false");
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
    bad(key, n, fmt::format("must be true or false (got '{}')", s));
  }
  std::string string(const YAML::Node& n, const std::string& key) const {
    if (!n.IsScalar()) bad(key, n, "must be a string");
    return n.Scalar();
  }
  std::string one_of(const YAML::Node& n, const std::string& key,
                     std::initializer_list<std::string_view> allowed) const {
    const std::string s = string(n, key);
    for (std::string_view a : allowed)
      if (s == a) return s;
    bad(key, n, fmt::format("must be one of {} (got '{}')", fmt::join(allowed, " | "), s));
  }
  // A list of integers, each checked by `elem` (which receives the element's dotted key).
  std::vector<int64_t> int_list(
      const YAML::Node& n, const std::string& key,
      const std::function<int64_t(const YAML::Node&, const std::string&)>& elem) const {
    if (!n.IsSequence()) bad(key, n, "must be a list of integers");
    std::vector<int64_t> out;
    for (size_t i = 0; i < n.size(); ++i) out.push_back(elem(n[i], fmt::format("{}[{}]", key, i)));
    return out;
  }

  using Handler = std::function<void(const YAML::Node& value, const std::string& key)>;
  // Dispatches each key of a mapping to its handler. Unknown and repeated keys are errors; a key whose value
  // is null (`key:` with nothing after it) keeps its default.
  void fields(const YAML::Node& map, const std::string& prefix,
              const std::map<std::string, Handler>& handlers) const {
    const std::string where = prefix.empty() ? "the top level" : prefix;
    if (!map.IsMap()) bad(where, map, "must be a mapping");
    std::set<std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string name = it->first.IsScalar() ? it->first.Scalar() : "?";
      const std::string key = prefix.empty() ? name : prefix + "." + name;
      const auto h = handlers.find(name);
      if (h == handlers.end()) bad(key, it->first, "unknown key");
      if (!seen.insert(name).second) bad(key, it->first, "repeated key");
      if (!it->second.IsNull()) h->second(it->second, key);
    }
  }

  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

std::filesystem::path resolve(const std::filesystem::path& base_dir, const std::filesystem::path& p) {
  return (p.is_absolute() ? p : base_dir / p).lexically_normal();
}

// A bare name (one leading '/' allowed) or, holding a '/' past its first character, an absolute socket path.
std::string ring_name(const Ctx& x, const YAML::Node& n, const std::string& key) {
  std::string s = x.string(n, key);
  const bool path = s.find('/', 1) != std::string::npos;
  if (s.empty() || s == "/" || s.find('\0') != std::string::npos || (path && s[0] != '/') || s.size() > 107)
    x.bad(key, n,
          fmt::format("must be a name (like /dspark-0 or dspark-0) or an absolute socket path of at most 107 "
                      "bytes (got '{}')",
                      s));
  return s;
}

// Sizes of CUDA-graph buckets: positive, strictly increasing, at most `limit` (the matching serving limit).
void check_buckets(const Ctx& x, const YAML::Node& n, const std::string& key, const std::vector<int64_t>& v,
                   int64_t limit, std::string_view limit_key) {
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string k = fmt::format("{}[{}]", key, i);
    if (i > 0 && v[i] <= v[i - 1])
      x.bad(k, n[i], fmt::format("must be larger than the previous size {}", v[i - 1]));
    if (v[i] > limit) x.bad(k, n[i], fmt::format("must be <= {} {} (got {})", limit_key, limit, v[i]));
  }
}

YAML::Node load_yaml(const std::string& text, const std::string& source) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail("{}: invalid YAML: {}", source, e.what());
  }
}

// The sections, one function each. Handlers take (value node, dotted key).
using Handler = Ctx::Handler;

// The upper bounds of the worker config's integers (docs/configuration.md).
constexpr int64_t kMaxSlots = 65536;              // slots' KV rings are allocated up front
constexpr int64_t kMaxBatch = 65536;              // a step message carries at most 2^16 draft requests
constexpr int64_t kMaxInt32 = INT32_MAX;          // slots, rows, positions and GPU indices are int32
constexpr int64_t kMaxFailedSteps = INT32_MAX;    // health answers carry the count as uint32
constexpr int64_t kMaxMarkovCacheRows = 1 << 20;  // more rows than any vocabulary (V x V_r x 4 bytes)

Handler positive_at_most_into(const Ctx& x, int64_t& dst, int64_t hi) {
  return [&x, &dst, hi](const YAML::Node& n, const std::string& k) { dst = x.positive_at_most(n, k, hi); };
}
Handler bool_into(const Ctx& x, bool& dst) {
  return [&x, &dst](const YAML::Node& n, const std::string& k) { dst = x.boolean(n, k); };
}

void read_ring(const Ctx& x, const YAML::Node& n, const std::string& key,
               const std::filesystem::path& base_dir, WorkerConfig::Ring& r) {
  x.fields(n, key,
           {{"name", [&](const auto& v, const auto& k) { r.name = ring_name(x, v, k); }},
            {"group",
             [&](const auto& v, const auto& k) {
               r.group = x.string(v, k);
               if (r.group.empty()) x.bad(k, v, "must be a group name");
             }},
            {"socket_dir",
             [&](const auto& v, const auto& k) {
               const std::string s = x.string(v, k);
               if (s.empty()) x.bad(k, v, "must be a non-empty path");
               r.socket_dir = resolve(base_dir, s);
             }},
            {"mode", [&](const auto& v, const auto& k) {
               x.bad(
                   k, v,
                   "is not a key any more: the socket is the worker's uid's only; ring.group: <name> lets a "
                   "group's members attach (docs/configuration.md)");
             }}});
}

// Also records which bucket lists were written out, for the checks against the limits.
void read_graphs(const Ctx& x, const YAML::Node& n, const std::string& key, WorkerConfig::Graphs& g,
                 std::optional<YAML::Node>& batch_sizes, std::optional<YAML::Node>& insert_rows,
                 std::optional<YAML::Node>& steps) {
  auto list = [&](std::vector<int64_t>& dst, std::optional<YAML::Node>& node) -> Handler {
    return [&](const YAML::Node& v, const std::string& k) {
      dst = x.int_list(v, k, [&](const auto& e, const auto& ek) { return x.positive(e, ek); });
      node.emplace(v);
    };
  };
  x.fields(n, key,
           {{"enabled", bool_into(x, g.enabled)},
            {"batch_sizes", list(g.batch_sizes, batch_sizes)},
            {"insert_rows", list(g.insert_rows, insert_rows)},
            {"steps", [&](const YAML::Node& v, const std::string& k) {
               if (!v.IsSequence()) x.bad(k, v, "must be a list of [rows, batch] pairs");
               std::vector<std::pair<int64_t, int64_t>> pairs;
               for (size_t i = 0; i < v.size(); ++i) {
                 const std::string ek = fmt::format("{}[{}]", k, i);
                 const std::vector<int64_t> p =
                     x.int_list(v[i], ek, [&](const auto& e, const auto& kk) { return x.positive(e, kk); });
                 if (p.size() != 2) x.bad(ek, v[i], "must be a [rows, batch] pair");
                 pairs.emplace_back(p[0], p[1]);
               }
               g.steps = std::move(pairs);
               steps.emplace(v);
             }}});
}

// Each pair's rows must be an insert bucket and its batch a recorded batch size (the lists as finally set).
void check_step_pairs(const Ctx& x, const YAML::Node& n, const WorkerConfig::Graphs& g) {
  for (size_t i = 0; i < g.steps->size(); ++i) {
    const auto [rows, batch] = (*g.steps)[i];
    const std::string k = fmt::format("graphs.steps[{}]", i);
    if (std::find(g.insert_rows.begin(), g.insert_rows.end(), rows) == g.insert_rows.end())
      x.bad(
          k, n[i],
          fmt::format("rows {} is not one of graphs.insert_rows [{}]", rows, fmt::join(g.insert_rows, ", ")));
    if (std::find(g.batch_sizes.begin(), g.batch_sizes.end(), batch) == g.batch_sizes.end())
      x.bad(k, n[i],
            fmt::format("batch {} is not one of graphs.batch_sizes [{}]", batch,
                        fmt::join(g.batch_sizes, ", ")));
  }
}

std::vector<int64_t> read_device_map(const Ctx& x, const YAML::Node& n, const std::string& key) {
  return x.int_list(n, key, [&](const YAML::Node& e, const std::string& k) {
    const int64_t v = x.integer(e, k, "a GPU index >= 0");
    if (v < 0) x.bad(k, e, fmt::format("must be a GPU index >= 0 (got {})", v));
    if (v > kMaxInt32) x.bad(k, e, fmt::format("must be a GPU index <= {} (got {})", kMaxInt32, v));
    return v;
  });
}

void read_logging(const Ctx& x, const YAML::Node& n, const std::string& key,
                  const std::filesystem::path& base_dir, WorkerConfig::Logging& l) {
  x.fields(n, key,
           {{"level",
             [&](const auto& v, const auto& k) {
               l.level = x.one_of(v, k, {"trace", "debug", "info", "warn", "error", "critical", "off"});
             }},
            {"dir", [&](const auto& v, const auto& k) { l.dir = resolve(base_dir, x.string(v, k)); }}});
}

void read_metrics(const Ctx& x, const YAML::Node& n, const std::string& key, WorkerConfig::Metrics& m) {
  x.fields(n, key,
           {{"port", [&](const auto& v, const auto& k) { m.port = x.within(v, k, 0, 65535); }},
            {"bind", [&](const auto& v, const auto& k) {
               m.bind = x.string(v, k);
               in_addr addr{};
               if (inet_pton(AF_INET, m.bind.c_str(), &addr) != 1)
                 x.bad(k, v, fmt::format("must be an IPv4 address such as 127.0.0.1 (got '{}')", m.bind));
             }}});
}

WorkerConfig parse(const std::string& text, const std::filesystem::path& base_dir,
                   const std::string& source) {
  const Ctx x(source);
  const YAML::Node root = load_yaml(text, source);
  if (root.IsNull()) fail("{}: checkpoint: required", source);

  WorkerConfig c;
  bool have_checkpoint = false;
  std::optional<YAML::Node> batch_sizes, insert_rows, steps;
  std::optional<int64_t> exchange_timeout;
  x.fields(
      root, "",
      {{"checkpoint",
        [&](const YAML::Node& n, const std::string& k) {
          const std::string s = x.string(n, k);
          if (s.empty()) x.bad(k, n, "must be a non-empty path");
          c.checkpoint = resolve(base_dir, s);
          have_checkpoint = true;
        }},
       {"backend",
        [&](const YAML::Node& n, const std::string& k) {
          c.backend = x.one_of(n, k, {"cpu", "cuda"}) == "cpu" ? BackendKind::cpu : BackendKind::cuda;
        }},
       {"slots", positive_at_most_into(x, c.slots, kMaxSlots)},
       {"max_batch", positive_at_most_into(x, c.max_batch, kMaxBatch)},
       // Positions travel as int32 on the ring and in the kernels.
       {"max_model_len", positive_at_most_into(x, c.max_model_len, kMaxInt32)},
       {"max_context_rows", positive_at_most_into(x, c.max_context_rows, kMaxInt32)},
       {"ring", [&](const YAML::Node& n, const std::string& k) { read_ring(x, n, k, base_dir, c.ring); }},
       {"graphs",
        [&](const YAML::Node& n, const std::string& k) {
          read_graphs(x, n, k, c.graphs, batch_sizes, insert_rows, steps);
        }},
       {"device_map",
        [&](const YAML::Node& n, const std::string& k) { c.device_map = read_device_map(x, n, k); }},
       {"weights",
        [&](const YAML::Node& n, const std::string& k) {
          x.fields(n, k, {{"head", [&](const YAML::Node& v, const std::string& kk) {
                             c.weights.head = x.one_of(v, kk, {"keep", "fp8"});
                           }}});
        }},
       {"logging",
        [&](const YAML::Node& n, const std::string& k) { read_logging(x, n, k, base_dir, c.logging); }},
       {"health",
        [&](const YAML::Node& n, const std::string& k) {
          x.fields(
              n, k,
              {{"host_timeout_ms",
                [&](const auto& v, const auto& key) {
                  c.health.host_timeout_ms = x.within(v, key, kMinHostTimeoutMs, kMaxHostTimeoutMs);
                }},
               {"max_failed_steps", positive_at_most_into(x, c.health.max_failed_steps, kMaxFailedSteps)},
               {"step_timeout_ms",
                [&](const auto& v, const auto& key) {
                  c.health.step_timeout_ms = x.within(v, key, kMinStepTimeoutMs, kMaxStepTimeoutMs);
                }},
               {"exchange_timeout_ms", [&](const auto& v, const auto& key) {
                  exchange_timeout = x.within(v, key, kMinExchangeTimeoutMs, kMaxStepTimeoutMs);
                }}});
        }},
       {"metrics", [&](const YAML::Node& n, const std::string& k) { read_metrics(x, n, k, c.metrics); }},
       {"markov_cache",
        [&](const YAML::Node& n, const std::string& k) {
          const auto path_into = [&](std::filesystem::path& p) {
            return [&](const YAML::Node& v, const std::string& kk) {
              const std::string s = x.string(v, kk);
              if (s.empty()) x.bad(kk, v, "must be a non-empty path");
              p = resolve(base_dir, s);
            };
          };
          x.fields(n, k,
                   {{"rows",
                     [&](const auto& v, const auto& kk) {
                       c.markov_cache.rows = x.within(v, kk, 0, kMaxMarkovCacheRows);
                     }},
                    {"tokens_file", path_into(c.markov_cache.tokens_file)},
                    {"hot_tokens_file", path_into(c.markov_cache.hot_tokens_file)}});
        }},
       {"sampling",
        [&](const YAML::Node& n, const std::string& k) {
          x.fields(n, k, {{"max_distributions", [&](const auto& v, const auto& kk) {
                             c.sampling.max_distributions = x.within(v, kk, 0, kMaxBatch);
                           }}});
        }},
       {"tuning",
        [&](const YAML::Node& n, const std::string& k) {
          x.fields(n, k,
                   {{"pdl", bool_into(x, c.tuning.pdl)},
                    {"weight_tiles", bool_into(x, c.tuning.weight_tiles)},
                    {"head_tiles", bool_into(x, c.tuning.head_tiles)},
                    {"peer_sum", bool_into(x, c.tuning.peer_sum)},
                    {"bf16_copies", bool_into(x, c.tuning.bf16_copies)}});
        }},
       {"debug", [&](const YAML::Node& n, const std::string& k) {
          x.fields(n, k,
                   {{"check_replicated", bool_into(x, c.debug.check_replicated)},
                    {"kernel_trace_file", [&](const YAML::Node& v, const std::string& kk) {
                       const std::string s = x.string(v, kk);
                       if (s.empty()) x.bad(kk, v, "must be a non-empty path");
                       c.debug.kernel_trace_file = resolve(base_dir, s);
                     }}});
        }}});
  if (!have_checkpoint) fail("{}: checkpoint: required", source);
  if (!exchange_timeout) {
    c.health.exchange_timeout_ms = std::min(kDefaultExchangeTimeoutMs, c.health.step_timeout_ms / 2);
  } else if (*exchange_timeout >= c.health.step_timeout_ms) {
    fail(
        "{}: health.exchange_timeout_ms ({}) must be below health.step_timeout_ms ({}): a step waiting for a "
        "late rank must fail before the step bound ends the worker",
        source, *exchange_timeout, c.health.step_timeout_ms);
  } else {
    c.health.exchange_timeout_ms = *exchange_timeout;
  }

  // An explicit bucket above its limit is an error; the default lists are clipped to the limits instead.
  if (batch_sizes) {
    check_buckets(x, *batch_sizes, "graphs.batch_sizes", c.graphs.batch_sizes, c.max_batch, "max_batch");
  } else {
    std::erase_if(c.graphs.batch_sizes, [&](int64_t b) { return b > c.max_batch; });
  }
  if (insert_rows) {
    check_buckets(x, *insert_rows, "graphs.insert_rows", c.graphs.insert_rows, c.max_context_rows,
                  "max_context_rows");
  } else {
    std::erase_if(c.graphs.insert_rows, [&](int64_t b) { return b > c.max_context_rows; });
  }
  if (steps) check_step_pairs(x, *steps, c.graphs);
  if (c.sampling.max_distributions > c.max_batch)
    fail("{}: sampling.max_distributions ({}) must be at most max_batch ({})", source,
         c.sampling.max_distributions, c.max_batch);
  return c;
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> default_step_pairs(const WorkerConfig::Graphs& g,
                                                            int64_t block_size) {
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (const int64_t b : g.batch_sizes) {
    for (size_t i = 0; i < g.insert_rows.size(); ++i) {
      const int64_t rows = g.insert_rows[i];
      // A bucket below B cannot hold the fewest rows; above the first one >= B (k + 1), the most fit lower.
      const bool below_high = i == 0 || g.insert_rows[i - 1] < b * (block_size + 1);
      if (rows >= b && below_high) pairs.emplace_back(rows, b);
    }
  }
  return pairs;
}

std::string default_ring_name() {
  return fmt::format("/dspark-{}", ::getuid());
}

WorkerConfig parse_worker_config(const std::string& yaml_text, const std::filesystem::path& base_dir) {
  return parse(yaml_text, base_dir, "worker config");
}

WorkerConfig load_worker_config(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::filesystem::path dir =
      path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  return parse(ss.str(), dir, path.string());
}

}  // namespace dspark
