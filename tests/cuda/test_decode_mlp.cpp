// The decode path of CudaExperts (src/cuda/decode_mlp.h): results against the float64 oracle
// over the dtypes, schemes, activations, layouts, partial fp8 groups, expert_map, int64 ids,
// router weights on the input, many pairs per expert and a large shared-memory operand; and
// (host-only, runs in CI) which applies take it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <ostream>
#include <string>

#include "cuda/cuda_experts.h"
#include "cuda/cuda_session.h"
#include "cuda/gpu_forward.h"
#include "cuda/gpu_test.h"
#include "modmoe/modmoe.h"
#include "oracle/oracle.h"
#include "oracle/problem.h"

namespace modmoe {
namespace {

using cuda::CudaExperts;
using DecodePath = CudaExperts::DecodePath;
using testing::CudaSession;

struct DecodeCase {
  const char* name;
  DType dtype;
  QuantScheme scheme;
  Activation activation;
  GatedLayout layout;
  int64_t M, topk, E, E_local, K, N;
  bool int64_ids = false;
  bool router_weight_on_input = false;
};

void PrintTo(const DecodeCase& c, std::ostream* os) { *os << c.name; }

testing::ProblemSpec spec_for(const DecodeCase& c) {
  testing::ProblemSpec spec =
      testing::simple_spec(c.M, c.topk, c.E, c.K, c.N, c.dtype, c.scheme,
                           4400 + static_cast<uint64_t>(c.M * 31 + c.K + c.N));
  spec.config.num_local_experts = c.E_local;
  spec.config.activation = c.activation;
  spec.config.gated_layout = c.layout;
  spec.int64_ids = c.int64_ids;
  spec.use_expert_map = c.E_local < c.E;
  spec.apply_router_weight_on_input = c.router_weight_on_input;
  return spec;
}

class DecodeMlp : public ::testing::TestWithParam<DecodeCase> {};

// DecodePath::always, so an M above the automatic threshold (several pairs per expert) runs
// the decode kernels too.
TEST_P(DecodeMlp, MatchesTheOracle) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  const DecodeCase& c = GetParam();
  const testing::Problem p = testing::make_problem(spec_for(c));
  auto experts = std::make_shared<CudaExperts>(p.spec.config, true, DecodePath::always);
  ASSERT_TRUE(experts->runs_decode(c.M));
  const OwnedTensor out = testing::forward_on_gpu(s, p, experts, s.ctx());
  const oracle::ErrorReport err =
      oracle::compare(out, oracle::moe_forward(p.oracle_inputs()), p.topk_ids, p.expert_map);
  const double tol = c.scheme == QuantScheme::none ? 1e-2 : 3e-2;
  EXPECT_TRUE(err.passed(tol)) << p.spec.str() << ": " << err.str();
}

// With dynamic fp8-block and 16-bit inputs the NoEP prepare leaves the rows unquantized and
// gate_up quantizes them in each CTA: the output must be the same bytes as with rows the
// prepare quantized (quantize_rows). The grouped path (DecodePath::automatic at an M past the
// decode bound) then quantizes them into its workspace first: same bytes too.
TEST_P(DecodeMlp, SameBytesWhetherThePrepareOrTheExpertsQuantize) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  const DecodeCase& c = GetParam();
  const testing::Problem p = testing::make_problem(spec_for(c));
  const MoEConfig& cfg = p.spec.config;
  for (DecodePath path : {DecodePath::always, DecodePath::automatic}) {
    auto experts = std::make_shared<CudaExperts>(cfg, true, path);
    const bool expects = c.scheme == QuantScheme::fp8_block && c.dtype != DType::fp32;
    EXPECT_EQ(experts->expects_unquantized_input(), expects) << p.spec.str();
    const OwnedTensor deferred = testing::forward_on_gpu(s, p, experts, s.ctx());
    const OwnedTensor quantized = testing::forward_on_gpu(
        s, p, experts, s.ctx(), std::make_shared<testing::QuantizingNoEP>(cfg));
    EXPECT_EQ(testing::bytes_of(deferred), testing::bytes_of(quantized))
        << p.spec.str() << " (" << experts->route(c.M) << ")";
  }
}

constexpr DType bf16 = DType::bf16, fp16 = DType::fp16, fp32 = DType::fp32;
constexpr QuantScheme none = QuantScheme::none, fp8 = QuantScheme::fp8_block;
constexpr Activation silu = Activation::silu, gelu = Activation::gelu,
                     swiglu = Activation::swigluoai;
constexpr GatedLayout gate_up = GatedLayout::GateUp, up_gate = GatedLayout::UpGate,
                      interleaved = GatedLayout::Interleaved;

INSTANTIATE_TEST_SUITE_P(
    Cases, DecodeMlp,
    ::testing::Values(
        // name, dtype, scheme, act, layout, M, topk, E, E_local, K, N
        DecodeCase{"bf16_M1", bf16, none, silu, gate_up, 1, 4, 16, 16, 256, 256},
        DecodeCase{"fp16_gelu_UpGate", fp16, none, gelu, up_gate, 3, 4, 16, 16, 256, 128},
        DecodeCase{"bf16_swiglu_Interleaved", bf16, none, swiglu, interleaved, 2, 8, 32, 32, 384,
                   96},
        DecodeCase{"fp8_M1", bf16, fp8, silu, gate_up, 1, 4, 16, 16, 256, 256},
        // K = 320, N = 192: a partial last scale group along both GEMMs' K.
        DecodeCase{"fp8_partial_groups_Interleaved", bf16, fp8, swiglu, interleaved, 5, 4, 16, 16,
                   320, 192},
        DecodeCase{"fp8_UpGate_fp32_out", fp32, fp8, silu, up_gate, 2, 2, 8, 8, 256, 128},
        DecodeCase{"bf16_expert_map", bf16, none, silu, gate_up, 6, 4, 16, 8, 256, 128},
        DecodeCase{"fp8_expert_map_int64_ids", bf16, fp8, gelu, gate_up, 4, 4, 16, 6, 256, 256,
                   true},
        DecodeCase{"bf16_router_weight_on_input", bf16, none, silu, gate_up, 6, 1, 8, 8, 256, 128,
                   false, true},
        // 40 tokens x 4 over 8 experts: ~20 pairs per expert, the same weights read by many CTAs.
        DecodeCase{"bf16_many_pairs_per_expert", bf16, none, silu, gate_up, 40, 4, 8, 8, 256, 128},
        DecodeCase{"fp8_many_pairs_per_expert", bf16, fp8, silu, interleaved, 40, 4, 8, 8, 256,
                   256},
        // topk * N * 2 bytes = 64 KiB of shared operand: above the 48 KiB default (opt-in).
        DecodeCase{"bf16_large_shared", bf16, none, silu, gate_up, 1, 4, 4, 4, 128, 8192},
        DecodeCase{"fp8_large_shared", bf16, fp8, silu, gate_up, 1, 4, 4, 4, 128, 8192},
        // gate_up's wider CTAs for 16-bit weights (gate_up_warps): K = 2880 is 45 stages over 8
        // warps (uneven shares), K = 4096 64 stages over 16 (8 on GPUs of 99 KiB per CTA).
        DecodeCase{"bf16_K2880_8_warps", bf16, none, silu, gate_up, 2, 2, 4, 4, 2880, 128},
        DecodeCase{"fp16_K4096_16_warps", fp16, none, gelu, interleaved, 1, 2, 4, 4, 4096, 64},
        // down's grid 6 x 1024 / 16 = 384 CTAs: on 96-191 SMs (the H200's 132 among them) the
        // 4-warp CTAs four to an SM that run it in one wave (decode_shapes).
        DecodeCase{"bf16_down_one_wave_of_4_warps", bf16, none, silu, gate_up, 6, 2, 8, 8, 1024,
                   128},
        DecodeCase{"fp8_down_one_wave_of_4_warps", bf16, fp8, swiglu, up_gate, 6, 2, 8, 8, 1024,
                   256}),
    [](const ::testing::TestParamInfo<DecodeCase>& info) { return std::string(info.param.name); });

// ---- which applies take the decode path (host only but the last: run without a GPU) ----------

MoEConfig qwen3_like(QuantScheme scheme) {
  return testing::simple_spec(1, 8, 128, 2048, 768, DType::bf16, scheme).config;
}

TEST(DecodeRoute, OneTokenOrAtMostOnePairPerLocalExpertAndABoundedWeightStream) {
  // One expert: (2 * 768 + 768) * 2048 weights, 9.4 MB bf16, 4.7 MB fp8. One pair per expert
  // (16 tokens) within 256 MiB: 3 bf16 tokens (24 pairs x 9.4 MB = 226 MB), 7 fp8 (263 MB);
  // half a pair per expert (8 tokens) within 480 MiB: 6 bf16 tokens (453 MB), 8 fp8 (302 MB).
  const CudaExperts bf16_experts(qwen3_like(none)), fp8_experts(qwen3_like(fp8));
  EXPECT_EQ(bf16_experts.max_decode_tokens(), 6);
  EXPECT_TRUE(bf16_experts.runs_decode(1));
  EXPECT_TRUE(bf16_experts.runs_decode(6));
  EXPECT_FALSE(bf16_experts.runs_decode(7));
  EXPECT_EQ(fp8_experts.max_decode_tokens(), 8);
  EXPECT_FALSE(fp8_experts.runs_decode(9));
  // gpt-oss-120b-sized (128 experts, topk 4, K = N = 2880, fp8: 24.9 MB an expert): 256 MiB is
  // 2 tokens, 480 MiB 5 (within the 16 of half a pair per expert and the 8-token cap).
  MoEConfig gpt_oss = qwen3_like(fp8);
  gpt_oss.topk = 4;
  gpt_oss.hidden_size = gpt_oss.intermediate_size = 2880;
  EXPECT_EQ(CudaExperts(gpt_oss).max_decode_tokens(), 5);
  // Small experts: the pair bound, 128 experts / topk 8 = 16 tokens (the sparse bound's
  // 8-token cap does not lower it).
  MoEConfig small = qwen3_like(none);
  small.hidden_size = 256;
  small.intermediate_size = 128;
  EXPECT_EQ(CudaExperts(small).max_decode_tokens(), 16);
  // Fewer experts than topk still decode one token.
  small.num_experts = small.num_local_experts = 4;
  EXPECT_TRUE(CudaExperts(small).runs_decode(1));
  EXPECT_FALSE(CudaExperts(small).runs_decode(2));
  // DeepSeek-V3-sized experts (44 MB fp8): 8 pairs are 352 MB, past the bound, but one token
  // always decodes (its experts are distinct: no weight read twice); two do not.
  MoEConfig big = qwen3_like(fp8);
  big.num_experts = big.num_local_experts = 256;
  big.hidden_size = 7168;
  big.intermediate_size = 2048;
  EXPECT_EQ(CudaExperts(big).max_decode_tokens(), 1);
  EXPECT_TRUE(CudaExperts(big).runs_decode(1));
  EXPECT_FALSE(CudaExperts(big).runs_decode(2));
}

TEST(DecodeRoute, OnlyForTheConfigsItRuns) {
  MoEConfig mx = qwen3_like(QuantScheme::mxfp8), no_mul = qwen3_like(none), odd = qwen3_like(none),
            token = qwen3_like(QuantScheme::fp8_token);
  no_mul.activation = Activation::silu_no_mul;
  odd.intermediate_size = 200;  // not a multiple of 16
  for (const MoEConfig& c : {mx, no_mul, odd, token}) {
    EXPECT_FALSE(CudaExperts(c).runs_decode(1)) << c.str();
    const std::string err = testing::error_of([&] { CudaExperts(c, true, DecodePath::always); });
    EXPECT_THAT(err, ::testing::HasSubstr("DecodePath::always")) << c.str();
  }
  // The unfused path and DecodePath::never keep the grouped pipeline.
  EXPECT_FALSE(CudaExperts(qwen3_like(none), false).runs_decode(1));
  EXPECT_FALSE(CudaExperts(qwen3_like(none), true, DecodePath::never).runs_decode(1));
  EXPECT_TRUE(CudaExperts(qwen3_like(none), true, DecodePath::always).runs_decode(4096));
}

TEST(DecodeRoute, WorkspaceHoldsTheIntermediate) {
  MODMOE_REQUIRE_GPU();  // workspace_shapes asks CUB for its scratch size on the device
  // With N >> K the grouped path's workspace13 holds y (M * topk, K) fp32, smaller than the
  // decode path's workspace, which workspace_shapes must therefore count: h (M * topk, N) in the
  // 16-bit operand dtype (bf16), or in fp32 plus its e4m3 codes and group-128 scales (fp8).
  for (const QuantScheme scheme : {none, fp8}) {
    MoEConfig c = qwen3_like(scheme);
    c.hidden_size = 256;
    c.intermediate_size = 4096;  // topk * N * 2 bytes = 64 KiB of shared operand: still decodes
    const CudaExperts experts(c);
    ASSERT_TRUE(experts.runs_decode(1)) << c.str();
    const WorkspaceShapes w = experts.workspace_shapes(
        1, c.intermediate_size, c.hidden_size, c.topk, c.num_experts, c.num_local_experts, nullptr);
    const int64_t pairs = c.topk, N = c.intermediate_size;
    const int64_t needed =
        scheme == none ? pairs * N * 2 : pairs * N * 4 + pairs * N + pairs * (N / 128) * 4;
    EXPECT_GE(shape_numel(w.workspace13) * static_cast<int64_t>(dtype_size(w.workspace_dtype)),
              needed)
        << c.str();
  }
}

}  // namespace
}  // namespace modmoe
