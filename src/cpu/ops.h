// The CPU implementations behind the public quantization and routing functions (quant.h,
// router.h). src/ops.cpp dispatches to them for CPU contexts; each validates its arguments
// with the public function's name and requires ctx.device == cpu.
#pragma once

#include <cstdint>

#include "modmoe/context.h"
#include "modmoe/quant.h"
#include "modmoe/router.h"
#include "modmoe/tensor.h"

namespace modmoe::cpu {

void quantize_activations(const Context& ctx, const Tensor& x, QuantScheme scheme,
                          bool static_scale, const Tensor& q, const Tensor& scale);
void dequantize_activations(const Context& ctx, const Tensor& q, const Tensor& scale,
                            QuantScheme scheme, const Tensor& out);
void quantize_weights(const Context& ctx, const Tensor& w, QuantScheme scheme, const Tensor& q,
                      const Tensor& scale);
void dequantize_weights(const Context& ctx, const Tensor& q, const Tensor& scale,
                        QuantScheme scheme, const Tensor& out);

void softmax_topk(const Context& ctx, const Tensor& logits, int64_t topk, bool renormalize,
                  const Tensor& topk_weights, const Tensor& topk_ids);
void grouped_topk(const Context& ctx, const Tensor& logits, const Tensor& correction_bias,
                  int64_t topk, const GroupedTopKParams& params, const Tensor& topk_weights,
                  const Tensor& topk_ids);

}  // namespace modmoe::cpu
