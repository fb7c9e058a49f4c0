// Sm90Experts with the top-k weight and reduce folded into GEMM2's epilogue (float atomics):
// the same results as the oracle, the deterministic-context guard, and the smaller workspace.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
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
  testing::ProblemSpec spec;
  MoEConfig& cfg = spec.config;
  cfg.num_experts = 16;
  cfg.num_local_experts = c.expert_map ? 8 : 16;
  cfg.hidden_size = 256;
  cfg.intermediate_size = 256;
  cfg.topk = c.router_weight_on_input ? 1 : 4;
  cfg.in_dtype = DType::bf16;
  cfg.quant.scheme = c.scheme;
  spec.M = 93;
  spec.seed = 9100 + static_cast<uint64_t>(c.scheme) * 7 + c.expert_map;
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
  // workspace13 holds GEMM2's output: (M, K) fp32 token rows instead of (M * topk, K).
  EXPECT_EQ(shape_numel(wd.workspace13) - shape_numel(wf.workspace13),
            (cfg.topk - 1) * M * K * int64_t(sizeof(float)));

  try {
    forward_on_gpu(s, p, std::make_shared<cuda::Sm90Experts>(cfg, true),
                   s.ctx());  // deterministic by default
    FAIL() << "a deterministic forward must refuse the folded reduce";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("Context::deterministic = false"));
  }
}

}  // namespace
}  // namespace modmoe
