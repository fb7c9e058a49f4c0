// Validation tests of the standalone ops: quantize_activations, softmax_topk and grouped_topk
// reject a bad argument with modmoe::Error whose message names the function, the argument, what
// was expected and what was given (ARCHITECTURE.md §4). Shared setup and the EXPECT macros:
// validation_helpers.h.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "modmoe/allocator.h"
#include "modmoe/error.h"
#include "modmoe/quant.h"
#include "modmoe/router.h"
#include "oracle/problem.h"
#include "validation_helpers.h"

namespace modmoe::validation_test {
namespace {

// ---- quantize_activations -----------------------------------------------------------------------

// x (5, 96) bf16 with N(0, 1) data, and q / scale laid out for `scheme`.
struct QuantInputs {
  explicit QuantInputs(QuantScheme scheme)
      : scheme(scheme),
        x(host_tensor(DType::bf16, {5, 96})),
        q(host_tensor(DType::fp8_e4m3, {5, 96})),
        scale(host_tensor(scale_dtype(scheme), act_scale_shape(scheme, 5, 96))) {
    fill_normal(x, 21);
    mt::poison(q);
    mt::poison(scale);
  }
  void run(const Tensor& xv, const Tensor& qv, const Tensor& sv, bool static_scale = false) const {
    quantize_activations(Context::cpu(), xv, scheme, static_scale, qv, sv);
  }
  QuantScheme scheme;
  OwnedTensor x, q, scale;
};

TEST(ValidationQuant, ValidInputsPass) {
  for (QuantScheme s : {QuantScheme::fp8_tensor, QuantScheme::fp8_token, QuantScheme::fp8_block,
                        QuantScheme::mxfp8}) {
    SCOPED_TRACE(quant_scheme_name(s));
    const QuantInputs in(s);
    EXPECT_NO_THROW(in.run(in.x, in.q, in.scale));
  }
  const QuantInputs in(QuantScheme::fp8_tensor);
  in.scale.data_ptr<float>()[0] = 0.01f;
  EXPECT_NO_THROW(in.run(in.x, in.q, in.scale, /*static_scale=*/true));
}

TEST(ValidationQuant, TokenScaleWrongShape) {
  const QuantInputs in(QuantScheme::fp8_token);
  const Tensor flat = in.scale.tensor().reshape({5});  // (M,) instead of (M, 1)
  EXPECT_MODMOE_ERROR(
      in.run(in.x, in.q, flat), HasSubstr("quantize_activations: scale must be fp32 (5, 1)"),
      HasSubstr("for fp8-token with (M, K) = (5, 96)"), HasSubstr("got fp32 (5,) on cpu"));
}

TEST(ValidationQuant, BlockScaleWrongShape) {
  const QuantInputs in(QuantScheme::fp8_block);
  // One scale per 32 columns (the MX layout) instead of per 128.
  const OwnedTensor mx_layout = host_tensor(DType::fp32, {5, 3});
  EXPECT_MODMOE_ERROR(
      in.run(in.x, in.q, mx_layout), HasSubstr("quantize_activations: scale must be fp32 (5, 1)"),
      HasSubstr("for fp8-block with (M, K) = (5, 96)"), HasSubstr("got fp32 (5, 3) on cpu"));
}

TEST(ValidationQuant, MxScaleFp32) {
  const QuantInputs in(QuantScheme::mxfp8);
  const OwnedTensor fp32_scale = host_tensor(DType::fp32, {5, 3});
  EXPECT_MODMOE_ERROR(in.run(in.x, in.q, fp32_scale),
                      HasSubstr("quantize_activations: scale must be e8m0 (5, 3)"),
                      HasSubstr("got fp32 (5, 3) on cpu"));
}

TEST(ValidationQuant, QWrongDType) {
  const QuantInputs in(QuantScheme::fp8_token);
  const Tensor as_int8(in.q.tensor().data(), DType::int8, {5, 96});
  EXPECT_MODMOE_ERROR(in.run(in.x, as_int8, in.scale),
                      HasSubstr("quantize_activations: q must be fp8_e4m3 (5, 96)"),
                      HasSubstr("got int8 (5, 96) on cpu"));
}

TEST(ValidationQuant, XIntegerDType) {
  const QuantInputs in(QuantScheme::fp8_token);
  const OwnedTensor ints = host_tensor(DType::int32, {5, 96});
  EXPECT_MODMOE_ERROR(in.run(ints, in.q, in.scale),
                      HasSubstr("quantize_activations: x must be bf16, fp16 or fp32"),
                      HasSubstr("got int32 (5, 96) on cpu"));
}

TEST(ValidationQuant, XOnCuda) {
  const QuantInputs in(QuantScheme::fp8_token);
  const Tensor on_cuda(in.x.tensor().data(), DType::bf16, {5, 96}, Device::cuda(0));
  EXPECT_MODMOE_ERROR(in.run(on_cuda, in.q, in.scale),
                      HasSubstr("quantize_activations: x must be on cpu"),
                      HasSubstr("got bf16 (5, 96) on cuda:0"));
}

TEST(ValidationQuant, StaticScaleWithBlockScheme) {
  const QuantInputs in(QuantScheme::fp8_block);
  EXPECT_MODMOE_ERROR(in.run(in.x, in.q, in.scale, /*static_scale=*/true),
                      HasSubstr("quantize_activations: static_scale is only supported with "
                                "fp8-tensor"),
                      HasSubstr("got fp8-block"));
}

TEST(ValidationQuant, StaticScaleNotPositive) {
  const QuantInputs in(QuantScheme::fp8_tensor);
  in.scale.data_ptr<float>()[0] = -2.0f;
  EXPECT_MODMOE_ERROR(in.run(in.x, in.q, in.scale, /*static_scale=*/true),
                      HasSubstr("quantize_activations: the static scale must be finite and > 0"),
                      HasSubstr("got -2"));
}

TEST(ValidationQuant, SchemeNone) {
  const QuantInputs in(QuantScheme::fp8_token);
  EXPECT_MODMOE_ERROR(
      quantize_activations(Context::cpu(), in.x, QuantScheme::none, false, in.q, in.scale),
      HasSubstr("quantize_activations: scheme must be one of fp8-tensor, fp8-token, fp8-block, "
                "mxfp8"),
      HasSubstr("got none"));
}

TEST(ValidationQuant, QOverlapsX) {
  // x as fp32 (5, 96) and q as the fp8 view of x's first bytes: in-place quantization would
  // read inputs it already overwrote.
  const OwnedTensor x = host_tensor(DType::fp32, {5, 96});
  fill_normal(x, 22);
  const Tensor q(x.tensor().data(), DType::fp8_e4m3, {5, 96});
  const OwnedTensor scale = host_tensor(DType::fp32, {5, 1});
  EXPECT_MODMOE_ERROR(
      quantize_activations(Context::cpu(), x, QuantScheme::fp8_token, false, q, scale),
      HasSubstr("quantize_activations: q must not overlap x"),
      HasSubstr("q fp8_e4m3 (5, 96) on cpu"), HasSubstr("x fp32 (5, 96) on cpu"));
}

// ---- softmax_topk / grouped_topk ----------------------------------------------------------------

// logits (5, E) fp32 with N(0, 1) data; outputs (5, topk) fp32 / int32.
struct RouterInputs {
  RouterInputs(int64_t E, int64_t topk)
      : logits(host_tensor(DType::fp32, {5, E})),
        weights(host_tensor(DType::fp32, {5, topk})),
        ids(host_tensor(DType::int32, {5, topk})) {
    fill_normal(logits, 31);
  }
  OwnedTensor logits, weights, ids;
};

TEST(ValidationRouter, ValidInputsPass) {
  const RouterInputs in(8, 2);
  EXPECT_NO_THROW(softmax_topk(Context::cpu(), in.logits, 2, true, in.weights, in.ids));
  GroupedTopKParams params;
  params.num_groups = 4;
  params.topk_groups = 2;
  EXPECT_NO_THROW(grouped_topk(Context::cpu(), in.logits, Tensor(), 2, params, in.weights, in.ids));
}

TEST(ValidationRouter, SoftmaxTopkGreaterThanNumExperts) {
  const RouterInputs in(4, 5);
  EXPECT_MODMOE_ERROR(softmax_topk(Context::cpu(), in.logits, 5, true, in.weights, in.ids),
                      HasSubstr("softmax_topk: topk must be in [1, E=4]"), HasSubstr("got 5"));
}

TEST(ValidationRouter, SoftmaxTopkZero) {
  const RouterInputs in(4, 0);
  EXPECT_MODMOE_ERROR(softmax_topk(Context::cpu(), in.logits, 0, true, in.weights, in.ids),
                      HasSubstr("softmax_topk: topk must be in [1, E=4]"), HasSubstr("got 0"));
}

TEST(ValidationRouter, SoftmaxIdsFloat) {
  const RouterInputs in(8, 2);
  const Tensor float_ids(in.ids.tensor().data(), DType::fp32, {5, 2});
  EXPECT_MODMOE_ERROR(softmax_topk(Context::cpu(), in.logits, 2, true, in.weights, float_ids),
                      HasSubstr("softmax_topk: topk_ids must be int32 or int64 (M, topk) = (5, 2)"),
                      HasSubstr("got fp32 (5, 2) on cpu"));
}

TEST(ValidationRouter, SoftmaxWeightsWrongShape) {
  const RouterInputs in(8, 2);
  const Tensor wide = in.weights.tensor().reshape({2, 5});
  EXPECT_MODMOE_ERROR(softmax_topk(Context::cpu(), in.logits, 2, true, wide, in.ids),
                      HasSubstr("softmax_topk: topk_weights must be fp32 (M, topk) = (5, 2)"),
                      HasSubstr("got fp32 (2, 5) on cpu"));
}

TEST(ValidationRouter, SoftmaxLogitsIntegerDType) {
  const RouterInputs in(8, 2);
  const OwnedTensor int_logits = host_tensor(DType::int32, {5, 8});
  EXPECT_MODMOE_ERROR(softmax_topk(Context::cpu(), int_logits, 2, true, in.weights, in.ids),
                      HasSubstr("softmax_topk: logits must be bf16, fp16 or fp32 (M, E)"),
                      HasSubstr("got int32 (5, 8) on cpu"));
}

TEST(ValidationRouter, GroupedExpertsNotDivisibleByGroups) {
  const RouterInputs in(8, 2);
  GroupedTopKParams params;
  params.num_groups = 3;
  params.topk_groups = 1;
  EXPECT_MODMOE_ERROR(
      grouped_topk(Context::cpu(), in.logits, Tensor(), 2, params, in.weights, in.ids),
      HasSubstr("grouped_topk: num_experts 8 must be divisible by num_groups 3"));
}

TEST(ValidationRouter, GroupedZeroGroups) {
  const RouterInputs in(8, 2);
  GroupedTopKParams params;
  params.num_groups = 0;
  EXPECT_MODMOE_ERROR(
      grouped_topk(Context::cpu(), in.logits, Tensor(), 2, params, in.weights, in.ids),
      HasSubstr("grouped_topk: num_groups must be >= 1"), HasSubstr("got 0"));
}

TEST(ValidationRouter, GroupedMoreKeptGroupsThanGroups) {
  const RouterInputs in(8, 2);
  GroupedTopKParams params;
  params.num_groups = 4;
  params.topk_groups = 5;
  EXPECT_MODMOE_ERROR(
      grouped_topk(Context::cpu(), in.logits, Tensor(), 2, params, in.weights, in.ids),
      HasSubstr("grouped_topk: topk_groups must be in [1, num_groups=4]"), HasSubstr("got 5"));
}

TEST(ValidationRouter, GroupedTopkMoreThanKeptExperts) {
  const RouterInputs in(8, 3);
  GroupedTopKParams params;
  params.num_groups = 4;   // groups of 2 experts
  params.topk_groups = 1;  // only 2 experts survive the group selection
  EXPECT_MODMOE_ERROR(
      grouped_topk(Context::cpu(), in.logits, Tensor(), 3, params, in.weights, in.ids),
      HasSubstr("grouped_topk: topk must be in [1, topk_groups * E / num_groups = 1 * 2 = 2]"),
      HasSubstr("got 3"));
}

TEST(ValidationRouter, GroupedBiasWrongLength) {
  const RouterInputs in(8, 2);
  const OwnedTensor bias = host_tensor(DType::fp32, {7});
  fill_normal(bias, 32);
  GroupedTopKParams params;
  params.num_groups = 4;
  params.topk_groups = 2;
  EXPECT_MODMOE_ERROR(grouped_topk(Context::cpu(), in.logits, bias, 2, params, in.weights, in.ids),
                      HasSubstr("grouped_topk: correction_bias must be fp32 (E,) = (8,)"),
                      HasSubstr("got fp32 (7,) on cpu"));
}

TEST(ValidationRouter, GroupedIdsWrongDType) {
  const RouterInputs in(8, 2);
  const OwnedTensor ids8 = host_tensor(DType::uint8, {5, 2});
  GroupedTopKParams params;
  params.num_groups = 4;
  params.topk_groups = 2;
  EXPECT_MODMOE_ERROR(
      grouped_topk(Context::cpu(), in.logits, Tensor(), 2, params, in.weights, ids8),
      HasSubstr("grouped_topk: topk_ids must be int32 or int64 (M, topk) = (5, 2)"),
      HasSubstr("got uint8 (5, 2) on cpu"));
}

}  // namespace
}  // namespace modmoe::validation_test
