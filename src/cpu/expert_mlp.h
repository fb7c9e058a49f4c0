// The expert MLP on rows already grouped by local expert, shared by both CPU experts:
//   GEMM1 (w13) -> act(gate) * up -> [fp8 quantize + dequantize, as GEMM2's input would be]
//   -> GEMM2 (w2).
#pragma once

#include <cstdint>

#include "cpu/gemm.h"
#include "modmoe/context.h"
#include "modmoe/moe_types.h"

namespace modmoe::cpu {

// The weight operand of local expert `e` of w (E, rows, cols) with its scales.
WeightOperand expert_operand(const Tensor& w, const Tensor& scale, QuantScheme scheme, int64_t e);

// Rows [m_indptr[e], m_indptr[e+1]) belong to local expert e (num_local_experts + 1 entries).
// In:  ws2  holds A (rows, K) fp32, the dequantized expert inputs.
// Out: ws13 holds Y (rows, K) fp32, the (unweighted) expert outputs.
// ws13 needs rows * max(w13_rows, K) floats, ws2 rows * max(N, K). `ctx` only carries the
// tracer (ranges gemm1, activation, quantize2, gemm2).
void run_expert_mlp(const Context& ctx, const MoEConfig& config, const ExpertWeights& weights,
                    int64_t rows, const int64_t* m_indptr, float* ws13, float* ws2);

// Dequantizes one row of expert input into fp32: bf16/fp16/fp32 rows are converted, fp8 rows
// are multiplied by their scales (`row_scale`: the row's scales, or the per-tensor scale).
void dequantize_input_row(const void* row, DType dtype, int64_t K, QuantScheme scheme,
                          const void* row_scale, float* out);

}  // namespace modmoe::cpu
