// The CPU grouped GEMM (src/cpu/gemm.h) against a float64 reference computed here from the
// WeightOperand definition: dequant(B)[n][k] = decode(code) * scale(n, k), C = A * dequant(B)^T.
//
// Every case runs under each micro-kernel (MODMOE_CPU_GEMM_ISA = generic / avx2 / avx512; a
// CPU without an instruction set silently runs the best one it has). Outputs are poisoned
// with NaN first: C elements the GEMM must write are checked against the reference, the
// others (ldc padding, rows of no group) must still be NaN. Rows of B are padded with NaN
// codes past K (row_stride > K), so a read past the row shows up as NaN too.
//
// Error bound per element: |C - ref| <= 1e-5 * sum_k |A[m][k] * dequant(B)[n][k]|. The
// sequential fp32 sum of K terms of random sign is typically off by ~u = 6e-8 of that
// sum (the rigorous worst case is K * u); one term too many or too few moves the result by
// ~1/K of it, i.e. >= 3.5e-4 for the K <= 2880 used here, far above the bound.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/gemm.h"
#include "modmoe/error.h"
#include "modmoe/numeric.h"
#include "modmoe/quant.h"

namespace modmoe {
namespace cpu {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kSeed = 20240611;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kRelativeBound = 1e-5;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- the micro-kernel choice ----------------------------------------------------------------

// Sets MODMOE_CPU_GEMM_ISA for the lifetime of the object (the GEMM reads it on every call).
class ScopedIsa {
 public:
  explicit ScopedIsa(const std::string& isa) {
    if (const char* old = std::getenv(kVar)) saved_ = old, had_ = true;
    setenv(kVar, isa.c_str(), 1);
  }
  ~ScopedIsa() {
    if (had_) {
      setenv(kVar, saved_.c_str(), 1);
    } else {
      unsetenv(kVar);
    }
  }

 private:
  static constexpr const char* kVar = "MODMOE_CPU_GEMM_ISA";
  std::string saved_;
  bool had_ = false;
};

const char* const kIsas[] = {"generic", "avx2", "avx512"};

// ---- random weights -------------------------------------------------------------------------

struct Format {
  DType dtype;
  QuantScheme scheme;
};

std::string format_name(const Format& f) {
  return std::string(dtype_name(f.dtype)) + "/" + quant_scheme_name(f.scheme);
}

const Format kFormats[] = {
    {DType::fp32, QuantScheme::none},          {DType::bf16, QuantScheme::none},
    {DType::fp16, QuantScheme::none},          {DType::fp8_e4m3, QuantScheme::fp8_tensor},
    {DType::fp8_e4m3, QuantScheme::fp8_token}, {DType::fp8_e4m3, QuantScheme::fp8_block},
    {DType::fp8_e4m3, QuantScheme::mxfp8},
};

// One expert's B: its codes (row_stride apart, NaN codes in the padding), its scales, the
// operand that points at them, and dequant(B) in float64 for the reference.
struct Weight {
  std::vector<uint8_t> bytes;
  std::vector<float> scale_f32;
  std::vector<uint8_t> scale_e8m0;
  std::vector<double> dequant;  // (N, K)
  WeightOperand op;
};

// The NaN code of each storage dtype, for row padding.
void store_nan(void* base, DType dtype, int64_t index) {
  if (dtype == DType::fp8_e4m3) {
    static_cast<uint8_t*>(base)[index] = 0x7f;
  } else {
    store_float(base, dtype, index, kNaN);
  }
}

// A random code of `dtype` that is finite.
void store_random(std::mt19937& rng, void* base, DType dtype, int64_t index) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  switch (dtype) {
    case DType::fp8_e4m3: {
      uint8_t code;
      do {
        code = static_cast<uint8_t>(rng());
      } while ((code & 0x7f) == 0x7f);  // 0x7f / 0xff are NaN
      static_cast<uint8_t*>(base)[index] = code;
      break;
    }
    case DType::fp16: {
      // Any bit pattern with a finite exponent: subnormals, tiny and large values alike.
      uint16_t code;
      do {
        code = static_cast<uint16_t>(rng());
      } while ((code & 0x7c00) == 0x7c00);
      static_cast<uint16_t*>(base)[index] = code;
      break;
    }
    default:
      store_float(base, dtype, index, normal(rng));
  }
}

Weight make_weight(std::mt19937& rng, Format f, int64_t N, int64_t K, int64_t row_stride) {
  Weight w;
  const size_t esize = dtype_size(f.dtype);
  w.bytes.resize(static_cast<size_t>(std::max<int64_t>(N * row_stride, 1)) * esize);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < row_stride; ++k) {
      if (k < K) {
        store_random(rng, w.bytes.data(), f.dtype, n * row_stride + k);
      } else {
        store_nan(w.bytes.data(), f.dtype, n * row_stride + k);
      }
    }
  }
  std::uniform_real_distribution<float> positive(0.25f, 2.0f);
  std::uniform_int_distribution<int> e8m0_code(120, 130);
  const void* scale = nullptr;
  switch (f.scheme) {
    case QuantScheme::none:
      break;
    case QuantScheme::fp8_tensor:
      w.scale_f32 = {positive(rng)};
      break;
    case QuantScheme::fp8_token:
      w.scale_f32.resize(N);
      break;
    case QuantScheme::fp8_block:
      w.scale_f32.resize(ceil_div(N, kBlockSize) * ceil_div(K, kBlockSize));
      break;
    case QuantScheme::mxfp8:
      w.scale_e8m0.resize(N * ceil_div(K, kMxBlockSize));
      for (auto& s : w.scale_e8m0) s = static_cast<uint8_t>(e8m0_code(rng));
      break;
  }
  for (auto& s : w.scale_f32) s = positive(rng);
  if (!w.scale_f32.empty()) scale = w.scale_f32.data();
  if (!w.scale_e8m0.empty()) scale = w.scale_e8m0.data();

  w.dequant.resize(N * K);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      double s = 1.0;
      switch (f.scheme) {
        case QuantScheme::none:
          break;
        case QuantScheme::fp8_tensor:
          s = w.scale_f32[0];
          break;
        case QuantScheme::fp8_token:
          s = w.scale_f32[n];
          break;
        case QuantScheme::fp8_block:
          s = w.scale_f32[(n / kBlockSize) * ceil_div(K, kBlockSize) + k / kBlockSize];
          break;
        case QuantScheme::mxfp8:
          s = e8m0_to_float(w.scale_e8m0[n * ceil_div(K, kMxBlockSize) + k / kMxBlockSize]);
          break;
      }
      w.dequant[n * K + k] = load_float(w.bytes.data(), f.dtype, n * row_stride + k) * s;
    }
  }
  w.op.data = w.bytes.data();
  w.op.dtype = f.dtype;
  w.op.N = N;
  w.op.K = K;
  w.op.row_stride = row_stride;
  w.op.scheme = f.scheme;
  w.op.scale = scale;
  return w;
}

std::vector<float> random_floats(std::mt19937& rng, int64_t count) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (auto& x : v) x = unit(rng);
  return v;
}

// ---- the check ------------------------------------------------------------------------------

// A grouped problem: A (rows, lda), C (rows, ldc), groups by row_offsets, weights per group
// (groups without rows get an operand with no data: the GEMM must not look at it).
struct Problem {
  int64_t rows = 0, lda = 0, ldc = 0, N = 0, K = 0;
  std::vector<int64_t> row_offsets;
  std::vector<Weight> weights;
  std::vector<WeightOperand> ops;
  std::vector<float> A;
};

Problem make_problem(std::mt19937& rng, Format f, const std::vector<int64_t>& row_offsets,
                     int64_t N, int64_t K, int64_t lda, int64_t ldc, int64_t row_stride) {
  Problem p;
  p.rows = row_offsets.back() + 2;  // two rows after the last group belong to no group
  p.lda = lda;
  p.ldc = ldc;
  p.N = N;
  p.K = K;
  p.row_offsets = row_offsets;
  const int64_t groups = static_cast<int64_t>(row_offsets.size()) - 1;
  p.weights.resize(groups);
  p.ops.resize(groups);
  for (int64_t g = 0; g < groups; ++g) {
    if (row_offsets[g + 1] > row_offsets[g]) {
      p.weights[g] = make_weight(rng, f, N, K, row_stride);
      p.ops[g] = p.weights[g].op;
    } else {
      p.ops[g].N = N;  // data stays null
      p.ops[g].K = K;
    }
  }
  p.A = random_floats(rng, p.rows * lda);
  for (int64_t m = 0; m < p.rows; ++m) {
    for (int64_t k = K; k < lda; ++k) p.A[m * lda + k] = kNaN;  // never read
  }
  return p;
}

std::vector<float> run_problem(const Problem& p) {
  std::vector<float> C(static_cast<size_t>(p.rows * p.ldc), kNaN);
  grouped_gemm_nt(static_cast<int64_t>(p.ops.size()), p.row_offsets.data(), p.A.data(), p.lda,
                  p.ops.data(), C.data(), p.ldc);
  return C;
}

void check_against_reference(const Problem& p, const std::vector<float>& C) {
  std::vector<bool> in_group(p.rows, false);
  int failures = 0;
  for (size_t g = 0; g + 1 < p.row_offsets.size(); ++g) {
    for (int64_t m = p.row_offsets[g]; m < p.row_offsets[g + 1]; ++m) {
      in_group[m] = true;
      for (int64_t n = 0; n < p.N; ++n) {
        double ref = 0.0, magnitude = 0.0;
        for (int64_t k = 0; k < p.K; ++k) {
          const double term = p.A[m * p.lda + k] * p.weights[g].dequant[n * p.K + k];
          ref += term;
          magnitude += std::fabs(term);
        }
        const float got = C[m * p.ldc + n];
        const double bound = kRelativeBound * magnitude;
        if (!(std::fabs(got - ref) <= bound) && failures++ < 5) {
          ADD_FAILURE() << "group " << g << " C[" << m << "][" << n << "] = " << got
                        << ", reference " << ref << ", |error| " << std::fabs(got - ref)
                        << " > bound " << bound;
        }
      }
    }
  }
  for (int64_t m = 0; m < p.rows; ++m) {
    for (int64_t n = 0; n < p.ldc; ++n) {
      if ((!in_group[m] || n >= p.N) && !std::isnan(C[m * p.ldc + n]) && failures++ < 5) {
        ADD_FAILURE() << "C[" << m << "][" << n << "] is outside every group's output but was "
                      << "overwritten with " << C[m * p.ldc + n];
      }
    }
  }
  EXPECT_EQ(failures, 0) << "elements failing";
}

// ---- accuracy over formats, shapes and micro-kernels ----------------------------------------

struct Shape3 {
  int64_t M, N, K;
};

class GemmIsaTest : public ::testing::TestWithParam<const char*> {};

TEST_P(GemmIsaTest, SingleGroupMatchesReferenceForEveryFormat) {
  const ScopedIsa isa(GetParam());
  // Up to 4 rows take the few-rows path: decode-sized (M = 1, K = 2880 with a partial 128
  // block, N = 200 with a partial tile) and K tails of every vector width. More rows take the
  // packed path: odd sizes, a K that crosses the 256 block by one, row blocks + remainders.
  const Shape3 shapes[] = {{1, 200, 2880}, {2, 33, 101},   {3, 19, 259}, {4, 40, 70},
                           {7, 33, 100},   {13, 130, 257}, {50, 17, 5}};
  uint32_t seed = kSeed;
  for (const Format& f : kFormats) {
    for (const Shape3& s : shapes) {
      for (const bool padded : {false, true}) {
        SCOPED_TRACE(testing::Message() << "isa " << GetParam() << ", " << format_name(f)
                                        << ", (M, N, K) = (" << s.M << ", " << s.N << ", " << s.K
                                        << "), padded strides " << padded << ", seed " << seed);
        std::mt19937 rng(seed++);
        const int64_t lda = padded ? s.K + 3 : s.K, ldc = padded ? s.N + 5 : s.N;
        const int64_t row_stride = padded ? s.K + 7 : s.K;
        const Problem p = make_problem(rng, f, {0, s.M}, s.N, s.K, lda, ldc, row_stride);
        std::vector<float> C(static_cast<size_t>(p.rows * ldc), kNaN);
        gemm_nt(s.M, p.A.data(), lda, p.ops[0], C.data(), ldc);
        check_against_reference(p, C);
      }
    }
  }
}

TEST_P(GemmIsaTest, GroupsWithEmptyGroupsMatchReference) {
  const ScopedIsa isa(GetParam());
  // Rows 0-1 and the last two rows belong to no group; empty groups have no weights at all;
  // groups of 1-3 rows (few-rows path) and 9 rows (packed); one group is larger than a tile's
  // row count (240), so it is split along M.
  const std::vector<int64_t> offsets = {2, 5, 5, 6, 6, 6, 15, 17, 264, 264};
  uint32_t seed = kSeed + 1000;
  for (const Format& f : {kFormats[1], kFormats[5], kFormats[6]}) {
    SCOPED_TRACE(testing::Message()
                 << "isa " << GetParam() << ", " << format_name(f) << ", seed " << seed);
    std::mt19937 rng(seed++);
    const Problem p = make_problem(rng, f, offsets, /*N=*/37, /*K=*/150, /*lda=*/160,
                                   /*ldc=*/40, /*row_stride=*/151);
    check_against_reference(p, run_problem(p));
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, GemmIsaTest, ::testing::ValuesIn(kIsas),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// ---- determinism ----------------------------------------------------------------------------

// Restores the OpenMP thread count on scope exit.
class ScopedThreads {
 public:
  explicit ScopedThreads(int threads) : saved_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
  }
  ~ScopedThreads() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

TEST(Gemm, ResultIsBitIdenticalForOneAndTwoThreads) {
  struct Case {
    const char* what;
    std::vector<int64_t> offsets;
    int64_t N, K;
    Format format;
  };
  // Large enough to run in parallel; 1 and 2 threads also cut different tiles.
  const Case cases[] = {
      {"decode", {0, 1}, 200, 2880, kFormats[5]},
      {"groups", {0, 1, 6, 6, 76, 79}, 200, 300, kFormats[1]},
      {"prefill", {0, 70}, 96, 520, kFormats[6]},
  };
  uint32_t seed = kSeed + 2000;
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message()
                 << c.what << ", " << format_name(c.format) << ", seed " << seed);
    std::mt19937 rng(seed++);
    const Problem p = make_problem(rng, c.format, c.offsets, c.N, c.K, c.K, c.N, c.K);
    std::vector<float> one, two;
    {
      const ScopedThreads threads(1);
      one = run_problem(p);
    }
    {
      const ScopedThreads threads(2);
      two = run_problem(p);
    }
    check_against_reference(p, two);
    EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(float)))
        << "1-thread and 2-thread results differ";
  }
}

// ---- degenerate shapes ----------------------------------------------------------------------

TEST(Gemm, EmptySumWritesZeros) {
  std::mt19937 rng(kSeed + 3000);
  const Problem p = make_problem(rng, kFormats[1], {0, 3}, /*N=*/5, /*K=*/0, 4, 6, 0);
  const std::vector<float> C = run_problem(p);
  for (int64_t m = 0; m < 3; ++m) {
    for (int64_t n = 0; n < 5; ++n) EXPECT_EQ(C[m * 6 + n], 0.0f) << "C[" << m << "][" << n << "]";
  }
  check_against_reference(p, C);  // and nothing else written
}

TEST(Gemm, NothingToDoTouchesNothing) {
  std::mt19937 rng(kSeed + 4000);
  const Problem no_columns = make_problem(rng, kFormats[0], {0, 3}, /*N=*/0, 8, 8, 4, 8);
  check_against_reference(no_columns, run_problem(no_columns));  // all of C stays NaN

  std::vector<float> C(4, kNaN);
  grouped_gemm_nt(0, nullptr, nullptr, 1, nullptr, C.data(), 1);
  WeightOperand unused;  // no data: never looked at for M = 0
  gemm_nt(0, nullptr, 1, unused, C.data(), 1);
  for (float c : C) EXPECT_TRUE(std::isnan(c));
}

// ---- argument validation --------------------------------------------------------------------

template <typename F>
void expect_error(F&& call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one containing: " << fragment;
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(fragment));
  }
}

TEST(Gemm, RejectsInvalidArguments) {
  std::mt19937 rng(kSeed + 5000);
  Problem p = make_problem(rng, kFormats[5], {0, 2, 2, 4}, /*N=*/16, /*K=*/64, 64, 16, 64);
  std::vector<float> C(static_cast<size_t>(p.rows * p.ldc), kNaN);
  auto call = [&](int64_t lda, int64_t ldc) {
    grouped_gemm_nt(3, p.row_offsets.data(), p.A.data(), lda, p.ops.data(), C.data(), ldc);
  };

  call(64, 16);  // the valid call works (and ignores the empty group's missing weights)
  for (const int64_t m : {0, 1, 2, 3}) {
    for (int64_t n = 0; n < 16; ++n) EXPECT_FALSE(std::isnan(C[m * 16 + n]));
  }
  std::fill(C.begin(), C.end(), kNaN);

  WeightOperand saved = p.ops[2];
  p.ops[2].row_stride = 10;
  expect_error([&] { call(64, 16); }, "grouped_gemm_nt: B[2].row_stride must be >= K = 64, got 10");
  p.ops[2] = saved;
  p.ops[2].dtype = DType::int8;
  expect_error([&] { call(64, 16); },
               "grouped_gemm_nt: B[2].dtype must be bf16, fp16, fp32 or fp8_e4m3, got int8");
  p.ops[2] = saved;
  p.ops[2].scheme = QuantScheme::none;
  expect_error([&] { call(64, 16); },
               "B[2].scheme must be fp8-tensor, fp8-token, fp8-block or "
               "mxfp8 for fp8_e4m3 weights, got none");
  p.ops[2] = saved;
  p.ops[2].scale = nullptr;
  expect_error([&] { call(64, 16); }, "B[2].scale must not be null for fp8-block weights");
  p.ops[2] = saved;
  p.ops[2].data = nullptr;
  expect_error([&] { call(64, 16); }, "B[2].data must not be null (its group has 2 rows)");
  p.ops[2] = saved;
  p.ops[0].dtype = DType::bf16;  // bf16 with a scheme
  expect_error([&] { call(64, 16); }, "B[0].scheme must be none for bf16 weights, got fp8-block");
  p.ops[0] = p.weights[0].op;

  expect_error([&] { call(63, 16); }, "grouped_gemm_nt: lda must be >= B[0].K = 64, got 63");
  expect_error([&] { call(64, 15); }, "grouped_gemm_nt: ldc must be >= B[0].N = 16, got 15");

  p.row_offsets[2] = 1;
  expect_error([&] { call(64, 16); },
               "row_offsets must be non-decreasing, got row_offsets[1] = 2 > row_offsets[2] = 1");
  p.row_offsets[2] = 2;

  expect_error([&] { gemm_nt(-1, p.A.data(), 64, p.ops[0], C.data(), 16); },
               "gemm_nt: M must be >= 0, got -1");
  expect_error([&] { gemm_nt(2, p.A.data(), 64, p.ops[0], nullptr, 16); },
               "gemm_nt: C must not be null");
  {
    const ScopedIsa isa("sse9");
    expect_error([&] { call(64, 16); },
                 "MODMOE_CPU_GEMM_ISA must be avx512, avx2, generic or auto, got 'sse9'");
  }
  for (float c : C) EXPECT_TRUE(std::isnan(c)) << "a rejected call wrote to C";
}

}  // namespace
}  // namespace cpu
}  // namespace modmoe
