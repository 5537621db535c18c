// The config.json published with the DeepSeek-V4.1-Flash weights (SPEC §2, "Two layouts"): Hugging Face
// names, the text model nested in `text_config`. Translated here into the inference layout that
// parse_model_config reads, remembering each key's released name so that every error names the key as the
// file spells it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dspark {

struct ReleaseTranslation {
  nlohmann::json inference;                  // the same values under the inference code's keys
  std::map<std::string, std::string> names;  // inference key -> released key ("text_config.hidden_size")
  std::vector<std::string> ignored;          // keys of the file the drafter does not use (target only)
};

// True when j has the released layout (a `text_config` object at the top level).
bool is_release_layout(const nlohmann::json& j);

// Checks the keys the drafter uses for presence and places them under the inference names; keys it does not
// use are listed in `ignored`. A used key missing (with no default in SPEC §2) is an error naming it.
ReleaseTranslation translate_release_config(const nlohmann::json& j, const std::string& source);

// The inverse: an inference-layout config (model_config_to_json's) in the released layout, with the
// release's metadata keys (architectures, model_type). The released layout has no `dtype`: quant_method fp8
// says that the linears of SPEC §3 are fp8 block, so it is written only when `dtype` is fp8.
nlohmann::json release_from_inference(const nlohmann::json& inference);

}  // namespace dspark
