// Checks and helpers shared by the CUDA experts (see experts_common.h).
#include "cuda/experts_common.h"

#include "core/validate.h"
#include "modmoe/quant.h"

namespace modmoe::cuda {

void check_experts_config(const char* name, const MoEConfig& c) {
  MODMOE_CHECK(c.in_dtype == DType::bf16 || c.in_dtype == DType::fp16 ||
               (c.in_dtype == DType::fp32 && c.quant.quantized()))
      << name << ": in_dtype must be bf16 or fp16 (fp32 only with an fp8 scheme: the tensor-core "
      << "GEMM has no fp32 operands), got " << dtype_name(c.in_dtype) << " with " << c.quant.str();
  MODMOE_CHECK(c.num_local_experts >= 1 && c.hidden_size >= 1 && c.intermediate_size >= 1 &&
               c.topk >= 1)
      << name << ": the config must have E_local, K, N, topk >= 1, got [" << c.str() << "]";
}

void check_workspace(const char* fn, const char* arg, const Tensor& ws, size_t bytes,
                     Device device) {
  MODMOE_CHECK(ws.defined() && ws.nbytes() >= bytes && ws.device() == device && ws.is_contiguous())
      << fn << ": " << arg << " must be a contiguous buffer of >= " << bytes << " bytes on "
      << device.str() << " (as workspace_shapes() declared), got " << ws.describe();
}

// Input checks shared by both experts; `a1q_rows` is the row shape of the activations
// ((M) standard, (E_local, T) batched).
void check_apply_inputs(const char* fn, const Context& ctx, const MoEConfig& c, const ApplyArgs& a,
                        const Shape& a1q_rows) {
  check_context_device(fn, ctx, DeviceType::cuda);
  MODMOE_CHECK(a.weights != nullptr) << fn << ": weights must not be null";
  check_expert_weights(fn, *a.weights, c, ctx.device);
  const DType in = c.quant.quantized() ? DType::fp8_e4m3 : c.in_dtype;
  Shape shape = a1q_rows;
  shape.push_back(c.hidden_size);
  check_tensor(fn, "hidden_states", a.hidden_states, {in}, shape,
               a1q_rows.size() == 1 ? "(M, K)" : "(E_local, max_tokens, K)", ctx.device);
  if (c.quant.quantized()) {
    const QuantScheme scheme = c.quant.scheme;
    if (c.quant.static_act_scale || scheme == QuantScheme::fp8_tensor) {
      check_scale(fn, "a1q_scale", a.a1q_scale, scheme, {1}, ctx.device);
    } else {
      const int64_t rows = shape_numel(a1q_rows);
      Shape scale_shape = a1q_rows;
      scale_shape.push_back(act_scale_shape(scheme, rows, c.hidden_size).back());
      check_scale(fn, "a1q_scale", a.a1q_scale, scheme, scale_shape, ctx.device);
    }
    if (c.quant.static_act_scale)
      check_tensor(fn, "weights.a2_scale", a.weights->a2_scale, {DType::fp32}, {1},
                   "(static per-tensor)", ctx.device);
  }
}

WorkspaceShapes byte_workspaces(size_t ws13_bytes, size_t ws2_bytes, Shape output,
                                DType output_dtype) {
  WorkspaceShapes s;
  s.workspace13 = {static_cast<int64_t>(ws13_bytes)};
  s.workspace2 = {static_cast<int64_t>(ws2_bytes)};
  s.workspace_dtype = DType::uint8;
  s.output = std::move(output);
  s.output_dtype = output_dtype;
  return s;
}

}  // namespace modmoe::cuda
