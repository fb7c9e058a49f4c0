// The four TopKWeightAndReduce kinds on their own, against brute-force sums in double.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cpu/topk_weight_and_reduce.h"
#include "modmoe/modmoe.h"
#include "modmoe/numeric.h"

namespace modmoe {
namespace {

struct Routing {
  int64_t M, topk, E;
  OwnedTensor ids, weights;
};

Routing random_routing(int64_t M, int64_t topk, int64_t E, std::mt19937& rng) {
  Routing r{M, topk, E, host_tensor(DType::int32, {M, topk}), host_tensor(DType::fp32, {M, topk})};
  std::uniform_real_distribution<float> u(0.1f, 1.0f);
  for (int64_t t = 0; t < M; ++t) {
    std::vector<int32_t> perm(E);
    for (int64_t e = 0; e < E; ++e) perm[e] = static_cast<int32_t>(e);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t k = 0; k < topk; ++k) {
      r.ids.data_ptr<int32_t>()[t * topk + k] = perm[k];
      r.weights.data_ptr<float>()[t * topk + k] = u(rng);
    }
  }
  return r;
}

void fill_random(const Tensor& t, std::mt19937& rng) {
  std::normal_distribution<float> n(0.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) store_float(t.data(), t.dtype(), i, n(rng));
}

void fill_nan(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) store_float(t.data(), t.dtype(), i, NAN);
}

TEST(TopKWeightAndReduce, ContiguousWeightsAndSumsSkippingNonLocal) {
  std::mt19937 rng(1);
  const int64_t M = 13, topk = 3, E = 6, K = 40;
  Routing r = random_routing(M, topk, E, rng);
  OwnedTensor fused = host_tensor(DType::fp32, {M, topk, K});
  fill_random(fused, rng);
  OwnedTensor map = host_tensor(DType::int32, {E});
  for (int64_t e = 0; e < E; ++e) map.data_ptr<int32_t>()[e] = (e % 3 == 0) ? -1 : static_cast<int32_t>(e / 2);
  for (bool with_map : {false, true}) {
    for (DType out_dtype : {DType::fp32, DType::bf16}) {
      OwnedTensor out = host_tensor(out_dtype, {M, K});
      fill_nan(out);
      cpu::TopKWeightAndReduceContiguous().apply(
          Context::cpu(), ReduceArgs{out, fused, r.weights, r.ids, with_map ? map.tensor() : Tensor(), false});
      for (int64_t t = 0; t < M; ++t) {
        for (int64_t i = 0; i < K; ++i) {
          double ref = 0;
          for (int64_t k = 0; k < topk; ++k) {
            const int32_t id = r.ids.data_ptr<int32_t>()[t * topk + k];
            if (with_map && map.data_ptr<int32_t>()[id] < 0) continue;
            ref += double(r.weights.data_ptr<float>()[t * topk + k]) *
                   fused.data_ptr<float>()[(t * topk + k) * K + i];
          }
          const double tol = out_dtype == DType::fp32 ? 1e-5 : 1e-2 * (1 + std::fabs(ref));
          ASSERT_NEAR(load_float(out.tensor().data(), out_dtype, t * K + i), ref, tol)
              << "t " << t << " i " << i << " map " << with_map;
        }
      }
    }
  }
}

TEST(TopKWeightAndReduce, ContiguousWithRouterWeightOnInputSumsUnweighted) {
  std::mt19937 rng(2);
  const int64_t M = 5, topk = 1, E = 4, K = 16;
  Routing r = random_routing(M, topk, E, rng);
  OwnedTensor fused = host_tensor(DType::fp32, {M, topk, K});
  fill_random(fused, rng);
  OwnedTensor out = host_tensor(DType::fp32, {M, K});
  fill_nan(out);
  cpu::TopKWeightAndReduceContiguous().apply(Context::cpu(), ReduceArgs{out, fused, r.weights, r.ids, Tensor(), true});
  for (int64_t i = 0; i < M * K; ++i) ASSERT_EQ(out.data_ptr<float>()[i], fused.data_ptr<float>()[i]);
}

TEST(TopKWeightAndReduce, NaiveBatchedFindsEachTokensSlotInTokenOrder) {
  std::mt19937 rng(3);
  const int64_t M = 17, topk = 2, E = 5, K = 24, T = 20;
  Routing r = random_routing(M, topk, E, rng);
  OwnedTensor fused = host_tensor(DType::fp32, {E, T, K});
  fill_nan(fused);  // rows past each expert's count stay NaN: reading one would show
  std::vector<int64_t> next(E, 0), slot(M * topk);
  for (int64_t p = 0; p < M * topk; ++p) {
    const int32_t e = r.ids.data_ptr<int32_t>()[p];
    slot[p] = e * T + next[e]++;
    for (int64_t i = 0; i < K; ++i) fused.data_ptr<float>()[slot[p] * K + i] = float(p * 100 + i);
  }
  OwnedTensor out = host_tensor(DType::fp32, {M, K});
  fill_nan(out);
  cpu::TopKWeightAndReduceNaiveBatched().apply(Context::cpu(), ReduceArgs{out, fused, r.weights, r.ids, Tensor(), false});
  for (int64_t t = 0; t < M; ++t)
    for (int64_t i = 0; i < K; ++i) {
      double ref = 0;
      for (int64_t k = 0; k < topk; ++k)
        ref += double(r.weights.data_ptr<float>()[t * topk + k]) * double((t * topk + k) * 100 + i);
      ASSERT_NEAR(out.data_ptr<float>()[t * K + i], ref, 1e-3 * std::fabs(ref)) << t << "," << i;
    }
}

TEST(TopKWeightAndReduce, NaiveBatchedRejectsOverfullExperts) {
  std::mt19937 rng(4);
  Routing r = random_routing(8, 2, 2, rng);  // each of 2 experts gets all 8 tokens
  OwnedTensor fused = host_tensor(DType::fp32, {2, 4, 8});
  OwnedTensor out = host_tensor(DType::fp32, {8, 8});
  try {
    cpu::TopKWeightAndReduceNaiveBatched().apply(Context::cpu(), ReduceArgs{out, fused, r.weights, r.ids, Tensor(), false});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than max_tokens = 4"), std::string::npos) << e.what();
  }
}

TEST(TopKWeightAndReduce, NoOpCopiesOnlyWhenNeeded) {
  std::mt19937 rng(5);
  OwnedTensor fused = host_tensor(DType::fp32, {3, 8}), out = host_tensor(DType::bf16, {3, 8});
  fill_random(fused, rng);
  fill_nan(out);
  cpu::TopKWeightAndReduceNoOp noop;
  noop.apply(Context::cpu(), ReduceArgs{out, fused, Tensor(), Tensor(), Tensor(), false});
  for (int64_t i = 0; i < 24; ++i)
    ASSERT_EQ(load_float(out.tensor().data(), DType::bf16, i), bf16_to_float(float_to_bf16(fused.data_ptr<float>()[i])));
  // Same memory: nothing happens (and nothing is read from undefined routing tensors).
  EXPECT_NO_THROW(noop.apply(Context::cpu(), ReduceArgs{fused, fused, Tensor(), Tensor(), Tensor(), false}));
}

TEST(TopKWeightAndReduce, DelegateRefusesToRunAndNamesItself) {
  cpu::TopKWeightAndReduceDelegate d;
  EXPECT_STREQ(d.name(), "TopKWeightAndReduceDelegate");
  try {
    d.apply(Context::cpu(), ReduceArgs{});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must replace it"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace modmoe
