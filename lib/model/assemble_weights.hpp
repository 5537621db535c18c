// DrafterWeights from a source of tensors: the one place that knows which checkpoint tensor fills which
// field. The loader's source reads this rank's part from the checkpoint; the benchmark's generates it on the
// GPU.
#pragma once

#include <functional>

#include "lib/checkpoint/tensor_table.hpp"
#include "lib/config/model_config.hpp"
#include "lib/model/weights.hpp"

namespace dspark {

// This rank's part of one table entry (in backend memory).
using TensorSource = std::function<Tensor(const DrafterTensor&)>;
// This rank's part of one linear entry, in whatever format it is stored.
using LinearSource = std::function<LinearWeight(const DrafterTensor&)>;

// Calls `part` once for every tensor of drafter_tensors(cfg) that is not a linear weight and `linear` for
// every one that is; DrafterWeights::bytes is the sum of their stored parts (linear_bytes). The head is a
// plain entry ("head.weight"): `head`, when given, makes its LinearWeight (an EXL3 head has parts of its
// own), else it is dense over part(head.weight).
DrafterWeights assemble_drafter_weights(const ModelConfig& cfg, const TensorSource& part,
                                        const LinearSource& linear, const LinearSource& head = {});
// Every linear weight dense, from `part` as well.
DrafterWeights assemble_drafter_weights(const ModelConfig& cfg, const TensorSource& part);

}  // namespace dspark
