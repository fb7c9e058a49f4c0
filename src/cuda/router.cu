// Routing on the device (src/cuda/router.h) and the CUDA versions of the public softmax_topk /
// grouped_topk (src/cuda/ops.h).
//
// One warp per token. Lane l holds experts l, l + 32, ... (16 register slots cover E <= 512).
// Selection is k rounds of a warp-wide max over 64-bit candidates (ordered key bits << 32 |
// ~index), whose order is exactly the CPU's: higher key first, then lower index. Values that
// must be added in the CPU's order (softmax denominators, the sum of the chosen weights) are
// added in that order, so weights come out bit-identical to the CPU's.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/op_checks.h"
#include "cuda/cuda_check.h"
#include "cuda/device_guard.h"
#include "cuda/ops.h"
#include "cuda/router.h"
#include "modmoe/error.h"

namespace modmoe::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarpsPerBlock * 32;
constexpr int kSlots = static_cast<int>(kRouterMaxExperts / 32);
constexpr unsigned kFullMask = 0xffffffffu;
constexpr uint64_t kNoCandidate = 0;  // below every real candidate (whose high half is > 0)

struct RouterArgs {
  RouterLogits logits;
  RouterOutput out;
  int topk;
  bool renormalize;
  // grouped_topk only
  const float* bias;
  int num_groups, topk_groups;
  bool sigmoid;
  float routed_scaling_factor;
};

// ---- the CPU's arithmetic ---------------------------------------------------------------------

__device__ __forceinline__ float load_logit(const RouterLogits& logits, int64_t row, int expert) {
  const int64_t offset = row * logits.row_stride + expert * logits.col_stride;
  switch (logits.dtype) {
    case DType::bf16:
      return __uint_as_float(uint32_t{static_cast<const uint16_t*>(logits.data)[offset]} << 16);
    case DType::fp16:
      return __half2float(__ushort_as_half(static_cast<const uint16_t*>(logits.data)[offset]));
    default:  // fp32 (validated on the host)
      return static_cast<const float*>(logits.data)[offset];
  }
}

// exp evaluated in double and rounded once to fp32: the correctly rounded value but for
// ~2^-29 of inputs, which is what glibc's expf returns but for rare near-halfway inputs. A
// float expf (2 ulp) would differ from the CPU often enough to flip near-tied rankings.
__device__ __forceinline__ float exp_f32(float x) {
  return __double2float_rn(exp(static_cast<double>(x)));
}

// The CPU's rank_key (NaN ranks as -inf), with -0 made +0: the two compare equal on the CPU,
// so they must have equal bits here.
__device__ __forceinline__ float rank_key(float score) {
  if (isnan(score)) return -INFINITY;
  return score == 0.0f ? 0.0f : score;
}

// ---- candidates: one 64-bit number orders (key desc, index asc) ---------------------------------

__device__ __forceinline__ uint64_t make_candidate(float key, int index) {
  const uint32_t bits = __float_as_uint(key);
  // Flip negatives entirely and set the sign bit of positives: unsigned order == float order.
  const uint32_t ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (uint64_t{ordered} << 32) | (0xffffffffu - static_cast<uint32_t>(index));
}

__device__ __forceinline__ int candidate_index(uint64_t candidate) {
  return static_cast<int>(0xffffffffu - static_cast<uint32_t>(candidate));
}

__device__ __forceinline__ uint64_t warp_max(uint64_t v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const uint64_t other = __shfl_xor_sync(kFullMask, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

// Removes the best candidate of the warp and returns its index (the same in every lane).
// Candidates are unique (the index is part of them), so exactly one slot is cleared.
__device__ __forceinline__ int take_best(uint64_t (&candidates)[kSlots]) {
  uint64_t best = kNoCandidate;
#pragma unroll
  for (int i = 0; i < kSlots; ++i) best = candidates[i] > best ? candidates[i] : best;
  best = warp_max(best);
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    if (candidates[i] == best) candidates[i] = kNoCandidate;
  }
  return candidate_index(best);
}

// values[0] + values[1] + ... in index order, as the CPU adds them; lane 0 adds, every lane
// gets the sum. The caller has made `values` visible to lane 0 (__syncwarp).
__device__ __forceinline__ float ordered_sum(const float* values, int n, int lane) {
  float sum = 0.0f;
  if (lane == 0) {
    for (int i = 0; i < n; ++i) sum = __fadd_rn(sum, values[i]);
  }
  return __shfl_sync(kFullMask, sum, 0);
}

// The sum of lane k's value for k < count, in k order (the chosen experts in rank order).
__device__ __forceinline__ float rank_order_sum(float value, int count) {
  float sum = 0.0f;
  for (int k = 0; k < count; ++k) sum = __fadd_rn(sum, __shfl_sync(kFullMask, value, k));
  return sum;
}

__device__ __forceinline__ void write_choice(const RouterOutput& out, int64_t row, int slot,
                                             int expert, float weight) {
  out.weights[row * out.weights_row_stride + slot] = weight;
  const int64_t id_offset = row * out.ids_row_stride + slot;
  if (out.ids_dtype == DType::int64) {
    static_cast<int64_t*>(out.ids)[id_offset] = expert;
  } else {
    static_cast<int32_t*>(out.ids)[id_offset] = expert;
  }
}

// Loads the row's logits into the lane's slots; returns their max, NaN skipped (the CPU's
// std::max loop skips a NaN too), -inf when there is none.
__device__ __forceinline__ float load_row(const RouterLogits& logits, int64_t row, int lane,
                                          float (&logit)[kSlots]) {
  const int E = static_cast<int>(logits.num_experts);
  float max_logit = -INFINITY;
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int e = i * 32 + lane;
    logit[i] = e < E ? load_logit(logits, row, e) : -INFINITY;
    if (e < E) max_logit = fmaxf(max_logit, logit[i]);
  }
  return warp_max(max_logit);
}

// ---- softmax top-k ------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) softmax_topk_kernel(RouterArgs a) {
  __shared__ float numerators[kWarpsPerBlock][kRouterMaxExperts];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t row = int64_t{blockIdx.x} * kWarpsPerBlock + warp;
  if (row >= a.logits.rows) return;  // the whole warp: it shares the row
  const int E = static_cast<int>(a.logits.num_experts);
  float* numerator = numerators[warp];

  float logit[kSlots];
  const float max_logit = load_row(a.logits, row, lane, logit);
  uint64_t candidates[kSlots];
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int e = i * 32 + lane;
    // Ranked by the logit itself, as on the CPU.
    candidates[i] = e < E ? make_candidate(rank_key(logit[i]), e) : kNoCandidate;
    if (e < E) numerator[e] = exp_f32(__fsub_rn(logit[i], max_logit));
  }
  __syncwarp();
  const float full_sum = a.renormalize ? 0.0f : ordered_sum(numerator, E, lane);

  int chosen = 0;
  float chosen_numerator = 0.0f;
  for (int k = 0; k < a.topk; ++k) {
    const int e = take_best(candidates);
    if (lane == k) {
      chosen = e;
      chosen_numerator = numerator[e];
    }
  }
  // Renormalized, p_k / sum(p_chosen) = exp_k / sum(exp_chosen): one division, as on the CPU.
  const float denominator = a.renormalize ? rank_order_sum(chosen_numerator, a.topk) : full_sum;
  if (lane < a.topk) {
    write_choice(a.out, row, lane, chosen, __fdiv_rn(chosen_numerator, denominator));
  }
}

// ---- grouped top-k ------------------------------------------------------------------------------

struct GroupedScratch {
  float score[kRouterMaxExperts];   // unbiased scores: the weights
  float key[kRouterMaxExperts];     // biased, rank_key'd scores: the selection
  uint8_t kept[kRouterMaxExperts];  // per group: among the topk_groups best
};

// The sum of the two largest values of group[0, n) (n >= 2) in the CPU's loop order.
__device__ __forceinline__ float best_two_sum_serial(const float* group, int n) {
  float best = group[0], second = -INFINITY;
  for (int i = 1; i < n; ++i) {
    const float v = group[i];
    if (v > best) {
      second = best;
      best = v;
    } else if (v > second) {
      second = v;
    }
  }
  return __fadd_rn(best, second);
}

// The same sum with the whole warp over one group (n > 32): each lane takes the best two of
// its share, then pairs merge by shuffles. The two largest of a multiset do not depend on
// the order of the walk, so the sum is the CPU's. Keys hold no NaN.
__device__ __forceinline__ float best_two_sum_warp(const float* group, int n, int lane) {
  float best = -INFINITY, second = -INFINITY;
  for (int i = lane; i < n; i += 32) {
    const float v = group[i];
    if (v > best) {
      second = best;
      best = v;
    } else if (v > second) {
      second = v;
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other_best = __shfl_xor_sync(kFullMask, best, offset);
    const float other_second = __shfl_xor_sync(kFullMask, second, offset);
    second = fmaxf(fminf(best, other_best), fmaxf(second, other_second));
    best = fmaxf(best, other_best);
  }
  return __fadd_rn(best, second);
}

__global__ void __launch_bounds__(kThreads) grouped_topk_kernel(RouterArgs a) {
  __shared__ GroupedScratch scratch_of_warp[kWarpsPerBlock];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t row = int64_t{blockIdx.x} * kWarpsPerBlock + warp;
  if (row >= a.logits.rows) return;  // the whole warp: it shares the row
  GroupedScratch& scratch = scratch_of_warp[warp];
  const int E = static_cast<int>(a.logits.num_experts);
  const int G = a.num_groups, group_size = E / G;

  // Scores.
  float logit[kSlots];
  const float max_logit = load_row(a.logits, row, lane, logit);
  if (a.sigmoid) {
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int e = i * 32 + lane;
      if (e < E) scratch.score[e] = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_f32(-logit[i])));
    }
  } else {
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int e = i * 32 + lane;
      if (e < E) scratch.score[e] = exp_f32(__fsub_rn(logit[i], max_logit));
    }
    __syncwarp();
    const float sum = ordered_sum(scratch.score, E, lane);
    __syncwarp();  // lane 0 has read every numerator before they are overwritten
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int e = i * 32 + lane;
      if (e < E) scratch.score[e] = __fdiv_rn(scratch.score[e], sum);
    }
  }

  // Selection keys: the biased scores.
  uint64_t candidates[kSlots];
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int e = i * 32 + lane;
    candidates[i] = kNoCandidate;
    if (e < E) {
      const float s = scratch.score[e];
      const float key = rank_key(a.bias ? __fadd_rn(s, a.bias[e]) : s);
      scratch.key[e] = key;
      candidates[i] = make_candidate(key, e);
    }
  }
  __syncwarp();

  // Group keys: group g in slot g / 32 of lane g % 32.
  uint64_t group_candidates[kSlots];
#pragma unroll
  for (int i = 0; i < kSlots; ++i) group_candidates[i] = kNoCandidate;
  if (group_size <= 32) {
    // Small groups: a lane walks each of its groups as the CPU does.
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int g = i * 32 + lane;
      if (g < G) {
        const float* group = scratch.key + g * group_size;
        const float group_key = group_size == 1 ? group[0] : best_two_sum_serial(group, group_size);
        group_candidates[i] = make_candidate(rank_key(group_key), g);
      }
    }
  } else {
    // Large groups (fewer than 16 of them): the warp takes one group at a time.
    for (int g = 0; g < G; ++g) {
      const float group_key = best_two_sum_warp(scratch.key + g * group_size, group_size, lane);
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        if (g == i * 32 + lane) group_candidates[i] = make_candidate(rank_key(group_key), g);
      }
    }
  }

  // Keep the best topk_groups groups, then drop the experts of the others.
  for (int g = lane; g < G; g += 32) scratch.kept[g] = 0;
  __syncwarp();
  for (int t = 0; t < a.topk_groups; ++t) {
    const int g = take_best(group_candidates);
    if (lane == 0) scratch.kept[g] = 1;
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int e = i * 32 + lane;
    if (e < E && !scratch.kept[e / group_size]) candidates[i] = kNoCandidate;
  }

  int chosen = 0;
  float chosen_score = 0.0f;
  for (int k = 0; k < a.topk; ++k) {
    const int e = take_best(candidates);
    if (lane == k) {
      chosen = e;
      chosen_score = scratch.score[e];
    }
  }
  // The bias only steers the choice; the weights are the unbiased scores.
  const float scale = a.renormalize
                          ? __fdiv_rn(a.routed_scaling_factor, rank_order_sum(chosen_score, a.topk))
                          : a.routed_scaling_factor;
  if (lane < a.topk) write_choice(a.out, row, lane, chosen, __fmul_rn(chosen_score, scale));
}

// ---- host side ----------------------------------------------------------------------------------

void check_router_arguments(const char* fn, const RouterLogits& logits, int64_t topk,
                            const RouterOutput& out) {
  const DType d = logits.dtype;
  MODMOE_CHECK(d == DType::bf16 || d == DType::fp16 || d == DType::fp32)
      << fn << ": logits must be bf16, fp16 or fp32, got " << dtype_name(d);
  MODMOE_CHECK(logits.rows >= 0) << fn << ": rows must be >= 0, got " << logits.rows;
  MODMOE_CHECK(logits.num_experts >= 1 && logits.num_experts <= kRouterMaxExperts)
      << fn << ": the CUDA router supports 1 <= E <= " << kRouterMaxExperts << ", got "
      << logits.num_experts;
  MODMOE_CHECK(topk >= 1 && topk <= logits.num_experts && topk <= kRouterMaxTopK)
      << fn << ": topk must be in [1, min(E=" << logits.num_experts << ", " << kRouterMaxTopK
      << ")] on the CUDA router, got " << topk;
  MODMOE_CHECK(is_index_dtype(out.ids_dtype))
      << fn << ": ids must be int32 or int64, got " << dtype_name(out.ids_dtype);
  MODMOE_CHECK(logits.rows == 0 || (logits.data && out.weights && out.ids))
      << fn << ": logits, weights and ids must not be null";
}

RouterArgs make_args(const RouterLogits& logits, int64_t topk, bool renormalize,
                     const RouterOutput& out) {
  RouterArgs a{};
  a.logits = logits;
  a.out = out;
  a.topk = static_cast<int>(topk);
  a.renormalize = renormalize;
  a.bias = nullptr;
  a.num_groups = 1;
  a.topk_groups = 1;
  a.sigmoid = false;
  a.routed_scaling_factor = 1.0f;
  return a;
}

unsigned blocks_for(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void softmax_topk_rows(const RouterLogits& logits, int64_t topk, bool renormalize,
                       const RouterOutput& out, cudaStream_t stream) {
  check_router_arguments("cuda::softmax_topk_rows", logits, topk, out);
  if (logits.rows == 0) return;
  softmax_topk_kernel<<<blocks_for(logits.rows), kThreads, 0, stream>>>(
      make_args(logits, topk, renormalize, out));
  MODMOE_CUDA_CHECK_LAUNCH();
}

void grouped_topk_rows(const RouterLogits& logits, const float* correction_bias, int64_t topk,
                       const GroupedTopKParams& params, const RouterOutput& out,
                       cudaStream_t stream) {
  constexpr const char* fn = "cuda::grouped_topk_rows";
  check_router_arguments(fn, logits, topk, out);
  const int64_t E = logits.num_experts, G = params.num_groups;
  MODMOE_CHECK(G >= 1 && E % G == 0)
      << fn << ": num_groups must be >= 1 and divide E = " << E << ", got " << G;
  MODMOE_CHECK(params.topk_groups >= 1 && params.topk_groups <= G)
      << fn << ": topk_groups must be in [1, num_groups=" << G << "], got " << params.topk_groups;
  MODMOE_CHECK(topk <= params.topk_groups * (E / G))
      << fn << ": topk must be <= topk_groups * E / num_groups = " << params.topk_groups * (E / G)
      << ", got " << topk;
  MODMOE_CHECK(params.scoring == ScoringFunc::sigmoid || params.scoring == ScoringFunc::softmax)
      << fn << ": scoring must be sigmoid or softmax, got " << static_cast<int>(params.scoring);
  if (logits.rows == 0) return;
  RouterArgs a = make_args(logits, topk, params.renormalize, out);
  a.bias = correction_bias;
  a.num_groups = static_cast<int>(G);
  a.topk_groups = static_cast<int>(params.topk_groups);
  a.sigmoid = params.scoring == ScoringFunc::sigmoid;
  a.routed_scaling_factor = params.routed_scaling_factor;
  grouped_topk_kernel<<<blocks_for(logits.rows), kThreads, 0, stream>>>(a);
  MODMOE_CUDA_CHECK_LAUNCH();
}

// ---- tensor entry points (ops.h): the shared checks of core/op_checks.h, on ctx.device ------

namespace {

void check_context(const char* fn, const Context& ctx) {
  MODMOE_CHECK(ctx.device.is_cuda())
      << fn << ": ctx.device must be cuda (the CUDA router), got " << ctx.device.str();
}

// The CUDA router's own limits, on top of the shared checks of core/op_checks.h.
void check_cuda_num_experts(const char* fn, const Tensor& logits) {
  MODMOE_CHECK(logits.size(1) <= kRouterMaxExperts)
      << fn << ": the CUDA router supports E <= " << kRouterMaxExperts << " experts, got "
      << logits.describe();
}

void check_cuda_topk(const char* fn, int64_t topk) {
  MODMOE_CHECK(topk <= kRouterMaxTopK)
      << fn << ": the CUDA router supports topk <= " << kRouterMaxTopK << ", got " << topk;
}

RouterLogits logits_view(const Tensor& t) {
  RouterLogits v;
  v.data = t.data();
  v.dtype = t.dtype();
  v.rows = t.size(0);
  v.num_experts = t.size(1);
  v.row_stride = t.stride(0);
  v.col_stride = t.stride(1);
  return v;
}

RouterOutput output_view(const Tensor& weights, const Tensor& ids) {
  RouterOutput v;
  v.weights = weights.data_ptr<float>();
  v.weights_row_stride = weights.stride(0);
  v.ids = ids.data();
  v.ids_dtype = ids.dtype();
  v.ids_row_stride = ids.stride(0);
  return v;
}

}  // namespace

void softmax_topk(const Context& ctx, const Tensor& logits, int64_t topk, bool renormalize,
                  const Tensor& topk_weights, const Tensor& topk_ids) {
  constexpr const char* fn = "softmax_topk";
  check_context(fn, ctx);
  check_router_logits(fn, logits, ctx.device);
  check_cuda_num_experts(fn, logits);
  check_router_topk(fn, topk, logits.size(1));
  check_cuda_topk(fn, topk);
  check_router_outputs(fn, logits, topk, topk_weights, topk_ids, ctx.device);
  if (logits.size(0) == 0) return;
  DeviceGuard guard(ctx.device.index);
  softmax_topk_rows(logits_view(logits), topk, renormalize, output_view(topk_weights, topk_ids),
                    static_cast<cudaStream_t>(ctx.stream));
}

void grouped_topk(const Context& ctx, const Tensor& logits, const Tensor& correction_bias,
                  int64_t topk, const GroupedTopKParams& params, const Tensor& topk_weights,
                  const Tensor& topk_ids) {
  constexpr const char* fn = "grouped_topk";
  check_context(fn, ctx);
  check_router_logits(fn, logits, ctx.device);
  check_cuda_num_experts(fn, logits);
  const int64_t E = logits.size(1);
  check_grouped_topk_groups(fn, E, topk, params);
  check_cuda_topk(fn, topk);
  check_grouped_topk_scoring(fn, params, correction_bias, E, ctx.device);
  check_grouped_topk_outputs(fn, logits, correction_bias, topk, topk_weights, topk_ids, ctx.device);
  if (logits.size(0) == 0) return;
  const float* bias = correction_bias.defined() ? correction_bias.data_ptr<float>() : nullptr;
  DeviceGuard guard(ctx.device.index);
  grouped_topk_rows(logits_view(logits), bias, topk, params, output_view(topk_weights, topk_ids),
                    static_cast<cudaStream_t>(ctx.stream));
}

}  // namespace modmoe::cuda
