// The activation functions in fp32 on the device, exactly the formulas of modmoe/activation.h
// (NaN behaviour of std::min/max kept). Shared by the activation kernels and the Hopper GEMM's
// gated epilogue.
#pragma once

#include <cuda_runtime.h>

#include "modmoe/activation.h"

namespace modmoe::cuda {

// x * sigmoid(a x) as x times a reciprocal, not x / (1 + exp(-a x)): an fp32 division takes its
// slow path (a subroutine call) whenever the numerator is 0, and the Hopper GEMM's epilogue
// sees exact zeros in every row past an expert's end (fp8 scales them by 0). At 1 row per
// expert that path cost the fused fp8 FC1 a quarter of its time (ncu, H200, 2026-11-30). The
// reciprocal's slow path needs 1 + exp(-a x) out of range (a x < -87); one more rounding.
//
// kFast (the Hopper GEMM epilogue, whose outputs are rounded to bf16/fp8): one MUFU instruction
// per element, x sigmoid(a x) = h + h tanh(a h) with h = x / 2 (tanh.approx), where exp2 and a
// reciprocal took two. The MUFU unit does 16 operations per clock per SM, an eighth of the fp32
// rate, and it paced the gated epilogue: in an epilogue-like loop (64 elements per thread, the
// row amax, the e4m3 pair conversion) the exp2 + reciprocal form took 20.4 cycles per
// warp-element and this one 12.3; a Newton reciprocal on the fma pipe instead of MUFU.RCP took
// 16-20 (more instructions to issue). Measured error (H200, 2^20 gates in [-20, 20]): at most
// 4.2e-6 of |gate * up| (the exp2 form 5.1e-7), under 2^-9 of it (bf16's rounding) everywhere;
// relative to the result 4.5e-6 for x > 0, 9.5e-5 for -6 <= x < 0 and 8.8e-3 for -10 <= x < -6,
// where |x sigmoid(x)| < 0.015 (perf.md, twenty-ninth session; CudaFastActivation.* holds it to
// 2e-5). x = -inf gives NaN (h + h * -1), as the exact form (-inf * 0); +inf gives inf; exact
// zeros (rows past an expert's end) give 0, with no slow path.
template <bool kFast = false>
__device__ __forceinline__ float times_sigmoid(float x, float a) {
  if constexpr (kFast) {
    const float h = 0.5f * x;
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(a * h));
    return fmaf(h, t, h);
  } else {
    return x * (1.0f / (1.0f + expf(-a * x)));
  }
}

// act(g) of the gate function of `act` (gated and _no_mul forms share it), as activation.h.
// kFast: the sigmoid-based ones approximated (times_sigmoid).
template <bool kFast = false>
__device__ __forceinline__ float gate_function(Activation act, float g) {
  switch (act) {
    case Activation::silu:
    case Activation::silu_no_mul:
      return times_sigmoid<kFast>(g, 1.0f);
    case Activation::gelu:
    case Activation::gelu_no_mul:
      return 0.5f * g * (1.0f + erff(g * 0.70710678118654752f));
    case Activation::gelu_tanh:
    case Activation::gelu_tanh_no_mul:
      return 0.5f * g * (1.0f + tanhf(0.79788456080286536f * (g + 0.044715f * g * g * g)));
    case Activation::swigluoai:
    case Activation::swigluoai_no_mul: {
      // std::min(g, limit) of the host formula: NaN stays NaN.
      const float x = kSwigluOaiLimit < g ? kSwigluOaiLimit : g;
      return times_sigmoid<kFast>(x, kSwigluOaiAlpha);
    }
  }
  return g;
}

template <bool kFast = false>
__device__ __forceinline__ float gated_function(Activation act, float gate, float up) {
  if (act == Activation::swigluoai) {
    // std::max(std::min(up, limit), -limit) of the host formula.
    up = kSwigluOaiLimit < up ? kSwigluOaiLimit : up;
    up = up < -kSwigluOaiLimit ? -kSwigluOaiLimit : up;
    return gate_function<kFast>(act, gate) * (up + 1.0f);
  }
  return gate_function<kFast>(act, gate) * up;
}

}  // namespace modmoe::cuda
