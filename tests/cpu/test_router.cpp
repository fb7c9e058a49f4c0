// Tests of the CPU router (softmax_topk, grouped_topk) against a float64 reference written
// here from the definitions in router.h: every expert is scored, then all are ranked with a
// stable sort (so ties keep the lower index), and the first k are taken.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "modmoe/allocator.h"
#include "modmoe/error.h"
#include "modmoe/numeric.h"
#include "modmoe/router.h"

namespace modmoe {
namespace {

using ::testing::HasSubstr;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// ---- data -----------------------------------------------------------------------------------

// Element (r, c) of a 2-D tensor through its strides.
int64_t offset_of(const Tensor& t, int64_t r, int64_t c) {
  return r * t.stride(0) + c * t.stride(1);
}

void fill_uniform(const Tensor& t, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  if (t.ndim() == 1) {
    for (int64_t i = 0; i < t.size(0); ++i)
      store_float(t.data(), t.dtype(), i * t.stride(0), dist(rng));
    return;
  }
  for (int64_t r = 0; r < t.size(0); ++r)
    for (int64_t c = 0; c < t.size(1); ++c)
      store_float(t.data(), t.dtype(), offset_of(t, r, c), dist(rng));
}

// NaN weights and -1 ids: anything the router forgets to write fails the comparison.
void poison(const Tensor& weights, const Tensor& ids) {
  for (int64_t r = 0; r < weights.size(0); ++r)
    for (int64_t c = 0; c < weights.size(1); ++c) {
      store_float(weights.data(), DType::fp32, offset_of(weights, r, c), NAN);
      store_float(ids.data(), ids.dtype(), offset_of(ids, r, c), -1);
    }
}

// The values the router actually sees (after rounding to the logits' dtype), as double.
std::vector<double> read_matrix(const Tensor& t) {
  std::vector<double> out(t.size(0) * t.size(1));
  for (int64_t r = 0; r < t.size(0); ++r)
    for (int64_t c = 0; c < t.size(1); ++c)
      out[r * t.size(1) + c] = load_float(t.data(), t.dtype(), offset_of(t, r, c));
  return out;
}

// ---- float64 reference ----------------------------------------------------------------------

struct ReferenceRouting {
  int64_t num_experts = 0, topk = 0;
  bool renormalize = false;
  double scale = 1.0;
  std::vector<double> select_score;  // (M, E): what ranks; -inf outside the kept groups
  std::vector<double> weight_score;  // (M, E): what becomes the weight (unbiased)
  std::vector<int64_t> ids;          // (M, topk)
};

// Indices of `score[0, n)` from best to worst; stable, so equal scores keep index order.
std::vector<int64_t> rank_descending(const double* score, int64_t n) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return score[a] > score[b]; });
  return order;
}

std::vector<double> softmax(const double* x, int64_t n) {
  const double max_x = *std::max_element(x, x + n);
  std::vector<double> p(n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += p[i] = std::exp(x[i] - max_x);
  for (double& v : p) v /= sum;
  return p;
}

ReferenceRouting reference_softmax_topk(const Tensor& logits, int64_t topk, bool renormalize) {
  const int64_t M = logits.size(0), E = logits.size(1);
  const std::vector<double> x = read_matrix(logits);
  ReferenceRouting ref{E, topk, renormalize, 1.0, {}, {}, {}};
  for (int64_t m = 0; m < M; ++m) {
    const std::vector<double> p = softmax(&x[m * E], E);
    ref.select_score.insert(ref.select_score.end(), p.begin(), p.end());
    ref.weight_score.insert(ref.weight_score.end(), p.begin(), p.end());
    const std::vector<int64_t> order = rank_descending(p.data(), E);
    ref.ids.insert(ref.ids.end(), order.begin(), order.begin() + topk);
  }
  return ref;
}

ReferenceRouting reference_grouped_topk(const Tensor& logits, const std::vector<double>& bias,
                                        int64_t topk, const GroupedTopKParams& params) {
  const int64_t M = logits.size(0), E = logits.size(1);
  const int64_t G = params.num_groups, group_size = E / G;
  const std::vector<double> x = read_matrix(logits);
  ReferenceRouting ref{E, topk, params.renormalize, params.routed_scaling_factor, {}, {}, {}};
  for (int64_t m = 0; m < M; ++m) {
    std::vector<double> s(E);
    if (params.scoring == ScoringFunc::softmax) {
      s = softmax(&x[m * E], E);
    } else {
      for (int64_t e = 0; e < E; ++e) s[e] = 1.0 / (1.0 + std::exp(-x[m * E + e]));
    }
    std::vector<double> biased(E);
    for (int64_t e = 0; e < E; ++e) biased[e] = s[e] + (bias.empty() ? 0.0 : bias[e]);

    std::vector<double> group_score(G);
    for (int64_t g = 0; g < G; ++g) {
      std::vector<double> members(biased.begin() + g * group_size,
                                  biased.begin() + (g + 1) * group_size);
      std::sort(members.rbegin(), members.rend());  // descending
      group_score[g] = members[0] + (group_size > 1 ? members[1] : 0.0);
    }
    const std::vector<int64_t> group_order = rank_descending(group_score.data(), G);
    std::vector<double> eligible(E, kNegInf);
    for (int64_t i = 0; i < params.topk_groups; ++i)
      for (int64_t e = group_order[i] * group_size; e < (group_order[i] + 1) * group_size; ++e)
        eligible[e] = biased[e];

    ref.select_score.insert(ref.select_score.end(), eligible.begin(), eligible.end());
    ref.weight_score.insert(ref.weight_score.end(), s.begin(), s.end());
    const std::vector<int64_t> order = rank_descending(eligible.data(), E);
    ref.ids.insert(ref.ids.end(), order.begin(), order.begin() + topk);
  }
  return ref;
}

// Checks the router's output against the reference. An id may differ from the reference's
// only when the two experts' selection scores differ, but by at most `score_tolerance` (a
// near-tie that fp32 and float64 may break differently); the weights are then checked for the
// ids actually chosen.
testing::AssertionResult matches_reference(const ReferenceRouting& ref, const Tensor& weights,
                                           const Tensor& ids, double score_tolerance) {
  const int64_t M = weights.size(0), E = ref.num_experts, K = ref.topk;
  for (int64_t m = 0; m < M; ++m) {
    const double* select = &ref.select_score[m * E];
    const double* weight_score = &ref.weight_score[m * E];
    std::vector<int64_t> got(K);
    std::set<int64_t> seen;
    double chosen_sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      got[k] = load_index(ids.data(), ids.dtype(), offset_of(ids, m, k));
      const int64_t want = ref.ids[m * K + k];
      auto where = [&] {
        std::ostringstream s;
        s << "row " << m << " slot " << k << ": got expert " << got[k] << ", reference " << want;
        return s.str();
      };
      if (got[k] < 0 || got[k] >= E)
        return testing::AssertionFailure() << where() << " (out of range)";
      if (!seen.insert(got[k]).second)
        return testing::AssertionFailure() << where() << " (repeated)";
      if (select[got[k]] == kNegInf)
        return testing::AssertionFailure() << where() << " (not in a kept group)";
      // Exact ties are not near-ties: they must go to the lower index, as in the reference.
      const double gap = std::fabs(select[got[k]] - select[want]);
      if (got[k] != want && !(gap > 0 && gap <= score_tolerance))
        return testing::AssertionFailure()
               << where() << " (scores " << select[got[k]] << " vs " << select[want] << ")";
      chosen_sum += weight_score[got[k]];
    }
    for (int64_t k = 0; k < K; ++k) {
      const double expected =
          weight_score[got[k]] / (ref.renormalize ? chosen_sum : 1.0) * ref.scale;
      const double actual = load_float(weights.data(), DType::fp32, offset_of(weights, m, k));
      if (!(std::fabs(actual - expected) <= 2e-5 * std::max(1.0, std::fabs(expected))))
        return testing::AssertionFailure() << "row " << m << " slot " << k << " (expert " << got[k]
                                           << "): weight " << actual << ", expected " << expected;
    }
  }
  return testing::AssertionSuccess();
}

std::vector<double> read_vector(const Tensor& t) {
  std::vector<double> out;
  if (!t.defined()) return out;
  for (int64_t i = 0; i < t.size(0); ++i) out.push_back(load_float(t.data(), t.dtype(), i));
  return out;
}

const Context kCpu = Context::cpu();

// The positive values of `values`, once each, in increasing order.
std::vector<int64_t> distinct(std::vector<int64_t> values) {
  values.erase(std::remove_if(values.begin(), values.end(), [](int64_t v) { return v < 1; }),
               values.end());
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  return values;
}

// ---- softmax_topk -----------------------------------------------------------------------------

TEST(SoftmaxTopK, MatchesReferenceAcrossShapesAndDtypes) {
  uint32_t seed = 1000;
  for (int64_t E : {8, 64, 128, 256})
    for (int64_t topk : {1, 2, 4, 8})
      for (int64_t M : {0, 1, 7, 33})
        for (DType logit_dtype : {DType::bf16, DType::fp32})
          for (DType id_dtype : {DType::int32, DType::int64})
            for (bool renormalize : {false, true}) {
              ++seed;
              SCOPED_TRACE(testing::Message()
                           << "seed " << seed << " E " << E << " topk " << topk << " M " << M
                           << " logits " << dtype_name(logit_dtype) << " ids "
                           << dtype_name(id_dtype) << " renormalize " << renormalize);
              std::mt19937 rng(seed);
              OwnedTensor logits = host_tensor(logit_dtype, {M, E});
              OwnedTensor weights = host_tensor(DType::fp32, {M, topk});
              OwnedTensor ids = host_tensor(id_dtype, {M, topk});
              fill_uniform(logits, rng, -4.0f, 4.0f);
              poison(weights, ids);
              softmax_topk(kCpu, logits, topk, renormalize, weights, ids);
              // Ranking by logit orders exactly as the float64 probabilities: no tolerance.
              EXPECT_TRUE(matches_reference(reference_softmax_topk(logits, topk, renormalize),
                                            weights, ids, 0.0));
            }
}

TEST(SoftmaxTopK, Fp16LogitsAndLargeTopK) {
  const uint32_t seed = 77;
  std::mt19937 rng(seed);
  for (int64_t topk : {1, 16, 63, 64}) {
    SCOPED_TRACE(testing::Message() << "seed " << seed << " topk " << topk);
    OwnedTensor logits = host_tensor(DType::fp16, {9, 64});
    OwnedTensor weights = host_tensor(DType::fp32, {9, topk});
    OwnedTensor ids = host_tensor(DType::int32, {9, topk});
    fill_uniform(logits, rng, -6.0f, 6.0f);
    poison(weights, ids);
    softmax_topk(kCpu, logits, topk, true, weights, ids);
    EXPECT_TRUE(matches_reference(reference_softmax_topk(logits, topk, true), weights, ids, 0.0));
  }
}

TEST(SoftmaxTopK, KnownValues) {
  // Logits log(1..4): probabilities 0.1, 0.2, 0.3, 0.4.
  std::vector<float> logit_values = {std::log(1.0f), std::log(2.0f), std::log(3.0f),
                                     std::log(4.0f)};
  Tensor logits(logit_values.data(), DType::fp32, {1, 4});
  OwnedTensor weights = host_tensor(DType::fp32, {1, 2});
  OwnedTensor ids = host_tensor(DType::int64, {1, 2});
  poison(weights, ids);
  softmax_topk(kCpu, logits, 2, false, weights, ids);
  EXPECT_EQ(ids.data_ptr<int64_t>()[0], 3);
  EXPECT_EQ(ids.data_ptr<int64_t>()[1], 2);
  EXPECT_NEAR(weights.data_ptr<float>()[0], 0.4f, 1e-6);
  EXPECT_NEAR(weights.data_ptr<float>()[1], 0.3f, 1e-6);

  poison(weights, ids);
  softmax_topk(kCpu, logits, 2, true, weights, ids);
  EXPECT_NEAR(weights.data_ptr<float>()[0], 4.0f / 7.0f, 1e-6);
  EXPECT_NEAR(weights.data_ptr<float>()[1], 3.0f / 7.0f, 1e-6);
}

TEST(SoftmaxTopK, TiesGoToTheLowerIndex) {
  // Row 0: three experts tie for the best score; row 1: all tie.
  std::vector<float> logit_values = {1, 3, 3, 2, 3, 0, 3, -1,  //
                                     5, 5, 5, 5, 5, 5, 5, 5};
  Tensor logits(logit_values.data(), DType::fp32, {2, 8});
  OwnedTensor weights = host_tensor(DType::fp32, {2, 3});
  OwnedTensor ids = host_tensor(DType::int32, {2, 3});
  poison(weights, ids);
  softmax_topk(kCpu, logits, 3, false, weights, ids);
  const int32_t* id = ids.data_ptr<int32_t>();
  EXPECT_THAT(std::vector<int32_t>(id, id + 3), testing::ElementsAre(1, 2, 4));
  EXPECT_THAT(std::vector<int32_t>(id + 3, id + 6), testing::ElementsAre(0, 1, 2));
  for (int k = 3; k < 6; ++k) EXPECT_FLOAT_EQ(weights.data_ptr<float>()[k], 1.0f / 8.0f);

  // The same through bf16, where many random logits collide.
  OwnedTensor bf16_logits = host_tensor(DType::bf16, {2, 8});
  for (int i = 0; i < 16; ++i)
    store_float(bf16_logits.data_ptr<void>(), DType::bf16, i, logit_values[i]);
  poison(weights, ids);
  softmax_topk(kCpu, bf16_logits, 3, true, weights, ids);
  EXPECT_THAT(std::vector<int32_t>(id, id + 3), testing::ElementsAre(1, 2, 4));
  EXPECT_THAT(std::vector<int32_t>(id + 3, id + 6), testing::ElementsAre(0, 1, 2));
  for (int k = 0; k < 6; ++k) EXPECT_FLOAT_EQ(weights.data_ptr<float>()[k], 1.0f / 3.0f);
}

TEST(SoftmaxTopK, RenormalizedWeightsSumToOne) {
  const uint32_t seed = 4242;
  std::mt19937 rng(seed);
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  OwnedTensor logits = host_tensor(DType::bf16, {33, 128});
  OwnedTensor weights = host_tensor(DType::fp32, {33, 8});
  OwnedTensor ids = host_tensor(DType::int32, {33, 8});
  fill_uniform(logits, rng, -3.0f, 3.0f);
  for (bool renormalize : {true, false}) {
    poison(weights, ids);
    softmax_topk(kCpu, logits, 8, renormalize, weights, ids);
    for (int64_t m = 0; m < 33; ++m) {
      double sum = 0;
      for (int64_t k = 0; k < 8; ++k) sum += weights.data_ptr<float>()[m * 8 + k];
      if (renormalize) {
        EXPECT_NEAR(sum, 1.0, 1e-6) << "row " << m;
      } else {
        EXPECT_LT(sum, 0.999) << "row " << m;  // 8 of 128 experts cannot hold all the mass
      }
    }
  }
}

TEST(SoftmaxTopK, StridedViewsAndSentinels) {
  // Logits are columns [2, 2+E) of a wider buffer; outputs are rows of wider buffers whose
  // padding must stay untouched.
  const uint32_t seed = 9;
  std::mt19937 rng(seed);
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const int64_t M = 7, E = 64, topk = 4, pad = 3;
  OwnedTensor wide_logits = host_tensor(DType::fp32, {M, E + 5});
  fill_uniform(wide_logits, rng, -4.0f, 4.0f);
  Tensor logits(wide_logits.data_ptr<float>() + 2, DType::fp32, {M, E}, {E + 5, 1}, Device::cpu());
  OwnedTensor wide_weights = host_tensor(DType::fp32, {M, topk + pad});
  OwnedTensor wide_ids = host_tensor(DType::int64, {M, topk + pad});
  poison(wide_weights, wide_ids);
  Tensor weights(wide_weights.data_ptr<float>(), DType::fp32, {M, topk}, {topk + pad, 1},
                 Device::cpu());
  Tensor ids(wide_ids.data_ptr<int64_t>(), DType::int64, {M, topk}, {topk + pad, 1}, Device::cpu());
  softmax_topk(kCpu, logits, topk, true, weights, ids);
  EXPECT_TRUE(matches_reference(reference_softmax_topk(logits, topk, true), weights, ids, 0.0));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = topk; c < topk + pad; ++c) {
      EXPECT_TRUE(std::isnan(wide_weights.data_ptr<float>()[m * (topk + pad) + c]));
      EXPECT_EQ(wide_ids.data_ptr<int64_t>()[m * (topk + pad) + c], -1);
    }
}

TEST(SoftmaxTopK, EmptyBatchIsANoOp) {
  Tensor logits(nullptr, DType::bf16, {0, 64});
  Tensor weights(nullptr, DType::fp32, {0, 8});
  Tensor ids(nullptr, DType::int32, {0, 8});
  EXPECT_NO_THROW(softmax_topk(kCpu, logits, 8, true, weights, ids));
  GroupedTopKParams params;
  params.num_groups = 8;
  params.topk_groups = 4;
  EXPECT_NO_THROW(grouped_topk(kCpu, logits, Tensor(), 8, params, weights, ids));
  // Validation still runs on an empty batch.
  EXPECT_THROW(softmax_topk(kCpu, logits, 65, true, weights, ids), Error);
}

// ---- grouped_topk -----------------------------------------------------------------------------

TEST(GroupedTopK, MatchesReferenceAcrossConfigs) {
  uint32_t seed = 5000;
  int cases = 0;
  for (int64_t E : {8, 64, 128, 256})
    for (int64_t num_groups : {1, 2, 4, 8})
      for (int64_t topk_groups : distinct({1, num_groups / 2, num_groups})) {
        for (int64_t topk : {1, 2, 4, 8}) {
          if (topk > topk_groups * (E / num_groups)) continue;
          for (int64_t M : {1, 7, 33})
            for (ScoringFunc scoring : {ScoringFunc::sigmoid, ScoringFunc::softmax})
              for (bool with_bias : {true, false}) {
                ++seed;
                ++cases;
                std::mt19937 rng(seed);
                // The remaining dimensions are drawn, so that all of them meet every shape.
                const DType logit_dtype = rng() % 2 ? DType::bf16 : DType::fp32;
                const DType id_dtype = rng() % 2 ? DType::int32 : DType::int64;
                GroupedTopKParams params;
                params.num_groups = num_groups;
                params.topk_groups = topk_groups;
                params.scoring = scoring;
                params.renormalize = rng() % 2;
                params.routed_scaling_factor = rng() % 2 ? 1.0f : 2.5f;
                SCOPED_TRACE(testing::Message()
                             << "seed " << seed << " E " << E << " groups " << num_groups
                             << " keep " << topk_groups << " topk " << topk << " M " << M
                             << " scoring " << static_cast<int>(scoring) << " bias " << with_bias
                             << " logits " << dtype_name(logit_dtype) << " ids "
                             << dtype_name(id_dtype) << " renormalize " << params.renormalize
                             << " scale " << params.routed_scaling_factor);
                OwnedTensor logits = host_tensor(logit_dtype, {M, E});
                OwnedTensor bias_storage = host_tensor(DType::fp32, {E});
                OwnedTensor weights = host_tensor(DType::fp32, {M, topk});
                OwnedTensor ids = host_tensor(id_dtype, {M, topk});
                fill_uniform(logits, rng, -4.0f, 4.0f);
                fill_uniform(bias_storage, rng, -0.3f, 0.3f);
                const Tensor bias = with_bias ? bias_storage.tensor() : Tensor();
                poison(weights, ids);
                grouped_topk(kCpu, logits, bias, topk, params, weights, ids);
                EXPECT_TRUE(matches_reference(
                    reference_grouped_topk(logits, read_vector(bias), topk, params), weights, ids,
                    1e-5));
              }
        }
      }
  EXPECT_GT(cases, 1000);
}

TEST(GroupedTopK, DeepSeekV3Config) {
  // E=256 in 8 groups of 32, keep 4 groups, top-8, sigmoid, bias, renormalize, x2.5.
  const uint32_t seed = 31337;
  std::mt19937 rng(seed);
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const int64_t M = 33, E = 256, topk = 8;
  GroupedTopKParams params;
  params.num_groups = 8;
  params.topk_groups = 4;
  params.scoring = ScoringFunc::sigmoid;
  params.renormalize = true;
  params.routed_scaling_factor = 2.5f;
  OwnedTensor logits = host_tensor(DType::bf16, {M, E});
  OwnedTensor bias = host_tensor(DType::fp32, {E});
  fill_uniform(logits, rng, -5.0f, 5.0f);
  fill_uniform(bias, rng, -1.0f, 1.0f);
  for (DType id_dtype : {DType::int32, DType::int64}) {
    OwnedTensor weights = host_tensor(DType::fp32, {M, topk});
    OwnedTensor ids = host_tensor(id_dtype, {M, topk});
    poison(weights, ids);
    grouped_topk(kCpu, logits, bias, topk, params, weights, ids);
    EXPECT_TRUE(matches_reference(reference_grouped_topk(logits, read_vector(bias), topk, params),
                                  weights, ids, 1e-5));
    for (int64_t m = 0; m < M; ++m) {
      double sum = 0;
      std::set<int64_t> groups;
      for (int64_t k = 0; k < topk; ++k) {
        sum += weights.data_ptr<float>()[m * topk + k];
        groups.insert(load_index(ids.data_ptr<void>(), id_dtype, m * topk + k) / 32);
      }
      EXPECT_NEAR(sum, 2.5, 1e-5) << "row " << m;
      EXPECT_LE(groups.size(), 4u) << "row " << m;
    }
  }
}

TEST(GroupedTopK, BiasSteersSelectionButWeightsAreUnbiased) {
  // Two groups of four. Unbiased, group 0 wins with experts 0 and 1. The bias lifts experts
  // 5 and 6 so group 1 wins and 5, 6 are chosen; their weights must be sigmoid(logit), not
  // sigmoid(logit) + bias.
  std::vector<float> logit_values = {2.0f, 1.5f, 0.1f, 0.0f, 0.5f, 0.4f, -1.0f, -2.0f};
  std::vector<float> bias_values = {0, 0, 0, 0, 0, 0.5f, 0.5f, 0};
  Tensor logits(logit_values.data(), DType::fp32, {1, 8});
  Tensor bias(bias_values.data(), DType::fp32, {8});
  GroupedTopKParams params;
  params.num_groups = 2;
  params.topk_groups = 1;
  auto sigmoid = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  OwnedTensor weights = host_tensor(DType::fp32, {1, 2});
  OwnedTensor ids = host_tensor(DType::int32, {1, 2});

  poison(weights, ids);
  grouped_topk(kCpu, logits, Tensor(), 2, params, weights, ids);  // no bias: experts 0, 1
  EXPECT_THAT(std::vector<int32_t>(ids.data_ptr<int32_t>(), ids.data_ptr<int32_t>() + 2),
              testing::ElementsAre(0, 1));

  for (bool renormalize : {false, true}) {
    SCOPED_TRACE(testing::Message() << "renormalize " << renormalize);
    params.renormalize = renormalize;
    params.routed_scaling_factor = 1.5f;
    poison(weights, ids);
    grouped_topk(kCpu, logits, bias, 2, params, weights, ids);
    EXPECT_THAT(std::vector<int32_t>(ids.data_ptr<int32_t>(), ids.data_ptr<int32_t>() + 2),
                testing::ElementsAre(5, 6));
    const double s5 = sigmoid(0.4), s6 = sigmoid(-1.0);
    const double denominator = renormalize ? s5 + s6 : 1.0;
    EXPECT_NEAR(weights.data_ptr<float>()[0], 1.5 * s5 / denominator, 1e-6);
    EXPECT_NEAR(weights.data_ptr<float>()[1], 1.5 * s6 / denominator, 1e-6);
  }

  // Within one group: the bias reorders the experts, and the output follows the biased order
  // (expert 3 first) although its weight is the smallest.
  params.num_groups = 1;
  params.renormalize = false;
  params.routed_scaling_factor = 1.0f;
  std::vector<float> lift_three = {0, 0, 0, 0.9f, 0, 0, 0, 0};
  Tensor bias3(lift_three.data(), DType::fp32, {8});
  poison(weights, ids);
  grouped_topk(kCpu, logits, bias3, 2, params, weights, ids);
  EXPECT_THAT(std::vector<int32_t>(ids.data_ptr<int32_t>(), ids.data_ptr<int32_t>() + 2),
              testing::ElementsAre(3, 0));
  EXPECT_NEAR(weights.data_ptr<float>()[0], sigmoid(0.0), 1e-6);
  EXPECT_NEAR(weights.data_ptr<float>()[1], sigmoid(2.0), 1e-6);
}

TEST(GroupedTopK, TiesGoToTheLowerGroupAndExpert) {
  // Groups 1 and 3 are identical and best; keeping one group must keep group 1. Inside it,
  // experts 5 and 6 tie for the best score: 5 comes first.
  std::vector<float> logit_values = {0, 0, 0, 0,  //
                                     1, 2, 2, 1,  //
                                     0, 0, 0, 0,  //
                                     1, 2, 2, 1};
  Tensor logits(logit_values.data(), DType::fp32, {1, 16});
  GroupedTopKParams params;
  params.num_groups = 4;
  params.topk_groups = 1;
  params.renormalize = true;
  OwnedTensor weights = host_tensor(DType::fp32, {1, 3});
  OwnedTensor ids = host_tensor(DType::int64, {1, 3});
  poison(weights, ids);
  grouped_topk(kCpu, logits, Tensor(), 3, params, weights, ids);
  EXPECT_THAT(std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 3),
              testing::ElementsAre(5, 6, 4));

  // Everything equal: the first groups and the first experts, equal weights.
  std::vector<float> flat(16, 0.25f);
  Tensor flat_logits(flat.data(), DType::fp32, {1, 16});
  params.topk_groups = 2;
  poison(weights, ids);
  grouped_topk(kCpu, flat_logits, Tensor(), 3, params, weights, ids);
  EXPECT_THAT(std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 3),
              testing::ElementsAre(0, 1, 2));
  for (int k = 0; k < 3; ++k) EXPECT_FLOAT_EQ(weights.data_ptr<float>()[k], 1.0f / 3.0f);
}

TEST(GroupedTopK, GroupScoreIsTheSumOfTheTopTwo) {
  // Group 0 has the single best expert but a poor second; group 1 has two good ones. The
  // top-2 sum keeps group 1 (a max-based group score would keep group 0).
  std::vector<float> logit_values = {4.0f, -4.0f, -4.0f, -4.0f, 1.0f, 1.0f, -4.0f, -4.0f};
  Tensor logits(logit_values.data(), DType::fp32, {1, 8});
  GroupedTopKParams params;
  params.num_groups = 2;
  params.topk_groups = 1;
  OwnedTensor weights = host_tensor(DType::fp32, {1, 1});
  OwnedTensor ids = host_tensor(DType::int32, {1, 1});
  poison(weights, ids);
  grouped_topk(kCpu, logits, Tensor(), 1, params, weights, ids);
  EXPECT_EQ(ids.data_ptr<int32_t>()[0], 4);
  EXPECT_FLOAT_EQ(weights.data_ptr<float>()[0], 1.0f);  // renormalized over one expert

  // With one expert per group, a group's score is that expert's score: plain top-k.
  params.num_groups = 8;
  params.topk_groups = 2;
  OwnedTensor weights2 = host_tensor(DType::fp32, {1, 2});
  OwnedTensor ids2 = host_tensor(DType::int32, {1, 2});
  poison(weights2, ids2);
  grouped_topk(kCpu, logits, Tensor(), 2, params, weights2, ids2);
  EXPECT_THAT(std::vector<int32_t>(ids2.data_ptr<int32_t>(), ids2.data_ptr<int32_t>() + 2),
              testing::ElementsAre(0, 4));
}

// ---- bad inputs -------------------------------------------------------------------------------

// Runs `call`, expects a modmoe::Error whose message contains `text`.
template <typename Call>
void expect_error(Call call, const std::string& text) {
  try {
    call();
    ADD_FAILURE() << "expected an Error containing: " << text;
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(text));
  }
}

TEST(RouterErrors, SoftmaxTopKRejectsBadArguments) {
  OwnedTensor logits = host_tensor(DType::fp32, {4, 8});
  OwnedTensor weights = host_tensor(DType::fp32, {4, 2});
  OwnedTensor ids = host_tensor(DType::int32, {4, 2});
  std::mt19937 rng(3);
  fill_uniform(logits, rng, -1.0f, 1.0f);
  poison(weights, ids);

  expect_error([&] { softmax_topk(kCpu, logits, 9, true, weights, ids); },
               "softmax_topk: topk must be in [1, E=8], got 9");
  expect_error([&] { softmax_topk(kCpu, logits, 0, true, weights, ids); },
               "softmax_topk: topk must be in [1, E=8], got 0");
  OwnedTensor float_ids = host_tensor(DType::fp32, {4, 2});
  expect_error([&] { softmax_topk(kCpu, logits, 2, true, weights, float_ids); },
               "softmax_topk: topk_ids must be int32 or int64 (M, topk) = (4, 2), got fp32 "
               "(4, 2) on cpu");
  OwnedTensor short_ids = host_tensor(DType::int64, {3, 2});
  expect_error([&] { softmax_topk(kCpu, logits, 2, true, weights, short_ids); },
               "softmax_topk: topk_ids must be int32 or int64 (M, topk) = (4, 2), got int64 "
               "(3, 2) on cpu");
  OwnedTensor bf16_weights = host_tensor(DType::bf16, {4, 2});
  expect_error([&] { softmax_topk(kCpu, logits, 2, true, bf16_weights, ids); },
               "softmax_topk: topk_weights must be fp32 (M, topk) = (4, 2), got bf16 (4, 2) "
               "on cpu");
  expect_error([&] { softmax_topk(kCpu, logits, 3, true, weights, ids); },
               "softmax_topk: topk_weights must be fp32 (M, topk) = (4, 3), got fp32 (4, 2) "
               "on cpu");
  OwnedTensor int_logits = host_tensor(DType::int32, {4, 8});
  expect_error([&] { softmax_topk(kCpu, int_logits, 2, true, weights, ids); },
               "softmax_topk: logits must be bf16, fp16 or fp32 (M, E), got int32 (4, 8) on cpu");
  expect_error([&] { softmax_topk(kCpu, logits.tensor().reshape({32}), 2, true, weights, ids); },
               "softmax_topk: logits must be bf16, fp16 or fp32 (M, E), got fp32 (32,) on cpu");
  expect_error([&] { softmax_topk(kCpu, Tensor(), 2, true, weights, ids); },
               "softmax_topk: logits must be defined, got undefined");
  expect_error([&] { softmax_topk(kCpu, logits, 2, true, weights, Tensor()); },
               "softmax_topk: topk_ids must be defined, got undefined");
  Tensor gpu_logits(logits.data_ptr<void>(), DType::fp32, {4, 8}, Device::cuda(0));
  expect_error([&] { softmax_topk(kCpu, gpu_logits, 2, true, weights, ids); },
               "softmax_topk: logits must be on cpu, got fp32 (4, 8) on cuda:0");
  // A CUDA context goes to the CUDA router, which wants its tensors on that device.
  Context gpu_context;
  gpu_context.device = Device::cuda(1);
#ifdef MODMOE_WITH_CUDA
  expect_error([&] { softmax_topk(gpu_context, logits, 2, true, weights, ids); },
               "softmax_topk: logits must be on cuda:1, got fp32 (4, 8) on cpu");
#else
  expect_error([&] { softmax_topk(gpu_context, logits, 2, true, weights, ids); },
               "softmax_topk: this build has no CUDA backend");
#endif
  // Outputs that alias each other, or a transposed output whose rows are not contiguous.
  Tensor aliased_ids(weights.data_ptr<void>(), DType::int32, {4, 2});
  expect_error([&] { softmax_topk(kCpu, logits, 2, true, weights, aliased_ids); },
               "softmax_topk: topk_weights and topk_ids must not overlap in memory");
  Tensor transposed_weights(weights.data_ptr<void>(), DType::fp32, {4, 2}, {1, 4}, Device::cpu());
  expect_error([&] { softmax_topk(kCpu, logits, 2, true, transposed_weights, ids); },
               "softmax_topk: topk_weights must have contiguous rows (column stride 1, row "
               "stride >= topk=2), got strides (1, 4)");

  // Nothing was written by any failed call.
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(std::isnan(weights.data_ptr<float>()[i]));
    EXPECT_EQ(ids.data_ptr<int32_t>()[i], -1);
  }
}

TEST(RouterErrors, GroupedTopKRejectsBadArguments) {
  OwnedTensor logits = host_tensor(DType::bf16, {4, 16});
  OwnedTensor bias = host_tensor(DType::fp32, {16});
  OwnedTensor weights = host_tensor(DType::fp32, {4, 2});
  OwnedTensor ids = host_tensor(DType::int64, {4, 2});
  std::mt19937 rng(4);
  fill_uniform(logits, rng, -1.0f, 1.0f);
  fill_uniform(bias, rng, -1.0f, 1.0f);
  poison(weights, ids);
  GroupedTopKParams good;
  good.num_groups = 4;
  good.topk_groups = 2;

  OwnedTensor logits10 = host_tensor(DType::fp32, {4, 10});
  OwnedTensor bias10 = host_tensor(DType::fp32, {10});
  expect_error([&] { grouped_topk(kCpu, logits10, bias10, 2, good, weights, ids); },
               "grouped_topk: num_experts 10 must be divisible by num_groups 4");
  GroupedTopKParams p = good;
  p.num_groups = 0;
  expect_error([&] { grouped_topk(kCpu, logits, bias, 2, p, weights, ids); },
               "grouped_topk: num_groups must be >= 1, got 0");
  p = good;
  p.topk_groups = 5;
  expect_error([&] { grouped_topk(kCpu, logits, bias, 2, p, weights, ids); },
               "grouped_topk: topk_groups must be in [1, num_groups=4], got 5");
  p.topk_groups = 0;
  expect_error([&] { grouped_topk(kCpu, logits, bias, 2, p, weights, ids); },
               "grouped_topk: topk_groups must be in [1, num_groups=4], got 0");
  OwnedTensor weights9 = host_tensor(DType::fp32, {4, 9});
  OwnedTensor ids9 = host_tensor(DType::int32, {4, 9});
  expect_error([&] { grouped_topk(kCpu, logits, bias, 9, good, weights9, ids9); },
               "grouped_topk: topk must be in [1, topk_groups * E / num_groups = 2 * 4 = 8], "
               "got 9");
  OwnedTensor bf16_bias = host_tensor(DType::bf16, {16});
  expect_error([&] { grouped_topk(kCpu, logits, bf16_bias, 2, good, weights, ids); },
               "grouped_topk: correction_bias must be fp32 (E,) = (16,) or undefined, got bf16 "
               "(16,) on cpu");
  OwnedTensor short_bias = host_tensor(DType::fp32, {8});
  expect_error([&] { grouped_topk(kCpu, logits, short_bias, 2, good, weights, ids); },
               "grouped_topk: correction_bias must be fp32 (E,) = (16,) or undefined, got fp32 "
               "(8,) on cpu");
  p = good;
  p.routed_scaling_factor = NAN;
  expect_error([&] { grouped_topk(kCpu, logits, bias, 2, p, weights, ids); },
               "grouped_topk: routed_scaling_factor must be finite, got nan");
  OwnedTensor int_ids = host_tensor(DType::uint8, {4, 2});
  expect_error([&] { grouped_topk(kCpu, logits, bias, 2, good, weights, int_ids); },
               "grouped_topk: topk_ids must be int32 or int64 (M, topk) = (4, 2), got uint8 "
               "(4, 2) on cpu");
  Tensor gpu_bias(bias.data_ptr<void>(), DType::fp32, {16}, Device::cuda(0));
  expect_error([&] { grouped_topk(kCpu, logits, gpu_bias, 2, good, weights, ids); },
               "grouped_topk: correction_bias must be on cpu, got fp32 (16,) on cuda:0");
  Tensor weights_on_bias(bias.data_ptr<void>(), DType::fp32, {4, 2});
  expect_error([&] { grouped_topk(kCpu, logits, bias, 2, good, weights_on_bias, ids); },
               "grouped_topk: topk_weights and topk_ids must not overlap correction_bias");

  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(std::isnan(weights.data_ptr<float>()[i]));
    EXPECT_EQ(ids.data_ptr<int64_t>()[i], -1);
  }
}

}  // namespace
}  // namespace modmoe
