// The portable grouped GEMM (src/cuda/grouped_gemm.h) against a float64 reference computed
// here from the definition: dequant(A)[s][k] * dequant(B[e])[n][k] summed over k, then the
// gated activation of activation.h (activation_gated<double>) where the case is gated.
//
// Every case:
//   * draws its data from a seeded std::mt19937 (the seed is printed on failure); operands are
//     random codes of the operand dtype, scales random positive values of each layout;
//   * fills every A row that no expert owns (rows past m_indptr[E], batched rows past the
//     counts, rows the gather map skips) and A's row padding (lda > K) with NaN codes and NaN
//     scales: reading any of them turns some output into NaN;
//   * poisons D with 0xFF bytes (NaN in bf16 / fp16 / fp32) and checks that rows outside the
//     expert ranges and the columns past N_out (ldd padding) still hold the poison;
//   * runs the GEMM twice into two poisoned outputs and requires bitwise-equal results
//     (deterministic);
//   * checks, per expert, ||D - ref|| / ||ref|| and every element against
//     |D - ref| <= rtol * |ref| + 1e-4 * rms(ref of the expert): rtol is the output dtype's
//     rounding (2^-8 bf16, 2^-10 fp16, 1e-6 fp32); 1e-4 * rms bounds fp32 accumulation over
//     K <= 2880 terms by a wide margin while one missing K term (~1/sqrt(K) of rms) fails.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/gpu_test.h"
#include "cuda/grouped_gemm.h"
#include "cuda/grouped_gemm_heuristic.cuh"
#include "modmoe/activation.h"
#include "modmoe/error.h"
#include "modmoe/numeric.h"
#include "modmoe/quant.h"

namespace modmoe::cuda {
namespace {

using ::testing::HasSubstr;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- device memory -----------------------------------------------------------------------

// A cudaMalloc'd copy of a host vector (or `bytes` of uninitialized memory).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    MODMOE_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(bytes, 16)));
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    upload(host);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }

  // upload() and fill() run on the legacy default stream and may return before the device
  // has finished (a pageable copy returns once staged, a device memset is asynchronous). The
  // GEMMs run on cudaStreamNonBlocking streams, which do not wait for the legacy stream, so
  // both wait for the device here: otherwise a late memset can overwrite results with the
  // poison (seen as -nan under GPU contention) and a late copy can feed stale operands.
  template <typename T>
  void upload(const std::vector<T>& host) {
    MODMOE_CUDA_CHECK(
        cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    MODMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> host(bytes_);
    MODMOE_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost));
    return host;
  }
  void fill(uint8_t byte) {
    MODMOE_CUDA_CHECK(cudaMemset(ptr_, byte, bytes_));
    MODMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// ---- a problem -----------------------------------------------------------------------------

struct Case {
  std::string name;
  DType ab = DType::bf16;
  QuantScheme scheme = QuantScheme::none;
  int64_t E = 1, N_b = 64, K = 64;
  std::vector<int> rows;  // rows per expert (standard) or expert_num_tokens (batched)
  bool batched = false;
  int64_t batch_rows = 0;
  bool gather = false;  // standard mode only: logical rows read A through a_row_index
  bool gated = false;
  Activation activation = Activation::silu;
  GatedLayout layout = GatedLayout::GateUp;
  DType d_dtype = DType::bf16;
  int64_t lda_pad = 0, ldd_pad = 0;
  int64_t extra_rows = 5;  // standard: unowned rows after m_indptr[E] (A and D)
  int64_t max_rows = -1;   // -1: the number of logical rows the case has
  uint32_t seed = 1;
};

std::string describe(const Case& c) {
  std::ostringstream s;
  s << c.name << " [" << dtype_name(c.ab) << "/" << quant_scheme_name(c.scheme) << " E=" << c.E
    << " N_b=" << c.N_b << " K=" << c.K << (c.batched ? " batched" : " standard")
    << (c.gather ? " gather" : "")
    << (c.gated ? std::string(" gated ") + activation_name(c.activation) + "/" +
                      gated_layout_name(c.layout)
                : std::string(" plain"))
    << " D=" << dtype_name(c.d_dtype) << " seed=" << c.seed << "]";
  return s.str();
}

int64_t n_out(const Case& c) { return c.gated ? c.N_b / 2 : c.N_b; }

// Everything on the host side of a case, with the float64 dequantized operands.
struct HostProblem {
  // Logical rows: [begin, end) per expert; D has `d_rows` rows.
  std::vector<int32_t> m_indptr, num_tokens, row_index;
  std::vector<int64_t> begin, end;
  int64_t logical_rows = 0, a_rows = 0, d_rows = 0, lda = 0, ldd = 0;
  std::vector<int32_t> src_of_row;  // A row of each logical row (-1: no data)
  std::vector<uint8_t> a, b;        // codes
  std::vector<float> a_scale, b_scale;
  std::vector<uint8_t> a_scale_mx, b_scale_mx;
  std::vector<double> a_deq;  // (a_rows, K), NaN for unowned rows
};

uint16_t float_bits16(DType d, float v) {
  return d == DType::bf16 ? float_to_bf16(v) : float_to_fp16(v);
}

double code_value(DType d, const uint8_t* base, int64_t i) {
  if (d == DType::fp8_e4m3) return e4m3_to_float(base[i]);
  uint16_t bits;
  std::memcpy(&bits, base + 2 * i, 2);
  return d == DType::bf16 ? bf16_to_float(bits) : fp16_to_float(bits);
}

// Draws operands and scales; unowned A rows get NaN codes and NaN scales.
HostProblem make_problem(const Case& c) {
  HostProblem h;
  std::mt19937 rng(c.seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), spread(0.5f, 2.0f);
  const int64_t E = c.E, K = c.K, esize = c.ab == DType::fp8_e4m3 ? 1 : 2;
  const bool fp8 = c.ab == DType::fp8_e4m3;

  // Row ownership.
  h.begin.resize(E);
  h.end.resize(E);
  if (c.batched) {
    h.logical_rows = E * c.batch_rows;
    for (int64_t e = 0; e < E; ++e) {
      h.num_tokens.push_back(c.rows[e]);
      h.begin[e] = e * c.batch_rows;
      h.end[e] = h.begin[e] + c.rows[e];
    }
    h.d_rows = h.logical_rows;
  } else {
    h.m_indptr.push_back(0);
    for (int64_t e = 0; e < E; ++e) {
      h.begin[e] = h.m_indptr.back();
      h.m_indptr.push_back(h.m_indptr.back() + c.rows[e]);
      h.end[e] = h.m_indptr.back();
    }
    h.logical_rows = h.m_indptr.back();
    h.d_rows = h.logical_rows + c.extra_rows;
  }

  // Source rows: identity, or a random injective map into a larger A (the rest unowned).
  h.src_of_row.assign(h.d_rows, -1);
  if (c.gather) {
    h.a_rows = h.logical_rows + c.extra_rows + 3;
    std::vector<int32_t> perm(h.a_rows);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    h.row_index.assign(h.d_rows, -1);  // past m_indptr[E]: never read by the kernel
    for (int64_t r = 0; r < h.logical_rows; ++r) h.row_index[r] = h.src_of_row[r] = perm[r];
    for (int64_t r = h.logical_rows; r < h.d_rows; ++r) h.row_index[r] = 0x7fffffff;
  } else {
    h.a_rows = h.d_rows;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t r = h.begin[e]; r < h.end[e]; ++r) h.src_of_row[r] = static_cast<int32_t>(r);
  }
  std::vector<bool> a_owned(h.a_rows, false);
  for (int32_t s : h.src_of_row)
    if (s >= 0) a_owned[s] = true;

  // A codes, with NaN in unowned rows and in the lda padding.
  h.lda = K + c.lda_pad;
  h.a.assign(h.a_rows * h.lda * esize, 0);
  auto put = [&](std::vector<uint8_t>& v, int64_t i, float x, bool nan) {
    if (fp8) {
      v[i] = nan ? 0x7f : float_to_e4m3(x * 448.0f);
    } else {
      const uint16_t bits = nan ? (c.ab == DType::bf16 ? 0x7fc0 : 0x7e00) : float_bits16(c.ab, x);
      std::memcpy(&v[2 * i], &bits, 2);
    }
  };
  for (int64_t s = 0; s < h.a_rows; ++s)
    for (int64_t k = 0; k < h.lda; ++k) put(h.a, s * h.lda + k, unit(rng), !a_owned[s] || k >= K);

  // B codes (E, N_b, K).
  h.b.assign(E * c.N_b * K * esize, 0);
  for (int64_t i = 0; i < E * c.N_b * K; ++i) put(h.b, i, unit(rng), false);

  // Scales: fp32 around 1/448 (dequantized values of order 1), e8m0 2^-9 .. 2^-7.
  const float nan = std::nanf("");
  const int64_t kb = ceil_div(K, kBlockSize), kg = ceil_div(K, kMxBlockSize);
  auto fp32_scale = [&] { return spread(rng) / 448.0f; };
  auto mx_code = [&] { return static_cast<uint8_t>(118 + rng() % 3); };
  switch (c.scheme) {
    case QuantScheme::fp8_tensor:
      h.a_scale = {fp32_scale()};
      for (int64_t e = 0; e < E; ++e) h.b_scale.push_back(fp32_scale());
      break;
    case QuantScheme::fp8_token:
      for (int64_t s = 0; s < h.a_rows; ++s) h.a_scale.push_back(a_owned[s] ? fp32_scale() : nan);
      for (int64_t i = 0; i < E * c.N_b; ++i) h.b_scale.push_back(fp32_scale());
      break;
    case QuantScheme::fp8_block:
      for (int64_t s = 0; s < h.a_rows; ++s)
        for (int64_t g = 0; g < kb; ++g) h.a_scale.push_back(a_owned[s] ? fp32_scale() : nan);
      for (int64_t i = 0; i < E * ceil_div(c.N_b, kBlockSize) * kb; ++i)
        h.b_scale.push_back(fp32_scale());
      break;
    case QuantScheme::mxfp8:
      for (int64_t s = 0; s < h.a_rows; ++s)
        for (int64_t g = 0; g < kg; ++g) h.a_scale_mx.push_back(a_owned[s] ? mx_code() : 0xff);
      for (int64_t i = 0; i < E * c.N_b * kg; ++i) h.b_scale_mx.push_back(mx_code());
      break;
    case QuantScheme::none:
      break;
  }

  // dequant(A) in float64.
  h.a_deq.assign(h.a_rows * K, std::nan(""));
  for (int64_t s = 0; s < h.a_rows; ++s) {
    if (!a_owned[s]) continue;
    for (int64_t k = 0; k < K; ++k) {
      double scale = 1.0;
      switch (c.scheme) {
        case QuantScheme::fp8_tensor:
          scale = h.a_scale[0];
          break;
        case QuantScheme::fp8_token:
          scale = h.a_scale[s];
          break;
        case QuantScheme::fp8_block:
          scale = h.a_scale[s * kb + k / kBlockSize];
          break;
        case QuantScheme::mxfp8:
          scale = e8m0_to_float(h.a_scale_mx[s * kg + k / kMxBlockSize]);
          break;
        case QuantScheme::none:
          break;
      }
      h.a_deq[s * K + k] = code_value(c.ab, h.a.data(), s * h.lda + k) * scale;
    }
  }
  h.ldd = n_out(c) + c.ldd_pad;
  return h;
}

// dequant(B[e]) (N_b, K) in float64.
std::vector<double> dequant_b(const Case& c, const HostProblem& h, int64_t e) {
  const int64_t N = c.N_b, K = c.K;
  const int64_t kb = ceil_div(K, kBlockSize), kg = ceil_div(K, kMxBlockSize);
  std::vector<double> out(N * K);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      double scale = 1.0;
      switch (c.scheme) {
        case QuantScheme::fp8_tensor:
          scale = h.b_scale[e];
          break;
        case QuantScheme::fp8_token:
          scale = h.b_scale[e * N + n];
          break;
        case QuantScheme::fp8_block:
          scale = h.b_scale[(e * ceil_div(N, kBlockSize) + n / kBlockSize) * kb + k / kBlockSize];
          break;
        case QuantScheme::mxfp8:
          scale = e8m0_to_float(h.b_scale_mx[(e * N + n) * kg + k / kMxBlockSize]);
          break;
        case QuantScheme::none:
          break;
      }
      out[n * K + k] = code_value(c.ab, h.b.data(), (e * N + n) * K + k) * scale;
    }
  }
  return out;
}

// Reference output (d_rows, N_out); rows nobody owns are left NaN (not compared).
std::vector<double> reference(const Case& c, const HostProblem& h) {
  const int64_t K = c.K, N = c.N_b, No = n_out(c);
  std::vector<double> ref(h.d_rows * No, std::nan(""));
  std::vector<double> acc(N);
  for (int64_t e = 0; e < c.E; ++e) {
    if (h.end[e] == h.begin[e]) continue;
    const std::vector<double> b = dequant_b(c, h, e);
    for (int64_t r = h.begin[e]; r < h.end[e]; ++r) {
      const double* a = &h.a_deq[h.src_of_row[r] * K];
      for (int64_t n = 0; n < N; ++n) {
        double s = 0.0;
        for (int64_t k = 0; k < K; ++k) s += a[k] * b[n * K + k];
        acc[n] = s;
      }
      for (int64_t j = 0; j < No; ++j) {
        ref[r * No + j] =
            c.gated ? activation_gated<double>(c.activation, acc[gate_column(c.layout, j, No)],
                                               acc[up_column(c.layout, j, No)])
                    : acc[j];
      }
    }
  }
  return ref;
}

// The problem on the device, and the arguments that point at it.
struct DeviceProblem {
  DeviceBuffer a, b, a_scale, b_scale, m_indptr, num_tokens, row_index, d, d2;
  GroupedGemmArgs args;
};

DeviceProblem upload(const Case& c, const HostProblem& h) {
  DeviceProblem dp;
  dp.a = DeviceBuffer(h.a);
  dp.b = DeviceBuffer(h.b);
  GroupedGemmArgs& a = dp.args;
  a.A = dp.a.get();
  a.lda = h.lda;
  a.B = dp.b.get();
  a.ab_dtype = c.ab;
  a.E = c.E;
  a.N_b = c.N_b;
  a.K = c.K;
  if (c.batched) {
    dp.num_tokens = DeviceBuffer(h.num_tokens);
    a.expert_num_tokens = dp.num_tokens.as<int32_t>();
    a.batch_rows = c.batch_rows;
  } else {
    dp.m_indptr = DeviceBuffer(h.m_indptr);
    a.m_indptr = dp.m_indptr.as<int32_t>();
  }
  if (c.gather) {
    dp.row_index = DeviceBuffer(h.row_index);
    a.a_row_index = dp.row_index.as<int32_t>();
  }
  a.max_rows = c.max_rows >= 0 ? c.max_rows : (c.batched ? 0 : h.logical_rows);
  a.scheme = c.scheme;
  if (c.scheme == QuantScheme::mxfp8) {
    dp.a_scale = DeviceBuffer(h.a_scale_mx);
    dp.b_scale = DeviceBuffer(h.b_scale_mx);
  } else if (c.scheme != QuantScheme::none) {
    dp.a_scale = DeviceBuffer(h.a_scale);
    dp.b_scale = DeviceBuffer(h.b_scale);
  }
  a.a_scale = dp.a_scale.get();
  a.b_scale = dp.b_scale.get();
  a.gated = c.gated;
  a.activation = c.activation;
  a.gated_layout = c.layout;
  a.ldd = h.ldd;
  a.d_dtype = c.d_dtype;
  const size_t d_bytes = h.d_rows * h.ldd * dtype_size(c.d_dtype);
  dp.d = DeviceBuffer(d_bytes);
  dp.d2 = DeviceBuffer(d_bytes);
  a.D = dp.d.get();
  return dp;
}

double output_value(DType d, const std::vector<uint8_t>& bytes, int64_t i) {
  if (d == DType::fp32) {
    float v;
    std::memcpy(&v, &bytes[4 * i], 4);
    return v;
  }
  return code_value(d, bytes.data(), i);
}

// Compares D with the reference; checks that unowned rows and ldd padding kept the poison.
void check_output(const Case& c, const HostProblem& h, const std::vector<double>& ref,
                  const std::vector<uint8_t>& d) {
  const int64_t No = n_out(c), esize = dtype_size(c.d_dtype);
  const double rtol = c.d_dtype == DType::bf16   ? 1.0 / 256
                      : c.d_dtype == DType::fp16 ? 1.0 / 1024
                                                 : 1e-6;
  std::vector<bool> owned(h.d_rows, false);
  for (int64_t e = 0; e < c.E; ++e)
    for (int64_t r = h.begin[e]; r < h.end[e]; ++r) owned[r] = true;

  // Untouched bytes: unowned rows entirely, owned rows past N_out.
  int64_t clobbered = 0;
  std::string first_clobbered;
  for (int64_t r = 0; r < h.d_rows; ++r) {
    for (int64_t j = owned[r] ? No : 0; j < h.ldd; ++j) {
      const uint8_t* p = &d[(r * h.ldd + j) * esize];
      if (std::any_of(p, p + esize, [](uint8_t v) { return v != 0xff; })) {
        if (clobbered++ == 0) {
          first_clobbered = "D[" + std::to_string(r) + "][" + std::to_string(j) + "]";
        }
      }
    }
  }
  EXPECT_EQ(clobbered, 0) << describe(c) << ": " << clobbered
                          << " elements outside the expert rows / past N_out were written, "
                             "first "
                          << first_clobbered;

  for (int64_t e = 0; e < c.E; ++e) {
    if (h.end[e] == h.begin[e]) continue;
    double diff2 = 0.0, ref2 = 0.0;
    for (int64_t r = h.begin[e]; r < h.end[e]; ++r)
      for (int64_t j = 0; j < No; ++j) ref2 += ref[r * No + j] * ref[r * No + j];
    const double count = double(h.end[e] - h.begin[e]) * No;
    const double rms = std::sqrt(ref2 / count);
    int64_t bad = 0;
    std::string first_bad;
    for (int64_t r = h.begin[e]; r < h.end[e]; ++r) {
      for (int64_t j = 0; j < No; ++j) {
        const double want = ref[r * No + j];
        const double got = output_value(c.d_dtype, d, r * h.ldd + j);
        const double err = std::fabs(got - want);
        diff2 += std::isfinite(got) ? err * err : INFINITY;
        if (!(err <= rtol * std::fabs(want) + 1e-4 * rms)) {
          if (bad++ == 0) {
            std::ostringstream s;
            s << "D[" << r << "][" << j << "] = " << got << ", reference " << want;
            first_bad = s.str();
          }
        }
      }
    }
    const double rel = std::sqrt(diff2 / std::max(ref2, 1e-300));
    EXPECT_EQ(bad, 0) << describe(c) << ": expert " << e << " has " << bad << " of " << count
                      << " elements off, first " << first_bad << " (rms " << rms << ")";
    EXPECT_LE(rel, c.d_dtype == DType::fp32 ? 1e-5 : 1e-2)
        << describe(c) << ": expert " << e << " relative error " << rel;
  }
}

// Runs the case (twice, into two poisoned outputs) and checks it.
void run_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  const HostProblem h = make_problem(c);
  const std::vector<double> ref = reference(c, h);
  DeviceProblem dp = upload(c, h);
  ASSERT_EQ(grouped_gemm_can_implement(dp.args), "");

  cudaStream_t stream;
  MODMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  dp.d.fill(0xff);
  dp.d2.fill(0xff);
  grouped_gemm(dp.args, stream);
  GroupedGemmArgs again = dp.args;
  again.D = dp.d2.get();
  grouped_gemm(again, stream);
  MODMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  MODMOE_CUDA_CHECK(cudaStreamDestroy(stream));

  const std::vector<uint8_t> d = dp.d.download(), d2 = dp.d2.download();
  check_output(c, h, ref, d);
  EXPECT_TRUE(d == d2) << describe(c) << ": two runs differ (not deterministic)";
}

std::vector<int> random_rows(uint32_t seed, int64_t E, int lo, int hi) {
  std::mt19937 rng(seed);
  std::vector<int> rows(E);
  for (auto& r : rows) r = lo + static_cast<int>(rng() % (hi - lo + 1));
  return rows;
}

gemm::GemmTile tile_of(const Case& c) {
  int64_t rows = 0;
  for (int r : c.rows) rows += r;
  const int64_t max_rows = c.max_rows >= 0 ? c.max_rows : (c.batched ? 0 : rows);
  return gemm::choose_gemm_tile(max_rows, c.E, c.batched, c.batch_rows);
}

// ---- 16-bit operands ---------------------------------------------------------------------

TEST(CudaGroupedGemm, Bf16PlainPrefillTile) {
  MODMOE_REQUIRE_GPU();
  Case c;
  c.name = "bf16 plain prefill";
  c.E = 8;
  c.N_b = 200;                              // not a multiple of the 128-wide tile
  c.K = 200;                                // 400 bytes: 3 full slices and a 16-byte one
  c.rows = {0, 1, 17, 64, 100, 3, 0, 130};  // not multiples of 64, empty experts
  c.lda_pad = 24;
  c.ldd_pad = 8;
  c.seed = 101;
  ASSERT_EQ(tile_of(c), gemm::GemmTile::k64x128);
  run_case(c);
}

TEST(CudaGroupedGemm, Bf16PlainDecodeTile) {
  MODMOE_REQUIRE_GPU();
  Case c;
  c.name = "bf16 plain decode";
  c.E = 64;
  c.N_b = 96;
  c.K = 512;
  c.rows = random_rows(7, c.E, 0, 3);
  c.d_dtype = DType::fp32;
  c.seed = 102;
  ASSERT_EQ(tile_of(c), gemm::GemmTile::k16x64);
  run_case(c);
}

TEST(CudaGroupedGemm, Fp16PlainOutputs) {
  MODMOE_REQUIRE_GPU();
  for (DType d : {DType::fp16, DType::fp32, DType::bf16}) {
    Case c;
    c.name = "fp16 plain";
    c.ab = DType::fp16;
    c.E = 4;
    c.N_b = 136;
    c.K = 264;
    c.rows = {50, 33, 0, 81};
    c.d_dtype = d;
    c.ldd_pad = 3;  // odd: rows not 16-byte aligned, the scalar store path
    c.seed = 103;
    run_case(c);
    c.rows = {1, 9, 0, 2};  // the decode tile
    c.seed = 104;
    run_case(c);
  }
}

TEST(CudaGroupedGemm, Bf16GatedLayoutsAndActivations) {
  MODMOE_REQUIRE_GPU();
  uint32_t seed = 200;
  for (GatedLayout layout : {GatedLayout::GateUp, GatedLayout::UpGate, GatedLayout::Interleaved}) {
    for (Activation act : {Activation::silu, Activation::swigluoai}) {
      for (bool decode : {false, true}) {
        Case c;
        c.name = "bf16 gated";
        c.E = 6;
        c.N_b = 2 * 72;  // N_out = 72: not a multiple of either tile's output width
        c.K = 256;       // dot products of order +-10: swigluoai's clamps at +-7 are hit
        c.rows =
            decode ? std::vector<int>{2, 0, 5, 1, 3, 1} : std::vector<int>{70, 0, 45, 128, 3, 66};
        c.gated = true;
        c.activation = act;
        c.layout = layout;
        c.seed = seed++;
        ASSERT_EQ(tile_of(c), decode ? gemm::GemmTile::k16x64 : gemm::GemmTile::k64x128);
        run_case(c);
      }
    }
  }
  for (Activation act : {Activation::gelu, Activation::gelu_tanh}) {
    Case c;
    c.name = "bf16 gated gelu";
    c.E = 3;
    c.N_b = 2 * 40;
    c.K = 128;
    c.rows = {37, 80, 12};
    c.gated = true;
    c.activation = act;
    c.d_dtype = DType::fp32;
    c.seed = seed++;
    run_case(c);
  }
}

// ---- fp8 --------------------------------------------------------------------------------------

const QuantScheme kFp8Schemes[] = {QuantScheme::fp8_tensor, QuantScheme::fp8_token,
                                   QuantScheme::fp8_block, QuantScheme::mxfp8};

TEST(CudaGroupedGemm, Fp8SchemesPrefillK2880) {
  MODMOE_REQUIRE_GPU();
  uint32_t seed = 300;
  for (QuantScheme scheme : kFp8Schemes) {
    for (bool gated : {false, true}) {
      Case c;
      c.name = "fp8 prefill K=2880";
      c.ab = DType::fp8_e4m3;
      c.scheme = scheme;
      c.E = 4;
      c.N_b = gated ? 2 * 96 : 160;  // gated GateUp: up rows 96.. straddle a 128-row block
      c.K = 2880;                    // 22.5 blocks of 128, 90 groups of 32
      c.rows = {70, 0, 33, 96};
      c.gated = gated;
      c.layout = GatedLayout::GateUp;
      c.d_dtype = gated ? DType::bf16 : DType::fp32;
      c.seed = seed++;
      ASSERT_EQ(tile_of(c), gemm::GemmTile::k64x128);
      run_case(c);
    }
  }
}

TEST(CudaGroupedGemm, Fp8SchemesDecodePartialBlocks) {
  MODMOE_REQUIRE_GPU();
  uint32_t seed = 320;
  for (QuantScheme scheme : kFp8Schemes) {
    for (bool gated : {false, true}) {
      Case c;
      c.name = "fp8 decode K=208";
      c.ab = DType::fp8_e4m3;
      c.scheme = scheme;
      c.E = 16;
      c.N_b = gated ? 2 * 136 : 200;  // past one 128-row block of B scales
      c.K = 208;                      // a partial 128 block (80) and a partial 32 group (16)
      c.rows = random_rows(seed, c.E, 0, 4);
      c.gated = gated;
      c.activation = Activation::swigluoai;
      c.layout = GatedLayout::Interleaved;
      c.d_dtype = DType::fp32;
      c.seed = seed++;
      ASSERT_EQ(tile_of(c), gemm::GemmTile::k16x64);
      run_case(c);
    }
  }
}

// ---- row ownership -----------------------------------------------------------------------------

TEST(CudaGroupedGemm, EmptyExpertsAndOneExpertWithAllRows) {
  MODMOE_REQUIRE_GPU();
  Case c;
  c.name = "one expert owns every row";
  c.E = 8;
  c.N_b = 128;
  c.K = 64;
  c.rows = {0, 0, 0, 0, 0, 150, 0, 0};
  c.seed = 400;
  run_case(c);

  c.name = "every expert empty";
  c.rows.assign(8, 0);
  c.max_rows = 40;  // the grid is sized for rows that do not come
  c.seed = 401;
  run_case(c);

  c.name = "fp8 block, one expert";
  c.ab = DType::fp8_e4m3;
  c.scheme = QuantScheme::fp8_block;
  c.rows = {0, 0, 0, 0, 0, 0, 0, 77};
  c.max_rows = -1;
  c.gated = true;
  c.seed = 402;
  run_case(c);
}

TEST(CudaGroupedGemm, ExpertCounts1And256) {
  MODMOE_REQUIRE_GPU();
  Case c;
  c.name = "E=1";
  c.E = 1;
  c.N_b = 2 * 64;
  c.K = 320;
  c.rows = {300};
  c.gated = true;
  c.seed = 500;
  run_case(c);

  c.name = "E=256 decode";
  c.E = 256;
  c.N_b = 2 * 48;
  c.K = 128;
  c.rows = random_rows(501, c.E, 0, 3);
  c.layout = GatedLayout::UpGate;
  c.seed = 502;
  run_case(c);

  c.name = "E=256 fp8 mx";
  c.ab = DType::fp8_e4m3;
  c.scheme = QuantScheme::mxfp8;
  c.rows = random_rows(503, c.E, 0, 2);
  c.seed = 504;
  run_case(c);
}

TEST(CudaGroupedGemm, MaxRowsOnlySizesTheGrid) {
  MODMOE_REQUIRE_GPU();
  // A grid sized for one tile must still walk every tile (persistent loop).
  Case c;
  c.name = "max_rows = 1";
  c.E = 4;
  c.N_b = 256;
  c.K = 64;
  c.rows = {40, 3, 90, 17};
  c.max_rows = 1;
  c.seed = 550;
  run_case(c);
}

TEST(CudaGroupedGemm, ManyMTilesPerExpert) {
  MODMOE_REQUIRE_GPU();
  // Experts taller than one raster band (512 rows): the m-fastest walk wraps into a second,
  // partial band.
  Case c;
  c.name = "10 m-tiles of 64";
  c.E = 2;
  c.N_b = 192;
  c.K = 64;
  c.rows = {600, 77};
  c.seed = 560;
  ASSERT_EQ(tile_of(c), gemm::GemmTile::k64x128);
  run_case(c);

  c.name = "38 m-tiles of 16";
  c.E = 64;
  c.rows.assign(64, 0);
  c.rows[9] = 600;
  c.rows[10] = 5;
  c.gated = true;
  c.seed = 561;
  ASSERT_EQ(tile_of(c), gemm::GemmTile::k16x64);
  run_case(c);
}

TEST(CudaGroupedGemm, BatchedGarbageRowsDoNotLeak) {
  MODMOE_REQUIRE_GPU();
  Case c;
  c.name = "batched bf16 gated";
  c.batched = true;
  c.E = 4;
  c.batch_rows = 40;
  c.rows = {0, 40, 17, 5};  // rows past the counts hold NaN in A and must stay NaN in D
  c.N_b = 2 * 80;
  c.K = 192;
  c.gated = true;
  c.seed = 600;
  run_case(c);

  c.name = "batched fp8 block plain";
  c.ab = DType::fp8_e4m3;
  c.scheme = QuantScheme::fp8_block;
  c.gated = false;
  c.N_b = 136;
  c.K = 272;
  c.batch_rows = 100;
  c.rows = {99, 0, 64, 100};
  c.max_rows = 263;  // given: the total of the counts
  c.seed = 601;
  run_case(c);

  c.name = "batched fp8 mx decode";
  c.scheme = QuantScheme::mxfp8;
  c.batch_rows = 8;
  c.rows = {1, 0, 8, 3};
  c.max_rows = -1;
  c.seed = 602;
  ASSERT_EQ(tile_of(c), gemm::GemmTile::k16x64);
  run_case(c);
}

TEST(CudaGroupedGemm, GatherThroughRowIndex) {
  MODMOE_REQUIRE_GPU();
  uint32_t seed = 700;
  for (QuantScheme scheme :
       {QuantScheme::none, QuantScheme::fp8_token, QuantScheme::fp8_block, QuantScheme::mxfp8}) {
    for (bool decode : {false, true}) {
      Case c;
      c.name = "gather";
      c.ab = scheme == QuantScheme::none ? DType::bf16 : DType::fp8_e4m3;
      c.scheme = scheme;
      c.E = 5;
      c.N_b = 2 * 72;
      c.K = 384;
      c.rows = decode ? std::vector<int>{3, 1, 0, 2, 4} : std::vector<int>{40, 81, 0, 66, 7};
      c.gather = true;  // unowned A rows (and their scales) are NaN
      c.gated = true;
      c.layout = GatedLayout::Interleaved;
      c.lda_pad = 16;
      c.seed = seed++;
      run_case(c);
    }
  }
}

// ---- graph capture ---------------------------------------------------------------------------

TEST(CudaGroupedGemm, CapturedInAGraphAndReplayedWithNewInputs) {
  MODMOE_REQUIRE_GPU();
  Case c;
  c.name = "graph";
  c.ab = DType::fp8_e4m3;
  c.scheme = QuantScheme::fp8_block;
  c.E = 8;
  c.N_b = 2 * 64;
  c.K = 256;
  c.rows = {5, 0, 70, 2, 9, 33, 0, 1};
  c.gated = true;
  c.seed = 800;
  HostProblem h = make_problem(c);
  DeviceProblem dp = upload(c, h);

  cudaStream_t stream;
  MODMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  MODMOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  try {
    grouped_gemm(dp.args, stream);
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);  // leave no capture behind for the other tests
    cudaGetLastError();
    throw;
  }
  MODMOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  MODMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  for (uint32_t replay = 0; replay < 2; ++replay) {
    // New operands and routing in the same buffers (same sizes: same row total).
    Case next = c;
    next.seed = 801 + replay;
    next.rows = replay == 0 ? std::vector<int>{0, 40, 10, 20, 0, 30, 20, 0}
                            : std::vector<int>{120, 0, 0, 0, 0, 0, 0, 0};
    const HostProblem hn = make_problem(next);
    ASSERT_EQ(hn.a.size(), h.a.size());
    dp.a.upload(hn.a);
    dp.b.upload(hn.b);
    dp.a_scale.upload(hn.a_scale);
    dp.b_scale.upload(hn.b_scale);
    dp.m_indptr.upload(hn.m_indptr);
    dp.d.fill(0xff);
    MODMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    MODMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    check_output(next, hn, reference(next, hn), dp.d.download());
  }
  MODMOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  MODMOE_CUDA_CHECK(cudaGraphDestroy(graph));
  MODMOE_CUDA_CHECK(cudaStreamDestroy(stream));
}

// ---- argument checks -------------------------------------------------------------------------

TEST(CudaGroupedGemm, CanImplementExplainsWhatIsWrong) {
  MODMOE_REQUIRE_GPU();
  Case c;
  c.E = 2;
  c.N_b = 64;
  c.K = 64;
  c.rows = {3, 4};
  c.gated = true;
  HostProblem h = make_problem(c);
  DeviceProblem dp = upload(c, h);
  const GroupedGemmArgs good = dp.args;
  ASSERT_EQ(grouped_gemm_can_implement(good), "");

  struct Bad {
    std::string expect;
    std::function<void(GroupedGemmArgs&)> edit;
  };
  int32_t* some_ints = dp.m_indptr.as<int32_t>();
  const std::vector<Bad> cases = {
      {"grouped_gemm: ab_dtype must be bf16, fp16 or fp8_e4m3, got fp32",
       [](GroupedGemmArgs& a) { a.ab_dtype = DType::fp32; }},
      {"grouped_gemm: E must be in [1, 1024]", [](GroupedGemmArgs& a) { a.E = 0; }},
      {"grouped_gemm: N_b must be even and >= 2 in gated mode",
       [](GroupedGemmArgs& a) { a.N_b = 63; }},
      {"grouped_gemm: K must be a positive multiple of 8 for bf16 (A and B rows are copied in "
       "16-byte pieces), got K = 60",
       [](GroupedGemmArgs& a) {
         a.K = 60;
         a.lda = 64;
       }},
      {"grouped_gemm: K must be a positive multiple of 16 for fp8_e4m3",
       [](GroupedGemmArgs& a) {
         a.ab_dtype = DType::fp8_e4m3;
         a.scheme = QuantScheme::fp8_tensor;
         a.a_scale = a.b_scale = a.A;
         a.K = 56;
       }},
      {"grouped_gemm: lda must be >= K = 64 and a multiple of 8 for bf16",
       [](GroupedGemmArgs& a) { a.lda = 60; }},
      {"grouped_gemm: lda must be >= K = 64", [](GroupedGemmArgs& a) { a.lda = 68; }},
      {"grouped_gemm: A and B must be 16-byte aligned",
       [](GroupedGemmArgs& a) { a.A = static_cast<const char*>(a.A) + 2; }},
      {"grouped_gemm: exactly one of m_indptr (standard) and expert_num_tokens (batched) must "
       "be given, got both",
       [&](GroupedGemmArgs& a) {
         a.expert_num_tokens = some_ints;
         a.batch_rows = 4;
       }},
      {"got neither", [](GroupedGemmArgs& a) { a.m_indptr = nullptr; }},
      {"grouped_gemm: batch_rows must be >= 0",
       [&](GroupedGemmArgs& a) {
         a.m_indptr = nullptr;
         a.expert_num_tokens = some_ints;
         a.batch_rows = -1;
       }},
      {"grouped_gemm: max_rows must be in [0, 2^31), got -3",
       [](GroupedGemmArgs& a) { a.max_rows = -3; }},
      {"grouped_gemm: scheme must be none for bf16 operands, got fp8-block",
       [](GroupedGemmArgs& a) { a.scheme = QuantScheme::fp8_block; }},
      {"grouped_gemm: scheme must be fp8-tensor, fp8-token, fp8-block or mxfp8 for fp8_e4m3",
       [](GroupedGemmArgs& a) { a.ab_dtype = DType::fp8_e4m3; }},
      {"grouped_gemm: a_scale and b_scale must be given for fp8-block, got b_scale = null",
       [](GroupedGemmArgs& a) {
         a.ab_dtype = DType::fp8_e4m3;
         a.scheme = QuantScheme::fp8_block;
         a.a_scale = a.A;
       }},
      {"grouped_gemm: activation must be a gated form (silu, gelu, gelu_tanh, swigluoai) in "
       "gated mode, got silu_no_mul",
       [](GroupedGemmArgs& a) { a.activation = Activation::silu_no_mul; }},
      {"grouped_gemm: d_dtype must be bf16, fp16 or fp32, got int32",
       [](GroupedGemmArgs& a) { a.d_dtype = DType::int32; }},
      {"grouped_gemm: ldd must be >= N_out = 32 (N_b / 2, gated), got 31",
       [](GroupedGemmArgs& a) { a.ldd = 31; }},
      {"grouped_gemm: D must be aligned to its element size (4 bytes)",
       [](GroupedGemmArgs& a) {
         a.d_dtype = DType::fp32;
         a.D = static_cast<char*>(a.D) + 2;
       }},
      {"grouped_gemm: A, B and D must be device pointers",
       [](GroupedGemmArgs& a) { a.B = nullptr; }},
  };
  for (const Bad& bad : cases) {
    GroupedGemmArgs a = good;
    bad.edit(a);
    EXPECT_THAT(grouped_gemm_can_implement(a), HasSubstr(bad.expect));
    try {
      grouped_gemm(a, nullptr);
      ADD_FAILURE() << "grouped_gemm accepted arguments that should fail with: " << bad.expect;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(bad.expect));
    }
  }
}

// Rows that cannot exist launch nothing: D keeps its poison.
TEST(CudaGroupedGemm, NoRowsNoLaunch) {
  MODMOE_REQUIRE_GPU();
  Case c;
  c.E = 2;
  c.N_b = 64;
  c.K = 64;
  c.rows = {0, 0};
  c.max_rows = 0;
  HostProblem h = make_problem(c);
  DeviceProblem dp = upload(c, h);
  dp.d.fill(0xff);
  grouped_gemm(dp.args, nullptr);
  MODMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> d = dp.d.download();
  EXPECT_TRUE(std::all_of(d.begin(), d.end(), [](uint8_t v) { return v == 0xff; }));
}

TEST(CudaGroupedGemm, TileHeuristic) {
  MODMOE_REQUIRE_GPU();
  using gemm::choose_gemm_tile;
  using gemm::GemmTile;
  // Decode: a token's top-k rows land on distinct experts.
  EXPECT_EQ(choose_gemm_tile(1 * 8, 256, false, 0), GemmTile::k16x64);
  EXPECT_EQ(choose_gemm_tile(128 * 8, 128, false, 0), GemmTile::k16x64);  // 8 rows / expert
  EXPECT_EQ(choose_gemm_tile(16 * 2, 8, false, 0), GemmTile::k16x64);
  // Prefill.
  EXPECT_EQ(choose_gemm_tile(1024 * 8, 128, false, 0), GemmTile::k64x128);  // 64 rows / expert
  EXPECT_EQ(choose_gemm_tile(8192 * 2, 8, false, 0), GemmTile::k64x128);
  // Batched: no expert has more than batch_rows.
  EXPECT_EQ(choose_gemm_tile(0, 8, true, 16), GemmTile::k16x64);
  EXPECT_EQ(choose_gemm_tile(0, 8, true, 512), GemmTile::k64x128);
  EXPECT_EQ(choose_gemm_tile(8 * 512, 8, true, 24), GemmTile::k16x64);
}

}  // namespace
}  // namespace modmoe::cuda
