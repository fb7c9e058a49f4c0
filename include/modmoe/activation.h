// Activation functions of the expert MLP and the layout of the gated halves in w13.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace modmoe {

// Gated forms compute act(gate) * up from a 2N-wide GEMM1 output; `_no_mul` forms compute
// act(h) from an N-wide one (w13 is then (E, N, K)).
enum class Activation : uint8_t {
  silu,              // SwiGLU: silu(gate) * up
  gelu,              // gelu_erf(gate) * up
  gelu_tanh,         // gelu_tanh(gate) * up
  swigluoai,         // gpt-oss: (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7)
  silu_no_mul,
  gelu_no_mul,
  gelu_tanh_no_mul,
  swigluoai_no_mul,  // g * sigmoid(1.702 g), g = min(h, 7)
};

// Where gate and up live in the 2N rows of w13 (and so in GEMM1's output columns).
enum class GatedLayout : uint8_t {
  GateUp,       // rows [0, N) gate, [N, 2N) up (vLLM's w13 = [w1; w3])
  UpGate,       // rows [0, N) up, [N, 2N) gate (FlashInfer is_gated)
  Interleaved,  // row 2i gate, row 2i+1 up (gpt-oss checkpoints)
};

constexpr float kSwigluOaiAlpha = 1.702f;
constexpr float kSwigluOaiLimit = 7.0f;

inline bool is_gated(Activation a) { return a <= Activation::swigluoai; }
const char* activation_name(Activation a);
Activation parse_activation(const std::string& name);
const char* gated_layout_name(GatedLayout layout);
GatedLayout parse_gated_layout(const std::string& name);

// Column of gate / up element j (0 <= j < N) in a 2N-wide GEMM1 output row.
constexpr int64_t gate_column(GatedLayout layout, int64_t j, int64_t N) {
  return layout == GatedLayout::GateUp ? j : layout == GatedLayout::UpGate ? N + j : 2 * j;
}
constexpr int64_t up_column(GatedLayout layout, int64_t j, int64_t N) {
  return layout == GatedLayout::GateUp ? N + j : layout == GatedLayout::UpGate ? j : 2 * j + 1;
}

// Scalar math, shared by every backend's reference path. T is float or double.
template <typename T>
T activation_gate(Activation a, T g) {
  switch (a) {
    case Activation::silu:
    case Activation::silu_no_mul: return g / (T(1) + std::exp(-g));
    case Activation::gelu:
    case Activation::gelu_no_mul: return T(0.5) * g * (T(1) + std::erf(g * T(0.70710678118654752)));
    case Activation::gelu_tanh:
    case Activation::gelu_tanh_no_mul: {
      const T c = T(0.79788456080286536);  // sqrt(2/pi)
      return T(0.5) * g * (T(1) + std::tanh(c * (g + T(0.044715) * g * g * g)));
    }
    case Activation::swigluoai:
    case Activation::swigluoai_no_mul: {
      const T x = std::min(g, T(kSwigluOaiLimit));
      return x / (T(1) + std::exp(-T(kSwigluOaiAlpha) * x));
    }
  }
  return g;
}

// act(gate) * up for the gated forms (swigluoai clamps up and adds 1).
template <typename T>
T activation_gated(Activation a, T gate, T up) {
  if (a == Activation::swigluoai) {
    up = std::max(std::min(up, T(kSwigluOaiLimit)), T(-kSwigluOaiLimit));
    return activation_gate(a, gate) * (up + T(1));
  }
  return activation_gate(a, gate) * up;
}

}  // namespace modmoe
