// Activation quantization on the device (src/cuda/quantize.h) and the CUDA versions of the
// public quantize_activations / dequantize_activations (src/cuda/ops.h).
//
// Every result is bit-identical to the CPU quantizer (src/cpu/quant_rows.h): the same amax
// (a max over the |x| bit patterns, NaN-propagating), the same scale arithmetic (one correctly
// rounded fp32 division), q = e4m3_rne_satfinite(x * (1 / scale)) with the reciprocal correctly
// rounded once per chunk (fp8_codec.cuh), and NaN codes that keep their sign. The tests
// compare codes and scales byte for byte.
//
// Layout of the work: one thread block per row (a grid-stride loop over rows), each thread
// taking 8 consecutive elements per step (one 16-byte load of bf16/fp16) so that a group of
// 128 columns is 16 neighbouring lanes and an MX group of 32 is 4: group amaxes are warp
// shuffles, with no shared memory and no atomics. The per-tensor amax is the one reduction
// across blocks: an integer atomicMax on the |x| bits, exact and order-independent.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "core/op_checks.h"
#include "cuda/cuda_check.h"
#include "cuda/device_guard.h"
#include "cuda/float_io.cuh"
#include "cuda/fp8_codec.cuh"
#include "cuda/ops.h"
#include "cuda/programmatic_launch.cuh"
#include "cuda/quantize.h"
#include "modmoe/error.h"

namespace modmoe::cuda {
namespace {

constexpr int kChunk = 8;         // elements per thread per step
constexpr int kMaxThreads = 256;  // threads per block (rows shorter than 256 * 8 use fewer)
constexpr int kMaxWarps = kMaxThreads / 32;

// float -> bf16 / fp16 / fp32 bits as modmoe/numeric.h rounds them (RNE).
__device__ __forceinline__ uint16_t bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Stores that round exactly as the CPU (numeric.h) does, NaN payloads included — hence not
// float_io.cuh's from_float (the device intrinsics canonicalize NaN).
__device__ __forceinline__ void store_as_cpu(float v, float* out) { *out = v; }
__device__ __forceinline__ void store_as_cpu(float v, __nv_bfloat16* out) {
  *reinterpret_cast<uint16_t*>(out) = bf16_bits(v);
}
__device__ __forceinline__ void store_as_cpu(float v, __half* out) { *out = __float2half_rn(v); }

// ---- chunks of 8 elements ---------------------------------------------------------------------

// v = row[k0, k0 + 8) as fp32, zeros past K. `vectorized`: the chunk is whole and 16-byte
// aligned (checked on the host), so it is one or two 16-byte loads.
template <typename T>
__device__ __forceinline__ void load_chunk(const T* row, int64_t k0, int64_t K, bool vectorized,
                                           float (&v)[kChunk]) {
  if (vectorized) {
    constexpr int kPerVector = 16 / sizeof(T);
    const uint4* src = reinterpret_cast<const uint4*>(row + k0);
#pragma unroll
    for (int i = 0; i < kChunk / kPerVector; ++i) {
      const uint4 raw = src[i];
      const T* elements = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < kPerVector; ++j) v[i * kPerVector + j] = to_float(elements[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kChunk; ++j) v[j] = k0 + j < K ? to_float(row[k0 + j]) : 0.0f;
  }
}

__device__ __forceinline__ uint32_t chunk_amax_bits(const float (&v)[kChunk]) {
  uint32_t amax = 0;
#pragma unroll
  for (int j = 0; j < kChunk; ++j) amax = max(amax, abs_bits(v[j]));
  return amax;
}

// The codes of e4m3(v / scale), two per 16-bit half of `pairs` (little-endian).
__device__ __forceinline__ void encode_chunk(const float (&v)[kChunk], float scale,
                                             uint32_t (&pairs)[kChunk / 2]) {
  const Fp8Reciprocal r = fp8_reciprocal(scale);
#pragma unroll
  for (int j = 0; j < kChunk / 2; ++j) {
    pairs[j] = e4m3_pair(v[2 * j], v[2 * j + 1], scale, r);
  }
}

// q_row[k0, k0 + 8) = the chunk's codes, stopping at K; one 8-byte store when `vectorized`.
__device__ __forceinline__ void store_chunk(const uint32_t (&pairs)[kChunk / 2], uint8_t* q_row,
                                            int64_t k0, int64_t K, bool vectorized) {
  if (vectorized) {
    *reinterpret_cast<uint2*>(q_row + k0) =
        make_uint2(pairs[0] | (pairs[1] << 16), pairs[2] | (pairs[3] << 16));
  } else {
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      if (k0 + j < K) q_row[k0 + j] = static_cast<uint8_t>(pairs[j / 2] >> (8 * (j % 2)));
    }
  }
}

// ---- reductions -------------------------------------------------------------------------------

// Max over the block, returned to every thread. Every thread of the block must call it.
__device__ uint32_t block_max(uint32_t v, uint32_t (&scratch)[kMaxWarps]) {
  v = __reduce_max_sync(0xffffffffu, v);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  uint32_t result = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) result = max(result, scratch[w]);
  __syncthreads();  // scratch is free again for the next call
  return result;
}

// Max over aligned groups of `lanes` (a power of two <= 32) neighbouring lanes.
__device__ __forceinline__ uint32_t lane_group_max(uint32_t v, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset /= 2) {
    v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Rows to process: the capacity, or *num_rows (clamped to [0, capacity]) when given.
__device__ __forceinline__ int64_t rows_to_process(int64_t capacity, const int32_t* num_rows) {
  if (num_rows == nullptr) return capacity;
  const int64_t n = *num_rows;
  return n < 0 ? 0 : (n < capacity ? n : capacity);
}

// ---- kernels ----------------------------------------------------------------------------------

struct QuantizeParams {
  const void* x;
  int64_t ldx;
  int64_t rows;             // capacity
  const int32_t* num_rows;  // optional device bound
  int64_t K;
  QuantScheme scheme;
  const float* tensor_scale;  // fp8_tensor: the scale to use (static, or computed before)
  uint8_t* q;
  void* scale;  // per-row schemes: written
  bool vectorized;
  // Scatter: source row r goes to rows dst_rows[r * fanout + j] (j < fanout; < 0: nowhere) of q
  // and scale, quantized once. Null: row r goes to row r.
  const int32_t* dst_rows;
  int64_t fanout;
};

// Where a source row's codes and scales go: its destination rows, read once per row before any
// store. (Read inside the store loops, every index was read again for each chunk and scale, as a
// store may alias dst_rows for all the compiler knows: at fanout 8 that loop was most of the
// kernel's instructions; docs/perf.md, thirteenth session.) The first kHeldDestinations are held
// in registers; a larger fanout reads the rest as it goes.
constexpr int kHeldDestinations = 8;
struct Destinations {
  int64_t row;                      // the source row
  int32_t held[kHeldDestinations];  // with dst_rows: destinations 0.. (-1: none)
};

__device__ __forceinline__ Destinations load_destinations(const QuantizeParams& p, int64_t row) {
  Destinations d;
  d.row = row;
#pragma unroll
  for (int j = 0; j < kHeldDestinations; ++j)
    d.held[j] = p.dst_rows != nullptr && j < p.fanout ? __ldg(p.dst_rows + row * p.fanout + j) : -1;
  return d;
}

// f(destination row) for each destination of d.row, in order (none for a negative index).
template <typename F>
__device__ __forceinline__ void for_each_destination(const QuantizeParams& p, const Destinations& d,
                                                     F&& f) {
  if (p.dst_rows == nullptr) return f(d.row);
#pragma unroll
  for (int j = 0; j < kHeldDestinations; ++j) {
    if (d.held[j] >= 0) f(int64_t{d.held[j]});
  }
  for (int64_t j = kHeldDestinations; j < p.fanout; ++j) {
    const int32_t dst = p.dst_rows[d.row * p.fanout + j];
    if (dst >= 0) f(int64_t{dst});
  }
}

// |x| max over the rows into *amax_bits (which the host zeroed first).
template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
    tensor_amax_kernel(QuantizeParams p, uint32_t* amax_bits) {
  __shared__ uint32_t scratch[kMaxWarps];
  const int64_t rows = rows_to_process(p.rows, p.num_rows);
  const int64_t step = int64_t{blockDim.x} * kChunk;
  uint32_t amax = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + row * p.ldx;
    for (int64_t k0 = int64_t{threadIdx.x} * kChunk; k0 < p.K; k0 += step) {
      float v[kChunk];
      load_chunk(x, k0, p.K, p.vectorized, v);
      amax = max(amax, chunk_amax_bits(v));
    }
  }
  amax = block_max(amax, scratch);
  // |x| bits order like the values (NaN above inf), so an integer max is the float max.
  if (threadIdx.x == 0 && amax != 0) atomicMax(amax_bits, amax);
}

// scale[0]: the amax bits left by tensor_amax_kernel -> the per-tensor scale.
__global__ void tensor_scale_from_amax_kernel(float* scale) {
  scale[0] = fp8_scale_for_amax(scale[0]);
}

// One step of a row (kChunk columns per thread from column k0 = base + kChunk * threadIdx.x;
// inactive threads hold zeros): for group schemes the group's amax across its lanes, the scale
// written by the group's first lane, then the codes. `row_scale` serves the other schemes.
// Every thread of the warp must call it (the group shuffles).
static_assert(kBlockSize == 1 << 7 && kMxBlockSize == 1 << 5, "quantize_step's group shifts");

__device__ __forceinline__ void quantize_step(const QuantizeParams& p, const Destinations& dests,
                                              int64_t k0, bool active, const float (&v)[kChunk],
                                              float row_scale, int64_t groups_per_row) {
  const bool block = p.scheme == QuantScheme::fp8_block;
  float scale = row_scale;
  if (block || p.scheme == QuantScheme::mxfp8) {
    const int group_shift = block ? 7 : 5;  // log2 of kBlockSize, kMxBlockSize
    const float amax =
        __uint_as_float(lane_group_max(chunk_amax_bits(v), (1 << group_shift) / kChunk));
    const bool writes_scale = active && (k0 & ((1 << group_shift) - 1)) == 0;
    const int64_t group = k0 >> group_shift;
    const uint8_t code = block ? 0 : mx_scale_code_for_amax(amax);
    scale = block ? fp8_scale_for_amax(amax) : e8m0_value(code);
    if (writes_scale) {
      for_each_destination(p, dests, [&](int64_t dst) {
        if (block)
          static_cast<float*>(p.scale)[dst * groups_per_row + group] = scale;
        else
          static_cast<uint8_t*>(p.scale)[dst * groups_per_row + group] = code;
      });
    }
  }
  if (!active) return;
  uint32_t pairs[kChunk / 2];
  encode_chunk(v, scale, pairs);
  for_each_destination(
      p, dests, [&](int64_t dst) { store_chunk(pairs, p.q + dst * p.K, k0, p.K, p.vectorized); });
}

// The grid is one wave of 2048 threads per SM (resident_row_blocks): registers are capped so that
// all of it is resident. (At 35 registers, 40 allocated, 6 of 8 blocks fit and the other 2 ran
// their rows after them; docs/perf.md, thirteenth session.)
template <typename T>
__global__ void __launch_bounds__(kMaxThreads, 2048 / kMaxThreads)
    quantize_rows_kernel(QuantizeParams p) {
  // A kernel launched programmatically after this one (Sm90Experts' decode-sized GEMM1 after the
  // quantize-scatter) may start now: it waits for this grid before reading what it writes.
  allow_dependent_launch();
  __shared__ uint32_t scratch[kMaxWarps];
  const int64_t rows = rows_to_process(p.rows, p.num_rows);
  const int64_t K = p.K;
  const int64_t step = int64_t{blockDim.x} * kChunk;

  if (p.scheme == QuantScheme::fp8_token) {
    // The row's amax first (a block-wide pass), then its codes.
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
      const T* x = static_cast<const T*>(p.x) + row * p.ldx;
      const Destinations dests = load_destinations(p, row);
      uint32_t amax = 0;
      for (int64_t k0 = int64_t{threadIdx.x} * kChunk; k0 < K; k0 += step) {
        float v[kChunk];
        load_chunk(x, k0, K, p.vectorized, v);
        amax = max(amax, chunk_amax_bits(v));
      }
      const float row_scale = fp8_scale_for_amax(__uint_as_float(block_max(amax, scratch)));
      if (threadIdx.x == 0)
        for_each_destination(p, dests,
                             [&](int64_t dst) { static_cast<float*>(p.scale)[dst] = row_scale; });
      for (int64_t k0 = int64_t{threadIdx.x} * kChunk; k0 < K; k0 += step) {
        float v[kChunk];
        load_chunk(x, k0, K, p.vectorized, v);
        uint32_t pairs[kChunk / 2];
        encode_chunk(v, row_scale, pairs);
        for_each_destination(
            p, dests, [&](int64_t dst) { store_chunk(pairs, p.q + dst * K, k0, K, p.vectorized); });
      }
    }
    return;
  }

  // Per-tensor and group scales: every step stands alone. Every thread takes the same steps
  // (inactive ones hold zeros), so the group shuffles always have the whole warp. A step starts
  // at a multiple of 256 columns and lane l holds columns [8l, 8l + 8) of it: a group of 128
  // (32) columns is exactly 16 (4) aligned lanes.
  const float row_scale = p.scheme == QuantScheme::fp8_tensor ? *p.tensor_scale : 0.0f;
  const int64_t group_size = p.scheme == QuantScheme::fp8_block ? kBlockSize : kMxBlockSize;
  const int64_t groups_per_row = (K + group_size - 1) / group_size;
  // (Rows kept 4 in flight per block measured no faster at Qwen3-30B's 8192 x 2048: 29 us
  // either way on the H200, with the SMs 70 % busy: the per-element division and the group
  // shuffles bound it, not loads in flight. docs/perf.md, seventh session. Nor did the scatter
  // at fanout 8 with three rows in flight through a cp.async ring and 16-byte stores covering
  // two destinations: 58.1 against 56.5 us at Qwen3.5 fp8 M = 8192, twenty-sixth session.)
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + row * p.ldx;
    const Destinations dests = load_destinations(p, row);
    for (int64_t base = 0; base < K; base += step) {
      const int64_t k0 = base + int64_t{threadIdx.x} * kChunk;
      float v[kChunk];
      if (k0 < K) {
        load_chunk(x, k0, K, p.vectorized, v);
      } else {
#pragma unroll
        for (int c = 0; c < kChunk; ++c) v[c] = 0.0f;
      }
      quantize_step(p, dests, k0, k0 < K, v, row_scale, groups_per_row);
    }
  }
}

struct DequantizeParams {
  const uint8_t* q;
  const void* scale;
  int64_t rows, K;
  QuantScheme scheme;
  void* out;
  bool vectorized;
};

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) dequantize_rows_kernel(DequantizeParams p) {
  const int64_t K = p.K;
  const int64_t step = int64_t{blockDim.x} * kChunk;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const uint8_t* q = p.q + row * K;
    T* out = static_cast<T*>(p.out) + row * K;
    for (int64_t k0 = int64_t{threadIdx.x} * kChunk; k0 < K; k0 += step) {
      // A chunk never straddles two scale groups (8 divides 32 and 128).
      float scale;
      switch (p.scheme) {
        case QuantScheme::fp8_tensor:
          scale = static_cast<const float*>(p.scale)[0];
          break;
        case QuantScheme::fp8_token:
          scale = static_cast<const float*>(p.scale)[row];
          break;
        case QuantScheme::fp8_block:
          scale = static_cast<const float*>(
              p.scale)[row * ((K + kBlockSize - 1) / kBlockSize) + k0 / kBlockSize];
          break;
        default:  // mxfp8
          scale = e8m0_value(static_cast<const uint8_t*>(
              p.scale)[row * ((K + kMxBlockSize - 1) / kMxBlockSize) + k0 / kMxBlockSize]);
          break;
      }
      uint2 packed = make_uint2(0, 0);  // the chunk's 8 codes, little-endian
      if (p.vectorized) {
        packed = *reinterpret_cast<const uint2*>(q + k0);
      } else {
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
          const uint32_t code = k0 + j < K ? q[k0 + j] : 0u;
          (j < 4 ? packed.x : packed.y) |= code << (8 * (j % 4));
        }
      }
      alignas(16) T values[kChunk];
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const uint32_t word = j < 4 ? packed.x : packed.y;
        const auto code = static_cast<uint8_t>(word >> (8 * (j % 4)));
        store_as_cpu(__fmul_rn(e4m3_value(code), scale), &values[j]);
      }
      if (p.vectorized) {
        constexpr int kVectors = kChunk * sizeof(T) / 16;
#pragma unroll
        for (int i = 0; i < kVectors; ++i) {
          reinterpret_cast<uint4*>(out + k0)[i] = reinterpret_cast<const uint4*>(values)[i];
        }
      } else {
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
          if (k0 + j < K) out[k0 + j] = values[j];
        }
      }
    }
  }
}

// ---- host helpers -------------------------------------------------------------------------------

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// One thread per 8 columns, rounded up to whole warps, at most kMaxThreads.
int threads_for(int64_t K) {
  const int64_t chunks = std::max<int64_t>((K + kChunk - 1) / kChunk, 1);
  return static_cast<int>(std::min<int64_t>((chunks + 31) / 32 * 32, kMaxThreads));
}

// SMs of the current device, asked once per device (launches stay free of driver queries).
int current_sm_count() {
  constexpr int kCachedDevices = 64;
  static std::atomic<int> cache[kCachedDevices];  // zero: not asked yet
  int device = 0;
  MODMOE_CUDA_CHECK(cudaGetDevice(&device));
  if (device < kCachedDevices) {
    const int cached = cache[device].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int sm_count = 0;
  MODMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  if (device < kCachedDevices) cache[device].store(sm_count, std::memory_order_relaxed);
  return sm_count;
}

// Enough blocks to fill the device; more rows than that are walked by a grid-stride loop (a
// num_rows bound may leave most of a large capacity empty: no need to launch it all).
int resident_row_blocks(int64_t rows, int threads) {
  const int64_t resident = static_cast<int64_t>(current_sm_count()) * (2048 / threads);
  return static_cast<int>(std::max<int64_t>(1, std::min(rows, resident)));
}

}  // namespace

// ---- kernel entry points (quantize.h) -----------------------------------------------------------

namespace {

// The checks both entry points share.
void check_quantize_call(const char* fn, DType x_dtype, int64_t rows, int64_t K, QuantScheme scheme,
                         bool static_scale, const void* x, const uint8_t* q, const void* scale) {
  MODMOE_CHECK(scheme != QuantScheme::none)
      << fn << ": scheme must be one of fp8-tensor, fp8-token, fp8-block, mxfp8, got none";
  MODMOE_CHECK(!static_scale || scheme == QuantScheme::fp8_tensor)
      << fn << ": static_scale is only supported with fp8-tensor, got "
      << quant_scheme_name(scheme);
  MODMOE_CHECK(is_float_io_dtype(x_dtype))
      << fn << ": x must be bf16, fp16 or fp32, got " << dtype_name(x_dtype);
  MODMOE_CHECK(rows >= 0 && K >= 0)
      << fn << ": rows and K must be >= 0, got rows = " << rows << ", K = " << K;
  // The per-tensor scale is written even for no rows (1, as on the CPU); row scales only exist
  // for rows (and for columns, with groups).
  const bool writes_scale = scheme == QuantScheme::fp8_tensor ||
                            (rows > 0 && (scheme == QuantScheme::fp8_token || K > 0));
  MODMOE_CHECK(scale != nullptr || !writes_scale) << fn << ": scale must not be null";
  MODMOE_CHECK(rows * K == 0 || (x != nullptr && q != nullptr))
      << fn << ": x and q must not be null for " << rows << " x " << K << " elements";
}

// The parameters of `rows` rows of x (`ldx` apart) into q and scale, each row to itself.
QuantizeParams params_for(const void* x, int64_t ldx, int64_t rows, int64_t K, QuantScheme scheme,
                          uint8_t* q, void* scale) {
  QuantizeParams p{};
  p.x = x;
  p.ldx = ldx;
  p.rows = rows;
  p.K = K;
  p.scheme = scheme;
  p.tensor_scale = static_cast<const float*>(scale);  // read by fp8_tensor (static or computed)
  p.q = q;
  p.scale = scale;
  p.fanout = 1;
  return p;
}

// Launches the quantization `p` describes (p.vectorized is set here).
void launch_quantize(QuantizeParams p, DType x_dtype, bool static_scale, cudaStream_t stream) {
  const size_t x_size = dtype_size(x_dtype);
  p.vectorized =
      p.K % kChunk == 0 && (p.ldx * x_size) % 16 == 0 && aligned(p.x, 16) && aligned(p.q, 8);
  const int threads = threads_for(p.K);
  const int blocks = resident_row_blocks(p.rows, threads);
  void* scale = p.scale;
  dispatch_float_io(x_dtype, "cuda quantize", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.scheme == QuantScheme::fp8_tensor && !static_scale) {
      // amax into scale[0] (as bits), then the scale in place, then the rows read it. An empty
      // tensor (rows == 0 or *num_rows == 0) leaves amax 0 and gets scale 1, as on the CPU.
      MODMOE_CUDA_CHECK(cudaMemsetAsync(scale, 0, sizeof(float), stream));
      if (p.rows > 0 && p.K > 0) {
        tensor_amax_kernel<T><<<blocks, threads, 0, stream>>>(p, static_cast<uint32_t*>(scale));
        MODMOE_CUDA_CHECK_LAUNCH();
      }
      tensor_scale_from_amax_kernel<<<1, 1, 0, stream>>>(static_cast<float*>(scale));
      MODMOE_CUDA_CHECK_LAUNCH();
    }
    if (p.rows > 0) {
      quantize_rows_kernel<T><<<blocks, threads, 0, stream>>>(p);
      MODMOE_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace

void quantize_rows(const void* x, DType x_dtype, int64_t ldx, int64_t rows, const int32_t* num_rows,
                   int64_t K, QuantScheme scheme, bool static_scale, uint8_t* q, void* scale,
                   cudaStream_t stream) {
  constexpr const char* fn = "cuda::quantize_rows";
  check_quantize_call(fn, x_dtype, rows, K, scheme, static_scale, x, q, scale);
  MODMOE_CHECK(ldx >= K) << fn << ": ldx must be >= K = " << K << ", got " << ldx;
  QuantizeParams p = params_for(x, ldx, rows, K, scheme, q, scale);
  p.num_rows = num_rows;
  launch_quantize(p, x_dtype, static_scale, stream);
}

void quantize_scatter_rows(const void* x, DType x_dtype, int64_t rows, int64_t K,
                           QuantScheme scheme, const int32_t* dst_rows, int64_t fanout, uint8_t* q,
                           void* scale, cudaStream_t stream) {
  constexpr const char* fn = "cuda::quantize_scatter_rows";
  check_quantize_call(fn, x_dtype, rows, K, scheme, /*static_scale=*/false, x, q, scale);
  MODMOE_CHECK(fanout >= 1) << fn << ": fanout must be >= 1, got " << fanout;
  MODMOE_CHECK(rows == 0 || dst_rows != nullptr) << fn << ": dst_rows must not be null";
  QuantizeParams p = params_for(x, K, rows, K, scheme, q, scale);
  p.dst_rows = dst_rows;
  p.fanout = fanout;
  launch_quantize(p, x_dtype, /*static_scale=*/false, stream);
}

void dequantize_rows(const uint8_t* q, const void* scale, int64_t rows, int64_t K,
                     QuantScheme scheme, void* out, DType out_dtype, cudaStream_t stream) {
  constexpr const char* fn = "cuda::dequantize_rows";
  MODMOE_CHECK(scheme != QuantScheme::none)
      << fn << ": scheme must be one of fp8-tensor, fp8-token, fp8-block, mxfp8, got none";
  MODMOE_CHECK(is_float_io_dtype(out_dtype))
      << fn << ": out must be bf16, fp16 or fp32, got " << dtype_name(out_dtype);
  MODMOE_CHECK(rows >= 0 && K >= 0)
      << fn << ": rows and K must be >= 0, got rows = " << rows << ", K = " << K;
  if (rows == 0 || K == 0) return;
  MODMOE_CHECK(q != nullptr && scale != nullptr && out != nullptr)
      << fn << ": q, scale and out must not be null";

  DequantizeParams p{};
  p.q = q;
  p.scale = scale;
  p.rows = rows;
  p.K = K;
  p.scheme = scheme;
  p.out = out;
  p.vectorized = K % kChunk == 0 && aligned(q, 8) && aligned(out, 16);
  const int threads = threads_for(K);
  const int blocks = resident_row_blocks(rows, threads);
  dispatch_float_io(out_dtype, "cuda quantize", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dequantize_rows_kernel<T><<<blocks, threads, 0, stream>>>(p);
    MODMOE_CUDA_CHECK_LAUNCH();
  });
}

// ---- tensor entry points (ops.h): the shared checks of core/op_checks.h, on ctx.device ------

namespace {

void check_context(const char* fn, const Context& ctx) {
  MODMOE_CHECK(ctx.device.is_cuda())
      << fn << ": ctx.device must be cuda (this is the CUDA implementation), got "
      << ctx.device.str();
}

}  // namespace

void quantize_activations(const Context& ctx, const Tensor& x, QuantScheme scheme,
                          bool static_scale, const Tensor& q, const Tensor& scale) {
  constexpr const char* fn = "quantize_activations";
  check_context(fn, ctx);
  check_quantize_activations_args(fn, x, scheme, static_scale, q, scale, ctx.device);
  const int64_t M = x.size(0), K = x.size(1);
  // A static scale stays on the device: unlike the CPU, it is not checked for being finite
  // and > 0 here (that would be a host synchronization).

  DeviceGuard guard(ctx.device.index);
  quantize_rows(x.data(), x.dtype(), K, M, nullptr, K, scheme, static_scale, q.data_ptr<uint8_t>(),
                scale.data(), static_cast<cudaStream_t>(ctx.stream));
}

void dequantize_activations(const Context& ctx, const Tensor& q, const Tensor& scale,
                            QuantScheme scheme, const Tensor& out) {
  constexpr const char* fn = "dequantize_activations";
  check_context(fn, ctx);
  check_dequantize_activations_args(fn, q, scale, scheme, out, ctx.device);
  const int64_t M = out.size(0), K = out.size(1);

  DeviceGuard guard(ctx.device.index);
  dequantize_rows(q.data_ptr<const uint8_t>(), scale.data(), M, K, scheme, out.data(), out.dtype(),
                  static_cast<cudaStream_t>(ctx.stream));
}

}  // namespace modmoe::cuda
