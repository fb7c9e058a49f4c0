// moe_gemm_groupwise: the grouped GEMM over experts as a public op (FlashInfer's
// moe_gemm_fp8_nt_groupwise with its is_gated flag, in modmoe's terms).
//
//   out[rows of e] = a[rows of e] · b[e]^T            rows of e = [m_indptr[e], m_indptr[e+1])
//
// a (total_rows, K) and b (E, N_b, K) are both bf16, or both fp8 e4m3 with scales whose dtype
// picks the scheme (a_scale and b_scale must agree):
//   fp32  block scales of granularity (1, 128, 128), K a multiple of 128: a_scale (total_rows,
//         K/128), b_scale (E, ceil(N_b/128), K/128), both K-major ("scale_major_mode" "K"), or
//         both MN-major ("MN": a_scale (K/128, total_rows), b_scale (E, K/128, ceil(N_b/128)));
//   e8m0  MX-FP8 (quant.h's mxfp8): one power-of-two scale 2^(v-127) per 32 elements along K,
//         K a multiple of 32: a_scale (total_rows, K/32), b_scale (E, N_b, K/32), K-major only;
//         out bf16, fp16 or fp32 (the fp8 out below writes fp8_block scales, not MX ones).
// m_indptr (E+1) int32 lives on the compute device and is not read on the host (on the CPU
// backend it is host memory and is validated). Experts may be empty; rows outside
// [m_indptr[0], m_indptr[E]) are not written. Gated: N_out = N_b / 2, the
// kernel computes both halves of a tile and writes act(gate) * up (GatedLayout says which half
// is which); plain: N_out = N_b. out (total_rows, N_out) bf16 (fp16/fp32 accepted), or, gated
// only, fp8_e4m3 with out_scale fp32 (total_rows, N_out/128): act(gate)*up quantized per row
// and 128 columns as the fp8_block activation quantizer does — the operand GEMM2 takes.
//
// Which kernel runs on CUDA (MoeGemmOptions::kernel):
//   automatic  the Hopper kernel when the device is sm_90 and the build has it (sm_90a) and the
//              arguments allow it, the portable mma.sync kernel otherwise
//   portable   the portable kernel (sm80+; fp8 from sm89)
//   sm90       the Hopper kernel (persistent, warp-specialized, TMA + wgmma); an error when the
//              device or the build cannot run it
// "MN" scales and the fp8 out run on the CPU and on the Hopper kernel; the portable CUDA kernel
// takes neither (automatic then needs the Hopper kernel, and says so when it cannot run).
// MX-FP8 runs on the CPU, the portable kernel (fp8: sm89+) and the Hopper kernel (K % 128;
// promoted per 32-wide K step on the CUDA cores, about 2.2-3.8x the time of block scales on the
// H200: docs/perf.md); automatic takes the Hopper kernel where it accepts the call, else the
// portable one (e.g. K % 128 != 0).
#pragma once

#include <string>
#include <vector>

#include "modmoe/activation.h"
#include "modmoe/context.h"
#include "modmoe/tensor.h"

namespace modmoe {

enum class MoeGemmKernel { automatic, portable, sm90 };

// How the Hopper kernel's CTAs find their next tile (expert, row block, column block):
//   cooperative  a scheduler warp per CTA scans 32 experts at a time (shuffle prefix sum over
//                the tile counts, ballot to find the owner), moving forward only
//   linear_scan  the same warp walks the experts one at a time (the simple baseline)
//   precomputed  a small kernel writes the tile list first; the CTAs read it (the "ideal" the
//                other two are measured against)
enum class MoeGemmScheduler { cooperative, linear_scan, precomputed };

struct MoeGemmOptions {
  bool gated = false;
  GatedLayout gated_layout = GatedLayout::GateUp;  // FlashInfer's is_gated order is UpGate
  Activation activation = Activation::silu;        // a gated form, used when gated
  std::string scale_major_mode = "K";              // "K" or "MN" (not on the portable kernel,
                                                   // nor for MX scales)
  Tensor out_scale;  // fp8 gated output only: (total_rows, N_out/128) fp32
  MoeGemmKernel kernel = MoeGemmKernel::automatic;
  MoeGemmScheduler scheduler = MoeGemmScheduler::cooperative;  // Hopper kernel only
  std::string tile;  // Hopper kernel only: "" = the heuristic, else one of moe_gemm_sm90_tiles()
};

void moe_gemm_groupwise(const Context& ctx, const Tensor& a, const Tensor& b, const Tensor& a_scale,
                        const Tensor& b_scale, const Tensor& m_indptr, const Tensor& out,
                        const MoeGemmOptions& options = {});

// The Hopper kernel's tile shapes, "BMxBN" (rows of a x rows of b per CTA tile; gated tiles
// hold BN/2 gate and BN/2 up rows). Empty in a build without the sm_90a kernels. Not every
// tile takes every call: the 256-wide tiles (128x256, 64x256) take no MX scales, fp8 block
// scales need the tile's weight-scale parts to lie in one 128-row block (gated N % 64 == 0 on
// the 256-wide tiles), and an fp8 out needs a 256-wide tile; a tile that cannot run a call is
// refused with the reason (docs/hopper.md).
std::vector<std::string> moe_gemm_sm90_tiles();

// Whether ctx's device can run the Hopper kernel (a CUDA device of compute capability 9.0 and a
// build with the sm_90a kernels).
bool moe_gemm_sm90_available(const Context& ctx);

// The tile the heuristic picks for these sizes (for benchmarks and tests; "" without sm_90a).
// An fp8 call with MX scales runs 128x128 where this says 128x256 and 64x128 where it says
// 64x256; one with block scales that a tile cannot take runs the next tile that can.
std::string moe_gemm_sm90_tile_for(int64_t total_rows, int64_t N_out, int64_t K, int64_t E,
                                   bool gated, DType dtype, int sm_count);

}  // namespace modmoe
