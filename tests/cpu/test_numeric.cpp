// Exhaustive checks of numeric.h (float <-> bf16 / fp16 / fp8 e4m3 / fp8 e5m2 / e8m0).
//
// The expected values come from the format definitions written out here in double
// arithmetic, not from numeric.h: decoding from (sign, exponent, mantissa, bias), encoding by
// locating the two representable neighbours of a value and applying round-to-nearest-even.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "modmoe/numeric.h"

namespace modmoe {
namespace {

constexpr uint32_t kSeed = 20240611;

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// ---- independent format definitions --------------------------------------------------------

struct FormatSpec {
  const char* name;
  int exponent_bits;
  int mantissa_bits;
  bool ieee_specials;  // all-ones exponent = inf / NaN (fp16, e5m2); else only S.1111.111 is NaN
  bool saturate;       // finite overflow (and inf) encodes to the largest finite value
  uint32_t (*encode)(float);
  float (*decode)(uint32_t);

  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  uint32_t sign_bit() const { return 1u << (exponent_bits + mantissa_bits); }
  uint32_t all_ones_exponent() const { return (1u << exponent_bits) - 1; }
  uint32_t num_codes() const { return sign_bit() << 1; }
  uint32_t max_finite_code() const {
    return ieee_specials
               ? ((all_ones_exponent() - 1) << mantissa_bits) | ((1u << mantissa_bits) - 1)
               : (all_ones_exponent() << mantissa_bits) | ((1u << mantissa_bits) - 2);
  }
  uint32_t inf_code() const { return all_ones_exponent() << mantissa_bits; }  // IEEE only

  // The value of `code` from the definition: (-1)^s * 2^(e - bias) * (1 + m / 2^man), or
  // subnormal (-1)^s * 2^(1 - bias) * (m / 2^man).
  double value(uint32_t code) const {
    const bool negative = code & sign_bit();
    const uint32_t e = (code >> mantissa_bits) & all_ones_exponent();
    const uint32_t m = code & ((1u << mantissa_bits) - 1);
    double v;
    if (ieee_specials && e == all_ones_exponent()) {
      v = m == 0 ? std::numeric_limits<double>::infinity()
                 : std::numeric_limits<double>::quiet_NaN();
    } else if (!ieee_specials && e == all_ones_exponent() && m == (1u << mantissa_bits) - 1) {
      v = std::numeric_limits<double>::quiet_NaN();
    } else if (e == 0) {
      v = std::ldexp(static_cast<double>(m), 1 - bias() - mantissa_bits);
    } else {
      v = std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -mantissa_bits),
                     static_cast<int>(e) - bias());
    }
    return negative ? -v : v;
  }

  // Round-to-nearest-even code of f (not NaN), found from the representable neighbours.
  uint32_t reference_encode(float f) const {
    const uint32_t sign = std::signbit(f) ? sign_bit() : 0;
    const double a = std::fabs(static_cast<double>(f));
    const uint32_t top = max_finite_code();
    const double v_max = value(top);
    if (a > v_max) {
      if (saturate) return sign | top;
      // The next step above the largest finite value would be the inf code; a tie goes to
      // the even code, which is inf (mantissa 0) since the largest finite mantissa is odd.
      const double midpoint = v_max + (v_max - value(top - 1)) / 2;
      return sign | (a < midpoint ? top : inf_code());
    }
    // Non-negative codes are ordered like their values: find lo with value(lo) <= a.
    uint32_t lo = 0, hi = top;
    while (hi - lo > 1) {
      const uint32_t mid = (lo + hi) / 2;
      (value(mid) <= a ? lo : hi) = mid;
    }
    if (value(hi) <= a) lo = hi;
    if (lo == top || value(lo) == a) return sign | lo;
    const double midpoint = (value(lo) + value(lo + 1)) / 2;  // exact: few significant bits
    if (a < midpoint) return sign | lo;
    if (a > midpoint) return sign | (lo + 1);
    return sign | ((lo & 1) ? lo + 1 : lo);  // tie: the even code
  }

  bool is_nan_code(uint32_t code) const { return std::isnan(value(code)); }
};

uint32_t encode_e4m3(float f) { return float_to_e4m3(f); }
float decode_e4m3(uint32_t c) { return e4m3_to_float(static_cast<uint8_t>(c)); }
uint32_t encode_e5m2(float f) { return float_to_e5m2(f); }
float decode_e5m2(uint32_t c) { return e5m2_to_float(static_cast<uint8_t>(c)); }
uint32_t encode_fp16(float f) { return float_to_fp16(f); }
float decode_fp16(uint32_t c) { return fp16_to_float(static_cast<uint16_t>(c)); }

const FormatSpec kE4M3{"e4m3", 4, 3, false, true, encode_e4m3, decode_e4m3};
const FormatSpec kE5M2{"e5m2", 5, 2, true, true, encode_e5m2, decode_e5m2};
const FormatSpec kFp16{"fp16", 5, 10, true, false, encode_fp16, decode_fp16};

// ---- generic checks shared by the minifloats -----------------------------------------------

void expect_decode_matches_definition(const FormatSpec& spec) {
  for (uint32_t code = 0; code < spec.num_codes(); ++code) {
    const double expected = spec.value(code);
    const float got = spec.decode(code);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << spec.name << " code 0x" << std::hex << code;
    } else {
      EXPECT_EQ(static_cast<double>(got), expected) << spec.name << " code 0x" << std::hex << code;
      EXPECT_EQ(std::signbit(got), (code & spec.sign_bit()) != 0)
          << spec.name << " sign of code 0x" << std::hex << code;
    }
  }
}

void expect_round_trip_of_every_code(const FormatSpec& spec) {
  int nan_codes = 0;
  for (uint32_t code = 0; code < spec.num_codes(); ++code) {
    const float v = spec.decode(code);
    if (spec.is_nan_code(code)) {
      ++nan_codes;
      EXPECT_TRUE(std::isnan(spec.decode(spec.encode(v))))
          << spec.name << " NaN code 0x" << std::hex << code;
      continue;
    }
    // -0 decodes to -0.0f and encodes back to the sign-only code, +0 to code 0.
    EXPECT_EQ(spec.encode(v), code)
        << spec.name << " code 0x" << std::hex << code << " value " << v;
  }
  EXPECT_GT(nan_codes, 0) << spec.name;
}

// Every boundary between two adjacent codes: the values themselves, the exact midpoint (a
// tie, resolved to the even code), and the floats just either side of it.
void expect_rne_at_every_midpoint(const FormatSpec& spec) {
  const uint32_t top = spec.max_finite_code();
  for (uint32_t lo = 0; lo < top; ++lo) {
    const double midpoint = (spec.value(lo) + spec.value(lo + 1)) / 2;
    const float mid = static_cast<float>(midpoint);
    ASSERT_EQ(static_cast<double>(mid), midpoint) << spec.name << ": midpoint not a float";
    const uint32_t even = (lo & 1) ? lo + 1 : lo;
    for (float sign : {1.0f, -1.0f}) {
      const uint32_t sign_code = sign < 0 ? spec.sign_bit() : 0;
      EXPECT_EQ(spec.encode(sign * mid), sign_code | even)
          << spec.name << " tie " << sign * mid << " between codes " << lo << " and " << lo + 1;
      EXPECT_EQ(spec.encode(sign * std::nextafter(mid, 0.0f)), sign_code | lo)
          << spec.name << " just below " << sign * mid;
      EXPECT_EQ(spec.encode(sign * std::nextafter(mid, INFINITY)), sign_code | (lo + 1))
          << spec.name << " just above " << sign * mid;
    }
  }
}

// Random floats across the whole exponent range of the format and beyond, against the
// reference encoder.
void expect_random_values_round_like_reference(const FormatSpec& spec, uint32_t seed) {
  std::mt19937 rng(seed);
  const int max_exponent = spec.bias() + 2, min_exponent = 1 - spec.bias() - spec.mantissa_bits - 3;
  std::uniform_int_distribution<int> exponent(min_exponent, max_exponent);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    float f = std::ldexp(mantissa(rng), exponent(rng));
    if (i % 2) f = -f;
    if (i % 5 == 0) f = float_of(any_bits(rng));
    if (std::isnan(f)) continue;
    ASSERT_EQ(spec.encode(f), spec.reference_encode(f))
        << spec.name << " value " << f << " (bits 0x" << std::hex << bits_of(f) << "), seed "
        << std::dec << seed;
  }
}

// ---- e4m3 --------------------------------------------------------------------------------

TEST(NumericE4M3, EveryCodeDecodesToItsDefinition) {
  expect_decode_matches_definition(kE4M3);
  // The definition's landmarks, spelled out.
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal, m * 2^-9
  EXPECT_EQ(e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal 2^(1-7)
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);                  // exponent field 7 = bias
  EXPECT_EQ(e4m3_to_float(0x78), 256.0f);                // top binade is finite (no inf in e4m3fn)
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xff)));
  EXPECT_EQ(E4M3Format::max_finite(), kE4M3Max);
  // Only 0x7f and 0xff are NaN.
  int nans = 0;
  for (int c = 0; c < 256; ++c) nans += std::isnan(e4m3_to_float(static_cast<uint8_t>(c)));
  EXPECT_EQ(nans, 2);
}

TEST(NumericE4M3, EncodeOfDecodeIsIdentity) {
  expect_round_trip_of_every_code(kE4M3);
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
}

TEST(NumericE4M3, RoundsToNearestEvenOnTies) {
  expect_rne_at_every_midpoint(kE4M3);
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);                // 1 + 1/16: tie -> 1.0 (even)
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3a);                // tie -> 1.25 (even)
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal
  EXPECT_EQ(float_to_e4m3(3 * std::ldexp(1.0f, -10)), 0x02);
  EXPECT_EQ(float_to_e4m3(15 * std::ldexp(1.0f, -10)), 0x08);  // subnormal rounds to normal
  EXPECT_EQ(float_to_e4m3(248.0f), 0x78);  // between 240 (0x77) and 256: tie -> 256 (even)
}

TEST(NumericE4M3, RandomValuesMatchReference) {
  expect_random_values_round_like_reference(kE4M3, kSeed);
}

TEST(NumericE4M3, SaturatesAndKeepsNaN) {
  EXPECT_EQ(float_to_e4m3(1000.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(449.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7e);  // would round to 480 without saturation
  EXPECT_EQ(float_to_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(float_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(float_to_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::max()), 0x7e);
  EXPECT_EQ(e4m3_to_float(float_to_e4m3(1000.0f)), 448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(float_to_e4m3(NAN))));
  EXPECT_TRUE(std::isnan(e4m3_to_float(float_to_e4m3(-NAN))));
  EXPECT_TRUE(std::isnan(e4m3_to_float(float_to_e4m3(float_of(0x7f800001u)))));  // sNaN
}

// ---- e5m2 --------------------------------------------------------------------------------

TEST(NumericE5M2, EveryCodeDecodesToItsDefinition) {
  expect_decode_matches_definition(kE5M2);
  EXPECT_EQ(e5m2_to_float(0x7b), 57344.0f);
  EXPECT_EQ(e5m2_to_float(0x01), std::ldexp(1.0f, -16));  // smallest subnormal m * 2^-16
  EXPECT_EQ(e5m2_to_float(0x3c), 1.0f);                   // exponent field 15 = bias
  EXPECT_EQ(e5m2_to_float(0x7c), INFINITY);
  EXPECT_EQ(e5m2_to_float(0xfc), -INFINITY);
  for (int c : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff})
    EXPECT_TRUE(std::isnan(e5m2_to_float(static_cast<uint8_t>(c)))) << c;
  EXPECT_EQ(E5M2Format::max_finite(), 57344.0f);
}

TEST(NumericE5M2, EncodeOfDecodeIsIdentity) {
  // inf is a code too; under the satfinite convention it encodes to the largest finite value.
  for (uint32_t code = 0; code < 256; ++code) {
    const float v = e5m2_to_float(static_cast<uint8_t>(code));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(e5m2_to_float(float_to_e5m2(v)))) << code;
    } else if (std::isinf(v)) {
      EXPECT_EQ(float_to_e5m2(v), (code & 0x80) | 0x7b) << code;
    } else {
      EXPECT_EQ(float_to_e5m2(v), code) << "code " << code << " value " << v;
    }
  }
  EXPECT_EQ(float_to_e5m2(-0.0f), 0x80);
}

TEST(NumericE5M2, RoundsToNearestEvenOnTies) {
  expect_rne_at_every_midpoint(kE5M2);
  EXPECT_EQ(float_to_e5m2(1.125f), 0x3c);  // between 1.0 and 1.25: tie -> 1.0 (even)
  EXPECT_EQ(float_to_e5m2(1.375f), 0x3e);  // between 1.25 and 1.5: tie -> 1.5 (even)
}

TEST(NumericE5M2, RandomValuesMatchReference) {
  expect_random_values_round_like_reference(kE5M2, kSeed + 1);
}

TEST(NumericE5M2, SaturatesAndKeepsNaN) {
  EXPECT_EQ(float_to_e5m2(1e6f), 0x7b);
  EXPECT_EQ(float_to_e5m2(-1e30f), 0xfb);
  EXPECT_EQ(float_to_e5m2(INFINITY), 0x7b);
  EXPECT_EQ(float_to_e5m2(-INFINITY), 0xfb);
  EXPECT_EQ(float_to_e5m2(61440.0f), 0x7b);  // would round to 65536 without saturation
  EXPECT_TRUE(std::isnan(e5m2_to_float(float_to_e5m2(NAN))));
  EXPECT_TRUE(std::isnan(e5m2_to_float(float_to_e5m2(-NAN))));
}

// ---- fp16 --------------------------------------------------------------------------------

TEST(NumericFp16, EveryCodeDecodesToItsDefinition) { expect_decode_matches_definition(kFp16); }

TEST(NumericFp16, KnownValues) {
  const struct {
    float value;
    uint16_t code;
  } known[] = {{1.0f, 0x3c00},
               {-2.0f, 0xc000},
               {65504.0f, 0x7bff},
               {0.5f, 0x3800},
               {0.333251953125f, 0x3555},
               {std::ldexp(1.0f, -24), 0x0001},
               {std::ldexp(1.0f, -14), 0x0400},
               {INFINITY, 0x7c00},
               {-INFINITY, 0xfc00},
               {0.0f, 0x0000},
               {-0.0f, 0x8000},
               {3.140625f, 0x4248}};
  for (const auto& k : known) {
    EXPECT_EQ(float_to_fp16(k.value), k.code) << k.value;
    EXPECT_EQ(fp16_to_float(k.code), k.value) << std::hex << k.code;
  }
  // Overflow: fp16 is not saturating. 65520 is the tie between 65504 and the inf step.
  EXPECT_EQ(float_to_fp16(65519.996f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(float_to_fp16(-1e10f), 0xfc00);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> 0 (even)
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002);  // tie -> 2 (even)
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(NAN))));
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(float_of(0x7f800001u)))));
}

TEST(NumericFp16, EncodeOfDecodeIsIdentity) { expect_round_trip_of_every_code(kFp16); }

TEST(NumericFp16, RoundsToNearestEvenOnTies) { expect_rne_at_every_midpoint(kFp16); }

TEST(NumericFp16, RandomValuesMatchReferenceAndRoundTrip) {
  expect_random_values_round_like_reference(kFp16, kSeed + 2);
  // Random round trips: the relative error of a normal value is at most 2^-11.
  std::mt19937 rng(kSeed + 3);
  std::uniform_real_distribution<float> value(-60000.0f, 60000.0f);
  for (int i = 0; i < 100000; ++i) {
    const float f = value(rng);
    if (std::fabs(f) < std::ldexp(1.0f, -14)) continue;
    const float back = fp16_to_float(float_to_fp16(f));
    ASSERT_LE(std::fabs(back - f), std::ldexp(std::fabs(f), -11)) << f << ", seed " << kSeed + 3;
  }
}

// ---- bf16 --------------------------------------------------------------------------------

// bf16 keeps the top 16 bits of an fp32; RNE from the two candidate truncations, in double.
uint16_t reference_bf16(float f) {
  const uint32_t u = bits_of(f);
  const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;  // same sign; hi may be inf
  const double a = std::fabs(static_cast<double>(f));
  const double lo_v = std::fabs(static_cast<double>(float_of(lo)));
  const double hi_v = (hi & 0x7fffffffu) == 0x7f800000u
                          ? std::ldexp(1.0, 128)  // the inf step sits where 2^128 would be
                          : std::fabs(static_cast<double>(float_of(hi)));
  const double midpoint = (lo_v + hi_v) / 2;
  if (a < midpoint) return static_cast<uint16_t>(lo >> 16);
  if (a > midpoint) return static_cast<uint16_t>(hi >> 16);
  return static_cast<uint16_t>(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

TEST(NumericBf16, DecodeIsTheTopHalfOfAnFp32) {
  for (uint32_t code = 0; code < 65536; ++code) {
    const float v = bf16_to_float(static_cast<uint16_t>(code));
    const float expected = float_of(code << 16);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(v)) << code;
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(v)))) << code;
    } else {
      EXPECT_EQ(bits_of(v), bits_of(expected)) << code;
      EXPECT_EQ(float_to_bf16(v), code) << code;  // round trip, -0 included
    }
  }
}

TEST(NumericBf16, RoundsToNearestEvenOnTies) {
  EXPECT_EQ(float_to_bf16(float_of(0x3f808000u)), 0x3f80);              // tie, lower code even
  EXPECT_EQ(float_to_bf16(float_of(0x3f818000u)), 0x3f82);              // tie, upper code even
  EXPECT_EQ(float_to_bf16(float_of(0x3f808001u)), 0x3f81);              // just above the tie
  EXPECT_EQ(float_to_bf16(float_of(0x3f807fffu)), 0x3f80);              // just below the tie
  EXPECT_EQ(float_to_bf16(float_of(0xbf818000u)), 0xbf82);              // negative tie
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xff80);
  std::mt19937 rng(kSeed + 4);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    // Every other value is forced onto a tie (low 16 bits 0x8000).
    uint32_t u = any_bits(rng);
    if (i % 2) u = (u & 0xffff0000u) | 0x8000u;
    const float f = float_of(u);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f), reference_bf16(f))
        << "bits 0x" << std::hex << u << ", seed " << std::dec << kSeed + 4;
  }
}

TEST(NumericBf16, NaNStaysNaN) {
  // Signaling NaNs whose payload lives in the dropped low half must not turn into inf.
  for (uint32_t u :
       {0x7f800001u, 0xff800001u, 0x7fc00000u, 0xffc00000u, 0x7f80ffffu, 0x7fffffffu}) {
    const uint16_t b = float_to_bf16(float_of(u));
    EXPECT_TRUE(std::isnan(bf16_to_float(b))) << std::hex << u << " -> " << b;
    EXPECT_EQ(b & 0x8000u, (u >> 16) & 0x8000u) << "sign of " << std::hex << u;
  }
}

// ---- e8m0 --------------------------------------------------------------------------------

TEST(NumericE8M0, DecodeIsAPowerOfTwo) {
  for (int code = 0; code < 255; ++code) {
    const float v = e8m0_to_float(static_cast<uint8_t>(code));
    EXPECT_EQ(static_cast<double>(v), std::ldexp(1.0, code - 127)) << code;
  }
  EXPECT_TRUE(std::isnan(e8m0_to_float(0xff)));
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(0), std::ldexp(1.0f, -127));  // an fp32 subnormal, still exact
}

TEST(NumericE8M0, FromExponentClampsAndRoundTrips) {
  for (int exponent = -127; exponent <= 127; ++exponent) {
    const uint8_t code = e8m0_from_exponent(exponent);
    EXPECT_EQ(code, exponent + 127);
    EXPECT_EQ(std::ilogb(e8m0_to_float(code)), exponent);
  }
  EXPECT_EQ(e8m0_from_exponent(-128), 0);
  EXPECT_EQ(e8m0_from_exponent(-1000), 0);
  EXPECT_EQ(e8m0_from_exponent(128), 254);  // never the NaN code
  EXPECT_EQ(e8m0_from_exponent(1000), 254);
  // store_float(e8m0) keeps floor(log2(v)).
  uint8_t code = 0;
  store_float(&code, DType::e8m0, 0, 3.0f);
  EXPECT_EQ(code, 128);
  store_float(&code, DType::e8m0, 0, 0.75f);
  EXPECT_EQ(code, 126);
  EXPECT_EQ(load_float(&code, DType::e8m0, 0), 0.5f);
}

TEST(NumericGeneric, LoadStoreFloatUseTheFormatCodecs) {
  std::mt19937 rng(kSeed + 5);
  std::normal_distribution<float> value(0.0f, 30.0f);
  for (int i = 0; i < 1000; ++i) {
    const float f = value(rng);
    uint8_t byte = 0;
    uint16_t half = 0;
    store_float(&byte, DType::fp8_e4m3, 0, f);
    EXPECT_EQ(byte, float_to_e4m3(f));
    EXPECT_EQ(load_float(&byte, DType::fp8_e4m3, 0), e4m3_to_float(byte));
    store_float(&byte, DType::fp8_e5m2, 0, f);
    EXPECT_EQ(byte, float_to_e5m2(f));
    store_float(&half, DType::bf16, 0, f);
    EXPECT_EQ(half, float_to_bf16(f));
    EXPECT_EQ(load_float(&half, DType::bf16, 0), bf16_to_float(half));
    store_float(&half, DType::fp16, 0, f);
    EXPECT_EQ(half, float_to_fp16(f));
    EXPECT_EQ(load_float(&half, DType::fp16, 0), fp16_to_float(half));
  }
}

}  // namespace
}  // namespace modmoe
