#include "lib/model/replica_check.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

#include "lib/core/error.hpp"

namespace dspark {

uint64_t tensor_hash(Backend& backend, const Tensor& t) {
  std::vector<uint8_t> bytes(t.nbytes());
  backend.download(bytes.data(), t);
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

void verify_replicated(Communicator& comm, Backend& backend, const std::string& what, const Tensor& t) {
  const uint64_t mine = tensor_hash(backend, t);
  std::vector<uint64_t> all(static_cast<size_t>(comm.size()));
  comm.all_gather(&mine, all.data(), sizeof(mine));
  for (uint64_t h : all)
    if (h != all[0])
      fail("replicated activations differ across ranks at {} (hash per rank: {:016x})", what,
           fmt::join(all, ", "));
}

}  // namespace dspark
