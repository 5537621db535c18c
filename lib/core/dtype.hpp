// Element types of checkpoint tensors and backend buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dspark {

enum class DType : uint8_t { bf16, f16, f32, i8, i16, i32, i64, u8, f8_e4m3, f8_e8m0 };

size_t dtype_size(DType t);
// Lower-case display name ("bf16", "float8_e4m3fn", ...).
std::string_view dtype_name(DType t);
// From the safetensors header's spelling ("BF16", "F8_E4M3", "F8_E8M0", ...); nullopt when unknown.
std::optional<DType> dtype_from_safetensors(std::string_view s);
std::string_view dtype_safetensors_name(DType t);

}  // namespace dspark
