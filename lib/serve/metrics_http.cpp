#include "lib/serve/metrics_http.hpp"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>

#include "lib/core/error.hpp"

namespace dspark {
namespace {

MHD_Result respond(MHD_Connection* c, unsigned status, const std::string& body, const char* type) {
  MHD_Response* r =
      MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (r == nullptr) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  const MHD_Result ret = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ret;
}

// Each request is answered on its first call: a GET has no body to wait for.
MHD_Result handle(void* cls, MHD_Connection* c, const char* url, const char* method, const char* /*version*/,
                  const char* /*upload*/, size_t* /*upload_size*/, void** /*state*/) {
  const auto* self = static_cast<const MetricsHttp*>(cls);
  if (std::strcmp(method, MHD_HTTP_METHOD_GET) != 0 && std::strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
    return respond(c, MHD_HTTP_METHOD_NOT_ALLOWED, "GET /metrics\n", "text/plain");
  if (std::strcmp(url, "/metrics") != 0)
    return respond(c, MHD_HTTP_NOT_FOUND, "GET /metrics\n", "text/plain");
  return respond(c, MHD_HTTP_OK, self->body()(), "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace

MetricsHttp::MetricsHttp(const std::string& bind, int port, Body body) : body_(std::move(body)) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, bind.c_str(), &addr.sin_addr) != 1)
    fail("metrics: '{}' is not an IPv4 address", bind);
  errno = 0;
  daemon_ = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, static_cast<uint16_t>(port),
                             nullptr, nullptr, &handle, this, MHD_OPTION_SOCK_ADDR, &addr, MHD_OPTION_END);
  if (daemon_ == nullptr)
    fail("metrics: cannot listen on {}:{} (metrics.bind, metrics.port): {}", bind, port,
         errno != 0 ? std::strerror(errno) : "libmicrohttpd could not start");
}

MetricsHttp::~MetricsHttp() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

}  // namespace dspark
