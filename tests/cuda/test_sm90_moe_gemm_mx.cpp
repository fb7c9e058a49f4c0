// MX-FP8 (e4m3 with an e8m0 scale per 32 along K, for a per row and for b per row of b) through
// the Hopper kernel (MoeGemmOptions::kernel = sm90), against the CPU backend on the same codes.
//
// What the inputs are made to catch:
//   * every 32-wide K chunk of a and of b is scaled by its own random power of two (2^-3..2^3),
//     so the e8m0 codes differ from chunk to chunk and from column to column: a scale read for
//     the wrong K step, row or column moves the result by up to 64x;
//   * gated N = b.size(1)/2 = 160, not a multiple of any tile's width: partial column tiles,
//     and (GateUp) up rows of a partial tile past b's last row, whose scales must not be read;
//   * ragged experts (empty, 1 row, around 64 and 128 rows), E = 1 holding every row, and E = 256
//     with 0-6 rows each; rows outside [m_indptr[0], m_indptr[E]) keep their poison;
//   * the e8m0 codes 0x00 (2^-127) and 0xff (NaN), which the kernel's fast decode does not
//     cover: NaN exactly where the CPU has NaN, the same values elsewhere.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_session.h"
#include "cuda/gpu_test.h"
#include "cuda/sm90_test_util.h"
#include "modmoe/modmoe.h"
#include "modmoe/numeric.h"

namespace modmoe {
namespace {

using testing::CudaSession;
using testing::sm90::indptr_from_counts;
using testing::sm90::Mode;
using testing::sm90::mode_name;
using testing::sm90::options_for;
using testing::sm90::Uniform;

// Accumulation order only (each 32-deep wgmma step is promoted in fp32 on both sides).
constexpr double kTolerance = 1e-3;

struct MxInputs {
  OwnedTensor a, b, a_scale, b_scale, m_indptr;
  int64_t E() const { return m_indptr.tensor().numel() - 1; }
};

// rows x K activations and E x N_b x K weights, each 32-chunk scaled by 2^[-3, 3], quantized by
// the CPU's mxfp8 quantizers.
MxInputs make_inputs(int64_t K, int64_t N_b, int64_t rows, const std::vector<int32_t>& indptr,
                     uint64_t seed) {
  Uniform u(seed);
  const int64_t E = static_cast<int64_t>(indptr.size()) - 1;
  auto chunk_factor = [&u] { return std::ldexp(1.0f, static_cast<int>(std::lround(3.0f * u()))); };
  OwnedTensor a32 = host_tensor(DType::fp32, {rows, K}),
              b32 = host_tensor(DType::fp32, {E, N_b, K});
  float* a = a32.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
      const float f = chunk_factor();
      for (int64_t k = k0; k < k0 + 32; ++k) a[r * K + k] = f * u();
    }
  float* b = b32.data_ptr<float>();
  const float inv_sqrt_k = 1.0f / std::sqrt(static_cast<float>(K));
  for (int64_t n = 0; n < E * N_b; ++n)
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
      const float f = chunk_factor() * inv_sqrt_k;
      for (int64_t k = k0; k < k0 + 32; ++k) b[n * K + k] = f * u();
    }
  const QuantScheme q = QuantScheme::mxfp8;
  MxInputs in;
  in.a = host_tensor(DType::fp8_e4m3, {rows, K});
  in.b = host_tensor(DType::fp8_e4m3, {E, N_b, K});
  in.a_scale = host_tensor(DType::e8m0, act_scale_shape(q, rows, K));
  in.b_scale = host_tensor(DType::e8m0, weight_scale_shape(q, E, N_b, K));
  quantize_activations(Context::cpu(), a32, q, false, in.a, in.a_scale);
  quantize_weights(Context::cpu(), b32, q, in.b, in.b_scale);
  in.m_indptr = host_tensor(DType::int32, {E + 1});
  std::copy(indptr.begin(), indptr.end(), in.m_indptr.data_ptr<int32_t>());
  return in;
}

OwnedTensor poisoned_host(DType dtype, const Shape& shape) {
  OwnedTensor t = host_tensor(dtype, shape);
  std::memset(t.tensor().data(), 0xFF, t.tensor().nbytes());
  return t;
}

OwnedTensor cpu_reference(const MxInputs& in, int64_t N_out, const MoeGemmOptions& o) {
  OwnedTensor out = poisoned_host(DType::fp32, {in.a.tensor().size(0), N_out});
  moe_gemm_groupwise(Context::cpu(), in.a, in.b, in.a_scale, in.b_scale, in.m_indptr, out, o);
  return out;
}

struct DeviceMx {
  OwnedTensor a, b, a_scale, b_scale, m_indptr;
  DeviceMx(const CudaSession& gpu, const MxInputs& in)
      : a(gpu.to_device(in.a)),
        b(gpu.to_device(in.b)),
        a_scale(gpu.to_device(in.a_scale)),
        b_scale(gpu.to_device(in.b_scale)),
        m_indptr(gpu.to_device(in.m_indptr)) {}
};

// Poisons out, runs the Hopper kernel (tile "" = the heuristic), returns out on the host.
OwnedTensor run_sm90(const CudaSession& gpu, const DeviceMx& d, const Tensor& out,
                     MoeGemmOptions o) {
  if (cudaMemsetAsync(out.data(), 0xFF, out.nbytes(), gpu.stream()) != cudaSuccess)
    throw Error("cudaMemsetAsync of out failed");
  o.kernel = MoeGemmKernel::sm90;
  moe_gemm_groupwise(gpu.ctx(), d.a, d.b, d.a_scale, d.b_scale, d.m_indptr, out, o);
  return gpu.to_host(out);
}

// got vs ref (fp32, host): NaN exactly where ref is NaN; elsewhere finite, relative RMS per
// expert and overall below kTolerance; rows nobody owns still all 0xFF bytes.
::testing::AssertionResult matches(const Tensor& got, const Tensor& ref,
                                   const std::vector<int32_t>& indptr) {
  const int64_t N = got.size(1), E = static_cast<int64_t>(indptr.size()) - 1;
  const float* g = got.data_ptr<const float>();
  const float* x = ref.data_ptr<const float>();
  double num = 0, den = 0;
  for (int64_t e = 0; e < E; ++e) {
    double num_e = 0, den_e = 0;
    for (int64_t r = indptr[e]; r < indptr[e + 1]; ++r)
      for (int64_t j = 0; j < N; ++j) {
        const float gv = g[r * N + j], xv = x[r * N + j];
        if (std::isnan(xv) != std::isnan(gv) || (!std::isnan(gv) && !std::isfinite(gv)))
          return ::testing::AssertionFailure() << "row " << r << " col " << j << " (expert " << e
                                               << "): got " << gv << ", CPU " << xv;
        if (std::isnan(xv)) continue;
        num_e += (gv - xv) * double(gv - xv);
        den_e += double(xv) * xv;
      }
    const double rel_e = den_e > 0 ? std::sqrt(num_e / den_e) : std::sqrt(num_e);
    if (!(rel_e < kTolerance))
      return ::testing::AssertionFailure() << "expert " << e << ": relative RMS error " << rel_e;
    num += num_e, den += den_e;
  }
  if (!(std::sqrt(num / den) < kTolerance))
    return ::testing::AssertionFailure() << "relative RMS error " << std::sqrt(num / den);
  const auto* bytes = static_cast<const uint8_t*>(got.data());
  for (int64_t r = 0; r < got.size(0); ++r) {
    if (r >= indptr.front() && r < indptr.back()) continue;
    for (int64_t i = 0; i < N * 4; ++i)
      if (bytes[r * N * 4 + i] != 0xFF)
        return ::testing::AssertionFailure() << "row " << r << " (owned by no expert) was written";
  }
  return ::testing::AssertionSuccess();
}

// ---- every fp8 tile x scheduler x mode on ragged experts -----------------------------------

class Sm90MoeGemmMx : public ::testing::TestWithParam<Mode> {};

TEST_P(Sm90MoeGemmMx, EveryTileAndSchedulerMatchesTheCpu) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  const Mode mode = GetParam();
  // Row 0-2 and the last 5 rows belong to no expert.
  const std::vector<int32_t> indptr = indptr_from_counts({0, 1, 63, 65, 128, 129, 0, 40}, 3);
  const int64_t K = 384, N_b = 320, rows = indptr.back() + 5;
  const MoeGemmOptions base = options_for(mode);
  const int64_t N_out = base.gated ? N_b / 2 : N_b;
  const MxInputs in = make_inputs(K, N_b, rows, indptr, 4100 + static_cast<int>(mode));
  const OwnedTensor ref = cpu_reference(in, N_out, base);
  const DeviceMx dev(gpu, in);
  const OwnedTensor out = gpu.empty(DType::fp32, {rows, N_out});
  std::vector<std::string> tiles = {""};
  for (const std::string& t : moe_gemm_sm90_tiles()) tiles.push_back(t);
  int explicit_tiles_run = 0;
  for (const std::string& tile : tiles)
    for (MoeGemmScheduler s : {MoeGemmScheduler::cooperative, MoeGemmScheduler::linear_scan,
                               MoeGemmScheduler::precomputed}) {
      MoeGemmOptions o = base;
      o.tile = tile;
      o.scheduler = s;
      OwnedTensor got;
      const std::string refused = testing::error_of([&] { got = run_sm90(gpu, dev, out, o); });
      if (!refused.empty()) {  // the 256-wide tiles and the bf16 one; never the heuristic's pick
        EXPECT_FALSE(tile.empty()) << refused;
        EXPECT_TRUE(tile == "128x256" || tile == "64x256" || tile == "144x256")
            << tile << ": " << refused;
        EXPECT_THAT(refused, ::testing::HasSubstr(tile));
        continue;
      }
      explicit_tiles_run += !tile.empty();
      EXPECT_TRUE(matches(got, ref, indptr))
          << mode_name(mode) << " tile \"" << tile << "\" scheduler " << static_cast<int>(s);
    }
  EXPECT_EQ(explicit_tiles_run, 3 * 3)
      << "128x128, 64x128 and 64x64 must all take MX (with each of the three schedulers)";
}

INSTANTIATE_TEST_SUITE_P(Modes, Sm90MoeGemmMx,
                         ::testing::Values(Mode::plain, Mode::gate_up, Mode::up_gate,
                                           Mode::interleaved),
                         [](const ::testing::TestParamInfo<Mode>& info) {
                           return std::string(mode_name(info.param));
                         });

// ---- one expert holding every row; many small experts -------------------------------------

TEST(Sm90MoeGemmMxExperts, OneExpertAndManyExpertsMatchTheCpu) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  std::vector<int32_t> many(256);
  Uniform u(77);
  for (int32_t& c : many) c = static_cast<int32_t>(3.5f * (u() + 1.0f));  // 0..6 rows
  for (const std::vector<int32_t>& counts : {std::vector<int32_t>{0, 0, 300, 0}, many}) {
    const std::vector<int32_t> indptr = indptr_from_counts(counts);
    const int64_t K = 256, N_b = 256, rows = indptr.back();
    const MxInputs in = make_inputs(K, N_b, rows, indptr, 4200 + counts.size());
    const DeviceMx dev(gpu, in);
    for (Mode mode : {Mode::plain, Mode::gate_up}) {
      const MoeGemmOptions o = options_for(mode);
      const int64_t N_out = o.gated ? N_b / 2 : N_b;
      const OwnedTensor out = gpu.empty(DType::fp32, {rows, N_out});
      EXPECT_TRUE(matches(run_sm90(gpu, dev, out, o), cpu_reference(in, N_out, o), indptr))
          << "E " << counts.size() << " " << mode_name(mode);
    }
  }
}

// ---- the e8m0 codes the fast decode does not cover ---------------------------------------

TEST(Sm90MoeGemmMxExperts, ScaleCodesZeroAndNaNDecodeAsOnTheCpu) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  // Expert 1 is row 5 alone (its error is not averaged away); expert 4 is rows 70-159.
  const std::vector<int32_t> indptr = indptr_from_counts({5, 1, 64, 0, 90});
  const int64_t K = 256, N_b = 256, rows = indptr.back();
  MxInputs in = make_inputs(K, N_b, rows, indptr, 4300);
  uint8_t* as = in.a_scale.data_ptr<uint8_t>();
  uint8_t* bs = in.b_scale.data_ptr<uint8_t>();
  const int64_t kq = K / 32;
  // 0x00 (2^-127) in row 5's chunk 3, against b codes 234 (2^107) for that chunk of expert 1:
  // the chunk then weighs like the others, so reading the code as 0 (the fast decode's value)
  // would move row 5 by about a chunk's share.
  as[5 * kq + 3] = 0x00;
  for (int64_t n = 0; n < N_b; ++n) bs[(1 * N_b + n) * kq + 3] = 234;
  // 0xff (NaN): one a chunk (row 100, every column) and one b row chunk (expert 4, row 17:
  // column 17 of every row of expert 4).
  as[100 * kq + 6] = 0xff;
  bs[(4 * N_b + 17) * kq + 1] = 0xff;
  const DeviceMx dev(gpu, in);
  const MoeGemmOptions o = options_for(Mode::plain);
  const OwnedTensor ref = cpu_reference(in, N_b, o);
  ASSERT_TRUE(std::isnan(ref.data_ptr<const float>()[100 * N_b + 3])) << "the CPU's NaN row";
  ASSERT_TRUE(std::isnan(ref.data_ptr<const float>()[80 * N_b + 17])) << "the CPU's NaN column";
  {  // The check can fail: with row 5's chunk 3 counted as 0, row 5 moves far past kTolerance.
    MxInputs zeroed = make_inputs(K, N_b, rows, indptr, 4300);
    std::memcpy(zeroed.a_scale.data_ptr<uint8_t>(), as, zeroed.a_scale.tensor().nbytes());
    std::memcpy(zeroed.b_scale.data_ptr<uint8_t>(), bs, zeroed.b_scale.tensor().nbytes());
    std::memset(zeroed.a.data_ptr<uint8_t>() + 5 * K + 3 * 32, 0, 32);
    const OwnedTensor without = cpu_reference(zeroed, N_b, o);
    double num = 0, den = 0;
    for (int64_t j = 0; j < N_b; ++j) {
      const double d =
          without.data_ptr<const float>()[5 * N_b + j] - ref.data_ptr<const float>()[5 * N_b + j];
      num += d * d;
      den += double(ref.data_ptr<const float>()[5 * N_b + j]) *
             ref.data_ptr<const float>()[5 * N_b + j];
    }
    ASSERT_GT(std::sqrt(num / den), 30 * kTolerance) << "the 0x00 code would not be noticed";
  }
  const OwnedTensor out = gpu.empty(DType::fp32, {rows, N_b});
  EXPECT_TRUE(matches(run_sm90(gpu, dev, out, o), ref, indptr));
}

// ---- which kernel automatic picks ----------------------------------------------------------

// automatic runs MX on the Hopper kernel where it accepts the call: the same kernel gives the
// same bits (no atomics), the portable kernel (another accumulation order) would not.
TEST(Sm90MoeGemmMxExperts, AutomaticPicksTheHopperKernel) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  const std::vector<int32_t> indptr = indptr_from_counts({40, 0, 77, 9});
  const MxInputs in = make_inputs(512, 256, indptr.back(), indptr, 4500);
  const DeviceMx dev(gpu, in);
  const OwnedTensor out = gpu.empty(DType::fp32, {indptr.back(), 128});
  const MoeGemmOptions o = options_for(Mode::gate_up);
  const OwnedTensor hopper = run_sm90(gpu, dev, out, o);
  ASSERT_EQ(cudaMemsetAsync(out.tensor().data(), 0xFF, out.tensor().nbytes(), gpu.stream()),
            cudaSuccess);
  moe_gemm_groupwise(gpu.ctx(), dev.a, dev.b, dev.a_scale, dev.b_scale, dev.m_indptr, out, o);
  const OwnedTensor automatic = gpu.to_host(out);
  EXPECT_EQ(std::memcmp(hopper.tensor().data(), automatic.tensor().data(), out.tensor().nbytes()),
            0);
  MoeGemmOptions portable = o;
  portable.kernel = MoeGemmKernel::portable;
  moe_gemm_groupwise(gpu.ctx(), dev.a, dev.b, dev.a_scale, dev.b_scale, dev.m_indptr, out,
                     portable);
  const OwnedTensor other = gpu.to_host(out);
  EXPECT_TRUE(matches(other, hopper, indptr));  // the same product ...
  EXPECT_NE(std::memcmp(hopper.tensor().data(), other.tensor().data(), out.tensor().nbytes()), 0)
      << "the portable kernel gave the Hopper kernel's bits: the check above cannot tell them "
         "apart";
}

// ---- what the Hopper kernel refuses for MX ------------------------------------------------

TEST(Sm90MoeGemmMxExperts, RefusesKNotAMultipleOf128WithTheReason) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  const std::vector<int32_t> indptr = indptr_from_counts({8, 8});
  const MxInputs in = make_inputs(160, 128, 16, indptr, 4400);
  const DeviceMx dev(gpu, in);
  const OwnedTensor out = gpu.empty(DType::fp32, {16, 128});
  const std::string refused =
      testing::error_of([&] { run_sm90(gpu, dev, out, options_for(Mode::plain)); });
  EXPECT_THAT(refused, ::testing::HasSubstr("K must be a multiple of 128 for MX-FP8"));
  // automatic takes the portable kernel for it instead, and gets the CPU's answer.
  MoeGemmOptions o = options_for(Mode::plain);
  ASSERT_EQ(cudaMemsetAsync(out.tensor().data(), 0xFF, out.tensor().nbytes(), gpu.stream()),
            cudaSuccess);
  moe_gemm_groupwise(gpu.ctx(), dev.a, dev.b, dev.a_scale, dev.b_scale, dev.m_indptr, out, o);
  EXPECT_TRUE(matches(gpu.to_host(out), cpu_reference(in, 128, o), indptr));
}

}  // namespace
}  // namespace modmoe
