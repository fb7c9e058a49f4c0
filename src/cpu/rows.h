// Row conversions between the float dtypes and fp32, and NaN poisoning (CPU internals).
#pragma once

#include <cstdint>

#include "modmoe/numeric.h"
#include "modmoe/tensor.h"

namespace modmoe::cpu {

// dst[0..n) = float(src[0..n)) for bf16/fp16/fp32 rows.
inline void load_row(const void* src, DType dtype, int64_t n, float* dst) {
  switch (dtype) {
    case DType::fp32: {
      const float* s = static_cast<const float*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = s[i];
      return;
    }
    case DType::bf16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
      return;
    }
    default:
      for (int64_t i = 0; i < n; ++i) dst[i] = load_float(src, dtype, i);
  }
}

// dst[0..n) = dtype(src[0..n)), rounding to nearest even.
inline void store_row(const float* src, int64_t n, DType dtype, void* dst) {
  switch (dtype) {
    case DType::fp32: {
      float* d = static_cast<float*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = src[i];
      return;
    }
    case DType::bf16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(src[i]);
      return;
    }
    default:
      for (int64_t i = 0; i < n; ++i) store_float(dst, dtype, i, src[i]);
  }
}

// Fills a host tensor with NaN (fp8: the NaN code, e8m0: 0xFF, integers: -1): memory that must
// never be read as data is poisoned so a reader produces NaN instead of a plausible number.
void poison(const Tensor& t);

}  // namespace modmoe::cpu
