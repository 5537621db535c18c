#include "lib/serve/rank_load.hpp"

#include <sys/resource.h>

#include <type_traits>

namespace dspark {

static_assert(std::is_trivially_copyable_v<RankLoad>, "RankLoad crosses ranks as bytes");

uint64_t peak_resident_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;  // Linux reports kilobytes
}

std::vector<RankLoad> gather_rank_loads(Communicator& comm, const RankLoad& mine) {
  std::vector<RankLoad> all(static_cast<size_t>(comm.size()));
  comm.all_gather(&mine, all.data(), sizeof(RankLoad));
  return all;
}

}  // namespace dspark
