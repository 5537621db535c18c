// The shared memory of one attach (protocol.hpp): two sealed memfds the worker creates for each host it
// accepts. The worker area is written by the worker alone (the host can only map it read-only), the host area
// by the host; neither can be shrunk or grown, so no side can make the other fault on its mapping.
#pragma once

#include <cstdint>

#include "lib/host/mapping.hpp"
#include "lib/host/protocol.hpp"
#include "lib/host/ring.hpp"
#include "lib/host/unique_fd.hpp"

namespace dspark::host {

// Ring capacities for a model: the request ring holds a full step message (max_context_rows rows + its draft
// batch) twice over; the response ring a full greedy draft answer many times over, and one with
// max_distributions whole distributions twice. Both powers of 2.
uint64_t request_ring_bytes(const ModelDescription& m);
uint64_t response_ring_bytes(const ModelDescription& m, uint32_t max_distributions = 0);

// The seals each area carries (F_GET_SEALS); a host refuses areas without them.
extern const int kWorkerAreaSeals;
extern const int kHostAreaSeals;

class SessionAreas {
 public:
  // Worker side: creates both memfds, fills the worker header (model, session, state, this pid, heartbeat)
  // and seals them: the worker area after this process mapped it writable, so that no mapping made later can
  // write it (F_SEAL_FUTURE_WRITE). The worker maps the host area read-only.
  // `version`: the protocol version the host's hello asked for (a served one), written into the header.
  static SessionAreas create(const ModelDescription& model, uint64_t session, WorkerState state,
                             uint32_t version = kProtocolVersion, uint32_t max_distributions = 0);
  // Host side: checks both memfds (seals, sizes, magic, version, ring capacities), then maps the worker area
  // read-only and the host area read-write. dspark::Error says what is wrong.
  static SessionAreas open(UniqueFd worker_area, UniqueFd host_area);

  // On the host side the worker header is read-only memory: writing it faults.
  WorkerHeader& worker() const { return *static_cast<WorkerHeader*>(worker_map_.addr()); }
  HostHeader& host() const { return *static_cast<HostHeader*>(host_map_.addr()); }
  RingView requests() const;   // host -> worker
  RingView responses() const;  // worker -> host

  // The descriptors (worker side: to send to the host, then drop_fds(); the mappings stay).
  int worker_fd() const { return worker_fd_.get(); }
  int host_fd() const { return host_fd_.get(); }
  void drop_fds();

 private:
  SessionAreas() = default;
  UniqueFd worker_fd_, host_fd_;
  Mapping worker_map_, host_map_;
  uint64_t request_bytes_ = 0, response_bytes_ = 0;
};

}  // namespace dspark::host
