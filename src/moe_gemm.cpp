// moe_gemm_groupwise (include/modmoe/moe_gemm.h): the argument contract, checked once for every
// backend, then the backend's implementation. Sits above the backends, like ops.cpp.
#include "modmoe/moe_gemm.h"

#include "core/validate.h"
#include "cpu/moe_gemm.h"
#include "modmoe/error.h"
#include "modmoe/quant.h"
#ifdef MODMOE_WITH_CUDA
#include "cuda/moe_gemm.h"
#endif

namespace modmoe {

namespace {
constexpr const char* kFn = "moe_gemm_groupwise";
}  // namespace

void moe_gemm_groupwise(const Context& ctx, const Tensor& a, const Tensor& b,
                        const Tensor& a_scale, const Tensor& b_scale, const Tensor& m_indptr,
                        const Tensor& out, const MoeGemmOptions& o) {
  MODMOE_CHECK(b.defined() && b.ndim() == 3)
      << kFn << ": b must be 3-D (E, N_b, K), got " << b.describe();
  MODMOE_CHECK(a.defined() && a.ndim() == 2)
      << kFn << ": a must be 2-D (total_rows, K), got " << a.describe();
  const int64_t E = b.size(0), N_b = b.size(1), K = b.size(2), rows = a.size(0);
  const DType dtype = a.dtype();
  MODMOE_CHECK(dtype == DType::bf16 || dtype == DType::fp8_e4m3)
      << kFn << ": a must be bf16 or fp8_e4m3, got " << a.describe();
  check_tensor(kFn, "a", a, {dtype}, {rows, K}, "(total_rows, K)", ctx.device);
  check_tensor(kFn, "b", b, {dtype}, {E, N_b, K}, "(E, N_b, K)", ctx.device);
  MODMOE_CHECK(o.scale_major_mode == "K")
      << kFn << ": scale_major_mode must be \"K\" (the MN-major layout is not supported yet), got \""
      << o.scale_major_mode << "\"";
  int64_t N_out = N_b;
  if (o.gated) {
    MODMOE_CHECK(N_b % 2 == 0) << kFn << ": b.size(1) must be even for gated, got " << N_b;
    MODMOE_CHECK(is_gated(o.activation))
        << kFn << ": gated needs a gated activation (silu, gelu, gelu_tanh, swigluoai), got "
        << activation_name(o.activation);
    N_out = N_b / 2;
  }
  MODMOE_CHECK(out.defined() && out.ndim() == 2 && out.size(1) == N_out)
      << kFn << ": out.size(1) must be " << (o.gated ? "b.size(1)/2 = " : "b.size(1) = ") << N_out
      << (o.gated ? " for gated" : "") << ", got " << (out.defined() && out.ndim() == 2 ? std::to_string(out.size(1)) : out.describe());
  check_tensor(kFn, "out", out, {DType::bf16, DType::fp16, DType::fp32}, {rows, N_out},
               "(total_rows, N_out)", ctx.device);
  MODMOE_CHECK(N_out % 16 == 0) << kFn << ": N_out must be a multiple of 16, got " << N_out;
  MODMOE_CHECK(m_indptr.defined() && m_indptr.ndim() == 1 && m_indptr.numel() == E + 1)
      << kFn << ": m_indptr must have E+1 = " << E + 1 << " elements, got " << m_indptr.describe();
  check_tensor(kFn, "m_indptr", m_indptr, {DType::int32}, {E + 1}, "(E+1)", ctx.device);
  const QuantScheme scheme = dtype == DType::fp8_e4m3 ? QuantScheme::fp8_block : QuantScheme::none;
  if (scheme == QuantScheme::fp8_block) {
    MODMOE_CHECK(K % kBlockSize == 0)
        << kFn << ": K must be a multiple of 128 for fp8 block scales, got " << K;
    check_tensor(kFn, "a_scale", a_scale, {DType::fp32}, act_scale_shape(scheme, rows, K),
                 "(total_rows, K/128)", ctx.device);
    check_tensor(kFn, "b_scale", b_scale, {DType::fp32}, weight_scale_shape(scheme, E, N_b, K),
                 "(E, ceil(N_b/128), K/128)", ctx.device);
  } else {
    MODMOE_CHECK(!a_scale.defined() && !b_scale.defined())
        << kFn << ": bf16 inputs take no scales, got a_scale " << a_scale.describe()
        << " and b_scale " << b_scale.describe();
  }
  MODMOE_CHECK(!out.overlaps(a) && !out.overlaps(b))
      << kFn << ": out must not overlap a or b";

  if (ctx.device.is_cuda()) {
#ifdef MODMOE_WITH_CUDA
    cuda::moe_gemm_groupwise(ctx, a, b, a_scale, b_scale, m_indptr, out, scheme, o);
    return;
#else
    MODMOE_FAIL() << kFn << ": this build has no CUDA backend";
#endif
  }
  cpu::moe_gemm_groupwise(ctx, a, b, a_scale, b_scale, m_indptr, out, scheme, o);
}

}  // namespace modmoe
