// The case list of the combinations test (ggml's test-backend-ops, vLLM's
// test_modular_kernel_combinations), shared by the CPU suite (tests/cpu/test_combinations.cpp)
// and the GPU suite (tests/cuda/test_cuda_combinations.cpp): every registered
// (PrepareAndFinalize x Experts) pair x quantization configs x shapes, on one backend. Pairs
// that compose there must match the float64 oracle; pairs that don't must be refused by
// make_modular_kernel with the reason check_compatibility gives.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "modmoe/modmoe.h"
#include "oracle/oracle.h"
#include "oracle/problem.h"

namespace modmoe::combinations {

struct Shape5 {
  int64_t M, topk, E, K, N;
  int64_t chunk_size;  // Context::chunk_size; < M splits the tokens
  int64_t E_local;     // < E: an expert_map routes some pairs elsewhere
};

// Covers every value of every dimension the architecture page asks for (M in {1, 7, 64, 300},
// topk in {1, 2, 8}, E in {8, 64}, aligned and odd K/N, chunking, expert_map) without the full
// cartesian product, so the suite stays fast on two cores.
inline const std::vector<Shape5> kShapes = {
    {1, 1, 8, 128, 128, 0, 8},       {7, 2, 8, 256, 128, 0, 8},    {64, 8, 64, 128, 256, 0, 64},
    {300, 2, 8, 128, 128, 128, 8},   {64, 8, 8, 2880, 160, 0, 8},  {7, 1, 64, 200, 72, 0, 64},
    {300, 8, 64, 128, 128, 100, 64}, {64, 2, 64, 256, 128, 0, 24},
};

struct QuantCase {
  DType dtype;
  QuantConfig quant;
};
inline const std::vector<QuantCase> kQuantCases = {
    {DType::bf16, {QuantScheme::none, false}},      {DType::fp16, {QuantScheme::none, false}},
    {DType::fp32, {QuantScheme::none, false}},      {DType::bf16, {QuantScheme::fp8_tensor, false}},
    {DType::bf16, {QuantScheme::fp8_tensor, true}}, {DType::bf16, {QuantScheme::fp8_token, false}},
    {DType::bf16, {QuantScheme::fp8_block, false}}, {DType::bf16, {QuantScheme::mxfp8, false}},
};

inline const Activation kActivations[] = {Activation::silu,
                                          Activation::gelu,
                                          Activation::swigluoai,
                                          Activation::silu_no_mul,
                                          Activation::gelu_tanh,
                                          Activation::gelu_no_mul,
                                          Activation::swigluoai_no_mul,
                                          Activation::gelu_tanh_no_mul};
inline const GatedLayout kLayouts[] = {GatedLayout::GateUp, GatedLayout::UpGate,
                                       GatedLayout::Interleaved};

struct Case {
  std::string pf, experts;
  size_t shape, quant;
};

inline std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const auto& pf : prepare_finalize_registry())
    for (const auto& ex : experts_registry())
      for (size_t s = 0; s < kShapes.size(); ++s)
        for (size_t q = 0; q < kQuantCases.size(); ++q)
          cases.push_back({pf.caps.name, ex.caps.name, s, q});
  return cases;
}

inline double tolerance(const QuantCase& q) {
  if (q.quant.quantized()) return 3e-2;
  return q.dtype == DType::fp32 ? 1e-4 : 1e-2;
}

inline testing::ProblemSpec make_spec(const Case& c) {
  const Shape5& s = kShapes[c.shape];
  const QuantCase& q = kQuantCases[c.quant];
  testing::ProblemSpec spec;
  MoEConfig& cfg = spec.config;
  cfg.num_experts = s.E;
  cfg.num_local_experts = s.E_local;
  cfg.hidden_size = s.K;
  cfg.intermediate_size = s.N;
  cfg.topk = s.topk;
  cfg.in_dtype = q.dtype;
  cfg.quant = q.quant;
  // Each shape exercises a different activation and layout, so every one is covered.
  cfg.activation = kActivations[(c.shape + c.quant) % 8];
  cfg.gated_layout = kLayouts[(c.shape + c.quant) % 3];
  cfg.max_num_tokens = s.M;
  spec.M = s.M;
  spec.seed = 1000 + 17 * c.shape + c.quant;
  spec.int64_ids = (c.shape % 2) == 1;
  spec.use_expert_map = s.E_local < s.E;
  return spec;
}

inline void PrintTo(const Case& c, std::ostream* os) {
  *os << c.pf << " + " << c.experts << " shape " << c.shape << " quant " << c.quant;
}

inline std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string q = kQuantCases[c.quant].quant.str() + "_" + dtype_name(kQuantCases[c.quant].dtype);
  for (char& ch : q)
    if (ch == '-') ch = '_';
  auto short_name = [](std::string s) {
    for (const char* suffix : {"PrepareAndFinalize", "Experts"}) {
      const auto pos = s.find(suffix);
      if (pos != std::string::npos) s.erase(pos);
    }
    return s;
  };
  return short_name(c.pf) + "_" + short_name(c.experts) + "_shape" + std::to_string(c.shape) + "_" +
         q;
}

// Runs `kernel` on the problem with `chunk_size` and leaves the result in p.output (host).
using RunForward =
    std::function<void(const ModularKernel& kernel, testing::Problem& p, int64_t chunk_size)>;

// The whole check of one case on `device`.
inline void check_case(const Case& c, Device device, const RunForward& run) {
  const testing::ProblemSpec spec = make_spec(c);
  const MoEConfig& cfg = spec.config;
  // On the device: a Hopper-only part on another GPU must be refused, with the reason.
  const Compatibility compat = check_compatibility(find_prepare_finalize(c.pf)->caps,
                                                   find_experts(c.experts)->caps, cfg, device);
  if (!compat) {
    try {
      make_modular_kernel(c.pf, c.experts, cfg, device);
      FAIL() << "make_modular_kernel accepted an incompatible pair: " << compat.reason;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(compat.reason), std::string::npos)
          << "error '" << e.what() << "' does not carry the reason '" << compat.reason << "'";
    }
    return;
  }
  testing::Problem p = testing::make_problem(spec);
  const ModularKernel kernel = make_modular_kernel(c.pf, c.experts, cfg, device);
  const int64_t chunk_size = kShapes[c.shape].chunk_size;
  run(kernel, p, chunk_size);

  oracle::OracleInputs in = p.oracle_inputs();
  // Dynamic per-tensor scales of the intermediate are per Experts::apply call, i.e. per chunk.
  in.chunk_size = kernel.experts().supports_chunking() ? chunk_size : 0;
  const std::vector<double> ref = oracle::moe_forward(in);
  const oracle::ErrorReport err = oracle::compare(p.output, ref, p.topk_ids, p.expert_map);
  const double tol = tolerance(kQuantCases[c.quant]);
  EXPECT_TRUE(err.passed(tol)) << spec.str() << ": " << err.str() << " (tolerance " << tol << ")";
}

}  // namespace modmoe::combinations
