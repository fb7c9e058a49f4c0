// Argument checks of the routing (router.h) and quantization (quant.h) entry points that every
// backend shares. Each takes the entry point's name `fn` and the Device the backend runs on, and
// throws modmoe::Error with the same message on every backend; a backend adds only its own
// limits (e.g. the CUDA router's maximum E and topk) around these calls.
#pragma once

#include <cstdint>
#include <string>

#include "modmoe/dtype.h"
#include "modmoe/quant.h"
#include "modmoe/router.h"
#include "modmoe/tensor.h"

namespace modmoe {

// ---- routing (softmax_topk, grouped_topk) ---------------------------------------------------

// `t` is defined and on `device` (any CPU tensor counts as on a CPU device).
void check_defined_on(const char* fn, const char* arg, const Tensor& t, Device device);

// logits: a 2-D bf16 / fp16 / fp32 (M, E) tensor on `device`, any strides.
void check_router_logits(const char* fn, const Tensor& logits, Device device);

// topk in [1, num_experts].
void check_router_topk(const char* fn, int64_t topk, int64_t num_experts);

// topk_weights fp32 and topk_ids int32/int64, both (M, topk) on `device`, rows with contiguous
// entries that do not alias, not overlapping each other nor logits.
void check_router_outputs(const char* fn, const Tensor& logits, int64_t topk,
                          const Tensor& topk_weights, const Tensor& topk_ids, Device device);

// grouped_topk: num_groups divides E, topk_groups in [1, num_groups], and topk in
// [1, topk_groups * E / num_groups] (the experts the kept groups hold).
void check_grouped_topk_groups(const char* fn, int64_t num_experts, int64_t topk,
                               const GroupedTopKParams& params);

// grouped_topk: scoring function, a finite routed_scaling_factor, and correction_bias
// (undefined, or a contiguous fp32 (E,) tensor on `device`).
void check_grouped_topk_scoring(const char* fn, const GroupedTopKParams& params,
                                const Tensor& correction_bias, int64_t num_experts, Device device);

// grouped_topk: check_router_outputs, and the outputs do not overlap correction_bias.
void check_grouped_topk_outputs(const char* fn, const Tensor& logits, const Tensor& correction_bias,
                                int64_t topk, const Tensor& topk_weights, const Tensor& topk_ids,
                                Device device);

// ---- quantization (quantize_/dequantize_activations, _weights) ------------------------------

// scheme is a quantized scheme (not none).
void check_quant_scheme(const char* fn, QuantScheme scheme);

// `t` is on `device` and row-major contiguous.
void check_contiguous_on(const char* fn, const char* arg, const Tensor& t, Device device);

// The unquantized side: a defined bf16 / fp16 / fp32 tensor of rank `rank` (`dims` such as
// "(M, K)" names its dimensions in the message), contiguous on `device`.
void check_float_operand(const char* fn, const char* arg, const Tensor& t, int rank,
                         const char* dims, Device device);

// A tensor whose dtype and shape are fully determined; `context` says why (shown on error).
void check_exact_operand(const char* fn, const char* arg, const Tensor& t, DType dtype,
                         const Shape& shape, const std::string& context, Device device);

// The output `out` does not overlap the input `in`.
void check_no_overlap(const char* fn, const char* out_name, const Tensor& out, const char* in_name,
                      const Tensor& in);

// Every argument check of quantize_activations but the context's device (and, on the CPU, the
// value of a static scale, which only the host can read cheaply).
void check_quantize_activations_args(const char* fn, const Tensor& x, QuantScheme scheme,
                                     bool static_scale, const Tensor& q, const Tensor& scale,
                                     Device device);

// Every argument check of dequantize_activations but the context's device.
void check_dequantize_activations_args(const char* fn, const Tensor& q, const Tensor& scale,
                                       QuantScheme scheme, const Tensor& out, Device device);

}  // namespace modmoe
