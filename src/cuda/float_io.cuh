// Device-side access to bf16 / fp16 / fp32 elements as fp32, vectors of them, and the one place
// that turns a runtime float DType into a template type (for the data-movement kernels).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "modmoe/dtype.h"
#include "modmoe/error.h"

namespace modmoe::cuda {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

// Round to nearest even, as modmoe/numeric.h does on the host.
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

// kVec consecutive elements moved as one aligned load/store.
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

template <typename T, int kVec>
__device__ __forceinline__ void load_floats(const T* src, float (&out)[kVec]) {
  const Vec<T, kVec> raw = *reinterpret_cast<const Vec<T, kVec>*>(src);
#pragma unroll
  for (int j = 0; j < kVec; ++j) out[j] = to_float(raw.v[j]);
}

template <typename T, int kVec>
__device__ __forceinline__ void store_floats(const float (&in)[kVec], T* dst) {
  Vec<T, kVec> raw;
#pragma unroll
  for (int j = 0; j < kVec; ++j) raw.v[j] = from_float<T>(in[j]);
  *reinterpret_cast<Vec<T, kVec>*>(dst) = raw;
}

template <typename T>
struct TypeTag {
  using type = T;
};

inline bool is_float_io_dtype(DType d) {
  return d == DType::bf16 || d == DType::fp16 || d == DType::fp32;
}

// Calls f(TypeTag<T>{}) with T the element type of `dtype` (bf16, fp16 or fp32).
template <typename F>
void dispatch_float_io(DType dtype, const char* fn, F&& f) {
  switch (dtype) {
    case DType::bf16:
      f(TypeTag<__nv_bfloat16>{});
      return;
    case DType::fp16:
      f(TypeTag<__half>{});
      return;
    case DType::fp32:
      f(TypeTag<float>{});
      return;
    default:
      MODMOE_FAIL() << fn << ": dtype must be bf16, fp16 or fp32, got " << dtype_name(dtype);
  }
}

inline bool is_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

inline int blocks_for(int64_t work, int threads) {
  return static_cast<int>((work + threads - 1) / threads);
}

}  // namespace modmoe::cuda
