// Routing on the device (raw pointers + stream): softmax top-k and DeepSeek-V3 grouped top-k,
// one warp per token, with exactly the semantics of the CPU router (src/cpu/router.cpp):
//
//   ranking     descending key, ties to the lower expert (group) index; a NaN key ranks as
//               -inf; -0 and +0 tie. Softmax top-k ranks by the *logit* (the CPU's choice: it
//               orders as the probability does, and is bit-identical on every backend).
//   grouped     key = score (+ correction_bias); a group's key is the sum of its two best keys
//               (its only key when a group has one expert); the best topk_groups groups are
//               kept, and the top-k keys among their experts chosen.
//   weights     softmax: exp(x - max) / sum; renormalized: / the sum of the chosen ones, added
//               in rank order. grouped: the unbiased scores of the chosen experts, times
//               routed_scaling_factor (divided by their rank-order sum when renormalizing).
//   outputs     slot k of a row holds the k-th best expert.
//
// The arithmetic is the CPU's operation for operation, with exp evaluated in double and
// rounded to fp32 (correctly rounded but for ~2^-29 of inputs, as glibc's expf is to within
// 0.502 ulp), so ids match the CPU and weights match it to the last bit but in rare cases.
// Never synchronizes; graph-capturable.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "modmoe/dtype.h"
#include "modmoe/router.h"

namespace modmoe::cuda {

constexpr int64_t kRouterMaxExperts = 512;  // experts live in registers, 16 per lane
constexpr int64_t kRouterMaxTopK = 32;      // lane k holds the k-th choice

// Router logits: rows x num_experts bf16/fp16/fp32 at any element strides.
struct RouterLogits {
  const void* data = nullptr;
  DType dtype = DType::fp32;
  int64_t rows = 0, num_experts = 0;
  int64_t row_stride = 0, col_stride = 1;
};

// topk_weights fp32 and topk_ids int32/int64, rows at any stride, the topk columns contiguous.
struct RouterOutput {
  float* weights = nullptr;
  int64_t weights_row_stride = 0;
  void* ids = nullptr;
  DType ids_dtype = DType::int32;
  int64_t ids_row_stride = 0;
};

// Softmax over the logits then the top-k (router.h softmax_topk).
void softmax_topk_rows(const RouterLogits& logits, int64_t topk, bool renormalize,
                       const RouterOutput& out, cudaStream_t stream);

// Grouped top-k (router.h grouped_topk); correction_bias: fp32 (num_experts) or nullptr.
void grouped_topk_rows(const RouterLogits& logits, const float* correction_bias, int64_t topk,
                       const GroupedTopKParams& params, const RouterOutput& out,
                       cudaStream_t stream);

}  // namespace modmoe::cuda
