#include "lib/host/mapping.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "lib/core/error.hpp"

namespace dspark::host {

Mapping::Mapping(int fd, size_t bytes, int prot, const char* what) {
  void* p = mmap(nullptr, bytes, prot, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail("cannot map the {} ({} bytes): {}", what, bytes, std::strerror(errno));
  addr_ = p;
  bytes_ = bytes;
}

Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    if (addr_ != nullptr) munmap(addr_, bytes_);
    addr_ = std::exchange(o.addr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

Mapping::~Mapping() {
  if (addr_ != nullptr) munmap(addr_, bytes_);
}

}  // namespace dspark::host
