// CPU implementations of the four TopKWeightAndReduce kinds.
#pragma once

#include "modmoe/topk_weight_and_reduce.h"

namespace modmoe::cpu {

// Copies fused_expert_output into output unless they are the same memory.
class TopKWeightAndReduceNoOp final : public TopKWeightAndReduce {
 public:
  WeightAndReduceKind kind() const override { return WeightAndReduceKind::NoOp; }
  void apply(const Context& ctx, const ReduceArgs& args) const override;
};

// output[t] = sum_k w[t, k] * fused[t, k]   with fused (M, topk, K).
class TopKWeightAndReduceContiguous final : public TopKWeightAndReduce {
 public:
  WeightAndReduceKind kind() const override { return WeightAndReduceKind::Contiguous; }
  void apply(const Context& ctx, const ReduceArgs& args) const override;
};

// output[t] = sum_k w[t, k] * fused[e, slot(t, k)]   with fused (E_local, max_tokens, K), where
// slot(t, k) is the rank of token t among the tokens routed to local expert e, in token order
// (the order BatchedPrepareAndFinalize scatters them in).
class TopKWeightAndReduceNaiveBatched final : public TopKWeightAndReduce {
 public:
  WeightAndReduceKind kind() const override { return WeightAndReduceKind::NaiveBatched; }
  void apply(const Context& ctx, const ReduceArgs& args) const override;
};

// "The finalize decides": never applied itself.
class TopKWeightAndReduceDelegate final : public TopKWeightAndReduce {
 public:
  WeightAndReduceKind kind() const override { return WeightAndReduceKind::Delegate; }
  void apply(const Context& ctx, const ReduceArgs& args) const override;
};

// The local expert of global id `id`: expert_map[id] (may be -1), or id itself without a map.
inline int64_t local_expert(const int32_t* expert_map, int64_t id) {
  return expert_map ? expert_map[id] : id;
}

}  // namespace modmoe::cpu
