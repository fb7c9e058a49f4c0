// The combinations test on the CPU backend (cases: tests/combinations/cases.h).
#include <gtest/gtest.h>

#include "combinations/cases.h"

namespace modmoe::combinations {
namespace {

class Combinations : public ::testing::TestWithParam<Case> {};

TEST_P(Combinations, MatchesOracleOrIsRefused) {
  check_case(GetParam(), Device::cpu(),
             [](const ModularKernel& kernel, testing::Problem& p, int64_t chunk_size) {
               Context ctx = Context::cpu();
               ctx.chunk_size = chunk_size;
               kernel.forward(ctx, p.forward_args());
             });
}

INSTANTIATE_TEST_SUITE_P(AllPairs, Combinations, ::testing::ValuesIn(all_cases()), case_name);

// The registry must hold at least one compatible and one incompatible pair on the CPU, or the
// test above would prove nothing about one of its two branches.
TEST(CombinationsCoverage, HasBothCompatibleAndIncompatiblePairs) {
  int ok = 0, refused = 0;
  for (const Case& c : all_cases()) {
    const bool compat = bool(check_compatibility(find_prepare_finalize(c.pf)->caps,
                                                 find_experts(c.experts)->caps,
                                                 make_spec(c).config, Backend::cpu));
    (compat ? ok : refused)++;
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace modmoe::combinations
