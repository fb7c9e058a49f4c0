// The CPU grouped GEMM behind the CPU experts (internal header).
//
// C = A * B^T with A in fp32 (the activations, already dequantized by the caller) and B an
// expert's weight matrix in nn.Linear layout (N rows of K), stored in bf16/fp16/fp32 or fp8
// e4m3 with the quantization scales of include/modmoe/quant.h. Accumulation is fp32.
//
// How it runs (gemm.cpp has the details):
//   * Groups of more than 4 rows: B is decoded and scaled into fp32 panels once per (tile,
//     256-wide K block) and reused by every row of the tile, so dequantization is amortized
//     over the rows; a register-blocked micro-kernel does the math.
//   * Groups of at most 4 rows (decode): nothing to amortize over, so B is decoded in place,
//     a vector at a time, straight into the dot products; reading B is the whole cost.
//   * The work is cut into (group, row block, column block) tiles spread over the OpenMP
//     threads together, so decode (one row in many groups) and prefill (many rows in one
//     group) both keep every thread busy.
//   * Deterministic: every C element is written by exactly one thread in a fixed summation
//     order (sequential over k for groups of more than 4 rows; lane-wise partial sums added
//     in a fixed tree for smaller groups); the result does not depend on the thread count or
//     the tiling, only on the instruction set the kernel runs with (vector width, fused
//     multiply-add where the CPU has it).
//   * The kernels are picked at run time for the CPU (AVX-512, AVX2+FMA, or the portable
//     baseline); the binary is built for the default target. The environment variable
//     MODMOE_CPU_GEMM_ISA = avx512 | avx2 | generic caps the choice (for tests and A/B
//     measurements); a request the CPU cannot honour falls back to the best it can.
#pragma once

#include <cstdint>

#include "modmoe/dtype.h"
#include "modmoe/quant.h"

namespace modmoe {
namespace cpu {

// One expert's weight matrix B (N rows, K columns, row-major "K-major" = nn.Linear layout)
// and how to dequantize it. dequant(B)[n][k] = decode(data[n*row_stride + k]) * scale(n, k).
struct WeightOperand {
  const void* data = nullptr;
  DType dtype = DType::fp32;  // bf16, fp16, fp32 or fp8_e4m3
  int64_t N = 0, K = 0;
  int64_t row_stride = 0;                  // elements between rows (>= K)
  QuantScheme scheme = QuantScheme::none;  // none for bf16/fp16/fp32
  // This expert's scales (already offset to the expert):
  //   fp8_tensor: float[1]; fp8_token (per-channel): float[N];
  //   fp8_block: float[ceil(N/128) * ceil(K/128)] row-major; mxfp8: uint8 e8m0 [N * ceil(K/32)].
  const void* scale = nullptr;
};

// C[m][n] (fp32, row stride ldc) = sum_k A[m][k] * dequant(B)[n][k]   (C = A * B^T)
// for the rows of each group g: rows [row_offsets[g], row_offsets[g+1]) of A and C use B[g].
// Groups with no rows cost nothing (their B is never touched).
//
// row_offsets has num_groups + 1 non-decreasing entries, row_offsets[0] >= 0. A (row stride
// lda >= K) and C (row stride ldc >= N) must not overlap. Rows outside every group and the
// columns of C past N are left untouched; with K = 0 the group's C rows are set to zero.
// Throws modmoe::Error on invalid arguments (checked before any work starts).
void grouped_gemm_nt(int64_t num_groups, const int64_t* row_offsets, const float* A, int64_t lda,
                     const WeightOperand* B, float* C, int64_t ldc);

// Convenience: a single group.
void gemm_nt(int64_t M, const float* A, int64_t lda, const WeightOperand& B, float* C, int64_t ldc);

}  // namespace cpu
}  // namespace modmoe
