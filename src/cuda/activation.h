// Activation kernels on the device (raw pointers + stream), the formulas of
// modmoe/activation.h in fp32. Used where the GEMM does not fuse the activation: the `_no_mul`
// forms (after a plain GEMM1) and the unfused gated path.
//
// Rows: `rows` is the capacity; when `num_rows` (device int32) is given, only rows below
// *num_rows are read and written, so a permuted buffer whose row count is known only on the
// device (m_indptr[E_local]) is never touched past its end. Never synchronizes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "modmoe/activation.h"
#include "modmoe/dtype.h"

namespace modmoe::cuda {

// y[r, j] = act(x[r, j]) for j < N. `act` must be a _no_mul form. x and y are bf16/fp16/fp32
// with leading dimensions ldx, ldy; y may be x itself (same dtype and ld): in place.
void activation_no_mul(Activation act, const void* x, DType x_dtype, int64_t ldx, void* y,
                       DType y_dtype, int64_t ldy, int64_t rows, const int32_t* num_rows, int64_t N,
                       cudaStream_t stream);

// y[r, j] = act(gate) * up for j < N, with gate = x[r, gate_column(layout, j, N)] and
// up = x[r, up_column(layout, j, N)] of the 2N-wide row x[r]. `act` must be a gated form.
// y must not overlap x.
void activation_and_mul(Activation act, GatedLayout layout, const void* x, DType x_dtype,
                        int64_t ldx, void* y, DType y_dtype, int64_t ldy, int64_t rows,
                        const int32_t* num_rows, int64_t N, cudaStream_t stream);

}  // namespace modmoe::cuda
