// Device kernels of the GPU benchmark (see bench_kernels.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "bench_kernels.h"
#include "modmoe/error.h"

namespace modmoe::bench {

namespace {

constexpr float kE4M3Max = 448.0f;

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  MODMOE_CHECK(e == cudaSuccess) << "modmoe-bench: launching " << what
                                 << " failed: " << cudaGetErrorString(e);
}

unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, 1 << 20));
}

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Sum of two uniforms, centred and scaled to unit variance: bounded (|z| <= 2.449), cheap,
// and smooth enough for timing data.
__device__ __forceinline__ float hash_normal(uint64_t seed, int64_t i) {
  const uint64_t h = mix64(seed * 0x100000001b3ull + static_cast<uint64_t>(i));
  const float u1 = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
  const float u2 = static_cast<float>((h >> 16) & 0xffffff) * (1.0f / 16777216.0f);
  return (u1 + u2 - 1.0f) * 2.449f;
}

__global__ void fill_normal_kernel(void* data, int dtype, int64_t n, uint64_t seed, float s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = hash_normal(seed, i) * s;
    if (dtype == 0)
      static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16(v);
    else if (dtype == 1)
      static_cast<__half*>(data)[i] = __float2half(v);
    else
      static_cast<float*>(data)[i] = v;
  }
}

__global__ void fill_e4m3_kernel(uint8_t* codes, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    codes[i] = __nv_cvt_float_to_fp8(hash_normal(seed, i) * 112.0f, __NV_SATFINITE, __NV_E4M3);
  }
}

__global__ void fill_uniform_kernel(float* data, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed * 0x100000001b3ull + static_cast<uint64_t>(i));
    data[i] = lo + (hi - lo) * static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
  }
}

__global__ void fill_e8m0_kernel(uint8_t* codes, int64_t n, uint64_t seed, int lo, int span) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed * 0x100000001b3ull + static_cast<uint64_t>(i));
    codes[i] = static_cast<uint8_t>(lo + static_cast<int>((h >> 32) % static_cast<uint64_t>(span)));
  }
}

constexpr int kReadThreads = 256;
constexpr int kReadBlocks = 132 * 8;  // a few waves on any current GPU; grid-stride beyond

// Four independent 16-byte loads in flight per thread per iteration. kStreaming: ld.global.cs
// (the L2 keeps the lines evict-first: the bandwidth measurement does not disturb it); else
// ld.global.cg, whose lines take the L2 with normal priority and so evict what was there (the
// benchmarks' L2 flush).
template <bool kStreaming>
__device__ __forceinline__ uint4 load_16(const uint4* p) {
  if constexpr (kStreaming) {
    return __ldcs(p);
  } else {
    return __ldcg(p);
  }
}

template <bool kStreaming>
__global__ void __launch_bounds__(kReadThreads)
    stream_read_kernel(const uint4* data, int64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = load_16<kStreaming>(data + i), b = load_16<kStreaming>(data + i + stride),
                c = load_16<kStreaming>(data + i + 2 * stride),
                d = load_16<kStreaming>(data + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^
           d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = load_16<kStreaming>(data + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  for (int off = 16; off > 0; off >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, off);
  if ((threadIdx.x & 31) == 0) sink[(blockIdx.x * blockDim.x + threadIdx.x) / 32] = acc;
}

__global__ void __launch_bounds__(kReadThreads)
    stream_write_kernel(uint4* data, int64_t n, uint32_t seed) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const uint32_t v = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    data[i] = make_uint4(v, v + 1, v + 2, v + 3);
  }
}

__global__ void __launch_bounds__(kReadThreads)
    stream_copy_kernel(const uint4* src, uint4* dst, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride), c = __ldcs(src + i + 2 * stride),
                d = __ldcs(src + i + 3 * stride);
    dst[i] = a, dst[i + stride] = b, dst[i + 2 * stride] = c, dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = __ldcs(src + i);
}

__global__ void empty_kernel() {}

// ---- baseline glue ----------------------------------------------------------------------------

__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

__device__ __forceinline__ float gated(Activation act, float gate, float up) {
  switch (act) {
    case Activation::silu:
      return silu(gate) * up;
    case Activation::gelu:
      return 0.5f * gate * (1.0f + erff(gate * 0.70710678f)) * up;
    case Activation::gelu_tanh: {
      const float c = 0.79788456f;
      return 0.5f * gate * (1.0f + tanhf(c * (gate + 0.044715f * gate * gate * gate))) * up;
    }
    case Activation::swigluoai: {
      const float g = fminf(gate, kSwigluOaiLimit);
      const float u = fmaxf(fminf(up, kSwigluOaiLimit), -kSwigluOaiLimit);
      return g / (1.0f + __expf(-kSwigluOaiAlpha * g)) * (u + 1.0f);
    }
    default:
      return silu(gate) * up;
  }
}

__device__ __forceinline__ void load8(const __nv_bfloat16* p, float* v) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ void store8(__nv_bfloat16* p, const float* v) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}

// One thread per 8 columns of one row.
__global__ void gather_rows_kernel(const __nv_bfloat16* x, int64_t K, const int32_t* row_token,
                                   int64_t rows, __nv_bfloat16* out) {
  const int64_t vecs = K / 8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * vecs;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / vecs, c = (i % vecs) * 8;
    const int32_t t = row_token[r];
    uint4 v = make_uint4(0, 0, 0, 0);
    if (t >= 0) v = *reinterpret_cast<const uint4*>(x + t * K + c);
    *reinterpret_cast<uint4*>(out + r * K + c) = v;
  }
}

// One warp per (row, 128-column group): lane l owns columns g*128 + 4l .. +3.
template <typename ValueAt>
__device__ void quantize_group(int64_t r, int64_t g, int64_t C, const BaselineRows& rows,
                               ValueAt value_at, uint8_t* q, float* scale) {
  const int lane = threadIdx.x & 31;
  const int64_t c0 = g * 128 + lane * 4;
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = (c0 + i < C) ? value_at(c0 + i) : 0.0f;
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  for (int off = 16; off > 0; off >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const float s = amax > 0.0f ? amax / kE4M3Max : 1.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (c0 + i < C) q[r * C + c0 + i] = __nv_cvt_float_to_fp8(v[i] / s, __NV_SATFINITE, __NV_E4M3);
  }
  if (lane == 0) {
    const int32_t e = rows.row_expert[r];
    const int64_t groups = (C + 127) / 128;
    const int64_t first = rows.expert_offset[e];
    scale[first * groups + g * rows.expert_rows[e] + (r - first)] = s;
  }
}

__global__ void gather_quantize_kernel(const __nv_bfloat16* x, int64_t K, BaselineRows rows,
                                       uint8_t* q, float* scale) {
  const int64_t groups = (K + 127) / 128;
  const int64_t warps = rows.rows * groups;
  for (int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; w < warps;
       w += int64_t(gridDim.x) * blockDim.x / 32) {
    const int64_t r = w / groups, g = w % groups;
    const int32_t t = rows.row_token[r];
    quantize_group(
        r, g, K, rows, [&](int64_t c) { return t >= 0 ? __bfloat162float(x[t * K + c]) : 0.0f; }, q,
        scale);
  }
}

__global__ void activation_kernel(Activation act, const __nv_bfloat16* h, int64_t N, int64_t rows,
                                  __nv_bfloat16* out) {
  const int64_t vecs = N / 8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * vecs;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / vecs, c = (i % vecs) * 8;
    float gate[8], up[8], y[8];
    load8(h + r * 2 * N + c, gate);
    load8(h + r * 2 * N + N + c, up);
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = gated(act, gate[j], up[j]);
    store8(out + r * N + c, y);
  }
}

__global__ void activation_quantize_kernel(Activation act, const __nv_bfloat16* h, int64_t N,
                                           BaselineRows rows, uint8_t* q, float* scale) {
  const int64_t groups = (N + 127) / 128;
  const int64_t warps = rows.rows * groups;
  for (int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; w < warps;
       w += int64_t(gridDim.x) * blockDim.x / 32) {
    const int64_t r = w / groups, g = w % groups;
    const __nv_bfloat16* row = h + r * 2 * N;
    quantize_group(
        r, g, N, rows,
        [&](int64_t c) {
          return gated(act, __bfloat162float(row[c]), __bfloat162float(row[N + c]));
        },
        q, scale);
  }
}

// One block per token; each thread sums 8 columns over k in fixed order.
__global__ void weighted_sum_kernel(const __nv_bfloat16* y, int64_t K, const int32_t* pair_row,
                                    const float* weights, int64_t topk, __nv_bfloat16* out) {
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x * 8; c < K; c += blockDim.x * 8) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t k = 0; k < topk; ++k) {
      const int32_t r = pair_row[t * topk + k];
      if (r < 0) continue;
      const float w = weights[t * topk + k];
      float v[8];
      load8(y + r * K + c, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += w * v[j];
    }
    store8(out + t * K + c, acc);
  }
}

constexpr int kCompareBlocks = 1024;
constexpr int kCompareThreads = 256;

__global__ void compare_partial_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t n,
                                       double* partials) {
  double diff = 0, ref = 0, bad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    if (!isfinite(x)) {
      bad += 1;
      continue;
    }
    diff += (x - y) * (x - y);
    ref += y * y;
  }
  __shared__ double s[3][kCompareThreads];
  s[0][threadIdx.x] = diff;
  s[1][threadIdx.x] = ref;
  s[2][threadIdx.x] = bad;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) {
      for (int j = 0; j < 3; ++j) s[j][threadIdx.x] += s[j][threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    for (int j = 0; j < 3; ++j) partials[blockIdx.x * 3 + j] = s[j][0];
  }
}

__global__ void compare_final_kernel(const double* partials, int blocks, double* stats) {
  if (threadIdx.x != 0) return;
  double sum[3] = {0, 0, 0};
  for (int b = 0; b < blocks; ++b)
    for (int j = 0; j < 3; ++j) sum[j] += partials[b * 3 + j];
  for (int j = 0; j < 3; ++j) stats[j] = sum[j];
}

}  // namespace

void fill_normal(void* data, DType dtype, int64_t n, uint64_t seed, float stddev,
                 cudaStream_t stream) {
  MODMOE_CHECK(dtype == DType::bf16 || dtype == DType::fp16 || dtype == DType::fp32)
      << "fill_normal: dtype must be bf16, fp16 or fp32, got " << dtype_name(dtype);
  const int code = dtype == DType::bf16 ? 0 : dtype == DType::fp16 ? 1 : 2;
  fill_normal_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(data, code, n, seed, stddev);
  check_launch("fill_normal");
}

void fill_e4m3(uint8_t* codes, int64_t n, uint64_t seed, cudaStream_t stream) {
  fill_e4m3_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(codes, n, seed);
  check_launch("fill_e4m3");
}

void fill_uniform(float* data, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t stream) {
  fill_uniform_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(data, n, seed, lo, hi);
  check_launch("fill_uniform");
}

void fill_e8m0(uint8_t* codes, int64_t n, uint64_t seed, int lo, int hi, cudaStream_t stream) {
  MODMOE_CHECK(0 <= lo && lo <= hi && hi <= 255) << "fill_e8m0: need 0 <= lo <= hi <= 255";
  fill_e8m0_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(codes, n, seed, lo, hi - lo + 1);
  check_launch("fill_e8m0");
}

int64_t stream_read_sink_words() { return int64_t(kReadBlocks) * kReadThreads / 32; }

void empty_kernels(int count, cudaStream_t stream) {
  for (int i = 0; i < count; ++i) {
    empty_kernel<<<1, 32, 0, stream>>>();
    check_launch("empty_kernel");
  }
}

void stream_read(const void* data, size_t bytes, uint32_t* sink, cudaStream_t stream,
                 ReadCaching caching) {
  MODMOE_CHECK(bytes % 16 == 0 && reinterpret_cast<uintptr_t>(data) % 16 == 0)
      << "stream_read: needs 16-byte aligned data and a multiple of 16 bytes, got " << bytes;
  const auto kernel =
      caching == ReadCaching::streaming ? stream_read_kernel<true> : stream_read_kernel<false>;
  kernel<<<kReadBlocks, kReadThreads, 0, stream>>>(static_cast<const uint4*>(data),
                                                   int64_t(bytes / 16), sink);
  check_launch("stream_read");
}

void stream_write(void* data, size_t bytes, uint32_t seed, cudaStream_t stream) {
  MODMOE_CHECK(bytes % 16 == 0 && reinterpret_cast<uintptr_t>(data) % 16 == 0)
      << "stream_write: needs 16-byte aligned data and a multiple of 16 bytes, got " << bytes;
  stream_write_kernel<<<kReadBlocks, kReadThreads, 0, stream>>>(static_cast<uint4*>(data),
                                                                int64_t(bytes / 16), seed);
  check_launch("stream_write");
}

void stream_copy(const void* src, void* dst, size_t bytes, cudaStream_t stream) {
  MODMOE_CHECK(bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
               reinterpret_cast<uintptr_t>(dst) % 16 == 0)
      << "stream_copy: needs 16-byte aligned buffers and a multiple of 16 bytes, got " << bytes;
  stream_copy_kernel<<<kReadBlocks, kReadThreads, 0, stream>>>(
      static_cast<const uint4*>(src), static_cast<uint4*>(dst), int64_t(bytes / 16));
  check_launch("stream_copy");
}

void gather_rows(const void* x, int64_t K, const BaselineRows& rows, void* out,
                 cudaStream_t stream) {
  MODMOE_CHECK(K % 8 == 0) << "gather_rows: K must be a multiple of 8, got " << K;
  gather_rows_kernel<<<blocks_for(rows.rows * K / 8, 256), 256, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(x), K, rows.row_token, rows.rows,
      static_cast<__nv_bfloat16*>(out));
  check_launch("gather_rows");
}

void gather_quantize_rows(const void* x, int64_t K, const BaselineRows& rows, uint8_t* q,
                          float* scale, cudaStream_t stream) {
  const int64_t warps = rows.rows * ((K + 127) / 128);
  gather_quantize_kernel<<<blocks_for(warps * 32, 256), 256, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(x), K, rows, q, scale);
  check_launch("gather_quantize_rows");
}

void activation_rows(Activation act, const void* h, int64_t N, int64_t rows, void* out,
                     cudaStream_t stream) {
  MODMOE_CHECK(is_gated(act) && N % 8 == 0)
      << "activation_rows: needs a gated activation and N % 8 == 0, got " << activation_name(act)
      << ", N = " << N;
  activation_kernel<<<blocks_for(rows * N / 8, 256), 256, 0, stream>>>(
      act, static_cast<const __nv_bfloat16*>(h), N, rows, static_cast<__nv_bfloat16*>(out));
  check_launch("activation_rows");
}

void activation_quantize_rows(Activation act, const void* h, int64_t N, const BaselineRows& rows,
                              uint8_t* q, float* scale, cudaStream_t stream) {
  MODMOE_CHECK(is_gated(act)) << "activation_quantize_rows: needs a gated activation, got "
                              << activation_name(act);
  const int64_t warps = rows.rows * ((N + 127) / 128);
  activation_quantize_kernel<<<blocks_for(warps * 32, 256), 256, 0, stream>>>(
      act, static_cast<const __nv_bfloat16*>(h), N, rows, q, scale);
  check_launch("activation_quantize_rows");
}

void weighted_sum_rows(const void* y, int64_t K, const int32_t* pair_row, const float* weights,
                       int64_t M, int64_t topk, void* out, cudaStream_t stream) {
  MODMOE_CHECK(K % 8 == 0) << "weighted_sum_rows: K must be a multiple of 8, got " << K;
  if (M == 0) return;
  weighted_sum_kernel<<<static_cast<unsigned>(M), 128, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(y), K, pair_row, weights, topk,
      static_cast<__nv_bfloat16*>(out));
  check_launch("weighted_sum_rows");
}

int64_t compare_partials() { return int64_t(kCompareBlocks) * 3; }

void compare_bf16(const void* a, const void* b, int64_t n, double* stats, double* partials,
                  cudaStream_t stream) {
  compare_partial_kernel<<<kCompareBlocks, kCompareThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(a), static_cast<const __nv_bfloat16*>(b), n, partials);
  check_launch("compare_bf16");
  compare_final_kernel<<<1, 32, 0, stream>>>(partials, kCompareBlocks, stats);
  check_launch("compare_bf16 (final)");
}

}  // namespace modmoe::bench
