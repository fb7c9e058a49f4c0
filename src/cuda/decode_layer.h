// The persistent decode layer: the decode path's gate_up, quantize_h and down (decode_mlp.h) as
// one grid of one CTA per SM that stays resident from the first weight to the last output.
//
// The separate kernels pay for their boundaries: gate_up's many short CTAs each fill their
// rings from empty (it streams at ~55-60 % of the DRAM rate at M = 1), quantize_h is a grid of
// its own, and down's few CTAs start as gate_up's last wave leaves. Here each warp's ring
// streams across tile boundaries instead, and one grid barrier stands where the kernel
// boundaries stood (docs/perf.md, twenty-fourth session §4: the byte stream with the barrier
// measured 29.2 µs for gpt-oss-120b fp8 M = 1 against the separate kernels' 41 µs):
//
//   phase 1  gate_up tiles (pair, 8 features), dealt round-robin to the CTAs (pairs fastest, so
//            pairs of one expert run side by side); each warp takes every 16th stage of the
//            CTA's tiles in a row, keeping its partial sums per tile in shared memory (summed
//            in warp order after the phase: deterministic). h is written as the separate
//            gate_up writes it. fp8: the CTA that writes the last tile of a (pair, group of 128)
//            of h — an atomic count per group says which — quantizes that group (the bits
//            quantize_h writes), so no second barrier is needed for it.
//   barrier  each CTA requests its first w2 stages, then waits for every CTA (a counter the
//            layer zeroes with a memset before the kernel; the launch is cooperative, so every
//            CTA is resident).
//   phase 2  down tiles (token, 8 or 16 output rows: whichever deals the fewer rows to the
//            busiest CTA), streamed the same way over (pair, stage) units; out written once per
//            row, in warp order: deterministic.
//
// The results are those of the separate kernels up to the order of fp32 additions (the warps
// split the stages differently). Stream ordered, graph capturable (a memset node and a
// cooperative kernel node).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/decode_mlp.h"

namespace modmoe::cuda {

// Why the persistent layer cannot run these args on the current device ("" when it can): the
// cooperative launch, its shared memory (tiles per CTA, the vector operands of all M tokens)
// and the counters. decode_mlp's own checks (decode_mlp_unsupported) come first.
std::string decode_layer_unsupported(const DecodeMlpArgs& a);
// The same for sizes alone (the counters assumed given).
std::string decode_layer_unsupported(int64_t M, int64_t K, int64_t N, int64_t topk,
                                     DType w_dtype);

// The counters the layer needs for these sizes (carve_decode_workspace makes room for them).
int64_t decode_layer_counters(int64_t M, int64_t topk, int64_t N, bool fp8_weights);

// Runs the layer; the args must be ones decode_layer_unsupported accepts.
void decode_layer(const DecodeMlpArgs& a, cudaStream_t stream);

}  // namespace modmoe::cuda
