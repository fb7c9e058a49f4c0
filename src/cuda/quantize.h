// Activation quantization on the device (raw pointers + stream), used by the CUDA P/Fs
// (hidden states) and the CUDA experts (the intermediate before GEMM2).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "modmoe/dtype.h"
#include "modmoe/quant.h"

namespace modmoe::cuda {

// Quantizes rows of x (bf16/fp16/fp32, `ldx` elements between rows) into q (e4m3, K elements
// per row, contiguous) and their scales in the layout of act_scale_shape(scheme, rows, K):
// per-tensor fp32 (1), per-token fp32 (rows, 1), group-128 fp32 (rows, ceil(K/128)),
// MX e8m0 (rows, ceil(K/32)). Semantics identical to the CPU quantizer (quant.h): dynamic
// scale = amax / 448 in fp32 (1 when amax == 0), q = rne_satfinite(x * (1 / scale))
// (docs/formats.md).
// `rows` is the capacity; when `num_rows` (device int32) is given only rows < *num_rows are
// read, written and counted in the per-tensor amax. fp8_tensor dynamic computes the amax on the
// device (deterministically) into scale[0] first; with `static_scale` scale[0] is read.
// Never synchronizes; graph-capturable.
void quantize_rows(const void* x, DType x_dtype, int64_t ldx, int64_t rows,
                   const int32_t* num_rows, int64_t K, QuantScheme scheme, bool static_scale,
                   uint8_t* q, void* scale, cudaStream_t stream);

// quantize_rows fused with a row scatter: each of the `rows` rows of x (contiguous, K
// elements) is quantized once (dynamic scales, any scheme) and its codes and scale row are
// written to rows dst_rows[row * fanout + j], j < fanout, of q and scale (negative entries:
// nowhere). With the permute's row_of_pair and fanout = topk it is the quantization fused into
// the gather by expert: each token read once, its topk rows written quantized. The rows written
// hold the same bits as quantize_rows followed by a gather; rows no entry names are not touched.
void quantize_scatter_rows(const void* x, DType x_dtype, int64_t rows, int64_t K,
                           QuantScheme scheme, const int32_t* dst_rows, int64_t fanout,
                           uint8_t* q, void* scale, cudaStream_t stream);

// out (rows, K) bf16/fp16/fp32 = dequant(q, scale); the inverse of quantize_rows (tests, tools).
void dequantize_rows(const uint8_t* q, const void* scale, int64_t rows, int64_t K,
                     QuantScheme scheme, void* out, DType out_dtype, cudaStream_t stream);

}  // namespace modmoe::cuda
