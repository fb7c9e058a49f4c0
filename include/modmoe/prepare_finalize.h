// PrepareAndFinalize: input quantization + all-to-all dispatch before the experts, and the
// combine (with the top-k weight and reduce when the experts leave it) after them.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "modmoe/allocator.h"
#include "modmoe/context.h"
#include "modmoe/moe_types.h"
#include "modmoe/topk_weight_and_reduce.h"

namespace modmoe {

struct PrepareArgs {
  Tensor a1;            // (M, K) hidden states, in dtype
  Tensor topk_weights;  // fp32 (M, topk)
  Tensor topk_ids;      // int32/int64 (M, topk), global ids
  int64_t num_experts = 0;      // global E
  Tensor expert_map;            // int32 (E), or undefined
  bool apply_router_weight_on_input = false;
  const ExpertWeights* weights = nullptr;  // for static activation scales (a13_scale)
  // The experts quantize the activations themselves (Experts::expects_unquantized_input): a
  // prepare that needs no quantized rows for its own dispatch should return a1 as it is (a1q
  // in in_dtype, a1q_scale undefined). A prepare may still quantize (e.g. to send fewer bytes).
  bool defer_input_quantization = false;
};

struct PrepareResult {
  Tensor a1q;        // Standard: (M, K); Batched: (E_local, max_tokens, K)
  Tensor a1q_scale;  // act_scale_shape of a1q's rows, or undefined when not quantized
                     // (no scheme, or the quantization deferred to the experts)
  std::optional<ExpertTokensMetadata> expert_tokens_meta;  // set by batched formats
  Tensor topk_ids;      // the ids/weights the experts see (a dispatch may replace them)
  Tensor topk_weights;
  std::vector<OwnedTensor> storage;  // owns whatever the views above point to
};

// Waits for a dispatch started by prepare_no_receive and returns its result.
using PrepareReceiver = std::function<PrepareResult()>;

struct FinalizeArgs {
  Tensor output;               // (M, K), in dtype: where the final result goes
  Tensor fused_expert_output;  // what Experts::apply wrote (its workspace_shapes().output)
  Tensor topk_weights;
  Tensor topk_ids;
  Tensor expert_map;
  bool apply_router_weight_on_input = false;
};

class PrepareAndFinalize {
 public:
  explicit PrepareAndFinalize(const MoEConfig& config) : config_(config) {}
  virtual ~PrepareAndFinalize() = default;

  virtual std::string name() const = 0;
  const MoEConfig& config() const { return config_; }

  // Batched when prepare() returns (E_local, max_tokens, K) activations, else Standard.
  virtual ActivationFormat activation_format() const = 0;
  // A dtype the dispatch requires of topk_ids, or nullopt when any index dtype works.
  virtual std::optional<DType> topk_indices_dtype() const { return std::nullopt; }
  // Most tokens one rank may submit to a dispatch; nullopt when unbounded.
  virtual std::optional<int64_t> max_num_tokens_per_rank() const = 0;
  // Number of dispatching units; batched outputs hold num_dispatchers * max_num_tokens_per_rank
  // rows per expert.
  virtual int num_dispatchers() const = 0;
  // True when finalize's output is already reduced over ranks (no further all-reduce needed).
  virtual bool output_is_reduced() const = 0;

  virtual PrepareResult prepare(const Context& ctx, const PrepareArgs& args) = 0;
  virtual bool has_prepare_no_receive() const { return false; }
  // Starts prepare without waiting for other ranks; the receiver waits. Default: throws.
  virtual PrepareReceiver prepare_no_receive(const Context& ctx, const PrepareArgs& args);

  // Combines fused_expert_output into output, applying `weight_and_reduce` (Delegate is
  // replaced by the implementation that fits this format).
  virtual void finalize(const Context& ctx, const FinalizeArgs& args,
                        const TopKWeightAndReduce& weight_and_reduce) = 0;

 private:
  MoEConfig config_;
};

}  // namespace modmoe
