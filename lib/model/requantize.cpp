#include "lib/model/requantize.hpp"

#include <vector>

#include "lib/core/block_quant.hpp"
#include "lib/core/error.hpp"
#include "lib/core/numeric.hpp"

namespace dspark {

LinearWeight requantize_fp8_block(const LinearWeight& dense, int64_t block, int64_t row0, int64_t rows,
                                  Backend& backend) {
  const int64_t out = dense.out, in = dense.in;
  if (dense.format != WeightFormat::dense)
    fail("re-quantising '{}' to fp8 block: it is stored {}, not dense", dense.name,
         weight_format_name(dense.format));
  if (!backend.supports_format(WeightFormat::fp8_block))
    fail("re-quantising '{}' to fp8 block: the {} backend does not run fp8 block weights", dense.name,
         backend.name());
  if (block <= 0 || row0 % block != 0 || (out % block != 0 && row0 + out != rows))
    fail(
        "re-quantising '{}' to fp8 block: this rank's rows [{}, {}) of {} do not fall on the {}-row blocks "
        "(quantization_config.weight_block_size), so its blocks would not be the whole tensor's",
        dense.name, row0, row0 + out, rows, block);

  const DType dt = dense.weight.dtype;
  std::vector<uint8_t> raw(dense.weight.nbytes());
  backend.download(raw.data(), dense.weight);
  std::vector<float> w(static_cast<size_t>(out * in));
  for (size_t i = 0; i < w.size(); ++i) {
    switch (dt) {
      case DType::bf16:
        w[i] = bf16_to_float(reinterpret_cast<const bf16_t*>(raw.data())[i]);
        break;
      case DType::f16:
        w[i] = f16_to_float(reinterpret_cast<const f16_t*>(raw.data())[i]);
        break;
      case DType::f32:
        w[i] = reinterpret_cast<const float*>(raw.data())[i];
        break;
      default:
        fail("re-quantising '{}' to fp8 block: dtype {} is not a dense weight dtype", dense.name,
             dtype_name(dt));
    }
  }
  LinearWeight q;
  q.name = dense.name;
  q.format = WeightFormat::fp8_block;
  q.out = out;
  q.in = in;
  q.block = block;
  q.weight = backend.alloc(DType::f8_e4m3, {out, in});
  q.scale = backend.alloc(DType::f8_e8m0, {(out + block - 1) / block, (in + block - 1) / block});
  std::vector<uint8_t> codes(static_cast<size_t>(q.weight.nbytes())),
      scales(static_cast<size_t>(q.scale.nbytes()));
  quantize_fp8_block(w.data(), out, in, block, codes.data(), scales.data());
  backend.upload(q.weight, codes.data());
  backend.upload(q.scale, scales.data());
  return q;
}

}  // namespace dspark
