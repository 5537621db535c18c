// A host's or observer's side of the attach (protocol.hpp): one try at the worker's socket.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "lib/host/peer.hpp"
#include "lib/host/protocol.hpp"
#include "lib/host/unique_fd.hpp"

namespace dspark::host {

struct DoorAnswer {
  enum class Kind {
    no_worker,    // nothing listens at the path (yet): try again
    not_ready,    // the worker is not serving yet: try again
    wrong_owner,  // the worker runs as another uid than expected: nothing was sent
    refused,      // the worker said no (why): trying again will not help
    accepted,
  };
  Kind kind = Kind::no_worker;
  std::string why;
  PeerCred worker;                  // SO_PEERCRED of the worker (once connected)
  UniqueFd socket;                  // an accepted host's connection: the worker closes it to end the session
  UniqueFd worker_area, host_area;  // an accepted host's memfds
  Observation observation{};        // an accepted observer's answer
  StatsMore observation_more{};     // and its acceptance and Markov cache figures
};

// Connects to `path`, checks that the worker runs as `expected_uid` before sending anything, says hello as
// `kind` and waits up to `timeout` for the reply.
DoorAnswer knock(const std::string& path, uint32_t expected_uid, PeerKind kind,
                 std::chrono::milliseconds timeout);

}  // namespace dspark::host
