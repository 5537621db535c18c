// The worker's side of the attach (protocol.hpp): a thread that answers every connection to the worker's
// socket, and a thread that keeps the attached host's worker area's heartbeat fresh.
//
// A connection from a uid other than the worker's euid (or a member of ring.group) is refused before
// anything is read from it. An observer gets an Observation. A host is admitted while the worker serves and
// no other host is attached: it gets two fresh sealed memfds (SessionAreas), and the server takes it with
// wait_admitted(). Every connection is handled within a bounded time (the hello must come within
// hello_timeout), so no peer can stall the door.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "lib/host/listener.hpp"
#include "lib/host/peer.hpp"
#include "lib/host/protocol.hpp"
#include "lib/host/session_areas.hpp"
#include "lib/host/unique_fd.hpp"

namespace dspark::host {

struct DoorOptions {
  std::string path;   // the socket (socket_path.hpp)
  std::string group;  // ring.group: its members may connect too ("" = the worker's euid only)
  ModelDescription model;
  std::chrono::milliseconds hello_timeout{500};
  bool stamp_heartbeat = true;  // false: the owner stamps worker_heartbeat_ns itself (a test's hung worker)
  uint32_t max_distributions = 0;  // whole distributions per answer the response ring has room for
};

// A host the door admitted; the server serves it until it calls release().
struct AdmittedHost {
  PeerCred peer;
  uint64_t session = 0;
  uint64_t admitted_ns = 0;  // the worker's clock at admission: the host's heartbeat is counted from here
  SessionAreas areas;
  uint32_t version = kProtocolVersion;  // the protocol version of its hello: its messages' layout
};

class HostDoor {
 public:
  // Fills an observer's counters (stats, failed_in_a_row); called on the door's thread.
  using Observe = std::function<void(Observation&, StatsMore&)>;

  // Binds the socket (Listener; state starting) and starts the threads. Throws dspark::Error naming the path,
  // or ring.group when it names no group.
  HostDoor(DoorOptions options, Observe observe);
  ~HostDoor();  // stops the threads; the socket closes and its path is removed
  HostDoor(const HostDoor&) = delete;
  HostDoor& operator=(const HostDoor&) = delete;

  const std::string& path() const { return listener_.path(); }
  // The model description of later sessions (the weight formats, known once loaded).
  void set_model(const ModelDescription& m);
  // serving admits hosts; stored in the attached host's worker area too.
  void set_state(WorkerState s);
  WorkerState state() const { return static_cast<WorkerState>(state_.load()); }

  // Waits up to `timeout` for a host admitted since the last call.
  std::shared_ptr<AdmittedHost> wait_admitted(std::chrono::milliseconds timeout);
  // The attached host's socket closed, or the host wrote to it (nothing is to come after the hello).
  bool host_hung_up() const { return hung_up_.load(); }
  // Ends the attached host's session: its socket is closed (the host sees it at once) and the next host may
  // be admitted. The caller drops its AdmittedHost afterwards.
  void release();

  uint64_t refused() const { return refused_.load(); }
  // The attached host's pid (SO_PEERCRED), 0 when none is.
  int32_t host_pid() const { return host_pid_.load(); }

 private:
  void door_loop();
  void heartbeat_loop();
  void handle(UniqueFd conn);
  void admit(UniqueFd conn, const PeerCred& peer, uint32_t version);
  void observe(int conn, uint32_t version);
  // version: the peer's, once its hello is read.
  void refuse(int conn, Admission a, const std::string& why, bool count,
              std::optional<uint32_t> version = std::nullopt);
  void refuse_version(int conn, uint32_t version);
  bool allowed(uint32_t uid) const;

  DoorOptions opt_;
  Observe observe_;
  std::optional<uint32_t> gid_;
  Listener listener_;
  UniqueFd wake_;  // eventfd: release() and the destructor wake the door's poll
  std::atomic<uint32_t> state_{static_cast<uint32_t>(WorkerState::starting)};
  std::atomic<bool> quit_{false};
  std::atomic<bool> hung_up_{false};
  std::atomic<uint64_t> refused_{0};
  std::atomic<int32_t> host_pid_{0};

  mutable std::mutex mu_;  // guards what follows
  std::condition_variable cv_;
  std::shared_ptr<AdmittedHost> live_;     // the attached host: its worker area gets the heartbeat and state
  std::shared_ptr<AdmittedHost> pending_;  // admitted, not yet taken by wait_admitted()
  bool release_requested_ = false;
  ModelDescription model_;

  // The door thread's own.
  UniqueFd host_socket_;
  uint64_t sessions_ = 0;

  std::thread door_, heartbeat_;
};

}  // namespace dspark::host
