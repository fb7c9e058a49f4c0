// The CUDA implementations behind the public quantization and routing functions (quant.h,
// router.h). src/ops.cpp dispatches to them for CUDA contexts.
//
// Each validates its arguments with the public function's name and the CPU version's messages
// (tensors must be on ctx.device instead of on cpu), then launches on ctx.stream. None
// synchronizes with the host, so all are capturable in a CUDA graph. One difference from the
// CPU: a static fp8-tensor scale lives on the device and is not checked for being finite and
// > 0 (that would need a host read).
#pragma once

#include <cstdint>

#include "modmoe/context.h"
#include "modmoe/quant.h"
#include "modmoe/router.h"
#include "modmoe/tensor.h"

namespace modmoe::cuda {

void quantize_activations(const Context& ctx, const Tensor& x, QuantScheme scheme,
                          bool static_scale, const Tensor& q, const Tensor& scale);
void dequantize_activations(const Context& ctx, const Tensor& q, const Tensor& scale,
                            QuantScheme scheme, const Tensor& out);

// Limits: E <= kRouterMaxExperts, topk <= kRouterMaxTopK (src/cuda/router.h).
void softmax_topk(const Context& ctx, const Tensor& logits, int64_t topk, bool renormalize,
                  const Tensor& topk_weights, const Tensor& topk_ids);
void grouped_topk(const Context& ctx, const Tensor& logits, const Tensor& correction_bias,
                  int64_t topk, const GroupedTopKParams& params, const Tensor& topk_weights,
                  const Tensor& topk_ids);

}  // namespace modmoe::cuda
