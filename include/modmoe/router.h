// Routing: router logits (M, E) -> topk_weights (M, topk) fp32 and topk_ids (M, topk).
//
// Ties are broken towards the lower expert index, so every backend selects the same experts.
#pragma once

#include "modmoe/context.h"
#include "modmoe/tensor.h"

namespace modmoe {

enum class ScoringFunc : uint8_t { softmax, sigmoid };

// Softmax over the E logits, then the top-k; with `renormalize` the k weights are divided by
// their sum (= softmax over the top-k logits, gpt-oss / Qwen / Mixtral routing).
// logits: bf16/fp16/fp32 (M, E); topk_weights: fp32 (M, topk); topk_ids: int32/int64 (M, topk).
void softmax_topk(const Context& ctx, const Tensor& logits, int64_t topk, bool renormalize,
                  const Tensor& topk_weights, const Tensor& topk_ids);

struct GroupedTopKParams {
  int64_t num_groups = 1;         // experts split into this many equal groups
  int64_t topk_groups = 1;        // groups kept
  ScoringFunc scoring = ScoringFunc::sigmoid;
  bool renormalize = true;
  float routed_scaling_factor = 1.0f;
};

// DeepSeek-V3 routing. s = score(logits); selection uses s + correction_bias (bias may be
// undefined): a group's score is the sum of its two best biased scores, the best
// `topk_groups` groups are kept, and the top-k biased scores among their experts are chosen.
// The weights are the *unbiased* s of the chosen experts, renormalized if asked, times
// routed_scaling_factor.
void grouped_topk(const Context& ctx, const Tensor& logits, const Tensor& correction_bias,
                  int64_t topk, const GroupedTopKParams& params, const Tensor& topk_weights,
                  const Tensor& topk_ids);

}  // namespace modmoe
