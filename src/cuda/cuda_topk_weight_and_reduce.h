// CUDA implementations of the TopKWeightAndReduce kinds (the CPU ones are in
// src/cpu/topk_weight_and_reduce.h; same semantics, tensors on ctx.device, launches on
// ctx.stream, no host synchronization). Deterministic: fp32 sums in fixed k order.
#pragma once

#include "modmoe/topk_weight_and_reduce.h"

namespace modmoe::cuda {

// Copies (converting the dtype if needed) fused_expert_output (M, K) into output unless they
// are the same memory.
class TopKWeightAndReduceNoOp final : public TopKWeightAndReduce {
 public:
  WeightAndReduceKind kind() const override { return WeightAndReduceKind::NoOp; }
  void apply(const Context& ctx, const ReduceArgs& args) const override;
};

// output[t] = sum_k w[t, k] * fused[t, k]   with fused (M, topk, K); pairs whose expert is not
// local (expert_map) are skipped.
class TopKWeightAndReduceContiguous final : public TopKWeightAndReduce {
 public:
  WeightAndReduceKind kind() const override { return WeightAndReduceKind::Contiguous; }
  void apply(const Context& ctx, const ReduceArgs& args) const override;
};

// output[t] = sum_k w[t, k] * fused[e, slot(t, k)]   with fused (E_local, max_tokens, K) and
// slot(t, k) the rank of pair (t, k) among the pairs routed to local expert e, in token order —
// recomputed from topk_ids on the device (a stable sort, cuda/permute.h) into a small
// temporary from ctx.alloc().
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

}  // namespace modmoe::cuda
