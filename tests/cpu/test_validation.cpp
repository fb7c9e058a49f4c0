// Validation tests: every public entry point rejects a bad argument with modmoe::Error, and the
// message names the function, the argument, what was expected and what was given
// (ARCHITECTURE.md §4).
//
// Every case starts from a valid input and breaks exactly one thing, so it can only pass because
// of the check it targets; the Valid* tests prove the unbroken inputs are accepted. Rejected
// forward calls must also leave `output` as it was: the checks run before any work.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/prepare_finalize.h"
#include "cpu/reference_experts.h"
#include "modmoe/allocator.h"
#include "modmoe/error.h"
#include "modmoe/modular_kernel.h"
#include "modmoe/numeric.h"
#include "modmoe/quant.h"
#include "modmoe/registry.h"
#include "modmoe/router.h"
#include "oracle/problem.h"

namespace modmoe {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
namespace mt = ::modmoe::testing;

constexpr const char* kStandardPF = "NoEPPrepareAndFinalize";
constexpr const char* kBatchedPF = "BatchedPrepareAndFinalize";
constexpr const char* kStandardExperts = "ReferenceExperts";
constexpr const char* kBatchedExperts = "BatchedReferenceExperts";

// ---- helpers ----------------------------------------------------------------------------------

// Runs `f` and returns the message of the modmoe::Error it throws, or a marker no expected
// substring matches. Any other exception escapes and gtest fails the test with it.
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no modmoe::Error was thrown>";
}

// EXPECT that `statement` throws modmoe::Error whose message contains every given matcher.
#define EXPECT_MODMOE_ERROR(statement, ...) \
  EXPECT_THAT(error_message([&] { statement; }), AllOf(__VA_ARGS__))

// A small layer (E = 4, K = 96, N = 40, topk = 2, bf16, SwiGLU): every shape in it differs, so a
// message that prints the wrong dimension cannot match by accident.
MoEConfig small_config(QuantConfig quant = {}) {
  MoEConfig c;
  c.num_experts = 4;
  c.num_local_experts = 4;
  c.hidden_size = 96;
  c.intermediate_size = 40;
  c.topk = 2;
  c.in_dtype = DType::bf16;
  c.quant = quant;
  c.activation = Activation::silu;
  return c;
}

mt::ProblemSpec spec_for(const MoEConfig& config, int64_t M = 5, uint64_t seed = 7) {
  mt::ProblemSpec s;
  s.config = config;
  s.M = M;
  s.seed = seed;
  return s;
}

// Fills a host float tensor (contiguous) with N(0, 1) values from a fixed seed.
void fill_normal(const Tensor& t, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) store_float(t.data(), t.dtype(), i, dist(rng));
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

// A random valid problem, the kernel for it and forward arguments viewing the problem's tensors.
// Tests break one field of `args` and call forward().
struct Layer {
  explicit Layer(const mt::ProblemSpec& spec, const char* pf = kStandardPF,
                 const char* experts = kStandardExperts)
      : problem(mt::make_problem(spec)),
        kernel(make_modular_kernel(pf, experts, problem.spec.config)) {
    args.hidden_states = problem.hidden_states;
    args.topk_weights = problem.topk_weights;
    args.topk_ids = problem.topk_ids;
    args.output = problem.output;
    args.weights = problem.weights();
    args.expert_map = problem.expert_map;
    args.apply_router_weight_on_input = spec.apply_router_weight_on_input;
    output_before = bytes_of(problem.output);
  }

  void forward() const { kernel.forward(Context::cpu(), args); }
  bool output_untouched() const { return bytes_of(problem.output) == output_before; }
  std::string str() const { return problem.spec.str(); }

  mt::Problem problem;
  ModularKernel kernel;
  ForwardArgs args;
  std::vector<uint8_t> output_before;
};

// EXPECT that forward rejects the layer's args with a ModularKernel::forward error containing
// the matchers, and that it wrote nothing to the output first.
#define EXPECT_FORWARD_ERROR(layer, ...)                                   \
  do {                                                                     \
    EXPECT_THAT(error_message([&] { (layer).forward(); }),                 \
                AllOf(HasSubstr("ModularKernel::forward: "), __VA_ARGS__)) \
        << (layer).str();                                                  \
    EXPECT_TRUE((layer).output_untouched())                                \
        << "forward wrote output before rejecting it; " << (layer).str();  \
  } while (0)

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

// ---- expert_map
// ----------------------------------------------------------------------------------

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

// ---- make_modular_kernel / check_compatibility
// ---------------------------------------------------

const PartCapabilities& pf_caps(const char* name) {
  const PrepareFinalizeEntry* entry = find_prepare_finalize(name);
  EXPECT_NE(entry, nullptr) << name << " is not registered";
  if (entry == nullptr) throw std::logic_error(std::string(name) + " is not registered");
  return entry->caps;
}

const PartCapabilities& experts_caps(const char* name) {
  const ExpertsEntry* entry = find_experts(name);
  EXPECT_NE(entry, nullptr) << name << " is not registered";
  if (entry == nullptr) throw std::logic_error(std::string(name) + " is not registered");
  return entry->caps;
}

TEST(ValidationRegistry, ValidPairsCompose) {
  MoEConfig config = small_config();
  config.max_num_tokens = 8;
  const Compatibility standard =
      check_compatibility(pf_caps(kStandardPF), experts_caps(kStandardExperts), config);
  EXPECT_TRUE(standard.ok) << standard.reason;
  const Compatibility batched =
      check_compatibility(pf_caps(kBatchedPF), experts_caps(kBatchedExperts), config);
  EXPECT_TRUE(batched.ok) << batched.reason;
  EXPECT_NO_THROW(make_modular_kernel(kStandardPF, "auto", config));
  EXPECT_NO_THROW(make_modular_kernel(kBatchedPF, "auto", config));
}

TEST(ValidationRegistry, UnknownPrepareFinalizeName) {
  EXPECT_MODMOE_ERROR(
      make_modular_kernel("NoSuchPrepareFinalize", kStandardExperts, small_config()),
      HasSubstr("make_modular_kernel: unknown PrepareAndFinalize"),
      HasSubstr("'NoSuchPrepareFinalize'"));
}

TEST(ValidationRegistry, UnknownExpertsName) {
  EXPECT_MODMOE_ERROR(make_modular_kernel(kStandardPF, "NoSuchExperts", small_config()),
                      HasSubstr("make_modular_kernel: unknown Experts"),
                      HasSubstr("'NoSuchExperts'"));
}

TEST(ValidationRegistry, IncompatibleActivationFormats) {
  MoEConfig config = small_config();
  config.max_num_tokens = 8;
  const Compatibility standard_to_batched =
      check_compatibility(pf_caps(kStandardPF), experts_caps(kBatchedExperts), config);
  EXPECT_FALSE(standard_to_batched.ok);
  EXPECT_THAT(standard_to_batched.reason,
              AllOf(HasSubstr("NoEPPrepareAndFinalize produces standard activations"),
                    HasSubstr("BatchedReferenceExperts expects batched")));
  const Compatibility batched_to_standard =
      check_compatibility(pf_caps(kBatchedPF), experts_caps(kStandardExperts), config);
  EXPECT_FALSE(batched_to_standard.ok);
  EXPECT_THAT(batched_to_standard.reason,
              AllOf(HasSubstr("BatchedPrepareAndFinalize produces batched activations"),
                    HasSubstr("ReferenceExperts expects standard")));
  EXPECT_MODMOE_ERROR(make_modular_kernel(kStandardPF, kBatchedExperts, config),
                      HasSubstr("make_modular_kernel: NoEPPrepareAndFinalize + "
                                "BatchedReferenceExperts do not compose"),
                      HasSubstr("produces standard activations but BatchedReferenceExperts "
                                "expects batched"));
}

TEST(ValidationRegistry, TopkGreaterThanNumExperts) {
  MoEConfig config = small_config();
  config.topk = 5;
  const Compatibility r =
      check_compatibility(pf_caps(kStandardPF), experts_caps(kStandardExperts), config);
  EXPECT_FALSE(r.ok);
  EXPECT_THAT(r.reason, HasSubstr("topk must be in [1, E=4], got 5"));
  EXPECT_MODMOE_ERROR(make_modular_kernel(kStandardPF, kStandardExperts, config),
                      HasSubstr("do not compose"), HasSubstr("topk must be in [1, E=4], got 5"));
}

TEST(ValidationRegistry, StaticScaleWithFp8Block) {
  const MoEConfig config = small_config({QuantScheme::fp8_block, true});
  EXPECT_THAT(check_config(config).reason,
              HasSubstr("static activation scales exist only for fp8-tensor, got "
                        "fp8-block-static"));
  EXPECT_MODMOE_ERROR(make_modular_kernel(kStandardPF, kStandardExperts, config),
                      HasSubstr("do not compose"),
                      HasSubstr("static activation scales exist only for fp8-tensor, got "
                                "fp8-block-static"));
}

TEST(ValidationRegistry, BatchedWithZeroMaxNumTokens) {
  MoEConfig config = small_config();
  config.max_num_tokens = 0;
  const Compatibility r =
      check_compatibility(pf_caps(kBatchedPF), experts_caps(kBatchedExperts), config);
  EXPECT_FALSE(r.ok);
  EXPECT_THAT(r.reason, AllOf(HasSubstr("BatchedPrepareAndFinalize is batched"),
                              HasSubstr("needs config.max_num_tokens > 0")));
  // "auto" lists why each candidate failed.
  EXPECT_MODMOE_ERROR(make_modular_kernel(kBatchedPF, "auto", config),
                      HasSubstr("make_modular_kernel: no registered Experts composes with "
                                "BatchedPrepareAndFinalize"),
                      HasSubstr("needs config.max_num_tokens > 0"));
}

TEST(ValidationRegistry, NegativeMaxNumTokens) {
  MoEConfig config = small_config();
  config.max_num_tokens = -1;
  EXPECT_THAT(check_config(config).reason, HasSubstr("max_num_tokens must be >= 0, got -1"));
}

TEST(ValidationRegistry, MoreLocalThanGlobalExperts) {
  MoEConfig config = small_config();
  config.num_local_experts = 5;
  EXPECT_MODMOE_ERROR(make_modular_kernel(kStandardPF, kStandardExperts, config),
                      HasSubstr("do not compose"),
                      HasSubstr("num_local_experts must be in [1, num_experts=4], got 5"));
}

TEST(ValidationRegistry, UnsupportedInputDType) {
  MoEConfig config = small_config();
  config.in_dtype = DType::fp64;
  EXPECT_THAT(check_config(config).reason,
              HasSubstr("in_dtype must be bf16, fp16 or fp32, got fp64"));
}

TEST(ValidationRegistry, ZeroHiddenSize) {
  MoEConfig config = small_config();
  config.hidden_size = 0;
  EXPECT_THAT(check_config(config).reason, HasSubstr("hidden_size K must be > 0, got 0"));
}

// ---- ModularKernel constructor and the batched P/F built directly
// ----------------------------------

TEST(ValidationKernel, PartsBuiltForDifferentLayers) {
  MoEConfig other = small_config();
  other.hidden_size = 128;
  EXPECT_MODMOE_ERROR(ModularKernel(std::make_shared<cpu::NoEPPrepareAndFinalize>(small_config()),
                                    std::make_shared<cpu::ReferenceExperts>(other)),
                      HasSubstr("ModularKernel: the parts were built for different layers"),
                      HasSubstr("NoEPPrepareAndFinalize [E=4 K=96"),
                      HasSubstr("ReferenceExperts [E=4 K=128"));
}

TEST(ValidationKernel, MismatchedFormats) {
  MoEConfig config = small_config();
  config.max_num_tokens = 8;
  EXPECT_MODMOE_ERROR(ModularKernel(std::make_shared<cpu::NoEPPrepareAndFinalize>(config),
                                    std::make_shared<cpu::BatchedReferenceExperts>(config)),
                      HasSubstr("ModularKernel: NoEPPrepareAndFinalize produces standard"),
                      HasSubstr("BatchedReferenceExperts expects batched"));
}

TEST(ValidationKernel, NullParts) {
  const MoEConfig config = small_config();
  EXPECT_MODMOE_ERROR(ModularKernel(nullptr, std::make_shared<cpu::ReferenceExperts>(config)),
                      HasSubstr("ModularKernel: prepare_finalize must not be null"));
  EXPECT_MODMOE_ERROR(ModularKernel(std::make_shared<cpu::NoEPPrepareAndFinalize>(config), nullptr),
                      HasSubstr("ModularKernel: experts must not be null"));
}

TEST(ValidationKernel, BatchedPrepareFinalizeNeedsMaxNumTokens) {
  MoEConfig config = small_config();
  config.max_num_tokens = 0;
  EXPECT_MODMOE_ERROR(cpu::BatchedPrepareAndFinalize{config},
                      HasSubstr("BatchedPrepareAndFinalize: config.max_num_tokens must be > 0"),
                      HasSubstr("got 0"));
}

// ---- quantize_activations
// ------------------------------------------------------------------------

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

// ---- softmax_topk / grouped_topk
// -----------------------------------------------------------------

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
}  // namespace modmoe
