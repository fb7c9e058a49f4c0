// Validation tests of ModularKernel::forward: every argument it is given is checked, and a bad
// one is rejected with modmoe::Error whose message names the function, the argument, what was
// expected and what was given (ARCHITECTURE.md §4), before anything is written to `output`.
// The ValidationValid tests prove the unbroken inputs are accepted. Shared setup and the EXPECT
// macros: validation_helpers.h.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "modmoe/allocator.h"
#include "modmoe/error.h"
#include "modmoe/modular_kernel.h"
#include "modmoe/numeric.h"
#include "modmoe/registry.h"
#include "oracle/problem.h"
#include "validation_helpers.h"

namespace modmoe::validation_test {
namespace {

// ---- ModularKernel::forward: hidden_states -----------------------------------------------------

TEST(ValidationForward, HiddenStatesUndefined) {
  Layer layer(spec_for(small_config()));
  layer.args.hidden_states = Tensor();
  EXPECT_FORWARD_ERROR(layer, HasSubstr("hidden_states must be 2-D (M, K)"),
                       HasSubstr("got undefined"));
}

TEST(ValidationForward, HiddenStatesWrongRank) {
  Layer layer(spec_for(small_config()));
  layer.args.hidden_states =
      Tensor(layer.problem.hidden_states.tensor().data(), DType::bf16, {1, 5, 96});
  EXPECT_FORWARD_ERROR(layer, HasSubstr("hidden_states must be 2-D (M, K)"),
                       HasSubstr("got bf16 (1, 5, 96) on cpu"));
}

TEST(ValidationForward, HiddenStatesWrongDType) {
  Layer layer(spec_for(small_config()));
  layer.args.hidden_states =
      Tensor(layer.problem.hidden_states.tensor().data(), DType::fp16, {5, 96});
  EXPECT_FORWARD_ERROR(layer, HasSubstr("hidden_states must be bf16 (M, K) = (5, 96)"),
                       HasSubstr("got fp16 (5, 96) on cpu"));
}

TEST(ValidationForward, HiddenStatesWrongHiddenSize) {
  Layer layer(spec_for(small_config()));
  layer.args.hidden_states =
      Tensor(layer.problem.hidden_states.tensor().data(), DType::bf16, {5, 64});
  EXPECT_FORWARD_ERROR(layer, HasSubstr("hidden_states must be bf16 (M, K) = (5, 96)"),
                       HasSubstr("got bf16 (5, 64) on cpu"));
}

TEST(ValidationForward, HiddenStatesNonContiguous) {
  Layer layer(spec_for(small_config()));
  // Every other 96-element block of a (5, 192) buffer: a valid strided view, not row-major.
  const OwnedTensor storage = host_tensor(DType::bf16, {5, 192});
  fill_normal(storage, 11);
  layer.args.hidden_states =
      Tensor(storage.tensor().data(), DType::bf16, {5, 96}, {192, 1}, Device::cpu());
  EXPECT_FORWARD_ERROR(layer, HasSubstr("hidden_states must be contiguous (row-major)"),
                       HasSubstr("got strides (192, 1) for shape (5, 96)"));
}

TEST(ValidationForward, HiddenStatesTransposedView) {
  Layer layer(spec_for(small_config()));
  // (5, 96) with column-major strides: same bytes count, wrong layout.
  layer.args.hidden_states = Tensor(layer.problem.hidden_states.tensor().data(), DType::bf16,
                                    {5, 96}, {1, 5}, Device::cpu());
  EXPECT_FORWARD_ERROR(layer, HasSubstr("hidden_states must be contiguous (row-major)"),
                       HasSubstr("got strides (1, 5) for shape (5, 96)"));
}

TEST(ValidationForward, HiddenStatesOnCudaDevice) {
  Layer layer(spec_for(small_config()));
  // Host memory labelled cuda:0: the device check must reject it before anything reads it.
  layer.args.hidden_states =
      Tensor(layer.problem.hidden_states.tensor().data(), DType::bf16, {5, 96}, Device::cuda(0));
  EXPECT_FORWARD_ERROR(layer, HasSubstr("hidden_states must be on cpu"),
                       HasSubstr("got bf16 (5, 96) on cuda:0"));
}

TEST(ValidationForward, TopkIdsOnCudaDeviceAreNotRead) {
  Layer layer(spec_for(small_config()));
  // Out-of-range ids behind a cuda label: were the values read before the device was checked,
  // the message would be the range error instead.
  int32_t* ids = layer.problem.topk_ids.data_ptr<int32_t>();
  for (int64_t i = 0; i < 10; ++i) ids[i] = 1000 + static_cast<int32_t>(i);
  layer.args.topk_ids = Tensor(ids, DType::int32, {5, 2}, Device::cuda(0));
  EXPECT_FORWARD_ERROR(layer, HasSubstr("topk_ids must be on cpu"),
                       HasSubstr("got int32 (5, 2) on cuda:0"));
}

Tensor on_cuda(const Tensor& t) {
  return t.defined() ? Tensor(t.data(), t.dtype(), t.shape(), Device::cuda(0)) : t;
}

// A kernel of CPU parts called with a CUDA context (and every tensor labelled cuda:0, so the
// per-tensor device checks agree with the context) must refuse before any part reads the
// tensors: forward skips the host-side topk_ids range check for device contexts, so a CPU part
// that went ahead would index with unchecked ids (and, with real device pointers, dereference
// device memory). Valid ids here, so the test is safe whatever the outcome. The shared-experts
// hook runs right after prepare: if it ran, prepare already went through the tensors.
TEST(ValidationForward, CpuKernelRejectsCudaContextBeforePrepare) {
  MoEConfig config = small_config();
  config.max_num_tokens = 8;
  const std::pair<const char*, const char*> pairs[] = {{kStandardPF, kStandardExperts},
                                                       {kBatchedPF, kBatchedExperts}};
  for (const auto& [pf, experts] : pairs) {
    SCOPED_TRACE(std::string(pf) + " + " + experts);
    const mt::Problem problem = mt::make_problem(spec_for(config));
    bool shared_experts_ran = false;
    const ModularKernel kernel =
        make_modular_kernel(pf, experts, problem.spec.config,
                            [&](const Context&, const Tensor&) { shared_experts_ran = true; });
    ForwardArgs args;
    args.hidden_states = on_cuda(problem.hidden_states);
    args.topk_weights = on_cuda(problem.topk_weights);
    args.topk_ids = on_cuda(problem.topk_ids);
    args.output = on_cuda(problem.output);
    args.weights.w13 = on_cuda(problem.w13);
    args.weights.w2 = on_cuda(problem.w2);
    Context ctx;
    ctx.device = Device::cuda(0);
    ctx.allocator = host_allocator();  // so the failure is not merely "no allocator for cuda"
    const std::vector<uint8_t> output_before = bytes_of(problem.output);
    EXPECT_MODMOE_ERROR(kernel.forward(ctx, args), HasSubstr("ctx.device"), HasSubstr("cpu"),
                        HasSubstr("cuda:0"));
    EXPECT_FALSE(shared_experts_ran) << "prepare ran on tensors of a cuda context";
    EXPECT_EQ(bytes_of(problem.output), output_before);
  }
}

// ---- output ------------------------------------------------------------------------------------

TEST(ValidationForward, OutputWrongShape) {
  Layer layer(spec_for(small_config()));
  layer.args.output = Tensor(layer.problem.output.tensor().data(), DType::bf16, {4, 96});
  EXPECT_FORWARD_ERROR(layer, HasSubstr("output must be bf16 (M, K) = (5, 96)"),
                       HasSubstr("got bf16 (4, 96) on cpu"));
}

TEST(ValidationForward, OutputUndefined) {
  Layer layer(spec_for(small_config()));
  layer.args.output = Tensor();
  EXPECT_FORWARD_ERROR(layer, HasSubstr("output must be bf16 (M, K) = (5, 96)"),
                       HasSubstr("got undefined"));
}

TEST(ValidationForward, OutputPartiallyOverlapsHiddenStates) {
  Layer layer(spec_for(small_config()));
  // hidden_states = rows [0, 5), output = rows [1, 6) of one (6, 96) buffer: writing output row
  // t would clobber hidden_states row t + 1 before it is read.
  const OwnedTensor storage = host_tensor(DType::bf16, {6, 96});
  fill_normal(storage, 12);
  layer.args.hidden_states = storage.tensor().slice(0, 5);
  layer.args.output = storage.tensor().slice(1, 6);
  const std::vector<uint8_t> before = bytes_of(storage);
  EXPECT_MODMOE_ERROR(layer.forward(), HasSubstr("ModularKernel::forward: output must be"),
                      HasSubstr("hidden_states itself (in place) or not overlap it"));
  EXPECT_EQ(bytes_of(storage), before) << "forward wrote into the overlapping buffer";
}

// ---- routing -----------------------------------------------------------------------------------

TEST(ValidationForward, TopkWeightsWrongDType) {
  Layer layer(spec_for(small_config()));
  layer.args.topk_weights = Tensor(layer.problem.topk_weights.tensor().data(), DType::bf16, {5, 2});
  EXPECT_FORWARD_ERROR(layer, HasSubstr("topk_weights must be fp32 (M, topk) = (5, 2)"),
                       HasSubstr("got bf16 (5, 2) on cpu"));
}

TEST(ValidationForward, TopkWeightsWrongShape) {
  Layer layer(spec_for(small_config()));
  layer.args.topk_weights = layer.problem.topk_weights.tensor().reshape({10});
  EXPECT_FORWARD_ERROR(layer, HasSubstr("topk_weights must be fp32 (M, topk) = (5, 2)"),
                       HasSubstr("got fp32 (10,) on cpu"));
}

TEST(ValidationForward, TopkIdsFloat) {
  Layer layer(spec_for(small_config()));
  layer.args.topk_ids = Tensor(layer.problem.topk_ids.tensor().data(), DType::fp32, {5, 2});
  EXPECT_FORWARD_ERROR(layer, HasSubstr("topk_ids must be int32 or int64 (M, topk) = (5, 2)"),
                       HasSubstr("got fp32 (5, 2) on cpu"));
}

TEST(ValidationForward, TopkIdsWrongShape) {
  Layer layer(spec_for(small_config()));
  layer.args.topk_ids = layer.problem.topk_ids.tensor().reshape({2, 5});
  EXPECT_FORWARD_ERROR(layer, HasSubstr("topk_ids must be int32 or int64 (M, topk) = (5, 2)"),
                       HasSubstr("got int32 (2, 5) on cpu"));
}

TEST(ValidationForward, TopkIdEqualToNumExperts) {
  Layer layer(spec_for(small_config()));
  layer.problem.topk_ids.data_ptr<int32_t>()[3 * 2 + 1] = 4;  // token 3, k 1: E itself
  EXPECT_FORWARD_ERROR(layer, HasSubstr("topk_ids must be in [0, E=4)"),
                       HasSubstr("got 4 at (token 3, k 1)"));
}

TEST(ValidationForward, TopkIdNegativeInt64) {
  mt::ProblemSpec spec = spec_for(small_config());
  spec.int64_ids = true;
  Layer layer(spec);
  layer.problem.topk_ids.data_ptr<int64_t>()[4 * 2 + 0] = -1;  // token 4, k 0
  EXPECT_FORWARD_ERROR(layer, HasSubstr("topk_ids must be in [0, E=4)"),
                       HasSubstr("got -1 at (token 4, k 0)"));
}

TEST(ValidationForward, ApplyRouterWeightOnInputNeedsTopkOne) {
  Layer layer(spec_for(small_config()));  // topk = 2
  layer.args.apply_router_weight_on_input = true;
  EXPECT_FORWARD_ERROR(layer, HasSubstr("apply_router_weight_on_input requires topk == 1"),
                       HasSubstr("got topk = 2"));
}

// ---- expert weights ----------------------------------------------------------------------------

TEST(ValidationForward, W13HasNRowsForGatedActivation) {
  Layer layer(spec_for(small_config()));
  // SwiGLU needs [gate; up] = 2N rows; (E, N, K) is what a _no_mul layer would pass.
  layer.args.weights.w13 = Tensor(layer.problem.w13.tensor().data(), DType::bf16, {4, 40, 96});
  EXPECT_FORWARD_ERROR(layer, HasSubstr("w13 must be bf16 (E_local, 2N, K) = (4, 80, 96)"),
                       HasSubstr("got bf16 (4, 40, 96) on cpu"));
}

TEST(ValidationForward, W13Has2NRowsForNoMulActivation) {
  MoEConfig config = small_config();
  config.activation = Activation::silu_no_mul;
  Layer layer(spec_for(config));
  const OwnedTensor gated_w13 = host_tensor(DType::bf16, {4, 80, 96});
  fill_normal(gated_w13, 13);
  layer.args.weights.w13 = gated_w13;
  EXPECT_FORWARD_ERROR(layer, HasSubstr("w13 must be bf16 (E_local, N, K) = (4, 40, 96)"),
                       HasSubstr("got bf16 (4, 80, 96) on cpu"));
}

TEST(ValidationForward, W2Transposed) {
  Layer layer(spec_for(small_config()));
  layer.args.weights.w2 = Tensor(layer.problem.w2.tensor().data(), DType::bf16, {4, 40, 96});
  EXPECT_FORWARD_ERROR(layer, HasSubstr("w2 must be bf16 (E_local, K, N) = (4, 96, 40)"),
                       HasSubstr("got bf16 (4, 40, 96) on cpu"));
}

TEST(ValidationForward, W13WrongDTypeForFp8Scheme) {
  Layer layer(spec_for(small_config({QuantScheme::fp8_token, false})));
  // The same bytes read as e5m2: an fp8 weight of the wrong format.
  layer.args.weights.w13 = Tensor(layer.problem.w13.tensor().data(), DType::fp8_e5m2, {4, 80, 96});
  EXPECT_FORWARD_ERROR(layer, HasSubstr("w13 must be fp8_e4m3 (E_local, 2N, K) = (4, 80, 96)"),
                       HasSubstr("got fp8_e5m2 (4, 80, 96) on cpu"));
}

TEST(ValidationForward, UnquantizedW2ForFp8Scheme) {
  Layer layer(spec_for(small_config({QuantScheme::fp8_tensor, false})));
  const OwnedTensor bf16_w2 = host_tensor(DType::bf16, {4, 96, 40});
  fill_normal(bf16_w2, 14);
  layer.args.weights.w2 = bf16_w2;
  EXPECT_FORWARD_ERROR(layer, HasSubstr("w2 must be fp8_e4m3 (E_local, K, N) = (4, 96, 40)"),
                       HasSubstr("got bf16 (4, 96, 40) on cpu"));
}

TEST(ValidationForward, W13ScaleWrongShapeForFp8Block) {
  MoEConfig config = small_config({QuantScheme::fp8_block, false});
  config.hidden_size = 256;        // 2 blocks along K
  config.intermediate_size = 192;  // 2N = 384: 3 blocks along w13's rows
  Layer layer(spec_for(config, 3));
  // (E, K blocks, N blocks) instead of (E, N blocks, K blocks): same element count.
  layer.args.weights.w13_scale =
      Tensor(layer.problem.w13_scale.tensor().data(), DType::fp32, {4, 2, 3});
  EXPECT_FORWARD_ERROR(layer, HasSubstr("w13_scale must be fp32 (4, 3, 2)"),
                       HasSubstr("got fp32 (4, 2, 3) on cpu"));
}

TEST(ValidationForward, W2ScaleMissing) {
  Layer layer(spec_for(small_config({QuantScheme::fp8_tensor, false})));
  layer.args.weights.w2_scale = Tensor();
  EXPECT_FORWARD_ERROR(layer, HasSubstr("w2_scale must be fp32 (4,)"), HasSubstr("got undefined"));
}

TEST(ValidationForward, MxScaleAsFp32InsteadOfE8m0) {
  Layer layer(spec_for(small_config({QuantScheme::mxfp8, false})));
  // The decoded scales as fp32: right shape, right values, wrong dtype.
  const Tensor& e8m0 = layer.problem.w13_scale.tensor();
  const OwnedTensor decoded = host_tensor(DType::fp32, e8m0.shape());
  for (int64_t i = 0; i < e8m0.numel(); ++i)
    decoded.data_ptr<float>()[i] = load_float(e8m0.data(), DType::e8m0, i);
  layer.args.weights.w13_scale = decoded;
  EXPECT_FORWARD_ERROR(layer, HasSubstr("w13_scale must be e8m0 (4, 80, 3)"),
                       HasSubstr("got fp32 (4, 80, 3) on cpu"));
}

TEST(ValidationForward, StaticSchemeWithoutA13Scale) {
  Layer layer(spec_for(small_config({QuantScheme::fp8_tensor, true})));
  layer.args.weights.a13_scale = Tensor();
  EXPECT_FORWARD_ERROR(layer, HasSubstr("a13_scale must be fp32 (static per-tensor) = (1,)"),
                       HasSubstr("got undefined"));
}

TEST(ValidationForward, StaticScaleNotPositiveFinite) {
  struct Case {
    const char* arg;
    float value;
    const char* printed;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const Case cases[] = {{"a13_scale", 0.0f, "got 0"},
                        {"a13_scale", -0.5f, "got -0.5"},
                        {"a2_scale", NAN, "got nan"},
                        {"a2_scale", inf, "got inf"},
                        {"a2_scale", -0.0f, "got -0"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.arg) + " = " + c.printed);
    Layer layer(spec_for(small_config({QuantScheme::fp8_tensor, true})));
    const bool a13 = std::string(c.arg) == "a13_scale";
    OwnedTensor& scale = a13 ? layer.problem.a13_scale : layer.problem.a2_scale;
    scale.data_ptr<float>()[0] = c.value;
    EXPECT_FORWARD_ERROR(layer, HasSubstr(std::string(c.arg) + " must be a positive finite scale"),
                         HasSubstr(c.printed));
  }
}

// ---- expert_map ---------------------------------------------------------------------------------

// E = 8 global experts, 4 of them local, routed through an expert map.
mt::ProblemSpec expert_map_spec() {
  MoEConfig config = small_config();
  config.num_experts = 8;
  config.num_local_experts = 4;
  mt::ProblemSpec spec = spec_for(config);
  spec.use_expert_map = true;
  return spec;
}

TEST(ValidationForward, ExpertMapWrongLength) {
  Layer layer(expert_map_spec());
  layer.args.expert_map = layer.problem.expert_map.tensor().slice(0, 7);
  EXPECT_FORWARD_ERROR(layer, HasSubstr("expert_map must be int32 (E) = (8,)"),
                       HasSubstr("got int32 (7,) on cpu"));
}

TEST(ValidationForward, ExpertMapWrongDType) {
  Layer layer(expert_map_spec());
  const OwnedTensor map64 = host_tensor(DType::int64, {8});
  for (int64_t g = 0; g < 8; ++g)
    map64.data_ptr<int64_t>()[g] = layer.problem.expert_map.data_ptr<int32_t>()[g];
  layer.args.expert_map = map64;
  EXPECT_FORWARD_ERROR(layer, HasSubstr("expert_map must be int32 (E) = (8,)"),
                       HasSubstr("got int64 (8,) on cpu"));
}

TEST(ValidationForward, ExpertMapValueOutOfRange) {
  for (int32_t bad : {4, -2}) {  // E_local = 4; -1 is the only legal negative value
    SCOPED_TRACE("expert_map[5] = " + std::to_string(bad));
    Layer layer(expert_map_spec());
    layer.problem.expert_map.data_ptr<int32_t>()[5] = bad;
    EXPECT_FORWARD_ERROR(layer,
                         HasSubstr("expert_map values must be -1 or a local expert in [0, 4)"),
                         HasSubstr("got expert_map[5] = " + std::to_string(bad)));
  }
}

TEST(ValidationForward, LocalSubsetWithoutExpertMap) {
  Layer layer(expert_map_spec());
  layer.args.expert_map = Tensor();
  EXPECT_FORWARD_ERROR(layer, HasSubstr("expert_map is required"),
                       HasSubstr("(E_local = 4, E = 8)"));
}

// ---- batched prepare ---------------------------------------------------------------------------

TEST(ValidationForward, BatchedPrepareRejectsMoreTokensThanMaxNumTokens) {
  MoEConfig config = small_config();
  config.max_num_tokens = 4;
  Layer layer(spec_for(config, /*M=*/5), kBatchedPF, kBatchedExperts);
  EXPECT_MODMOE_ERROR(layer.forward(), HasSubstr("BatchedPrepareAndFinalize::prepare: "),
                      HasSubstr("M = 5 tokens exceed max_num_tokens_per_rank = 4"));
  EXPECT_TRUE(layer.output_untouched());
}

// ---- good input passes -------------------------------------------------------------------------

bool all_finite(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(load_float(t.data(), t.dtype(), i))) return false;
  return true;
}

TEST(ValidationValid, ForwardAcceptsValidProblems) {
  struct Case {
    const char* name;
    mt::ProblemSpec spec;
    const char* pf;
    const char* experts;
  };
  MoEConfig block = small_config({QuantScheme::fp8_block, false});
  block.hidden_size = 256;
  block.intermediate_size = 192;
  MoEConfig no_mul = small_config({QuantScheme::fp8_token, false});
  no_mul.activation = Activation::silu_no_mul;
  MoEConfig batched = small_config();
  batched.max_num_tokens = 5;
  MoEConfig topk1 = small_config();
  topk1.topk = 1;
  mt::ProblemSpec int64_ids = spec_for(small_config({QuantScheme::mxfp8, false}));
  int64_ids.int64_ids = true;
  mt::ProblemSpec on_input = spec_for(topk1);
  on_input.apply_router_weight_on_input = true;

  const std::vector<Case> cases = {
      {"bf16", spec_for(small_config()), kStandardPF, kStandardExperts},
      {"fp8-tensor-static", spec_for(small_config({QuantScheme::fp8_tensor, true})), kStandardPF,
       kStandardExperts},
      {"fp8-block", spec_for(block, 3), kStandardPF, kStandardExperts},
      {"fp8-token no_mul", spec_for(no_mul), kStandardPF, kStandardExperts},
      {"mxfp8 int64 ids", int64_ids, kStandardPF, kStandardExperts},
      {"expert_map", expert_map_spec(), kStandardPF, kStandardExperts},
      {"router weight on input", on_input, kStandardPF, kStandardExperts},
      {"batched, M == max_num_tokens", spec_for(batched), kBatchedPF, kBatchedExperts},
      {"M = 0", spec_for(small_config(), 0), kStandardPF, kStandardExperts},
  };
  for (const Case& c : cases) {
    Layer layer(c.spec, c.pf, c.experts);
    SCOPED_TRACE(std::string(c.name) + ": " + layer.str());
    EXPECT_NO_THROW(layer.forward());
    EXPECT_TRUE(all_finite(layer.problem.output)) << "output keeps NaN poison or overflowed";
  }
}

TEST(ValidationValid, ForwardAcceptsInPlaceOutput) {
  Layer layer(spec_for(small_config()));
  layer.args.output = layer.args.hidden_states;
  EXPECT_NO_THROW(layer.forward()) << layer.str();
  EXPECT_TRUE(all_finite(layer.problem.hidden_states));
}

}  // namespace
}  // namespace modmoe::validation_test
