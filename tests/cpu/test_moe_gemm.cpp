// moe_gemm_groupwise on the CPU backend: against a double-precision reference, and its
// argument contract (the messages are the same on every backend: src/moe_gemm.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "modmoe/modmoe.h"
#include "modmoe/numeric.h"
#include "error_message.h"
#include "oracle/problem.h"

namespace modmoe {
namespace {

using ::testing::HasSubstr;
using testing::transpose_last_two;

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
  for (int64_t i = 0; i < b32.tensor().numel(); ++i)
    b32.data_ptr<float>()[i] = n(rng) / std::sqrt(float(c.K));
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
    for (int64_t i = 0; i < a32.tensor().numel(); ++i)
      store_float(in.a.tensor().data(), DType::bf16, i, a32.data_ptr<float>()[i]);
    for (int64_t i = 0; i < b32.tensor().numel(); ++i)
      store_float(in.b.tensor().data(), DType::bf16, i, b32.data_ptr<float>()[i]);
  }
  in.m_indptr = host_tensor(DType::int32, {c.E + 1});
  for (int64_t e = 0; e <= c.E; ++e) in.m_indptr.data_ptr<int32_t>()[e] = c.indptr[e];
  in.out = host_tensor(DType::bf16, {c.rows, N_out});
  for (int64_t i = 0; i < in.out.tensor().numel(); ++i)
    store_float(in.out.tensor().data(), DType::bf16, i, NAN);
  return in;
}

// Dequantized element of a or b (decoded by the definition, in double).
double deq_a(const GemmInputs& in, const GemmCase& c, int64_t r, int64_t k) {
  const double v = load_float(in.a.tensor().data(), in.a.tensor().dtype(), r * c.K + k);
  return c.dtype == DType::fp8_e4m3 ? v * in.a_scale.data_ptr<float>()[r * (c.K / 128) + k / 128]
                                    : v;
}
double deq_b(const GemmInputs& in, const GemmCase& c, int64_t e, int64_t n, int64_t k) {
  const double v =
      load_float(in.b.tensor().data(), in.b.tensor().dtype(), (e * c.N_b + n) * c.K + k);
  if (c.dtype != DType::fp8_e4m3) return v;
  const int64_t nb = (c.N_b + 127) / 128, kb = c.K / 128;
  return v * in.b_scale.data_ptr<float>()[(e * nb + n / 128) * kb + k / 128];
}

TEST(MoeGemmGroupwise, MatchesDoubleReferenceOnTheCpu) {
  const std::vector<GemmCase> cases = {
      {4, 64, 128, {0, 3, 3, 10, 12}, 12, DType::bf16, false, GatedLayout::GateUp},
      {4, 64, 256, {0, 3, 3, 10, 12}, 12, DType::bf16, true, GatedLayout::GateUp},
      {3, 96, 256, {2, 2, 9, 9}, 11, DType::fp8_e4m3, true, GatedLayout::UpGate},  // rows 0-1, 9-10
                                                                                   // unowned
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
          const double ref =
              c.gated ? activation_gated(Activation::silu, h[gate_column(c.layout, j, N_out)],
                                         h[up_column(c.layout, j, N_out)])
                      : h[j];
          const double got = load_float(in.out.tensor().data(), DType::bf16, r * N_out + j);
          ASSERT_NEAR(got, ref, 1e-2 * (1 + std::fabs(ref)))
              << "case " << ci << " row " << r << " col " << j;
        }
      }
    }
    // Rows no expert owns stay untouched (NaN-poisoned).
    for (int64_t r = 0; r < c.rows; ++r) {
      if (r >= c.indptr.front() && r < c.indptr.back()) continue;
      EXPECT_TRUE(std::isnan(load_float(in.out.tensor().data(), DType::bf16, r * N_out)))
          << "row " << r;
    }
  }
}

using testing::error_of;

TEST(MoeGemmGroupwise, RejectsWhatTheContractForbids) {
  GemmCase c{4, 1024, 256, {0, 3, 3, 10, 12}, 12, DType::bf16, true, GatedLayout::GateUp};
  GemmInputs in = make_inputs(c, 7);
  MoeGemmOptions gated;
  gated.gated = true;
  // out.size(1) for gated
  OwnedTensor wide = host_tensor(DType::bf16, {12, 1024});
  EXPECT_THAT(
      error_of([&] {
        moe_gemm_groupwise(Context::cpu(), in.a, in.b, {}, {}, in.m_indptr, wide, gated);
      }),
      HasSubstr("moe_gemm_groupwise: out.size(1) must be b.size(1)/2 = 512 for gated, got 1024"));
  // m_indptr length
  OwnedTensor short_indptr = host_tensor(DType::int32, {4});
  EXPECT_THAT(error_of([&] {
                moe_gemm_groupwise(Context::cpu(), in.a, in.b, {}, {}, short_indptr, in.out, gated);
              }),
              HasSubstr("m_indptr must have E+1 = 5 elements, got int32 (4,)"));
  // N_out % 16
  GemmCase odd{2, 72, 128, {0, 1, 2}, 2, DType::bf16, false, GatedLayout::GateUp};
  GemmInputs oi = make_inputs(odd, 8);
  EXPECT_THAT(error_of([&] {
                moe_gemm_groupwise(Context::cpu(), oi.a, oi.b, {}, {}, oi.m_indptr, oi.out);
              }),
              HasSubstr("N_out must be a multiple of 16, got 72"));
  // K % 128 for fp8 block
  OwnedTensor a8 = host_tensor(DType::fp8_e4m3, {2, 160}),
              b8 = host_tensor(DType::fp8_e4m3, {2, 64, 160});
  OwnedTensor o8 = host_tensor(DType::bf16, {2, 64});
  EXPECT_THAT(
      error_of([&] { moe_gemm_groupwise(Context::cpu(), a8, b8, {}, {}, oi.m_indptr, o8); }),
      HasSubstr("K must be a multiple of 128 for fp8 block scales, got 160"));
  // scales on bf16, MN-major, decreasing m_indptr, dtype mismatch
  EXPECT_THAT(error_of([&] {
                moe_gemm_groupwise(Context::cpu(), in.a, in.b, in.a.tensor(), {}, in.m_indptr,
                                   in.out, gated);
              }),
              HasSubstr("bf16 inputs take no scales"));
  in.m_indptr.data_ptr<int32_t>()[2] = 1;
  EXPECT_THAT(error_of([&] {
                moe_gemm_groupwise(Context::cpu(), in.a, in.b, {}, {}, in.m_indptr, in.out, gated);
              }),
              HasSubstr("m_indptr must be non-decreasing, got m_indptr[2] = 1 < m_indptr[1] = 3"));
  OwnedTensor a8_rows = host_tensor(DType::fp8_e4m3, {12, 256});
  EXPECT_THAT(
      error_of([&] {
        moe_gemm_groupwise(Context::cpu(), a8_rows, in.b, {}, {}, in.m_indptr, in.out, gated);
      }),
      HasSubstr("moe_gemm_groupwise: b must be fp8_e4m3 (E, N_b, K) = (4, 1024, 256), got bf16"));
}

// ---- MN-major scales, the fp8 gated output and the kernel options ---------------------------

// A host tensor whose every byte is `byte` (0xFF: NaN in bf16, fp32 and fp8 e4m3).
OwnedTensor poisoned(DType dtype, const Shape& shape, uint8_t byte = 0xFF) {
  OwnedTensor t = host_tensor(dtype, shape);
  std::memset(t.tensor().data(), byte, t.tensor().nbytes());
  return t;
}

// Bytes [begin, end) of row-major rows of `row_bytes` each.
std::vector<uint8_t> row_bytes(const Tensor& t, int64_t begin, int64_t end) {
  const size_t bytes_per_row = t.nbytes() / t.size(0);
  const uint8_t* p = static_cast<const uint8_t*>(t.data());
  return std::vector<uint8_t>(p + begin * bytes_per_row, p + end * bytes_per_row);
}

// Rows outside [first, last) still hold only 0xFF bytes.
void expect_rows_outside_poisoned(const Tensor& t, int64_t first, int64_t last, const char* what) {
  for (int64_t r = 0; r < t.size(0); ++r) {
    if (r >= first && r < last) continue;
    for (uint8_t byte : row_bytes(t, r, r + 1)) ASSERT_EQ(byte, 0xFF) << what << " row " << r;
  }
}

TEST(MoeGemmGroupwise, MnMajorScalesGiveTheKMajorResult) {
  // kb = K/128 = 2 and nb = N_b/128 = 3 differ, so a layout mix-up reads other scales (or
  // runs out of bounds under sanitizers); rows 0-1 and 23-24 belong to no expert.
  for (bool gated : {false, true}) {
    GemmCase c{4, 384, 256, {2, 2, 9, 20, 23}, 25, DType::fp8_e4m3, gated, GatedLayout::UpGate};
    GemmInputs in = make_inputs(c, 21 + gated);
    const int64_t N_out = gated ? c.N_b / 2 : c.N_b;
    MoeGemmOptions o;
    o.gated = gated;
    o.gated_layout = c.layout;
    OwnedTensor out_k = poisoned(DType::fp32, {c.rows, N_out});
    moe_gemm_groupwise(Context::cpu(), in.a, in.b, in.a_scale, in.b_scale, in.m_indptr, out_k, o);

    OwnedTensor a_scale_mn = transpose_last_two(in.a_scale),
                b_scale_mn = transpose_last_two(in.b_scale);
    ASSERT_EQ(a_scale_mn.tensor().shape(), (Shape{2, c.rows}));
    ASSERT_EQ(b_scale_mn.tensor().shape(), (Shape{c.E, 2, 3}));
    o.scale_major_mode = "MN";
    OwnedTensor out_mn = poisoned(DType::fp32, {c.rows, N_out});
    moe_gemm_groupwise(Context::cpu(), in.a, in.b, a_scale_mn, b_scale_mn, in.m_indptr, out_mn, o);

    for (int64_t i = 2 * N_out; i < 23 * N_out; ++i)
      ASSERT_TRUE(std::isfinite(out_k.data_ptr<float>()[i])) << "K-major out element " << i;
    // The same values in another layout: the same computation, so the same bits.
    EXPECT_EQ(row_bytes(out_mn, 0, c.rows), row_bytes(out_k, 0, c.rows))
        << (gated ? "gated" : "plain");
    expect_rows_outside_poisoned(out_mn, 2, 23, "MN out");
  }
}

TEST(MoeGemmGroupwise, Fp8GatedOutIsTheFp8BlockQuantizedFp32Out) {
  // N_out = 256: two scale groups per row. Row 5 of a is all zeros, so its output groups are
  // all zeros too: the quantizer's scale for that case (1.0) must come out of the GEMM as well.
  const std::vector<int32_t> indptr = {1, 4, 4, 12, 14};
  const int64_t first = 1, last = 14, zero_row = 5;
  int variant = 0;
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    for (GatedLayout layout : {GatedLayout::GateUp, GatedLayout::Interleaved}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) +
                   (layout == GatedLayout::GateUp ? " GateUp" : " Interleaved"));
      GemmCase c{4, 512, 256, indptr, 16, dtype, true, layout};
      GemmInputs in = make_inputs(c, 40 + variant++);
      std::memset(static_cast<char*>(in.a.tensor().data()) + zero_row * c.K * dtype_size(dtype), 0,
                  c.K * dtype_size(dtype));
      const int64_t N_out = 256;
      MoeGemmOptions o;
      o.gated = true;
      o.gated_layout = layout;
      o.activation = Activation::silu;
      OwnedTensor out32 = poisoned(DType::fp32, {c.rows, N_out});
      moe_gemm_groupwise(Context::cpu(), in.a, in.b, in.a_scale, in.b_scale, in.m_indptr, out32, o);

      OwnedTensor out8 = poisoned(DType::fp8_e4m3, {c.rows, N_out});
      OwnedTensor out_scale = poisoned(DType::fp32, {c.rows, N_out / 128});
      o.out_scale = out_scale;
      moe_gemm_groupwise(Context::cpu(), in.a, in.b, in.a_scale, in.b_scale, in.m_indptr, out8, o);

      // The reference: the public fp8_block activation quantizer on the fp32 rows.
      const Tensor owned32 = out32.tensor().slice(first, last);
      OwnedTensor q_ref = host_tensor(DType::fp8_e4m3, {last - first, N_out});
      OwnedTensor s_ref =
          host_tensor(DType::fp32, act_scale_shape(QuantScheme::fp8_block, last - first, N_out));
      quantize_activations(Context::cpu(), owned32, QuantScheme::fp8_block, false, q_ref, s_ref);
      EXPECT_EQ(row_bytes(out8, first, last), row_bytes(q_ref, 0, last - first));
      EXPECT_EQ(row_bytes(out_scale, first, last), row_bytes(s_ref, 0, last - first));
      EXPECT_EQ(out_scale.data_ptr<float>()[zero_row * 2], 1.0f);
      // Scales are the groups' own (not one shared value): two groups of a random row differ.
      EXPECT_NE(out_scale.data_ptr<float>()[first * 2], out_scale.data_ptr<float>()[first * 2 + 1]);
      expect_rows_outside_poisoned(out8, first, last, "out");
      expect_rows_outside_poisoned(out_scale, first, last, "out_scale");
    }
  }
}

TEST(MoeGemmGroupwise, RejectsBadScaleModesFp8OutsAndKernelOptions) {
  const auto cpu = Context::cpu();
  // kb = 2, nb = 3: every K-major scale shape differs from its MN-major one.
  GemmCase c{4, 384, 256, {0, 3, 3, 10, 12}, 12, DType::fp8_e4m3, false, GatedLayout::GateUp};
  GemmInputs in = make_inputs(c, 9);
  auto run = [&](const Tensor& a_scale, const Tensor& b_scale, const Tensor& out,
                 const MoeGemmOptions& o) {
    return error_of(
        [&] { moe_gemm_groupwise(cpu, in.a, in.b, a_scale, b_scale, in.m_indptr, out, o); });
  };
  OwnedTensor out_plain = host_tensor(DType::bf16, {12, 384});

  MoeGemmOptions bad_mode;
  bad_mode.scale_major_mode = "k";
  EXPECT_THAT(run(in.a_scale, in.b_scale, out_plain, bad_mode),
              HasSubstr("moe_gemm_groupwise: scale_major_mode must be \"K\" or \"MN\", got \"k\""));

  MoeGemmOptions mn;
  mn.scale_major_mode = "MN";
  OwnedTensor a_scale_mn = transpose_last_two(in.a_scale),
              b_scale_mn = transpose_last_two(in.b_scale);
  EXPECT_THAT(
      run(in.a_scale, b_scale_mn, out_plain, mn),
      HasSubstr("a_scale must be fp32 (K/128, total_rows) for MN = (2, 12), got fp32 (12, 2)"));
  EXPECT_THAT(
      run(a_scale_mn, in.b_scale, out_plain, mn),
      HasSubstr(
          "b_scale must be fp32 (E, K/128, ceil(N_b/128)) for MN = (4, 2, 3), got fp32 (4, 3, 2)"));
  EXPECT_EQ(run(a_scale_mn, b_scale_mn, out_plain, mn), "");
  // ... and the K-major shapes are still what "K" asks for.
  EXPECT_THAT(run(a_scale_mn, b_scale_mn, out_plain, {}),
              HasSubstr("a_scale must be fp32 (total_rows, K/128)"));

  // fp8 out: gated only, N_out a multiple of 128, with an out_scale (total_rows, N_out/128).
  OwnedTensor out8_plain = host_tensor(DType::fp8_e4m3, {12, 384});
  EXPECT_THAT(run(in.a_scale, in.b_scale, out8_plain, {}),
              HasSubstr("an fp8_e4m3 out (quantized gated output) needs gated = true"));
  MoeGemmOptions gated;
  gated.gated = true;
  OwnedTensor out8_192 = host_tensor(DType::fp8_e4m3, {12, 192});
  EXPECT_THAT(run(in.a_scale, in.b_scale, out8_192, gated),
              HasSubstr("an fp8_e4m3 out needs N_out to be a multiple of 128 (one scale per row "
                        "and 128 columns), got 192"));

  GemmCase wide{4, 512, 256, {0, 3, 3, 10, 12}, 12, DType::fp8_e4m3, true, GatedLayout::GateUp};
  GemmInputs w = make_inputs(wide, 10);
  auto run_wide = [&](const Tensor& out, const MoeGemmOptions& o) {
    return error_of(
        [&] { moe_gemm_groupwise(cpu, w.a, w.b, w.a_scale, w.b_scale, w.m_indptr, out, o); });
  };
  OwnedTensor out8 = host_tensor(DType::fp8_e4m3, {12, 256});
  EXPECT_THAT(run_wide(out8, gated),
              HasSubstr("out_scale must be fp32 (total_rows, N_out/128) = (12, 2), got undefined"));
  MoeGemmOptions bad_scale = gated;
  OwnedTensor scale_3 = host_tensor(DType::fp32, {12, 3});
  bad_scale.out_scale = scale_3;
  EXPECT_THAT(
      run_wide(out8, bad_scale),
      HasSubstr("out_scale must be fp32 (total_rows, N_out/128) = (12, 2), got fp32 (12, 3)"));
  OwnedTensor scale_bf16 = host_tensor(DType::bf16, {12, 2});
  bad_scale.out_scale = scale_bf16;
  EXPECT_THAT(
      run_wide(out8, bad_scale),
      HasSubstr("out_scale must be fp32 (total_rows, N_out/128) = (12, 2), got bf16 (12, 2)"));
  OwnedTensor scale_ok = host_tensor(DType::fp32, {12, 2});
  bad_scale.out_scale = scale_ok;
  OwnedTensor out_bf16 = host_tensor(DType::bf16, {12, 256});
  EXPECT_THAT(run_wide(out_bf16, bad_scale),
              HasSubstr("out_scale is only for an fp8_e4m3 out, got fp32 (12, 2)"));
  bad_scale.out_scale = Tensor(out8.tensor().data(), DType::fp32, {12, 2});  // inside out's bytes
  EXPECT_THAT(run_wide(out8, bad_scale), HasSubstr("out_scale must not overlap out"));

  // The kernel choice is a CUDA option: on a CPU context only "automatic" is accepted (and the
  // tile, a Hopper-kernel option, is ignored by the CPU backend with it).
  MoeGemmOptions sm90;
  sm90.kernel = MoeGemmKernel::sm90;
  EXPECT_THAT(run(in.a_scale, in.b_scale, out_plain, sm90),
              HasSubstr("kernel sm90 needs a CUDA context, got cpu"));
  MoeGemmOptions portable;
  portable.kernel = MoeGemmKernel::portable;
  EXPECT_THAT(run(in.a_scale, in.b_scale, out_plain, portable),
              HasSubstr("kernel portable needs a CUDA context, got cpu"));
  // A tile with the portable kernel is refused whichever check speaks first (the tile check is
  // device-independent; tests/cuda/test_sm90_moe_gemm.cpp checks its message on a CUDA context).
  portable.tile = "128x128";
  EXPECT_THAT(run(in.a_scale, in.b_scale, out_plain, portable), HasSubstr("portable"));
  EXPECT_NE(run(in.a_scale, in.b_scale, out_plain, portable), "");
}

// ---- MX-FP8: e4m3 a and b with e8m0 scales per 32 along K --------------------------------

struct MxCase {
  int64_t E, N_b, K;
  std::vector<int32_t> indptr;  // E + 1
  int64_t rows;
  bool gated;
  GatedLayout layout;
  DType out_dtype;
};

struct MxInputs {
  OwnedTensor a, b, a_scale, b_scale, m_indptr, out;
};

// e4m3 codes of normal draws (never all zero) and e8m0 exponents drawn per group: a in
// 2^-7..2^7, b in 2^-17..2^-5 (weights are small; the gated products then land where silu is
// neither linear nor saturated). Groups differ by up to 2^14, so a scale read from the wrong
// group or row cannot go unnoticed.
MxInputs make_mx_inputs(const MxCase& c, uint64_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> a_exponent(120, 134), b_exponent(110, 122);
  const int64_t groups = c.K / 32, N_out = c.gated ? c.N_b / 2 : c.N_b;
  MxInputs in;
  in.a = host_tensor(DType::fp8_e4m3, {c.rows, c.K});
  in.b = host_tensor(DType::fp8_e4m3, {c.E, c.N_b, c.K});
  in.a_scale = host_tensor(DType::e8m0, {c.rows, groups});
  in.b_scale = host_tensor(DType::e8m0, {c.E, c.N_b, groups});
  for (const Tensor& t : {in.a.tensor(), in.b.tensor()})
    for (int64_t i = 0; i < t.numel(); ++i)
      static_cast<uint8_t*>(t.data())[i] = float_to_e4m3(normal(rng));
  for (int64_t i = 0; i < in.a_scale.tensor().numel(); ++i)
    in.a_scale.data_ptr<uint8_t>()[i] = static_cast<uint8_t>(a_exponent(rng));
  for (int64_t i = 0; i < in.b_scale.tensor().numel(); ++i)
    in.b_scale.data_ptr<uint8_t>()[i] = static_cast<uint8_t>(b_exponent(rng));
  in.m_indptr = host_tensor(DType::int32, {c.E + 1});
  for (int64_t e = 0; e <= c.E; ++e) in.m_indptr.data_ptr<int32_t>()[e] = c.indptr[e];
  in.out = poisoned(c.out_dtype, {c.rows, N_out});
  return in;
}

// The MX definition in double: e4m3 value times 2^(v - 127) of the element's 32-wide K group.
double mx_value(const Tensor& q, const Tensor& scale, int64_t row, int64_t k) {
  const int64_t K = q.size(-1), groups = scale.size(-1);
  const double v = load_float(q.data(), DType::fp8_e4m3, row * K + k);
  const int exponent = static_cast<const uint8_t*>(scale.data())[row * groups + k / 32];
  return std::ldexp(v, exponent - 127);
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

TEST(MoeGemmGroupwise, MxFp8MatchesDoubleReferenceOnTheCpu) {
  const std::vector<MxCase> cases = {
      // K = 96: three groups, not a multiple of 128; rows 0-1 and 13-14 belong to no expert,
      // expert 0 is empty.
      {3, 96, 96, {2, 2, 9, 13}, 15, true, GatedLayout::UpGate, DType::fp32},
      // Plain, N_b = 80 (no multiple of 32), experts 1 and 3 empty, rows 19-20 unowned.
      {4, 80, 160, {0, 5, 5, 19, 19}, 21, false, GatedLayout::GateUp, DType::fp32},
      // One K group, the last expert empty, interleaved gate/up rows, a bf16 out.
      {2, 64, 32, {0, 7, 7}, 7, true, GatedLayout::Interleaved, DType::bf16},
      {5, 32, 224, {1, 2, 4, 4, 10, 11}, 12, false, GatedLayout::GateUp, DType::bf16},
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const MxCase& c = cases[ci];
    SCOPED_TRACE("MX case " + std::to_string(ci));
    MxInputs in = make_mx_inputs(c, 300 + ci);
    MoeGemmOptions o;
    o.gated = c.gated;
    o.gated_layout = c.layout;
    moe_gemm_groupwise(Context::cpu(), in.a, in.b, in.a_scale, in.b_scale, in.m_indptr, in.out, o);

    const int64_t N_out = c.gated ? c.N_b / 2 : c.N_b;
    // fp32 out: only fp32 accumulation differs from the reference, so the bound is |a|·|b|
    // summed (the scale of the rounding), not the result. bf16 out: its own rounding.
    const double accumulate = 5e-5, store = c.out_dtype == DType::bf16 ? 8e-3 : 1e-6;
    for (int64_t e = 0; e < c.E; ++e) {
      for (int64_t r = c.indptr[e]; r < c.indptr[e + 1]; ++r) {
        std::vector<double> h(c.N_b, 0.0), h_abs(c.N_b, 0.0);
        for (int64_t n = 0; n < c.N_b; ++n) {
          for (int64_t k = 0; k < c.K; ++k) {
            const double p =
                mx_value(in.a, in.a_scale, r, k) * mx_value(in.b, in.b_scale, e * c.N_b + n, k);
            h[n] += p;
            h_abs[n] += std::fabs(p);
          }
        }
        for (int64_t j = 0; j < N_out; ++j) {
          double ref = h[j], tol = accumulate * h_abs[j];
          if (c.gated) {
            const int64_t g = gate_column(c.layout, j, N_out), u = up_column(c.layout, j, N_out);
            ref = silu(h[g]) * h[u];
            // silu' is at most 1.1 in magnitude: how the gate's and up's errors reach the out.
            tol =
                accumulate * (1.1 * std::fabs(h[u]) * h_abs[g] + std::fabs(silu(h[g])) * h_abs[u]);
          }
          const double got = load_float(in.out.tensor().data(), c.out_dtype, r * N_out + j);
          ASSERT_TRUE(std::isfinite(got)) << "row " << r << " col " << j;
          ASSERT_NEAR(got, ref, tol + store * std::fabs(ref)) << "row " << r << " col " << j;
        }
      }
    }
    expect_rows_outside_poisoned(in.out, c.indptr.front(), c.indptr.back(), "MX out");
  }
}

TEST(MoeGemmGroupwise, MxFp8RejectsWhatTheContractForbids) {
  const auto cpu = Context::cpu();
  // K/32 = 8 groups and N_b = 384: the fp8_block shapes (12, 2) and (4, 3, 2) all differ.
  MxCase c{4, 384, 256, {0, 3, 3, 10, 12}, 12, false, GatedLayout::GateUp, DType::bf16};
  MxInputs in = make_mx_inputs(c, 31);
  auto run = [&](const Tensor& a_scale, const Tensor& b_scale, const Tensor& out,
                 const MoeGemmOptions& o) {
    return error_of(
        [&] { moe_gemm_groupwise(cpu, in.a, in.b, a_scale, b_scale, in.m_indptr, out, o); });
  };
  EXPECT_EQ(run(in.a_scale, in.b_scale, in.out, {}), "");

  // Scale shapes: MX's own, not the block ones.
  OwnedTensor a_scale_block = host_tensor(DType::e8m0, {12, 2}),
              b_scale_block = host_tensor(DType::e8m0, {4, 3, 8});
  EXPECT_THAT(run(a_scale_block, in.b_scale, in.out, {}),
              HasSubstr("moe_gemm_groupwise: a_scale must be e8m0 (total_rows, K/32) = (12, 8), "
                        "got e8m0 (12, 2)"));
  EXPECT_THAT(run(in.a_scale, b_scale_block, in.out, {}),
              HasSubstr("moe_gemm_groupwise: b_scale must be e8m0 (E, N_b, K/32) = (4, 384, 8), "
                        "got e8m0 (4, 3, 8)"));
  EXPECT_THAT(run({}, in.b_scale, in.out, {}),
              HasSubstr("a_scale must be e8m0 (total_rows, K/32) = (12, 8), got undefined"));

  // One e8m0 and one fp32 scale: no scheme, either way round.
  OwnedTensor a_scale_fp32 = host_tensor(DType::fp32, {12, 2}),
              b_scale_fp32 = host_tensor(DType::fp32, {4, 3, 2});
  for (const Tensor& t : {a_scale_fp32.tensor(), b_scale_fp32.tensor()})
    for (int64_t i = 0; i < t.numel(); ++i) static_cast<float*>(t.data())[i] = 0.5f;
  EXPECT_THAT(run(in.a_scale, b_scale_fp32, in.out, {}),
              HasSubstr("moe_gemm_groupwise: a_scale and b_scale must both be e8m0 (MX-FP8, one "
                        "scale per 32 along K) or both fp32 (fp8 block scales), got a_scale e8m0 "
                        "(12, 8) on cpu and b_scale fp32 (4, 3, 2) on cpu"));
  EXPECT_THAT(run(a_scale_fp32, in.b_scale, in.out, {}),
              HasSubstr("got a_scale fp32 (12, 2) on cpu and b_scale e8m0 (4, 384, 8) on cpu"));
  // ... while two fp32 scales of the block shapes are still the fp8_block scheme.
  EXPECT_EQ(run(a_scale_fp32, b_scale_fp32, in.out, {}), "");

  // MX scales are K-major only.
  MoeGemmOptions mn;
  mn.scale_major_mode = "MN";
  EXPECT_THAT(run(in.a_scale, in.b_scale, in.out, mn),
              HasSubstr("moe_gemm_groupwise: scale_major_mode must be \"K\" with MX-FP8 inputs "
                        "(e8m0 scales), got \"MN\": MX scales are K-major only"));

  // The fp8 out is the fp8_block operand: not with MX inputs.
  MoeGemmOptions gated;
  gated.gated = true;
  OwnedTensor out8 = host_tensor(DType::fp8_e4m3, {12, 192});
  OwnedTensor out8_scale = host_tensor(DType::fp32, {12, 1});
  gated.out_scale = out8_scale;
  EXPECT_THAT(run(in.a_scale, in.b_scale, out8, gated),
              HasSubstr("moe_gemm_groupwise: out must be bf16, fp16 or fp32 with MX-FP8 inputs "
                        "(e8m0 scales), got fp8_e4m3 (12, 192) on cpu"));
  OwnedTensor out_gated = host_tensor(DType::fp32, {12, 192});
  gated.out_scale = Tensor();
  EXPECT_EQ(run(in.a_scale, in.b_scale, out_gated, gated), "");

  // K: a multiple of 32 (one scale per 32; the portable CUDA kernel's 16 is implied).
  OwnedTensor a48 = host_tensor(DType::fp8_e4m3, {12, 48}),
              b48 = host_tensor(DType::fp8_e4m3, {4, 384, 48});
  OwnedTensor a48_scale = host_tensor(DType::e8m0, {12, 2}),
              b48_scale = host_tensor(DType::e8m0, {4, 384, 2});
  EXPECT_THAT(error_of([&] {
                moe_gemm_groupwise(cpu, a48, b48, a48_scale, b48_scale, in.m_indptr, in.out);
              }),
              HasSubstr("moe_gemm_groupwise: K must be a multiple of 32 for MX-FP8 scales (one "
                        "e8m0 per 32 along K), got 48"));

  // e8m0 scales on bf16 inputs are still "no scales".
  OwnedTensor a16 = host_tensor(DType::bf16, {12, 256}),
              b16 = host_tensor(DType::bf16, {4, 384, 256});
  EXPECT_THAT(error_of([&] {
                moe_gemm_groupwise(cpu, a16, b16, in.a_scale, in.b_scale, in.m_indptr, in.out);
              }),
              HasSubstr("bf16 inputs take no scales, got a_scale e8m0 (12, 8) on cpu"));
}

}  // namespace
}  // namespace modmoe
