// CPU routing (router.h): softmax top-k and DeepSeek-V3 grouped top-k, OpenMP over tokens.
//
// Ranking rule, shared by every backend: descending selection score, ties go to the lower
// expert (or group) index. A NaN score ranks as -inf, so even a bad row gets a defined,
// duplicate-free selection; its weights come out NaN, which the caller can see.
// All arithmetic is fp32 whatever the logits' dtype.
#include "cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/op_checks.h"
#include "modmoe/error.h"
#include "modmoe/numeric.h"

namespace modmoe {
namespace cpu {
namespace {

float rank_key(float score) { return std::isnan(score) ? -INFINITY : score; }

// A strict total order on indices (no two indices are equal), so std::partial_sort gives one
// answer whatever the order of its input.
struct RanksBefore {
  const float* key;
  bool operator()(int32_t a, int32_t b) const {
    return key[a] > key[b] || (key[a] == key[b] && a < b);
  }
};

// Moves the best `k` of candidates[0, count) to the front, best first.
void select_best(const float* key, int32_t* candidates, int64_t count, int64_t k) {
  std::partial_sort(candidates, candidates + k, candidates + count, RanksBefore{key});
}

template <typename Raw, typename Convert>
void convert_row(const Raw* src, int64_t n, int64_t stride, Convert convert, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = convert(src[i * stride]);
}

// The logits: a 2-D bf16/fp16/fp32 view with any strides, read one row at a time as fp32.
struct LogitRows {
  const void* data;
  DType dtype;
  int64_t num_experts, row_stride, col_stride;

  explicit LogitRows(const Tensor& t)
      : data(t.data()),
        dtype(t.dtype()),
        num_experts(t.size(1)),
        row_stride(t.stride(0)),
        col_stride(t.stride(1)) {}

  void load(int64_t row, float* out) const {
    const int64_t offset = row * row_stride;
    switch (dtype) {
      case DType::bf16:
        convert_row(static_cast<const uint16_t*>(data) + offset, num_experts, col_stride,
                    bf16_to_float, out);
        break;
      case DType::fp16:
        convert_row(static_cast<const uint16_t*>(data) + offset, num_experts, col_stride,
                    fp16_to_float, out);
        break;
      default:  // fp32; the entry points admit nothing else
        convert_row(
            static_cast<const float*>(data) + offset, num_experts, col_stride,
            [](float v) { return v; }, out);
        break;
    }
  }
};

// topk_weights (fp32) and topk_ids (int32/int64), rows at any stride, columns contiguous.
struct RoutingOutput {
  float* weights;
  int64_t weight_row_stride;
  void* ids;
  bool ids_are_int64;
  int64_t id_row_stride;

  RoutingOutput(const Tensor& topk_weights, const Tensor& topk_ids)
      : weights(topk_weights.data_ptr<float>()),
        weight_row_stride(topk_weights.stride(0)),
        ids(topk_ids.data()),
        ids_are_int64(topk_ids.dtype() == DType::int64),
        id_row_stride(topk_ids.stride(0)) {}

  void write(int64_t row, int64_t slot, int32_t expert, float weight) const {
    weights[row * weight_row_stride + slot] = weight;
    if (ids_are_int64) {
      static_cast<int64_t*>(ids)[row * id_row_stride + slot] = expert;
    } else {
      static_cast<int32_t*>(ids)[row * id_row_stride + slot] = expert;
    }
  }
};

// Writes exp(x - max) into `out` and returns its sum (the numerically safe softmax).
float exp_shifted(const float* x, int64_t n, float* out) {
  float max_x = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max_x = std::max(max_x, x[i]);  // a NaN x is skipped here
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = std::exp(x[i] - max_x);
    sum += out[i];
  }
  return sum;
}

// Threads only pay off when there is more than a handful of work.
bool worth_threads(int64_t rows, int64_t num_experts) {
  return rows > 1 && rows * num_experts >= 4096;
}

void softmax_topk_rows(const LogitRows& logits, int64_t num_tokens, int64_t topk, bool renormalize,
                       const RoutingOutput& out) {
  const int64_t E = logits.num_experts;
#pragma omp parallel if (worth_threads(num_tokens, E))
  {
    std::vector<float> logit(E), key(E), numerator(E);
    std::vector<int32_t> order(E);
#pragma omp for schedule(static)
    for (int64_t m = 0; m < num_tokens; ++m) {
      logits.load(m, logit.data());
      const float full_sum = exp_shifted(logit.data(), E, numerator.data());
      // Rank by the logit: it orders exactly as the probability does (exp is monotonic),
      // yet is bit-identical on every backend, while rounded probabilities of distinct
      // logits can tie or swap between two exp implementations.
      for (int64_t e = 0; e < E; ++e) {
        key[e] = rank_key(logit[e]);
        order[e] = static_cast<int32_t>(e);
      }
      select_best(key.data(), order.data(), E, topk);
      float chosen_sum = 0.0f;
      for (int64_t k = 0; k < topk; ++k) chosen_sum += numerator[order[k]];
      // Renormalized, p_k / sum(p_chosen) = exp_k / sum(exp_chosen): one division, not two.
      const float denominator = renormalize ? chosen_sum : full_sum;
      for (int64_t k = 0; k < topk; ++k) {
        out.write(m, k, order[k], numerator[order[k]] / denominator);
      }
    }
  }
}

void grouped_topk_rows(const LogitRows& logits, const float* correction_bias, int64_t num_tokens,
                       int64_t topk, const GroupedTopKParams& params, const RoutingOutput& out) {
  const int64_t E = logits.num_experts;
  const int64_t G = params.num_groups;
  const int64_t group_size = E / G;
#pragma omp parallel if (worth_threads(num_tokens, E))
  {
    std::vector<float> logit(E), score(E), key(E), group_key(G);
    std::vector<int32_t> group_order(G), candidates(E);
#pragma omp for schedule(static)
    for (int64_t m = 0; m < num_tokens; ++m) {
      logits.load(m, logit.data());
      if (params.scoring == ScoringFunc::softmax) {
        const float sum = exp_shifted(logit.data(), E, score.data());
        for (int64_t e = 0; e < E; ++e) score[e] /= sum;
      } else {
        for (int64_t e = 0; e < E; ++e) score[e] = 1.0f / (1.0f + std::exp(-logit[e]));
      }
      for (int64_t e = 0; e < E; ++e) {
        key[e] = rank_key(correction_bias ? score[e] + correction_bias[e] : score[e]);
      }

      // A group is as good as the sum of its two best biased scores (its only one if alone).
      for (int64_t g = 0; g < G; ++g) {
        const float* group = key.data() + g * group_size;
        float best = group[0], second = -INFINITY;
        for (int64_t i = 1; i < group_size; ++i) {
          if (group[i] > best) {
            second = best;
            best = group[i];
          } else if (group[i] > second) {
            second = group[i];
          }
        }
        group_key[g] = rank_key(group_size == 1 ? best : best + second);
        group_order[g] = static_cast<int32_t>(g);
      }
      select_best(group_key.data(), group_order.data(), G, params.topk_groups);

      int64_t count = 0;
      for (int64_t i = 0; i < params.topk_groups; ++i) {
        const int64_t first = group_order[i] * group_size;
        for (int64_t e = first; e < first + group_size; ++e) {
          candidates[count++] = static_cast<int32_t>(e);
        }
      }
      select_best(key.data(), candidates.data(), count, topk);

      // The bias only steers the choice; the weights are the unbiased scores.
      float chosen_sum = 0.0f;
      for (int64_t k = 0; k < topk; ++k) chosen_sum += score[candidates[k]];
      const float scale = params.renormalize ? params.routed_scaling_factor / chosen_sum
                                             : params.routed_scaling_factor;
      for (int64_t k = 0; k < topk; ++k) {
        out.write(m, k, candidates[k], score[candidates[k]] * scale);
      }
    }
  }
}

}  // namespace
}  // namespace cpu

namespace {

// The shared argument checks live in core/op_checks.h; only the context's device is ours.
void check_context(const char* fn, const Context& ctx) {
  MODMOE_CHECK(ctx.device.is_cpu())
      << fn << ": ctx.device must be cpu (the CPU router), got " << ctx.device.str();
}

}  // namespace

// ---- entry points (the public functions of router.h dispatch here for CPU contexts) -------

namespace cpu {

void softmax_topk(const Context& ctx, const Tensor& logits, int64_t topk, bool renormalize,
                  const Tensor& topk_weights, const Tensor& topk_ids) {
  constexpr const char* fn = "softmax_topk";
  check_context(fn, ctx);
  check_router_logits(fn, logits, ctx.device);
  check_router_topk(fn, topk, logits.size(1));
  check_router_outputs(fn, logits, topk, topk_weights, topk_ids, ctx.device);
  const int64_t num_tokens = logits.size(0);
  if (num_tokens == 0) return;
  cpu::softmax_topk_rows(cpu::LogitRows(logits), num_tokens, topk, renormalize,
                         cpu::RoutingOutput(topk_weights, topk_ids));
}

void grouped_topk(const Context& ctx, const Tensor& logits, const Tensor& correction_bias,
                  int64_t topk, const GroupedTopKParams& params, const Tensor& topk_weights,
                  const Tensor& topk_ids) {
  constexpr const char* fn = "grouped_topk";
  check_context(fn, ctx);
  check_router_logits(fn, logits, ctx.device);
  const int64_t E = logits.size(1);
  check_grouped_topk_groups(fn, E, topk, params);
  check_grouped_topk_scoring(fn, params, correction_bias, E, ctx.device);
  check_grouped_topk_outputs(fn, logits, correction_bias, topk, topk_weights, topk_ids, ctx.device);
  const int64_t num_tokens = logits.size(0);
  if (num_tokens == 0) return;
  const float* bias = correction_bias.defined() ? correction_bias.data_ptr<float>() : nullptr;
  cpu::grouped_topk_rows(cpu::LogitRows(logits), bias, num_tokens, topk, params,
                         cpu::RoutingOutput(topk_weights, topk_ids));
}

}  // namespace cpu
}  // namespace modmoe
