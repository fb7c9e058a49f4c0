// What a no-EP and a batched PrepareAndFinalize are, independent of the backend: their
// properties (format, token limits, dispatchers) and the parts of their behaviour that need no
// kernels. Each backend derives its NoEPPrepareAndFinalize / BatchedPrepareAndFinalize from
// these and supplies prepare() and finalize() with its own kernels.
#pragma once

#include "modmoe/prepare_finalize.h"

namespace modmoe {

// One rank holds every token: prepare only quantizes. prepare_no_receive is supported (there is
// nothing to wait for, so the receiver returns at once) so that shared experts overlap the
// "dispatch" exactly as they would with a real all-to-all.
class NoEPPrepareAndFinalizeBase : public PrepareAndFinalize {
 public:
  using PrepareAndFinalize::PrepareAndFinalize;
  std::string name() const override { return "NoEPPrepareAndFinalize"; }
  ActivationFormat activation_format() const override { return ActivationFormat::Standard; }
  std::optional<int64_t> max_num_tokens_per_rank() const override { return std::nullopt; }
  int num_dispatchers() const override { return 1; }
  bool output_is_reduced() const override { return false; }
  bool has_prepare_no_receive() const override { return true; }
  PrepareReceiver prepare_no_receive(const Context& ctx, const PrepareArgs& args) override;
};

// Scatters tokens into (E_local, num_dispatchers * max_num_tokens, K) + expert_num_tokens.
class BatchedPrepareAndFinalizeBase : public PrepareAndFinalize {
 public:
  // Throws Error unless config.max_num_tokens > 0 and num_dispatchers >= 1.
  BatchedPrepareAndFinalizeBase(const MoEConfig& config, int num_dispatchers);
  std::string name() const override { return "BatchedPrepareAndFinalize"; }
  ActivationFormat activation_format() const override { return ActivationFormat::Batched; }
  std::optional<int64_t> max_num_tokens_per_rank() const override {
    return config().max_num_tokens;
  }
  int num_dispatchers() const override { return num_dispatchers_; }
  bool output_is_reduced() const override { return false; }
  // Rows per expert in the batched activations.
  int64_t max_tokens() const { return config().max_num_tokens * num_dispatchers_; }

 private:
  int num_dispatchers_;
};

}  // namespace modmoe
