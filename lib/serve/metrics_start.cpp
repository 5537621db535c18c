#include <spdlog/spdlog.h>

#include "lib/core/error.hpp"
#include "lib/serve/metrics.hpp"
#ifdef DSPARK_WITH_PROMETHEUS
#include "lib/serve/prometheus_metrics.hpp"
#endif

namespace dspark {

bool metrics_built() {
#ifdef DSPARK_WITH_PROMETHEUS
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Metrics> start_metrics(const WorkerConfig::Metrics& cfg, [[maybe_unused]] int64_t slots) {
  if (cfg.port == 0) return nullptr;
#ifdef DSPARK_WITH_PROMETHEUS
  auto m = std::make_unique<PrometheusMetrics>(slots);
  m->serve(cfg.bind, cfg.port);
  spdlog::info("metrics: http://{}:{}/metrics", cfg.bind, cfg.port);
  return m;
#else
  fail(
      "metrics.port: {}: this build has no Prometheus metrics (built without prometheus-cpp and "
      "libmicrohttpd; "
      "install prometheus-cpp-dev and libmicrohttpd-dev, as scripts/install_deps.sh does, and configure "
      "again), "
      "or set metrics.port: 0",
      cfg.port);
#endif
}

}  // namespace dspark
