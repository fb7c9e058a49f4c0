// Scalar conversions between float and the narrow formats (bf16, fp16, fp8 e4m3/e5m2, e8m0).
//
// Rounding is round-to-nearest-even everywhere. fp8 encodes saturate finite overflow to the
// largest finite value (the "satfinite" convention of quantization kernels); NaN stays NaN.
// Header-only and branch-light so the CPU kernels can inline it in their inner loops.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "modmoe/dtype.h"

namespace modmoe {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// ---- bf16 -------------------------------------------------------------------------------
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // qNaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// ---- IEEE-like minifloats (fp16, e4m3fn, e5m2) ------------------------------------------
// A format with `kExp` exponent bits, `kMan` mantissa bits and bias 2^(kExp-1)-1.
// kIeeeSpecials: the all-ones exponent is Inf/NaN (fp16, e5m2). Otherwise only
// S.1111.111 is NaN (e4m3fn) and the rest of the top binade is finite.
template <int kExp, int kMan, bool kIeeeSpecials, bool kSaturate>
struct MiniFloat {
  static constexpr int kBias = (1 << (kExp - 1)) - 1;
  static constexpr int kMinNormalExp = 1 - kBias;
  static constexpr int kMaxCode = kIeeeSpecials ? (((1 << kExp) - 2) << kMan) | ((1 << kMan) - 1)
                                                : (((1 << kExp) - 1) << kMan) | ((1 << kMan) - 2);
  static constexpr int kSignBit = 1 << (kExp + kMan);

  static float decode(uint32_t code) {
    const bool neg = code & kSignBit;
    const int e = (code >> kMan) & ((1 << kExp) - 1);
    const int m = code & ((1 << kMan) - 1);
    float v;
    if (kIeeeSpecials && e == (1 << kExp) - 1) {
      v = m ? NAN : INFINITY;
    } else if (!kIeeeSpecials && e == (1 << kExp) - 1 && m == (1 << kMan) - 1) {
      v = NAN;
    } else if (e == 0) {
      v = std::ldexp(static_cast<float>(m), kMinNormalExp - kMan);
    } else {
      v = std::ldexp(static_cast<float>(m + (1 << kMan)), e - kBias - kMan);
    }
    return neg ? -v : v;
  }

  static float max_finite() { return decode(kMaxCode); }

  static uint32_t encode(float f) {
    const uint32_t sign = (float_bits(f) >> 31) ? kSignBit : 0;
    if (std::isnan(f)) return sign | (kIeeeSpecials ? (((1 << kExp) - 1) << kMan) | 1 : 0x7f);
    const float a = std::fabs(f);
    if (a >= max_finite()) {
      // Values that would round past the largest finite value.
      const float half_step_above = max_finite() + std::ldexp(1.0f, ilogb_max() - kMan - 1);
      if (kSaturate || a < half_step_above) return sign | kMaxCode;
      return sign | (((1 << kExp) - 1) << kMan);  // Inf (IEEE formats only)
    }
    int e = std::ilogb(a);  // a = 1.m * 2^e (a > 0), FP_ILOGB0 for 0
    if (a == 0.0f || e < kMinNormalExp) e = kMinNormalExp;  // subnormal quantum
    // Quantum of the binade; a / quantum is exact (power-of-two scaling).
    long q = std::lrint(std::ldexp(a, kMan - e));
    if (q >= (2L << kMan)) {  // rounded up into the next binade
      q >>= 1;
      e += 1;
    }
    if (q < (1L << kMan)) return sign | static_cast<uint32_t>(q);  // subnormal (or zero)
    return sign | (static_cast<uint32_t>(e + kBias) << kMan) |
           static_cast<uint32_t>(q - (1L << kMan));
  }

 private:
  static int ilogb_max() { return std::ilogb(max_finite()); }
};

using Fp16Format = MiniFloat<5, 10, true, false>;
using E4M3Format = MiniFloat<4, 3, false, true>;
using E5M2Format = MiniFloat<5, 2, true, true>;

inline uint16_t float_to_fp16(float f) { return static_cast<uint16_t>(Fp16Format::encode(f)); }
inline float fp16_to_float(uint16_t h) { return Fp16Format::decode(h); }
inline uint8_t float_to_e4m3(float f) { return static_cast<uint8_t>(E4M3Format::encode(f)); }
inline float e4m3_to_float(uint8_t b) { return E4M3Format::decode(b); }
inline uint8_t float_to_e5m2(float f) { return static_cast<uint8_t>(E5M2Format::encode(f)); }
inline float e5m2_to_float(uint8_t b) { return E5M2Format::decode(b); }

constexpr float kE4M3Max = 448.0f;

// ---- e8m0 (MX shared scale) --------------------------------------------------------------
inline float e8m0_to_float(uint8_t b) {
  return b == 0xff ? NAN : std::ldexp(1.0f, static_cast<int>(b) - 127);
}
// The e8m0 code of 2^exponent, exponent clamped to the representable range [-127, 127].
inline uint8_t e8m0_from_exponent(int exponent) {
  if (exponent < -127) exponent = -127;
  if (exponent > 127) exponent = 127;
  return static_cast<uint8_t>(exponent + 127);
}

// ---- generic element access (slow path; for tests, validation and reference code) --------
inline float load_float(const void* base, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::fp16: return fp16_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::fp32: return static_cast<const float*>(base)[index];
    case DType::fp64: return static_cast<float>(static_cast<const double*>(base)[index]);
    case DType::fp8_e4m3: return e4m3_to_float(static_cast<const uint8_t*>(base)[index]);
    case DType::fp8_e5m2: return e5m2_to_float(static_cast<const uint8_t*>(base)[index]);
    case DType::e8m0: return e8m0_to_float(static_cast<const uint8_t*>(base)[index]);
    case DType::int8: return static_cast<const int8_t*>(base)[index];
    case DType::int32: return static_cast<float>(static_cast<const int32_t*>(base)[index]);
    case DType::int64: return static_cast<float>(static_cast<const int64_t*>(base)[index]);
    case DType::uint8: return static_cast<const uint8_t*>(base)[index];
  }
  return NAN;
}

inline void store_float(void* base, DType dtype, int64_t index, float v) {
  switch (dtype) {
    case DType::bf16: static_cast<uint16_t*>(base)[index] = float_to_bf16(v); break;
    case DType::fp16: static_cast<uint16_t*>(base)[index] = float_to_fp16(v); break;
    case DType::fp32: static_cast<float*>(base)[index] = v; break;
    case DType::fp64: static_cast<double*>(base)[index] = v; break;
    case DType::fp8_e4m3: static_cast<uint8_t*>(base)[index] = float_to_e4m3(v); break;
    case DType::fp8_e5m2: static_cast<uint8_t*>(base)[index] = float_to_e5m2(v); break;
    case DType::e8m0:
      static_cast<uint8_t*>(base)[index] = e8m0_from_exponent(std::ilogb(v));
      break;
    case DType::int8: static_cast<int8_t*>(base)[index] = static_cast<int8_t>(v); break;
    case DType::int32: static_cast<int32_t*>(base)[index] = static_cast<int32_t>(v); break;
    case DType::int64: static_cast<int64_t*>(base)[index] = static_cast<int64_t>(v); break;
    case DType::uint8: static_cast<uint8_t*>(base)[index] = static_cast<uint8_t>(v); break;
  }
}

// Reads an index tensor element (int32 or int64) as int64.
inline int64_t load_index(const void* base, DType dtype, int64_t index) {
  return dtype == DType::int64 ? static_cast<const int64_t*>(base)[index]
                               : static_cast<const int32_t*>(base)[index];
}

}  // namespace modmoe
