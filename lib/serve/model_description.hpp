// What a worker tells an attaching host about the model it serves (SPEC §7's attach answer): the sizes, the
// limits it was started with, the tapped target layers and the weight formats it loaded.
#pragma once

#include <cstdint>
#include <string>

#include "lib/config/model_config.hpp"
#include "lib/core/weight_format.hpp"
#include "lib/host/protocol.hpp"
#include "lib/model/weights.hpp"

namespace dspark {

// The served limits the description carries beside the model's sizes.
struct ServedLimits {
  int64_t slots = 0;
  int64_t max_batch = 0;
  int64_t max_context_rows = 0;
  int64_t max_model_len = 0;
  int tp = 1;
};

host::ModelDescription describe_model(const ModelConfig& m, const ServedLimits& limits);

// The tapped target layers in row order and the noise token (the config refuses more than 16 layers).
host::ModelTaps describe_taps(const ModelConfig& m);

// The model description's code of a loaded weight's format: the representation, whatever layout the backend
// keeps it in (the CUDA backend's mma tiles hold the same values).
uint32_t format_code(WeightFormat f);

// The representations of every loaded linear weight (the head included): model-description bits and names.
struct LoadedFormats {
  uint32_t bits = 0;
  std::string names;
};
LoadedFormats loaded_formats(const DrafterWeights& w);

}  // namespace dspark
