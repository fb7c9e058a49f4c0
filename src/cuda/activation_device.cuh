// The activation functions in fp32 on the device, exactly the formulas of modmoe/activation.h
// (NaN behaviour of std::min/max kept). Shared by the activation kernels and the Hopper GEMM's
// gated epilogue.
#pragma once

#include <cuda_runtime.h>

#include "modmoe/activation.h"

namespace modmoe::cuda {

// act(g) of the gate function of `act` (gated and _no_mul forms share it), as activation.h.
__device__ __forceinline__ float gate_function(Activation act, float g) {
  switch (act) {
    case Activation::silu:
    case Activation::silu_no_mul:
      return g / (1.0f + expf(-g));
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
      return x / (1.0f + expf(-kSwigluOaiAlpha * x));
    }
  }
  return g;
}

__device__ __forceinline__ float gated_function(Activation act, float gate, float up) {
  if (act == Activation::swigluoai) {
    // std::max(std::min(up, limit), -limit) of the host formula.
    up = kSwigluOaiLimit < up ? kSwigluOaiLimit : up;
    up = up < -kSwigluOaiLimit ? -kSwigluOaiLimit : up;
    return gate_function(act, gate) * (up + 1.0f);
  }
  return gate_function(act, gate) * up;
}

}  // namespace modmoe::cuda
