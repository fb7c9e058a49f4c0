// Random MoE problems for the tests and tools: inputs, routing, expert weights (quantized per
// the scheme) and a NaN-poisoned output, all on the host and all determined by the seed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "modmoe/allocator.h"
#include "modmoe/modular_kernel.h"
#include "modmoe/moe_types.h"
#include "oracle/oracle.h"

namespace modmoe {
namespace testing {

struct ProblemSpec {
  MoEConfig config;  // E, E_local (0: = E), K, N, topk, in_dtype, quant, activation, layout
  int64_t M = 1;
  uint64_t seed = 1;
  bool int64_ids = false;
  bool use_expert_map = false;  // then config.num_local_experts <= num_experts; local experts
                                // are a random subset, numbered in random order
  bool apply_router_weight_on_input = false;  // requires topk == 1

  std::string str() const;  // "M=7 seed=3 E=64 K=256 ..." for failure messages
};

struct Problem {
  ProblemSpec spec;  // as given, with config.num_local_experts filled in
  // hidden_states (M, K) in_dtype, pre-rounded through the scheme's activation quantization;
  // topk_weights fp32 (M, topk); topk_ids int32/int64 (M, topk); expert_map int32 (E) or
  // undefined; output (M, K) in_dtype, NaN-poisoned.
  OwnedTensor hidden_states, topk_weights, topk_ids, expert_map, output;
  // w13 (E_local, 2N or N, K), w2 (E_local, K, N): in_dtype, or e4m3 codes with scales
  // (weight_scale_shape) for quantized schemes; a13/a2_scale fp32 (1) for static schemes.
  OwnedTensor w13, w2, w13_scale, w2_scale, a13_scale, a2_scale;

  ExpertWeights weights() const;  // views
  // ModularKernel::forward arguments over these (host) tensors, writing into `output`.
  ForwardArgs forward_args() const;
  oracle::OracleInputs oracle_inputs() const;
};

// Data: x ~ N(0,1); weights ~ N(0,1)/sqrt(fan_in), so the output is O(1); topk ids distinct
// within a row, uniform over the E global experts; topk weights a softmax of N(0,1) logits
// (positive, summing to 1 per row) — except with apply_router_weight_on_input, where they are
// uniform in [0.25, 1) (Llama-4-style sigmoid scores: with topk == 1 a normalized weight
// would always be 1 and hide a missing multiplication).
// Quantized schemes: fp32 weights go through modmoe::quantize_weights; hidden states are drawn
// in fp32 and pre-rounded (quantize_activations + dequantize_activations into in_dtype) so
// the experts' own input quantization is (nearly) exact. Static schemes get
// a13_scale = amax(x)/448 and a2_scale = oracle::intermediate_amax(...)/448.
Problem make_problem(const ProblemSpec& spec);

// A spec for an unquantized-or-`scheme` layer with every expert local and
// max_num_tokens = M (so batched P/Fs take the whole batch).
ProblemSpec simple_spec(int64_t M, int64_t topk, int64_t E, int64_t K, int64_t N,
                        DType dtype = DType::fp32, QuantScheme scheme = QuantScheme::none,
                        uint64_t seed = 7);

// Fills a host tensor of a float, fp8 or e8m0 dtype with NaN (fp8: 0x7f, e8m0: 0xff).
void poison(const Tensor& t);

// The bytes of a contiguous host tensor: for the bitwise checks (the same output two ways, an
// output a rejected call left untouched).
std::vector<uint8_t> bytes_of(const Tensor& t);

// The last two dims of a contiguous fp32 host tensor swapped (2-D or 3-D): K-major fp8 block
// scales, a_scale (rows, K/128) and b_scale (E, nb, kb), turned into the MN-major layouts.
OwnedTensor transpose_last_two(const Tensor& t);

}  // namespace testing
}  // namespace modmoe
