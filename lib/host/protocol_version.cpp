#include "lib/host/protocol_version.hpp"

#include <fmt/format.h>

#include "lib/host/protocol.hpp"

namespace dspark::host {

bool protocol_served(uint32_t version) {
  return version >= kMinProtocolVersion && version <= kProtocolVersion;
}

std::string served_versions() {
  if (kMinProtocolVersion == kProtocolVersion) return fmt::format("protocol version {}", kProtocolVersion);
  return fmt::format("protocol versions {} to {}", kMinProtocolVersion, kProtocolVersion);
}

std::string version_refusal(uint32_t version) {
  return fmt::format("the client speaks protocol version {}; this worker serves {}", version,
                     served_versions());
}

}  // namespace dspark::host
