// Checks and helpers shared by the CUDA experts (see experts_common.h).
#include "core/validate.h"
#include "cuda/experts_common.h"
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
                        const Shape& a1q_rows, bool may_be_unquantized) {
  check_context_device(fn, ctx, DeviceType::cuda);
  MODMOE_CHECK(a.weights != nullptr) << fn << ": weights must not be null";
  check_expert_weights(fn, *a.weights, c, ctx.device);
  // Unquantized rows of a quantized scheme: the experts quantize them (a prepare deferred it).
  const bool unquantized = c.quant.quantized() && may_be_unquantized &&
                           a.hidden_states.defined() && a.hidden_states.dtype() == c.in_dtype;
  const DType in = c.quant.quantized() ? DType::fp8_e4m3 : c.in_dtype;
  Shape shape = a1q_rows;
  shape.push_back(c.hidden_size);
  const char* names = a1q_rows.size() == 1 ? "(M, K)" : "(E_local, max_tokens, K)";
  if (c.quant.quantized() && may_be_unquantized)
    check_tensor(fn, "hidden_states", a.hidden_states, {in, c.in_dtype}, shape, names, ctx.device);
  else
    check_tensor(fn, "hidden_states", a.hidden_states, {in}, shape, names, ctx.device);
  if (unquantized) {
    MODMOE_CHECK(!a.a1q_scale.defined())
        << fn << ": hidden_states in " << dtype_name(c.in_dtype)
        << " are quantized by the experts, so a1q_scale must be undefined, got "
        << a.a1q_scale.describe();
  } else if (c.quant.quantized()) {
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

namespace {
int64_t global_experts(const MoEConfig& c, const ApplyArgs& a) {
  return a.global_num_experts > 0 ? a.global_num_experts : c.num_experts;
}
}  // namespace

int64_t check_standard_apply(const char* fn, const Context& ctx, const MoEConfig& c,
                             const ApplyArgs& a, bool may_be_unquantized) {
  MODMOE_CHECK(a.hidden_states.defined() && a.hidden_states.ndim() == 2)
      << fn << ": hidden_states must be 2-D (M, K), got " << a.hidden_states.describe();
  const int64_t M = a.hidden_states.size(0), K = c.hidden_size, topk = c.topk;
  check_apply_inputs(fn, ctx, c, a, {M}, may_be_unquantized);
  check_tensor(fn, "output", a.output, {c.in_dtype}, {M, K}, "(M, K)", ctx.device);
  check_tensor(fn, "topk_ids", a.topk_ids, {DType::int32, DType::int64}, {M, topk}, "(M, topk)",
               ctx.device);
  if (!a.apply_router_weight_on_input)
    check_tensor(fn, "topk_weights", a.topk_weights, {DType::fp32}, {M, topk}, "(M, topk)",
                 ctx.device);
  MODMOE_CHECK(!a.apply_router_weight_on_input || topk == 1)
      << fn << ": apply_router_weight_on_input requires topk == 1, got topk = " << topk;
  const int64_t E = global_experts(c, a);
  if (a.expert_map.defined()) {
    check_tensor(fn, "expert_map", a.expert_map, {DType::int32}, {E}, "(E)", ctx.device);
  } else {
    MODMOE_CHECK(c.num_local_experts == E)
        << fn << ": expert_map is required when the weights hold a subset of the experts "
        << "(E_local = " << c.num_local_experts << ", E = " << E << ")";
  }
  return M;
}

void check_batched_experts(const char* name, const MoEConfig& c, int num_dispatchers) {
  MODMOE_CHECK(c.max_num_tokens > 0)
      << name << ": config.max_num_tokens must be > 0, got " << c.max_num_tokens;
  MODMOE_CHECK(num_dispatchers >= 1)
      << name << ": num_dispatchers must be >= 1, got " << num_dispatchers;
}

void check_batched_apply(const char* fn, const Context& ctx, const MoEConfig& c, const ApplyArgs& a,
                         int64_t T) {
  const int64_t E_local = c.num_local_experts, K = c.hidden_size;
  check_apply_inputs(fn, ctx, c, a, {E_local, T});
  MODMOE_CHECK(a.expert_tokens_meta != nullptr)
      << fn << ": expert_tokens_meta (expert_num_tokens) is required for batched inputs";
  check_tensor(fn, "expert_num_tokens", a.expert_tokens_meta->expert_num_tokens, {DType::int32},
               {E_local}, "(E_local)", ctx.device);
  check_tensor(fn, "output", a.output, {DType::fp32}, {E_local, T, K}, "(E_local, max_tokens, K)",
               ctx.device);
}

PermuteArgs standard_permute_args(const MoEConfig& c, const ApplyArgs& a, int64_t M) {
  PermuteArgs p;
  p.topk_ids = a.topk_ids.data();
  p.ids_dtype = a.topk_ids.dtype();
  p.num_tokens = M;
  p.topk = c.topk;
  p.expert_map = a.expert_map.defined() ? a.expert_map.data_ptr<int32_t>() : nullptr;
  p.num_experts = global_experts(c, a);
  p.num_local_experts = c.num_local_experts;
  return p;
}

WeightedReduceArgs standard_reduce_args(const MoEConfig& c, const ApplyArgs& a, const void* y,
                                        DType y_dtype, const int32_t* row_of_pair, int64_t M) {
  const int64_t K = c.hidden_size;
  WeightedReduceArgs r;
  r.src = y;
  r.src_dtype = y_dtype;
  r.src_ld = K;
  r.pair_row = row_of_pair;
  r.topk_weights = a.apply_router_weight_on_input ? nullptr : a.topk_weights.data_ptr<float>();
  r.M = M;
  r.topk = c.topk;
  r.K = K;
  r.out = a.output.data();
  r.out_dtype = a.output.dtype();
  r.out_ld = K;
  return r;
}

}  // namespace modmoe::cuda
