// What the validation tests share (test_validation_*.cpp): a small valid layer to break one
// argument of, and EXPECT macros that check a modmoe::Error's message.
//
// Every case starts from a valid input and breaks exactly one thing, so it can only pass because
// of the check it targets; the Valid* tests prove the unbroken inputs are accepted. Rejected
// forward calls must also leave `output` as it was: the checks run before any work.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "error_message.h"
#include "modmoe/error.h"
#include "modmoe/modular_kernel.h"
#include "modmoe/numeric.h"
#include "modmoe/registry.h"
#include "oracle/problem.h"

namespace modmoe::validation_test {

using ::testing::AllOf;
using ::testing::HasSubstr;
namespace mt = ::modmoe::testing;

inline constexpr const char* kStandardPF = "NoEPPrepareAndFinalize";
inline constexpr const char* kBatchedPF = "BatchedPrepareAndFinalize";
inline constexpr const char* kStandardExperts = "ReferenceExperts";
inline constexpr const char* kBatchedExperts = "BatchedReferenceExperts";

// Runs `f` and returns the message of the modmoe::Error it throws, or a marker no expected
// substring matches (so a negative matcher cannot pass on a call that threw nothing). Any other
// exception escapes and gtest fails the test with it.
template <typename F>
std::string error_message(F&& f) {
  const std::string message = mt::error_of(std::forward<F>(f));
  return message.empty() ? "<no modmoe::Error was thrown>" : message;
}

// EXPECT that `statement` throws modmoe::Error whose message contains every given matcher.
#define EXPECT_MODMOE_ERROR(statement, ...) \
  EXPECT_THAT(error_message([&] { statement; }), AllOf(__VA_ARGS__))

// A small layer (E = 4, K = 96, N = 40, topk = 2, bf16, SwiGLU): every shape in it differs, so a
// message that prints the wrong dimension cannot match by accident.
inline MoEConfig small_config(QuantConfig quant = {}) {
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

inline mt::ProblemSpec spec_for(const MoEConfig& config, int64_t M = 5, uint64_t seed = 7) {
  mt::ProblemSpec s;
  s.config = config;
  s.M = M;
  s.seed = seed;
  return s;
}

// Fills a host float tensor (contiguous) with N(0, 1) values from a fixed seed.
inline void fill_normal(const Tensor& t, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) store_float(t.data(), t.dtype(), i, dist(rng));
}

using ::modmoe::testing::bytes_of;

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

}  // namespace modmoe::validation_test
