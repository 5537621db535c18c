// The memfds of one attach: created and sealed by the worker, checked and mapped by the host.
#include "lib/host/session_areas.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

#include "lib/core/error.hpp"
#include "lib/host/codec.hpp"
#include "lib/host/liveness.hpp"

namespace dspark::host {
namespace {

constexpr uint64_t kMinRingBytes = 64 * 1024;
constexpr uint64_t kOpenMinRingBytes = 64;          // what open() accepts: a header-sized message must fit
constexpr uint64_t kOpenMaxRingBytes = 1ull << 40;  // what open() maps at most

constexpr uint64_t kWorkerDataOffset = area_data_offset<WorkerHeader>();
constexpr uint64_t kHostDataOffset = area_data_offset<HostHeader>();

UniqueFd new_memfd(const char* name, uint64_t bytes) {
  UniqueFd fd(memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) fail("cannot create the memfd {}: {}", name, std::strerror(errno));
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0)
    fail("cannot size the memfd {} to {} bytes: {}", name, bytes, std::strerror(errno));
  return fd;
}

void seal(int fd, int seals, const char* name) {
  if (fcntl(fd, F_ADD_SEALS, seals) != 0) fail("cannot seal the memfd {}: {}", name, std::strerror(errno));
}

// The size of an area the host was handed, after checking its seals.
uint64_t checked_area(int fd, int seals, const char* what) {
  const int have = fcntl(fd, F_GET_SEALS);
  if (have < 0) fail("the {} is not a sealable memfd: {}", what, std::strerror(errno));
  if ((have & seals) != seals)
    fail("the {} is not sealed as the protocol requires (seals 0x{:x}, needs 0x{:x})", what, have, seals);
  struct stat st {};
  if (fstat(fd, &st) != 0) fail("cannot stat the {}: {}", what, std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

bool ring_bytes_ok(uint64_t bytes) {
  return std::has_single_bit(bytes) && bytes >= kOpenMinRingBytes && bytes <= kOpenMaxRingBytes;
}

}  // namespace

const int kWorkerAreaSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;
const int kHostAreaSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

uint64_t request_ring_bytes(const ModelDescription& m) {
  const uint64_t step = max_step_bytes(m);
  if (step > UINT32_MAX)
    fail(
        "a full step message ({} context rows of {} bytes) is {} bytes, over the protocol's 4 GiB: lower "
        "max_context_rows",
        m.max_context_rows, m.row_bytes, step);
  return std::max(kMinRingBytes, std::bit_ceil(2 * step));
}

uint64_t response_ring_bytes(const ModelDescription& m, uint32_t max_distributions) {
  const uint64_t greedy = max_draft_answer_bytes(m, 0), answer = max_draft_answer_bytes(m, max_distributions);
  if (answer > UINT32_MAX)
    fail(
        "a full draft answer ({} x {} drafts, {} whole distributions of {} values) is {} bytes, over the "
        "protocol's 4 GiB: lower sampling.max_distributions",
        m.max_batch, m.block_size, max_distributions, m.vocab_size, answer);
  return std::max({kMinRingBytes, std::bit_ceil(8 * greedy), std::bit_ceil(2 * answer)});
}

SessionAreas SessionAreas::create(const ModelDescription& model, uint64_t session, WorkerState state,
                                  uint32_t version, uint32_t max_distributions) {
  SessionAreas a;
  a.request_bytes_ = request_ring_bytes(model);
  a.response_bytes_ = response_ring_bytes(model, version >= 7 ? max_distributions : 0);
  a.worker_fd_ = new_memfd("dspark-worker-area", kWorkerDataOffset + a.response_bytes_);
  a.host_fd_ = new_memfd("dspark-host-area", kHostDataOffset + a.request_bytes_);
  a.worker_map_ = Mapping(a.worker_fd_.get(), kWorkerDataOffset + a.response_bytes_, PROT_READ | PROT_WRITE,
                          "worker area");
  auto* h = new (a.worker_map_.addr()) WorkerHeader();
  h->magic = kMagic;
  h->version = version;
  h->header_bytes = sizeof(WorkerHeader);
  h->request_bytes = a.request_bytes_;
  h->response_bytes = a.response_bytes_;
  h->model = model;
  h->session = session;
  h->worker_state.store(static_cast<uint32_t>(state));
  h->worker_pid.store(getpid());
  h->worker_heartbeat_ns.store(monotonic_ns());
  // After the writable mapping above: it stays writable, every later one cannot be.
  seal(a.worker_fd_.get(), kWorkerAreaSeals, "worker area");
  seal(a.host_fd_.get(), kHostAreaSeals, "host area");
  a.host_map_ = Mapping(a.host_fd_.get(), kHostDataOffset + a.request_bytes_, PROT_READ, "host area");
  return a;
}

SessionAreas SessionAreas::open(UniqueFd worker_area, UniqueFd host_area) {
  const uint64_t worker_size = checked_area(worker_area.get(), kWorkerAreaSeals, "worker area");
  const uint64_t host_size = checked_area(host_area.get(), kHostAreaSeals, "host area");
  if (worker_size < kWorkerDataOffset)
    fail("the worker area has {} bytes, less than its header's {}", worker_size, kWorkerDataOffset);
  SessionAreas a;
  a.worker_map_ = Mapping(worker_area.get(), worker_size, PROT_READ, "worker area");
  const WorkerHeader& h = a.worker();
  if (h.magic != kMagic) fail("the worker area is not a dspark worker area (magic 0x{:016x})", h.magic);
  if (h.version != kProtocolVersion)
    fail("the worker speaks protocol version {}; this build speaks version {}", h.version, kProtocolVersion);
  if (h.header_bytes != sizeof(WorkerHeader))
    fail("the worker area has a header of {} bytes; this build expects {}", h.header_bytes,
         sizeof(WorkerHeader));
  const uint64_t rq = h.request_bytes, rs = h.response_bytes;
  if (!ring_bytes_ok(rq) || !ring_bytes_ok(rs))
    fail("the worker's rings of {} and {} bytes: each must be a power of 2 from {} to {}", rq, rs,
         kOpenMinRingBytes, kOpenMaxRingBytes);
  if (worker_size != kWorkerDataOffset + rs || host_size != kHostDataOffset + rq)
    fail(
        "the worker area ({} bytes) and host area ({} bytes) do not hold rings of {} and {} bytes after "
        "their "
        "headers",
        worker_size, host_size, rs, rq);
  a.host_map_ = Mapping(host_area.get(), host_size, PROT_READ | PROT_WRITE, "host area");
  a.request_bytes_ = rq;
  a.response_bytes_ = rs;
  return a;
}

RingView SessionAreas::requests() const {
  return RingView{&host().request, &worker().request,
                  static_cast<uint8_t*>(host_map_.addr()) + kHostDataOffset, request_bytes_};
}

RingView SessionAreas::responses() const {
  return RingView{&worker().response, &host().response,
                  static_cast<uint8_t*>(worker_map_.addr()) + kWorkerDataOffset, response_bytes_};
}

void SessionAreas::drop_fds() {
  worker_fd_.reset();
  host_fd_.reset();
}

}  // namespace dspark::host
