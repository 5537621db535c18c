// The named POSIX shared-memory segment of a worker (SPEC §7): created by rank 0, opened by hosts.
#pragma once

#include <cstdint>
#include <string>

#include "lib/host/protocol.hpp"
#include "lib/host/ring.hpp"

namespace dspark::host {

// Ring capacities for a model: the request ring holds a full step message (max_context_rows rows + its draft
// batch) twice over; the response ring a full draft answer many times over. Both powers of 2.
uint64_t request_ring_bytes(const ModelDescription& m);
uint64_t response_ring_bytes(const ModelDescription& m);

bool process_alive(int32_t pid);
uint64_t monotonic_ns();

class Segment {
 public:
  // Worker side: creates `name` with permissions `mode` (owner-only by default) and fills the header (state
  // starting, worker_pid = this process). Refuses (dspark::Error naming the segment) when the name exists and
  // belongs to a live worker; removes a stale one (dead worker or not a dspark segment) and creates it anew.
  static Segment create(const std::string& name, uint32_t mode, const ModelDescription& model);
  // Host side: opens an existing segment and checks magic, version and sizes. Error names the segment.
  static Segment open(const std::string& name);

  Segment(Segment&&) noexcept;
  Segment& operator=(Segment&&) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();  // unmaps; the creator also unlinks the name

  SegmentHeader& header() const { return *header_; }
  RingView requests() const;
  RingView responses() const;
  const std::string& name() const { return name_; }

 private:
  Segment() = default;
  void close() noexcept;
  std::string name_;
  SegmentHeader* header_ = nullptr;
  size_t bytes_ = 0;
  bool owner_ = false;
  RingView requests_{}, responses_{};  // validated once: the header's offsets are not trusted afterwards
  uint64_t dev_ = 0, ino_ = 0;         // the creator unlinks the name only while it still names this segment
};

}  // namespace dspark::host
