// moe_gemm_groupwise on the CPU backend: against a double-precision reference, and its
// argument contract (the messages are the same on every backend: src/moe_gemm.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
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

// The last two dims of a contiguous fp32 tensor swapped (2-D or 3-D): the K-major scale
// layouts turned into the MN-major ones.
OwnedTensor transpose_last_two(const Tensor& t) {
  const int64_t batch = t.ndim() == 3 ? t.size(0) : 1, R = t.size(-2), C = t.size(-1);
  OwnedTensor out = host_tensor(DType::fp32, t.ndim() == 3 ? Shape{batch, C, R} : Shape{C, R});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c)
        out.data_ptr<float>()[(b * C + c) * R + r] = t.data_ptr<const float>()[(b * R + r) * C + c];
  return out;
}

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
  EXPECT_EQ(run(a_scale_mn, b_scale_mn, out_plain, mn), "<no error>");
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
  EXPECT_NE(run(in.a_scale, in.b_scale, out_plain, portable), "<no error>");
}

}  // namespace
}  // namespace modmoe
