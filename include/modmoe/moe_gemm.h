// moe_gemm_groupwise: the grouped GEMM over experts as a public op (FlashInfer's
// moe_gemm_fp8_nt_groupwise with its is_gated flag, in modmoe's terms).
//
//   out[rows of e] = a[rows of e] · b[e]^T            rows of e = [m_indptr[e], m_indptr[e+1])
//
// a (total_rows, K) and b (E, N_b, K) are both bf16, or both fp8 e4m3 with fp32 block scales of
// granularity (1, 128, 128): a_scale (total_rows, K/128), b_scale (E, ceil(N_b/128), K/128), both
// K-major ("scale_major_mode" "K"). m_indptr (E+1) int32 lives on the compute device and is not
// read on the host (on the CPU backend it is host memory and is validated). Experts may be
// empty; rows outside [m_indptr[0], m_indptr[E]) are not written. Gated: N_out = N_b / 2, the
// kernel computes both halves of a tile and writes act(gate) * up (GatedLayout says which half
// is which); plain: N_out = N_b. out (total_rows, N_out) bf16 (fp16/fp32 accepted).
//
// On CUDA this runs the portable mma.sync grouped GEMM today; the Hopper wgmma kernel (issue 5)
// will take its place behind the same call.
#pragma once

#include <string>

#include "modmoe/activation.h"
#include "modmoe/context.h"
#include "modmoe/tensor.h"

namespace modmoe {

struct MoeGemmOptions {
  bool gated = false;
  GatedLayout gated_layout = GatedLayout::GateUp;  // FlashInfer's is_gated order is UpGate
  Activation activation = Activation::silu;        // a gated form, used when gated
  std::string scale_major_mode = "K";              // "MN" (transposed scales): not supported yet
};

void moe_gemm_groupwise(const Context& ctx, const Tensor& a, const Tensor& b,
                        const Tensor& a_scale, const Tensor& b_scale, const Tensor& m_indptr,
                        const Tensor& out, const MoeGemmOptions& options = {});

}  // namespace modmoe
