// moe_gemm_groupwise on the CPU backend: against a double-precision reference, and its
// argument contract (the messages are the same on every backend: src/moe_gemm.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "modmoe/modmoe.h"
#include "modmoe/numeric.h"

namespace modmoe {
namespace {

using ::testing::HasSubstr;

struct GemmCase {
  int64_t E, N_b, K;
  std::vector<int32_t> indptr;  // E + 1
  int64_t rows;
  DType dtype;
  bool gated;
  GatedLayout layout;
};

struct GemmInputs {
  OwnedTensor a, b, a_scale, b_scale, m_indptr, out;
};

GemmInputs make_inputs(const GemmCase& c, uint64_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  GemmInputs in;
  const int64_t N_out = c.gated ? c.N_b / 2 : c.N_b;
  OwnedTensor a32 = host_tensor(DType::fp32, {c.rows, c.K});
  OwnedTensor b32 = host_tensor(DType::fp32, {c.E, c.N_b, c.K});
  for (int64_t i = 0; i < a32.tensor().numel(); ++i) a32.data_ptr<float>()[i] = n(rng);
  for (int64_t i = 0; i < b32.tensor().numel(); ++i) b32.data_ptr<float>()[i] = n(rng) / std::sqrt(float(c.K));
  if (c.dtype == DType::fp8_e4m3) {
    const QuantScheme s = QuantScheme::fp8_block;
    in.a = host_tensor(DType::fp8_e4m3, {c.rows, c.K});
    in.a_scale = host_tensor(DType::fp32, act_scale_shape(s, c.rows, c.K));
    in.b = host_tensor(DType::fp8_e4m3, {c.E, c.N_b, c.K});
    in.b_scale = host_tensor(DType::fp32, weight_scale_shape(s, c.E, c.N_b, c.K));
    quantize_activations(Context::cpu(), a32, s, false, in.a, in.a_scale);
    quantize_weights(Context::cpu(), b32, s, in.b, in.b_scale);
  } else {
    in.a = host_tensor(DType::bf16, {c.rows, c.K});
    in.b = host_tensor(DType::bf16, {c.E, c.N_b, c.K});
    for (int64_t i = 0; i < a32.tensor().numel(); ++i) store_float(in.a.tensor().data(), DType::bf16, i, a32.data_ptr<float>()[i]);
    for (int64_t i = 0; i < b32.tensor().numel(); ++i) store_float(in.b.tensor().data(), DType::bf16, i, b32.data_ptr<float>()[i]);
  }
  in.m_indptr = host_tensor(DType::int32, {c.E + 1});
  for (int64_t e = 0; e <= c.E; ++e) in.m_indptr.data_ptr<int32_t>()[e] = c.indptr[e];
  in.out = host_tensor(DType::bf16, {c.rows, N_out});
  for (int64_t i = 0; i < in.out.tensor().numel(); ++i) store_float(in.out.tensor().data(), DType::bf16, i, NAN);
  return in;
}

// Dequantized element of a or b (decoded by the definition, in double).
double deq_a(const GemmInputs& in, const GemmCase& c, int64_t r, int64_t k) {
  const double v = load_float(in.a.tensor().data(), in.a.tensor().dtype(), r * c.K + k);
  return c.dtype == DType::fp8_e4m3 ? v * in.a_scale.data_ptr<float>()[r * (c.K / 128) + k / 128] : v;
}
double deq_b(const GemmInputs& in, const GemmCase& c, int64_t e, int64_t n, int64_t k) {
  const double v = load_float(in.b.tensor().data(), in.b.tensor().dtype(), (e * c.N_b + n) * c.K + k);
  if (c.dtype != DType::fp8_e4m3) return v;
  const int64_t nb = (c.N_b + 127) / 128, kb = c.K / 128;
  return v * in.b_scale.data_ptr<float>()[(e * nb + n / 128) * kb + k / 128];
}

TEST(MoeGemmGroupwise, MatchesDoubleReferenceOnTheCpu) {
  const std::vector<GemmCase> cases = {
      {4, 64, 128, {0, 3, 3, 10, 12}, 12, DType::bf16, false, GatedLayout::GateUp},
      {4, 64, 256, {0, 3, 3, 10, 12}, 12, DType::bf16, true, GatedLayout::GateUp},
      {3, 96, 256, {2, 2, 9, 9}, 11, DType::fp8_e4m3, true, GatedLayout::UpGate},  // rows 0-1, 9-10 unowned
      {2, 160, 128, {0, 1, 5}, 5, DType::fp8_e4m3, false, GatedLayout::GateUp},
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const GemmCase& c = cases[ci];
    GemmInputs in = make_inputs(c, 100 + ci);
    MoeGemmOptions o;
    o.gated = c.gated;
    o.gated_layout = c.layout;
    moe_gemm_groupwise(Context::cpu(), in.a, in.b, in.a_scale, in.b_scale, in.m_indptr, in.out, o);
    const int64_t N_out = c.gated ? c.N_b / 2 : c.N_b;
    for (int64_t e = 0; e < c.E; ++e) {
      for (int64_t r = c.indptr[e]; r < c.indptr[e + 1]; ++r) {
        std::vector<double> h(c.N_b, 0.0);
        for (int64_t n = 0; n < c.N_b; ++n)
          for (int64_t k = 0; k < c.K; ++k) h[n] += deq_a(in, c, r, k) * deq_b(in, c, e, n, k);
        for (int64_t j = 0; j < N_out; ++j) {
          const double ref = c.gated ? activation_gated(Activation::silu, h[gate_column(c.layout, j, N_out)],
                                                        h[up_column(c.layout, j, N_out)])
                                     : h[j];
          const double got = load_float(in.out.tensor().data(), DType::bf16, r * N_out + j);
          ASSERT_NEAR(got, ref, 1e-2 * (1 + std::fabs(ref))) << "case " << ci << " row " << r << " col " << j;
        }
      }
    }
    // Rows no expert owns stay untouched (NaN-poisoned).
    for (int64_t r = 0; r < c.rows; ++r) {
      if (r >= c.indptr.front() && r < c.indptr.back()) continue;
      EXPECT_TRUE(std::isnan(load_float(in.out.tensor().data(), DType::bf16, r * N_out))) << "row " << r;
    }
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(MoeGemmGroupwise, RejectsWhatTheContractForbids) {
  GemmCase c{4, 1024, 256, {0, 3, 3, 10, 12}, 12, DType::bf16, true, GatedLayout::GateUp};
  GemmInputs in = make_inputs(c, 7);
  MoeGemmOptions gated;
  gated.gated = true;
  // out.size(1) for gated
  OwnedTensor wide = host_tensor(DType::bf16, {12, 1024});
  EXPECT_THAT(error_of([&] { moe_gemm_groupwise(Context::cpu(), in.a, in.b, {}, {}, in.m_indptr, wide, gated); }),
              HasSubstr("moe_gemm_groupwise: out.size(1) must be b.size(1)/2 = 512 for gated, got 1024"));
  // m_indptr length
  OwnedTensor short_indptr = host_tensor(DType::int32, {4});
  EXPECT_THAT(error_of([&] { moe_gemm_groupwise(Context::cpu(), in.a, in.b, {}, {}, short_indptr, in.out, gated); }),
              HasSubstr("m_indptr must have E+1 = 5 elements, got int32 (4,)"));
  // N_out % 16
  GemmCase odd{2, 72, 128, {0, 1, 2}, 2, DType::bf16, false, GatedLayout::GateUp};
  GemmInputs oi = make_inputs(odd, 8);
  EXPECT_THAT(error_of([&] { moe_gemm_groupwise(Context::cpu(), oi.a, oi.b, {}, {}, oi.m_indptr, oi.out); }),
              HasSubstr("N_out must be a multiple of 16, got 72"));
  // K % 128 for fp8 block
  OwnedTensor a8 = host_tensor(DType::fp8_e4m3, {2, 160}), b8 = host_tensor(DType::fp8_e4m3, {2, 64, 160});
  OwnedTensor o8 = host_tensor(DType::bf16, {2, 64});
  EXPECT_THAT(error_of([&] { moe_gemm_groupwise(Context::cpu(), a8, b8, {}, {}, oi.m_indptr, o8); }),
              HasSubstr("K must be a multiple of 128 for fp8 block scales, got 160"));
  // scales on bf16, MN-major, decreasing m_indptr, dtype mismatch
  EXPECT_THAT(error_of([&] { moe_gemm_groupwise(Context::cpu(), in.a, in.b, in.a.tensor(), {}, in.m_indptr, in.out, gated); }),
              HasSubstr("bf16 inputs take no scales"));
  MoeGemmOptions mn = gated;
  mn.scale_major_mode = "MN";
  EXPECT_THAT(error_of([&] { moe_gemm_groupwise(Context::cpu(), in.a, in.b, {}, {}, in.m_indptr, in.out, mn); }),
              HasSubstr("scale_major_mode must be \"K\""));
  in.m_indptr.data_ptr<int32_t>()[2] = 1;
  EXPECT_THAT(error_of([&] { moe_gemm_groupwise(Context::cpu(), in.a, in.b, {}, {}, in.m_indptr, in.out, gated); }),
              HasSubstr("m_indptr must be non-decreasing, got m_indptr[2] = 1 < m_indptr[1] = 3"));
  OwnedTensor a8_rows = host_tensor(DType::fp8_e4m3, {12, 256});
  EXPECT_THAT(error_of([&] { moe_gemm_groupwise(Context::cpu(), a8_rows, in.b, {}, {}, in.m_indptr, in.out, gated); }),
              HasSubstr("moe_gemm_groupwise: b must be fp8_e4m3 (E, N_b, K) = (4, 1024, 256), got bf16"));
}

}  // namespace
}  // namespace modmoe
