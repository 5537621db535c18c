// A shared mapping of a file, unmapped when its owner goes away.
#pragma once

#include <cstddef>
#include <utility>

namespace dspark::host {

class Mapping {
 public:
  Mapping() = default;
  // mmap(MAP_SHARED) of `bytes` of `fd` with `prot`; throws dspark::Error naming `what` on failure.
  Mapping(int fd, size_t bytes, int prot, const char* what);
  Mapping(Mapping&& o) noexcept
      : addr_(std::exchange(o.addr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();

  void* addr() const { return addr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* addr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace dspark::host
