#include <cuda_runtime.h>

#include "core/validate.h"
#include "cuda/batched.h"
#include "cuda/byte_carver.h"
#include "cuda/cuda_topk_weight_and_reduce.h"
#include "cuda/device_guard.h"
#include "cuda/permute.h"
#include "cuda/reduce.h"
#include "modmoe/allocator.h"

namespace modmoe::cuda {

namespace {

struct ReduceShape {
  int64_t M, topk, K;
};

// The checks every reduce shares (the CPU ones, with tensors on ctx.device).
ReduceShape check_common(const char* fn, const Context& ctx, const ReduceArgs& a) {
  check_context_device(fn, ctx, DeviceType::cuda);
  MODMOE_CHECK(a.output.defined() && a.output.ndim() == 2)
      << fn << ": output must be 2-D (M, K), got " << a.output.describe();
  const int64_t M = a.output.size(0), K = a.output.size(1);
  MODMOE_CHECK(a.topk_ids.defined() && a.topk_ids.ndim() == 2 && a.topk_ids.size(0) == M)
      << fn << ": topk_ids must be (M, topk) with M = " << M << ", got " << a.topk_ids.describe();
  const int64_t topk = a.topk_ids.size(1);
  check_tensor(fn, "output", a.output, {DType::bf16, DType::fp16, DType::fp32}, {M, K}, "(M, K)",
               ctx.device);
  check_tensor(fn, "topk_ids", a.topk_ids, {DType::int32, DType::int64}, {M, topk}, "(M, topk)",
               ctx.device);
  if (!a.apply_router_weight_on_input)
    check_tensor(fn, "topk_weights", a.topk_weights, {DType::fp32}, {M, topk}, "(M, topk)",
                 ctx.device);
  if (a.expert_map.defined()) {
    MODMOE_CHECK(a.expert_map.ndim() == 1)
        << fn << ": expert_map must be int32 (E), got " << a.expert_map.describe();
    check_tensor(fn, "expert_map", a.expert_map, {DType::int32}, {a.expert_map.size(0)}, "(E)",
                 ctx.device);
  }
  MODMOE_CHECK(!a.output.overlaps(a.fused_expert_output))
      << fn << ": output must not overlap fused_expert_output, got output " << a.output.describe()
      << " and fused_expert_output " << a.fused_expert_output.describe();
  return {M, topk, K};
}

WeightedReduceArgs base_args(const ReduceArgs& a, const ReduceShape& s) {
  WeightedReduceArgs w;
  w.src = a.fused_expert_output.data();
  w.src_dtype = a.fused_expert_output.dtype();
  w.src_ld = s.K;
  w.topk_ids = a.topk_ids.data();
  w.ids_dtype = a.topk_ids.dtype();
  w.topk_weights = a.apply_router_weight_on_input ? nullptr : a.topk_weights.data_ptr<float>();
  w.M = s.M;
  w.topk = s.topk;
  w.K = s.K;
  w.out = a.output.data();
  w.out_dtype = a.output.dtype();
  w.out_ld = s.K;
  return w;
}

}  // namespace

void TopKWeightAndReduceNoOp::apply(const Context& ctx, const ReduceArgs& a) const {
  static constexpr const char* kFn = "cuda::TopKWeightAndReduceNoOp";
  check_context_device(kFn, ctx, DeviceType::cuda);
  if (a.output.data() == a.fused_expert_output.data()) return;
  MODMOE_CHECK(a.output.defined() && a.output.ndim() == 2)
      << kFn << ": output must be 2-D (M, K), got " << a.output.describe();
  const int64_t M = a.output.size(0), K = a.output.size(1);
  check_tensor(kFn, "output", a.output, {DType::bf16, DType::fp16, DType::fp32}, {M, K}, "(M, K)",
               ctx.device);
  check_tensor(kFn, "fused_expert_output (the reduced output)", a.fused_expert_output,
               {DType::bf16, DType::fp16, DType::fp32}, {M, K}, "(M, K)", ctx.device);
  MODMOE_CHECK(!a.output.overlaps(a.fused_expert_output))
      << kFn << ": output must be fused_expert_output itself or not overlap it";
  DeviceGuard guard(ctx.device.index);
  // A one-term "reduce" with weight 1: a dtype-converting row copy.
  WeightedReduceArgs w;
  w.src = a.fused_expert_output.data();
  w.src_dtype = a.fused_expert_output.dtype();
  w.src_ld = K;
  w.M = M;
  w.topk = 1;
  w.K = K;
  w.out = a.output.data();
  w.out_dtype = a.output.dtype();
  w.out_ld = K;
  weighted_reduce(w, static_cast<cudaStream_t>(ctx.stream));
}

void TopKWeightAndReduceContiguous::apply(const Context& ctx, const ReduceArgs& a) const {
  static constexpr const char* kFn = "cuda::TopKWeightAndReduceContiguous";
  const ReduceShape s = check_common(kFn, ctx, a);
  check_tensor(kFn, "fused_expert_output", a.fused_expert_output,
               {DType::bf16, DType::fp16, DType::fp32}, {s.M, s.topk, s.K}, "(M, topk, K)",
               ctx.device);
  DeviceGuard guard(ctx.device.index);
  WeightedReduceArgs w = base_args(a, s);
  if (a.expert_map.defined()) {
    w.expert_map = a.expert_map.data_ptr<int32_t>();
    w.num_experts = a.expert_map.size(0);
  }
  weighted_reduce(w, static_cast<cudaStream_t>(ctx.stream));
}

void TopKWeightAndReduceNaiveBatched::apply(const Context& ctx, const ReduceArgs& a) const {
  static constexpr const char* kFn = "cuda::TopKWeightAndReduceNaiveBatched";
  const ReduceShape s = check_common(kFn, ctx, a);
  const Tensor& f = a.fused_expert_output;
  MODMOE_CHECK(f.defined() && f.ndim() == 3 && f.size(2) == s.K)
      << kFn << ": fused_expert_output must be (E_local, max_tokens, K) with K = " << s.K
      << ", got " << f.describe();
  const int64_t E_local = f.size(0), T = f.size(1);
  check_tensor(kFn, "fused_expert_output", f, {DType::bf16, DType::fp16, DType::fp32},
               {E_local, T, s.K}, "(E_local, max_tokens, K)", ctx.device);
  MODMOE_CHECK(E_local >= 1) << kFn << ": fused_expert_output must hold >= 1 expert, got "
                             << f.describe();
  if (s.M == 0) return;
  DeviceGuard guard(ctx.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);

  // The slots, recomputed on the device: permute (stable by pair) -> rank within the expert.
  const int64_t num_pairs = s.M * s.topk;
  const int64_t num_experts = a.expert_map.defined() ? a.expert_map.size(0) : E_local;
  ByteCarver sizing(nullptr);
  PermuteWorkspace::carve(sizing, num_pairs, E_local);
  sizing.take<int32_t>(num_pairs);
  OwnedTensor scratch(ctx.alloc(), DType::uint8, {static_cast<int64_t>(sizing.size())}, ctx.stream);
  ByteCarver carver(scratch.tensor().data());
  const PermuteWorkspace perm = PermuteWorkspace::carve(carver, num_pairs, E_local);
  int32_t* batched_row = carver.take<int32_t>(num_pairs);

  PermuteArgs p;
  p.topk_ids = a.topk_ids.data();
  p.ids_dtype = a.topk_ids.dtype();
  p.num_tokens = s.M;
  p.topk = s.topk;
  p.expert_map = a.expert_map.defined() ? a.expert_map.data_ptr<int32_t>() : nullptr;
  p.num_experts = num_experts;
  p.num_local_experts = E_local;
  permute(p, perm, stream);
  batched_slots(perm, T, batched_row, nullptr, stream);

  WeightedReduceArgs w = base_args(a, s);
  w.pair_row = batched_row;
  weighted_reduce(w, stream);
  // `scratch` goes back to the pool stream-ordered (after the reduce), when it leaves scope.
}

void TopKWeightAndReduceDelegate::apply(const Context&, const ReduceArgs&) const {
  MODMOE_FAIL() << "cuda::TopKWeightAndReduceDelegate: cannot be applied; the PrepareAndFinalize "
                   "must replace it with the implementation that fits its activation format";
}

}  // namespace modmoe::cuda
