#include "lib/core/dtype.hpp"

#include <array>

namespace dspark {
namespace {
struct DTypeInfo {
  DType type;
  size_t size;
  std::string_view name;
  std::string_view safetensors;
};
constexpr std::array<DTypeInfo, 10> kTypes{{
    {DType::bf16, 2, "bf16", "BF16"},
    {DType::f16, 2, "f16", "F16"},
    {DType::f32, 4, "f32", "F32"},
    {DType::i8, 1, "i8", "I8"},
    {DType::i16, 2, "i16", "I16"},
    {DType::i32, 4, "i32", "I32"},
    {DType::i64, 8, "i64", "I64"},
    {DType::u8, 1, "u8", "U8"},
    {DType::f8_e4m3, 1, "float8_e4m3fn", "F8_E4M3"},
    {DType::f8_e8m0, 1, "float8_e8m0", "F8_E8M0"},
}};
const DTypeInfo& info(DType t) {
  return kTypes[static_cast<size_t>(t)];
}
}  // namespace

size_t dtype_size(DType t) {
  return info(t).size;
}
std::string_view dtype_name(DType t) {
  return info(t).name;
}
std::string_view dtype_safetensors_name(DType t) {
  return info(t).safetensors;
}

std::optional<DType> dtype_from_safetensors(std::string_view s) {
  for (const auto& i : kTypes)
    if (i.safetensors == s) return i.type;
  if (s == "F8_E8M0FNU") return DType::f8_e8m0;  // the spelling some writers use for e8m0
  return std::nullopt;
}

}  // namespace dspark
