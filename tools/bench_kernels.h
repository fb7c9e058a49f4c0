// Small device kernels of the GPU benchmark (raw pointers + stream): random fills, the
// streaming-read bandwidth probe, and the glue of the cuBLAS per-expert baseline (row gather,
// activation, 1x128 quantization into cuBLASLt's scale layout, top-k weighted sum).
//
// None of these is part of modmoe: the baseline must not borrow modmoe's kernels, or a speedup
// against it would measure modmoe against itself.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "modmoe/activation.h"
#include "modmoe/dtype.h"

namespace modmoe::bench {

// ---- random data (a hash of (seed, index): any size, no host staging) ----------------------

// data[i] ~ stddev * (approximately N(0, 1)); bf16, fp16 or fp32.
void fill_normal(void* data, DType dtype, int64_t n, uint64_t seed, float stddev,
                 cudaStream_t stream);
// e4m3 codes of z * 112 with z ~ approximately N(0, 1) (|z| <= 2.45, so codes span most of
// e4m3's range without saturating at 448).
void fill_e4m3(uint8_t* codes, int64_t n, uint64_t seed, cudaStream_t stream);
// data[i] uniform in [lo, hi).
void fill_uniform(float* data, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t stream);
// e8m0 codes (MX scales, 2^(code - 127)) uniform in [lo, hi].
void fill_e8m0(uint8_t* codes, int64_t n, uint64_t seed, int lo, int hi, cudaStream_t stream);

// ---- bandwidth ------------------------------------------------------------------------------

// Reads `bytes` (a multiple of 16, 16-byte aligned) once with 16-byte loads; one XOR per warp
// lands in `sink` (stream_read_sink_words() words) so the loads cannot be optimized away.
// streaming: the lines enter the L2 evict-first (a bandwidth measurement); normal: with normal
// priority, evicting what the L2 held (an L2 flush that leaves no dirty lines).
enum class ReadCaching { streaming, normal };
void stream_read(const void* data, size_t bytes, uint32_t* sink, cudaStream_t stream,
                 ReadCaching caching = ReadCaching::streaming);
int64_t stream_read_sink_words();

// Writes `bytes` (a multiple of 16, 16-byte aligned) once with 16-byte stores of values that
// differ per store (`seed` mixed in), and copies `bytes` from src to dst the same way (16-byte
// loads, four in flight per thread, then their stores): the write-only and read+write
// ceilings of kernels that mostly write (the quantize-scatter) or read and write (the reduce).
void stream_write(void* data, size_t bytes, uint32_t seed, cudaStream_t stream);
void stream_copy(const void* src, void* dst, size_t bytes, cudaStream_t stream);

// ---- launch latency ---------------------------------------------------------------------------

// `count` empty kernels (one warp each) in a row on `stream`: what a graph of that many kernel
// nodes costs with no work in them.
void empty_kernels(int count, cudaStream_t stream);

// ---- the cuBLAS baseline's glue ---------------------------------------------------------------
//
// The baseline lays the routed rows out expert after expert, each expert's segment padded to a
// multiple of 4 rows (cuBLASLt's 1x128 scales want the row count of an operand to be one):
//   expert_offset[e]   first (padded) row of expert e; expert_rows[e] its padded row count
//   row_token[r]       token of row r, or -1 for a padding row (zeros)
//   row_expert[r]      expert of row r
// Per-expert 1x128 scales of a (rows, C) fp8 operand live at
//   scale[expert_offset[e] * ceil(C/128) + g * expert_rows[e] + (r - expert_offset[e])]
// (per expert: groups outer, rows inner, i.e. "outer-dimension major", as cuBLASLt's
// CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F expects).
struct BaselineRows {
  const int32_t* row_token = nullptr;
  const int32_t* row_expert = nullptr;
  const int32_t* expert_offset = nullptr;
  const int32_t* expert_rows = nullptr;
  int64_t rows = 0;  // padded total
};

// out[r] = x[row_token[r]] (zeros for padding rows); bf16, K % 8 == 0.
void gather_rows(const void* x, int64_t K, const BaselineRows& rows, void* out,
                 cudaStream_t stream);
// The same rows quantized to e4m3 per 1x128 group (scale = amax / 448, 1 for an all-zero
// group), scales in the per-expert layout above.
void gather_quantize_rows(const void* x, int64_t K, const BaselineRows& rows, uint8_t* q,
                          float* scale, cudaStream_t stream);
// out[r, j] = act(gate) * up of the [gate; up] row h[r] (2N wide, bf16) into bf16 (rows, N);
// N % 8 == 0. `act` is a gated activation.
void activation_rows(Activation act, const void* h, int64_t N, int64_t rows, void* out,
                     cudaStream_t stream);
// The same, quantized to e4m3 per 1x128 group with scales in the per-expert layout.
void activation_quantize_rows(Activation act, const void* h, int64_t N, const BaselineRows& rows,
                              uint8_t* q, float* scale, cudaStream_t stream);
// out[t] = sum_k w[t, k] * y[pair_row[t * topk + k]] in fp32, rounded to bf16; y bf16 (., K).
void weighted_sum_rows(const void* y, int64_t K, const int32_t* pair_row, const float* weights,
                       int64_t M, int64_t topk, void* out, cudaStream_t stream);

// ---- checks -----------------------------------------------------------------------------------

// Fills `stats` (3 doubles, device) with sum((a-b)^2), sum(b^2) and the count of non-finite
// elements of a; a and b bf16 (n). Deterministic (fixed-order block partials, one final block).
void compare_bf16(const void* a, const void* b, int64_t n, double* stats, double* partials,
                  cudaStream_t stream);
int64_t compare_partials();  // doubles `partials` must hold

}  // namespace modmoe::bench
