// Tests of the float64 oracle (tests/oracle/oracle.h) and the random-problem builder
// (tests/oracle/problem.h) that every other test and tool relies on.
//
// The tiny cases are computed here from the definition with the gate/up rows written out as
// literals, so a wiring mistake in the oracle (wrong half, missing weight, ignored map) cannot
// be reproduced by the expectation. The scalar decoders are held to numeric.h, and the
// quantization emulation to numeric.h and to the library's own CPU quantizer.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "modmoe/error.h"
#include "modmoe/numeric.h"
#include "modmoe/quant.h"
#include "oracle/oracle.h"
#include "oracle/problem.h"

namespace modmoe {
namespace {

using oracle::OracleInputs;
using testing::make_problem;
using testing::Problem;
using testing::ProblemSpec;

constexpr uint64_t kSeed = 20240917;

// ---- hand-computed tiny cases ---------------------------------------------------------------

double silu(double g) { return g / (1.0 + std::exp(-g)); }
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// A tiny fp32 MoE layer whose tensors are literals; views into its vectors feed the oracle.
struct HandCase {
  int64_t M = 2, K = 2, N = 2, topk = 2;
  std::vector<float> x = {1.0f, -0.5f, 0.25f, 2.0f};  // (M, K)
  // (E_local = 2, 2N = 4, K): rows 0..3 of expert 0, then of expert 1.
  std::vector<float> w13 = {0.5f,   1.0f, -1.0f, 0.25f, 1.5f, -0.5f, 0.75f, 0.5f,
                            -0.25f, 0.5f, 1.0f,  1.0f,  0.5f, -1.5f, -0.5f, 0.25f};
  std::vector<float> w2 = {1.0f,  -0.5f, 0.25f, 2.0f,    // expert 0 (K, N)
                           -1.0f, 0.5f,  1.5f,  0.75f};  // expert 1
  std::vector<int32_t> ids = {0, 1, 1, 0};
  std::vector<float> weights = {0.75f, 0.25f, 0.4f, 0.6f};
  std::vector<int32_t> map;  // empty: identity
  int64_t rows13 = 4;

  int64_t num_local() const { return static_cast<int64_t>(w2.size()) / (K * N); }

  OracleInputs inputs(Activation act, GatedLayout layout) {
    OracleInputs in;
    in.hidden_states = Tensor(x.data(), DType::fp32, {M, K});
    in.topk_ids = Tensor(ids.data(), DType::int32, {M, topk});
    in.topk_weights = Tensor(weights.data(), DType::fp32, {M, topk});
    in.weights.w13 = Tensor(w13.data(), DType::fp32, {num_local(), rows13, K});
    in.weights.w2 = Tensor(w2.data(), DType::fp32, {num_local(), K, N});
    if (!map.empty()) in.expert_map = Tensor(map.data(), DType::int32, {int64_t(map.size())});
    in.activation = act;
    in.layout = layout;
    return in;
  }

  // W2_e · act(W13_e · x): `gate_rows` / `up_rows` name the w13 rows of gate_j / up_j;
  // `combine(gate, up)` is the activation (up is ignored for the _no_mul forms).
  std::vector<double> expert(int64_t e, const std::vector<double>& xt,
                             const std::vector<int>& gate_rows, const std::vector<int>& up_rows,
                             const std::function<double(double, double)>& combine) const {
    auto gemm1_row = [&](int r) {
      double s = 0;
      for (int64_t c = 0; c < K; ++c) s += double(w13[(e * rows13 + r) * K + c]) * xt[c];
      return s;
    };
    std::vector<double> a(N), y(K, 0.0);
    for (int64_t j = 0; j < N; ++j)
      a[j] = combine(gemm1_row(gate_rows[j]), up_rows.empty() ? 0.0 : gemm1_row(up_rows[j]));
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < N; ++j) y[k] += double(w2[(e * K + k) * N + j]) * a[j];
    return y;
  }
  std::vector<double> token(int64_t t) const { return {x[t * K], x[t * K + 1]}; }
};

// out[t] = sum_k w[t,k] * expert(map(id[t,k]), x_t) with identity or literal map.
std::vector<double> hand_forward(const HandCase& c, const std::vector<int>& gate_rows,
                                 const std::vector<int>& up_rows,
                                 const std::function<double(double, double)>& combine) {
  std::vector<double> out(c.M * c.K, 0.0);
  for (int64_t t = 0; t < c.M; ++t) {
    for (int64_t k = 0; k < c.topk; ++k) {
      int64_t e = c.ids[t * c.topk + k];
      if (!c.map.empty()) e = c.map[e];
      if (e < 0) continue;
      const std::vector<double> y = c.expert(e, c.token(t), gate_rows, up_rows, combine);
      for (int64_t j = 0; j < c.K; ++j) out[t * c.K + j] += c.weights[t * c.topk + k] * y[j];
    }
  }
  return out;
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want,
                     double tol = 1e-12) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << "element " << i;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

double rel_diff(const std::vector<double>& a, const std::vector<double>& ref) {
  double d = 0, r = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (a[i] - ref[i]) * (a[i] - ref[i]);
    r += ref[i] * ref[i];
  }
  return std::sqrt(d / r);
}

const auto kSiluGlu = [](double g, double u) { return silu(g) * u; };

TEST(OracleHand, SiluInEveryGatedLayout) {
  HandCase c;
  const std::vector<double> gate_up =
      hand_forward(c, /*gate_rows=*/{0, 1}, /*up_rows=*/{2, 3}, kSiluGlu);
  const std::vector<double> up_gate = hand_forward(c, {2, 3}, {0, 1}, kSiluGlu);
  const std::vector<double> interleaved = hand_forward(c, {0, 2}, {1, 3}, kSiluGlu);
  expect_near_all(oracle::moe_forward(c.inputs(Activation::silu, GatedLayout::GateUp)), gate_up);
  expect_near_all(oracle::moe_forward(c.inputs(Activation::silu, GatedLayout::UpGate)), up_gate);
  expect_near_all(oracle::moe_forward(c.inputs(Activation::silu, GatedLayout::Interleaved)),
                  interleaved);
  // The layouts really lead to different outputs, so the checks above tell them apart.
  EXPECT_GT(max_abs_diff(gate_up, up_gate), 0.05);
  EXPECT_GT(max_abs_diff(gate_up, interleaved), 0.05);
  EXPECT_GT(max_abs_diff(up_gate, interleaved), 0.05);
}

TEST(OracleHand, NoMulFormUsesNRows) {
  HandCase c;
  c.rows13 = 2;  // (E, N, K): keep rows 0..1 of each expert
  c.w13 = {0.5f, 1.0f, -1.0f, 0.25f, -0.25f, 0.5f, 1.0f, 1.0f};
  const std::vector<double> want =
      hand_forward(c, {0, 1}, {}, [](double h, double) { return silu(h); });
  expect_near_all(oracle::moe_forward(c.inputs(Activation::silu_no_mul, GatedLayout::GateUp)),
                  want);
  // GELU (erf) too, as the second activation family.
  const std::vector<double> want_gelu = hand_forward(c, {0, 1}, {}, [](double h, double) {
    return 0.5 * h * (1.0 + std::erf(h / std::sqrt(2.0)));
  });
  expect_near_all(oracle::moe_forward(c.inputs(Activation::gelu_no_mul, GatedLayout::GateUp)),
                  want_gelu);
}

TEST(OracleHand, SwigluOaiClampsGateAndUp) {
  HandCase c;
  c.x = {4.0f, 3.0f, -2.0f, 3.5f};
  // Interleaved (gpt-oss). Token 0 through expert 0: gate0 = 11 (> 7), up0 = -12 (< -7),
  // gate1 = 1.25, up1 = 11 (> 7): every clamp is active.
  c.w13 = {2.0f,   1.0f, -3.0f, 0.0f, 0.5f, -0.25f, 2.0f,  1.0f,
           -0.25f, 0.5f, 1.0f,  1.0f, 0.5f, -1.5f,  -0.5f, 0.25f};
  const double alpha = 1.702f;  // gpt-oss's alpha is the float 1.702f (activation.h)
  auto swigluoai = [alpha](double gate, double up) {
    const double g = std::min(gate, 7.0);
    const double u = std::max(std::min(up, 7.0), -7.0);
    return g * sigmoid(alpha * g) * (u + 1.0);
  };
  auto unclamped = [alpha](double gate, double up) {
    return gate * sigmoid(alpha * gate) * (up + 1);
  };
  const std::vector<double> want = hand_forward(c, {0, 2}, {1, 3}, swigluoai);
  expect_near_all(oracle::moe_forward(c.inputs(Activation::swigluoai, GatedLayout::Interleaved)),
                  want);
  EXPECT_GT(max_abs_diff(want, hand_forward(c, {0, 2}, {1, 3}, unclamped)), 1.0)
      << "the case must exercise the clamps";
}

TEST(OracleHand, RouterWeightOnInputScalesTheInput) {
  HandCase c;
  c.topk = 1;
  c.ids = {1, 0};
  c.weights = {0.5f, 2.0f};
  std::vector<double> want(c.M * c.K, 0.0), weight_after(c.M * c.K, 0.0);
  for (int64_t t = 0; t < c.M; ++t) {
    std::vector<double> xt = c.token(t);
    const double w = c.weights[t];
    const std::vector<double> after = c.expert(c.ids[t], xt, {0, 1}, {2, 3}, kSiluGlu);
    for (double& v : xt) v *= w;
    const std::vector<double> y = c.expert(c.ids[t], xt, {0, 1}, {2, 3}, kSiluGlu);
    for (int64_t j = 0; j < c.K; ++j) {
      want[t * c.K + j] = y[j];  // the output is not weighted again
      weight_after[t * c.K + j] = w * after[j];
    }
  }
  OracleInputs in = c.inputs(Activation::silu, GatedLayout::GateUp);
  in.apply_router_weight_on_input = true;
  expect_near_all(oracle::moe_forward(in), want);
  EXPECT_GT(max_abs_diff(want, weight_after), 0.01) << "weighting before the MLP must differ";
}

TEST(OracleHand, ExpertMapSkipsNonLocalExperts) {
  HandCase c;
  c.M = 3;
  c.x = {1.0f, -0.5f, 0.25f, 2.0f, -1.5f, 0.75f};
  // Global 0 -> local 1, global 2 -> local 0; 1 and 3 live elsewhere. Token 2 has no local
  // expert.
  c.map = {1, -1, 0, -1};
  c.ids = {0, 1, 2, 1, 3, 1};
  c.weights = {0.75f, 0.25f, 0.4f, 0.6f, 0.5f, 0.5f};
  const std::vector<double> got =
      oracle::moe_forward(c.inputs(Activation::silu, GatedLayout::GateUp));
  const std::vector<double> y0 = c.expert(1, c.token(0), {0, 1}, {2, 3}, kSiluGlu);
  const std::vector<double> y1 = c.expert(0, c.token(1), {0, 1}, {2, 3}, kSiluGlu);
  const double w0 = c.weights[0], w1 = c.weights[2];  // the fp32 weights 0.75f and 0.4f
  expect_near_all(got, {w0 * y0[0], w0 * y0[1], w1 * y1[0], w1 * y1[1], 0.0, 0.0});
}

TEST(OracleHand, RejectsInvalidInputs) {
  HandCase c;
  c.ids = {0, 2, 1, 0};  // expert 2 does not exist
  EXPECT_THROW(oracle::moe_forward(c.inputs(Activation::silu, GatedLayout::GateUp)), Error);
  HandCase d;
  OracleInputs in = d.inputs(Activation::silu, GatedLayout::GateUp);
  in.apply_router_weight_on_input = true;  // topk = 2
  try {
    oracle::moe_forward(in);
    FAIL() << "expected modmoe::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("topk == 1"), std::string::npos) << e.what();
  }
  in = d.inputs(Activation::silu_no_mul, GatedLayout::GateUp);  // w13 has 2N rows
  EXPECT_THROW(oracle::moe_forward(in), Error);
}

// ---- scalar decoders and rounding against numeric.h -----------------------------------------

void expect_same_value(double got, double want, uint32_t code) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << "code 0x" << std::hex << code;
  } else {
    EXPECT_EQ(got, want) << "code 0x" << std::hex << code;
  }
}

TEST(OracleDecoders, MatchNumericOverEveryCode) {
  for (uint32_t code = 0; code < 256; ++code) {
    expect_same_value(oracle::decode_e4m3(uint8_t(code)), e4m3_to_float(uint8_t(code)), code);
    expect_same_value(oracle::decode_e8m0(uint8_t(code)), e8m0_to_float(uint8_t(code)), code);
  }
  for (uint32_t code = 0; code < 65536; ++code) {
    expect_same_value(oracle::decode_fp16(uint16_t(code)), fp16_to_float(uint16_t(code)), code);
    expect_same_value(oracle::decode_bf16(uint16_t(code)), bf16_to_float(uint16_t(code)), code);
  }
  EXPECT_EQ(oracle::decode_e4m3(0x7e), 448.0);
  EXPECT_EQ(oracle::decode_e4m3(0x01), std::ldexp(1.0, -9));
}

TEST(OracleDecoders, RoundToE4M3MatchesNumeric) {
  std::vector<float> values;
  // Every code's value and every midpoint between neighbours (the ties).
  std::vector<float> codes;
  for (int code = 0; code < 0x7f; ++code) codes.push_back(e4m3_to_float(uint8_t(code)));
  for (size_t i = 0; i < codes.size(); ++i) {
    values.push_back(codes[i]);
    if (i + 1 < codes.size()) values.push_back(0.5f * (codes[i] + codes[i + 1]));
  }
  values.insert(values.end(), {448.0f, 460.0f, 464.0f, 480.0f, 1e6f, 1e-30f, 0.0f});
  std::mt19937 rng(kSeed);
  std::uniform_real_distribution<float> exponent(-14.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) values.push_back(std::exp2(exponent(rng)));
  for (float v : values) {
    for (float s : {v, -v}) {
      const double want = e4m3_to_float(float_to_e4m3(s));
      EXPECT_EQ(oracle::round_to_e4m3(s), want) << "value " << s << " (seed " << kSeed << ")";
    }
  }
  EXPECT_EQ(oracle::round_to_e4m3(1.0625), 1.0);   // tie between 1 and 1.125 -> even
  EXPECT_EQ(oracle::round_to_e4m3(1.1875), 1.25);  // tie between 1.125 and 1.25 -> even
  EXPECT_EQ(oracle::round_to_e4m3(-1e9), -448.0);
  EXPECT_TRUE(std::isnan(oracle::round_to_e4m3(NAN)));
}

// ---- activation quantization emulation -------------------------------------------------------

const QuantScheme kFp8Schemes[] = {QuantScheme::fp8_tensor, QuantScheme::fp8_token,
                                   QuantScheme::fp8_block, QuantScheme::mxfp8};

// The scheme written out with numeric.h's codec in float arithmetic (the library's rules).
std::vector<double> quantize_with_numeric(const std::vector<float>& x, int64_t rows, int64_t cols,
                                          QuantScheme scheme) {
  const int64_t group = scheme == QuantScheme::fp8_tensor  ? rows * cols
                        : scheme == QuantScheme::fp8_token ? cols
                        : scheme == QuantScheme::fp8_block ? 128
                                                           : 32;
  std::vector<double> out(x.size());
  // Groups never straddle rows except for the whole-tensor group.
  for (int64_t r = 0; r < (scheme == QuantScheme::fp8_tensor ? 1 : rows); ++r) {
    const int64_t row_len = scheme == QuantScheme::fp8_tensor ? rows * cols : cols;
    for (int64_t c0 = 0; c0 < row_len; c0 += group) {
      const int64_t begin = r * row_len + c0, end = begin + std::min(group, row_len - c0);
      float amax = 0;
      for (int64_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float scale = scheme == QuantScheme::mxfp8
                              ? std::ldexp(1.0f, std::max(std::ilogb(amax) - 8, -127))
                              : (amax == 0 ? 1.0f : amax / 448.0f);
      for (int64_t i = begin; i < end; ++i)
        out[i] = double(e4m3_to_float(float_to_e4m3(x[i] * (1.0f / scale)))) * scale;
    }
  }
  return out;
}

TEST(OracleQuant, FakeQuantizeMatchesNumericAndTheLibraryQuantizer) {
  const int64_t rows = 3, cols = 300;  // partial last block (300 = 2*128 + 44) and MX group
  std::mt19937 rng(kSeed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(rows * cols);
  for (float& v : x) v = normal(rng);
  for (int64_t c = 0; c < cols; ++c) x[2 * cols + c] *= 1e-3f;  // a row of another magnitude
  for (QuantScheme scheme : kFp8Schemes) {
    SCOPED_TRACE(quant_scheme_name(scheme));
    std::vector<double> got(x.begin(), x.end());
    oracle::fake_quantize(got, rows, cols, scheme);
    const std::vector<double> want = quantize_with_numeric(x, rows, cols, scheme);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;

    // The library's CPU quantizer (quant.h) and back to fp32: equal up to the fp32 rounding of
    // code * scale in its dequantization.
    const Tensor xt(x.data(), DType::fp32, {rows, cols});
    OwnedTensor q = host_tensor(DType::fp8_e4m3, {rows, cols});
    OwnedTensor s = host_tensor(scale_dtype(scheme), act_scale_shape(scheme, rows, cols));
    OwnedTensor back = host_tensor(DType::fp32, {rows, cols});
    quantize_activations(Context::cpu(), xt, scheme, false, q, s);
    dequantize_activations(Context::cpu(), q, s, scheme, back);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(back.data_ptr<float>()[i], got[i], 1e-7 * std::fabs(got[i])) << "element " << i;
  }
  // A static scale replaces the dynamic one.
  std::vector<double> v = {1.0, 3.0, -100.0};
  oracle::fake_quantize(v, 1, 3, QuantScheme::fp8_tensor, /*static_scale=*/0.125);
  EXPECT_EQ(v[0], 1.0);
  EXPECT_EQ(v[1], 3.0);
  EXPECT_EQ(v[2], -448.0 * 0.125);  // saturates
}

ProblemSpec small_spec(QuantScheme scheme, bool static_scale = false) {
  ProblemSpec spec;
  spec.config.num_experts = 4;
  spec.config.hidden_size = 256;
  spec.config.intermediate_size = 192;
  spec.config.topk = 2;
  spec.config.in_dtype = DType::bf16;
  spec.config.quant = {scheme, static_scale};
  spec.M = 16;
  spec.seed = kSeed;
  return spec;
}

TEST(OracleQuant, IntermediateQuantizationChangesTheResultALittle) {
  std::vector<ProblemSpec> specs;
  for (QuantScheme scheme : kFp8Schemes) specs.push_back(small_spec(scheme));
  specs.push_back(small_spec(QuantScheme::fp8_tensor, /*static_scale=*/true));
  for (const ProblemSpec& spec : specs) {
    SCOPED_TRACE(spec.str());
    const Problem p = make_problem(spec);
    OracleInputs in = p.oracle_inputs();
    const std::vector<double> emulated = oracle::moe_forward(in);
    in.emulate_quantization = false;
    const std::vector<double> exact = oracle::moe_forward(in);
    const double rel = rel_diff(emulated, exact);
    EXPECT_GT(rel, 1e-3);
    EXPECT_LT(rel, 5e-2);
  }
}

TEST(OracleQuant, HiddenStatesArePreRoundedThroughTheScheme) {
  for (QuantScheme scheme : kFp8Schemes) {
    for (DType dtype : {DType::bf16, DType::fp32}) {
      ProblemSpec spec = small_spec(scheme);
      spec.config.in_dtype = dtype;
      SCOPED_TRACE(spec.str());
      const Problem p = make_problem(spec);
      const Tensor& x = p.hidden_states;
      std::vector<double> values(x.numel());
      for (int64_t i = 0; i < x.numel(); ++i) values[i] = oracle::element_at(x, i);
      std::vector<double> requantized = values;
      oracle::fake_quantize(requantized, spec.M, spec.config.hidden_size, scheme);
      // Re-quantizing is the identity up to the in_dtype rounding of the dequantized values.
      const double tol = dtype == DType::fp32 ? 1e-6 : 1e-2;
      for (size_t i = 0; i < values.size(); ++i)
        ASSERT_NEAR(requantized[i], values[i], tol * std::fabs(values[i])) << "element " << i;
    }
  }
}

TEST(OracleQuant, ChunksGetTheirOwnPerTensorIntermediateScale) {
  for (QuantScheme scheme : kFp8Schemes) {
    SCOPED_TRACE(quant_scheme_name(scheme));
    const Problem p = make_problem(small_spec(scheme));  // M = 16
    OracleInputs in = p.oracle_inputs();
    const std::vector<double> whole = oracle::moe_forward(in);
    in.chunk_size = 16;
    EXPECT_EQ(oracle::moe_forward(in), whole);
    in.chunk_size = 5;
    const std::vector<double> chunked = oracle::moe_forward(in);
    if (scheme == QuantScheme::fp8_tensor) {
      EXPECT_GT(rel_diff(chunked, whole), 1e-3);
    } else {
      EXPECT_EQ(chunked, whole) << "row-wise scales do not depend on the chunking";
    }
  }
}

TEST(OracleQuant, StaticScalesAreUsed) {
  const Problem p = make_problem(small_spec(QuantScheme::fp8_tensor, /*static_scale=*/true));
  const std::vector<double> base = oracle::moe_forward(p.oracle_inputs());
  for (const OwnedTensor* scale : {&p.a13_scale, &p.a2_scale}) {
    float& s = scale->data_ptr<float>()[0];
    const float saved = s;
    s = saved * 3;  // another grid (a power of two would only shift the binades)
    const std::vector<double> coarse = oracle::moe_forward(p.oracle_inputs());
    s = saved / 4;  // saturation
    const std::vector<double> saturated = oracle::moe_forward(p.oracle_inputs());
    s = saved;
    EXPECT_GT(rel_diff(coarse, base), 0.02);
    EXPECT_GT(rel_diff(saturated, base), 0.02);
  }
}

// The weights dequantized by hand (numeric.h codecs, quant.h's scale table) into fp64: the
// oracle on those, unquantized, must equal the oracle on the codes and scales.
std::vector<double> dequantize_by_hand(const Tensor& q, const Tensor& scale, QuantScheme scheme) {
  const int64_t E = q.size(0), R = q.size(1), C = q.size(2);
  std::vector<double> out(E * R * C);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        switch (scheme) {
          case QuantScheme::fp8_tensor:
            s = scale.data_ptr<float>()[e];
            break;
          case QuantScheme::fp8_token:
            s = scale.data_ptr<float>()[e * R + r];
            break;
          case QuantScheme::fp8_block: {
            const int64_t rb = (R + 127) / 128, cb = (C + 127) / 128;
            s = scale.data_ptr<float>()[(e * rb + r / 128) * cb + c / 128];
            break;
          }
          default: {
            const int64_t groups = (C + 31) / 32;
            s = e8m0_to_float(scale.data_ptr<uint8_t>()[(e * R + r) * groups + c / 32]);
          }
        }
        const int64_t i = (e * R + r) * C + c;
        out[i] = double(e4m3_to_float(q.data_ptr<uint8_t>()[i])) * s;
      }
    }
  }
  return out;
}

TEST(OracleQuant, WeightScaleLayoutsMatchQuantH) {
  for (QuantScheme scheme : kFp8Schemes) {
    ProblemSpec spec = small_spec(scheme);
    spec.config.num_experts = 3;
    spec.config.hidden_size = 160;        // K: 2 blocks of 128, 5 MX groups
    spec.config.intermediate_size = 136;  // 2N = 272: 3 row blocks, the last partial
    spec.M = 5;
    SCOPED_TRACE(spec.str());
    const Problem p = make_problem(spec);
    OracleInputs in = p.oracle_inputs();
    in.emulate_quantization = false;
    const std::vector<double> from_codes = oracle::moe_forward(in);

    std::vector<double> w13 = dequantize_by_hand(p.w13, p.w13_scale, scheme);
    std::vector<double> w2 = dequantize_by_hand(p.w2, p.w2_scale, scheme);
    in.quant = {};
    in.weights = {};
    in.weights.w13 = Tensor(w13.data(), DType::fp64, p.w13.tensor().shape());
    in.weights.w2 = Tensor(w2.data(), DType::fp64, p.w2.tensor().shape());
    const std::vector<double> from_floats = oracle::moe_forward(in);
    expect_near_all(from_codes, from_floats, 1e-12);
  }
}

TEST(OracleQuant, ThreadCountDoesNotChangeTheResult) {
  ProblemSpec spec = small_spec(QuantScheme::fp8_block);
  spec.config.num_experts = 8;
  spec.M = 64;  // 128 pairs * (384 + 256) * 192 multiply-adds: the oracle's parallel path
  const Problem p = make_problem(spec);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<double> serial = oracle::moe_forward(p.oracle_inputs());
  omp_set_num_threads(std::max(threads, 2));
  const std::vector<double> parallel = oracle::moe_forward(p.oracle_inputs());
  omp_set_num_threads(threads);
  EXPECT_EQ(serial, parallel);
}

// ---- compare() -------------------------------------------------------------------------------

OwnedTensor to_tensor(const std::vector<double>& values, int64_t M, int64_t K, DType dtype) {
  OwnedTensor t = host_tensor(dtype, {M, K});
  if (dtype == DType::fp64) {
    std::copy(values.begin(), values.end(), t.data_ptr<double>());
  } else {
    for (int64_t i = 0; i < M * K; ++i) store_float(t.tensor().data(), dtype, i, float(values[i]));
  }
  return t;
}

ProblemSpec routing_spec() {
  ProblemSpec spec;
  spec.config.num_experts = 64;
  spec.config.hidden_size = 32;
  spec.config.intermediate_size = 48;
  spec.config.topk = 2;
  spec.config.in_dtype = DType::fp32;
  spec.M = 256;
  spec.seed = kSeed;
  return spec;
}

TEST(OracleCompare, IdenticalOutputsPass) {
  SCOPED_TRACE(routing_spec().str());
  const Problem p = make_problem(routing_spec());
  const std::vector<double> ref = oracle::moe_forward(p.oracle_inputs());
  const int64_t M = p.spec.M, K = p.spec.config.hidden_size;
  const oracle::ErrorReport exact =
      oracle::compare(to_tensor(ref, M, K, DType::fp64), ref, p.topk_ids, p.expert_map);
  EXPECT_TRUE(exact.passed(0)) << exact.str();
  EXPECT_EQ(exact.rel_error, 0);
  const oracle::ErrorReport rounded =
      oracle::compare(to_tensor(ref, M, K, DType::bf16), ref, p.topk_ids, p.expert_map);
  EXPECT_TRUE(rounded.passed(1e-2)) << rounded.str();
  EXPECT_GT(rounded.rel_error, 0);
  EXPECT_GE(rounded.worst_expert, 0);
  EXPECT_NE(rounded.str().find("worst expert"), std::string::npos) << rounded.str();
}

TEST(OracleCompare, FlagsNonFiniteFirst) {
  SCOPED_TRACE(routing_spec().str());
  const Problem p = make_problem(routing_spec());
  const std::vector<double> ref = oracle::moe_forward(p.oracle_inputs());
  const int64_t M = p.spec.M, K = p.spec.config.hidden_size;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY}) {
    OwnedTensor out = to_tensor(ref, M, K, DType::fp32);
    out.data_ptr<float>()[3 * K + 5] = bad;
    out.data_ptr<float>()[7 * K + 1] = bad;
    const oracle::ErrorReport r = oracle::compare(out, ref, p.topk_ids, p.expert_map);
    EXPECT_FALSE(r.all_finite);
    EXPECT_EQ(r.first_non_finite, 3 * K + 5);
    EXPECT_EQ(r.num_non_finite, 2);
    EXPECT_FALSE(r.passed(1e9));
    EXPECT_NE(r.str().find("non-finite at"), std::string::npos) << r.str();
    EXPECT_NE(r.str().find("row 3, col 5"), std::string::npos) << r.str();
  }
  // An unwritten (still poisoned) output fails.
  const oracle::ErrorReport poisoned = oracle::compare(p.output, ref, p.topk_ids, p.expert_map);
  EXPECT_FALSE(poisoned.all_finite);
  EXPECT_EQ(poisoned.first_non_finite, 0);
}

TEST(OracleCompare, OneWrongExpertStandsOut) {
  SCOPED_TRACE(routing_spec().str());
  const Problem p = make_problem(routing_spec());
  const std::vector<double> ref = oracle::moe_forward(p.oracle_inputs());
  // Expert `wrong` is off by 10%: its topk weight is scaled in a copy of the routing.
  const int64_t wrong = p.topk_ids.data_ptr<int32_t>()[0];
  const int64_t M = p.spec.M, K = p.spec.config.hidden_size, topk = p.spec.config.topk;
  OwnedTensor weights = host_tensor(DType::fp32, {M, topk});
  for (int64_t i = 0; i < M * topk; ++i) {
    const bool hit = p.topk_ids.data_ptr<int32_t>()[i] == wrong;
    weights.data_ptr<float>()[i] = p.topk_weights.data_ptr<float>()[i] * (hit ? 1.1f : 1.0f);
  }
  OracleInputs in = p.oracle_inputs();
  in.topk_weights = weights;
  const std::vector<double> bad = oracle::moe_forward(in);
  const oracle::ErrorReport r =
      oracle::compare(to_tensor(bad, M, K, DType::fp32), ref, p.topk_ids, p.expert_map);
  EXPECT_TRUE(r.all_finite);
  EXPECT_LT(r.rel_error, 3e-2) << r.str();
  EXPECT_GT(r.max_expert_rel_error, 3e-2) << r.str();
  EXPECT_GT(r.max_expert_rel_error, 2 * r.rel_error) << r.str();
  EXPECT_EQ(r.worst_expert, wrong) << r.str();
  EXPECT_FALSE(r.passed(3e-2)) << r.str();
}

TEST(OracleCompare, PerExpertMeasureFollowsTheExpertMap) {
  ProblemSpec spec = routing_spec();
  spec.use_expert_map = true;
  spec.config.num_local_experts = 16;
  const Problem p = make_problem(spec);
  const std::vector<double> ref = oracle::moe_forward(p.oracle_inputs());
  const int64_t M = p.spec.M, K = p.spec.config.hidden_size;
  // Rows with no local expert are zero in the reference.
  int64_t unrouted_rows = 0;
  for (int64_t t = 0; t < M; ++t) {
    bool local = false;
    for (int64_t k = 0; k < spec.config.topk; ++k) {
      const int32_t global = p.topk_ids.data_ptr<int32_t>()[t * spec.config.topk + k];
      local = local || p.expert_map.data_ptr<int32_t>()[global] >= 0;
    }
    if (local) continue;
    ++unrouted_rows;
    for (int64_t c = 0; c < K; ++c) ASSERT_EQ(ref[t * K + c], 0.0);
  }
  EXPECT_GT(unrouted_rows, 0);
  const oracle::ErrorReport r =
      oracle::compare(to_tensor(ref, M, K, DType::bf16), ref, p.topk_ids, p.expert_map);
  EXPECT_TRUE(r.passed(1e-2)) << r.str();
  ASSERT_GE(r.worst_expert, 0);
  EXPECT_GE(p.expert_map.data_ptr<int32_t>()[r.worst_expert], 0) << "only local experts count";
}

// ---- make_problem --------------------------------------------------------------------------

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

bool same_problem(const Problem& a, const Problem& b) {
  return same_bytes(a.hidden_states, b.hidden_states) && same_bytes(a.topk_ids, b.topk_ids) &&
         same_bytes(a.topk_weights, b.topk_weights) && same_bytes(a.expert_map, b.expert_map) &&
         same_bytes(a.w13, b.w13) && same_bytes(a.w2, b.w2) &&
         same_bytes(a.w13_scale, b.w13_scale) && same_bytes(a.w2_scale, b.w2_scale) &&
         same_bytes(a.a13_scale, b.a13_scale) && same_bytes(a.a2_scale, b.a2_scale);
}

TEST(ProblemBuilder, DeterministicPerSeedAndDifferentAcrossSeeds) {
  for (ProblemSpec spec : {routing_spec(), small_spec(QuantScheme::fp8_tensor, true),
                           small_spec(QuantScheme::mxfp8)}) {
    spec.use_expert_map = true;
    spec.config.num_local_experts = spec.config.num_experts - 1;
    SCOPED_TRACE(spec.str());
    const Problem a = make_problem(spec), b = make_problem(spec);
    EXPECT_TRUE(same_problem(a, b));
    spec.seed += 1;
    const Problem c = make_problem(spec);
    EXPECT_FALSE(same_bytes(a.hidden_states, c.hidden_states));
    EXPECT_FALSE(same_bytes(a.topk_ids, c.topk_ids));
    EXPECT_FALSE(same_bytes(a.topk_weights, c.topk_weights));
    EXPECT_FALSE(same_bytes(a.w13, c.w13));
    EXPECT_FALSE(same_bytes(a.w2, c.w2));
  }
}

TEST(ProblemBuilder, RoutingWeightsAndOutputFollowTheContract) {
  ProblemSpec spec = routing_spec();
  spec.config.topk = 8;
  const Problem p = make_problem(spec);
  const int64_t M = spec.M, E = spec.config.num_experts, topk = 8;
  std::vector<int64_t> hits(E, 0);
  for (int64_t t = 0; t < M; ++t) {
    std::set<int32_t> row;
    double sum = 0;
    for (int64_t k = 0; k < topk; ++k) {
      const int32_t id = p.topk_ids.data_ptr<int32_t>()[t * topk + k];
      ASSERT_TRUE(id >= 0 && id < E) << id;
      row.insert(id);
      ++hits[id];
      const float w = p.topk_weights.data_ptr<float>()[t * topk + k];
      EXPECT_GT(w, 0.0f);
      sum += w;
    }
    EXPECT_EQ(row.size(), size_t(topk)) << "ids must be distinct within row " << t;
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
  // Uniform over E: 256 * 8 / 64 = 32 hits on average; every expert gets some.
  EXPECT_GT(*std::min_element(hits.begin(), hits.end()), 8);
  EXPECT_LT(*std::max_element(hits.begin(), hits.end()), 64);
  for (int64_t i = 0; i < p.output.tensor().numel(); ++i)
    ASSERT_TRUE(std::isnan(p.output.data_ptr<float>()[i]));
  // The output is O(1), and the hidden states are not degenerate.
  const std::vector<double> ref = oracle::moe_forward(p.oracle_inputs());
  double sq = 0;
  for (double v : ref) sq += v * v;
  const double rms = std::sqrt(sq / ref.size());
  EXPECT_GT(rms, 0.1);
  EXPECT_LT(rms, 3.0);
  int64_t zeros = 0;
  for (int64_t i = 0; i < p.hidden_states.tensor().numel(); ++i)
    zeros += p.hidden_states.data_ptr<float>()[i] == 0.0f;
  EXPECT_EQ(zeros, 0);
}

TEST(ProblemBuilder, ExpertMapIsARandomSubset) {
  ProblemSpec spec = routing_spec();
  spec.use_expert_map = true;
  spec.config.num_local_experts = 24;
  const Problem p = make_problem(spec);
  ASSERT_TRUE(p.expert_map.tensor().defined());
  ASSERT_EQ(p.expert_map.tensor().dtype(), DType::int32);
  ASSERT_EQ(p.expert_map.tensor().numel(), 64);
  std::set<int32_t> locals;
  int64_t non_local = 0;
  bool monotonic = true;
  int32_t last = -1;
  for (int64_t g = 0; g < 64; ++g) {
    const int32_t local = p.expert_map.data_ptr<int32_t>()[g];
    if (local < 0) {
      EXPECT_EQ(local, -1);
      ++non_local;
      continue;
    }
    EXPECT_LT(local, 24);
    locals.insert(local);
    monotonic = monotonic && local > last;
    last = local;
  }
  EXPECT_EQ(non_local, 64 - 24);
  EXPECT_EQ(locals.size(), 24u) << "local ids must be a permutation of [0, E_local)";
  EXPECT_FALSE(monotonic) << "local experts are numbered in random order";
  EXPECT_EQ(p.w13.tensor().size(0), 24);
  EXPECT_EQ(p.w2.tensor().size(0), 24);
  // Without the flag there is no map.
  EXPECT_FALSE(make_problem(routing_spec()).expert_map.tensor().defined());
}

TEST(ProblemBuilder, IdDtypeDoesNotChangeTheProblem) {
  ProblemSpec spec = routing_spec();
  const Problem a = make_problem(spec);
  spec.int64_ids = true;
  const Problem b = make_problem(spec);
  ASSERT_EQ(b.topk_ids.tensor().dtype(), DType::int64);
  for (int64_t i = 0; i < a.topk_ids.tensor().numel(); ++i)
    ASSERT_EQ(a.topk_ids.data_ptr<int32_t>()[i], b.topk_ids.data_ptr<int64_t>()[i]);
  EXPECT_EQ(oracle::moe_forward(a.oracle_inputs()), oracle::moe_forward(b.oracle_inputs()));
}

TEST(ProblemBuilder, RouterWeightOnInputGetsUnnormalizedWeights) {
  ProblemSpec spec = routing_spec();
  spec.config.topk = 1;
  spec.apply_router_weight_on_input = true;
  const Problem p = make_problem(spec);
  float lo = 1, hi = 0;
  for (int64_t t = 0; t < spec.M; ++t) {
    lo = std::min(lo, p.topk_weights.data_ptr<float>()[t]);
    hi = std::max(hi, p.topk_weights.data_ptr<float>()[t]);
  }
  EXPECT_GE(lo, 0.25f);
  EXPECT_LT(hi, 1.0f);
  EXPECT_GT(hi - lo, 0.5f);
  EXPECT_TRUE(p.oracle_inputs().apply_router_weight_on_input);
  spec.config.topk = 2;
  EXPECT_THROW(make_problem(spec), Error);
}

TEST(ProblemBuilder, QuantizedWeightsAndStaticScales) {
  const Problem p = make_problem(small_spec(QuantScheme::fp8_block));
  EXPECT_EQ(p.w13.tensor().dtype(), DType::fp8_e4m3);
  EXPECT_EQ(p.w13_scale.tensor().shape(), Shape({4, 3, 2}));  // 2N = 384, K = 256
  EXPECT_EQ(p.w2_scale.tensor().shape(), Shape({4, 2, 2}));   // K = 256, N = 192
  EXPECT_FALSE(p.a13_scale.tensor().defined());

  const Problem s = make_problem(small_spec(QuantScheme::fp8_tensor, /*static_scale=*/true));
  ASSERT_TRUE(s.a13_scale.tensor().defined() && s.a2_scale.tensor().defined());
  double amax = 0;
  for (int64_t i = 0; i < s.hidden_states.tensor().numel(); ++i)
    amax = std::max(amax, std::fabs(oracle::element_at(s.hidden_states, i)));
  EXPECT_EQ(s.a13_scale.data_ptr<float>()[0], float(amax) / 448.0f);
  EXPECT_EQ(s.a2_scale.data_ptr<float>()[0],
            float(oracle::intermediate_amax(s.oracle_inputs())) / 448.0f);
}

TEST(ProblemBuilder, EmptyBatch) {
  ProblemSpec spec = small_spec(QuantScheme::fp8_tensor, /*static_scale=*/true);
  spec.M = 0;
  const Problem p = make_problem(spec);
  EXPECT_EQ(p.hidden_states.tensor().shape(), Shape({0, 256}));
  EXPECT_EQ(p.output.tensor().shape(), Shape({0, 256}));
  EXPECT_EQ(p.a2_scale.data_ptr<float>()[0], 1.0f) << "no intermediate: a neutral scale";
  EXPECT_TRUE(oracle::moe_forward(p.oracle_inputs()).empty());
}

TEST(ProblemBuilder, PoisonFillsEveryFloatDtype) {
  for (DType dtype :
       {DType::bf16, DType::fp16, DType::fp32, DType::fp64, DType::fp8_e4m3, DType::e8m0}) {
    OwnedTensor t = host_tensor(dtype, {3, 5});
    std::memset(t.tensor().data(), 0, t.tensor().nbytes());
    // A strided view of columns 1..3 of every row: only those are poisoned.
    const Tensor view(static_cast<char*>(t.tensor().data()) + dtype_size(dtype), dtype, {3, 3},
                      {5, 1}, Device::cpu());
    testing::poison(view);
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t c = 0; c < 5; ++c) {
        const double v = oracle::element_at(t, r * 5 + c);
        EXPECT_EQ(std::isnan(v), c >= 1 && c <= 3) << dtype_name(dtype) << " " << r << "," << c;
      }
    }
  }
  OwnedTensor ints = host_tensor(DType::int32, {4});
  EXPECT_THROW(testing::poison(ints), Error);
}

}  // namespace
}  // namespace modmoe
