#include "core/validate.h"

#include <sstream>

#include "modmoe/numeric.h"
#include "modmoe/quant.h"

namespace modmoe {

std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::ostringstream s;
  size_t i = 0;
  for (DType d : dtypes) {
    s << (i == 0 ? "" : (i + 1 == dtypes.size() ? " or " : ", ")) << dtype_name(d);
    ++i;
  }
  return s.str();
}

void check_tensor(const char* fn, const char* arg, const Tensor& t,
                  std::initializer_list<DType> dtypes, const Shape& shape,
                  const char* shape_names, Device device) {
  auto expected = [&] {
    std::ostringstream s;
    s << dtype_list(dtypes) << " ";
    if (shape_names && *shape_names) s << shape_names << " = ";
    s << shape_str(shape);
    return s.str();
  };
  MODMOE_CHECK(t.defined()) << fn << ": " << arg << " must be " << expected() << ", got undefined";
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok |= (t.dtype() == d);
  MODMOE_CHECK(dtype_ok && t.shape() == shape)
      << fn << ": " << arg << " must be " << expected() << ", got " << t.describe();
  MODMOE_CHECK(t.device() == device)
      << fn << ": " << arg << " must be on " << device.str() << ", got " << t.describe();
  MODMOE_CHECK(t.is_contiguous() || t.numel() == 0)
      << fn << ": " << arg << " must be contiguous (row-major), got strides "
      << shape_str(t.strides()) << " for shape " << t.shape_str();
  MODMOE_CHECK(t.data() != nullptr || t.numel() == 0)
      << fn << ": " << arg << " has a null data pointer";
}

void check_scale(const char* fn, const char* arg, const Tensor& scale, QuantScheme scheme,
                 const Shape& expected_shape, Device device) {
  check_tensor(fn, arg, scale, {scale_dtype(scheme)}, expected_shape, "", device);
}

void check_expert_weights(const char* fn, const ExpertWeights& w, const MoEConfig& c,
                          Device device) {
  const int64_t E = c.num_local_experts, K = c.hidden_size, N = c.intermediate_size;
  const int64_t R = c.w13_rows();
  const QuantScheme scheme = c.quant.scheme;
  if (scheme == QuantScheme::none) {
    const char* w13_names = is_gated(c.activation) ? "(E_local, 2N, K)" : "(E_local, N, K)";
    check_tensor(fn, "w13", w.w13, {c.in_dtype}, {E, R, K}, w13_names, device);
    check_tensor(fn, "w2", w.w2, {c.in_dtype}, {E, K, N}, "(E_local, K, N)", device);
    return;
  }
  const char* w13_names = is_gated(c.activation) ? "(E_local, 2N, K)" : "(E_local, N, K)";
  check_tensor(fn, "w13", w.w13, {DType::fp8_e4m3}, {E, R, K}, w13_names, device);
  check_tensor(fn, "w2", w.w2, {DType::fp8_e4m3}, {E, K, N}, "(E_local, K, N)", device);
  check_scale(fn, "w13_scale", w.w13_scale, scheme, weight_scale_shape(scheme, E, R, K), device);
  check_scale(fn, "w2_scale", w.w2_scale, scheme, weight_scale_shape(scheme, E, K, N), device);
  if (c.quant.static_act_scale) {
    check_tensor(fn, "a13_scale", w.a13_scale, {DType::fp32}, {1}, "(static per-tensor)", device);
    check_tensor(fn, "a2_scale", w.a2_scale, {DType::fp32}, {1}, "(static per-tensor)", device);
    if (device.is_cpu()) {
      for (const auto& [name, t] : {std::pair{"a13_scale", w.a13_scale}, std::pair{"a2_scale", w.a2_scale}}) {
        const float s = t.data_ptr<float>()[0];
        MODMOE_CHECK(std::isfinite(s) && s > 0)
            << fn << ": " << name << " must be a positive finite scale, got " << s;
      }
    }
  }
}

void check_context_device(const char* fn, const Context& ctx, DeviceType expected) {
  MODMOE_CHECK(ctx.device.type == expected)
      << fn << ": ctx.device must be " << (expected == DeviceType::cpu ? "cpu" : "cuda")
      << " for this part, got " << ctx.device.str();
}

void check_routing_values(const char* fn, const Tensor& topk_ids, int64_t num_experts,
                          const Tensor& expert_map, int64_t num_local_experts) {
  const int64_t n = topk_ids.numel();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = load_index(topk_ids.data(), topk_ids.dtype(), i);
    MODMOE_CHECK(id >= 0 && id < num_experts)
        << fn << ": topk_ids must be in [0, E=" << num_experts << "), got " << id
        << " at (token " << i / topk_ids.size(1) << ", k " << i % topk_ids.size(1) << ")";
  }
  if (!expert_map.defined()) return;
  const int32_t* map = expert_map.data_ptr<int32_t>();
  for (int64_t g = 0; g < expert_map.numel(); ++g) {
    MODMOE_CHECK(map[g] >= -1 && map[g] < num_local_experts)
        << fn << ": expert_map values must be -1 or a local expert in [0, " << num_local_experts
        << "), got expert_map[" << g << "] = " << map[g];
  }
}

}  // namespace modmoe
