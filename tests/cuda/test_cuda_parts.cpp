// The CUDA parts: NoEPPrepareAndFinalize, BatchedPrepareAndFinalize, CudaExperts and
// BatchedCudaExperts.
//   prepare   the batched prepare moves exactly the rows and scale rows the NoEP prepare
//             quantized, in token order, with the right counts (and equals the CPU prepare
//             when nothing is quantized)
//   pairs     NoEP + CudaExperts and Batched + BatchedCudaExperts through ModularKernel::forward
//             against the float64 oracle: every quant scheme, activation and layout, expert_map,
//             chunking, apply_router_weight_on_input, M = 1 and 300, E = 8 and 64, fused and
//             unfused gated paths, int32/int64 ids; NaN-poisoned outputs; a second forward
//             reproduces every bit
//   experts   tokens with no local expert get zeros, in-place output, BatchedCudaExperts never
//             reads nor writes rows past expert_num_tokens, registry and argument checks
// Tolerances (relative L2, whole output and per expert): bf16/fp16 1e-2, fp8 3e-2 (the CPU
// suite's). There is no fp32 case: CudaExperts takes bf16/fp16 inputs only.
// MODMOE_TEST_VERBOSE=1 prints every pair case's error.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cpu/prepare_finalize.h"
#include "cuda/cuda_experts.h"
#include "cuda/cuda_prepare_finalize.h"
#include "cuda/cuda_session.h"
#include "cuda/gpu_test.h"
#include "cuda/sm90/sm90_experts.h"
#include "modmoe/modmoe.h"
#include "modmoe/numeric.h"
#include "oracle/oracle.h"
#include "oracle/problem.h"

namespace modmoe {
namespace {

using ::modmoe::testing::bytes_of;
using ::modmoe::testing::CudaSession;
using ::modmoe::testing::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Fills device memory with 0xff bytes: NaN for bf16/fp16/fp32/e4m3/e8m0, -1 for int32.
void poison_device(const CudaSession& s, const Tensor& t) {
  ASSERT_EQ(cudaMemsetAsync(t.data(), 0xff, t.nbytes(), s.stream()), cudaSuccess);
}

OwnedTensor device_or_empty(const CudaSession& s, const OwnedTensor& host) {
  return host.tensor().defined() ? s.to_device(host) : OwnedTensor();
}

// ---- prepare --------------------------------------------------------------------------------

TEST(CudaBatched, PrepareScattersTheNoEPRowsInTokenOrder) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  const QuantConfig quants[] = {{QuantScheme::none, false},      {QuantScheme::fp8_tensor, false},
                                {QuantScheme::fp8_tensor, true}, {QuantScheme::fp8_token, false},
                                {QuantScheme::fp8_block, false}, {QuantScheme::mxfp8, false}};
  int index = 0;
  for (const QuantConfig& quant : quants) {
    testing::ProblemSpec spec;
    MoEConfig& cfg = spec.config;
    cfg.num_experts = 64;
    cfg.num_local_experts = index % 2 ? 24 : 64;
    cfg.hidden_size = 384;
    cfg.intermediate_size = 64;
    cfg.topk = 4;
    cfg.in_dtype = DType::bf16;
    cfg.quant = quant;
    cfg.max_num_tokens = 100;
    spec.M = 77;
    spec.seed = 40 + index;
    spec.use_expert_map = cfg.num_local_experts < cfg.num_experts;
    spec.int64_ids = index % 3 == 0;
    spec.apply_router_weight_on_input = false;
    ++index;
    const testing::Problem p = testing::make_problem(spec);
    const MoEConfig& c = p.spec.config;

    const OwnedTensor x = s.to_device(p.hidden_states), ids = s.to_device(p.topk_ids),
                      w = s.to_device(p.topk_weights), map = device_or_empty(s, p.expert_map),
                      a13 = device_or_empty(s, p.a13_scale);
    ExpertWeights weights;
    weights.a13_scale = a13;
    PrepareArgs args;
    args.a1 = x;
    args.topk_weights = w;
    args.topk_ids = ids;
    args.num_experts = c.num_experts;
    args.expert_map = map;
    args.weights = &weights;
    cuda::NoEPPrepareAndFinalize noep(c);
    cuda::BatchedPrepareAndFinalize batched(c);
    const PrepareResult flat = noep.prepare(s.ctx(), args);
    const PrepareResult scattered = batched.prepare(s.ctx(), args);
    ASSERT_TRUE(scattered.expert_tokens_meta.has_value());
    EXPECT_FALSE(scattered.expert_tokens_meta->expert_num_tokens_cpu.defined());

    const OwnedTensor q = s.to_host(flat.a1q), bq = s.to_host(scattered.a1q);
    const OwnedTensor counts = s.to_host(scattered.expert_tokens_meta->expert_num_tokens);
    const bool per_row = flat.a1q_scale.defined() && flat.a1q_scale.ndim() == 2;
    OwnedTensor scale, bscale;
    if (per_row) {
      scale = s.to_host(flat.a1q_scale);
      bscale = s.to_host(scattered.a1q_scale);
    } else if (flat.a1q_scale.defined()) {
      EXPECT_EQ(bytes_of(s.to_host(scattered.a1q_scale)), bytes_of(s.to_host(flat.a1q_scale)));
    }
    const std::string what = spec.str();
    const int64_t T = c.max_num_tokens, K = c.hidden_size;
    const size_t row_bytes = K * dtype_size(q.tensor().dtype());
    std::vector<int32_t> n(c.num_local_experts, 0);
    const int32_t* map_ptr =
        p.expert_map.tensor().defined() ? p.expert_map.data_ptr<int32_t>() : nullptr;
    for (int64_t pair = 0; pair < spec.M * c.topk; ++pair) {
      const int64_t g = load_index(p.topk_ids.tensor().data(), p.topk_ids.tensor().dtype(), pair);
      const int64_t e = map_ptr ? map_ptr[g] : g;
      if (e < 0) continue;
      const int64_t t = pair / c.topk, slot = n[e]++;
      ASSERT_EQ(
          std::memcmp(static_cast<const char*>(bq.tensor().data()) + (e * T + slot) * row_bytes,
                      static_cast<const char*>(q.tensor().data()) + t * row_bytes, row_bytes),
          0)
          << what << ": pair " << pair;
      if (per_row) {
        const size_t srow = scale.tensor().size(1) * dtype_size(scale.tensor().dtype());
        ASSERT_EQ(
            std::memcmp(static_cast<const char*>(bscale.tensor().data()) + (e * T + slot) * srow,
                        static_cast<const char*>(scale.tensor().data()) + t * srow, srow),
            0)
            << what << ": scales of pair " << pair;
      }
    }
    EXPECT_EQ(std::vector<int32_t>(counts.data_ptr<int32_t>(),
                                   counts.data_ptr<int32_t>() + c.num_local_experts),
              n)
        << what;
    if (!quant.quantized()) {
      // Unquantized, the CPU prepare is the same data movement: compare its valid rows too.
      cpu::BatchedPrepareAndFinalize cpu_pf(c);
      PrepareArgs host_args = args;
      host_args.a1 = p.hidden_states;
      host_args.topk_weights = p.topk_weights;
      host_args.topk_ids = p.topk_ids;
      host_args.expert_map = p.expert_map;
      const PrepareResult ref = cpu_pf.prepare(Context::cpu(), host_args);
      for (int64_t e = 0; e < c.num_local_experts; ++e)
        ASSERT_EQ(std::memcmp(static_cast<const char*>(bq.tensor().data()) + e * T * row_bytes,
                              static_cast<const char*>(ref.a1q.data()) + e * T * row_bytes,
                              n[e] * row_bytes),
                  0)
            << what << ": expert " << e;
    }
  }
}

// ---- CudaExperts / BatchedCudaExperts through ModularKernel::forward --------------------------

struct PairCase {
  bool batched;
  DType dtype;
  QuantConfig quant;
  Activation activation;
  GatedLayout layout;
  int64_t M, topk, E, E_local, K, N;
  int64_t chunk;  // Context::chunk_size (standard only); 0 = no limit
  bool router_weight_on_input = false;
  bool fused = true;  // gated activation in GEMM1's epilogue
  bool int64_ids = false;
};

std::string pair_case_name(const ::testing::TestParamInfo<PairCase>& info) {
  const PairCase& c = info.param;
  std::string n =
      std::string(c.batched ? "Batched_" : "Std_") + dtype_name(c.dtype) + "_" + c.quant.str() +
      "_" + activation_name(c.activation) + "_" + gated_layout_name(c.layout) + "_M" +
      std::to_string(c.M) + "_k" + std::to_string(c.topk) + "_E" + std::to_string(c.E) + "_" +
      std::to_string(c.E_local) + "_K" + std::to_string(c.K) + "_N" + std::to_string(c.N);
  if (c.chunk) n += "_chunk" + std::to_string(c.chunk);
  if (c.router_weight_on_input) n += "_routerw";
  if (!c.fused) n += "_unfused";
  if (c.int64_ids) n += "_ids64";
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return std::to_string(info.index) + "_" + n;
}

std::vector<PairCase> pair_cases() {
  const QuantConfig none{QuantScheme::none, false}, tensor{QuantScheme::fp8_tensor, false},
      tensor_static{QuantScheme::fp8_tensor, true}, token{QuantScheme::fp8_token, false},
      block{QuantScheme::fp8_block, false}, mx{QuantScheme::mxfp8, false};
  using A = Activation;
  using L = GatedLayout;
  std::vector<PairCase> cases;
  for (bool batched : {false, true}) {
    const int64_t chunk = batched ? 0 : 128;  // standard: 300 tokens in chunks of 128, 128, 44
    // Every scheme, at M = 1 and M = 300, E = 8 and 64, every activation and layout.
    cases.push_back(
        {batched, DType::bf16, none, A::silu, L::GateUp, 300, 2, 8, 8, 256, 128, chunk});
    cases.push_back({batched, DType::fp16, none, A::gelu, L::UpGate, 1, 8, 64, 64, 128, 256, 0});
    cases.push_back({batched, DType::bf16, tensor, A::swigluoai, L::Interleaved, 300, 8, 64, 64,
                     128, 128, chunk});
    cases.push_back(
        {batched, DType::bf16, tensor_static, A::gelu_tanh, L::GateUp, 300, 2, 8, 8, 256, 160, 0});
    cases.push_back({batched, DType::bf16, token, A::silu_no_mul, L::GateUp, 300, 4, 64, 24, 128,
                     128, chunk, false, true, true});
    cases.push_back({batched, DType::bf16, block, A::silu, L::UpGate, 1, 1, 8, 8, 384, 160, 0});
    cases.push_back(
        {batched, DType::fp16, block, A::gelu_no_mul, L::GateUp, 300, 8, 64, 64, 256, 128, chunk});
    cases.push_back({batched, DType::bf16, mx, A::swigluoai_no_mul, L::GateUp, 300, 2, 8, 8, 128,
                     96, 0, false, true, true});
    cases.push_back(
        {batched, DType::bf16, mx, A::gelu, L::Interleaved, 64, 2, 64, 64, 2880, 128, 0});
    cases.push_back({batched, DType::bf16, none, A::gelu_tanh_no_mul, L::GateUp, 300, 8, 64, 16,
                     128, 64, chunk});
    // apply_router_weight_on_input (topk = 1), with and without quantization.
    cases.push_back(
        {batched, DType::bf16, none, A::silu, L::GateUp, 300, 1, 8, 8, 128, 128, chunk, true});
    cases.push_back(
        {batched, DType::bf16, token, A::silu, L::Interleaved, 40, 1, 64, 64, 128, 64, 0, true});
    // The unfused gated path (plain GEMM1 + activation_and_mul), with and without fp8.
    cases.push_back({batched, DType::bf16, none, A::swigluoai, L::Interleaved, 300, 2, 8, 8, 128,
                     128, chunk, false, false});
    cases.push_back({batched, DType::bf16, block, A::gelu, L::UpGate, 64, 8, 64, 24, 256, 128, 0,
                     false, false});
    cases.push_back({batched, DType::bf16, tensor, A::silu, L::GateUp, 300, 2, 8, 8, 128, 128,
                     chunk, false, false});
  }
  // Chunks of one token on the standard path (dynamic per-tensor: one scale per token).
  cases.push_back({false, DType::bf16, tensor, A::silu, L::GateUp, 7, 2, 8, 8, 128, 64, 1});
  return cases;
}

class CudaExpertsPairs : public ::testing::TestWithParam<PairCase> {};

testing::ProblemSpec spec_of(const PairCase& c, uint64_t seed) {
  testing::ProblemSpec spec;
  MoEConfig& cfg = spec.config;
  cfg.num_experts = c.E;
  cfg.num_local_experts = c.E_local;
  cfg.hidden_size = c.K;
  cfg.intermediate_size = c.N;
  cfg.topk = c.topk;
  cfg.in_dtype = c.dtype;
  cfg.quant = c.quant;
  cfg.activation = c.activation;
  cfg.gated_layout = c.layout;
  cfg.max_num_tokens = c.M;
  spec.M = c.M;
  spec.seed = seed;
  spec.int64_ids = c.int64_ids;
  spec.use_expert_map = c.E_local < c.E;
  spec.apply_router_weight_on_input = c.router_weight_on_input;
  return spec;
}

// Device copies of a problem's tensors and the forward arguments over them.
struct DeviceProblem {
  OwnedTensor hidden_states, topk_weights, topk_ids, expert_map, output, w13, w2, w13_scale,
      w2_scale, a13_scale, a2_scale;
  DeviceProblem(const CudaSession& s, const testing::Problem& p)
      : hidden_states(s.to_device(p.hidden_states)),
        topk_weights(s.to_device(p.topk_weights)),
        topk_ids(s.to_device(p.topk_ids)),
        expert_map(device_or_empty(s, p.expert_map)),
        output(s.to_device(p.output)),  // NaN-poisoned by make_problem
        w13(s.to_device(p.w13)),
        w2(s.to_device(p.w2)),
        w13_scale(device_or_empty(s, p.w13_scale)),
        w2_scale(device_or_empty(s, p.w2_scale)),
        a13_scale(device_or_empty(s, p.a13_scale)),
        a2_scale(device_or_empty(s, p.a2_scale)) {}
  ExpertWeights weights() const {
    ExpertWeights w;
    w.w13 = w13;
    w.w2 = w2;
    w.w13_scale = w13_scale;
    w.w2_scale = w2_scale;
    w.a13_scale = a13_scale;
    w.a2_scale = a2_scale;
    return w;
  }
  ForwardArgs args(bool router_weight_on_input) const {
    ForwardArgs a;
    a.hidden_states = hidden_states;
    a.topk_weights = topk_weights;
    a.topk_ids = topk_ids;
    a.output = output;
    a.weights = weights();
    a.expert_map = expert_map;
    a.apply_router_weight_on_input = router_weight_on_input;
    return a;
  }
};

ModularKernel kernel_for(const PairCase& c, const MoEConfig& cfg) {
  if (c.fused) {
    return make_modular_kernel(c.batched ? "BatchedPrepareAndFinalize" : "NoEPPrepareAndFinalize",
                               c.batched ? "BatchedCudaExperts" : "CudaExperts", cfg,
                               Device::cuda(0));
  }
  if (c.batched) {
    return ModularKernel(std::make_shared<cuda::BatchedPrepareAndFinalize>(cfg),
                         std::make_shared<cuda::BatchedCudaExperts>(cfg, 1, false));
  }
  return ModularKernel(std::make_shared<cuda::NoEPPrepareAndFinalize>(cfg),
                       std::make_shared<cuda::CudaExperts>(cfg, false));
}

TEST_P(CudaExpertsPairs, MatchesOracleAndRepeatsBitForBit) {
  MODMOE_REQUIRE_GPU();
  const PairCase& c = GetParam();
  CudaSession s;
  const testing::ProblemSpec spec = spec_of(c, 7000 + static_cast<uint64_t>(c.M + c.K + c.N));
  const testing::Problem p = testing::make_problem(spec);
  const MoEConfig& cfg = p.spec.config;
  ModularKernel kernel = kernel_for(c, cfg);
  EXPECT_EQ(kernel.experts().name(), c.batched ? "BatchedCudaExperts" : "CudaExperts");
  Context ctx = s.ctx();
  ctx.chunk_size = c.chunk;

  DeviceProblem d(s, p);
  kernel.forward(ctx, d.args(c.router_weight_on_input));
  const OwnedTensor out = s.to_host(d.output);

  oracle::OracleInputs in = p.oracle_inputs();
  in.chunk_size = c.batched ? 0 : c.chunk;
  const oracle::ErrorReport err =
      oracle::compare(out, oracle::moe_forward(in), p.topk_ids, p.expert_map);
  const double tol = c.quant.quantized() ? 3e-2 : 1e-2;
  EXPECT_TRUE(err.passed(tol)) << spec.str() << ": " << err.str() << " (tolerance " << tol << ")";
  if (std::getenv("MODMOE_TEST_VERBOSE"))
    std::printf("  %s: %s\n", spec.str().c_str(), err.str().c_str());

  // Deterministic: a second forward (output poisoned again) reproduces every bit.
  poison_device(s, d.output);
  kernel.forward(ctx, d.args(c.router_weight_on_input));
  EXPECT_EQ(bytes_of(s.to_host(d.output)), bytes_of(out)) << spec.str();
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaExpertsPairs, ::testing::ValuesIn(pair_cases()),
                         pair_case_name);

// Tokens whose experts are all elsewhere get exact zeros (the CPU behaviour).
TEST(CudaExperts, TokensWithNoLocalExpertGetZeros) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  for (bool batched : {false, true}) {
    PairCase c{batched,
               DType::bf16,
               {QuantScheme::none, false},
               Activation::silu,
               GatedLayout::GateUp,
               64,
               2,
               32,
               5,
               128,
               64,
               0};
    const testing::Problem p = testing::make_problem(spec_of(c, 91));
    ModularKernel kernel = kernel_for(c, p.spec.config);
    DeviceProblem d(s, p);
    kernel.forward(s.ctx(), d.args(false));
    const OwnedTensor out = s.to_host(d.output);
    const int32_t* map = p.expert_map.data_ptr<int32_t>();
    int zero_rows = 0;
    for (int64_t t = 0; t < 64; ++t) {
      const bool any =
          map[load_index(p.topk_ids.tensor().data(), p.topk_ids.tensor().dtype(), 2 * t)] >= 0 ||
          map[load_index(p.topk_ids.tensor().data(), p.topk_ids.tensor().dtype(), 2 * t + 1)] >= 0;
      if (any) continue;
      ++zero_rows;
      for (int64_t i = 0; i < 128; ++i)
        ASSERT_EQ(load_float(out.tensor().data(), DType::bf16, t * 128 + i), 0.0f)
            << (batched ? "batched" : "standard") << " token " << t;
    }
    EXPECT_GT(zero_rows, 0) << "the routing should leave some tokens without a local expert";
  }
}

// Unquantized and fp8-block (whose rows the experts quantize themselves: into their workspace
// on the grouped path at M = 100, inside the decode path's first kernel at M = 4).
TEST(CudaExperts, InPlaceOutputEqualsOutOfPlace) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  for (QuantScheme scheme : {QuantScheme::none, QuantScheme::fp8_block}) {
    for (int64_t M : {100, 4}) {
      PairCase c{false,
                 DType::bf16,
                 {scheme, false},
                 Activation::silu,
                 GatedLayout::GateUp,
                 M,
                 4,
                 16,
                 16,
                 128,
                 128,
                 32};
      const testing::Problem p = testing::make_problem(spec_of(c, 92));
      ModularKernel kernel = kernel_for(c, p.spec.config);
      Context ctx = s.ctx();
      ctx.chunk_size = c.chunk;  // each chunk reads its own rows before it overwrites them
      DeviceProblem d(s, p);
      kernel.forward(ctx, d.args(false));
      const std::vector<uint8_t> out_of_place = bytes_of(s.to_host(d.output));
      ForwardArgs in_place = d.args(false);
      in_place.output = d.hidden_states;
      kernel.forward(ctx, in_place);
      EXPECT_EQ(bytes_of(s.to_host(d.hidden_states)), out_of_place)
          << quant_scheme_name(scheme) << " M = " << M;
    }
  }
}

// BatchedCudaExperts::apply on inputs whose rows past expert_num_tokens are NaN, into an
// output whose rows past the counts must stay as they were.
TEST(CudaExperts, BatchedNeverTouchesRowsPastTheCounts) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  for (QuantScheme scheme : {QuantScheme::none, QuantScheme::fp8_token, QuantScheme::fp8_tensor}) {
    PairCase c{true,
               DType::bf16,
               {scheme, false},
               Activation::silu,
               GatedLayout::GateUp,
               50,
               2,
               8,
               8,
               128,
               128,
               0};
    const testing::Problem p = testing::make_problem(spec_of(c, 93));
    const MoEConfig& cfg = p.spec.config;
    DeviceProblem d(s, p);
    cuda::BatchedPrepareAndFinalize pf(cfg);
    cuda::BatchedCudaExperts experts(cfg);
    PrepareArgs pargs;
    pargs.a1 = d.hidden_states;
    pargs.topk_weights = d.topk_weights;
    pargs.topk_ids = d.topk_ids;
    pargs.num_experts = cfg.num_experts;
    const ExpertWeights weights = d.weights();
    pargs.weights = &weights;
    PrepareResult prep = pf.prepare(s.ctx(), pargs);

    // Poison every row past the counts (activations and per-row scales).
    const int64_t E = cfg.num_local_experts, T = cfg.max_num_tokens, K = cfg.hidden_size;
    const OwnedTensor counts = s.to_host(prep.expert_tokens_meta->expert_num_tokens);
    OwnedTensor a1q = s.to_host(prep.a1q);
    const bool per_row = prep.a1q_scale.defined() && prep.a1q_scale.ndim() == 3;
    OwnedTensor a1q_scale = per_row ? s.to_host(prep.a1q_scale) : OwnedTensor();
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i = counts.data_ptr<int32_t>()[e]; i < T; ++i) {
        testing::poison(a1q.tensor().select(e).slice(i, i + 1));
        if (per_row) testing::poison(a1q_scale.tensor().select(e).slice(i, i + 1));
      }
    copy_tensor(s.ctx(), prep.a1q, a1q);
    if (per_row) copy_tensor(s.ctx(), prep.a1q_scale, a1q_scale);

    const WorkspaceShapes ws = experts.workspace_shapes(p.spec.M, cfg.intermediate_size, K,
                                                        cfg.topk, cfg.num_experts, E, nullptr);
    EXPECT_EQ(ws.workspace_dtype, DType::uint8);
    const OwnedTensor ws13 = s.empty(ws.workspace_dtype, ws.workspace13);
    const OwnedTensor ws2 = s.empty(ws.workspace_dtype, ws.workspace2);
    const OwnedTensor fused = s.empty(ws.output_dtype, ws.output);
    poison_device(s, fused);
    ApplyArgs a;
    a.output = fused;
    a.hidden_states = prep.a1q;
    a.a1q_scale = prep.a1q_scale;
    a.weights = &weights;
    a.topk_weights = prep.topk_weights;
    a.topk_ids = prep.topk_ids;
    a.global_num_experts = cfg.num_experts;
    a.workspace13 = ws13;
    a.workspace2 = ws2;
    a.expert_tokens_meta = &*prep.expert_tokens_meta;
    experts.apply(s.ctx(), a);

    const OwnedTensor host_fused = s.to_host(fused);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t k = 0; k < K; k += 17) {
          const float v = host_fused.data_ptr<float>()[(e * T + i) * K + k];
          if (i < counts.data_ptr<int32_t>()[e]) {
            ASSERT_TRUE(std::isfinite(v)) << quant_scheme_name(scheme) << ": expert " << e
                                          << " row " << i << " read a poisoned row";
          } else {
            uint32_t bits;
            std::memcpy(&bits, &v, 4);
            ASSERT_EQ(bits, 0xffffffffu) << quant_scheme_name(scheme) << ": expert " << e << " row "
                                         << i << " past its count was written";
          }
        }
    // And the valid rows are right: finalize and compare with the oracle.
    FinalizeArgs f;
    f.output = d.output;
    f.fused_expert_output = fused;
    f.topk_weights = d.topk_weights;
    f.topk_ids = d.topk_ids;
    pf.finalize(s.ctx(), f, *experts.finalize_weight_and_reduce_impl());
    const oracle::ErrorReport err = oracle::compare(
        s.to_host(d.output), oracle::moe_forward(p.oracle_inputs()), p.topk_ids, p.expert_map);
    EXPECT_TRUE(err.passed(scheme == QuantScheme::none ? 1e-2 : 3e-2))
        << quant_scheme_name(scheme) << ": " << err.str();
  }
}

// ---- registration and argument checks -------------------------------------------------------

TEST(CudaExperts, RegistryPicksTheCudaPartsOnCuda) {
  MODMOE_REQUIRE_GPU();
  MoEConfig cfg;
  cfg.num_experts = cfg.num_local_experts = 8;
  cfg.hidden_size = 128;
  cfg.intermediate_size = 64;
  cfg.topk = 2;
  cfg.in_dtype = DType::bf16;
  cfg.max_num_tokens = 16;
  // On an sm_90 device the Hopper experts come first; elsewhere the portable ones.
  const bool hopper = moe_gemm_sm90_available(cuda_context(0, nullptr));
  EXPECT_EQ(
      make_modular_kernel("NoEPPrepareAndFinalize", "auto", cfg, Device::cuda(0)).experts().name(),
      hopper ? "Sm90Experts" : "CudaExperts");
  EXPECT_EQ(make_modular_kernel("BatchedPrepareAndFinalize", "auto", cfg, Device::cuda(0))
                .experts()
                .name(),
            hopper ? "BatchedSm90Experts" : "BatchedCudaExperts");
  // What the Hopper experts cannot run (here: fp16) falls back to the portable ones.
  MoEConfig fp16 = cfg;
  fp16.in_dtype = DType::fp16;
  EXPECT_EQ(
      make_modular_kernel("NoEPPrepareAndFinalize", "auto", fp16, Device::cuda(0)).experts().name(),
      "CudaExperts");
  EXPECT_EQ(make_modular_kernel("NoEPPrepareAndFinalize", "auto", cfg).experts().name(),
            "ReferenceExperts");
  // Not on the CPU, and not for what the GEMM cannot do.
  EXPECT_THAT(error_of([&] { make_modular_kernel("NoEPPrepareAndFinalize", "CudaExperts", cfg); }),
              HasSubstr("CudaExperts has no cpu implementation"));
  MoEConfig fp32 = cfg;
  fp32.in_dtype = DType::fp32;
  EXPECT_THAT(error_of([&] {
                make_modular_kernel("NoEPPrepareAndFinalize", "CudaExperts", fp32, Device::cuda(0));
              }),
              HasSubstr("CudaExperts does not support in_dtype fp32"));
  MoEConfig odd = cfg;
  odd.hidden_size = 200;
  EXPECT_THAT(error_of([&] {
                make_modular_kernel("NoEPPrepareAndFinalize", "CudaExperts", odd, Device::cuda(0));
              }),
              HasSubstr("needs K % 16 == 0, got K = 200"));
  EXPECT_THAT(error_of([&] {
                make_modular_kernel("NoEPPrepareAndFinalize", "auto", cfg,
                                    Device::cuda(cuda_device_count()));
              }),
              HasSubstr("device index must be in"));
}

TEST(CudaExperts, ApplyRejectsWrongDevicesAndSmallWorkspaces) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  PairCase c{false,
             DType::bf16,
             {QuantScheme::none, false},
             Activation::silu,
             GatedLayout::GateUp,
             16,
             2,
             8,
             8,
             128,
             64,
             0};
  const testing::Problem p = testing::make_problem(spec_of(c, 94));
  const MoEConfig& cfg = p.spec.config;
  DeviceProblem d(s, p);
  cuda::CudaExperts experts(cfg);
  const WorkspaceShapes ws = experts.workspace_shapes(16, 64, 128, 2, 8, 8, nullptr);
  const OwnedTensor ws13 = s.empty(ws.workspace_dtype, ws.workspace13);
  const OwnedTensor ws2 = s.empty(ws.workspace_dtype, ws.workspace2);
  const ExpertWeights weights = d.weights();
  ApplyArgs a;
  a.output = d.output;
  a.hidden_states = d.hidden_states;
  a.weights = &weights;
  a.topk_weights = d.topk_weights;
  a.topk_ids = d.topk_ids;
  a.global_num_experts = 8;
  a.workspace13 = ws13;
  a.workspace2 = ws2;
  EXPECT_NO_THROW(experts.apply(s.ctx(), a));
  EXPECT_THAT(error_of([&] { experts.apply(Context::cpu(), a); }),
              HasSubstr("CudaExperts::apply: ctx.device must be cuda"));
  ApplyArgs host_input = a;
  host_input.hidden_states = p.hidden_states;
  EXPECT_THAT(error_of([&] { experts.apply(s.ctx(), host_input); }),
              AllOf(HasSubstr("hidden_states must be on cuda:0"), HasSubstr("on cpu")));
  ApplyArgs small = a;
  small.workspace2 = ws2.tensor().slice(0, ws2.tensor().size(0) / 2);
  EXPECT_THAT(error_of([&] { experts.apply(s.ctx(), small); }),
              HasSubstr("workspace2 must be a contiguous buffer of >= "));
  EXPECT_THAT(error_of([] {
                MoEConfig fp32;
                fp32.num_experts = fp32.num_local_experts = 8;
                fp32.hidden_size = 128;
                fp32.intermediate_size = 64;
                fp32.topk = 2;
                fp32.in_dtype = DType::fp32;
                cuda::CudaExperts bad(fp32);
              }),
              HasSubstr("in_dtype must be bf16 or fp16"));
}

// A host-side rule (no GPU needed): Sm90Experts hands decode-sized applies to the portable
// CudaExperts: bf16 up to 8 expected rows per expert (the grouped pipeline) or where CudaExperts
// decodes; fp8-block only where CudaExperts decodes; never when the reduce is folded into GEMM2.
TEST(Sm90Experts, FewRowsPerExpertRunThePortablePipeline) {
  MoEConfig cfg;
  cfg.num_experts = cfg.num_local_experts = 128;
  cfg.hidden_size = 256;
  cfg.intermediate_size = 256;
  cfg.topk = 8;
  cfg.in_dtype = DType::bf16;
  const cuda::Sm90Experts bf16(cfg);
  EXPECT_TRUE(bf16.runs_portable(1));     // 8 pairs on 8 experts: 1 row each
  EXPECT_TRUE(bf16.runs_portable(128));   // 1024 pairs on 128 experts: 8 rows each
  EXPECT_FALSE(bf16.runs_portable(129));  // 1032 pairs: 9 rows each
  EXPECT_FALSE(bf16.runs_portable(8192));
  MoEConfig fp8 = cfg;
  fp8.quant.scheme = QuantScheme::fp8_block;
  const cuda::Sm90Experts block(fp8);
  EXPECT_EQ(block.max_portable_tokens(), 0);
  EXPECT_TRUE(block.runs_portable(1));    // the decode path: 8 pairs on 128 experts
  EXPECT_TRUE(block.runs_portable(16));   // 128 pairs on 128 experts
  EXPECT_FALSE(block.runs_portable(17));  // 136 pairs: more than one per expert
  EXPECT_FALSE(block.runs_portable(8192));
  // route() names the path for the benchmark's records.
  EXPECT_STREQ(bf16.route(1), "decode");
  EXPECT_STREQ(bf16.route(128), "grouped");
  EXPECT_STREQ(bf16.route(8192), "hopper");
  EXPECT_STREQ(block.route(16), "decode");
  EXPECT_STREQ(block.route(17), "hopper");
  const cuda::Sm90Experts folded(cfg, /*reduce_in_gemm2=*/true);
  EXPECT_FALSE(folded.runs_portable(1));
  // max_portable_tokens() is the ceil(pairs / busy experts) rule at its edge, for uneven sizes
  // too, in both dtypes.
  for (const QuantScheme scheme : {QuantScheme::none, QuantScheme::fp8_block}) {
    for (const int64_t E : {1, 7, 128, 256}) {
      for (const int64_t topk : {1, 3, 8}) {
        MoEConfig c = cfg;
        c.quant.scheme = scheme;
        c.num_experts = c.num_local_experts = E;
        c.topk = std::min(topk, E);
        const cuda::Sm90Experts ex(c);
        const cuda::CudaExperts portable(c);
        const int64_t rows = ex.decode_rows_per_expert();
        for (int64_t M = 1; M <= ex.max_portable_tokens() + E + 3; ++M) {
          const int64_t pairs = M * c.topk, busy = std::min(E, pairs);
          EXPECT_EQ(ex.runs_portable(M),
                    (pairs + busy - 1) / busy <= rows || portable.runs_decode(M))
              << "E " << E << " topk " << c.topk << " M " << M;
        }
      }
    }
  }
}

}  // namespace
}  // namespace modmoe
