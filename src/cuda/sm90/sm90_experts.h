// The experts on the Hopper grouped GEMM (sm90_gemm.h), for bf16 inputs or fp8 block scales
// (1x128 activations, 128x128 weights) and a gated activation:
//
//   Sm90Experts (standard):  permute -> gather rows by expert (fp8: quantized on the way when
//                            the prepare left them unquantized, else with their scales)
//     -> GEMM1 with act(gate)*up in its epilogue, written as GEMM2's operand (bf16, or fp8 with
//        its group-128 scales: the epilogue quantizes, no fp32 intermediate, no quantize kernel)
//     -> GEMM2 into (pairs, K) fp32 -> unpermute + top-k weight + reduce (NoOp finalize)
//   BatchedSm90Experts:      GEMM1 and GEMM2 straight on (E_local, max_tokens, K), the kernel
//     reading expert_num_tokens on the device: no pack step, nothing written past a count;
//     GEMM2 writes the (E_local, max_tokens, K) fp32 output (Delegate finalize).
//
// Both need an sm_90 device and a build with the sm_90a kernels (registered as hopper_only:
// "auto" picks them only there). sm90_experts_unsupported() says which configs they take.
#pragma once

#include <memory>
#include <string>

#include "cuda/cuda_experts.h"
#include "modmoe/experts.h"

namespace modmoe::cuda {

// "" when the Hopper experts run `config`, else why not.
std::string sm90_experts_unsupported(const MoEConfig& config);

class Sm90Experts final : public Experts {
 public:
  // reduce_in_gemm2: GEMM2's epilogue adds each row, times its top-k weight, into its token's
  // fp32 row (float atomics: the summation order varies from run to run), so no (pairs, K)
  // buffer and no separate reduce of it; its forward needs Context::deterministic = false.
  // Default: GEMM2 writes (pairs, K) and a deterministic kernel reduces in fixed k order.
  explicit Sm90Experts(const MoEConfig& config, bool reduce_in_gemm2 = false);
  std::string name() const override { return "Sm90Experts"; }
  std::pair<ActivationFormat, ActivationFormat> activation_formats() const override {
    return {ActivationFormat::Standard, ActivationFormat::Standard};
  }
  bool supports_expert_map() const override { return true; }
  bool supports_chunking() const override { return true; }
  WorkspaceShapes workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk,
                                   int64_t global_num_experts, int64_t local_num_experts,
                                   const ExpertTokensMetadata* meta) const override;
  TopKWeightAndReducePtr finalize_weight_and_reduce_impl() const override;
  // fp8-block: the hidden states may come unquantized; apply() quantizes each token once,
  // writing its topk rows by expert (quantize_scatter_rows): the gather and the quantization
  // in one kernel, with no quantize kernel in the prepare. Quantized input still works.
  bool expects_unquantized_input() const override;
  void apply(const Context& ctx, const ApplyArgs& args) override;

  // Whether an apply of M tokens runs the portable CudaExperts instead: where CudaExperts
  // takes its decode path (decode_mlp.h), or its grouped pipeline with at most
  // decode_rows_per_expert() expected rows per expert (M * topk spread over the local experts).
  // bf16: up to 8 rows, where the portable kernels' fused gather (no row copy before GEMM1) and
  // 16-row tiles beat the Hopper path (H200, 2026-11-29, perf.md: Qwen3-30B-A3B M = 1 55.7 vs
  // 62 us; M = 16 204 vs 218 us on 2026-12-01). fp8-block: never (0 rows): since the fp8
  // Hopper kernel's 2026-11-30 speedups it wins every M = 16 case (e.g. DeepSeek-V3 774 vs
  // 862 us, 2026-12-01) and the M = 1 cases the decode path leaves to it (DeepSeek-V3 146 vs
  // 166 us, Mixtral 162 vs 173 us).
  bool runs_portable(int64_t M) const;
  int64_t max_portable_tokens() const;  // the largest M of the grouped rows rule (0: none)
  int64_t decode_rows_per_expert() const;
  // The path an apply of M tokens takes: CudaExperts' "decode" or "grouped", or "hopper" (this
  // part's own kernels); for benchmark records.
  const char* route(int64_t M) const { return runs_portable(M) ? portable_->route(M) : "hopper"; }
  static constexpr int64_t kDecodeRowsPerExpertBf16 = 8;
  static constexpr int64_t kDecodeRowsPerExpertFp8 = 0;

 private:
  bool reduce_in_gemm2_;
  std::unique_ptr<CudaExperts> portable_;  // unless reduce_in_gemm2
};

class BatchedSm90Experts final : public Experts {
 public:
  explicit BatchedSm90Experts(const MoEConfig& config, int num_dispatchers = 1);
  std::string name() const override { return "BatchedSm90Experts"; }
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
};

}  // namespace modmoe::cuda
