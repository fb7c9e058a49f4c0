#include "cpu/expert_mlp.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/quant_rows.h"
#include "cpu/rows.h"
#include "modmoe/activation.h"
#include "modmoe/trace.h"

namespace modmoe::cpu {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Scale entries one expert owns in a weight scale tensor of (E, rows, cols) weights.
int64_t scales_per_expert(QuantScheme scheme, int64_t rows, int64_t cols) {
  switch (scheme) {
    case QuantScheme::fp8_tensor: return 1;
    case QuantScheme::fp8_token: return rows;
    case QuantScheme::fp8_block: return ceil_div(rows, kBlockSize) * ceil_div(cols, kBlockSize);
    case QuantScheme::mxfp8: return rows * ceil_div(cols, kMxBlockSize);
    case QuantScheme::none: return 0;
  }
  return 0;
}
}  // namespace

WeightOperand expert_operand(const Tensor& w, const Tensor& scale, QuantScheme scheme, int64_t e) {
  WeightOperand op;
  op.N = w.size(1);
  op.K = w.size(2);
  op.row_stride = op.K;
  op.dtype = w.dtype();
  op.data = static_cast<const char*>(w.data()) + e * op.N * op.K * dtype_size(w.dtype());
  op.scheme = scheme;
  if (scheme != QuantScheme::none) {
    op.scale = static_cast<const char*>(scale.data()) +
               e * scales_per_expert(scheme, op.N, op.K) * dtype_size(scale.dtype());
  }
  return op;
}

void dequantize_input_row(const void* row, DType dtype, int64_t K, QuantScheme scheme,
                          const void* row_scale, float* out) {
  if (scheme == QuantScheme::none) {
    load_row(row, dtype, K, out);
  } else {
    dequantize_row(static_cast<const uint8_t*>(row), K, scheme, row_scale, out);
  }
}

void run_expert_mlp(const Context& ctx, const MoEConfig& c, const ExpertWeights& w, int64_t rows,
                    const int64_t* m_indptr, float* ws13, float* ws2) {
  if (rows == 0) return;
  const int64_t E = c.num_local_experts, K = c.hidden_size, N = c.intermediate_size;
  const int64_t R = c.w13_rows();
  const QuantScheme scheme = c.quant.scheme;

  std::vector<WeightOperand> w13(E), w2(E);
  for (int64_t e = 0; e < E; ++e) {
    w13[e] = expert_operand(w.w13, w.w13_scale, scheme, e);
    w2[e] = expert_operand(w.w2, w.w2_scale, scheme, e);
  }

  // GEMM1: H (rows, R) = A (rows, K) * w13^T.        A in ws2, H in ws13.
  float* A = ws2;
  float* H = ws13;
  {
    TraceRange range(ctx, "gemm1");
    grouped_gemm_nt(E, m_indptr, A, K, w13.data(), H, R);
  }

  // Activation: act (rows, N) into ws2 (A is no longer needed).
  float* act = ws2;
  const bool gated = is_gated(c.activation);
  TraceRange activation_range(ctx, "activation");
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* h = H + r * R;
    float* o = act + r * N;
    for (int64_t j = 0; j < N; ++j) {
      o[j] = gated ? activation_gated(c.activation, h[gate_column(c.gated_layout, j, N)],
                                      h[up_column(c.gated_layout, j, N)])
                   : activation_gate(c.activation, h[j]);
    }
  }

  activation_range.close();

  // GEMM2's input is quantized exactly as a real fp8 kernel would see it (and as the oracle
  // emulates): quantize each row with the scheme's scales, then dequantize back to fp32.
  if (scheme != QuantScheme::none) {
    TraceRange range(ctx, "quantize2");
    float tensor_scale = 0.0f;
    if (scheme == QuantScheme::fp8_tensor) {
      if (c.quant.static_act_scale) {
        tensor_scale = w.a2_scale.data_ptr<float>()[0];
      } else {
        float amax = 0.0f;
#pragma omp parallel for reduction(max : amax)
        for (int64_t i = 0; i < rows * N; ++i) amax = std::max(amax, std::fabs(act[i]));
        tensor_scale = fp8_scale_for_amax(amax);
      }
    }
    const int64_t groups = scheme == QuantScheme::fp8_tensor ? 1 : ceil_div(N, kMxBlockSize);
#pragma omp parallel
    {
      std::vector<uint8_t> q(N);
      std::vector<float> row_scale(std::max<int64_t>(groups, 1));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        float* o = act + r * N;
        void* rs = scheme == QuantScheme::fp8_tensor ? static_cast<void*>(&tensor_scale)
                                                     : static_cast<void*>(row_scale.data());
        quantize_row(o, N, scheme, &tensor_scale, q.data(), rs);
        dequantize_row(q.data(), N, scheme, rs, o);
      }
    }
  }

  // GEMM2: Y (rows, K) = act (rows, N) * w2^T.       act in ws2, Y in ws13.
  TraceRange range(ctx, "gemm2");
  grouped_gemm_nt(E, m_indptr, act, N, w2.data(), ws13, K);
}

}  // namespace modmoe::cpu
