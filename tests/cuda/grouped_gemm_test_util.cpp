// The harness of the portable grouped GEMM tests: see grouped_gemm_test_util.h.
#include "cuda/grouped_gemm_test_util.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/grouped_gemm.h"
#include "cuda/grouped_gemm_heuristic.cuh"
#include "modmoe/activation.h"
#include "modmoe/error.h"
#include "modmoe/numeric.h"
#include "modmoe/quant.h"

namespace modmoe::cuda::grouped_gemm_test {

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

namespace {

uint16_t float_bits16(DType d, float v) {
  return d == DType::bf16 ? float_to_bf16(v) : float_to_fp16(v);
}

double code_value(DType d, const uint8_t* base, int64_t i) {
  if (d == DType::fp8_e4m3) return e4m3_to_float(base[i]);
  uint16_t bits;
  std::memcpy(&bits, base + 2 * i, 2);
  return d == DType::bf16 ? bf16_to_float(bits) : fp16_to_float(bits);
}

}  // namespace

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

namespace {

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

}  // namespace

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

namespace {

double output_value(DType d, const std::vector<uint8_t>& bytes, int64_t i) {
  if (d == DType::fp32) {
    float v;
    std::memcpy(&v, &bytes[4 * i], 4);
    return v;
  }
  return code_value(d, bytes.data(), i);
}

}  // namespace

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

}  // namespace modmoe::cuda::grouped_gemm_test
