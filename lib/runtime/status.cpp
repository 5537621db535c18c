#include "runtime/status.hpp"

namespace dspark {

std::string_view status_name(Status s) {
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

}  // namespace dspark
