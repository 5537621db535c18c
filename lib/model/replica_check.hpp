// The debug check of SPEC §5: activations every rank must hold identically (the stream after each half, the
// routing decisions) are hashed and compared across ranks; a mismatch fails the step loudly on every rank.
#pragma once

#include <cstdint>
#include <string>

#include "comm/communicator.hpp"
#include "lib/model/backend.hpp"

namespace dspark {

// FNV-1a over the tensor's bytes (downloaded from the backend).
uint64_t tensor_hash(Backend& backend, const Tensor& t);

// Throws dspark::Error on every rank, naming `what` and each rank's hash, when the ranks' tensors differ.
void verify_replicated(Communicator& comm, Backend& backend, const std::string& what, const Tensor& t);

}  // namespace dspark
