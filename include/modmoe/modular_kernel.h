// ModularKernel: prepare -> allocate workspaces -> apply (chunked over M) -> finalize.
#pragma once

#include <functional>
#include <memory>

#include "modmoe/experts.h"
#include "modmoe/prepare_finalize.h"

namespace modmoe {

struct ForwardArgs {
  Tensor hidden_states;  // (M, K) in config().in_dtype
  Tensor topk_weights;   // fp32 (M, topk)
  Tensor topk_ids;       // int32/int64 (M, topk), global expert ids in [0, E)
  Tensor output;         // (M, K) in config().in_dtype; may be hidden_states itself (in place)
  ExpertWeights weights;
  Tensor expert_map;  // optional int32 (E): global id -> local id, -1 = not on this rank
  bool apply_router_weight_on_input = false;  // only with topk == 1
};

// Called between prepare and finalize (after the dispatch was started, before it is waited
// for when the P/F supports prepare_no_receive) so shared experts overlap the all-to-all.
using SharedExpertsFn = std::function<void(const Context& ctx, const Tensor& hidden_states)>;

class ModularKernel {
 public:
  // Throws Error with the reason when the two parts do not compose.
  ModularKernel(std::shared_ptr<PrepareAndFinalize> prepare_finalize,
                std::shared_ptr<Experts> experts, SharedExpertsFn shared_experts = {});

  void forward(const Context& ctx, const ForwardArgs& args) const;

  const PrepareAndFinalize& prepare_finalize() const { return *prepare_finalize_; }
  const Experts& experts() const { return *experts_; }
  const MoEConfig& config() const { return experts_->config(); }

 private:
  std::shared_ptr<PrepareAndFinalize> prepare_finalize_;
  std::shared_ptr<Experts> experts_;
  SharedExpertsFn shared_experts_;
};

}  // namespace modmoe
