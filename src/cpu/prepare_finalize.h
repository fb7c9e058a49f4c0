// CPU PrepareAndFinalize parts: no expert parallelism, Standard and Batched formats.
#pragma once

#include "modmoe/prepare_finalize.h"

namespace modmoe::cpu {

// Quantizes the hidden states as the scheme asks (no dispatch: one rank holds every token).
// Finalize: Delegate -> Contiguous. prepare_no_receive is supported (the receiver returns at
// once), so shared experts run "during" the dispatch as they would with a real all-to-all.
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

// Scatters (quantized) tokens into (E_local, max_tokens, K) in token order, with
// expert_num_tokens; rows past a count are NaN-poisoned so a reader cannot mistake them for
// data. Finalize: Delegate -> NaiveBatched.
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

}  // namespace modmoe::cpu
