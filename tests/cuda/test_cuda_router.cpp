// The CUDA router against the CPU router: the same experts in the same slots (ties to the lower
// index, NaN ranked last), weights within 1e-6 (and almost always bit-identical, since the
// device repeats the CPU's arithmetic in its order), for softmax top-k over E up to 512 and
// topk up to 32, DeepSeek-V3 grouped top-k and its variants (small groups walked by a lane,
// large groups by the warp, one expert per group, one group), strided logits and outputs, tie-
// heavy and non-finite logits, and the argument checks on a CUDA context.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/cuda_session.h"
#include "cuda/gpu_test.h"
#include "modmoe/allocator.h"
#include "modmoe/numeric.h"
#include "modmoe/router.h"

namespace modmoe {
namespace {

using ::modmoe::testing::CudaSession;
using ::modmoe::testing::error_of;
using ::testing::HasSubstr;

constexpr double kWeightTolerance = 1e-6;  // relative to max(1, |weight|)

// ---- data ---------------------------------------------------------------------------------------

enum class Flavor { random, ties };

// Router logits: `random` ~ N(0, 2^2); `ties` rounds them to multiples of 0.5, so a row has
// many equal logits (and -0 next to +0).
OwnedTensor make_logits(DType dtype, int64_t M, int64_t E, Flavor flavor, std::mt19937& rng) {
  OwnedTensor t = host_tensor(dtype, {M, E});
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t i = 0; i < M * E; ++i) {
    float v = normal(rng);
    if (flavor == Flavor::ties) v = std::round(v * 2.0f) / 2.0f;
    store_float(t.tensor().data(), dtype, i, v);
  }
  return t;
}

// DeepSeek-V3-like correction bias: small, so it reorders near neighbours.
OwnedTensor make_bias(int64_t E, Flavor flavor, std::mt19937& rng) {
  OwnedTensor t = host_tensor(DType::fp32, {E});
  std::normal_distribution<float> normal(0.0f, 0.1f);
  for (int64_t e = 0; e < E; ++e) {
    float v = normal(rng);
    if (flavor == Flavor::ties) v = std::round(v * 8.0f) / 8.0f;
    t.data_ptr<float>()[e] = v;
  }
  return t;
}

// NaN weights and -1 ids, for a (rows, row_stride) buffer.
void poison(const Tensor& weights, const Tensor& ids) {
  for (int64_t i = 0; i < weights.numel(); ++i) weights.data_ptr<float>()[i] = NAN;
  for (int64_t i = 0; i < ids.numel(); ++i) store_float(ids.data(), ids.dtype(), i, -1);
}

// ---- comparison ---------------------------------------------------------------------------------

struct Agreement {
  int64_t weights = 0, bit_identical = 0;
};

// Rows of (M, topk) views at any row stride; ids must be equal, weights close. Stops after a
// few failures so one bad case does not flood the log.
void expect_same_routing(const Tensor& cpu_weights, const Tensor& cpu_ids,
                         const Tensor& gpu_weights, const Tensor& gpu_ids, Agreement* agreement) {
  int failures = 0;
  for (int64_t r = 0; r < cpu_weights.size(0) && failures < 8; ++r) {
    for (int64_t k = 0; k < cpu_weights.size(1); ++k) {
      const int64_t cpu_id = load_index(cpu_ids.data(), cpu_ids.dtype(), r * cpu_ids.stride(0) + k);
      const int64_t gpu_id = load_index(gpu_ids.data(), gpu_ids.dtype(), r * gpu_ids.stride(0) + k);
      const float cpu_w = cpu_weights.data_ptr<float>()[r * cpu_weights.stride(0) + k];
      const float gpu_w = gpu_weights.data_ptr<float>()[r * gpu_weights.stride(0) + k];
      if (cpu_id != gpu_id) {
        ADD_FAILURE() << "row " << r << " slot " << k << ": cpu expert " << cpu_id
                      << ", gpu expert " << gpu_id;
        ++failures;
      }
      const bool both_nan = std::isnan(cpu_w) && std::isnan(gpu_w);
      const double tolerance = kWeightTolerance * std::max(1.0, std::fabs(double{cpu_w}));
      if (!both_nan && !(std::fabs(double{cpu_w} - double{gpu_w}) <= tolerance)) {
        ADD_FAILURE() << "row " << r << " slot " << k << ": cpu weight " << cpu_w << ", gpu weight "
                      << gpu_w;
        ++failures;
      }
      ++agreement->weights;
      if (float_bits(cpu_w) == float_bits(gpu_w)) ++agreement->bit_identical;
    }
  }
}

// A routing call on either backend: (ctx, logits, bias, weights, ids).
using RouteFn =
    std::function<void(const Context&, const Tensor&, const Tensor&, const Tensor&, const Tensor&)>;

// Runs `route` on the CPU with the host tensors and on the GPU with device copies, into
// poisoned (M, topk) outputs, and compares.
void compare_with_cpu(const CudaSession& gpu, const Tensor& logits, const Tensor& bias,
                      int64_t topk, DType ids_dtype, const RouteFn& route, Agreement* agreement) {
  const int64_t M = logits.size(0);
  OwnedTensor cpu_weights = host_tensor(DType::fp32, {M, topk});
  OwnedTensor cpu_ids = host_tensor(ids_dtype, {M, topk});
  poison(cpu_weights, cpu_ids);
  route(Context::cpu(), logits, bias, cpu_weights, cpu_ids);

  OwnedTensor init_weights = host_tensor(DType::fp32, {M, topk});
  OwnedTensor init_ids = host_tensor(ids_dtype, {M, topk});
  poison(init_weights, init_ids);
  const OwnedTensor logits_dev = gpu.to_device(logits);
  const OwnedTensor bias_dev = bias.defined() ? gpu.to_device(bias) : OwnedTensor();
  const OwnedTensor weights_dev = gpu.to_device(init_weights);
  const OwnedTensor ids_dev = gpu.to_device(init_ids);
  route(gpu.ctx(), logits_dev, bias.defined() ? bias_dev.tensor() : Tensor(), weights_dev, ids_dev);
  const OwnedTensor gpu_weights = gpu.to_host(weights_dev);
  const OwnedTensor gpu_ids = gpu.to_host(ids_dev);
  expect_same_routing(cpu_weights, cpu_ids, gpu_weights, gpu_ids, agreement);
}

RouteFn softmax_route(int64_t topk, bool renormalize) {
  return [=](const Context& ctx, const Tensor& logits, const Tensor&, const Tensor& weights,
             const Tensor& ids) { softmax_topk(ctx, logits, topk, renormalize, weights, ids); };
}

RouteFn grouped_route(int64_t topk, const GroupedTopKParams& params) {
  return [=](const Context& ctx, const Tensor& logits, const Tensor& bias, const Tensor& weights,
             const Tensor& ids) { grouped_topk(ctx, logits, bias, topk, params, weights, ids); };
}

// The device repeats the CPU's arithmetic in the CPU's order, with exp correctly rounded where
// glibc's expf nearly always is: a weight that is not bit-identical is the rare exception.
// (A float expf or a fused multiply-add would make a large share differ.)
void expect_mostly_bit_identical(const Agreement& a) {
  EXPECT_GE(a.bit_identical, a.weights * 9 / 10)
      << a.bit_identical << " of " << a.weights << " weights are bit-identical to the CPU's";
}

std::string describe(const char* what, int64_t E, int64_t topk, DType dtype, uint32_t seed) {
  std::ostringstream s;
  s << what << " E=" << E << " topk=" << topk << " logits " << dtype_name(dtype) << " seed "
    << seed;
  return s.str();
}

// ---- softmax top-k ------------------------------------------------------------------------------

TEST(CudaRouter, SoftmaxTopKMatchesCpu) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const DType dtypes[] = {DType::fp32, DType::bf16, DType::fp16};
  const int64_t M = 37;
  Agreement renormalized, plain;
  int case_index = 0;
  for (int64_t E : {8, 60, 128, 256, 512}) {
    for (int64_t topk : {1, 2, 6, 8, 32}) {
      if (topk > E) continue;
      for (bool renormalize : {true, false}) {
        const DType dtype = dtypes[case_index % 3];
        const DType ids_dtype = case_index % 2 ? DType::int64 : DType::int32;
        const uint32_t seed = static_cast<uint32_t>(100 + case_index++);
        SCOPED_TRACE(describe("softmax", E, topk, dtype, seed) +
                     (renormalize ? " renormalized" : ""));
        std::mt19937 rng(seed);
        const OwnedTensor logits = make_logits(dtype, M, E, Flavor::random, rng);
        compare_with_cpu(gpu, logits, Tensor(), topk, ids_dtype, softmax_route(topk, renormalize),
                         renormalize ? &renormalized : &plain);
      }
    }
  }
  expect_mostly_bit_identical(renormalized);
  expect_mostly_bit_identical(plain);
}

// ---- grouped top-k ------------------------------------------------------------------------------

TEST(CudaRouter, DeepSeekV3MatchesCpu) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  GroupedTopKParams params;
  params.num_groups = 8;
  params.topk_groups = 4;
  params.scoring = ScoringFunc::sigmoid;
  params.renormalize = true;
  params.routed_scaling_factor = 2.5f;
  const int64_t M = 67, E = 256, topk = 8;
  Agreement agreement;
  for (DType dtype : {DType::fp32, DType::bf16}) {
    const uint32_t seed = dtype == DType::fp32 ? 7 : 8;
    SCOPED_TRACE(describe("DeepSeek-V3", E, topk, dtype, seed));
    std::mt19937 rng(seed);
    const OwnedTensor logits = make_logits(dtype, M, E, Flavor::random, rng);
    const OwnedTensor bias = make_bias(E, Flavor::random, rng);
    compare_with_cpu(gpu, logits, bias, topk, DType::int32, grouped_route(topk, params),
                     &agreement);
  }
  expect_mostly_bit_identical(agreement);
}

struct GroupedCase {
  int64_t E, num_groups, topk_groups, topk;
  ScoringFunc scoring;
  bool bias, renormalize;
  float scaling;
  const char* what;
};

TEST(CudaRouter, GroupedTopKVariantsMatchCpu) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const ScoringFunc sig = ScoringFunc::sigmoid, soft = ScoringFunc::softmax;
  const GroupedCase cases[] = {
      {64, 8, 3, 6, sig, true, false, 1.0f, "8 groups of 8, not renormalized"},
      {64, 1, 1, 4, soft, false, true, 1.0f, "one group: plain top-k of softmax scores"},
      {16, 16, 5, 5, sig, true, true, 1.0f, "one expert per group"},
      {160, 5, 5, 10, sig, false, true, 1.5f, "groups of 32 (lane walk), all kept, no bias"},
      {96, 3, 2, 3, soft, true, false, 1.0f, "softmax scores with a bias"},
      {256, 4, 2, 8, sig, true, true, 2.5f, "groups of 64 (warp walk)"},
      {512, 2, 1, 32, soft, true, true, 1.0f, "groups of 256, topk 32"},
      {512, 64, 8, 16, sig, true, true, 1.0f, "64 groups of 8 (two slots per lane)"},
  };
  Agreement agreement;
  int case_index = 0;
  for (const GroupedCase& c : cases) {
    for (Flavor flavor : {Flavor::random, Flavor::ties}) {
      const DType dtype = case_index % 2 ? DType::bf16 : DType::fp32;
      const uint32_t seed = static_cast<uint32_t>(300 + case_index++);
      SCOPED_TRACE(describe(c.what, c.E, c.topk, dtype, seed) +
                   (flavor == Flavor::ties ? " (tie-heavy)" : ""));
      std::mt19937 rng(seed);
      const int64_t M = 29;
      const OwnedTensor logits = make_logits(dtype, M, c.E, flavor, rng);
      const OwnedTensor bias = make_bias(c.E, flavor, rng);
      GroupedTopKParams params;
      params.num_groups = c.num_groups;
      params.topk_groups = c.topk_groups;
      params.scoring = c.scoring;
      params.renormalize = c.renormalize;
      params.routed_scaling_factor = c.scaling;
      compare_with_cpu(gpu, logits, c.bias ? bias.tensor() : Tensor(), c.topk,
                       case_index % 3 ? DType::int32 : DType::int64, grouped_route(c.topk, params),
                       &agreement);
    }
  }
  expect_mostly_bit_identical(agreement);
}

// ---- ties and non-finite logits -----------------------------------------------------------------

// Rows built to exercise the ranking rule: all equal (the k lowest indices win), +0 and -0
// only (they tie), NaNs (ranked last; the weights turn NaN), all -inf, one +inf, all NaN, and
// tie-heavy rows.
OwnedTensor special_logits(int64_t M, int64_t E, std::mt19937& rng) {
  OwnedTensor t = make_logits(DType::fp32, M, E, Flavor::ties, rng);
  float* x = t.data_ptr<float>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t e = 0; e < E; ++e) {
    x[0 * E + e] = 0.5f;
    x[1 * E + e] = e % 2 ? -0.0f : 0.0f;
    x[3 * E + e] = -INFINITY;
    x[5 * E + e] = nan;
  }
  for (int64_t e = 0; e < E; e += 3) x[2 * E + e] = e % 2 ? -nan : nan;
  x[4 * E + E / 2] = INFINITY;
  return t;
}

TEST(CudaRouter, TiesAndNonFiniteLogitsMatchCpu) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const int64_t M = 23;
  Agreement agreement;
  for (int64_t E : {32, 256}) {
    std::mt19937 rng(static_cast<uint32_t>(E));
    const OwnedTensor logits = special_logits(M, E, rng);
    const OwnedTensor bias = make_bias(E, Flavor::ties, rng);
    for (bool renormalize : {true, false}) {
      SCOPED_TRACE("softmax E=" + std::to_string(E) + (renormalize ? " renormalized" : ""));
      compare_with_cpu(gpu, logits, Tensor(), 8, DType::int32, softmax_route(8, renormalize),
                       &agreement);
    }
    for (ScoringFunc scoring : {ScoringFunc::sigmoid, ScoringFunc::softmax}) {
      SCOPED_TRACE(std::string("grouped ") +
                   (scoring == ScoringFunc::sigmoid ? "sigmoid" : "softmax") +
                   " E=" + std::to_string(E));
      GroupedTopKParams params;
      params.num_groups = 4;
      params.topk_groups = 2;
      params.scoring = scoring;
      compare_with_cpu(gpu, logits, bias, 6, DType::int64, grouped_route(6, params), &agreement);
    }
  }
}

// ---- strided views ------------------------------------------------------------------------------

// Logits as a column window of a wider buffer and as a transposed view; outputs with padded
// rows, whose padding must stay poisoned.
TEST(CudaRouter, StridedLogitsAndOutputsMatchCpu) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const int64_t M = 13, E = 64, topk = 4, pad = 3;
  std::mt19937 rng(55);
  const OwnedTensor wide = make_logits(DType::bf16, M, E + 5, Flavor::random, rng);
  const OwnedTensor transposed = make_logits(DType::fp32, E, M, Flavor::random, rng);
  const OwnedTensor bias = make_bias(E, Flavor::random, rng);
  const OwnedTensor wide_dev = gpu.to_device(wide);
  const OwnedTensor transposed_dev = gpu.to_device(transposed);
  const OwnedTensor bias_dev = gpu.to_device(bias);

  auto window = [&](const Tensor& buffer, Device device) {
    return Tensor(static_cast<uint16_t*>(buffer.data()) + 2, DType::bf16, {M, E}, {E + 5, 1},
                  device);
  };
  auto transpose = [&](const Tensor& buffer, Device device) {
    return Tensor(buffer.data(), DType::fp32, {M, E}, {1, M}, device);
  };
  auto padded = [&](const Tensor& buffer, DType dtype, Device device) {
    return Tensor(buffer.data(), dtype, {M, topk}, {topk + pad, 1}, device);
  };

  GroupedTopKParams params;
  params.num_groups = 8;
  params.topk_groups = 2;
  params.routed_scaling_factor = 2.5f;
  const RouteFn routes[] = {softmax_route(topk, true), grouped_route(topk, params)};
  Agreement agreement;
  for (int view = 0; view < 2; ++view) {
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE(std::string(view ? "transposed" : "window") + (r ? " grouped" : " softmax"));
      const Tensor logits_host =
          view ? transpose(transposed, Device::cpu()) : window(wide, Device::cpu());
      const Tensor logits_dev =
          view ? transpose(transposed_dev, Device::cuda(0)) : window(wide_dev, Device::cuda(0));
      OwnedTensor cpu_w = host_tensor(DType::fp32, {M, topk + pad});
      OwnedTensor cpu_ids = host_tensor(DType::int64, {M, topk + pad});
      poison(cpu_w, cpu_ids);
      routes[r](Context::cpu(), logits_host, bias, padded(cpu_w, DType::fp32, Device::cpu()),
                padded(cpu_ids, DType::int64, Device::cpu()));
      OwnedTensor init_w = host_tensor(DType::fp32, {M, topk + pad});
      OwnedTensor init_ids = host_tensor(DType::int64, {M, topk + pad});
      poison(init_w, init_ids);
      const OwnedTensor w_dev = gpu.to_device(init_w);
      const OwnedTensor ids_dev = gpu.to_device(init_ids);
      routes[r](gpu.ctx(), logits_dev, bias_dev, padded(w_dev, DType::fp32, Device::cuda(0)),
                padded(ids_dev, DType::int64, Device::cuda(0)));
      const OwnedTensor gpu_w = gpu.to_host(w_dev);
      const OwnedTensor gpu_ids = gpu.to_host(ids_dev);
      expect_same_routing(padded(cpu_w, DType::fp32, Device::cpu()),
                          padded(cpu_ids, DType::int64, Device::cpu()),
                          padded(gpu_w, DType::fp32, Device::cpu()),
                          padded(gpu_ids, DType::int64, Device::cpu()), &agreement);
      for (int64_t row = 0; row < M; ++row) {
        for (int64_t c = topk; c < topk + pad; ++c) {
          EXPECT_TRUE(std::isnan(gpu_w.data_ptr<float>()[row * (topk + pad) + c]))
              << "padding of row " << row << " was written";
          EXPECT_EQ(gpu_ids.data_ptr<int64_t>()[row * (topk + pad) + c], -1)
              << "padding of row " << row << " was written";
        }
      }
    }
  }
}

// ---- edges and errors ---------------------------------------------------------------------------

TEST(CudaRouter, EmptyBatchIsANoOp) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const OwnedTensor logits = gpu.empty(DType::fp32, {0, 64});
  const OwnedTensor weights = gpu.empty(DType::fp32, {0, 4});
  const OwnedTensor ids = gpu.empty(DType::int32, {0, 4});
  EXPECT_NO_THROW(softmax_topk(gpu.ctx(), logits, 4, true, weights, ids));
  EXPECT_NO_THROW(grouped_topk(gpu.ctx(), logits, Tensor(), 4, GroupedTopKParams{}, weights, ids));
  gpu.sync();
}

TEST(CudaRouter, RejectsHostTensorsAndUnsupportedSizes) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const Context& ctx = gpu.ctx();
  std::mt19937 rng(3);
  const OwnedTensor logits = make_logits(DType::fp32, 4, 8, Flavor::random, rng);
  const OwnedTensor bias = make_bias(8, Flavor::random, rng);
  const OwnedTensor logits_dev = gpu.to_device(logits);
  OwnedTensor init_w = host_tensor(DType::fp32, {4, 2});
  OwnedTensor init_ids = host_tensor(DType::int32, {4, 2});
  poison(init_w, init_ids);
  const OwnedTensor w_dev = gpu.to_device(init_w);
  const OwnedTensor ids_dev = gpu.to_device(init_ids);
  GroupedTopKParams params;
  params.num_groups = 2;
  params.topk_groups = 1;

  EXPECT_THAT(error_of([&] { softmax_topk(ctx, logits, 2, true, w_dev, ids_dev); }),
              HasSubstr("softmax_topk: logits must be on cuda:0, got fp32 (4, 8) on cpu"));
  EXPECT_THAT(error_of([&] { softmax_topk(ctx, logits_dev, 2, true, init_w, ids_dev); }),
              HasSubstr("softmax_topk: topk_weights must be on cuda:0, got fp32 (4, 2) on cpu"));
  EXPECT_THAT(error_of([&] { softmax_topk(ctx, logits_dev, 2, true, w_dev, init_ids); }),
              HasSubstr("softmax_topk: topk_ids must be on cuda:0, got int32 (4, 2) on cpu"));
  EXPECT_THAT(error_of([&] { grouped_topk(ctx, logits_dev, bias, 2, params, w_dev, ids_dev); }),
              HasSubstr("grouped_topk: correction_bias must be on cuda:0, got fp32 (8,) on cpu"));
  EXPECT_THAT(error_of([&] { softmax_topk(ctx, logits_dev, 9, true, w_dev, ids_dev); }),
              HasSubstr("softmax_topk: topk must be in [1, E=8], got 9"));

  const OwnedTensor wide_dev = gpu.empty(DType::fp32, {4, 520});
  EXPECT_THAT(error_of([&] { softmax_topk(ctx, wide_dev, 2, true, w_dev, ids_dev); }),
              HasSubstr("softmax_topk: the CUDA router supports E <= 512 experts"));
  const OwnedTensor many_dev = gpu.empty(DType::fp32, {4, 64});
  const OwnedTensor w33_dev = gpu.empty(DType::fp32, {4, 33});
  const OwnedTensor ids33_dev = gpu.empty(DType::int32, {4, 33});
  EXPECT_THAT(error_of([&] { softmax_topk(ctx, many_dev, 33, true, w33_dev, ids33_dev); }),
              HasSubstr("softmax_topk: the CUDA router supports topk <= 32, got 33"));
  GroupedTopKParams one_group;
  EXPECT_THAT(
      error_of([&] { grouped_topk(ctx, many_dev, Tensor(), 33, one_group, w33_dev, ids33_dev); }),
      HasSubstr("grouped_topk: the CUDA router supports topk <= 32, got 33"));

  // Nothing was written by any failed call.
  const OwnedTensor w_after = gpu.to_host(w_dev);
  const OwnedTensor ids_after = gpu.to_host(ids_dev);
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(std::isnan(w_after.data_ptr<float>()[i]));
    EXPECT_EQ(ids_after.data_ptr<int32_t>()[i], -1);
  }
}

}  // namespace
}  // namespace modmoe
