// Sm90Experts with the top-k weight and reduce folded into GEMM2's epilogue (float atomics):
// the same results as the oracle, the deterministic-context guard, and the smaller workspace.
// Sm90Experts with fp8 block scales and K, N not multiples of 128 (partial last scale groups,
// as gpt-oss-120b's 2880 has): the same results as the oracle in every gated layout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <ostream>
#include <string>

#include "cuda/cuda_prepare_finalize.h"
#include "cuda/cuda_session.h"
#include "cuda/gpu_forward.h"
#include "cuda/gpu_test.h"
#include "cuda/sm90/sm90_experts.h"
#include "cuda/sm90_test_util.h"
#include "modmoe/modmoe.h"
#include "oracle/oracle.h"
#include "oracle/problem.h"

namespace modmoe {
namespace {

using testing::CudaSession;
using testing::forward_on_gpu;

struct FoldCase {
  QuantScheme scheme;
  bool expert_map;
  bool router_weight_on_input;
};

class Sm90ReduceInGemm2 : public ::testing::TestWithParam<FoldCase> {};

testing::ProblemSpec fold_spec(const FoldCase& c) {
  testing::ProblemSpec spec =
      testing::simple_spec(93, c.router_weight_on_input ? 1 : 4, 16, 256, 256, DType::bf16,
                           c.scheme, 9100 + static_cast<uint64_t>(c.scheme) * 7 + c.expert_map);
  spec.config.num_local_experts = c.expert_map ? 8 : 16;
  spec.use_expert_map = c.expert_map;
  spec.apply_router_weight_on_input = c.router_weight_on_input;
  return spec;
}

TEST_P(Sm90ReduceInGemm2, MatchesTheOracle) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  MODMOE_REQUIRE_SM90(s);
  const FoldCase& c = GetParam();
  const testing::Problem p = testing::make_problem(fold_spec(c));
  Context ctx = s.ctx();
  ctx.deterministic = false;
  const OwnedTensor out = forward_on_gpu(
      s, p, std::make_shared<cuda::Sm90Experts>(p.spec.config, /*reduce_in_gemm2=*/true), ctx);
  const oracle::ErrorReport err =
      oracle::compare(out, oracle::moe_forward(p.oracle_inputs()), p.topk_ids, p.expert_map);
  const double tol = c.scheme == QuantScheme::none ? 1e-2 : 3e-2;
  EXPECT_TRUE(err.passed(tol)) << p.spec.str() << ": " << err.str();
}

INSTANTIATE_TEST_SUITE_P(Cases, Sm90ReduceInGemm2,
                         ::testing::Values(FoldCase{QuantScheme::none, false, false},
                                           FoldCase{QuantScheme::fp8_block, false, false},
                                           FoldCase{QuantScheme::none, true, false},
                                           FoldCase{QuantScheme::none, false, true}));

TEST(Sm90ReduceInGemm2Guard, NeedsANonDeterministicContextAndHoldsNoPairsByKBuffer) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  MODMOE_REQUIRE_SM90(s);
  const testing::Problem p = testing::make_problem(fold_spec({QuantScheme::none, false, false}));
  const MoEConfig& cfg = p.spec.config;
  const cuda::Sm90Experts folded(cfg, true), fixed_order(cfg, false);
  const int64_t M = p.spec.M, K = cfg.hidden_size;
  const WorkspaceShapes wf = folded.workspace_shapes(
      M, cfg.intermediate_size, K, cfg.topk, cfg.num_experts, cfg.num_local_experts, nullptr);
  const WorkspaceShapes wd = fixed_order.workspace_shapes(
      M, cfg.intermediate_size, K, cfg.topk, cfg.num_experts, cfg.num_local_experts, nullptr);
  // workspace13 holds GEMM2's output: (M, K) fp32 token rows (the epilogue's atomics add into
  // fp32) instead of the fixed order's (M * topk, K) bf16 rows.
  EXPECT_EQ(shape_numel(wd.workspace13) - shape_numel(wf.workspace13),
            cfg.topk * M * K * int64_t(sizeof(uint16_t)) - M * K * int64_t(sizeof(float)));

  try {
    forward_on_gpu(s, p, std::make_shared<cuda::Sm90Experts>(cfg, true),
                   s.ctx());  // deterministic by default
    FAIL() << "a deterministic forward must refuse the folded reduce";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("Context::deterministic = false"));
  }
}

// ---- fp8 block scales, K and N not multiples of 128 ----------------------------------------

struct UnalignedCase {
  GatedLayout layout;
  int64_t M;
  std::string name() const {
    return std::string(gated_layout_name(layout)) + "_M" + std::to_string(M);
  }
};
void PrintTo(const UnalignedCase& c, std::ostream* os) { *os << c.name(); }

class Sm90ExpertsUnaligned : public ::testing::TestWithParam<UnalignedCase> {};

// K = 320 = 2.5 * 128 and N = 192 = 1.5 * 128: GEMM1's last K block and GEMM2's last K block
// are partial (TMA zero fill, the last scale group of a row partial), the fp8 intermediate's
// last quantization group is 64 columns, and GateUp/UpGate's up (gate) rows start 64 rows into
// a 128-row weight-scale block: at M = 1024 GEMM1 runs the 128x256 kernel whose halves read a
// weight scale per 64 rows (kSplitScales; Interleaved too), at M = 96 the 64x256 tile. The output is NaN-poisoned (make_problem), inputs random, never zeros.
TEST_P(Sm90ExpertsUnaligned, Fp8BlockMatchesTheOracle) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  MODMOE_REQUIRE_SM90(s);
  const UnalignedCase& c = GetParam();
  testing::ProblemSpec spec = testing::simple_spec(
      c.M, 4, 16, 320, 192, DType::bf16, QuantScheme::fp8_block,
      9300 + static_cast<uint64_t>(c.layout) * 11 + static_cast<uint64_t>(c.M));
  MoEConfig& cfg = spec.config;
  cfg.gated_layout = c.layout;
  cfg.activation = c.layout == GatedLayout::Interleaved ? Activation::swigluoai : Activation::silu;
  ASSERT_EQ(cuda::sm90_experts_unsupported(cfg), "");
  const testing::Problem p = testing::make_problem(spec);
  auto experts = std::make_shared<cuda::Sm90Experts>(p.spec.config);
  // The Hopper kernels, not the portable pipeline of decode-sized applies.
  ASSERT_FALSE(experts->runs_portable(c.M))
      << "max_portable_tokens " << experts->max_portable_tokens();
  const OwnedTensor out = forward_on_gpu(s, p, experts, s.ctx());
  const oracle::ErrorReport err =
      oracle::compare(out, oracle::moe_forward(p.oracle_inputs()), p.topk_ids, p.expert_map);
  EXPECT_TRUE(err.passed(3e-2)) << p.spec.str() << ": " << err.str();
}

INSTANTIATE_TEST_SUITE_P(K320N192, Sm90ExpertsUnaligned,
                         ::testing::Values(UnalignedCase{GatedLayout::GateUp, 96},
                                           UnalignedCase{GatedLayout::GateUp, 1024},
                                           UnalignedCase{GatedLayout::UpGate, 96},
                                           UnalignedCase{GatedLayout::UpGate, 1024},
                                           UnalignedCase{GatedLayout::Interleaved, 96},
                                           UnalignedCase{GatedLayout::Interleaved, 1024}),
                         [](const ::testing::TestParamInfo<UnalignedCase>& info) {
                           return info.param.name();
                         });

// ---- fp8 block input quantized by the experts (expects_unquantized_input) -------------------

struct DeferCase {
  int64_t M;
  int topk;
  bool expert_map;
  bool router_weight_on_input;
  std::string name() const {
    return "M" + std::to_string(M) + "_topk" + std::to_string(topk) + (expert_map ? "_map" : "") +
           (router_weight_on_input ? "_weight_on_input" : "");
  }
};
void PrintTo(const DeferCase& c, std::ostream* os) { *os << c.name(); }

class Sm90ExpertsQuantizeInput : public ::testing::TestWithParam<DeferCase> {};

// The NoEP prepare leaves fp8-block rows unquantized for Sm90Experts, which quantizes each
// token once while it writes the token's rows by expert (quantize_scatter_rows), or hands them
// to CudaExperts' decode path, whose gate_up quantizes them. The output must be the same bytes
// as with rows the prepare quantized, on every route: M = 1 (the decode path), 16 (the Hopper
// kernels at ~1 row per expert), 300
// (several row blocks per expert), with an expert map (pairs of no local expert: row_of_pair
// -1, rows the scatter never writes), and with the router weight applied to the input.
TEST_P(Sm90ExpertsQuantizeInput, SameBytesAsRowsThePrepareQuantized) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  MODMOE_REQUIRE_SM90(s);
  const DeferCase& c = GetParam();
  testing::ProblemSpec spec =
      testing::simple_spec(c.M, c.topk, 16, 384, 256, DType::bf16, QuantScheme::fp8_block,
                           9500 + static_cast<uint64_t>(c.M) * 3 + c.topk + 17 * c.expert_map);
  spec.config.num_local_experts = c.expert_map ? 8 : 16;
  spec.use_expert_map = c.expert_map;
  spec.apply_router_weight_on_input = c.router_weight_on_input;
  const testing::Problem p = testing::make_problem(spec);
  const MoEConfig& cfg = p.spec.config;
  auto experts = std::make_shared<cuda::Sm90Experts>(cfg);
  ASSERT_TRUE(experts->expects_unquantized_input());
  const OwnedTensor deferred = forward_on_gpu(s, p, experts, s.ctx());
  const OwnedTensor quantized =
      forward_on_gpu(s, p, experts, s.ctx(), std::make_shared<testing::QuantizingNoEP>(cfg));
  ASSERT_EQ(deferred.tensor().nbytes(), quantized.tensor().nbytes());
  EXPECT_EQ(std::memcmp(deferred.tensor().data(), quantized.tensor().data(),
                        deferred.tensor().nbytes()),
            0)
      << p.spec.str() << " (route " << experts->route(c.M) << ")";
  const oracle::ErrorReport err =
      oracle::compare(deferred, oracle::moe_forward(p.oracle_inputs()), p.topk_ids, p.expert_map);
  EXPECT_TRUE(err.passed(3e-2)) << p.spec.str() << ": " << err.str();
}

INSTANTIATE_TEST_SUITE_P(Routes, Sm90ExpertsQuantizeInput,
                         ::testing::Values(DeferCase{1, 4, false, false},
                                           DeferCase{16, 4, false, false},
                                           DeferCase{300, 4, false, false},
                                           DeferCase{300, 4, true, false},
                                           DeferCase{40, 1, false, true}),
                         [](const ::testing::TestParamInfo<DeferCase>& info) {
                           return info.param.name();
                         });

// A prepare that defers gives the experts bf16 rows and no scales; apply() refuses scales with
// them (they would be silently ignored) and names the argument.
TEST(Sm90ExpertsQuantizeInputGuard, UnquantizedRowsWithScalesAreRefused) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  MODMOE_REQUIRE_SM90(s);
  const testing::Problem p = testing::make_problem(
      testing::simple_spec(8, 2, 16, 256, 128, DType::bf16, QuantScheme::fp8_block, 9601));
  const MoEConfig& cfg = p.spec.config;
  cuda::Sm90Experts experts(cfg);
  const int64_t M = 8, K = cfg.hidden_size;
  const WorkspaceShapes w = experts.workspace_shapes(M, cfg.intermediate_size, K, cfg.topk,
                                                     cfg.num_experts, cfg.num_local_experts,
                                                     nullptr);
  OwnedTensor hidden = s.to_device(p.hidden_states), ids = s.to_device(p.topk_ids),
              weights = s.to_device(p.topk_weights), out = s.to_device(p.output),
              w13 = s.to_device(p.w13), w2 = s.to_device(p.w2), w13s = s.to_device(p.w13_scale),
              w2s = s.to_device(p.w2_scale);
  OwnedTensor scale = s.empty(DType::fp32, act_scale_shape(QuantScheme::fp8_block, M, K));
  OwnedTensor ws13 = s.empty(w.workspace_dtype, w.workspace13),
              ws2 = s.empty(w.workspace_dtype, w.workspace2);
  ExpertWeights ew;
  ew.w13 = w13, ew.w2 = w2, ew.w13_scale = w13s, ew.w2_scale = w2s;
  ApplyArgs a;
  a.output = out;
  a.hidden_states = hidden;  // bf16
  a.a1q_scale = scale;       // but with scales
  a.weights = &ew;
  a.topk_weights = weights;
  a.topk_ids = ids;
  a.global_num_experts = cfg.num_experts;
  a.workspace13 = ws13;
  a.workspace2 = ws2;
  try {
    experts.apply(s.ctx(), a);
    FAIL() << "bf16 rows with a1q_scale must be refused";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("a1q_scale must be undefined"));
  }
}

}  // namespace
}  // namespace modmoe
