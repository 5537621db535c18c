#include "lib/core/tuning.hpp"

#include <fmt/format.h>

namespace dspark {

std::string describe(const Tuning& t) {
  const auto on = [](bool b) { return b ? "on" : "off"; };
  return fmt::format("pdl {}, weight_tiles {}, head_tiles {}, peer_sum {}, bf16_copies {}", on(t.pdl),
                     on(t.weight_tiles), on(t.head_tiles), on(t.peer_sum), on(t.bf16_copies));
}

}  // namespace dspark
