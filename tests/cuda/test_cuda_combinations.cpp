// The combinations test on the CUDA backend (cases: tests/combinations/cases.h): the same
// pairs x quantization configs x shapes as on the CPU; inputs move to the device, the forward
// runs on a stream, the output comes back and is held to the float64 oracle.
#include <gtest/gtest.h>

#include "combinations/cases.h"
#include "cuda/cuda_session.h"
#include "cuda/gpu_test.h"

namespace modmoe::combinations {
namespace {

class CudaCombinations : public ::testing::TestWithParam<Case> {};

TEST_P(CudaCombinations, MatchesOracleOrIsRefused) {
  MODMOE_REQUIRE_GPU();
  testing::CudaSession gpu;
  check_case(GetParam(), Device::cuda(0),
             [&](const ModularKernel& kernel, testing::Problem& p, int64_t chunk_size) {
               Context ctx = gpu.ctx();
               ctx.chunk_size = chunk_size;
               const ExpertWeights w = p.weights();
               auto dev = [&](const Tensor& t) {
                 return t.defined() ? gpu.to_device(t) : OwnedTensor();
               };
               OwnedTensor x = dev(p.hidden_states), tw = dev(p.topk_weights),
                           ids = dev(p.topk_ids), map = dev(p.expert_map), out = dev(p.output),
                           w13 = dev(w.w13), w2 = dev(w.w2), s13 = dev(w.w13_scale),
                           s2 = dev(w.w2_scale), a13 = dev(w.a13_scale), a2 = dev(w.a2_scale);
               ForwardArgs args;
               args.hidden_states = x;
               args.topk_weights = tw;
               args.topk_ids = ids;
               args.output = out;
               args.weights = {w13, w2, s13, s2, a13, a2};
               args.expert_map = map;
               kernel.forward(ctx, args);
               copy_tensor(ctx, p.output, out);  // waits for the stream
             });
}

INSTANTIATE_TEST_SUITE_P(AllPairs, CudaCombinations, ::testing::ValuesIn(all_cases()), case_name);

// On CUDA too, some pairs must compose and some must be refused.
TEST(CudaCombinationsCoverage, HasBothCompatibleAndIncompatiblePairs) {
  int ok = 0, refused = 0;
  for (const Case& c : all_cases()) {
    const bool compat = bool(check_compatibility(find_prepare_finalize(c.pf)->caps,
                                                 find_experts(c.experts)->caps,
                                                 make_spec(c).config, Backend::cuda));
    (compat ? ok : refused)++;
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace modmoe::combinations
