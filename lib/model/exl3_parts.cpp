#include "lib/model/exl3_parts.hpp"

#include "lib/core/error.hpp"
#include "lib/core/exl3.hpp"

namespace dspark {
namespace {

// A scale vector: F16 [n] as .<scaled>, or the legacy I16 bit-packed signs [n / 16] as .<legacy>.
void check_scale(const Checkpoint& ckpt, const std::string& base, const char* scaled, const char* legacy,
                 int64_t n, const std::string& file) {
  if (const TensorInfo* s = ckpt.find(base + scaled)) {
    if (ckpt.has(base + legacy))
      fail("tensor '{}' in {}: has both {} and {} ({} replaces the legacy signs)", base, file, scaled, legacy,
           scaled);
    if (s->dtype != DType::f16 || s->shape != Shape{n})
      fail("tensor '{}{}' in {}: {} {}, expected {} [{}]", base, scaled, s->file.string(),
           dtype_name(s->dtype), shape_str(s->shape), dtype_name(DType::f16), n);
    return;
  }
  const TensorInfo* s = ckpt.find(base + legacy);
  if (!s) fail("tensor '{}' in {}: the EXL3 weight has neither {} nor {}", base, file, scaled, legacy);
  if (s->dtype != DType::i16 || s->shape != Shape{n / 16})
    fail("tensor '{}{}' in {}: {} {}, expected {} [{}] (bit-packed signs)", base, legacy, s->file.string(),
         dtype_name(s->dtype), shape_str(s->shape), dtype_name(DType::i16), n / 16);
}

}  // namespace

int64_t check_exl3_parts(const Checkpoint& ckpt, const ModelConfig& cfg, const std::string& base, int64_t out,
                         int64_t in) {
  const TensorInfo& t = ckpt.get(base + ".trellis");
  const std::string file = t.file.string();
  if (in % kExl3HadamardBlock != 0 || out % kExl3HadamardBlock != 0)
    fail("tensor '{}' in {}: EXL3 needs inputs and outputs in multiples of {}; the config implies [{}, {}]",
         base, file, kExl3HadamardBlock, out, in);
  if (t.dtype != DType::i16 || t.shape.size() != 3 || t.shape[0] != in / 16 || t.shape[1] != out / 16 ||
      t.shape[2] % 16 != 0 || t.shape[2] / 16 < kExl3MinBits || t.shape[2] / 16 > kExl3MaxBits)
    fail("tensor '{}.trellis' in {}: {} {}, expected i16 [{}, {}, 16 K] with K in {}..{} (a [{}, {}] matrix)",
         base, file, dtype_name(t.dtype), shape_str(t.shape), in / 16, out / 16, kExl3MinBits, kExl3MaxBits,
         out, in);
  const int64_t K = t.shape[2] / 16;
  if (const TensorInfo* b = ckpt.find(base + ".bias"))
    fail("tensor '{}.bias' in {}: the drafter's linears have no bias (SPEC §4)", base, b->file.string());
  check_scale(ckpt, base, ".suh", ".su", in, file);
  check_scale(ckpt, base, ".svh", ".sv", out, file);
  const bool mcg = ckpt.has(base + ".mcg"), mul1 = ckpt.has(base + ".mul1");
  if (mcg && mul1) fail("tensor '{}' in {}: has both codebook markers .mcg and .mul1", base, file);
  for (const char* m : {".mcg", ".mul1"})
    if (const TensorInfo* mk = ckpt.find(base + m); mk && (mk->dtype != DType::i32 || !mk->shape.empty()))
      fail("tensor '{}{}' in {}: {} {}, expected an {} scalar marker", base, m, mk->file.string(),
           dtype_name(mk->dtype), shape_str(mk->shape), dtype_name(DType::i32));
  const std::string codebook = mcg ? "mcg" : mul1 ? "mul1" : "3inst";
  if (!cfg.exl3.codebook.empty() && cfg.exl3.codebook != codebook)
    fail("tensor '{}' in {}: its codebook is {} but quantization_config.codebook says {}", base, file,
         codebook, cfg.exl3.codebook);
  const std::string role = exl3_role(base);
  if (const auto it = cfg.exl3.role_bits.find(role); it != cfg.exl3.role_bits.end() && it->second != K)
    fail("tensor '{}.trellis' in {}: K = {} bits per weight, but quantization_config.exl3_bits.{} says {}",
         base, file, K, role, it->second);
  return K;
}

}  // namespace dspark
