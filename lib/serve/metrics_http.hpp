// The HTTP side of the metrics: GET /metrics answers a text body (the Prometheus text format), anything else
// 404, on libmicrohttpd's own thread. (prometheus-cpp's own exposer cannot run in the worker: its civetweb
// threads have fixed 100 KB stacks, smaller than the static TLS of the CUDA libraries the worker links, so
// they fail to start.)
#pragma once

#include <functional>
#include <string>

struct MHD_Daemon;

namespace dspark {

class MetricsHttp {
 public:
  using Body = std::function<std::string()>;
  // Listens on bind:port (an IPv4 address); throws dspark::Error naming the address when it cannot.
  // `body` is called on the server's thread for each scrape.
  MetricsHttp(const std::string& bind, int port, Body body);
  ~MetricsHttp();
  MetricsHttp(const MetricsHttp&) = delete;
  MetricsHttp& operator=(const MetricsHttp&) = delete;

  const Body& body() const { return body_; }

 private:
  Body body_;
  MHD_Daemon* daemon_ = nullptr;
};

}  // namespace dspark
