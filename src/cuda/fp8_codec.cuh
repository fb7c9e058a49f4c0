// The fp8 element codecs of the CUDA backend: device twins of src/cpu/quant_rows.h, so a value
// quantized on the GPU has the CPU's bits (scales, e4m3 codes, NaN signs included). Used by the
// quantization kernels (quantize.cu) and the Hopper GEMM's fp8 output epilogue.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace modmoe::cuda {

constexpr uint32_t kQuietNaNBits = 0x7fc00000u;  // std::numeric_limits<float>::quiet_NaN()

__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// amax / 448, 1 for an all-zero group, NaN for inf/NaN, the smallest subnormal on underflow.
__device__ __forceinline__ float fp8_scale_for_amax(float amax) {
  if (!isfinite(amax)) return __uint_as_float(kQuietNaNBits);
  if (amax == 0.0f) return 1.0f;
  const float scale = __fdiv_rn(amax, 448.0f);
  return scale > 0.0f ? scale : __uint_as_float(1u);
}

// e8m0 code of 2^(floor(log2(amax)) - 8), clamped at 0; 0xff (NaN) for inf/NaN.
__device__ __forceinline__ uint8_t mx_scale_code_for_amax(float amax) {
  const uint32_t bits = abs_bits(amax);
  if (bits >= 0x7f800000u) return 0xff;
  const int biased_exponent = static_cast<int>(bits >> 23);
  return static_cast<uint8_t>(biased_exponent > 8 ? biased_exponent - 8 : 0);
}

__device__ __forceinline__ float e8m0_value(uint8_t code) {
  if (code == 0xff) return __uint_as_float(kQuietNaNBits);
  return code == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(uint32_t{code} << 23);
}

// The value of an e4m3 code, exactly as the CPU's table (NaN codes keep their sign).
__device__ __forceinline__ float e4m3_value(uint8_t code) {
  const uint32_t sign = uint32_t{code & 0x80u} << 24;
  const uint32_t exponent = (code >> 3) & 0xfu, mantissa = code & 0x7u;
  if ((code & 0x7fu) == 0x7fu) return __uint_as_float(sign | kQuietNaNBits);
  const float magnitude = exponent == 0
                              ? __fmul_rn(static_cast<float>(mantissa), 0.001953125f)  // m * 2^-9
                              : __uint_as_float(((exponent + 120u) << 23) | (mantissa << 20));
  return __uint_as_float(__float_as_uint(magnitude) | sign);
}

// What a group's elements are multiplied by, q = (x * pre) * inverse: cpu::fp8_reciprocal's
// twin (src/cpu/quant_rows.h). inverse = 1 / scale correctly rounded, pre = 1; a subnormal or
// zero scale, whose reciprocal overflows, takes pre = 2^64 and inverse = RN(2^-64 / scale).
// A multiply, not a correctly rounded division per element: the division's Newton steps, range
// check and slow-path branch were the largest part of the fp8-out GEMM1 epilogue (ncu, H200;
// docs/formats.md, perf.md eighth session).
struct Fp8Reciprocal {
  float pre, inverse;
};
__device__ __forceinline__ Fp8Reciprocal fp8_reciprocal(float scale) {
  if (scale < __uint_as_float(0x00800000u)) {  // below the smallest normal float
    return {0x1p64f, __frcp_rn(__fmul_rn(scale, 0x1p64f))};
  }
  return {1.0f, __frcp_rn(scale)};
}

// The same scale and reciprocal without a branch, for amax_bits on which
// fp8_scale_is_fast: 0 (scale 1) or a finite amax whose amax / 448 is a normal float. These are
// the instructions of __fdiv_rn's and __frcp_rn's own fast paths (SASS, nvcc 13.0: three FFMAs
// for the division by 448, MUFU.RCP and two FFMAs for the reciprocal) without the range checks
// and slow-path calls around them, which made each row's chain a branch region of its own in the
// Hopper GEMM's fp8-out epilogue, so the two rows of a thread ran one after the other (perf.md,
// thirty-first session). The bits are the exact forms': the CPU checked the division over every
// finite amax (bench/results/2026-12-04-h200-s31-tools/div448_check.cpp) and
// CudaFp8Codec.FastScaleHasTheExactBitsOnEveryAmax checks both on the GPU.
constexpr uint32_t kFastScaleMinAmaxBits = 0x04e00000u;  // 7 * 2^-120 = 448 * 2^-126

__device__ __forceinline__ bool fp8_scale_is_fast(uint32_t amax_bits) {
  return amax_bits == 0u || (amax_bits >= kFastScaleMinAmaxBits && amax_bits < 0x7f800000u);
}

__device__ __forceinline__ float fp8_scale_for_amax_fast(float amax) {
  constexpr float kInv448 = 1.0f / 448.0f;  // correctly rounded at compile time
  const float q0 = __fmul_rn(amax, kInv448);
  const float q = __fmaf_rn(__fmaf_rn(-q0, 448.0f, amax), kInv448, q0);
  return amax == 0.0f ? 1.0f : q;
}

__device__ __forceinline__ float fp8_reciprocal_fast(float scale) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(scale));
  return __fmaf_rn(y, __fmaf_rn(-scale, y, 1.0f), y);
}

// The code of a NaN quotient: x's sign if x is NaN, else the scale's (as the CPU writes it out;
// the GPU's arithmetic returns one canonical NaN).
__device__ __forceinline__ uint32_t e4m3_nan_code(float x, float scale) {
  return ((__float_as_uint(isnan(x) ? x : scale) >> 24) & 0x80u) | 0x7fu;
}

// The e4m3 codes of x0 / scale and x1 / scale (x0's in the low byte) as (x * pre) * inverse,
// then RNE with finite saturation by the hardware conversion: bit-identical to the CPU's
// e4m3_quantize.
__device__ __forceinline__ uint32_t e4m3_pair(float x0, float x1, float scale, Fp8Reciprocal r) {
  const float q0 = __fmul_rn(__fmul_rn(x0, r.pre), r.inverse);
  const float q1 = __fmul_rn(__fmul_rn(x1, r.pre), r.inverse);
  uint32_t codes = __nv_cvt_float2_to_fp8x2(make_float2(q0, q1), __NV_SATFINITE, __NV_E4M3);
  if (isnan(q0)) codes = (codes & 0xff00u) | e4m3_nan_code(x0, scale);
  if (isnan(q1)) codes = (codes & 0x00ffu) | (e4m3_nan_code(x1, scale) << 8);
  return codes;
}

// Whether a group's quotients can skip e4m3_pair's pre-scale and NaN fix-ups: its values are all
// finite (the group's max |x| bits below inf's; a NaN's bits lie above) and its scale is a
// normal float (pre = 1), so x * inverse is never NaN and (x * 1) * inverse is x * inverse.
__device__ __forceinline__ bool e4m3_group_is_plain(uint32_t amax_bits, Fp8Reciprocal r) {
  return amax_bits < 0x7f800000u && r.pre == 1.0f;
}

// e4m3_pair for a plain group (e4m3_group_is_plain): bit-identical, one multiply per value.
__device__ __forceinline__ uint32_t e4m3_pair_plain(float x0, float x1, float inverse) {
  const float2 q = make_float2(__fmul_rn(x0, inverse), __fmul_rn(x1, inverse));
  return __nv_cvt_float2_to_fp8x2(q, __NV_SATFINITE, __NV_E4M3);
}

}  // namespace modmoe::cuda
