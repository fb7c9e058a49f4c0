// The Hopper moe_gemm_groupwise (MoeGemmOptions::kernel = sm90) against the CPU backend on the
// same inputs. Both sides read identical bf16 / fp8 values and scales, so only the order of the
// fp32 accumulation differs: an fp32 out agrees to 1e-3 (relative RMS, overall and per expert).
//
// What the inputs are made to catch:
//   * ragged experts: empty ones, 1 row, rows one short of / one past a tile, an expert that
//     spans several row tiles, and rows outside [m_indptr[0], m_indptr[E]) that must keep their
//     poison (0xFF bytes: NaN in bf16, fp32 and e4m3; checked byte for byte);
//   * every 128x128 block of b and every 1x128 block of a is scaled by its own random power of
//     two (2^-2 .. 2^2), so the fp8 block scales differ from block to block and a scale read
//     from the wrong block, or an MN/K layout mix-up, moves the result by up to 16x;
//   * the tile list comes from moe_gemm_sm90_tiles() at run time; "" (the heuristic) is always
//     one of the tiles tried. Not every tile is built for every input dtype and out (the list
//     does not say which), so an explicit tile may be refused, before anything runs, by an Error
//     that names it; the heuristic's pick never is, and some explicit tile must run.
// Every test needs a device that can run the Hopper kernel; elsewhere it is reported skipped.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/cuda_session.h"
#include "cuda/gpu_test.h"
#include "cuda/sm90_test_util.h"
#include "modmoe/modmoe.h"
#include "modmoe/numeric.h"
#include "oracle/problem.h"

namespace modmoe {
namespace {

using testing::CudaSession;
using testing::transpose_last_two;
using testing::sm90::indptr_from_counts;
using testing::sm90::Mode;
using testing::sm90::mode_name;
using testing::sm90::options_for;
using testing::sm90::Uniform;

constexpr double kFp32OutTolerance = 1e-3;  // accumulation order only
constexpr double kBf16OutTolerance = 4e-3;  // both sides round to bf16: a few 1-ulp flips
constexpr double kFp8OutTolerance = 3e-2;   // dequantized e4m3: a few 1-code flips
// Relative difference of the out_scale values (amax / 448 of the fp32 group). bf16 products
// accumulate in full fp32; fp8 wgmma accumulates a 128-deep K block in a narrower fixed-point
// accumulator (about 14 bits, as DeepSeek-V3's report measured) before the fp32 promotion, so a
// group's amax may move by ~2^-10 there (the H200 showed 1.1e-3 on 2026-11-29).
constexpr double kScaleToleranceBf16In = 1e-5;
constexpr double kScaleToleranceFp8In = 4e-3;

const MoeGemmScheduler kSchedulers[] = {
    MoeGemmScheduler::cooperative, MoeGemmScheduler::linear_scan, MoeGemmScheduler::precomputed};

const char* scheduler_name(MoeGemmScheduler s) {
  return s == MoeGemmScheduler::cooperative   ? "cooperative"
         : s == MoeGemmScheduler::linear_scan ? "linear_scan"
                                              : "precomputed";
}

// "" (the heuristic's choice) and every tile the build has.
std::vector<std::string> tiles_to_try() {
  std::vector<std::string> tiles = {""};
  for (const std::string& t : moe_gemm_sm90_tiles()) tiles.push_back(t);
  return tiles;
}

struct GemmShape {
  int64_t K, N_b, rows;         // rows = total_rows = a.size(0)
  std::vector<int32_t> indptr;  // E + 1
  DType dtype;                  // bf16 or fp8_e4m3 (block 128 scales)
  int64_t E() const { return static_cast<int64_t>(indptr.size()) - 1; }
};

// A random power of two in [2^-2, 2^2]: one per scale block (see the file comment).
float block_factor(Uniform& u) {
  return std::ldexp(1.0f, static_cast<int>(std::lround(2.0f * u())));
}

// The host inputs of one problem (K-major scales, as the CPU reference reads them).
struct HostInputs {
  OwnedTensor a, b, a_scale, b_scale, m_indptr;
};

HostInputs make_inputs(const GemmShape& s, uint64_t seed) {
  Uniform u(seed);
  const int64_t E = s.E(), K = s.K, N_b = s.N_b, kb = (K + 127) / 128, nb = (N_b + 127) / 128;
  OwnedTensor a32 = host_tensor(DType::fp32, {s.rows, K}),
              b32 = host_tensor(DType::fp32, {E, N_b, K});
  float* a = a32.data_ptr<float>();
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t g = 0; g < kb; ++g) {
      const float f = block_factor(u);
      for (int64_t k = g * 128; k < std::min(K, g * 128 + 128); ++k) a[r * K + k] = f * u();
    }
  float* b = b32.data_ptr<float>();
  const float inv_sqrt_k = 1.0f / std::sqrt(static_cast<float>(K));
  std::vector<float> factors(nb * kb);
  for (int64_t e = 0; e < E; ++e) {
    for (float& f : factors) f = block_factor(u) * inv_sqrt_k;
    for (int64_t n = 0; n < N_b; ++n)
      for (int64_t k = 0; k < K; ++k)
        b[(e * N_b + n) * K + k] = factors[(n / 128) * kb + k / 128] * u();
  }
  HostInputs in;
  in.a = host_tensor(s.dtype, {s.rows, K});
  in.b = host_tensor(s.dtype, {E, N_b, K});
  if (s.dtype == DType::fp8_e4m3) {
    const QuantScheme q = QuantScheme::fp8_block;
    in.a_scale = host_tensor(DType::fp32, act_scale_shape(q, s.rows, K));
    in.b_scale = host_tensor(DType::fp32, weight_scale_shape(q, E, N_b, K));
    quantize_activations(Context::cpu(), a32, q, false, in.a, in.a_scale);
    quantize_weights(Context::cpu(), b32, q, in.b, in.b_scale);
  } else {
    uint16_t* a16 = in.a.data_ptr<uint16_t>();
    uint16_t* b16 = in.b.data_ptr<uint16_t>();
    for (int64_t i = 0; i < s.rows * K; ++i) a16[i] = float_to_bf16(a[i]);
    for (int64_t i = 0; i < E * N_b * K; ++i) b16[i] = float_to_bf16(b[i]);
  }
  in.m_indptr = host_tensor(DType::int32, {E + 1});
  std::copy(s.indptr.begin(), s.indptr.end(), in.m_indptr.data_ptr<int32_t>());
  return in;
}

// Device copies of the host inputs (undefined stays undefined).
struct DeviceInputs {
  OwnedTensor a, b, a_scale, b_scale, m_indptr;
  DeviceInputs(const CudaSession& gpu, const HostInputs& in)
      : a(gpu.to_device(in.a)),
        b(gpu.to_device(in.b)),
        a_scale(in.a_scale.tensor().defined() ? gpu.to_device(in.a_scale) : OwnedTensor()),
        b_scale(in.b_scale.tensor().defined() ? gpu.to_device(in.b_scale) : OwnedTensor()),
        m_indptr(gpu.to_device(in.m_indptr)) {}
};

// A host tensor filled with 0xFF bytes (the poison the device output gets as well).
OwnedTensor poisoned_host(DType dtype, const Shape& shape) {
  OwnedTensor t = host_tensor(dtype, shape);
  std::memset(t.tensor().data(), 0xFF, t.tensor().nbytes());
  return t;
}

// The CPU backend's result on the same inputs (K-major scales).
OwnedTensor cpu_reference(const HostInputs& in, DType out_dtype, int64_t N_out,
                          const MoeGemmOptions& o) {
  OwnedTensor out = poisoned_host(out_dtype, {in.a.tensor().size(0), N_out});
  MoeGemmOptions cpu = o;
  cpu.kernel = MoeGemmKernel::automatic;
  cpu.tile.clear();
  moe_gemm_groupwise(Context::cpu(), in.a, in.b, in.a_scale, in.b_scale, in.m_indptr, out, cpu);
  return out;
}

// Poisons `out` on the session stream, runs the Hopper kernel there, returns out on the host.
OwnedTensor run_sm90(const CudaSession& gpu, const Tensor& a, const Tensor& b,
                     const Tensor& a_scale, const Tensor& b_scale, const Tensor& m_indptr,
                     const Tensor& out, const MoeGemmOptions& options) {
  const auto stream = gpu.stream();
  if (cudaMemsetAsync(out.data(), 0xFF, out.nbytes(), stream) != cudaSuccess)
    throw Error("cudaMemsetAsync of out failed");
  MoeGemmOptions o = options;
  o.kernel = MoeGemmKernel::sm90;
  moe_gemm_groupwise(gpu.ctx(), a, b, a_scale, b_scale, m_indptr, out, o);
  return gpu.to_host(out);  // waits for the stream
}
OwnedTensor run_sm90(const CudaSession& gpu, const DeviceInputs& d, const Tensor& out,
                     const MoeGemmOptions& options) {
  return run_sm90(gpu, d.a, d.b, d.a_scale, d.b_scale, d.m_indptr, out, options);
}

// Whether `message`, the Error that refused a call with `tile`, is an acceptable refusal.
::testing::AssertionResult acceptable_refusal(const std::string& tile, const std::string& message) {
  if (tile.empty())
    return ::testing::AssertionFailure() << "the heuristic's tile was refused: " << message;
  if (message.find(tile) == std::string::npos)
    return ::testing::AssertionFailure()
           << "the refusal of tile " << tile << " does not name it: " << message;
  return ::testing::AssertionSuccess();
}

// Rows outside [indptr[0], indptr[E]) of a host copy still hold only 0xFF bytes.
::testing::AssertionResult rows_outside_poisoned(const Tensor& t,
                                                 const std::vector<int32_t>& indptr) {
  const size_t row_bytes = t.nbytes() / t.size(0);
  const auto* p = static_cast<const uint8_t*>(t.data());
  for (int64_t r = 0; r < t.size(0); ++r) {
    if (r >= indptr.front() && r < indptr.back()) continue;
    for (size_t i = 0; i < row_bytes; ++i)
      if (p[r * row_bytes + i] != 0xFF)
        return ::testing::AssertionFailure()
               << "row " << r << " (outside [" << indptr.front() << ", " << indptr.back()
               << ")) was written: byte " << i;
  }
  return ::testing::AssertionSuccess();
}

// got vs ref (host, same shape, bf16 or fp32, or e4m3 with their (rows, N/128) scales, compared
// dequantized): every owned element finite, relative RMS overall and per expert below `tol`,
// rows nobody owns untouched.
::testing::AssertionResult close_to(const Tensor& got, const Tensor& ref,
                                    const std::vector<int32_t>& indptr, double tol,
                                    const Tensor& got_scale = {}, const Tensor& ref_scale = {}) {
  const int64_t N = got.size(1), E = static_cast<int64_t>(indptr.size()) - 1;
  auto value = [&](const Tensor& t, const Tensor& scale, int64_t r, int64_t j) -> double {
    const double v = load_float(t.data(), t.dtype(), r * N + j);
    return t.dtype() == DType::fp8_e4m3 ? v * scale.data_ptr<const float>()[r * (N / 128) + j / 128]
                                        : v;
  };
  double num = 0, den = 0, worst_expert = 0;
  int64_t worst_e = -1;
  for (int64_t e = 0; e < E; ++e) {
    double num_e = 0, den_e = 0;
    for (int64_t r = indptr[e]; r < indptr[e + 1]; ++r)
      for (int64_t j = 0; j < N; ++j) {
        const double g = value(got, got_scale, r, j), x = value(ref, ref_scale, r, j);
        if (!std::isfinite(g))
          return ::testing::AssertionFailure()
                 << "non-finite " << g << " at row " << r << " col " << j << " (expert " << e
                 << ", reference " << x << ")";
        num_e += (g - x) * (g - x);
        den_e += x * x;
      }
    num += num_e;
    den += den_e;
    const double rel_e = den_e > 0 ? std::sqrt(num_e / den_e) : std::sqrt(num_e);
    if (rel_e > worst_expert) worst_expert = rel_e, worst_e = e;
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (!(rel < tol) || !(worst_expert < tol))
    return ::testing::AssertionFailure()
           << "relative RMS error " << rel << ", worst expert " << worst_e << " at " << worst_expert
           << " (tolerance " << tol << ")";
  if (auto poisoned = rows_outside_poisoned(got, indptr); !poisoned) return poisoned;
  if (got_scale.defined()) return rows_outside_poisoned(got_scale, indptr);
  return ::testing::AssertionSuccess();
}

std::string describe(DType dtype, Mode mode, const std::string& tile, MoeGemmScheduler s) {
  std::ostringstream os;
  os << dtype_name(dtype) << " " << mode_name(mode) << " tile \"" << tile << "\" "
     << scheduler_name(s);
  return os.str();
}

// ---- every tile x every scheduler on a ragged problem ------------------------------------

struct TileCase {
  DType dtype;
  Mode mode;
  std::string name() const { return std::string(dtype_name(dtype)) + "_" + mode_name(mode); }
};
void PrintTo(const TileCase& c, std::ostream* os) { *os << c.name(); }

class Sm90MoeGemmTiles : public ::testing::TestWithParam<TileCase> {};

TEST_P(Sm90MoeGemmTiles, EveryTileAndSchedulerMatchesTheCpu) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  const DType dtype = GetParam().dtype;
  const Mode mode = GetParam().mode;
  // Empty experts, 1 row, 64 / 65 rows and one past 128 / 192 (a 128-row tile's second consumer
  // with no rows or one), one short of / exactly 128 rows, one spanning several row tiles.
  const GemmShape shape{
      512, 512, 1012, indptr_from_counts({0, 1, 64, 65, 127, 128, 129, 193, 300, 0, 5}), dtype};
  const MoeGemmOptions base = options_for(mode);
  const int64_t N_out = base.gated ? shape.N_b / 2 : shape.N_b;
  const HostInputs in =
      make_inputs(shape, 1000 + static_cast<int>(mode) + 10 * (dtype == DType::bf16));
  const OwnedTensor ref = cpu_reference(in, DType::fp32, N_out, base);
  const DeviceInputs dev(gpu, in);
  const OwnedTensor out = gpu.empty(DType::fp32, {shape.rows, N_out});
  int explicit_tiles_run = 0;
  for (const std::string& tile : tiles_to_try()) {
    for (MoeGemmScheduler scheduler : kSchedulers) {
      const std::string what = describe(dtype, mode, tile, scheduler);
      MoeGemmOptions o = base;
      o.tile = tile;
      o.scheduler = scheduler;
      OwnedTensor got;
      if (const std::string refused = testing::error_of([&] { got = run_sm90(gpu, dev, out, o); });
          !refused.empty()) {
        EXPECT_TRUE(acceptable_refusal(tile, refused)) << what;
        continue;
      }
      explicit_tiles_run += !tile.empty();
      EXPECT_TRUE(close_to(got, ref, shape.indptr, kFp32OutTolerance)) << what;
    }
  }
  EXPECT_GT(explicit_tiles_run, 0) << "every explicit tile was refused";
}

INSTANTIATE_TEST_SUITE_P(DtypesAndModes, Sm90MoeGemmTiles,
                         ::testing::Values(TileCase{DType::bf16, Mode::plain},
                                           TileCase{DType::bf16, Mode::gate_up},
                                           TileCase{DType::bf16, Mode::up_gate},
                                           TileCase{DType::bf16, Mode::interleaved},
                                           TileCase{DType::fp8_e4m3, Mode::plain},
                                           TileCase{DType::fp8_e4m3, Mode::gate_up},
                                           TileCase{DType::fp8_e4m3, Mode::up_gate},
                                           TileCase{DType::fp8_e4m3, Mode::interleaved}),
                         [](const ::testing::TestParamInfo<TileCase>& info) {
                           return info.param.name();
                         });

// ---- few and many experts ----------------------------------------------------------------

// Rows per expert for E experts: E = 1 holds every row; E = 512 leaves most experts empty or
// with 1-2 rows (decode-like) and gives a few of them a full tile's worth.
std::vector<int32_t> counts_for(int64_t E) {
  std::vector<int32_t> counts(E);
  if (E == 1) return {333};
  if (E == 8) return {40, 0, 3, 64, 0, 0, 17, 1};
  Uniform u(E);
  for (int64_t e = 0; e < E; ++e) {
    const float x = 0.5f * (u() + 1.0f);  // [0, 1)
    counts[e] = E >= 512 ? (x < 0.6f    ? 0
                            : x < 0.8f  ? 1
                            : x < 0.97f ? 2
                                        : 70)
                         : static_cast<int32_t>(x * 7);
  }
  return counts;
}

struct ExpertsCase {
  int64_t E;
  DType dtype;
  std::string name() const { return "E" + std::to_string(E) + "_" + dtype_name(dtype); }
};
void PrintTo(const ExpertsCase& c, std::ostream* os) { *os << c.name(); }

class Sm90MoeGemmExperts : public ::testing::TestWithParam<ExpertsCase> {};

TEST_P(Sm90MoeGemmExperts, EverySchedulerMatchesTheCpu) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  const int64_t E = GetParam().E;
  const DType dtype = GetParam().dtype;
  const std::vector<int32_t> indptr = indptr_from_counts(counts_for(E));
  // K = 128 for the large E keeps their weights (E x 256 x K) small; K = 384 otherwise.
  const GemmShape shape{E >= 256 ? 128 : 384, 256, indptr.back(), indptr, dtype};
  const MoeGemmOptions base = options_for(Mode::gate_up);
  const HostInputs in = make_inputs(shape, 2000 + E);
  const OwnedTensor ref = cpu_reference(in, DType::fp32, shape.N_b / 2, base);
  const DeviceInputs dev(gpu, in);
  const OwnedTensor out = gpu.empty(DType::fp32, {shape.rows, shape.N_b / 2});
  for (MoeGemmScheduler scheduler : kSchedulers) {
    MoeGemmOptions o = base;
    o.scheduler = scheduler;
    EXPECT_TRUE(close_to(run_sm90(gpu, dev, out, o), ref, indptr, kFp32OutTolerance))
        << "E " << E << " (" << indptr.back() << " rows) " << dtype_name(dtype) << " "
        << scheduler_name(scheduler);
  }
}

INSTANTIATE_TEST_SUITE_P(
    FewAndMany, Sm90MoeGemmExperts,
    ::testing::Values(ExpertsCase{1, DType::bf16}, ExpertsCase{1, DType::fp8_e4m3},
                      ExpertsCase{8, DType::bf16}, ExpertsCase{8, DType::fp8_e4m3},
                      ExpertsCase{256, DType::bf16}, ExpertsCase{256, DType::fp8_e4m3},
                      ExpertsCase{512, DType::bf16}, ExpertsCase{512, DType::fp8_e4m3}),
    [](const ::testing::TestParamInfo<ExpertsCase>& info) { return info.param.name(); });

// ---- row ranges --------------------------------------------------------------------------

TEST(Sm90MoeGemm, OneExpertHoldsEveryRow) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    const GemmShape shape{256, 256, 400, indptr_from_counts({0, 0, 0, 0, 0, 400, 0, 0}), dtype};
    const HostInputs in = make_inputs(shape, 3000 + (dtype == DType::bf16));
    const DeviceInputs dev(gpu, in);
    for (Mode mode : {Mode::plain, Mode::gate_up}) {
      const MoeGemmOptions base = options_for(mode);
      const int64_t N_out = base.gated ? shape.N_b / 2 : shape.N_b;
      const OwnedTensor ref = cpu_reference(in, DType::fp32, N_out, base);
      const OwnedTensor out = gpu.empty(DType::fp32, {shape.rows, N_out});
      for (MoeGemmScheduler scheduler : kSchedulers) {
        MoeGemmOptions o = base;
        o.scheduler = scheduler;
        EXPECT_TRUE(close_to(run_sm90(gpu, dev, out, o), ref, shape.indptr, kFp32OutTolerance))
            << describe(dtype, mode, "", scheduler);
      }
    }
  }
}

// m_indptr[0] = 17 > 0 and m_indptr[E] = 283 < 300 rows: rows 0-16 and 283-299 belong to no
// expert and keep their poison in every out dtype (close_to checks the bytes).
TEST(Sm90MoeGemm, RowsOutsideTheExpertsKeepTheirPoison) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  const std::vector<int32_t> indptr = indptr_from_counts({0, 43, 1, 139, 0, 50, 33, 0}, 17);
  ASSERT_EQ(indptr.back(), 283);
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    const GemmShape shape{256, 512, 300, indptr, dtype};
    const HostInputs in = make_inputs(shape, 4000 + (dtype == DType::bf16));
    const DeviceInputs dev(gpu, in);
    for (Mode mode : {Mode::plain, Mode::up_gate}) {
      const MoeGemmOptions o = options_for(mode);
      const int64_t N_out = o.gated ? shape.N_b / 2 : shape.N_b;
      for (DType out_dtype : {DType::fp32, DType::bf16}) {
        const OwnedTensor ref = cpu_reference(in, out_dtype, N_out, o);
        const OwnedTensor out = gpu.empty(out_dtype, {shape.rows, N_out});
        const double tol = out_dtype == DType::fp32 ? kFp32OutTolerance : kBf16OutTolerance;
        EXPECT_TRUE(close_to(run_sm90(gpu, dev, out, o), ref, indptr, tol))
            << dtype_name(dtype) << " " << mode_name(mode) << " out " << dtype_name(out_dtype);
      }
    }
    // The fp8 gated out and its scales.
    MoeGemmOptions o = options_for(Mode::gate_up);
    const int64_t N_out = shape.N_b / 2;
    OwnedTensor ref_scale = poisoned_host(DType::fp32, {shape.rows, N_out / 128});
    o.out_scale = ref_scale;
    const OwnedTensor ref = cpu_reference(in, DType::fp8_e4m3, N_out, o);
    const OwnedTensor out = gpu.empty(DType::fp8_e4m3, {shape.rows, N_out});
    const OwnedTensor out_scale = gpu.empty(DType::fp32, {shape.rows, N_out / 128});
    ASSERT_CUDA(cudaMemsetAsync(out_scale.tensor().data(), 0xFF, out_scale.tensor().nbytes(),
                                gpu.stream()));
    o.out_scale = out_scale;
    const OwnedTensor got = run_sm90(gpu, dev, out, o);
    const OwnedTensor got_scale = gpu.to_host(out_scale);
    EXPECT_TRUE(close_to(got, ref, indptr, kFp8OutTolerance, got_scale, ref_scale))
        << dtype_name(dtype) << " out fp8";
  }
}

// ---- MN-major scales ---------------------------------------------------------------------

// The same scale values transposed: the GPU in "MN" mode against the CPU in "K" mode. Two row
// counts: 300 (a_scale rows are 16-byte multiples) and 301 (they are not; the contract has no
// padding).
TEST(Sm90MoeGemm, MnMajorScalesMatchTheKMajorResult) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  for (int64_t rows : {300, 301}) {
    const std::vector<int32_t> indptr = indptr_from_counts({5, 0, 129, 1, 100, 0, 60, 1}, 3);
    ASSERT_LE(indptr.back(), rows);
    const GemmShape shape{256, 384, rows, indptr, DType::fp8_e4m3};  // kb = 2, nb = 3
    const HostInputs in = make_inputs(shape, 5000 + rows);
    const DeviceInputs dev(gpu, in);
    const OwnedTensor a_scale_mn = gpu.to_device(transpose_last_two(in.a_scale));
    const OwnedTensor b_scale_mn = gpu.to_device(transpose_last_two(in.b_scale));
    for (Mode mode : {Mode::plain, Mode::interleaved}) {
      const MoeGemmOptions base = options_for(mode);
      const int64_t N_out = base.gated ? shape.N_b / 2 : shape.N_b;
      const OwnedTensor ref = cpu_reference(in, DType::fp32, N_out, base);
      const OwnedTensor out = gpu.empty(DType::fp32, {rows, N_out});
      int explicit_tiles_run = 0;
      for (const std::string& tile : tiles_to_try()) {
        const std::string what = std::to_string(rows) + " rows, " +
                                 describe(DType::fp8_e4m3, mode, tile, base.scheduler);
        MoeGemmOptions o = base;
        o.tile = tile;
        o.scale_major_mode = "MN";
        OwnedTensor got;
        if (const std::string refused = testing::error_of([&] {
              got = run_sm90(gpu, dev.a, dev.b, a_scale_mn, b_scale_mn, dev.m_indptr, out, o);
            });
            !refused.empty()) {
          EXPECT_TRUE(acceptable_refusal(tile, refused)) << what;
          continue;
        }
        explicit_tiles_run += !tile.empty();
        EXPECT_TRUE(close_to(got, ref, indptr, kFp32OutTolerance)) << what << " MN";
      }
      EXPECT_GT(explicit_tiles_run, 0) << "every explicit tile was refused";
    }
  }
}

// ---- the fp8 gated out -------------------------------------------------------------------

// act(gate)*up quantized per row and 128 columns: dequantized values to fp8 rounding, scales to
// fp32 rounding of the same amax. Row 20 of a is zero: its groups are all-zero, whose scale
// is the CPU quantizer's convention for that case. Tiles whose output columns do not cover
// whole 128-column groups may refuse the fp8 out (acceptable_refusal).
TEST(Sm90MoeGemm, Fp8GatedOutMatchesTheCpuQuantizer) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  const std::vector<int32_t> indptr = indptr_from_counts({0, 1, 127, 129, 0, 40, 2, 30}, 2);
  const int64_t zero_row = 20;
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    const GemmShape shape{512, 768, 340, indptr, dtype};  // N_out = 384: three scale groups
    HostInputs in = make_inputs(shape, 6000 + (dtype == DType::bf16));
    const size_t a_row_bytes = shape.K * dtype_size(dtype);
    std::memset(static_cast<char*>(in.a.tensor().data()) + zero_row * a_row_bytes, 0, a_row_bytes);
    const DeviceInputs dev(gpu, in);
    const int64_t N_out = shape.N_b / 2;
    const double scale_tol = dtype == DType::bf16 ? kScaleToleranceBf16In : kScaleToleranceFp8In;
    for (Mode mode : {Mode::gate_up, Mode::up_gate, Mode::interleaved}) {
      MoeGemmOptions base = options_for(mode);
      OwnedTensor ref_scale = poisoned_host(DType::fp32, {shape.rows, N_out / 128});
      base.out_scale = ref_scale;
      const OwnedTensor ref = cpu_reference(in, DType::fp8_e4m3, N_out, base);
      const OwnedTensor out = gpu.empty(DType::fp8_e4m3, {shape.rows, N_out});
      const OwnedTensor out_scale = gpu.empty(DType::fp32, {shape.rows, N_out / 128});
      base.out_scale = out_scale;
      int explicit_tiles_run = 0;
      for (const std::string& tile : tiles_to_try()) {
        for (MoeGemmScheduler scheduler : kSchedulers) {
          const std::string what = describe(dtype, mode, tile, scheduler);
          MoeGemmOptions o = base;
          o.tile = tile;
          o.scheduler = scheduler;
          ASSERT_CUDA(cudaMemsetAsync(out_scale.tensor().data(), 0xFF, out_scale.tensor().nbytes(),
                                      gpu.stream()));
          OwnedTensor got;
          if (const std::string refused =
                  testing::error_of([&] { got = run_sm90(gpu, dev, out, o); });
              !refused.empty()) {
            EXPECT_TRUE(acceptable_refusal(tile, refused)) << what;
            continue;
          }
          explicit_tiles_run += !tile.empty();
          const OwnedTensor got_scale = gpu.to_host(out_scale);
          EXPECT_TRUE(close_to(got, ref, indptr, kFp8OutTolerance, got_scale, ref_scale)) << what;
          for (int64_t r = indptr.front(); r < indptr.back(); ++r)
            for (int64_t g = 0; g < N_out / 128; ++g) {
              const float x = ref_scale.data_ptr<float>()[r * (N_out / 128) + g];
              const float y = got_scale.data_ptr<float>()[r * (N_out / 128) + g];
              ASSERT_LE(std::fabs(y - x), scale_tol * x)
                  << what << ": out_scale row " << r << " group " << g;
            }
          EXPECT_EQ(got_scale.data_ptr<float>()[zero_row * (N_out / 128)],
                    ref_scale.data_ptr<float>()[zero_row * (N_out / 128)])
              << what << ": the scale of an all-zero group";
        }
      }
      EXPECT_GT(explicit_tiles_run, 0) << "every explicit tile was refused";
    }
  }
}

// ---- out dtypes and N_b not a multiple of the tile ---------------------------------------

// N_out = 160: every tile's BN (or BN/2 for gated) leaves a partial column tile, whose missing
// columns must be neither computed from garbage into valid ones nor stored. The Hopper kernel
// refuses fp8 GateUp/UpGate tiles whose weight-scale parts (s B rows: 64 for 128x256, 128x128,
// 64x256) would straddle two weight-scale blocks, i.e. N = N_b/2 not a multiple of s: at
// N = 160, 128x256, 128x128 and 64x256 refuse, 64x128 and 64x64 (the heuristic's pick steps
// down to them) run. Kernel
// "automatic" must give the right answer too, and it is checked in every case.
TEST(Sm90MoeGemm, OutDtypesAndPartialColumnTiles) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  const std::vector<int32_t> indptr = indptr_from_counts({3, 0, 130, 1, 64}, 1);
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    for (Mode mode : {Mode::plain, Mode::gate_up, Mode::up_gate, Mode::interleaved}) {
      const MoeGemmOptions base = options_for(mode);
      const int64_t N_out = 160, N_b = base.gated ? 2 * N_out : N_out;
      const bool may_refuse = dtype == DType::fp8_e4m3 && base.gated && mode != Mode::interleaved;
      const GemmShape shape{256, N_b, 200, indptr, dtype};
      const HostInputs in =
          make_inputs(shape, 7000 + static_cast<int>(mode) + 10 * (dtype == DType::bf16));
      const DeviceInputs dev(gpu, in);
      for (DType out_dtype : {DType::fp32, DType::bf16}) {
        const OwnedTensor ref = cpu_reference(in, out_dtype, N_out, base);
        const OwnedTensor out = gpu.empty(out_dtype, {shape.rows, N_out});
        const double tol = out_dtype == DType::fp32 ? kFp32OutTolerance : kBf16OutTolerance;
        const std::string case_name = std::string(dtype_name(dtype)) + " " + mode_name(mode) +
                                      " out " + dtype_name(out_dtype);
        int tiles_run = 0;
        for (const std::string& tile : tiles_to_try()) {
          MoeGemmOptions o = base;
          o.tile = tile;
          OwnedTensor got;
          if (const std::string refused =
                  testing::error_of([&] { got = run_sm90(gpu, dev, out, o); });
              !refused.empty()) {
            if (!may_refuse) {
              EXPECT_TRUE(acceptable_refusal(tile, refused)) << case_name;
            }
            continue;
          }
          ++tiles_run;
          EXPECT_TRUE(close_to(got, ref, indptr, tol)) << case_name << " tile \"" << tile << "\"";
        }
        EXPECT_TRUE(may_refuse || tiles_run > 1)
            << case_name << ": every explicit tile was refused";
        // kernel "automatic": whichever kernel takes the call.
        ASSERT_CUDA(
            cudaMemsetAsync(out.tensor().data(), 0xFF, out.tensor().nbytes(), gpu.stream()));
        moe_gemm_groupwise(gpu.ctx(), dev.a, dev.b, dev.a_scale, dev.b_scale, dev.m_indptr, out,
                           base);
        EXPECT_TRUE(close_to(gpu.to_host(out), ref, indptr, tol))
            << case_name << " kernel automatic";
      }
    }
  }
}

// ---- arguments ---------------------------------------------------------------------------

TEST(Sm90MoeGemm, RejectsUnknownTilesAndTilesForThePortableKernel) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  const GemmShape shape{256, 256, 16, indptr_from_counts({4, 12}), DType::bf16};
  const DeviceInputs dev(gpu, make_inputs(shape, 8000));
  const OwnedTensor out = gpu.empty(DType::fp32, {shape.rows, shape.N_b});
  auto error_with = [&](MoeGemmKernel kernel, const std::string& tile) {
    MoeGemmOptions o;
    o.kernel = kernel;
    o.tile = tile;
    return testing::error_of(
        [&] { moe_gemm_groupwise(gpu.ctx(), dev.a, dev.b, {}, {}, dev.m_indptr, out, o); });
  };
  const std::string unknown = error_with(MoeGemmKernel::sm90, "96x200");
  EXPECT_THAT(unknown, ::testing::HasSubstr("moe_gemm_groupwise"));
  EXPECT_THAT(unknown, ::testing::HasSubstr("\"96x200\""));
  ASSERT_FALSE(moe_gemm_sm90_tiles().empty());
  for (const std::string& known : moe_gemm_sm90_tiles())
    EXPECT_THAT(unknown, ::testing::HasSubstr(known));
  EXPECT_THAT(error_with(MoeGemmKernel::portable, moe_gemm_sm90_tiles().front()),
              ::testing::HasSubstr("tile \"" + moe_gemm_sm90_tiles().front() +
                                   "\" is a Hopper-kernel option"));
  // Every listed tile is accepted.
  for (const std::string& known : moe_gemm_sm90_tiles())
    EXPECT_EQ(error_with(MoeGemmKernel::sm90, known), "") << known;
  gpu.sync();
}

// ---- CUDA graph capture ------------------------------------------------------------------

// One call captured on the session stream (global mode: a host sync or cudaMalloc inside would
// invalidate the capture), replayed after a's contents (and scales) change in place, then after
// m_indptr's do: the kernel and its scheduler read both from device memory at replay time.
TEST(Sm90MoeGemm, CapturedCallReplaysWithNewInputs) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  const std::vector<int32_t> first_indptr = indptr_from_counts({10, 0, 129, 1, 60, 0, 33, 7}, 4);
  const std::vector<int32_t> second_indptr = indptr_from_counts({0, 200, 0, 0, 1, 1, 17, 0}, 9);
  const int64_t rows = 260;
  const GemmShape shape{256, 512, rows, first_indptr, DType::fp8_e4m3};
  const MoeGemmOptions base = options_for(Mode::gate_up);
  const int64_t N_out = shape.N_b / 2;
  for (MoeGemmScheduler scheduler : kSchedulers) {
    SCOPED_TRACE(scheduler_name(scheduler));
    HostInputs in = make_inputs(shape, 9000);
    const DeviceInputs dev(gpu, in);
    const OwnedTensor out = gpu.empty(DType::fp32, {rows, N_out});
    MoeGemmOptions o = base;
    o.scheduler = scheduler;
    o.kernel = MoeGemmKernel::sm90;
    // Eager warm-up (module loading, the allocator's pool), checked like any other call.
    ASSERT_TRUE(close_to(run_sm90(gpu, dev, out, o), cpu_reference(in, DType::fp32, N_out, o),
                         first_indptr, kFp32OutTolerance));

    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_CUDA(cudaStreamBeginCapture(gpu.stream(), cudaStreamCaptureModeGlobal));
    std::string thrown;
    try {
      moe_gemm_groupwise(gpu.ctx(), dev.a, dev.b, dev.a_scale, dev.b_scale, dev.m_indptr, out, o);
    } catch (const std::exception& e) {
      thrown = e.what();
    }
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t query = cudaStreamIsCapturing(gpu.stream(), &status);
    const cudaError_t ended = cudaStreamEndCapture(gpu.stream(), &graph);
    ASSERT_TRUE(thrown.empty()) << "moe_gemm_groupwise threw during capture: " << thrown;
    ASSERT_CUDA(query);
    ASSERT_EQ(status, cudaStreamCaptureStatusActive)
        << "the capture was invalidated (a host sync?)";
    ASSERT_CUDA(ended);
    ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));

    auto replay = [&](const HostInputs& now, const std::vector<int32_t>& indptr, const char* what) {
      ASSERT_CUDA(cudaMemsetAsync(out.tensor().data(), 0xFF, out.tensor().nbytes(), gpu.stream()));
      ASSERT_CUDA(cudaGraphLaunch(exec, gpu.stream()));
      const OwnedTensor got = gpu.to_host(out);
      EXPECT_TRUE(
          close_to(got, cpu_reference(now, DType::fp32, N_out, o), indptr, kFp32OutTolerance))
          << what;
    };
    // New a and a_scale, written into the captured buffers.
    HostInputs fresh = make_inputs(shape, 9001);
    copy_tensor(gpu.ctx(), dev.a, fresh.a);
    copy_tensor(gpu.ctx(), dev.a_scale, fresh.a_scale);
    in.a = std::move(fresh.a);
    in.a_scale = std::move(fresh.a_scale);
    replay(in, first_indptr, "replay with new a");
    // New m_indptr (same E; other rows outside, which stay poisoned).
    std::copy(second_indptr.begin(), second_indptr.end(), in.m_indptr.data_ptr<int32_t>());
    copy_tensor(gpu.ctx(), dev.m_indptr, in.m_indptr);
    replay(in, second_indptr, "replay with new m_indptr");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

}  // namespace
}  // namespace modmoe
