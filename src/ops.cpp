// The public quantization and routing functions (quant.h, router.h) and Context::alloc():
// thin dispatchers on ctx.device to the CPU backend (src/cpu/ops.h) or the CUDA backend
// (src/cuda/ops.h). This file, like the registry, sits above the backends.
//
// In a build without the CUDA backend (no MODMOE_WITH_CUDA), a CUDA context gets
// "<fn>: this build has no CUDA backend", and the functions of cuda.h are defined here as
// stubs: no device is ever available, everything else throws.
#include "cpu/ops.h"

#include "modmoe/allocator.h"
#include "modmoe/context.h"
#include "modmoe/cuda.h"
#include "modmoe/error.h"
#include "modmoe/quant.h"
#include "modmoe/router.h"

#ifdef MODMOE_WITH_CUDA
#include "cuda/ops.h"
// Runs `call` (a modmoe::cuda function) and returns.
#define MODMOE_ON_CUDA(fn, call) \
  do {                           \
    call;                        \
    return;                      \
  } while (0)
#else
#define MODMOE_ON_CUDA(fn, call) MODMOE_FAIL() << fn << ": this build has no CUDA backend"
#endif

namespace modmoe {

// ---- quantization --------------------------------------------------------------------------

void quantize_activations(const Context& ctx, const Tensor& x, QuantScheme scheme,
                          bool static_scale, const Tensor& q, const Tensor& scale) {
  if (ctx.device.is_cuda()) {
    MODMOE_ON_CUDA("quantize_activations",
                   cuda::quantize_activations(ctx, x, scheme, static_scale, q, scale));
  }
  cpu::quantize_activations(ctx, x, scheme, static_scale, q, scale);
}

void dequantize_activations(const Context& ctx, const Tensor& q, const Tensor& scale,
                            QuantScheme scheme, const Tensor& out) {
  if (ctx.device.is_cuda()) {
    MODMOE_ON_CUDA("dequantize_activations",
                   cuda::dequantize_activations(ctx, q, scale, scheme, out));
  }
  cpu::dequantize_activations(ctx, q, scale, scheme, out);
}

// Weights are prepared offline, once per model: the CPU quantizer is the one implementation.
void quantize_weights(const Context& ctx, const Tensor& w, QuantScheme scheme, const Tensor& q,
                      const Tensor& scale) {
  MODMOE_CHECK(!ctx.device.is_cuda())
      << "quantize_weights: not implemented on cuda: quantize weights on the CPU and copy them";
  cpu::quantize_weights(ctx, w, scheme, q, scale);
}

void dequantize_weights(const Context& ctx, const Tensor& q, const Tensor& scale,
                        QuantScheme scheme, const Tensor& out) {
  MODMOE_CHECK(!ctx.device.is_cuda())
      << "dequantize_weights: not implemented on cuda: dequantize weights on the CPU";
  cpu::dequantize_weights(ctx, q, scale, scheme, out);
}

// ---- routing -------------------------------------------------------------------------------

void softmax_topk(const Context& ctx, const Tensor& logits, int64_t topk, bool renormalize,
                  const Tensor& topk_weights, const Tensor& topk_ids) {
  if (ctx.device.is_cuda()) {
    MODMOE_ON_CUDA("softmax_topk",
                   cuda::softmax_topk(ctx, logits, topk, renormalize, topk_weights, topk_ids));
  }
  cpu::softmax_topk(ctx, logits, topk, renormalize, topk_weights, topk_ids);
}

void grouped_topk(const Context& ctx, const Tensor& logits, const Tensor& correction_bias,
                  int64_t topk, const GroupedTopKParams& params, const Tensor& topk_weights,
                  const Tensor& topk_ids) {
  if (ctx.device.is_cuda()) {
    MODMOE_ON_CUDA("grouped_topk", cuda::grouped_topk(ctx, logits, correction_bias, topk, params,
                                                      topk_weights, topk_ids));
  }
  cpu::grouped_topk(ctx, logits, correction_bias, topk, params, topk_weights, topk_ids);
}

// ---- Context -------------------------------------------------------------------------------

Allocator* Context::alloc() const {
  if (allocator) return allocator;
  if (device.is_cuda()) {
#ifdef MODMOE_WITH_CUDA
    return cuda_default_allocator(device.index);
#else
    MODMOE_FAIL() << "Context: no allocator given for device " << device.str()
                  << " and this build has no CUDA backend";
#endif
  }
  return host_allocator();
}

// ---- cuda.h without the CUDA backend -------------------------------------------------------

#ifndef MODMOE_WITH_CUDA

bool cuda_available() { return false; }

int cuda_device_count() { return 0; }

Context cuda_context(int, void*, Allocator*) {
  MODMOE_FAIL() << "cuda_context: this build has no CUDA backend";
  return Context{};
}

Allocator* cuda_default_allocator(int) {
  MODMOE_FAIL() << "cuda_default_allocator: this build has no CUDA backend";
  return nullptr;
}

void copy_tensor(const Context&, const Tensor&, const Tensor&) {
  MODMOE_FAIL() << "copy_tensor: this build has no CUDA backend";
}

void synchronize(const Context&) { MODMOE_FAIL() << "synchronize: this build has no CUDA backend"; }

#endif  // MODMOE_WITH_CUDA

}  // namespace modmoe
