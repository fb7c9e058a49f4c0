// CUDA PrepareAndFinalize parts: no expert parallelism, Standard and Batched formats. Same
// names and semantics as the CPU parts (src/cpu/prepare_finalize.h); tensors on ctx.device,
// every launch on ctx.stream, no host synchronization (graph-capturable). Storage of the
// prepared activations comes from ctx.alloc() and lives in PrepareResult::storage.
#pragma once

#include "modmoe/prepare_finalize.h"

namespace modmoe::cuda {

// Quantizes the hidden states as the scheme asks (cuda::quantize_rows); with
// apply_router_weight_on_input the rows are first multiplied by topk_weights[:, 0] (rounded to
// the input dtype, as on the CPU). Finalize: Delegate -> cuda Contiguous.
class NoEPPrepareAndFinalize final : public PrepareAndFinalize {
 public:
  using PrepareAndFinalize::PrepareAndFinalize;
  std::string name() const override { return "NoEPPrepareAndFinalize"; }
  ActivationFormat activation_format() const override { return ActivationFormat::Standard; }
  std::optional<int64_t> max_num_tokens_per_rank() const override { return std::nullopt; }
  int num_dispatchers() const override { return 1; }
  bool output_is_reduced() const override { return false; }
  bool has_prepare_no_receive() const override { return true; }

  PrepareResult prepare(const Context& ctx, const PrepareArgs& args) override;
  PrepareReceiver prepare_no_receive(const Context& ctx, const PrepareArgs& args) override;
  void finalize(const Context& ctx, const FinalizeArgs& args,
                const TopKWeightAndReduce& weight_and_reduce) override;
};

// Quantizes like NoEP, then scatters the (quantized) rows and their scale rows into
// (E_local, max_tokens, K) in token order with expert_num_tokens (device only: the host copy
// expert_num_tokens_cpu stays undefined, since it would need a synchronization). Rows past a
// count are left unwritten (not poisoned, unlike the CPU part: that would cost a write of the
// whole buffer); the batched experts never read them. Finalize: Delegate -> cuda NaiveBatched.
class BatchedPrepareAndFinalize final : public PrepareAndFinalize {
 public:
  // max_tokens rows per expert = num_dispatchers * config.max_num_tokens.
  explicit BatchedPrepareAndFinalize(const MoEConfig& config, int num_dispatchers = 1);
  std::string name() const override { return "BatchedPrepareAndFinalize"; }
  ActivationFormat activation_format() const override { return ActivationFormat::Batched; }
  std::optional<int64_t> max_num_tokens_per_rank() const override {
    return config().max_num_tokens;
  }
  int num_dispatchers() const override { return num_dispatchers_; }
  bool output_is_reduced() const override { return false; }

  PrepareResult prepare(const Context& ctx, const PrepareArgs& args) override;
  void finalize(const Context& ctx, const FinalizeArgs& args,
                const TopKWeightAndReduce& weight_and_reduce) override;

 private:
  int num_dispatchers_;
};

}  // namespace modmoe::cuda
