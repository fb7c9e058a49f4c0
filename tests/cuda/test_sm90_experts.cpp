// Sm90Experts with the top-k weight and reduce folded into GEMM2's epilogue (float atomics):
// the same results as the oracle, the deterministic-context guard, and the smaller workspace.
// Sm90Experts with fp8 block scales and K, N not multiples of 128 (partial last scale groups,
// as gpt-oss-120b's 2880 has): the same results as the oracle in every gated layout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace modmoe
