// The compatibility rule of protocol.hpp ("Protocol versions"): which versions a worker serves and what it
// answers a peer of any other, so that the socket's door and the attach message say the same.
#pragma once

#include <cstdint>
#include <string>

namespace dspark::host {

// Whether this build serves a peer speaking `version`: kMinProtocolVersion <= version <= kProtocolVersion.
bool protocol_served(uint32_t version);

// "protocol version 3", or "protocol versions 3 to 4" once an older one is still served.
std::string served_versions();

// The refusal of a peer speaking `version`, naming it and the served ones: "the client speaks protocol
// version 2; this worker serves protocol version 3".
std::string version_refusal(uint32_t version);

}  // namespace dspark::host
