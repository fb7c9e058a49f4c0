// CPU fp8 quantization (quant.h, src/cpu/quant.cpp, src/cpu/quant_rows.h).
//
// Expected scales and codes are recomputed here from the scheme definitions (group amax,
// amax / 448, the MX power of two) with numeric.h's reference encoder, element by element.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/quant_rows.h"
#include "modmoe/allocator.h"
#include "modmoe/error.h"
#include "modmoe/numeric.h"
#include "modmoe/quant.h"
#include "error_message.h"
#include "oracle/problem.h"

namespace modmoe {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kSeed = 1234567;
constexpr QuantScheme kSchemes[] = {QuantScheme::fp8_tensor, QuantScheme::fp8_token,
                                    QuantScheme::fp8_block, QuantScheme::mxfp8};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- test data ---------------------------------------------------------------------------

// Random values in `dtype`: rows of very different magnitudes (1e-2 .. 3e2), normal
// elements, and a few 8x outliers so that group maxima differ from row maxima. Returns the
// tensor and its values as stored (after rounding to dtype).
struct HostData {
  OwnedTensor tensor;
  std::vector<float> values;
};

HostData random_tensor(DType dtype, const Shape& shape, uint32_t seed) {
  HostData d{host_tensor(dtype, shape), {}};
  const int64_t numel = shape_numel(shape);
  const int64_t row_length = shape.empty() ? 1 : shape.back();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_magnitude(-2.0f, 2.5f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  float magnitude = 1.0f;
  d.values.resize(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) {
    if (i % row_length == 0) magnitude = std::pow(10.0f, log_magnitude(rng));
    float v = normal(rng) * magnitude;
    if (unit(rng) < 0.01f) v *= 8.0f;
    store_float(d.tensor.tensor().data(), dtype, i, v);
    d.values[i] = load_float(d.tensor.tensor().data(), dtype, i);
  }
  return d;
}

// NaN poison (NaN codes for fp8 and e8m0) so that unwritten elements show, and the bytes of a
// tensor: the oracle's helpers.
using testing::bytes_of;
using testing::poison;

std::string case_name(QuantScheme scheme, DType dtype, const Shape& shape) {
  return std::string(quant_scheme_name(scheme)) + " " + dtype_name(dtype) + " " + shape_str(shape);
}

// ---- the definition of each scheme, written out for the checks ---------------------------

// A quantized tensor seen as (E, N, K): weights as they are, activations (M, K) as E = 1,
// N = M. Gives the index of the scale that covers element (e, n, k).
struct Layout {
  bool weights;
  QuantScheme scheme;
  int64_t E, N, K;

  int64_t scale_index(int64_t e, int64_t n, int64_t k) const {
    switch (scheme) {
      case QuantScheme::fp8_tensor:
        return weights ? e : 0;
      case QuantScheme::fp8_token:
        return e * N + n;
      case QuantScheme::fp8_block: {
        const int64_t col_blocks = ceil_div(K, kBlockSize);
        if (!weights) return n * col_blocks + k / kBlockSize;
        return (e * ceil_div(N, kBlockSize) + n / kBlockSize) * col_blocks + k / kBlockSize;
      }
      default:
        return (e * N + n) * ceil_div(K, kMxBlockSize) + k / kMxBlockSize;
    }
  }
  int64_t num_scales() const {
    return shape_numel(weights ? weight_scale_shape(scheme, E, N, K)
                               : act_scale_shape(scheme, N, K));
  }
};

// floor(log2(a)) for a > 0, without the bit tricks of the code under test.
int floor_log2(double a) {
  int exponent;
  std::frexp(a, &exponent);  // a = f * 2^exponent, f in [0.5, 1)
  return exponent - 1;
}

// Half of the e4m3 spacing around v >= 0 (v <= 448): 2^-10 in the subnormal range, else
// 2^(floor(log2 v) - 4) (3 mantissa bits).
double e4m3_half_ulp(double v) {
  if (v < std::ldexp(1.0, -6)) return std::ldexp(1.0, -10);
  return std::ldexp(1.0, floor_log2(v) - 4);
}

// Checks q and scale against the definition for input values x (row-major (E, N, K)).
// For `static_scale` (fp8_tensor), the expected scale is the given one.
void check_quantized(const Layout& layout, const std::vector<float>& x, const uint8_t* q,
                     const void* scale_data, const float* static_scale = nullptr) {
  const bool mx = layout.scheme == QuantScheme::mxfp8;
  const int64_t num_scales = layout.num_scales();
  std::vector<double> amax(static_cast<size_t>(num_scales), 0.0);
  for (int64_t e = 0, i = 0; e < layout.E; ++e)
    for (int64_t n = 0; n < layout.N; ++n)
      for (int64_t k = 0; k < layout.K; ++k, ++i) {
        double& a = amax[layout.scale_index(e, n, k)];
        a = std::max(a, std::fabs(static_cast<double>(x[i])));
      }

  // Scales: amax / 448 in fp32, or the MX power of two.
  std::vector<double> scale(static_cast<size_t>(num_scales));
  for (int64_t s = 0; s < num_scales; ++s) {
    ASSERT_GT(amax[s], 0.0) << "test data has an all-zero group " << s;
    if (mx) {
      const uint8_t code = static_cast<const uint8_t*>(scale_data)[s];
      const int expected_exponent = std::max(floor_log2(amax[s]) - 8, -127);
      ASSERT_EQ(code, expected_exponent + 127) << "MX scale " << s << ", amax " << amax[s];
      scale[s] = std::ldexp(1.0, code - 127);  // a power of two by construction of e8m0
      if (expected_exponent > -127) {          // the group's amax lands in [256, 512) scale units
        EXPECT_GE(amax[s] / scale[s], 256.0) << s;
        EXPECT_LT(amax[s] / scale[s], 512.0) << s;
      }
    } else {
      const float got = static_cast<const float*>(scale_data)[s];
      const float expected = static_scale ? *static_scale : static_cast<float>(amax[s]) / kE4M3Max;
      ASSERT_EQ(got, expected) << "scale " << s << ", amax " << amax[s];
      scale[s] = got;
    }
  }

  // Elements: the exact code, the error bound, and the group maximum at +-448.
  int64_t saturated = 0;
  std::vector<bool> amax_seen_at_448(static_cast<size_t>(num_scales), false);
  for (int64_t e = 0, i = 0; e < layout.E; ++e)
    for (int64_t n = 0; n < layout.N; ++n)
      for (int64_t k = 0; k < layout.K; ++k, ++i) {
        const int64_t s = layout.scale_index(e, n, k);
        const float sf = static_cast<float>(scale[s]);
        // The element rule of formats.md: x times the correctly rounded reciprocal (the
        // test data's scales are normal floats; subnormal ones: SubnormalAndZeroScales).
        ASSERT_GE(sf, std::numeric_limits<float>::min());
        ASSERT_EQ(q[i], float_to_e4m3(x[i] * (1.0f / sf)))
            << "element (" << e << ", " << n << ", " << k << ") x = " << x[i] << " scale " << sf;
        ASSERT_NE(q[i] & 0x7f, 0x7f) << "NaN code at " << i;  // so |q| <= 448
        const double dequant = static_cast<double>(e4m3_to_float(q[i])) * scale[s];
        const double error = std::fabs(dequant - x[i]);
        const double v = std::fabs(static_cast<double>(x[i])) / scale[s];  // in scale units
        // fp32 rounding of x / scale and of the dequant multiply: a few ulps of |x|.
        const double slop = std::ldexp(std::fabs(static_cast<double>(x[i])), -21);
        if (v > kE4M3Max) {
          ++saturated;
          // Only MX (amax up to 512 scale units) and small static scales saturate; the error
          // is then the distance to 448 * scale.
          if (!mx && !static_scale) {
            ASSERT_LE(v, kE4M3Max * (1 + 1e-6)) << i;
          }
          ASSERT_NEAR(error, (v - kE4M3Max) * scale[s], slop) << i;
          if (mx) {
            ASSERT_LT(error, 64 * scale[s] + slop) << i;
          }
        } else {
          // Round to nearest: within half the e4m3 spacing at v.
          ASSERT_LE(error, e4m3_half_ulp(v) * scale[s] + slop)
              << "element " << i << " x = " << x[i] << " dequant " << dequant;
          // Hence within half the top-binade spacing (32 / 2 = 16 scale units): for amax / 448
          // scales that is amax_group / 28.
          ASSERT_LE(error, 16 * scale[s] + slop) << i;
        }
        if (std::fabs(static_cast<double>(x[i])) == amax[s] && (q[i] & 0x7f) == 0x7e)
          amax_seen_at_448[s] = true;
      }
  if (!mx && !static_scale) {
    for (int64_t s = 0; s < num_scales; ++s) {
      EXPECT_TRUE(amax_seen_at_448[s]) << "the amax of group " << s << " must map to +-448";
    }
  }
  if (mx && num_scales >= 32) {
    EXPECT_GT(saturated, 0) << "no MX group exercised saturation";
  }
}

// out (any float dtype) == e4m3(q) * scale, rounded to out's dtype.
void check_dequantized(const Layout& layout, const uint8_t* q, const void* scale_data,
                       const Tensor& out) {
  for (int64_t e = 0, i = 0; e < layout.E; ++e)
    for (int64_t n = 0; n < layout.N; ++n)
      for (int64_t k = 0; k < layout.K; ++k, ++i) {
        const int64_t s = layout.scale_index(e, n, k);
        const float scale = layout.scheme == QuantScheme::mxfp8
                                ? e8m0_to_float(static_cast<const uint8_t*>(scale_data)[s])
                                : static_cast<const float*>(scale_data)[s];
        float expected = e4m3_to_float(q[i]) * scale;
        float stored = NAN;
        store_float(&stored, DType::fp32, 0, expected);
        if (out.dtype() != DType::fp32) {
          uint16_t half = 0;
          store_float(&half, out.dtype(), 0, expected);
          stored = load_float(&half, out.dtype(), 0);
        }
        ASSERT_EQ(load_float(out.data(), out.dtype(), i), stored) << "element " << i;
      }
}

// ---- row helpers -------------------------------------------------------------------------

TEST(QuantRows, E4M3TablesAndEncoderMatchNumeric) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const float expected = e4m3_to_float(code);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(cpu::e4m3_value(code))) << c;
    } else {
      EXPECT_EQ(float_bits(cpu::e4m3_value(code)), float_bits(expected)) << c;
    }
    const float e8m0 = e8m0_to_float(code);
    if (std::isnan(e8m0)) {
      EXPECT_TRUE(std::isnan(cpu::e8m0_value(code)));
    } else {
      EXPECT_EQ(cpu::e8m0_value(code), e8m0) << c;
    }
  }
  // The fast encoder against numeric.h: around every e4m3 value and midpoint, a dense
  // sweep of the magnitudes that matter, and random bit patterns (inf, NaN, huge, tiny).
  auto expect_same = [](float f) {
    ASSERT_EQ(cpu::e4m3_encode(f), float_to_e4m3(f))
        << f << " (bits 0x" << std::hex << float_bits(f) << ")";
  };
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = e4m3_to_float(static_cast<uint8_t>(c));
    const float hi = e4m3_to_float(static_cast<uint8_t>(c + 1));
    for (float center : {lo, (lo + hi) / 2}) {
      float below = center, above = center;
      for (int step = 0; step < 3; ++step) {
        for (float sign : {1.0f, -1.0f}) {
          expect_same(sign * below);
          expect_same(sign * above);
        }
        below = std::nextafter(below, 0.0f);
        above = std::nextafter(above, INFINITY);
      }
    }
  }
  for (uint32_t bits = float_bits(std::ldexp(1.0f, -12)); bits < float_bits(600.0f); bits += 101)
    expect_same(bits_float(bits));
  std::mt19937 rng(kSeed);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    const float f = bits_float(any_bits(rng));
    if (std::isnan(f)) {
      EXPECT_EQ(cpu::e4m3_encode(f) & 0x7f, 0x7f);
    } else {
      expect_same(f);
    }
  }
  for (float f : {0.0f, -0.0f, INFINITY, -INFINITY, 448.0f, 464.0f, 1e-45f}) expect_same(f);
}

// The element rule (formats.md): x times the correctly rounded reciprocal of the scale, for
// normal scales literally x * (1 / scale); the codes are those of the division but where x /
// scale lies within ~1.5 fp32 ulp of a midpoint between two e4m3 values, and e4m3 * scale
// re-quantizes to its code.
TEST(QuantRows, QuantizeMultipliesByTheReciprocal) {
  std::mt19937 rng(kSeed + 7);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int64_t differ_from_division = 0, checked = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const float scale = std::ldexp(mantissa(rng), trial % 200 - 120);  // 2^-120 .. 2^80
    const cpu::Fp8Reciprocal r = cpu::fp8_reciprocal(scale);
    ASSERT_EQ(r.pre, 1.0f);
    ASSERT_EQ(r.inverse, 1.0f / scale);
    for (int i = 0; i < 64; ++i) {
      const float x = normal(rng) * 100.0f * scale;
      const uint8_t code = cpu::e4m3_quantize(x, scale, r);
      ASSERT_EQ(code, float_to_e4m3(x * (1.0f / scale))) << x << " / " << scale;
      const uint8_t divided = float_to_e4m3(x / scale);
      if (code != divided) {  // then x / scale is within a few fp32 ulp of their midpoint
        ++differ_from_division;
        const double midpoint =
            (std::fabs(e4m3_to_float(code)) + std::fabs(e4m3_to_float(divided))) / 2;
        const double quotient = std::fabs(static_cast<double>(x) / scale);
        EXPECT_LE(std::fabs(quotient - midpoint), quotient * 0x1p-21) << x << " / " << scale;
      }
      ++checked;
    }
    for (int c = 0; c < 0x7f; ++c) {  // every finite code of both signs re-quantizes to itself
      for (int sign : {0, 0x80}) {
        const uint8_t want = static_cast<uint8_t>(c | sign);
        ASSERT_EQ(cpu::e4m3_quantize(e4m3_to_float(want) * scale, scale, r), want)
            << "code 0x" << std::hex << int{want} << " scale " << scale;
      }
    }
  }
  // Near-midpoint quotients are rare: a handful at most in 128000 normal samples.
  EXPECT_LE(differ_from_division, 8) << "of " << checked;
}

// A subnormal scale (an amax below ~5e-36) has a reciprocal past float's range: the quantizer
// multiplies by RN(2^-64 / scale) after scaling x by 2^64 (both exact moves), so the codes are
// within rounding of x / scale and e4m3 * scale still re-quantizes. A zero (static) scale
// saturates non-zero x and makes 0 a NaN code, as the division did.
TEST(QuantRows, SubnormalAndZeroScales) {
  for (float scale : {std::numeric_limits<float>::denorm_min(), 7e-42f, 1e-39f,
                      std::numeric_limits<float>::min() / 2}) {
    SCOPED_TRACE(scale);
    const cpu::Fp8Reciprocal r = cpu::fp8_reciprocal(scale);
    ASSERT_LT(scale, std::numeric_limits<float>::min());  // the case under test: subnormal
    ASSERT_EQ(r.pre, 0x1p64f);
    ASSERT_TRUE(std::isfinite(r.inverse));
    for (int c = 0; c < 0x7f; ++c) {
      const float x = e4m3_to_float(static_cast<uint8_t>(c)) * scale;  // rounded to a subnormal
      const uint8_t code = cpu::e4m3_quantize(x, scale, r);
      // Within half an e4m3 spacing of x / scale, computed in double.
      const double quotient = static_cast<double>(x) / scale;
      const double got = e4m3_to_float(code);
      const double spacing =
          quotient < 0.015625 ? 0x1p-9 : std::ldexp(1.0, std::ilogb(quotient) - 3);
      EXPECT_LE(std::fabs(got - std::min(quotient, 448.0)), spacing / 2 + quotient * 0x1p-21)
          << "x = " << x << " code 0x" << std::hex << int{code};
      if (x == e4m3_to_float(static_cast<uint8_t>(c)) * static_cast<double>(scale)) {
        EXPECT_EQ(code, c) << "x = " << x << " is exactly code " << c << " times the scale";
      }
    }
  }
  const cpu::Fp8Reciprocal zero = cpu::fp8_reciprocal(0.0f);
  EXPECT_EQ(cpu::e4m3_quantize(3.0f, 0.0f, zero), 0x7e);  // +inf quotient: saturates
  EXPECT_EQ(cpu::e4m3_quantize(-3.0f, 0.0f, zero), 0xfe);
  EXPECT_EQ(cpu::e4m3_quantize(0.0f, 0.0f, zero), 0x7f);  // 0 / 0: NaN, the scale's sign
  EXPECT_EQ(cpu::e4m3_quantize(-NAN, 1.0f, cpu::fp8_reciprocal(1.0f)), 0xff);  // x's sign
  EXPECT_EQ(cpu::e4m3_quantize(1.0f, NAN, cpu::fp8_reciprocal(NAN)), 0x7f);    // the scale's
}

TEST(QuantRows, ScaleForAmax) {
  EXPECT_EQ(cpu::fp8_scale_for_amax(448.0f), 1.0f);
  EXPECT_EQ(cpu::fp8_scale_for_amax(0.0f), 1.0f);
  EXPECT_EQ(cpu::fp8_scale_for_amax(3.5f), 3.5f / 448.0f);
  EXPECT_TRUE(std::isnan(cpu::fp8_scale_for_amax(NAN)));
  EXPECT_TRUE(std::isnan(cpu::fp8_scale_for_amax(INFINITY)));
  EXPECT_GT(cpu::fp8_scale_for_amax(1e-45f), 0.0f);  // never a zero scale
}

TEST(QuantRows, MxScaleCodeForAmax) {
  EXPECT_EQ(cpu::mx_scale_code_for_amax(0.0f), 0);
  EXPECT_EQ(cpu::mx_scale_code_for_amax(1.0f), 127 - 8);
  EXPECT_EQ(cpu::mx_scale_code_for_amax(256.0f), 127);
  EXPECT_EQ(cpu::mx_scale_code_for_amax(511.99f), 127);
  EXPECT_EQ(cpu::mx_scale_code_for_amax(512.0f), 128);
  EXPECT_EQ(cpu::mx_scale_code_for_amax(std::ldexp(1.0f, -120)), 0);  // clamped to 2^-127
  EXPECT_EQ(cpu::mx_scale_code_for_amax(1e-45f), 0);
  EXPECT_EQ(cpu::mx_scale_code_for_amax(std::numeric_limits<float>::max()), 127 + 127 - 8);
  EXPECT_EQ(cpu::mx_scale_code_for_amax(INFINITY), 0xff);
  EXPECT_EQ(cpu::mx_scale_code_for_amax(NAN), 0xff);
  std::mt19937 rng(kSeed + 1);
  std::uniform_real_distribution<float> log2_amax(-110.0f, 120.0f);
  for (int i = 0; i < 10000; ++i) {
    const float amax = std::exp2(log2_amax(rng));
    ASSERT_EQ(cpu::mx_scale_code_for_amax(amax), std::max(floor_log2(amax) - 8, -127) + 127)
        << amax;
  }
}

TEST(QuantRows, AmaxPropagatesNaN) {
  std::vector<float> row = {1.0f, -7.5f, 3.0f, -0.0f};
  EXPECT_EQ(cpu::amax_of(row.data(), 4), 7.5f);
  EXPECT_EQ(cpu::amax_of(row.data(), 0), 0.0f);
  row[2] = -INFINITY;
  EXPECT_EQ(cpu::amax_of(row.data(), 4), INFINITY);
  row[0] = NAN;
  EXPECT_TRUE(std::isnan(cpu::amax_of(row.data(), 4)));
  EXPECT_TRUE(std::isnan(cpu::amax_combine(NAN, 3.0f)));
  EXPECT_TRUE(std::isnan(cpu::amax_combine(3.0f, NAN)));
  // A NaN input yields a NaN scale, and every code of the row becomes NaN.
  std::vector<uint8_t> q(4, 0);
  float scale = 0.0f;
  cpu::quantize_row(row.data(), 4, QuantScheme::fp8_token, nullptr, q.data(), &scale);
  EXPECT_TRUE(std::isnan(scale));
  for (uint8_t c : q) EXPECT_EQ(c & 0x7f, 0x7f);
}

// quantize_row / dequantize_row are the building blocks of the public functions: one row of
// quantize_activations is exactly quantize_row.
TEST(QuantRows, RowMatchesPublicFunction) {
  for (QuantScheme scheme : kSchemes) {
    for (int64_t K : {1, 33, 130, 200}) {
      SCOPED_TRACE(case_name(scheme, DType::fp32, {1, K}));
      HostData x = random_tensor(DType::fp32, {1, K}, kSeed + static_cast<uint32_t>(K));
      OwnedTensor q = host_tensor(DType::fp8_e4m3, {1, K});
      OwnedTensor scale = host_tensor(scale_dtype(scheme), act_scale_shape(scheme, 1, K));
      poison(q);
      poison(scale);
      quantize_activations(Context::cpu(), x.tensor, scheme, false, q, scale);

      std::vector<uint8_t> row_q(K, 0xff), row_scale(scale.tensor().nbytes(), 0xff);
      const float tensor_scale = scheme == QuantScheme::fp8_tensor
                                     ? cpu::fp8_scale_for_amax(cpu::amax_of(x.values.data(), K))
                                     : NAN;
      cpu::quantize_row(x.values.data(), K, scheme, &tensor_scale, row_q.data(), row_scale.data());
      if (scheme == QuantScheme::fp8_tensor) std::memcpy(row_scale.data(), &tensor_scale, 4);
      EXPECT_EQ(row_q, bytes_of(q));
      EXPECT_EQ(row_scale, bytes_of(scale));

      std::vector<float> row_out(K, NAN);
      cpu::dequantize_row(row_q.data(), K, scheme, row_scale.data(), row_out.data());
      OwnedTensor out = host_tensor(DType::fp32, {1, K});
      poison(out);
      dequantize_activations(Context::cpu(), q, scale, scheme, out);
      EXPECT_EQ(0, std::memcmp(row_out.data(), out.data_ptr<float>(), K * sizeof(float)));
    }
  }
}

// ---- activations: every scheme x input dtype x K ---------------------------------------

using QuantCase = std::tuple<QuantScheme, DType, int64_t>;

std::string quant_case_name(const ::testing::TestParamInfo<QuantCase>& info) {
  std::string name = std::string(quant_scheme_name(std::get<0>(info.param))) + "_" +
                     dtype_name(std::get<1>(info.param)) + "_K" +
                     std::to_string(std::get<2>(info.param));
  for (char& c : name)
    if (c == '-') c = '_';
  return name;
}

class ActivationQuant : public ::testing::TestWithParam<QuantCase> {};

TEST_P(ActivationQuant, QuantizeDequantizeAgainstDefinition) {
  const auto [scheme, dtype, K] = GetParam();
  const int64_t M = 5;
  const uint32_t seed = kSeed + static_cast<uint32_t>(K) * 7 + static_cast<uint32_t>(scheme);
  SCOPED_TRACE(case_name(scheme, dtype, {M, K}) + ", seed " + std::to_string(seed));
  HostData x = random_tensor(dtype, {M, K}, seed);
  OwnedTensor q = host_tensor(DType::fp8_e4m3, {M, K});
  OwnedTensor scale = host_tensor(scale_dtype(scheme), act_scale_shape(scheme, M, K));
  poison(q);
  poison(scale);
  quantize_activations(Context::cpu(), x.tensor, scheme, false, q, scale);
  const Layout layout{false, scheme, 1, M, K};
  check_quantized(layout, x.values, q.data_ptr<uint8_t>(), scale.tensor().data());

  OwnedTensor out = host_tensor(dtype, {M, K});
  poison(out);
  dequantize_activations(Context::cpu(), q, scale, scheme, out);
  check_dequantized(layout, q.data_ptr<uint8_t>(), scale.tensor().data(), out);
}

// quantize(dequantize(quantize(x))) reproduces the codes and the scales bit for bit.
TEST_P(ActivationQuant, RequantizationIsIdempotent) {
  const auto [scheme, dtype, K] = GetParam();
  const int64_t M = 5;
  const uint32_t seed = kSeed + 99 + static_cast<uint32_t>(K) + static_cast<uint32_t>(scheme);
  SCOPED_TRACE(case_name(scheme, dtype, {M, K}) + ", seed " + std::to_string(seed));
  HostData x = random_tensor(dtype, {M, K}, seed);
  OwnedTensor q1 = host_tensor(DType::fp8_e4m3, {M, K}), q2 = host_tensor(DType::fp8_e4m3, {M, K});
  const Shape scale_shape = act_scale_shape(scheme, M, K);
  OwnedTensor s1 = host_tensor(scale_dtype(scheme), scale_shape);
  OwnedTensor s2 = host_tensor(scale_dtype(scheme), scale_shape);
  OwnedTensor y = host_tensor(DType::fp32, {M, K});
  for (const Tensor& t : {q1.tensor(), q2.tensor(), s1.tensor(), s2.tensor(), y.tensor()})
    poison(t);
  quantize_activations(Context::cpu(), x.tensor, scheme, false, q1, s1);
  dequantize_activations(Context::cpu(), q1, s1, scheme, y);
  quantize_activations(Context::cpu(), y, scheme, false, q2, s2);
  EXPECT_EQ(bytes_of(q1), bytes_of(q2));
  EXPECT_EQ(bytes_of(s1), bytes_of(s2));
}

INSTANTIATE_TEST_SUITE_P(
    AllSchemes, ActivationQuant,
    ::testing::Combine(::testing::ValuesIn(kSchemes),
                       ::testing::Values(DType::bf16, DType::fp16, DType::fp32),
                       ::testing::Values<int64_t>(200, 2880)),  // both end in a partial 128-group
    quant_case_name);

// ---- weights: every scheme x input dtype x (N, K) ---------------------------------------

class WeightQuant : public ::testing::TestWithParam<QuantCase> {};

TEST_P(WeightQuant, QuantizeDequantizeAgainstDefinition) {
  const auto [scheme, dtype, K] = GetParam();
  // N not a multiple of 128: the last 128x128 block of each expert is partial in N too.
  const int64_t E = 2, N = K > 1000 ? 130 : 200;
  const uint32_t seed = kSeed + 7 + static_cast<uint32_t>(K) * 3 + static_cast<uint32_t>(scheme);
  SCOPED_TRACE(case_name(scheme, dtype, {E, N, K}) + ", seed " + std::to_string(seed));
  HostData w = random_tensor(dtype, {E, N, K}, seed);
  OwnedTensor q = host_tensor(DType::fp8_e4m3, {E, N, K});
  OwnedTensor scale = host_tensor(scale_dtype(scheme), weight_scale_shape(scheme, E, N, K));
  poison(q);
  poison(scale);
  quantize_weights(Context::cpu(), w.tensor, scheme, q, scale);
  const Layout layout{true, scheme, E, N, K};
  check_quantized(layout, w.values, q.data_ptr<uint8_t>(), scale.tensor().data());

  OwnedTensor out = host_tensor(dtype, {E, N, K});
  poison(out);
  dequantize_weights(Context::cpu(), q, scale, scheme, out);
  check_dequantized(layout, q.data_ptr<uint8_t>(), scale.tensor().data(), out);
}

TEST_P(WeightQuant, RequantizationIsIdempotent) {
  const auto [scheme, dtype, K] = GetParam();
  const int64_t E = 2, N = 130;
  const uint32_t seed = kSeed + 5 + static_cast<uint32_t>(K) + static_cast<uint32_t>(scheme);
  SCOPED_TRACE(case_name(scheme, dtype, {E, N, K}) + ", seed " + std::to_string(seed));
  HostData w = random_tensor(dtype, {E, N, K}, seed);
  const Shape scale_shape = weight_scale_shape(scheme, E, N, K);
  OwnedTensor q1 = host_tensor(DType::fp8_e4m3, {E, N, K});
  OwnedTensor q2 = host_tensor(DType::fp8_e4m3, {E, N, K});
  OwnedTensor s1 = host_tensor(scale_dtype(scheme), scale_shape);
  OwnedTensor s2 = host_tensor(scale_dtype(scheme), scale_shape);
  OwnedTensor y = host_tensor(DType::fp32, {E, N, K});
  for (const Tensor& t : {q1.tensor(), q2.tensor(), s1.tensor(), s2.tensor(), y.tensor()})
    poison(t);
  quantize_weights(Context::cpu(), w.tensor, scheme, q1, s1);
  dequantize_weights(Context::cpu(), q1, s1, scheme, y);
  quantize_weights(Context::cpu(), y, scheme, q2, s2);
  EXPECT_EQ(bytes_of(q1), bytes_of(q2));
  EXPECT_EQ(bytes_of(s1), bytes_of(s2));
}

INSTANTIATE_TEST_SUITE_P(AllSchemes, WeightQuant,
                         ::testing::Combine(::testing::ValuesIn(kSchemes),
                                            ::testing::Values(DType::bf16, DType::fp16,
                                                              DType::fp32),
                                            ::testing::Values<int64_t>(200, 2880)),
                         quant_case_name);

// ---- static per-tensor scale, zero-size tensors ------------------------------------------

TEST(QuantStatic, ScaleIsReadNotWritten) {
  const int64_t M = 6, K = 200;
  for (DType dtype : {DType::bf16, DType::fp32}) {
    SCOPED_TRACE(dtype_name(dtype));
    HostData x = random_tensor(dtype, {M, K}, kSeed + 11);
    // A calibrated scale smaller than amax / 448, so that the largest values saturate.
    float amax = 0.0f;
    for (float v : x.values) amax = std::max(amax, std::fabs(v));
    const float static_scale = amax / 600.0f;
    OwnedTensor q = host_tensor(DType::fp8_e4m3, {M, K});
    OwnedTensor scale = host_tensor(DType::fp32, {1});
    poison(q);
    *scale.data_ptr<float>() = static_scale;
    const std::vector<uint8_t> scale_before = bytes_of(scale);
    quantize_activations(Context::cpu(), x.tensor, QuantScheme::fp8_tensor, true, q, scale);
    EXPECT_EQ(bytes_of(scale), scale_before);
    check_quantized({false, QuantScheme::fp8_tensor, 1, M, K}, x.values, q.data_ptr<uint8_t>(),
                    scale.tensor().data(), &static_scale);
    int saturated = 0;
    for (int64_t i = 0; i < M * K; ++i) saturated += (q.data_ptr<uint8_t>()[i] & 0x7f) == 0x7e;
    EXPECT_GT(saturated, 0);
  }
}

TEST(QuantZeroSize, ActivationsWithNoRows) {
  for (QuantScheme scheme : kSchemes) {
    SCOPED_TRACE(quant_scheme_name(scheme));
    const int64_t K = 256;
    OwnedTensor x = host_tensor(DType::bf16, {0, K});
    OwnedTensor q = host_tensor(DType::fp8_e4m3, {0, K});
    OwnedTensor scale = host_tensor(scale_dtype(scheme), act_scale_shape(scheme, 0, K));
    OwnedTensor out = host_tensor(DType::bf16, {0, K});
    poison(scale);
    EXPECT_NO_THROW(quantize_activations(Context::cpu(), x, scheme, false, q, scale));
    EXPECT_NO_THROW(dequantize_activations(Context::cpu(), q, scale, scheme, out));
    // The per-tensor scale of an empty tensor is defined: 1 (amax 0).
    if (scheme == QuantScheme::fp8_tensor) {
      EXPECT_EQ(*scale.data_ptr<float>(), 1.0f);
      *scale.data_ptr<float>() = 0.5f;
      EXPECT_NO_THROW(quantize_activations(Context::cpu(), x, scheme, true, q, scale));
      EXPECT_EQ(*scale.data_ptr<float>(), 0.5f);
    }
  }
}

TEST(QuantZeroSize, WeightsWithNoExpertsOrRows) {
  for (QuantScheme scheme : kSchemes) {
    for (const Shape& shape : {Shape{0, 256, 256}, Shape{2, 0, 256}}) {
      SCOPED_TRACE(case_name(scheme, DType::fp32, shape));
      OwnedTensor w = host_tensor(DType::fp32, shape);
      OwnedTensor q = host_tensor(DType::fp8_e4m3, shape);
      OwnedTensor scale = host_tensor(scale_dtype(scheme),
                                      weight_scale_shape(scheme, shape[0], shape[1], shape[2]));
      poison(scale);
      EXPECT_NO_THROW(quantize_weights(Context::cpu(), w, scheme, q, scale));
      EXPECT_NO_THROW(dequantize_weights(Context::cpu(), q, scale, scheme, w));
      if (scheme == QuantScheme::fp8_tensor) {  // experts with no rows still get a scale
        for (int64_t e = 0; e < shape[0]; ++e) {
          EXPECT_EQ(scale.data_ptr<float>()[e], 1.0f);
        }
      }
    }
  }
}

// ---- bad inputs --------------------------------------------------------------------------

using testing::error_of;

class QuantErrors : public ::testing::Test {
 protected:
  static constexpr int64_t M = 4, K = 256, E = 2, N = 200;
  Context ctx = Context::cpu();
  OwnedTensor x = host_tensor(DType::bf16, {M, K});
  OwnedTensor q = host_tensor(DType::fp8_e4m3, {M, K});
  OwnedTensor token_scale = host_tensor(DType::fp32, {M, 1});
  OwnedTensor block_scale = host_tensor(DType::fp32, {M, 2});
  OwnedTensor tensor_scale = host_tensor(DType::fp32, {1});
  OwnedTensor w = host_tensor(DType::bf16, {E, N, K});
  OwnedTensor wq = host_tensor(DType::fp8_e4m3, {E, N, K});
  OwnedTensor w_block_scale = host_tensor(DType::fp32, {E, 2, 2});
};

TEST_F(QuantErrors, SchemeNone) {
  EXPECT_THAT(
      error_of([&] { quantize_activations(ctx, x, QuantScheme::none, false, q, token_scale); }),
      HasSubstr("quantize_activations: scheme must be one of fp8-tensor, fp8-token, "
                "fp8-block, mxfp8, got none"));
  EXPECT_THAT(error_of([&] { quantize_weights(ctx, w, QuantScheme::none, wq, w_block_scale); }),
              HasSubstr("quantize_weights: scheme must be one of"));
}

TEST_F(QuantErrors, StaticScaleOnlyForPerTensor) {
  EXPECT_THAT(
      error_of([&] { quantize_activations(ctx, x, QuantScheme::fp8_block, true, q, block_scale); }),
      HasSubstr("quantize_activations: static_scale is only supported with fp8-tensor, got "
                "fp8-block"));
}

TEST_F(QuantErrors, StaticScaleMustBePositiveAndFinite) {
  for (float bad : {0.0f, -1.0f, NAN, INFINITY}) {
    *tensor_scale.data_ptr<float>() = bad;
    EXPECT_THAT(error_of([&] {
                  quantize_activations(ctx, x, QuantScheme::fp8_tensor, true, q, tensor_scale);
                }),
                HasSubstr("quantize_activations: the static scale must be finite and > 0, got"))
        << bad;
  }
}

TEST_F(QuantErrors, InputDtypeAndRank) {
  OwnedTensor x_int = host_tensor(DType::int32, {M, K});
  EXPECT_THAT(error_of([&] {
                quantize_activations(ctx, x_int, QuantScheme::fp8_token, false, q, token_scale);
              }),
              HasSubstr("quantize_activations: x must be bf16, fp16 or fp32, got int32 (4, 256) "
                        "on cpu"));
  EXPECT_THAT(
      error_of(
          [&] { quantize_activations(ctx, w, QuantScheme::fp8_token, false, q, token_scale); }),
      HasSubstr("quantize_activations: x must be 2-D (M, K), got bf16 (2, 200, 256) on cpu"));
  EXPECT_THAT(error_of([&] {
                quantize_activations(ctx, Tensor(), QuantScheme::fp8_token, false, q, token_scale);
              }),
              HasSubstr("x must be a 2-D (M, K) bf16, fp16 or fp32 tensor, got undefined"));
  EXPECT_THAT(
      error_of([&] { quantize_weights(ctx, x, QuantScheme::fp8_block, wq, w_block_scale); }),
      HasSubstr("quantize_weights: w must be 3-D (E, N, K), got bf16 (4, 256) on cpu"));
}

TEST_F(QuantErrors, QuantizedOutputDtypeAndShape) {
  OwnedTensor q_bf16 = host_tensor(DType::bf16, {M, K});
  EXPECT_THAT(error_of([&] {
                quantize_activations(ctx, x, QuantScheme::fp8_token, false, q_bf16, token_scale);
              }),
              HasSubstr("quantize_activations: q must be fp8_e4m3 (4, 256) for fp8-token with "
                        "(M, K) = (4, 256), got bf16 (4, 256) on cpu"));
  OwnedTensor wq_short = host_tensor(DType::fp8_e4m3, {E, N - 1, K});
  EXPECT_THAT(error_of([&] {
                dequantize_weights(ctx, wq_short, w_block_scale, QuantScheme::fp8_block, w);
              }),
              HasSubstr("dequantize_weights: q must be fp8_e4m3 (2, 200, 256) for fp8-block with "
                        "(E, N, K) = (2, 200, 256), got fp8_e4m3 (2, 199, 256) on cpu"));
}

TEST_F(QuantErrors, ScaleShapeAndDtype) {
  EXPECT_THAT(error_of([&] {
                quantize_activations(ctx, x, QuantScheme::fp8_block, false, q, token_scale);
              }),
              HasSubstr("quantize_activations: scale must be fp32 (4, 2) for fp8-block with "
                        "(M, K) = (4, 256), got fp32 (4, 1) on cpu"));
  EXPECT_THAT(
      error_of([&] { quantize_activations(ctx, x, QuantScheme::mxfp8, false, q, block_scale); }),
      HasSubstr("scale must be e8m0 (4, 8) for mxfp8 with (M, K) = (4, 256), got fp32 (4, 2)"));
  OwnedTensor flat_block_scale = host_tensor(DType::fp32, {E, 1, 2});  // N / 128 rounded down
  EXPECT_THAT(
      error_of([&] { quantize_weights(ctx, w, QuantScheme::fp8_block, wq, flat_block_scale); }),
      HasSubstr("quantize_weights: scale must be fp32 (2, 2, 2) for fp8-block with "
                "(E, N, K) = (2, 200, 256), got fp32 (2, 1, 2) on cpu"));
  OwnedTensor per_channel = host_tensor(DType::fp32, {E, N});
  EXPECT_THAT(error_of([&] { quantize_weights(ctx, w, QuantScheme::fp8_tensor, wq, per_channel); }),
              HasSubstr("scale must be fp32 (2,) for fp8-tensor"));
}

TEST_F(QuantErrors, NonContiguous) {
  // Every other row of a (2M, K) buffer: right shape, wrong strides.
  OwnedTensor big = host_tensor(DType::bf16, {2 * M, K});
  const Tensor strided(big.tensor().data(), DType::bf16, {M, K}, {2 * K, 1}, Device::cpu());
  EXPECT_THAT(error_of([&] {
                quantize_activations(ctx, strided, QuantScheme::fp8_token, false, q, token_scale);
              }),
              HasSubstr("quantize_activations: x must be contiguous (row-major), got bf16 "
                        "(4, 256) on cpu with strides (512, 1)"));
}

TEST_F(QuantErrors, DeviceMustBeCpu) {
  const Tensor q_cuda(q.tensor().data(), DType::fp8_e4m3, {M, K}, Device::cuda(0));
  EXPECT_THAT(error_of([&] {
                quantize_activations(ctx, x, QuantScheme::fp8_token, false, q_cuda, token_scale);
              }),
              HasSubstr("quantize_activations: q must be on cpu, got fp8_e4m3 (4, 256) on cuda:0"));
  // A CUDA context goes to the CUDA quantizer, which wants its tensors on that device.
  Context cuda_ctx;
  cuda_ctx.device = Device::cuda(0);
#ifdef MODMOE_WITH_CUDA
  EXPECT_THAT(error_of([&] {
                dequantize_activations(cuda_ctx, q, token_scale, QuantScheme::fp8_token, x);
              }),
              HasSubstr("dequantize_activations: out must be on cuda:0, got"));
#else
  EXPECT_THAT(error_of([&] {
                dequantize_activations(cuda_ctx, q, token_scale, QuantScheme::fp8_token, x);
              }),
              HasSubstr("dequantize_activations: this build has no CUDA backend"));
#endif
}

TEST_F(QuantErrors, DequantizeOutputDtype) {
  OwnedTensor out_fp8 = host_tensor(DType::fp8_e4m3, {M, K});
  EXPECT_THAT(error_of([&] {
                dequantize_activations(ctx, q, token_scale, QuantScheme::fp8_token, out_fp8);
              }),
              HasSubstr("dequantize_activations: out must be bf16, fp16 or fp32, got fp8_e4m3 "
                        "(4, 256) on cpu"));
}

TEST_F(QuantErrors, OutputsMustNotOverlapInputs) {
  // q viewing the first bytes of x.
  const Tensor q_alias(x.tensor().data(), DType::fp8_e4m3, {M, K}, Device::cpu());
  EXPECT_THAT(error_of([&] {
                quantize_activations(ctx, x, QuantScheme::fp8_token, false, q_alias, token_scale);
              }),
              HasSubstr("quantize_activations: q must not overlap x"));
}

}  // namespace
}  // namespace modmoe
