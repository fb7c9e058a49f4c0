// The Hopper grouped GEMM (sm90::launch, the entry point moe_gemm_groupwise and Sm90Experts
// share) with fp8 block scales and K, N not multiples of 128: ceil(K/128) scale groups per row
// with a partial last one, a partial last K block (TMA's zero fill past K), B rows of a gated
// half starting inside a 128-row weight-scale block, and the fp8 out's partial last
// quantization group. Called directly because the public moe_gemm_groupwise contract still
// asks K % 128 for fp8 block scales (its CPU path reads K/128 groups), and because it sets the
// grid: FewCtasTakeManyTilesEach runs 1-3 persistent CTAs over many tiles each (the stage ring
// and the ping-pong hand-off), with bf16 operands as well (the fp8 operands' values, rounded).
//
// Reference: the same e4m3 codes and scales dequantized on the host (quant.h), products in
// double; an fp8 out is compared with the CPU quantizer applied to that reference (same
// groups), dequantized. Rows outside [m_indptr[0], m_indptr[E]) keep their 0xFF poison.
// Every test needs a device that can run the Hopper kernel; elsewhere it is reported skipped.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_session.h"
#include "cuda/gpu_test.h"
#include "cuda/sm90/sm90_gemm.h"
#include "cuda/sm90_test_util.h"
#include "modmoe/modmoe.h"
#include "modmoe/numeric.h"

namespace modmoe {
namespace {

using testing::CudaSession;
using testing::sm90::indptr_from_counts;
using testing::sm90::Mode;
using testing::sm90::mode_name;
using testing::sm90::Uniform;
namespace sm90 = cuda::sm90;

constexpr double kFp32OutTolerance = 1e-3;  // accumulation order (and wgmma's fp8 accumulator)
constexpr double kFp8OutTolerance = 3e-2;   // a few 1-code flips of e4m3

// The problem: K, the experts' rows (m_indptr) in the rows of a, the operands' dtype and the
// grid. The default: K = 320 = 2.5 * 128 (three scale groups, the last one 64 wide), ragged
// experts (empty ones, 1 row, one past 128 rows), rows 0 and 199 owned by none.
struct Problem {
  int64_t K = 320;
  std::vector<int32_t> indptr = indptr_from_counts({3, 0, 130, 1, 64}, 1);
  int64_t rows = 200;
  DType ab_dtype = DType::fp8_e4m3;  // bf16: the fp8 operands' dequantized values, rounded
  int grid = 0;                      // persistent CTAs; 0: one per SM
  int64_t E() const { return static_cast<int64_t>(indptr.size()) - 1; }
};

// e4m3 codes and block scales of random data: every 1x128 block of a and 128x128 block of b
// gets its own power-of-two factor (2^-2 .. 2^2), so a scale read from the wrong block shows.
struct Operands {
  OwnedTensor a, a_scale, b, b_scale;  // host; a and b in the problem's dtype (bf16: no scales)
  std::vector<float> a_deq, b_deq;     // what they hold, as floats: (rows, K) and (E, N_b, K)
};

float block_factor(Uniform& u) {
  return std::ldexp(1.0f, static_cast<int>(std::lround(2.0f * u())));
}

Operands make_operands(const Problem& p, int64_t N_b, uint64_t seed) {
  Uniform u(seed);
  const int64_t E = p.E(), K = p.K, rows = p.rows;
  const int64_t kb = (K + 127) / 128, nb = (N_b + 127) / 128;
  OwnedTensor a32 = host_tensor(DType::fp32, {rows, K}),
              b32 = host_tensor(DType::fp32, {E, N_b, K});
  float* a = a32.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < kb; ++g) {
      const float f = block_factor(u);
      for (int64_t k = g * 128; k < std::min(K, g * 128 + 128); ++k) a[r * K + k] = f * u();
    }
  float* b = b32.data_ptr<float>();
  std::vector<float> factors(nb * kb);
  for (int64_t e = 0; e < E; ++e) {
    for (float& f : factors) f = block_factor(u) / std::sqrt(static_cast<float>(K));
    for (int64_t n = 0; n < N_b; ++n)
      for (int64_t k = 0; k < K; ++k)
        b[(e * N_b + n) * K + k] = factors[(n / 128) * kb + k / 128] * u();
  }
  const QuantScheme q = QuantScheme::fp8_block;
  Operands o;
  o.a = host_tensor(DType::fp8_e4m3, {rows, K});
  o.b = host_tensor(DType::fp8_e4m3, {E, N_b, K});
  o.a_scale = host_tensor(DType::fp32, act_scale_shape(q, rows, K));
  o.b_scale = host_tensor(DType::fp32, weight_scale_shape(q, E, N_b, K));
  quantize_activations(Context::cpu(), a32, q, false, o.a, o.a_scale);
  quantize_weights(Context::cpu(), b32, q, o.b, o.b_scale);
  dequantize_activations(Context::cpu(), o.a, o.a_scale, q, a32);
  dequantize_weights(Context::cpu(), o.b, o.b_scale, q, b32);
  o.a_deq.assign(a, a + rows * K);
  o.b_deq.assign(b, b + E * N_b * K);
  if (p.ab_dtype == DType::bf16) {
    // The same values in bf16 (an e4m3 code times a power of two mostly fits; the rest rounds).
    o.a = host_tensor(DType::bf16, {rows, K});
    o.b = host_tensor(DType::bf16, {E, N_b, K});
    for (auto [t, v] : {std::pair{&o.a, &o.a_deq}, std::pair{&o.b, &o.b_deq}}) {
      for (size_t i = 0; i < v->size(); ++i) {
        store_float(t->tensor().data(), DType::bf16, static_cast<int64_t>(i), (*v)[i]);
        (*v)[i] = load_float(t->tensor().data(), DType::bf16, static_cast<int64_t>(i));
      }
    }
  }
  return o;
}

// The reference out (rows, N_out) in fp32; rows nobody owns are 0 (never compared).
std::vector<float> reference(const Problem& p, const Operands& o, int64_t N_b, Mode mode) {
  const std::vector<int32_t>& indptr = p.indptr;
  const int64_t K = p.K;
  const bool gated = mode != Mode::plain;
  const int64_t N_out = gated ? N_b / 2 : N_b;
  const GatedLayout layout = testing::sm90::options_for(mode).gated_layout;
  std::vector<float> out(p.rows * N_out, 0.0f);
  std::vector<double> c(N_b);
  for (int64_t e = 0; e < p.E(); ++e)
    for (int64_t r = indptr[e]; r < indptr[e + 1]; ++r) {
      for (int64_t n = 0; n < N_b; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += double(o.a_deq[r * K + k]) * double(o.b_deq[(e * N_b + n) * K + k]);
        c[n] = s;
      }
      for (int64_t j = 0; j < N_out; ++j)
        out[r * N_out + j] = static_cast<float>(
            gated ? activation_gated(Activation::silu, c[gate_column(layout, j, N_out)],
                                     c[up_column(layout, j, N_out)])
                  : c[j]);
    }
  return out;
}

// Runs the kernel with `tile` into a poisoned out (and out_scale); throws its refusal.
struct Result {
  OwnedTensor out, out_scale;  // host
};

Result run(const CudaSession& gpu, const Problem& p, const Operands& o, int64_t N_b, Mode mode,
           DType out_dtype, const std::string& tile) {
  const bool gated = mode != Mode::plain, fp8 = p.ab_dtype == DType::fp8_e4m3;
  const int64_t N_out = gated ? N_b / 2 : N_b, scale_cols = (N_out + 127) / 128;
  const OwnedTensor a = gpu.to_device(o.a), b = gpu.to_device(o.b),
                    a_scale = gpu.to_device(o.a_scale), b_scale = gpu.to_device(o.b_scale);
  OwnedTensor indptr = host_tensor(DType::int32, {p.E() + 1});
  std::copy(p.indptr.begin(), p.indptr.end(), indptr.data_ptr<int32_t>());
  const OwnedTensor m_indptr = gpu.to_device(indptr);
  const OwnedTensor out = gpu.empty(out_dtype, {p.rows, N_out});
  const OwnedTensor out_scale = gpu.empty(DType::fp32, {p.rows, scale_cols});
  if (cudaMemsetAsync(out.tensor().data(), 0xFF, out.tensor().nbytes(), gpu.stream()) !=
          cudaSuccess ||
      cudaMemsetAsync(out_scale.tensor().data(), 0xFF, out_scale.tensor().nbytes(), gpu.stream()) !=
          cudaSuccess)
    throw Error("cudaMemsetAsync of out failed");
  sm90::GemmArgs g;
  g.a = a.tensor().data();
  g.total_rows = p.rows;
  g.b = b.tensor().data();
  g.E = p.E();
  g.N_b = N_b;
  g.K = p.K;
  g.ab_dtype = p.ab_dtype;
  g.m_indptr = m_indptr.data_ptr<int32_t>();
  g.a_scale = fp8 ? a_scale.data_ptr<float>() : nullptr;
  g.b_scale = fp8 ? b_scale.data_ptr<float>() : nullptr;
  g.gated = gated;
  g.gated_layout = testing::sm90::options_for(mode).gated_layout;
  g.activation = Activation::silu;
  g.d = out.tensor().data();
  g.d_dtype = out_dtype;
  g.d_scale = out_dtype == DType::fp8_e4m3 ? out_scale.data_ptr<float>() : nullptr;
  g.tile = tile;
  g.sm_count = p.grid > 0 ? p.grid : gpu.ctx().sm_count;
  sm90::launch(g, gpu.stream());
  return Result{gpu.to_host(out), gpu.to_host(out_scale)};
}

// Relative RMS overall and per expert below `tol`, every owned value finite, the rest poison.
::testing::AssertionResult close_to(const Problem& p, const std::vector<float>& got,
                                    const std::vector<float>& ref, const Tensor& got_host,
                                    int64_t N_out, double tol) {
  const std::vector<int32_t>& indptr = p.indptr;
  double num = 0, den = 0;
  for (size_t e = 0; e + 1 < indptr.size(); ++e) {
    double num_e = 0, den_e = 0;
    for (int64_t r = indptr[e]; r < indptr[e + 1]; ++r)
      for (int64_t j = 0; j < N_out; ++j) {
        const double g = got[r * N_out + j], x = ref[r * N_out + j];
        if (!std::isfinite(g))
          return ::testing::AssertionFailure() << "non-finite " << g << " at row " << r << " col "
                                               << j << " (expert " << e << ")";
        num_e += (g - x) * (g - x);
        den_e += x * x;
      }
    if (den_e > 0 && !(std::sqrt(num_e / den_e) < tol))
      return ::testing::AssertionFailure()
             << "expert " << e << ": relative RMS error " << std::sqrt(num_e / den_e);
    num += num_e;
    den += den_e;
  }
  if (!(std::sqrt(num / den) < tol))
    return ::testing::AssertionFailure() << "relative RMS error " << std::sqrt(num / den);
  const size_t row_bytes = got_host.nbytes() / got_host.size(0);
  const auto* bytes = static_cast<const uint8_t*>(got_host.data());
  for (int64_t r = 0; r < p.rows; ++r) {
    if (r >= indptr.front() && r < indptr.back()) continue;
    for (size_t i = 0; i < row_bytes; ++i)
      if (bytes[r * row_bytes + i] != 0xFF)
        return ::testing::AssertionFailure() << "row " << r << " (owned by no expert) was written";
  }
  return ::testing::AssertionSuccess();
}

std::vector<float> as_floats(const Tensor& t) {
  std::vector<float> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = load_float(t.data(), t.dtype(), i);
  return v;
}

// Runs `mode` with an fp8 out (N_out columns) on each tile and compares it, dequantized, with the
// CPU quantizer applied to the reference (same groups), and its scales with the quantizer's.
void expect_fp8_out_matches_the_cpu_quantizer(const CudaSession& gpu, const Problem& p,
                                              int64_t N_out, Mode mode,
                                              const std::vector<std::string>& tiles,
                                              uint64_t seed) {
  const int64_t scale_cols = (N_out + 127) / 128;
  const Operands o = make_operands(p, 2 * N_out, seed);
  OwnedTensor ref32 = host_tensor(DType::fp32, {p.rows, N_out});
  const std::vector<float> ref = reference(p, o, 2 * N_out, mode);
  std::copy(ref.begin(), ref.end(), ref32.data_ptr<float>());
  OwnedTensor ref_q = host_tensor(DType::fp8_e4m3, {p.rows, N_out}),
              ref_scale = host_tensor(DType::fp32, {p.rows, scale_cols});
  quantize_activations(Context::cpu(), ref32, QuantScheme::fp8_block, false, ref_q, ref_scale);
  dequantize_activations(Context::cpu(), ref_q, ref_scale, QuantScheme::fp8_block, ref32);
  const std::vector<float> ref_deq(ref32.data_ptr<float>(), ref32.data_ptr<float>() + ref.size());
  for (const std::string& tile : tiles) {
    const std::string what =
        std::string(mode_name(mode)) + " tile \"" + tile + "\" grid " + std::to_string(p.grid);
    Result r;
    ASSERT_EQ(
        testing::error_of([&] { r = run(gpu, p, o, 2 * N_out, mode, DType::fp8_e4m3, tile); }), "")
        << what;
    std::vector<float> got(p.rows * N_out, 0.0f);
    const float* s = r.out_scale.data_ptr<float>();
    for (int64_t row = p.indptr.front(); row < p.indptr.back(); ++row)
      for (int64_t j = 0; j < N_out; ++j)
        got[row * N_out + j] = load_float(r.out.tensor().data(), DType::fp8_e4m3, row * N_out + j) *
                               s[row * scale_cols + j / 128];
    EXPECT_TRUE(close_to(p, got, ref_deq, r.out, N_out, kFp8OutTolerance)) << what;
    EXPECT_TRUE(
        close_to(p, as_floats(r.out_scale), as_floats(ref_scale), r.out_scale, scale_cols, 4e-3))
        << what << ": out_scale";
  }
}

// fp32 out, every tile: plain N_b = 336 (2.625 * 128), gated N = 192 (1.5 * 128) in each layout.
// Every tile takes every layout: at N = 192 the up (GateUp) or gate (UpGate) rows of a tile start
// 64 rows into a 128-row weight-scale block, which the 128x256 tile's 128-row halves straddle at
// their middle (each 64-row part reads its own scale) and the other tiles' halves of <= 64 rows
// never cross; an Interleaved half of 128x256 spans two blocks, split at the same place.
TEST(Sm90GemmUnaligned, Fp8BlockEveryTileMatchesTheDequantizedReference) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  const Problem p;
  for (Mode mode : {Mode::plain, Mode::gate_up, Mode::up_gate, Mode::interleaved}) {
    const int64_t N_b = mode == Mode::plain ? 336 : 2 * 192,
                  N_out = mode == Mode::plain ? N_b : 192;
    const Operands o = make_operands(p, N_b, 11000 + static_cast<uint64_t>(mode));
    const std::vector<float> ref = reference(p, o, N_b, mode);
    std::vector<std::string> tiles = {""};
    for (const std::string& t : sm90::tile_names())
      if (sm90::tile_runs(t, p.ab_dtype, mode != Mode::plain)) tiles.push_back(t);
    for (const std::string& tile : tiles) {
      const std::string what = std::string(mode_name(mode)) + " tile \"" + tile + "\"";
      Result r;
      ASSERT_EQ(testing::error_of([&] { r = run(gpu, p, o, N_b, mode, DType::fp32, tile); }), "")
          << what;
      EXPECT_TRUE(close_to(p, as_floats(r.out), ref, r.out, N_out, kFp32OutTolerance)) << what;
    }
  }
}

// N = 160 (N % 64 == 32): GateUp's up rows start 32 rows into a scale block, inside a 64-row
// part of every 128x128, 64x256 and 128x256 half: those tiles refuse, naming the rule; 64x128
// (32-row halves) takes the call, and so does the heuristic (stepping down to it).
TEST(Sm90GemmUnaligned, Fp8BlockTilesRefuseScalePartsThatStraddleABlock) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  const Problem p;
  const int64_t N_out = 160;
  const Operands o = make_operands(p, 2 * N_out, 11100);
  const std::vector<float> ref = reference(p, o, 2 * N_out, Mode::gate_up);
  for (const std::string tile : {"128x256", "128x128", "64x256"}) {
    Result r;
    const std::string refused =
        testing::error_of([&] { r = run(gpu, p, o, 2 * N_out, Mode::gate_up, DType::fp32, tile); });
    EXPECT_THAT(refused, ::testing::HasSubstr("tile " + tile)) << tile;
    EXPECT_THAT(refused, ::testing::HasSubstr("N % 64 == 0")) << tile;
  }
  for (const std::string tile : {"", "64x128"}) {
    Result r;
    ASSERT_EQ(
        testing::error_of([&] { r = run(gpu, p, o, 2 * N_out, Mode::gate_up, DType::fp32, tile); }),
        "")
        << tile;
    EXPECT_TRUE(close_to(p, as_floats(r.out), ref, r.out, N_out, kFp32OutTolerance)) << tile;
  }
}

// 16-bit outs leave the epilogue as 8-byte pieces, 4 columns of a row per lane after a swap
// with the neighbouring lane (store_tile: whole 32-byte sectors per instruction). Plain,
// N_b = 170 (170 % 8 == 2): rows past row 0 are not 8-byte aligned, so every row takes the
// 4-byte fallback, and a row's last piece is partial. An odd N_out (column pairs would straddle
// rows) is refused by name. On the 64x256 tile (kCompactStores) N_b = 336 drives both of
// store_tile's loops: the compact one for columns 0-255 (every store whole), the general one for
// the partial block; N_b = 170 the general one only.
TEST(Sm90GemmUnaligned, SixteenBitOutsOfRowsNotAMultipleOf8Columns) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  const Problem p;
  constexpr double kSixteenBitOutTolerance = 4e-3;  // one rounding to bf16 / fp16
  for (const int64_t N_b : {int64_t{336}, int64_t{170}}) {
    const Operands o = make_operands(p, N_b, 11200 + static_cast<uint64_t>(N_b));
    const std::vector<float> ref = reference(p, o, N_b, Mode::plain);
    std::vector<std::string> tiles = {""};
    for (const std::string& t : sm90::tile_names())
      if (sm90::tile_runs(t, p.ab_dtype, false)) tiles.push_back(t);
    for (DType out_dtype : {DType::bf16, DType::fp16}) {
      for (const std::string& tile : tiles) {
        const std::string what = "N_b " + std::to_string(N_b) + " out " + dtype_name(out_dtype) +
                                 " tile \"" + tile + "\"";
        Result r;
        ASSERT_EQ(testing::error_of([&] { r = run(gpu, p, o, N_b, Mode::plain, out_dtype, tile); }),
                  "")
            << what;
        EXPECT_TRUE(close_to(p, as_floats(r.out), ref, r.out, N_b, kSixteenBitOutTolerance))
            << what;
      }
    }
  }
  const Operands odd = make_operands(p, 171, 11300);
  Result r;
  EXPECT_THAT(testing::error_of([&] { r = run(gpu, p, odd, 171, Mode::plain, DType::bf16, ""); }),
              ::testing::HasSubstr("even number of columns, got 171"));
}

// The bf16 swapped tile (144x256: the weights as the wgmma's M side, 144 rows of a as its N side)
// at the rows around its height (0, 1, 143, 144, 145, 289 and 7 rows per expert, unowned rows
// before and after), a partial last K block (K = 1096: 17 x 64 + 8) and a partial column tile
// (N_b = 336 = 256 + 80), into each out dtype, with one CTA per SM and with 3 CTAs taking many
// tiles each. The heuristic gives it only calls of K >= 4096; asked for by name it runs any plain
// bf16 call.
TEST(Sm90GemmUnaligned, Bf16SwappedTileAtRowsAroundItsHeight) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  ASSERT_TRUE(sm90::tile_runs("144x256", DType::bf16, false));
  Problem p;
  p.ab_dtype = DType::bf16;
  p.K = 1096;
  p.indptr = indptr_from_counts({0, 1, 143, 144, 145, 289, 7}, 5);
  p.rows = p.indptr.back() + 3;
  const int64_t N_b = 336;
  const Operands o = make_operands(p, N_b, 11400);
  const std::vector<float> ref = reference(p, o, N_b, Mode::plain);
  for (int grid : {0, 3}) {
    p.grid = grid;
    for (DType out_dtype : {DType::fp32, DType::bf16, DType::fp16}) {
      const std::string what =
          std::string("out ") + dtype_name(out_dtype) + " grid " + std::to_string(grid);
      Result r;
      ASSERT_EQ(testing::error_of(
                    [&] { r = run(gpu, p, o, N_b, Mode::plain, out_dtype, "144x256"); }),
                "")
          << what;
      EXPECT_TRUE(close_to(p, as_floats(r.out), ref, r.out, N_b,
                           out_dtype == DType::fp32 ? kFp32OutTolerance : 4e-3))
          << what;
    }
  }
}

// The fp8 gated out (GEMM1 of Sm90Experts): N = 192, two quantization groups per row, the
// second one 64 columns wide; compared with the CPU quantizer applied to the reference. On the
// 64x256 tile the first group takes gated_epilogue's compact store loop, the second the general.
TEST(Sm90GemmUnaligned, Fp8BlockGatedFp8OutMatchesTheCpuQuantizer) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  const Problem p;
  const int64_t N_out = 192;
  for (Mode mode : {Mode::gate_up, Mode::up_gate, Mode::interleaved})
    expect_fp8_out_matches_the_cpu_quantizer(gpu, p, N_out, mode, {"", "64x256", "128x256"},
                                             12000 + static_cast<uint64_t>(mode));
}

// Rows the fp8 out's quantizer must not treat as ordinary: a NaN in a row of a (its out row is
// NaN), a scale of 1e38 (the products overflow fp32: inf, and silu(-inf) * inf = NaN), an
// all-zero row (amax 0: scale 1, codes 0) and rows scaled by 2^-62 (amax below 448 * 2^-126:
// the scale is not a normal float and the quotient takes the 2^64 pre-scale). A non-finite row's
// scales are NaN and each code is e4m3's NaN (0x7f / 0xff); the tiny rows match the CPU
// quantizer row by row, the others as a whole. The rows sit in both 8-row halves of a warp's
// 16 rows (r_lo and r_lo + 8) and, with N = 192, in the 64x256 tile's compact store loop (first
// group: its fast path of finite rows with a normal scale, and the other rows' e4m3_pair) and
// its general loop (second group).
TEST(Sm90GemmUnaligned, Fp8BlockGatedFp8OutOfNonFiniteZeroAndTinyRows) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  const Problem p;
  const int64_t N_out = 192, scale_cols = 2, K = p.K, kb = (K + 127) / 128;
  Operands o = make_operands(p, 2 * N_out, 12100);
  auto* codes = static_cast<uint8_t*>(o.a.tensor().data());
  float* a_scale = o.a_scale.data_ptr<float>();
  // Experts own rows 1-3, 4-133, 134, 135-198; expert 2's tiles start at rows 4 and 68.
  const int64_t nan_row = 13, inf_row = 2, zero_row = 5;
  const std::vector<int64_t> tiny_rows = {12, 100};
  codes[nan_row * K + 7] = 0x7f;  // e4m3's NaN
  a_scale[inf_row * kb] = 1e38f;
  std::fill(codes + zero_row * K, codes + zero_row * K + K, uint8_t{0});
  for (int64_t r : tiny_rows)
    for (int64_t g = 0; g < kb; ++g) a_scale[r * kb + g] *= 0x1p-62f;
  OwnedTensor a32 = host_tensor(DType::fp32, {p.rows, K});
  dequantize_activations(Context::cpu(), o.a, o.a_scale, QuantScheme::fp8_block, a32);
  o.a_deq.assign(a32.data_ptr<float>(), a32.data_ptr<float>() + p.rows * K);

  const std::vector<float> ref = reference(p, o, 2 * N_out, Mode::gate_up);
  OwnedTensor ref32 = host_tensor(DType::fp32, {p.rows, N_out});
  std::copy(ref.begin(), ref.end(), ref32.data_ptr<float>());
  OwnedTensor ref_q = host_tensor(DType::fp8_e4m3, {p.rows, N_out}),
              ref_scale = host_tensor(DType::fp32, {p.rows, scale_cols});
  quantize_activations(Context::cpu(), ref32, QuantScheme::fp8_block, false, ref_q, ref_scale);
  dequantize_activations(Context::cpu(), ref_q, ref_scale, QuantScheme::fp8_block, ref32);
  std::vector<float> ref_deq(ref32.data_ptr<float>(), ref32.data_ptr<float>() + ref.size());
  for (int64_t r : {nan_row, inf_row}) std::fill_n(ref_deq.begin() + r * N_out, N_out, 0.0f);
  const float* want_scale = ref_scale.data_ptr<float>();

  for (const std::string tile : {"", "64x256", "128x256"}) {
    const std::string what = "tile \"" + tile + "\"";
    Result r;
    ASSERT_EQ(testing::error_of(
                  [&] { r = run(gpu, p, o, 2 * N_out, Mode::gate_up, DType::fp8_e4m3, tile); }),
              "")
        << what;
    const auto* q = static_cast<const uint8_t*>(r.out.tensor().data());
    const float* s = r.out_scale.data_ptr<float>();
    std::vector<float> got(p.rows * N_out, 0.0f);
    for (int64_t row = p.indptr.front(); row < p.indptr.back(); ++row) {
      if (row == nan_row || row == inf_row) {
        for (int64_t c = 0; c < scale_cols; ++c)
          EXPECT_TRUE(std::isnan(s[row * scale_cols + c]))
              << what << " row " << row << " scale " << c;
        for (int64_t j = 0; j < N_out; ++j)
          EXPECT_EQ(q[row * N_out + j] & 0x7f, 0x7f) << what << " row " << row << " col " << j;
        continue;
      }
      for (int64_t j = 0; j < N_out; ++j)
        got[row * N_out + j] =
            load_float(q, DType::fp8_e4m3, row * N_out + j) * s[row * scale_cols + j / 128];
    }
    for (int64_t c = 0; c < scale_cols; ++c) {
      EXPECT_EQ(s[zero_row * scale_cols + c], 1.0f) << what << " zero row, scale " << c;
      for (int64_t row : tiny_rows) {
        const float want = want_scale[row * scale_cols + c];
        EXPECT_LT(want, 448.0f * 0x1p-126f) << "row " << row << " is not tiny enough to test";
        EXPECT_NEAR(s[row * scale_cols + c], want, 4e-3 * want) << what << " row " << row;
      }
    }
    for (int64_t j = 0; j < N_out; ++j)
      EXPECT_EQ(q[zero_row * N_out + j] & 0x7f, 0) << what << " zero row, col " << j;  // +-0
    for (int64_t row : tiny_rows) {
      double num = 0, den = 0;
      for (int64_t j = 0; j < N_out; ++j) {
        const double g = got[row * N_out + j], x = ref_deq[row * N_out + j];
        num += (g - x) * (g - x);
        den += x * x;
      }
      EXPECT_GT(den, 0.0) << what << " row " << row;
      EXPECT_LT(std::sqrt(num / den), kFp8OutTolerance) << what << " row " << row;
    }
    EXPECT_TRUE(close_to(p, got, ref_deq, r.out, N_out, kFp8OutTolerance)) << what;
  }
}

// Persistent CTAs that take many tiles each: grids of 1, 2 and 3 CTAs, and K = 1408 (11 fp8 K
// blocks, 22 bf16: more than twice the stages of any tile), so a CTA's K blocks go round its
// stage ring many times; on the ping-pong tile (64x256) each consumer takes every other tile,
// steps past the other's stages and waits for its turn. (With one CTA per SM the other tests'
// problems give a CTA one tile or none: a stage ring skipped by whole tiles once passed them
// and only the benchmark's shapes failed.) Every tile, bf16 and fp8, plain and gated, fp32 out;
// the gated fp8 out on the 256-wide tiles. (The bf16 swapped 144x256 tile: plain only.)
TEST(Sm90GemmUnaligned, FewCtasTakeManyTilesEach) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  Problem p;
  p.K = 1408;
  p.indptr = indptr_from_counts({1, 64, 65, 0, 3, 130, 17, 40, 2}, 1);
  p.rows = p.indptr.back() + 2;
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    p.ab_dtype = dtype;
    for (Mode mode : {Mode::plain, Mode::gate_up}) {
      const int64_t N_b = 512, N_out = mode == Mode::plain ? N_b : N_b / 2;
      const Operands o = make_operands(p, N_b, 13000 + static_cast<uint64_t>(mode));
      const std::vector<float> ref = reference(p, o, N_b, mode);
      for (int grid : {1, 2, 3}) {
        p.grid = grid;
        for (const std::string& tile : sm90::tile_names()) {
          if (!sm90::tile_runs(tile, dtype, mode != Mode::plain)) continue;
          const std::string what = std::string(dtype_name(dtype)) + " " + mode_name(mode) +
                                   " tile " + tile + " grid " + std::to_string(grid);
          Result r;
          ASSERT_EQ(testing::error_of([&] { r = run(gpu, p, o, N_b, mode, DType::fp32, tile); }),
                    "")
              << what;
          EXPECT_TRUE(close_to(p, as_floats(r.out), ref, r.out, N_out, kFp32OutTolerance)) << what;
          if (mode != Mode::plain) continue;
          // A bf16 out: the 128-row tiles store whole 16-row pieces through TMA.
          ASSERT_EQ(testing::error_of([&] { r = run(gpu, p, o, N_b, mode, DType::bf16, tile); }),
                    "")
              << what << " bf16 out";
          EXPECT_TRUE(close_to(p, as_floats(r.out), ref, r.out, N_out, 4e-3))
              << what << " bf16 out";
        }
      }
      p.grid = 0;
    }
  }
  p.ab_dtype = DType::fp8_e4m3;
  p.grid = 2;
  expect_fp8_out_matches_the_cpu_quantizer(gpu, p, 256, Mode::gate_up, {"64x256", "128x256"},
                                           13100);
}

}  // namespace
}  // namespace modmoe
