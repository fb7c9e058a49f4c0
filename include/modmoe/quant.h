// Quantization schemes, scale layouts, and the CPU quantize/dequantize functions.
//
// Scale layouts (ARCHITECTURE.md §5). Activations x (M, K); weights w (E, N, K), K-major.
//
//   scheme       activation q / scale                weight q / scale
//   none         x as is                             w as is (bf16/fp16/fp32)
//   fp8_tensor   e4m3 (M, K) / fp32 (1)              e4m3 / fp32 (E)            per expert
//   fp8_token    e4m3 (M, K) / fp32 (M, 1)           e4m3 / fp32 (E, N)         per channel
//   fp8_block    e4m3 (M, K) / fp32 (M, ceil(K/128)) e4m3 / fp32 (E, ceil(N/128), ceil(K/128))
//   mxfp8        e4m3 (M, K) / e8m0 (M, ceil(K/32))  e4m3 / e8m0 (E, N, ceil(K/32))
//
// dequant(q)[m, k] = q[m, k] * scale[group containing (m, k)]. Dynamic scales map the group's
// largest magnitude to 448 (fp8 e4m3 max); MX scales are the power of two
// 2^(floor(log2(amax)) - 8) of the OCP MX spec, with saturation to 448. Static activation
// scales (given, not computed) exist for fp8_tensor, the scheme that vLLM calibrates.
#pragma once

#include <string>

#include "modmoe/context.h"
#include "modmoe/tensor.h"

namespace modmoe {

enum class QuantScheme : uint8_t { none, fp8_tensor, fp8_token, fp8_block, mxfp8 };

constexpr int64_t kBlockSize = 128;  // fp8_block: 1x128 activations, 128x128 weights
constexpr int64_t kMxBlockSize = 32;  // mxfp8: one E8M0 scale per 32 elements along K

struct QuantConfig {
  QuantScheme scheme = QuantScheme::none;
  bool static_act_scale = false;  // fp8_tensor only: activation scales are given, not computed

  bool quantized() const { return scheme != QuantScheme::none; }
  bool operator==(const QuantConfig& o) const {
    return scheme == o.scheme && static_act_scale == o.static_act_scale;
  }
  std::string str() const;  // "fp8-block", "fp8-tensor-static", "none"
};

// "none", "fp8-tensor", "fp8-token", "fp8-block", "mxfp8" (the modmoe-check spellings).
const char* quant_scheme_name(QuantScheme scheme);
QuantScheme parse_quant_scheme(const std::string& name);

DType quantized_dtype(QuantScheme scheme);  // fp8_e4m3 (or the float dtype for none: invalid)
DType scale_dtype(QuantScheme scheme);      // fp32, or e8m0 for mxfp8
Shape act_scale_shape(QuantScheme scheme, int64_t M, int64_t K);
Shape weight_scale_shape(QuantScheme scheme, int64_t E, int64_t N, int64_t K);
// Columns one scale covers along K (K itself for tensor/token schemes).
int64_t scale_group_k(QuantScheme scheme, int64_t K);

// Quantizes activations x (M, K) in bf16/fp16/fp32 into q (M, K) e4m3 and scale
// (act_scale_shape). With `static_scale` the scale tensor is read, not written.
void quantize_activations(const Context& ctx, const Tensor& x, QuantScheme scheme,
                          bool static_scale, const Tensor& q, const Tensor& scale);
// out (M, K) in bf16/fp16/fp32 = dequant(q, scale).
void dequantize_activations(const Context& ctx, const Tensor& q, const Tensor& scale,
                            QuantScheme scheme, const Tensor& out);
// Quantizes weights w (E, N, K) into q (E, N, K) e4m3 and scale (weight_scale_shape).
void quantize_weights(const Context& ctx, const Tensor& w, QuantScheme scheme, const Tensor& q,
                      const Tensor& scale);
// out (E, N, K) in bf16/fp16/fp32 = dequant(q, scale).
void dequantize_weights(const Context& ctx, const Tensor& q, const Tensor& scale,
                        QuantScheme scheme, const Tensor& out);

}  // namespace modmoe
