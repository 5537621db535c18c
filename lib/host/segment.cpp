// The worker's named shared-memory segment: created (replacing a stale one) by rank 0, opened and checked by
// hosts.
#include "lib/host/segment.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

#include "lib/core/error.hpp"
#include "lib/host/codec.hpp"

namespace dspark::host {
namespace {

constexpr uint64_t kRingAlign = 64;
constexpr uint64_t kMinRingBytes = 64 * 1024;
constexpr uint64_t kOpenMinRingBytes = 64;  // what open() accepts: a header-sized message must fit
constexpr uint64_t kFreshHeartbeatNs = 2'000'000'000;
constexpr size_t kMaxNameBytes = 255;  // NAME_MAX of the file under /dev/shm, with the leading '/'

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

uint64_t align_up(uint64_t n, uint64_t a) {
  return (n + a - 1) / a * a;
}

void check_name(const std::string& name) {
  if (name.size() < 2 || name.size() > kMaxNameBytes || name[0] != '/' ||
      name.find('/', 1) != std::string::npos)
    fail("shared memory segment name '{}': must be '/' and 1 to {} characters other than '/'", name,
         kMaxNameBytes - 1);
}

// What create() found under a name that already exists.
struct Existing {
  bool gone = false;  // removed meanwhile
  bool live = false;  // a running worker's: leave it alone
  int32_t pid = 0;
  std::string why;  // why it may be replaced
};

Existing inspect(const std::string& name) {
  Fd fd{shm_open(name.c_str(), O_RDONLY, 0)};
  if (fd.fd < 0) {
    const int e = errno;
    if (e == ENOENT) return Existing{.gone = true, .live = false, .pid = 0, .why = {}};
    fail("shared memory segment {} exists and cannot be opened to check it: {}", name, std::strerror(e));
  }
  struct stat st {};
  if (fstat(fd.fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < sizeof(SegmentHeader))
    return Existing{.gone = false, .live = false, .pid = 0, .why = "not a dspark segment"};
  void* p = mmap(nullptr, sizeof(SegmentHeader), PROT_READ, MAP_SHARED, fd.fd, 0);
  if (p == MAP_FAILED) fail("shared memory segment {} exists and cannot be mapped to check it", name);
  const auto* h = static_cast<const SegmentHeader*>(p);
  Existing e;
  if (h->magic != kMagic || h->version != kProtocolVersion || h->header_bytes != sizeof(SegmentHeader)) {
    e.why = "not a dspark segment of this protocol version";
  } else {
    e.pid = h->worker_pid.load();
    const uint64_t beat = h->worker_heartbeat_ns.load();
    const uint64_t now = monotonic_ns();  // read after the heartbeat: a live one is not ahead of it
    const bool fresh = beat >= now || now - beat < kFreshHeartbeatNs;
    e.live = process_alive(e.pid) && fresh;
    e.why = !process_alive(e.pid) ? fmt::format("its worker pid {} is gone", e.pid)
                                  : fmt::format("its heartbeat is {:.1f} s old", (now - beat) * 1e-9);
  }
  munmap(p, sizeof(SegmentHeader));
  return e;
}

// shm_open(O_CREAT | O_EXCL), first removing a stale segment of the same name.
int create_exclusive(const std::string& name, uint32_t mode) {
  for (int attempt = 0;; ++attempt) {
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, static_cast<mode_t>(mode));
    if (fd >= 0) return fd;
    const int err = errno;
    if (err != EEXIST || attempt == 2)
      fail("cannot create shared memory segment {}: {}", name, std::strerror(err));
    const Existing e = inspect(name);
    if (e.gone) continue;
    if (e.live) fail("shared memory segment {} belongs to a live worker (pid {})", name, e.pid);
    if (shm_unlink(name.c_str()) != 0 && errno != ENOENT)
      fail("cannot remove the stale shared memory segment {}: {}", name, std::strerror(errno));
    spdlog::warn("removed the stale shared memory segment {} ({})", name, e.why);
  }
}

RingView checked_ring(const std::string& name, const char* which, RingControl* ctl, uint8_t* base,
                      uint64_t offset, uint64_t bytes, uint64_t file_bytes) {
  if (!std::has_single_bit(bytes) || bytes < kOpenMinRingBytes || offset % kRingAlign != 0 ||
      offset < sizeof(SegmentHeader) || offset > file_bytes || bytes > file_bytes - offset)
    fail(
        "shared memory segment {}: its {} ring ({} bytes at offset {}) is not a power of 2 of at least {} "
        "bytes, "
        "aligned to {}, after the header and within the segment's {} bytes",
        name, which, bytes, offset, kOpenMinRingBytes, kRingAlign, file_bytes);
  return RingView{ctl, base + offset, bytes};
}

}  // namespace

bool process_alive(int32_t pid) {
  return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t request_ring_bytes(const ModelDescription& m) {
  const uint64_t step = max_step_bytes(m);
  if (step > UINT32_MAX)
    fail(
        "a full step message ({} context rows of {} bytes) is {} bytes, over the protocol's 4 GiB: lower "
        "max_context_rows",
        m.max_context_rows, m.row_bytes, step);
  return std::max(kMinRingBytes, std::bit_ceil(2 * step));
}

uint64_t response_ring_bytes(const ModelDescription& m) {
  const uint64_t answer = max_draft_answer_bytes(m);
  if (answer > UINT32_MAX)
    fail("a full draft answer ({} x {} drafts) is {} bytes, over the protocol's 4 GiB", m.max_batch,
         m.block_size, answer);
  return std::max(kMinRingBytes, std::bit_ceil(8 * answer));
}

Segment Segment::create(const std::string& name, uint32_t mode, const ModelDescription& model) {
  check_name(name);
  if ((mode & ~07777u) != 0) fail("shared memory segment {}: {:o} is not a permission mode", name, mode);
  const uint64_t request_bytes = request_ring_bytes(model);
  const uint64_t response_bytes = response_ring_bytes(model);
  const uint64_t request_offset = align_up(sizeof(SegmentHeader), kRingAlign);
  const uint64_t response_offset = request_offset + request_bytes;
  const uint64_t total = response_offset + response_bytes;

  Fd fd{create_exclusive(name, mode)};
  // A failure from here on removes the half-made segment.
  const auto undo = [&](const char* what) {
    const int err = errno;
    shm_unlink(name.c_str());
    fail("cannot {} shared memory segment {}: {}", what, name, std::strerror(err));
  };
  // shm_open applied the umask: set exactly the mode asked for.
  if (fchmod(fd.fd, static_cast<mode_t>(mode)) != 0) undo("set the mode of");
  if (ftruncate(fd.fd, static_cast<off_t>(total)) != 0) undo("size");
  struct stat st {};
  if (fstat(fd.fd, &st) != 0) undo("stat");
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
  if (p == MAP_FAILED) undo("map");

  auto* h = new (p) SegmentHeader();
  h->version = kProtocolVersion;
  h->header_bytes = sizeof(SegmentHeader);
  h->request_offset = request_offset;
  h->request_bytes = request_bytes;
  h->response_offset = response_offset;
  h->response_bytes = response_bytes;
  h->model = model;
  h->worker_state.store(static_cast<uint32_t>(WorkerState::starting));
  h->worker_pid.store(getpid());
  h->worker_heartbeat_ns.store(monotonic_ns());
  h->host_pid.store(0);
  // Last: a host opening meanwhile sees either no dspark segment or a whole header.
  std::atomic_ref<uint64_t>(h->magic).store(kMagic, std::memory_order_release);

  Segment s;
  s.name_ = name;
  s.header_ = h;
  s.bytes_ = total;
  s.owner_ = true;
  s.dev_ = st.st_dev;
  s.ino_ = st.st_ino;
  auto* base = static_cast<uint8_t*>(p);
  s.requests_ = RingView{&h->request_ctl, base + request_offset, request_bytes};
  s.responses_ = RingView{&h->response_ctl, base + response_offset, response_bytes};
  spdlog::info("created shared memory segment {} (mode {:o}; rings of {} and {} bytes)", name, mode,
               request_bytes, response_bytes);
  return s;
}

Segment Segment::open(const std::string& name) {
  check_name(name);
  Fd fd{shm_open(name.c_str(), O_RDWR, 0)};
  if (fd.fd < 0) {
    const int err = errno;
    if (err == ENOENT) fail("shared memory segment {} does not exist (is the worker running?)", name);
    fail("cannot open shared memory segment {}: {}", name, std::strerror(err));
  }
  struct stat st {};
  if (fstat(fd.fd, &st) != 0) fail("cannot stat shared memory segment {}: {}", name, std::strerror(errno));
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < sizeof(SegmentHeader))
    fail("shared memory segment {} is not a dspark segment ({} bytes, smaller than a header)", name, size);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
  if (p == MAP_FAILED) fail("cannot map shared memory segment {}: {}", name, std::strerror(errno));

  Segment s;  // unmaps on a failed check below
  s.name_ = name;
  s.header_ = static_cast<SegmentHeader*>(p);
  s.bytes_ = size;
  SegmentHeader* h = s.header_;
  const uint64_t magic = std::atomic_ref<uint64_t>(h->magic).load(std::memory_order_acquire);
  if (magic != kMagic)
    fail("shared memory segment {} is not a dspark segment (magic 0x{:016x})", name, magic);
  if (h->version != kProtocolVersion)
    fail("shared memory segment {} speaks protocol version {}; this build speaks version {}", name,
         h->version, kProtocolVersion);
  if (h->header_bytes != sizeof(SegmentHeader))
    fail("shared memory segment {} has a header of {} bytes; this build expects {}", name, h->header_bytes,
         sizeof(SegmentHeader));
  auto* base = static_cast<uint8_t*>(p);
  s.requests_ =
      checked_ring(name, "request", &h->request_ctl, base, h->request_offset, h->request_bytes, size);
  s.responses_ =
      checked_ring(name, "response", &h->response_ctl, base, h->response_offset, h->response_bytes, size);
  const uint64_t rq = h->request_offset, rs = h->response_offset;
  if (rq < rs + s.responses_.capacity && rs < rq + s.requests_.capacity)
    fail("shared memory segment {}: its request and response rings overlap", name);
  return s;
}

Segment::Segment(Segment&& o) noexcept {
  *this = std::move(o);
}

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    close();
    name_ = std::move(o.name_);
    header_ = std::exchange(o.header_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    owner_ = std::exchange(o.owner_, false);
    requests_ = std::exchange(o.requests_, RingView{});
    responses_ = std::exchange(o.responses_, RingView{});
    dev_ = o.dev_;
    ino_ = o.ino_;
  }
  return *this;
}

Segment::~Segment() {
  close();
}

void Segment::close() noexcept {
  if (header_ != nullptr) munmap(header_, bytes_);
  if (owner_) {
    // Only while the name still is this segment: a later worker may have replaced it (after deciding this one
    // was stale), and its segment is not ours to remove.
    struct stat st {};
    const int fd = shm_open(name_.c_str(), O_RDONLY, 0);
    const bool unreadable = fd < 0 && errno == EACCES;  // a write-only mode: cannot check, assume ours
    const bool same =
        unreadable || (fd >= 0 && fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_dev) == dev_ &&
                       static_cast<uint64_t>(st.st_ino) == ino_);
    if (fd >= 0) ::close(fd);
    if (same) shm_unlink(name_.c_str());
  }
  header_ = nullptr;
  bytes_ = 0;
  owner_ = false;
  requests_ = responses_ = RingView{};
}

RingView Segment::requests() const {
  return requests_;
}

RingView Segment::responses() const {
  return responses_;
}

}  // namespace dspark::host
