#include "comm/mpi_communicator.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>

#include "lib/core/error.hpp"
#include "lib/core/markov_record.hpp"

namespace dspark {
namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail("MPI {} failed: {}", what, std::string(msg, static_cast<size_t>(len)));
}

// MPI counts are int: large buffers move in pieces.
constexpr size_t kMaxChunk = size_t{1} << 30;

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
  check(MPI_Comm_rank(comm_, &rank_), "Comm_rank");
  check(MPI_Comm_size(comm_, &size_), "Comm_size");
  // Errors come back as return codes (turned into exceptions) instead of aborting the job.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

void MpiCommunicator::all_gather(const void* mine, void* all, size_t bytes) {
  if (bytes > kMaxChunk) fail("all_gather of {} bytes per rank is over the {} limit", bytes, kMaxChunk);
  check(MPI_Allgather(mine, static_cast<int>(bytes), MPI_BYTE, all, static_cast<int>(bytes), MPI_BYTE, comm_),
        "Allgather");
}

void MpiCommunicator::all_reduce_sum(const Tensor& partial) {
  if (partial.dtype != DType::f32) fail("all_reduce_sum: f32 only, got {}", dtype_name(partial.dtype));
  const size_t bytes = partial.nbytes();
  gathered_.resize(bytes * static_cast<size_t>(size_));
  all_gather(partial.data, gathered_.data(), bytes);
  // Rank order on every rank: identical bits everywhere.
  float* out = partial.as<float>();
  const int64_t n = partial.numel();
  const float* parts = reinterpret_cast<const float*>(gathered_.data());
  for (int64_t i = 0; i < n; ++i) {
    float acc = 0.0f;
    for (int r = 0; r < size_; ++r) acc += parts[static_cast<int64_t>(r) * n + i];
    out[i] = acc;
  }
}

void MpiCommunicator::argmax_exchange(const Tensor& cand) {
  const size_t bytes = cand.nbytes();
  const int64_t B = static_cast<int64_t>(bytes / sizeof(MarkovRecord));
  gathered_.resize(bytes * static_cast<size_t>(size_));
  all_gather(cand.data, gathered_.data(), bytes);
  const MarkovRecord* parts = reinterpret_cast<const MarkovRecord*>(gathered_.data());
  MarkovRecord* out = reinterpret_cast<MarkovRecord*>(cand.data);
  for (int64_t b = 0; b < B; ++b) {
    MarkovRecord acc = parts[b];
    for (int r = 1; r < size_; ++r) acc = merge_markov(acc, parts[static_cast<int64_t>(r) * B + b]);
    out[b] = acc;
  }
}

void MpiCommunicator::broadcast(void* data, size_t bytes, int root) {
  char* p = static_cast<char*>(data);
  for (size_t off = 0; off < bytes; off += kMaxChunk) {
    const size_t n = std::min(kMaxChunk, bytes - off);
    MPI_Request req;
    check(MPI_Ibcast(p + off, static_cast<int>(n), MPI_BYTE, root, comm_, &req), "Ibcast");
    wait_idle_friendly(req);
  }
}

void MpiCommunicator::wait_idle_friendly(MPI_Request& req) {
  // A blocking MPI wait spins: ranks waiting for the next step plan would burn a core each while the worker
  // is idle. Spin for a short while (steps arrive back to back while serving), then sleep with a growing
  // pause.
  using clock = std::chrono::steady_clock;
  const auto spin_until = clock::now() + std::chrono::milliseconds(2);
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    int done = 0;
    check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "Test");
    if (done) return;
    if (clock::now() < spin_until) continue;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
  }
}

bool MpiCommunicator::any(bool flag) {
  int mine = flag ? 1 : 0, all = 0;
  check(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LOR, comm_), "Allreduce");
  return all != 0;
}

bool MpiCommunicator::one_host() const {
  MPI_Comm local;
  check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local), "Comm_split_type");
  int here = 0;
  MPI_Comm_size(local, &here);
  MPI_Comm_free(&local);
  int all_here = here == size_ ? 1 : 0, every = 0;
  check(MPI_Allreduce(&all_here, &every, 1, MPI_INT, MPI_LAND, comm_), "Allreduce");
  return every != 0;
}

void MpiCommunicator::barrier() {
  check(MPI_Barrier(comm_), "Barrier");
}

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "Init_thread");
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_free(&local);
}

MpiSession::~MpiSession() {
  MPI_Finalize();
}

}  // namespace dspark
