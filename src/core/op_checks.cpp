#include "core/op_checks.h"

#include <cmath>

#include "modmoe/error.h"

namespace modmoe {
namespace {

// A CPU backend runs on any CPU tensor (a CPU Device's index means nothing); a device backend
// only on tensors of its own device.
bool is_on(const Tensor& t, Device device) {
  return device.is_cpu() ? t.device().is_cpu() : t.device() == device;
}

// The float dtypes the kernels read and write (fp64 is not one of them).
bool is_io_float_dtype(DType d) { return d == DType::bf16 || d == DType::fp16 || d == DType::fp32; }

// Rows may sit at any stride, but one row's k entries are contiguous and rows must not alias
// (two threads would write the same memory).
void check_output_layout(const char* fn, const char* name, const Tensor& t, int64_t topk) {
  const int64_t rows = t.size(0);
  MODMOE_CHECK((topk == 1 || t.stride(1) == 1) && (rows <= 1 || t.stride(0) >= topk))
      << fn << ": " << name
      << " must have contiguous rows (column stride 1, row stride >= topk=" << topk
      << "), got strides " << shape_str(t.strides());
}

// The unquantized (M, K) activation `values` (named `values_arg`), then q and scale, whose
// shapes follow from it and the scheme.
void check_activation_operands(const char* fn, const char* values_arg, const Tensor& values,
                               QuantScheme scheme, const Tensor& q, const Tensor& scale,
                               Device device) {
  check_float_operand(fn, values_arg, values, 2, "(M, K)", device);
  const int64_t M = values.size(0), K = values.size(1);
  const std::string context = std::string(quant_scheme_name(scheme)) + " with (M, K) = (" +
                              std::to_string(M) + ", " + std::to_string(K) + ")";
  check_exact_operand(fn, "q", q, DType::fp8_e4m3, {M, K}, context, device);
  check_exact_operand(fn, "scale", scale, scale_dtype(scheme), act_scale_shape(scheme, M, K),
                      context, device);
}

}  // namespace

// ---- routing -----------------------------------------------------------------------------

void check_defined_on(const char* fn, const char* arg, const Tensor& t, Device device) {
  MODMOE_CHECK(t.defined()) << fn << ": " << arg << " must be defined, got undefined";
  MODMOE_CHECK(is_on(t, device)) << fn << ": " << arg << " must be on " << device.str() << ", got "
                                 << t.describe();
}

void check_router_logits(const char* fn, const Tensor& logits, Device device) {
  check_defined_on(fn, "logits", logits, device);
  MODMOE_CHECK(logits.ndim() == 2 && is_io_float_dtype(logits.dtype()))
      << fn << ": logits must be bf16, fp16 or fp32 (M, E), got " << logits.describe();
}

void check_router_topk(const char* fn, int64_t topk, int64_t num_experts) {
  MODMOE_CHECK(topk >= 1 && topk <= num_experts)
      << fn << ": topk must be in [1, E=" << num_experts << "], got " << topk;
}

void check_router_outputs(const char* fn, const Tensor& logits, int64_t topk,
                          const Tensor& topk_weights, const Tensor& topk_ids, Device device) {
  const Shape expected{logits.size(0), topk};
  check_defined_on(fn, "topk_weights", topk_weights, device);
  MODMOE_CHECK(topk_weights.dtype() == DType::fp32 && topk_weights.shape() == expected)
      << fn << ": topk_weights must be fp32 (M, topk) = " << shape_str(expected) << ", got "
      << topk_weights.describe();
  check_defined_on(fn, "topk_ids", topk_ids, device);
  MODMOE_CHECK(is_index_dtype(topk_ids.dtype()) && topk_ids.shape() == expected)
      << fn << ": topk_ids must be int32 or int64 (M, topk) = " << shape_str(expected) << ", got "
      << topk_ids.describe();
  check_output_layout(fn, "topk_weights", topk_weights, topk);
  check_output_layout(fn, "topk_ids", topk_ids, topk);
  MODMOE_CHECK(!topk_weights.overlaps(topk_ids))
      << fn << ": topk_weights and topk_ids must not overlap in memory";
  MODMOE_CHECK(!topk_weights.overlaps(logits) && !topk_ids.overlaps(logits))
      << fn << ": topk_weights and topk_ids must not overlap logits in memory";
}

void check_grouped_topk_groups(const char* fn, int64_t num_experts, int64_t topk,
                               const GroupedTopKParams& params) {
  const int64_t E = num_experts;
  MODMOE_CHECK(params.num_groups >= 1)
      << fn << ": num_groups must be >= 1, got " << params.num_groups;
  MODMOE_CHECK(E % params.num_groups == 0)
      << fn << ": num_experts " << E << " must be divisible by num_groups " << params.num_groups;
  MODMOE_CHECK(params.topk_groups >= 1 && params.topk_groups <= params.num_groups)
      << fn << ": topk_groups must be in [1, num_groups=" << params.num_groups << "], got "
      << params.topk_groups;
  const int64_t group_size = E / params.num_groups;
  const int64_t kept_experts = params.topk_groups * group_size;
  MODMOE_CHECK(topk >= 1 && topk <= kept_experts)
      << fn << ": topk must be in [1, topk_groups * E / num_groups = " << params.topk_groups
      << " * " << group_size << " = " << kept_experts << "], got " << topk;
}

void check_grouped_topk_scoring(const char* fn, const GroupedTopKParams& params,
                                const Tensor& correction_bias, int64_t num_experts, Device device) {
  const int64_t E = num_experts;
  MODMOE_CHECK(params.scoring == ScoringFunc::sigmoid || params.scoring == ScoringFunc::softmax)
      << fn << ": scoring must be sigmoid or softmax, got " << static_cast<int>(params.scoring);
  MODMOE_CHECK(std::isfinite(params.routed_scaling_factor))
      << fn << ": routed_scaling_factor must be finite, got " << params.routed_scaling_factor;
  if (!correction_bias.defined()) return;
  check_defined_on(fn, "correction_bias", correction_bias, device);
  MODMOE_CHECK(correction_bias.dtype() == DType::fp32 && correction_bias.ndim() == 1 &&
               correction_bias.size(0) == E)
      << fn << ": correction_bias must be fp32 (E,) = (" << E << ",) or undefined, got "
      << correction_bias.describe();
  MODMOE_CHECK(E <= 1 || correction_bias.stride(0) == 1)
      << fn << ": correction_bias must be contiguous, got stride " << correction_bias.stride(0);
}

void check_grouped_topk_outputs(const char* fn, const Tensor& logits, const Tensor& correction_bias,
                                int64_t topk, const Tensor& topk_weights, const Tensor& topk_ids,
                                Device device) {
  check_router_outputs(fn, logits, topk, topk_weights, topk_ids, device);
  MODMOE_CHECK(!topk_weights.overlaps(correction_bias) && !topk_ids.overlaps(correction_bias))
      << fn << ": topk_weights and topk_ids must not overlap correction_bias in memory";
}

// ---- quantization ------------------------------------------------------------------------

void check_quant_scheme(const char* fn, QuantScheme scheme) {
  MODMOE_CHECK(scheme != QuantScheme::none)
      << fn << ": scheme must be one of fp8-tensor, fp8-token, fp8-block, mxfp8, got none "
      << "(nothing to quantize)";
}

void check_contiguous_on(const char* fn, const char* arg, const Tensor& t, Device device) {
  MODMOE_CHECK(is_on(t, device)) << fn << ": " << arg << " must be on " << device.str() << ", got "
                                 << t.describe();
  MODMOE_CHECK(t.is_contiguous()) << fn << ": " << arg << " must be contiguous (row-major), got "
                                  << t.describe() << " with strides " << shape_str(t.strides());
}

void check_float_operand(const char* fn, const char* arg, const Tensor& t, int rank,
                         const char* dims, Device device) {
  MODMOE_CHECK(t.defined()) << fn << ": " << arg << " must be a " << rank << "-D " << dims
                            << " bf16, fp16 or fp32 tensor, got undefined";
  MODMOE_CHECK(is_io_float_dtype(t.dtype()))
      << fn << ": " << arg << " must be bf16, fp16 or fp32, got " << t.describe();
  MODMOE_CHECK(t.ndim() == rank) << fn << ": " << arg << " must be " << rank << "-D " << dims
                                 << ", got " << t.describe();
  check_contiguous_on(fn, arg, t, device);
}

void check_exact_operand(const char* fn, const char* arg, const Tensor& t, DType dtype,
                         const Shape& shape, const std::string& context, Device device) {
  MODMOE_CHECK(t.defined() && t.dtype() == dtype && t.shape() == shape)
      << fn << ": " << arg << " must be " << dtype_name(dtype) << " " << shape_str(shape) << " for "
      << context << ", got " << t.describe();
  check_contiguous_on(fn, arg, t, device);
}

void check_no_overlap(const char* fn, const char* out_name, const Tensor& out, const char* in_name,
                      const Tensor& in) {
  MODMOE_CHECK(!out.overlaps(in)) << fn << ": " << out_name << " must not overlap " << in_name
                                  << " (" << out_name << " " << out.describe() << ", " << in_name
                                  << " " << in.describe() << ")";
}

void check_quantize_activations_args(const char* fn, const Tensor& x, QuantScheme scheme,
                                     bool static_scale, const Tensor& q, const Tensor& scale,
                                     Device device) {
  check_quant_scheme(fn, scheme);
  MODMOE_CHECK(!static_scale || scheme == QuantScheme::fp8_tensor)
      << fn << ": static_scale is only supported with fp8-tensor, got "
      << quant_scheme_name(scheme);
  check_activation_operands(fn, "x", x, scheme, q, scale, device);
  check_no_overlap(fn, "q", q, "x", x);
  check_no_overlap(fn, "q", q, "scale", scale);
  // A static scale is an input that quantizing only reads: it may share memory with x.
  if (!static_scale) check_no_overlap(fn, "scale", scale, "x", x);
}

void check_dequantize_activations_args(const char* fn, const Tensor& q, const Tensor& scale,
                                       QuantScheme scheme, const Tensor& out, Device device) {
  check_quant_scheme(fn, scheme);
  check_activation_operands(fn, "out", out, scheme, q, scale, device);
  check_no_overlap(fn, "out", out, "q", q);
  check_no_overlap(fn, "out", out, "scale", scale);
}

}  // namespace modmoe
