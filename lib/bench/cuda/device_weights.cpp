#include "lib/bench/cuda/device_weights.hpp"

#include <fmt/format.h>

#include <map>
#include <string_view>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/fill_random.hpp"
#include "kernels/cuda/quant_linear.hpp"
#include "lib/checkpoint/synthetic.hpp"
#include "lib/checkpoint/synthetic_exl3.hpp"
#include "lib/checkpoint/tensor_table.hpp"
#include "lib/core/error.hpp"
#include "lib/model/assemble_weights.hpp"
#include "lib/model/tensor_split.hpp"

namespace dspark::bench {
namespace {

// synthetic.cpp's key of (seed, weight name) (private there): FNV-1a of the name through splitmix64, so the
// device values equal those of `dspark_make_ckpt --seed` for the same tensor.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t tensor_key(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char ch : name) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001b3ull;
  return mix64(mix64(seed + 0x9e3779b97f4a7c15ull) ^ h);
}

uint64_t shard_bytes(const DrafterTensor& t, const TensorSplit& s) {
  return static_cast<uint64_t>(split_numel(t, s)) * dtype_size(t.dense_dtype);
}

bool is_exl3_mix(const ModelConfig& cfg) {
  return cfg.quant_method == "exl3";
}

// The bytes a tensor's generated part holds: an EXL3 trellis K bits per weight plus suh and svh, else dense.
uint64_t generated_bytes(const DrafterTensor& t, const TensorSplit& s, const ModelConfig& cfg) {
  if (!is_exl3_mix(cfg) || !synthetic_exl3_tensor(t)) return shard_bytes(t, s);
  const bool rows = s.kind == TensorSplit::Kind::rows, cols = s.kind == TensorSplit::Kind::cols;
  const auto out = static_cast<uint64_t>(rows ? s.count : t.shape[0]);
  const auto in = static_cast<uint64_t>(cols ? s.count : t.shape[1]);
  return out * in * static_cast<uint64_t>(synthetic_exl3_bits(t, cfg)) / 8 + 2 * (out + in);
}

// The device counterpart of load_weights.cpp's Loader: allocates this rank's part and fills it.
class Generator {
 public:
  Generator(const ModelConfig& cfg, const ShardPlan& plan, CudaBackend& backend, uint64_t seed,
            GenerationProgress& prog, const GenerationProgressFn& progress)
      : cfg_(cfg), plan_(plan), backend_(backend), seed_(seed), prog_(prog), progress_(progress) {}

  // A linear entry in the format config.json gives it: the bf16 part, quantised on the device (its rank's
  // part: a cut never splits a block, so the part's blocks are the whole matrix's).
  LinearWeight linear(const DrafterTensor& t) {
    if (is_exl3_mix(cfg_) && synthetic_exl3_tensor(t)) return exl3(t);
    Tensor dense = tensor(t);
    // The seed's mix stores its one other linear, wo_a, in fp8 block (synthetic.cpp's synthetic_format).
    const WeightFormat f = is_exl3_mix(cfg_) ? WeightFormat::fp8_block : configured_format(t, cfg_);
    if (f == WeightFormat::dense) return dense_linear(t.name, std::move(dense));
    return quantised(t.name, dense, f);
  }

  LinearWeight quantised(const std::string& name, const Tensor& dense, WeightFormat f) {
    const char* op = "quantise synthetic weights";
    LinearWeight l;
    l.name = name;
    l.format = f;
    l.out = dense.dim(0);
    l.in = dense.dim(1);
    l.block = cfg_.weight_block_size;
    l.weight = backend_.alloc(f == WeightFormat::fp4 ? DType::u8 : DType::f8_e4m3,
                              stored_weight_shape(f, l.out, l.in));
    l.scale = backend_.alloc(DType::f8_e8m0, *stored_scale_shape(f, l.out, l.in, l.block));
    if (f == WeightFormat::fp8_block)
      cuda::check(cuda::launch_quantize_fp8_block(dense.data, l.out, l.in, l.block, l.weight.data,
                                                  l.scale.data, backend_.stream()),
                  op);
    else
      cuda::check(
          cuda::launch_quantize_fp4(dense.data, l.out, l.in, l.weight.data, l.scale.data, backend_.stream()),
          op);
    backend_.synchronize();  // before the bf16 part is released
    return l;
  }

  // This rank's part of an EXL3 linear of the seed's mix (synthetic_exl3.hpp's values): random trellis bits
  // made on the device, suh and svh made on the host (vectors) and uploaded; an output split takes tiles
  // along dim 1 and svh, an input split tiles along dim 0 and suh.
  LinearWeight exl3(const DrafterTensor& t) {
    const char* op = "generate EXL3 weights";
    const TensorSplit split = tensor_split(t, cfg_, plan_);
    const bool rows = split.kind == TensorSplit::Kind::rows, cols = split.kind == TensorSplit::Kind::cols;
    const std::string base = synthetic_exl3_base(t);
    LinearWeight l;
    l.name = base;
    l.format = WeightFormat::exl3;
    l.out = rows ? split.count : t.shape[0];
    l.in = cols ? split.count : t.shape[1];
    l.bits = synthetic_exl3_bits(t, cfg_);
    l.codebook = cfg_.exl3.codebook.empty() ? Exl3Codebook::mul1 : exl3_codebook_named(cfg_.exl3.codebook);
    l.weight = backend_.alloc(DType::i16, {l.in / 16, l.out / 16, 16 * l.bits});
    cuda::TrellisFill f{};
    f.key = tensor_key(seed_, base + ".trellis");
    f.tiles_in = l.in / 16;
    f.tiles_out = l.out / 16;
    f.per_tile = 16 * l.bits;
    f.tiles_out_full = t.shape[0] / 16;
    f.tk0 = cols ? split.begin / 16 : 0;
    f.tn0 = rows ? split.begin / 16 : 0;
    cuda::check(cuda::launch_fill_trellis(l.weight.as<int16_t>(), f, backend_.stream()), op);
    for (const TensorSpec& part : synthetic_exl3_parts(t, cfg_)) {
      const bool input = part.name.ends_with(".suh");
      if (!input && !part.name.ends_with(".svh")) continue;
      const std::vector<uint8_t> whole = synthetic_exl3_part(t, cfg_, part, seed_);
      const int64_t begin = input ? (cols ? split.begin : 0) : (rows ? split.begin : 0);
      Tensor& dst = input ? l.suh : l.svh;
      dst = backend_.alloc(DType::f16, {input ? l.in : l.out});
      backend_.upload(dst, whole.data() + begin * 2);
    }
    prog_.bytes_done += linear_bytes(l);
    ++prog_.tensors_done;
    if (progress_) progress_(prog_);
    return l;
  }

  Tensor tensor(const DrafterTensor& t) {
    const TensorSplit split = tensor_split(t, cfg_, plan_);
    const bool cols = split.kind == TensorSplit::Kind::cols;
    Shape shape = t.shape;
    if (cols)
      shape[1] = split.count;
    else
      shape[0] = split.count;
    Tensor dst = backend_.alloc(t.dense_dtype, shape);
    const SyntheticInit init = synthetic_init(t);
    const int64_t full_rows = t.shape[0], full_cols = t.shape.size() == 2 ? t.shape[1] : 1;
    cuda::SyntheticFill f{};
    f.key = tensor_key(seed_, t.weight_name());
    f.rows = cols ? full_rows : split.count;
    f.cols = cols ? split.count : full_cols;
    f.full_cols = full_cols;
    f.row0 = cols ? 0 : split.begin;
    f.col0 = cols ? split.begin : 0;
    f.mean = init.mean;
    f.std = init.std;
    const cuda::Elt elt = cuda::elt(dst, "fill_synthetic", t.weight_name().c_str());
    cuda::check(cuda::launch_fill_synthetic(dst.data, elt, f, backend_.stream()), "fill_synthetic");
    prog_.bytes_done += dst.nbytes();
    ++prog_.tensors_done;
    if (progress_) progress_(prog_);
    return dst;
  }

 private:
  const ModelConfig& cfg_;
  const ShardPlan& plan_;
  CudaBackend& backend_;
  uint64_t seed_;
  GenerationProgress& prog_;
  const GenerationProgressFn& progress_;
};

}  // namespace

DrafterWeights generate_device_weights(const ModelConfig& cfg, const ShardPlan& plan, CudaBackend& backend,
                                       uint64_t seed, BenchFormat format,
                                       const GenerationProgressFn& progress) {
  GenerationProgress prog;
  for (const DrafterTensor& t : drafter_tensors(cfg)) {
    synthetic_init(t);  // a tensor without a rule fails before anything is allocated
    prog.bytes_total += generated_bytes(t, tensor_split(t, cfg, plan), cfg);
    ++prog.tensors_total;
  }
  Generator gen(cfg, plan, backend, seed, prog, progress);
  DrafterWeights w = assemble_drafter_weights(
      cfg, [&](const DrafterTensor& t) { return gen.tensor(t); },
      [&](const DrafterTensor& t) { return gen.linear(t); },
      [&](const DrafterTensor& t) {
        return is_exl3_mix(cfg) ? gen.exl3(t) : dense_linear(t.name, gen.tensor(t));
      });
  if (format == BenchFormat::fp8_head) {
    const uint64_t dense_bytes = w.head.weight.nbytes();
    w.head = gen.quantised(w.head.name, w.head.weight, WeightFormat::fp8_block);
    w.bytes = w.bytes - dense_bytes + w.head.weight.nbytes() + w.head.scale.nbytes();
  }
  if (prog.tensors_done != prog.tensors_total)
    fail("synthetic weights: {} of the table's {} tensors were generated", prog.tensors_done,
         prog.tensors_total);
  backend.synchronize();
  return w;
}

}  // namespace dspark::bench
