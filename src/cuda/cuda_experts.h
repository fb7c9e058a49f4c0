// The CUDA experts on the portable grouped GEMM (src/cuda/grouped_gemm.h). Both run, over rows
// grouped by local expert and known only on the device:
//
//   GEMM1 (w13) [+ act(gate)*up in its epilogue] -> [activation kernel (_no_mul / unfused)]
//   -> [quantize_rows (fp8 schemes), bounded by the device row count] -> GEMM2 (w2)
//
// Intermediates: GEMM1 writes fp32 whenever a quantization or an activation kernel follows
// (so the fp8 scale of the intermediate sees the same fp32 values as the CPU reference); when
// nothing follows (unquantized, fused gated) it writes GEMM2's bf16/fp16 input directly, which
// is the one rounding GEMM2's operand needs anyway. GEMM2 accumulates and writes fp32.
// Every buffer is declared in workspace_shapes() (uint8 byte workspaces, carved at 256-byte
// alignment); apply() never allocates, never synchronizes, and launches only on ctx.stream.
#pragma once

#include <cstdint>

#include "modmoe/experts.h"

namespace modmoe::cuda {

// Standard format. permute (CUB stable sort) -> GEMM1 gathering A rows through the permute's
// row map -> ... -> GEMM2 into (rows, K) fp32 -> unpermute + top-k weight + reduce in fixed k
// order, writing (M, K) in the input dtype itself: finalize_weight_and_reduce_impl is NoOp.
// Supports expert_map (pairs of other ranks' experts are skipped) and chunking (a dynamic
// per-tensor intermediate scale is then one per chunk, as on the CPU).
//
// Decode-sized applies of the configs decode_mlp runs (gated; none or dynamic fp8_block; K, N
// multiples of 16) take the decode path instead (decode_mlp.h): two weight-streaming kernels, no
// permute. Decode sized: one token (its topk experts are distinct, so no weight is read twice);
// or at most one pair per local expert on average (M * topk <= E_local) and at most
// kMaxDecodeWeightBytes of expert weights (M * topk * one expert's w13 + w2); or at most
// kMaxSparseDecodeTokens tokens, half a pair per local expert and kMaxSparseDecodeWeightBytes.
// On the H200 (2026-12-01, docs/perf.md) the decode path wins the M = 1 layer of every standard
// model but DeepSeek-V3 bf16 (1.03x the Hopper path's time in the sixth session); with the
// twelfth session's kernels it also won 11 of the 12 layers of M = 2..8 that the 256 MiB bound
// alone kept on the grouped paths (gpt-oss-120b fp8 M = 3..5 0.73-0.84x, bf16 M = 2 0.97x;
// Qwen3 fp8 M = 8 0.92x, bf16 M = 4..6 0.86-0.96x; Qwen3.5 bf16 M = 6..8 0.87-0.98x) and lost
// Qwen3 bf16 M = 7 (528 MB streamed: 1.03x), which the 480 MiB bound leaves out; it lost at
// M = 16 (Qwen3 fp8 1.28x, Qwen3.5 fp8 1.12x, Qwen3.5 bf16 1.06x: pairs share experts, and each
// pair reads its own), where the bounds keep the grouped paths.
class CudaExperts final : public Experts {
 public:
  // When the decode path runs: `automatic` as above; `never` and `always` (every M, for
  // tests and A/B measurements; an error on a config it cannot run).
  enum class DecodePath : uint8_t { automatic, never, always };

  // fuse_gated_activation = false runs the gated activation as its own kernel after a plain
  // GEMM1 into a 2N-wide fp32 buffer (the unfused path: tests and A/B measurements); it implies
  // DecodePath::never.
  explicit CudaExperts(const MoEConfig& config, bool fuse_gated_activation = true,
                       DecodePath decode = DecodePath::automatic);
  std::string name() const override { return "CudaExperts"; }
  std::pair<ActivationFormat, ActivationFormat> activation_formats() const override {
    return {ActivationFormat::Standard, ActivationFormat::Standard};
  }
  bool supports_expert_map() const override { return true; }
  bool supports_chunking() const override { return true; }
  WorkspaceShapes workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk,
                                   int64_t global_num_experts, int64_t local_num_experts,
                                   const ExpertTokensMetadata* meta) const override;
  TopKWeightAndReducePtr finalize_weight_and_reduce_impl() const override;
  // Dynamic fp8-block with a decode path: the decode path's gate_up quantizes the token rows
  // itself (no quantize kernel in front of it, one graph node fewer at M = 1); the grouped path
  // quantizes them into workspace2 first. Quantized rows (a prepare that quantized anyway)
  // still work.
  bool expects_unquantized_input() const override;
  void apply(const Context& ctx, const ApplyArgs& args) override;

  // Whether an apply of M tokens takes the decode path.
  bool runs_decode(int64_t M) const;
  // The most tokens an apply may have and still take the decode path (0: none).
  int64_t max_decode_tokens() const;
  // The path an apply of M tokens takes: "decode" or "grouped" (for benchmark records).
  const char* route(int64_t M) const { return runs_decode(M) ? "decode" : "grouped"; }
  static constexpr int64_t kMaxDecodeWeightBytes = int64_t{256} << 20;
  static constexpr int64_t kMaxSparseDecodeTokens = 8;
  static constexpr int64_t kMaxSparseDecodeWeightBytes = int64_t{480} << 20;

 private:
  bool fuse_gated_activation_;
  DecodePath decode_;
};

// Batched format: (E_local, max_tokens, K) inputs with expert_num_tokens on the device. The
// valid rows of all experts are packed (a device prefix sum over the counts) and run through
// the same pipeline; GEMM2 writes straight into the (E_local, max_tokens, K) fp32 output,
// only rows below each count. Rows past expert_num_tokens[e] are never read nor written.
// finalize_weight_and_reduce_impl is Delegate (the P/F's NaiveBatched).
class BatchedCudaExperts final : public Experts {
 public:
  explicit BatchedCudaExperts(const MoEConfig& config, int num_dispatchers = 1,
                              bool fuse_gated_activation = true);
  std::string name() const override { return "BatchedCudaExperts"; }
  std::pair<ActivationFormat, ActivationFormat> activation_formats() const override {
    return {ActivationFormat::Batched, ActivationFormat::Batched};
  }
  bool supports_expert_map() const override { return true; }
  bool supports_chunking() const override { return false; }
  WorkspaceShapes workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk,
                                   int64_t global_num_experts, int64_t local_num_experts,
                                   const ExpertTokensMetadata* meta) const override;
  TopKWeightAndReducePtr finalize_weight_and_reduce_impl() const override;
  void apply(const Context& ctx, const ApplyArgs& args) override;

 private:
  int num_dispatchers_;
  bool fuse_gated_activation_;
};

}  // namespace modmoe::cuda
