// TopKWeightAndReduce: where the top-k weighting and the reduction over k happen.
//
// Experts::finalize_weight_and_reduce_impl() returns one of these; PrepareAndFinalize::finalize
// calls it. NoOp: the experts already wrote the reduced (M, K) output. Delegate: "finalize,
// pick the one that fits your format" (Contiguous for Standard, NaiveBatched for Batched).
#pragma once

#include <memory>

#include "modmoe/context.h"
#include "modmoe/tensor.h"

namespace modmoe {

enum class WeightAndReduceKind : uint8_t { NoOp, Contiguous, NaiveBatched, Delegate };
const char* weight_and_reduce_name(WeightAndReduceKind kind);

struct ReduceArgs {
  Tensor output;               // (M, K), in dtype
  Tensor fused_expert_output;  // NoOp: (M, K); Contiguous: (M, topk, K);
                               // NaiveBatched: (E_local, max_tokens, K)
  Tensor topk_weights;         // fp32 (M, topk)
  Tensor topk_ids;             // int32/int64 (M, topk), global expert ids
  Tensor expert_map;           // int32 (E) global -> local, -1 = not here; or undefined
  bool apply_router_weight_on_input = false;  // weights were applied before GEMM1: plain sum
};

class TopKWeightAndReduce {
 public:
  virtual ~TopKWeightAndReduce() = default;
  virtual WeightAndReduceKind kind() const = 0;
  const char* name() const { return weight_and_reduce_name(kind()); }
  // output = reduce(fused_expert_output). Entries routed to experts that are not local are
  // skipped. Delegate throws: a finalize must replace it first.
  virtual void apply(const Context& ctx, const ReduceArgs& args) const = 0;
};

using TopKWeightAndReducePtr = std::shared_ptr<const TopKWeightAndReduce>;

}  // namespace modmoe
