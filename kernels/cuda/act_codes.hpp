// CudaBackend's ActCodes (lib/model/backend.hpp) as the kernels take them: QuantAct views of the codes a norm
// wrote, and the check a product makes before reading them instead of quantising its input.
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/cuda/quant_act.hpp"
#include "lib/model/backend.hpp"

namespace dspark::cuda {

// codes' QuantAct (the layout for codes.rows rows), where a product of `rows` rows of `cols` quantised per
// `block` can read them; nullopt where codes is empty or made for another shape or block.
std::optional<QuantAct> usable_codes(const ActCodes& codes, int64_t rows, int64_t cols, int64_t block);

// Where a norm writing `rows` rows of `cols` puts its codes: none for empty codes; throws dspark::Error for
// codes made for another row length or too few rows.
QuantActOut codes_out(const ActCodes& codes, int64_t rows, int64_t cols, const char* op);

}  // namespace dspark::cuda
