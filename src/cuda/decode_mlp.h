// The decode path of CudaExperts: the whole expert MLP of a few tokens in two weight-streaming
// kernels (with fp8 weights a small third one between them), without a permute, reading every
// pair's expert straight from topk_ids.
//
// At decode sizes (about one pair per expert or fewer) the grouped pipeline is a chain of ~6
// small kernels (permute, GEMM1, [quantize], GEMM2, reduce) whose launch gaps, not the weight
// bytes, set the time: 3-7x the floor at M = 1 on the H200 (docs/perf.md). Here two
// weight-streaming kernels, each CTA one 16-row tile on the tensor cores (decode_mlp.cu), and
// for fp8 one that quantizes h once for all of down's CTAs:
//
//   gate_up:  grid (pairs, N / 8). A CTA stages its pair's token row in shared memory (16-bit;
//             fp8 as exact fp16, quantized there first if it came unquantized) and streams
//             the gate and up rows of 8 features of the pair's
//             expert, its warps splitting K; it writes h[pair, n] = act(gate) * up, in fp32
//             for fp8 weights, else rounded to the weights' 16-bit dtype (down's operand).
//   [fp8: quantize_h: one warp per (pair, group of 128): h quantized once, with group-128
//             scales exactly as quantize_rows would, into the workspace's h_codes / h_scale.]
//   down:     grid (tokens, K / 16). A CTA takes its token's topk pairs: their h rows go to
//             shared memory as gate_up wrote them or, for fp8, as the codes quantize_h wrote
//             (their scales folded with the router weight and the w2 scale); its warps
//             stream 16 w2 rows of every pair's expert and it writes
//             out[t, k] = sum over pairs of w * (w2[e] row k . a2), in the output dtype.
//
// On sm_90 down is a programmatic dependent launch of gate_up (fp8: quantize_h is, and down of
// quantize_h): it launches as gate_up's last wave leaves the SMs, requests its first w2 stages
// and waits for gate_up (quantize_h) to finish before reading h (MODMOE_PDL=0 turns it off).
// gate_up itself is launched normally: it reads the routing, which the kernels before it write.
// Both request their first weights before staging their vector operand.
//
// Measured on the H200 (docs/perf.md, sixth and twelfth sessions): the big layers' gate_up
// streams at 70-80 % of the DRAM bandwidth, down at 63-74 % (44-48 % for fp8 while each of its
// CTAs quantized h itself); small layers cost ~8-14 us per kernel whatever their bytes. gate_up's
// CTAs have 4-16 warps (gate_up_warps in decode_mlp.cu: wider for 16-bit weights and long K;
// twenty-first session); down's the most of 16, 8, 4 that run its grid in one wave
// (decode_shapes; twenty-second session).
//
// One persistent grid for all three (a cooperative launch, a grid barrier where the kernel
// boundaries are) was built and measured 1.02-1.31x slower at M = 1 (docs/perf.md,
// twenty-seventh and twenty-eighth sessions: its prologue and the chain between its phases
// cost more than the kernel boundaries, which programmatic dependent launch already overlaps);
// it was removed (git: src/cuda/decode_layer.cu at 143d862).
//
// Each weight row a CTA needs is read once per pair: a pair's expert is read again by every
// other pair routed to it, which at <= 1 pair per expert mostly hits the L2 (those CTAs run
// side by side). Everything is deterministic (fixed summation order, no atomics), stream
// ordered and graph capturable; the schemes are none and fp8_block (dynamic), the activation
// gated, any GatedLayout, expert_map and apply_router_weight_on_input supported.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "modmoe/activation.h"
#include "modmoe/dtype.h"
#include "modmoe/moe_types.h"

namespace modmoe::cuda {

struct DecodeMlpArgs {
  // Tokens: x (M, K) of x_dtype: the weights' dtype (bf16/fp16); with fp8 weights either e4m3
  // codes with x_scale (M, ceil(K / 128)) fp32, or bf16/fp16 with no x_scale, which gate_up
  // quantizes itself (group-128 scales, the bits quantize_rows writes): no quantize kernel
  // before it.
  const void* x = nullptr;
  const float* x_scale = nullptr;
  DType x_dtype = DType::bf16;
  int64_t M = 0, K = 0, N = 0, topk = 0;
  // Routing: pair p = t * topk + j goes to local expert expert_map[topk_ids[p]] (or the id);
  // pairs of no local expert are skipped. topk_weights null: every weight is 1.
  const void* topk_ids = nullptr;
  DType ids_dtype = DType::int32;
  const float* topk_weights = nullptr;
  const int32_t* expert_map = nullptr;
  int64_t num_experts = 0, num_local_experts = 0;
  // Weights: w13 (E_local, 2N, K) and w2 (E_local, K, N) in w_dtype (bf16, fp16 or fp8_e4m3
  // with 128x128 block scales (E_local, ceil(rows / 128), ceil(cols / 128)) fp32).
  const void* w13 = nullptr;
  const void* w2 = nullptr;
  const float* w13_scale = nullptr;
  const float* w2_scale = nullptr;
  DType w_dtype = DType::bf16;
  Activation activation = Activation::silu;  // gated
  GatedLayout gated_layout = GatedLayout::GateUp;
  // Workspace (carve_decode_workspace): h (M * topk, N), fp32 with fp8 weights, else in the
  // weights' 16-bit dtype (down's operand, rounded once by gate_up); with fp8 weights also h
  // quantized once for down: (M * topk, ceil(N / 128) * 128) e4m3 codes (zeros past N) and
  // (M * topk, ceil(N / 128)) fp32 scales.
  void* h = nullptr;
  uint8_t* h_codes = nullptr;
  float* h_scale = nullptr;
  void* out = nullptr;  // (M, K) in out_dtype (bf16, fp16, fp32)
  DType out_dtype = DType::bf16;
};

// Why the decode path cannot run this config with these pointers ("" when it can). Host-side
// only: the shapes, dtypes, scheme and pointer alignments.
std::string decode_mlp_unsupported(const MoEConfig& c, const DecodeMlpArgs& a);

// The same test on the config alone (pointers assumed 16-byte aligned): whether a workspace
// must make room for decode_mlp_workspace_bytes.
bool decode_mlp_config_fits(const MoEConfig& c);

// The workspace of M tokens, carved from `base` (null: sizes only, every pointer null).
struct DecodeWorkspace {
  void* h = nullptr;
  uint8_t* h_codes = nullptr;  // fp8 only
  float* h_scale = nullptr;    // fp8 only
  size_t bytes = 0;
};
DecodeWorkspace carve_decode_workspace(void* base, const MoEConfig& c, int64_t M);
// Bytes of that workspace for M tokens.
size_t decode_mlp_workspace_bytes(const MoEConfig& c, int64_t M);

void decode_mlp(const DecodeMlpArgs& a, cudaStream_t stream);

}  // namespace modmoe::cuda
