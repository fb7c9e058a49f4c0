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
// kFast (the Hopper GEMM epilogue, whose outputs are mostly rounded to bf16/fp8): exp2 and
// reciprocal approximations (one MUFU each, a few fp32 ulp) instead of expf's range reduction and
// the correctly rounded reciprocal's Newton steps, range check and branch. Together with the
// quantization's multiply (fp8_codec.cuh) that took ~1250 of the ~2960 instructions per warp
// and tile out of the fp8-out GEMM1 epilogue (ncu, H200, perf.md eighth session).
// 1 + exp(-a x) = inf gives a reciprocal of 0, as the exact form. The exponential is
// ex2.approx.ftz of x times the folded constant -a log2(e): __expf's ex2.approx without .ftz
// compiles to three more instructions per element on sm_90 (a range test, a halving and a
// squaring, for results below 2^-126 — which 1 + e rounds away anyway), ~190 of the ~420
// instructions of a 64-column consumer's silu (SASS of the fp8 64x256 kernel, perf.md twentieth
// session); the epilogue's code is fetched cold on each SM's first tile.
template <bool kFast = false>
__device__ __forceinline__ float times_sigmoid(float x, float a) {
  if constexpr (kFast) {
    constexpr float kLog2e = 1.4426950408889634f;
    float e, r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * (-a * kLog2e)));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
    return x * r;
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
