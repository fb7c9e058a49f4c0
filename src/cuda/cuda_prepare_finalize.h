// CUDA PrepareAndFinalize parts: no expert parallelism, Standard and Batched formats. Same
// names and semantics as the CPU parts (src/cpu/prepare_finalize.h); tensors on ctx.device,
// every launch on ctx.stream, no host synchronization (graph-capturable). Storage of the
// prepared activations comes from ctx.alloc() and lives in PrepareResult::storage.
#pragma once

#include "core/prepare_finalize_kinds.h"

namespace modmoe::cuda {

// Quantizes the hidden states as the scheme asks (cuda::quantize_rows); with
// apply_router_weight_on_input the rows are first multiplied by topk_weights[:, 0] (rounded to
// the input dtype, as on the CPU). Finalize: Delegate -> cuda Contiguous.
class NoEPPrepareAndFinalize final : public NoEPPrepareAndFinalizeBase {
 public:
  using NoEPPrepareAndFinalizeBase::NoEPPrepareAndFinalizeBase;
  PrepareResult prepare(const Context& ctx, const PrepareArgs& args) override;
  void finalize(const Context& ctx, const FinalizeArgs& args,
                const TopKWeightAndReduce& weight_and_reduce) override;
};

// Quantizes like NoEP, then scatters the (quantized) rows and their scale rows into
// (E_local, max_tokens, K) in token order with expert_num_tokens (device only: the host copy
// expert_num_tokens_cpu stays undefined, since it would need a synchronization). Rows past a
// count are left unwritten (not poisoned, unlike the CPU part: that would cost a write of the
// whole buffer); the batched experts never read them. Finalize: Delegate -> cuda NaiveBatched.
class BatchedPrepareAndFinalize final : public BatchedPrepareAndFinalizeBase {
 public:
  // max_tokens rows per expert = num_dispatchers * config.max_num_tokens.
  explicit BatchedPrepareAndFinalize(const MoEConfig& config, int num_dispatchers = 1)
      : BatchedPrepareAndFinalizeBase(config, num_dispatchers) {}
  PrepareResult prepare(const Context& ctx, const PrepareArgs& args) override;
  void finalize(const Context& ctx, const FinalizeArgs& args,
                const TopKWeightAndReduce& weight_and_reduce) override;
};

}  // namespace modmoe::cuda
