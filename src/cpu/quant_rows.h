// Row-level fp8 quantization helpers for the CPU backend's inner loops (internal header).
//
// The scale conventions are those of include/modmoe/quant.h:
//   fp8 (tensor / token / block): scale = amax / 448, q = e4m3_rne_saturating(x * (1 / scale))
//   (the reciprocal correctly rounded once per group: e4m3_quantize below)
//   mxfp8: scale = 2^(floor(log2(amax)) - 8) stored as an e8m0 code, same element rule
// and dequant(q) = e4m3(q) * scale, a single fp32 multiply.
//
// The element encoder here is a bit-exact, branch-light twin of modmoe::float_to_e4m3
// (numeric.h), which is written for clarity (ilogb/ldexp/lrint) rather than speed; the tests
// compare the two over a dense sweep of fp32 values.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>

#include "modmoe/numeric.h"
#include "modmoe/quant.h"

namespace modmoe {
namespace cpu {

// ---- e4m3 / e8m0 element codecs ----------------------------------------------------------

namespace detail {
// 2^e for |e| small, in a constexpr context (std::ldexp is not constexpr in C++17).
constexpr float exp2_int(int e) {
  float v = 1.0f;
  for (; e > 0; --e) v *= 2.0f;
  for (; e < 0; ++e) v *= 0.5f;
  return v;
}
constexpr std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> table{};
  for (int code = 0; code < 256; ++code) {
    const int exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
    float v = exponent == 0 ? mantissa * exp2_int(-9)  // subnormal: m * 2^-9
                            : (8 + mantissa) * exp2_int(exponent - 7 - 3);
    if ((code & 0x7f) == 0x7f) v = std::numeric_limits<float>::quiet_NaN();
    table[code] = (code & 0x80) ? -v : v;
  }
  return table;
}
}  // namespace detail

// Decoded value of every e4m3 code (0x7f / 0xff are NaN).
inline constexpr std::array<float, 256> kE4M3Values = detail::make_e4m3_table();

inline float e4m3_value(uint8_t code) { return kE4M3Values[code]; }

// e4m3 code of f: round to nearest even, finite overflow and +-inf saturate to +-448, NaN to
// 0x7f with f's sign. Equal to float_to_e4m3(f) for every f.
inline uint8_t e4m3_encode(float f) {
  const uint32_t bits = float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7f;   // NaN
  if (abs_bits >= 0x43e00000u) return sign | 0x7e;  // >= 448, inf included: saturate
  if (abs_bits < 0x3c800000u) {
    // Below 2^-6, the e4m3 quantum is 2^-9: codes 0..8 are round(|f| * 2^9), and code 8 is
    // also the smallest normal. Adding 1.5 * 2^23 leaves that rounded integer (RNE, the
    // default mode) in the low mantissa bits; the scaling by 2^9 is exact.
    const float shifted = bits_float(abs_bits) * 512.0f + 12582912.0f;
    return sign | static_cast<uint8_t>(float_bits(shifted) - 0x4b400000u);
  }
  // Normal: round the 23-bit mantissa to 3 bits, ties to even; a carry correctly moves into
  // the exponent. Then rebias the exponent from 127 (fp32) to 7 (e4m3): (127 - 7) << 3.
  const uint32_t rounded = abs_bits + 0x7ffffu + ((abs_bits >> 20) & 1u);
  return sign | static_cast<uint8_t>((rounded >> 20) - (120u << 3));
}

// 2^(code - 127); code 0 is 2^-127 (an fp32 subnormal) and 0xff is NaN.
inline float e8m0_value(uint8_t code) {
  if (code == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return code == 0 ? bits_float(0x00400000u) : bits_float(static_cast<uint32_t>(code) << 23);
}

// ---- scales ------------------------------------------------------------------------------

// max |x[i]|, NaN if any x[i] is NaN. For non-negative floats the bit patterns order like
// the values, and NaN patterns sort above +inf, so an integer max propagates NaN for free
// (and vectorizes, unlike a float max with NaN semantics).
inline float amax_of(const float* x, int64_t n) {
  uint32_t max_bits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = float_bits(x[i]) & 0x7fffffffu;
    max_bits = b > max_bits ? b : max_bits;
  }
  return bits_float(max_bits);
}

// NaN-propagating max of two amax values (both >= 0 or NaN).
inline float amax_combine(float a, float b) {
  const uint32_t ba = float_bits(a) & 0x7fffffffu, bb = float_bits(b) & 0x7fffffffu;
  return bits_float(ba > bb ? ba : bb);
}

// Scale that maps amax to 448: amax / 448 in fp32; 1.0f when amax == 0 (the group is all
// zeros, any scale works and 1 keeps dequantization trivially exact); NaN when amax is not
// finite, so a bad input shows up in the output instead of silently flushing to zero.
// An amax so small that amax / 448 underflows to 0 gets the smallest positive scale.
inline float fp8_scale_for_amax(float amax) {
  if (!std::isfinite(amax)) return std::numeric_limits<float>::quiet_NaN();
  if (amax == 0.0f) return 1.0f;
  const float scale = amax / kE4M3Max;
  return scale > 0.0f ? scale : std::numeric_limits<float>::denorm_min();
}

// MX (OCP MX v1.0, e4m3 elements, emax = 8): e8m0 code of 2^(floor(log2(amax)) - 8), the
// exponent clamped to [-127, 127]. amax == 0 (or an fp32 subnormal) gives code 0 (2^-127);
// inf or NaN gives 0xff (NaN). The group's amax then scales into [256, 512); the part above
// 448 saturates, as the spec prescribes.
inline uint8_t mx_scale_code_for_amax(float amax) {
  const uint32_t abs_bits = float_bits(amax) & 0x7fffffffu;
  if (abs_bits >= 0x7f800000u) return 0xff;
  // floor(log2(amax)) = biased exponent - 127 for normal amax, so the e8m0 code
  // (exponent - 8 + 127) is the biased exponent minus 8.
  const int biased_exponent = static_cast<int>(abs_bits >> 23);
  return static_cast<uint8_t>(biased_exponent > 8 ? biased_exponent - 8 : 0);
}

// ---- spans and rows ----------------------------------------------------------------------

// What a group's elements are multiplied by: q = (x * pre) * inverse, with inverse = 1 / scale
// correctly rounded and pre = 1. 1 / scale overflows below 2^-128, so a subnormal (or zero)
// scale takes pre = 2^64 and inverse = RN(2^-64 / scale) instead: the same correctly rounded
// reciprocal moved into range, and x * 2^64 is exact, so the product and its rounding are the
// same as with an unbounded exponent. The GPU computes the same (src/cuda/fp8_codec.cuh).
struct Fp8Reciprocal {
  float pre, inverse;
};
inline Fp8Reciprocal fp8_reciprocal(float scale) {
  if (scale < std::numeric_limits<float>::min()) return {0x1p64f, 1.0f / (scale * 0x1p64f)};
  return {1.0f, 1.0f / scale};
}

// e4m3 code of x / scale as (x * pre) * inverse. A NaN takes x's sign when x is NaN, else the
// scale's (written out: which NaN operand a multiplication returns is the compiler's choice).
//
// Design decision (docs/formats.md): a multiply by the reciprocal, not a correctly rounded
// division per element. The division was the largest part of the Hopper GEMM1 epilogue and of
// quantize_rows on the H200 (perf.md, eighth session); x * RN(1/scale) is within 1.5 fp32 ulp of
// RN(x / scale), so a code differs only where x / scale is that close to a midpoint between
// two e4m3 values, and values that are e4m3 * scale still re-quantize to their codes.
inline uint8_t e4m3_quantize(float x, float scale, Fp8Reciprocal r) {
  const float q = (x * r.pre) * r.inverse;
  if (std::isnan(q)) {
    return static_cast<uint8_t>(((float_bits(std::isnan(x) ? x : scale) >> 24) & 0x80u) | 0x7fu);
  }
  return e4m3_encode(q);
}

// q[i] = e4m3(x[i] / scale), by e4m3_quantize.
inline void quantize_span(const float* x, int64_t n, float scale, uint8_t* q) {
  const Fp8Reciprocal r = fp8_reciprocal(scale);
  for (int64_t i = 0; i < n; ++i) q[i] = e4m3_quantize(x[i], scale, r);
}

// out[i] = e4m3(q[i]) * scale.
inline void dequantize_span(const uint8_t* q, int64_t n, float scale, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = kE4M3Values[q[i]] * scale;
}

// Quantizes one row x[0..K) (fp32) to e4m3 codes q[0..K) and writes its scales:
//   fp8_tensor: uses *tensor_scale (the caller computes the per-tensor dynamic scale over the
//               whole tensor first, or passes a static one); writes no row scale.
//   fp8_token : one fp32 scale -> row_scale[0]
//   fp8_block : ceil(K/128) fp32 scales -> row_scale[0..], the last group may be partial
//   mxfp8     : ceil(K/32) e8m0 codes (uint8) -> row_scale[0..], the last group may be partial
// `tensor_scale` is read only for fp8_tensor and `row_scale` is unused there.
void quantize_row(const float* x, int64_t K, QuantScheme scheme, const float* tensor_scale,
                  uint8_t* q, void* row_scale);

// out[k] = e4m3(q[k]) * (scale of k's group); row_scale as for quantize_row (fp8_tensor: a
// pointer to the tensor scale).
void dequantize_row(const uint8_t* q, int64_t K, QuantScheme scheme, const void* row_scale,
                    float* out);

}  // namespace cpu
}  // namespace modmoe
