// CPU PrepareAndFinalize parts: no expert parallelism, Standard and Batched formats.
#pragma once

#include "core/prepare_finalize_kinds.h"

namespace modmoe::cpu {

// Quantizes the hidden states as the scheme asks (no dispatch: one rank holds every token).
// Finalize: Delegate -> Contiguous.
class NoEPPrepareAndFinalize final : public NoEPPrepareAndFinalizeBase {
 public:
  using NoEPPrepareAndFinalizeBase::NoEPPrepareAndFinalizeBase;
  PrepareResult prepare(const Context& ctx, const PrepareArgs& args) override;
  void finalize(const Context& ctx, const FinalizeArgs& args,
                const TopKWeightAndReduce& weight_and_reduce) override;
};

// Scatters (quantized) tokens into (E_local, max_tokens, K) in token order, with
// expert_num_tokens; rows past a count are NaN-poisoned so a reader cannot mistake them for
// data. Finalize: Delegate -> NaiveBatched.
class BatchedPrepareAndFinalize final : public BatchedPrepareAndFinalizeBase {
 public:
  explicit BatchedPrepareAndFinalize(const MoEConfig& config, int num_dispatchers = 1)
      : BatchedPrepareAndFinalizeBase(config, num_dispatchers) {}
  PrepareResult prepare(const Context& ctx, const PrepareArgs& args) override;
  void finalize(const Context& ctx, const FinalizeArgs& args,
                const TopKWeightAndReduce& weight_and_reduce) override;
};

}  // namespace modmoe::cpu
