// The CPU experts: the reference every other backend is compared with, fast enough for the demo
// (cache-blocked OpenMP GEMMs, fp32 accumulation and fp32 intermediates).
#pragma once

#include "modmoe/experts.h"

namespace modmoe::cpu {

// Standard format. Permutes the (token, k) pairs by local expert, runs the expert MLP, and
// (by default) applies the top-k weights and reduces itself, writing (M, K) directly: its
// finalize_weight_and_reduce_impl is NoOp. With reduce_in_experts = false it writes the
// unreduced (M, topk, K) output and asks the finalize to reduce (Delegate), which is how the
// tests drive the Contiguous reduce through a whole forward.
class ReferenceExperts final : public Experts {
 public:
  explicit ReferenceExperts(const MoEConfig& config, bool reduce_in_experts = true)
      : Experts(config), reduce_in_experts_(reduce_in_experts) {}
  std::string name() const override { return "ReferenceExperts"; }
  std::pair<ActivationFormat, ActivationFormat> activation_formats() const override {
    return {ActivationFormat::Standard, ActivationFormat::Standard};
  }
  bool supports_expert_map() const override { return true; }
  bool supports_chunking() const override { return true; }
  WorkspaceShapes workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk,
                                   int64_t global_num_experts, int64_t local_num_experts,
                                   const ExpertTokensMetadata* meta) const override;
  TopKWeightAndReducePtr finalize_weight_and_reduce_impl() const override;
  void apply(const Context& ctx, const ApplyArgs& args) override;

 private:
  bool reduce_in_experts_;
};

// Batched format: (E_local, max_tokens, K) inputs with expert_num_tokens; reads only the first
// expert_num_tokens[e] rows of each expert and writes only those rows of its
// (E_local, max_tokens, K) output. Leaves the weight-and-reduce to the finalize (Delegate).
class BatchedReferenceExperts final : public Experts {
 public:
  explicit BatchedReferenceExperts(const MoEConfig& config, int num_dispatchers = 1)
      : Experts(config), num_dispatchers_(num_dispatchers) {}
  std::string name() const override { return "BatchedReferenceExperts"; }
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

}  // namespace modmoe::cpu
