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

void moe_gemm_groupwise(const Context& ctx, const Tensor& a, const Tensor& b, const Tensor& a_scale,
                        const Tensor& b_scale, const Tensor& m_indptr, const Tensor& out,
                        const MoeGemmOptions& o) {
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
  MODMOE_CHECK(o.scale_major_mode == "K" || o.scale_major_mode == "MN")
      << kFn << ": scale_major_mode must be \"K\" or \"MN\", got \"" << o.scale_major_mode << "\"";
  const bool mn_major = o.scale_major_mode == "MN";
  // fp8 inputs: the scales' dtype picks the scheme, e8m0 MX-FP8 (one scale per 32 along K),
  // otherwise fp32 block scales (also when none are given: their checks then say what is
  // missing). One e8m0 and one fp32 scale is no scheme at all: refused by name, so the caller
  // does not get a shape complaint about the other one.
  const bool a_mx = a_scale.defined() && a_scale.dtype() == DType::e8m0;
  const bool b_mx = b_scale.defined() && b_scale.dtype() == DType::e8m0;
  const bool mx = dtype == DType::fp8_e4m3 && (a_mx || b_mx);
  MODMOE_CHECK(!mx || !a_scale.defined() || !b_scale.defined() || a_mx == b_mx)
      << kFn << ": a_scale and b_scale must both be e8m0 (MX-FP8, one scale per 32 along K) or "
      << "both fp32 (fp8 block scales), got a_scale " << a_scale.describe() << " and b_scale "
      << b_scale.describe();
  const QuantScheme scheme = dtype == DType::bf16 ? QuantScheme::none
                             : mx                 ? QuantScheme::mxfp8
                                                  : QuantScheme::fp8_block;
  MODMOE_CHECK(!mx || !mn_major)
      << kFn << ": scale_major_mode must be \"K\" with MX-FP8 inputs (e8m0 scales), got \"MN\": "
      << "MX scales are K-major only";
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
      << (o.gated ? " for gated" : "") << ", got "
      << (out.defined() && out.ndim() == 2 ? std::to_string(out.size(1)) : out.describe());
  check_tensor(kFn, "out", out, {DType::bf16, DType::fp16, DType::fp32, DType::fp8_e4m3},
               {rows, N_out}, "(total_rows, N_out)", ctx.device);
  MODMOE_CHECK(N_out % 16 == 0) << kFn << ": N_out must be a multiple of 16, got " << N_out;
  const bool fp8_out = out.dtype() == DType::fp8_e4m3;
  if (fp8_out) {
    // That out is the fp8_block operand (fp32 scales per row and 128 columns), not an MX one.
    MODMOE_CHECK(!mx) << kFn << ": out must be bf16, fp16 or fp32 with MX-FP8 inputs (e8m0 "
                      << "scales), got " << out.describe() << ": an fp8_e4m3 out writes fp8 "
                      << "block scales (fp32, one per row and 128 columns)";
    MODMOE_CHECK(o.gated) << kFn << ": an fp8_e4m3 out (quantized gated output) needs gated = true";
    MODMOE_CHECK(N_out % kBlockSize == 0)
        << kFn << ": an fp8_e4m3 out needs N_out to be a multiple of 128 (one scale per row and "
        << "128 columns), got " << N_out;
    check_tensor(kFn, "out_scale", o.out_scale, {DType::fp32}, {rows, N_out / kBlockSize},
                 "(total_rows, N_out/128)", ctx.device);
    MODMOE_CHECK(!o.out_scale.overlaps(out)) << kFn << ": out_scale must not overlap out";
  } else {
    MODMOE_CHECK(!o.out_scale.defined())
        << kFn << ": out_scale is only for an fp8_e4m3 out, got " << o.out_scale.describe()
        << " with out " << out.describe();
  }
  MODMOE_CHECK(m_indptr.defined() && m_indptr.ndim() == 1 && m_indptr.numel() == E + 1)
      << kFn << ": m_indptr must have E+1 = " << E + 1 << " elements, got " << m_indptr.describe();
  check_tensor(kFn, "m_indptr", m_indptr, {DType::int32}, {E + 1}, "(E+1)", ctx.device);
  if (scheme == QuantScheme::mxfp8) {
    MODMOE_CHECK(K % kMxBlockSize == 0)
        << kFn << ": K must be a multiple of 32 for MX-FP8 scales (one e8m0 per 32 along K), got "
        << K;
    const int64_t kg = K / kMxBlockSize;
    check_tensor(kFn, "a_scale", a_scale, {DType::e8m0}, {rows, kg}, "(total_rows, K/32)",
                 ctx.device);
    check_tensor(kFn, "b_scale", b_scale, {DType::e8m0}, {E, N_b, kg}, "(E, N_b, K/32)",
                 ctx.device);
  } else if (scheme == QuantScheme::fp8_block) {
    MODMOE_CHECK(K % kBlockSize == 0)
        << kFn << ": K must be a multiple of 128 for fp8 block scales, got " << K;
    const int64_t kb = K / kBlockSize, nb = (N_b + kBlockSize - 1) / kBlockSize;
    if (mn_major) {
      check_tensor(kFn, "a_scale", a_scale, {DType::fp32}, {kb, rows}, "(K/128, total_rows) for MN",
                   ctx.device);
      check_tensor(kFn, "b_scale", b_scale, {DType::fp32}, {E, kb, nb},
                   "(E, K/128, ceil(N_b/128)) for MN", ctx.device);
    } else {
      check_tensor(kFn, "a_scale", a_scale, {DType::fp32}, {rows, kb}, "(total_rows, K/128)",
                   ctx.device);
      check_tensor(kFn, "b_scale", b_scale, {DType::fp32}, {E, nb, kb}, "(E, ceil(N_b/128), K/128)",
                   ctx.device);
    }
  } else {
    MODMOE_CHECK(!a_scale.defined() && !b_scale.defined())
        << kFn << ": bf16 inputs take no scales, got a_scale " << a_scale.describe()
        << " and b_scale " << b_scale.describe();
  }
  MODMOE_CHECK(!out.overlaps(a) && !out.overlaps(b)) << kFn << ": out must not overlap a or b";
  MODMOE_CHECK(ctx.device.is_cuda() || o.kernel == MoeGemmKernel::automatic)
      << kFn << ": kernel " << (o.kernel == MoeGemmKernel::sm90 ? "sm90" : "portable")
      << " needs a CUDA context, got " << ctx.device.str();
  MODMOE_CHECK(o.tile.empty() || o.kernel != MoeGemmKernel::portable)
      << kFn << ": tile \"" << o.tile << "\" is a Hopper-kernel option; kernel is portable";

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

std::vector<std::string> moe_gemm_sm90_tiles() {
#ifdef MODMOE_WITH_CUDA
  return cuda::moe_gemm_sm90_tiles();
#else
  return {};
#endif
}

bool moe_gemm_sm90_available(const Context& ctx) {
#ifdef MODMOE_WITH_CUDA
  return ctx.device.is_cuda() && cuda::moe_gemm_sm90_available(ctx.device.index);
#else
  (void)ctx;
  return false;
#endif
}

std::string moe_gemm_sm90_tile_for(int64_t total_rows, int64_t N_out, int64_t K, int64_t E,
                                   bool gated, DType dtype, int sm_count) {
#ifdef MODMOE_WITH_CUDA
  return cuda::moe_gemm_sm90_tile_for(total_rows, N_out, K, E, gated, dtype, sm_count);
#else
  (void)total_rows, (void)N_out, (void)K, (void)E, (void)gated, (void)dtype, (void)sm_count;
  return "";
#endif
}

}  // namespace modmoe
