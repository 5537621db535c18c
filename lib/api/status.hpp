// Status codes of every answer (SPEC §7).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dspark {

enum class Status : uint32_t {
  ok = 0,
  invalid_argument = 1,    // slot, token, position, k' or sizes out of range: rejected whole, nothing changed
  resource_exhausted = 2,  // batch or rows over the configured limits
  unavailable = 3,         // starting, draining, unhealthy
  internal = 4,            // the step failed; its slots were reset
};

inline std::string_view status_name(Status s) {
  switch (s) {
    case Status::ok:
      return "OK";
    case Status::invalid_argument:
      return "INVALID_ARGUMENT";
    case Status::resource_exhausted:
      return "RESOURCE_EXHAUSTED";
    case Status::unavailable:
      return "UNAVAILABLE";
    case Status::internal:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

struct StatusOr {
  Status status = Status::ok;
  std::string message;
  bool ok() const { return status == Status::ok; }
};

}  // namespace dspark
