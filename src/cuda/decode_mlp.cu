// The decode path's two kernels (see decode_mlp.h).
//
// Both are weight-streaming dot products: a warp owns a few weight rows, each lane 16 bytes of
// each row per step (8 bf16/fp16 or 16 e4m3 values), and the loads of several steps and rows
// are issued before any of them is used, so each lane keeps ~8 x 16 bytes in flight (what the
// bandwidth needs: ~30 KB per SM at ~1 us of latency). The vector the rows are multiplied with
// sits in shared memory as fp32 (gate_up: the token row) or 16-bit values (down: the topk
// intermediate rows; fp8 values are exact in fp16). fp8 products are summed per lane in fp32 on
// the e4m3 values themselves (exact products) and scaled once per 16 values, whose group of 128
// along the row gives the scales.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>

#include "cuda/activation_device.cuh"
#include "cuda/cuda_check.h"
#include "cuda/decode_mlp.h"
#include "cuda/float_io.cuh"
#include "cuda/fp8_codec.cuh"
#include "cuda/pair_key.cuh"
#include "modmoe/error.h"
#include "modmoe/quant.h"

namespace modmoe::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
// Registers capped at 128 per thread: 4 CTAs (16 warps) per SM keep enough loads in flight.
constexpr int kMinCtasPerSm = 4;
constexpr int kFeaturesPerWarp = 2;  // gate_up: 2 features = 4 weight rows per warp
constexpr int kGateUpSteps = 2;      // gate_up: steps of every row loaded together
constexpr int kRowsPerWarp = 2;      // down: w2 rows per warp
constexpr int kDownSteps = 4;        // down: (pair, step) units loaded together
constexpr int kFillLoads = 8;        // down: rounds of h loads in flight while staging
constexpr int kGroup = 128;          // fp8 scale group along a row
// Shared memory a CTA may ask for: within the per-block limit of every GPU from sm_80 (99 KiB on
// sm_86 / sm_89); above 48 KiB the kernel opts in (launch()).
constexpr size_t kMaxSharedBytes = 96 * 1024;

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- 16 bytes of weights as fp32 --------------------------------------------------------------

template <typename W>
struct WeightVector {
  static constexpr int kValues = 16 / sizeof(W);
};

__device__ __forceinline__ float2 to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ float2 to_float2(__half2 v) { return __half22float2(v); }

// 8 bf16 or fp16 values (T2 = their pair type).
template <typename T2>
__device__ __forceinline__ void unpack_pairs(const uint4& raw, float (&f)[8]) {
  const T2* v = reinterpret_cast<const T2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = to_float2(v[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}
__device__ __forceinline__ void unpack(const uint4& raw, float (&f)[8], __nv_bfloat16) {
  unpack_pairs<__nv_bfloat162>(raw, f);
}
__device__ __forceinline__ void unpack(const uint4& raw, float (&f)[8], __half) {
  unpack_pairs<__half2>(raw, f);
}
// e4m3 codes through the hardware pair conversion to fp16 (exact), then fp32.
__device__ __forceinline__ void unpack(const uint4& raw, float (&f)[16], uint8_t) {
  const uint16_t* pairs = reinterpret_cast<const uint16_t*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pairs[i], __NV_E4M3);
    const float2 p = __half22float2(__half2(h));
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// sum_i f[i] * v[i] with v read from shared memory at `v`.
template <int kValues>
__device__ __forceinline__ float dot_f32(const float (&f)[kValues], const float* v) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kValues; i += 4) {
    const float4 x = *reinterpret_cast<const float4*>(v + i);
    s = fmaf(f[i], x.x, s);
    s = fmaf(f[i + 1], x.y, s);
    s = fmaf(f[i + 2], x.z, s);
    s = fmaf(f[i + 3], x.w, s);
  }
  return s;
}
template <int kValues, typename S>
__device__ __forceinline__ float dot_16(const float (&f)[kValues], const S* v) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kValues; i += 8) {
    float x[8];
    load_floats<S, 8>(v + i, x);
#pragma unroll
    for (int j = 0; j < 8; ++j) s = fmaf(f[i + j], x[j], s);
  }
  return s;
}

// Programmatic dependent launch (sm_90): gate_up lets down launch once all its CTAs are done
// with their work; down requests its first weights, then waits for gate_up's completion
// (griddepcontrol.wait: every prerequisite grid finished, its writes visible) before it reads
// h. Both are no-ops when the launch was not programmatic, and absent before sm_90.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prerequisite_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ int32_t local_expert(const DecodeMlpArgs& a, int64_t pair) {
  const int32_t E_local = static_cast<int32_t>(a.num_local_experts);
  return a.ids_dtype == DType::int64 ? pair_key(static_cast<const int64_t*>(a.topk_ids), pair,
                                                a.expert_map, a.num_experts, E_local)
                                     : pair_key(static_cast<const int32_t*>(a.topk_ids), pair,
                                                a.expert_map, a.num_experts, E_local);
}

// ---- gate_up ------------------------------------------------------------------------------------
//
// grid (M * topk, ceil(N / (kWarps * kFeaturesPerWarp))). Shared: the token row (K fp32) and,
// for fp8, its group scales (ceil(K / 128) fp32).
template <typename W>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
    decode_gate_up_kernel(const DecodeMlpArgs a) {
  constexpr bool kFp8 = std::is_same_v<W, uint8_t>;
  constexpr int kV = WeightVector<W>::kValues;
  constexpr int kRows = 2 * kFeaturesPerWarp;
  constexpr int64_t kBatch = int64_t{32} * kV * kGateUpSteps;  // row elements per batch
  extern __shared__ float4 shared_x[];
  float* x_s = reinterpret_cast<float*>(shared_x);
  const int64_t K = a.K, N = a.N, pair = blockIdx.x, t = pair / a.topk;
  const int32_t e = local_expert(a, pair);
  if (e >= a.num_local_experts) return;  // not routed here: its h row is never read
  const int64_t k_groups = ceil_div(K, kGroup);
  float* x_scale_s = x_s + K;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n0 = (int64_t{blockIdx.y} * kWarps + warp) * kFeaturesPerWarp;
  const bool warp_has_rows = n0 < N;

  // Rows 2f and 2f + 1: the gate and up rows of feature n0 + f (features past N repeat the
  // last one, computed and dropped).
  const int64_t rows_per_expert = 2 * N;
  const W* w = static_cast<const W*>(a.w13) + e * rows_per_expert * K;
  const W* row[kRows];
  int64_t row_index[kRows];
#pragma unroll
  for (int f = 0; f < kFeaturesPerWarp; ++f) {
    const int64_t n = min(n0 + f, N - 1);
    row_index[2 * f] = gate_column(a.gated_layout, n, N);
    row_index[2 * f + 1] = up_column(a.gated_layout, n, N);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) row[r] = w + row_index[r] * K;
  // kGateUpSteps steps of every row from element k0 (this lane's) on; zeros past K.
  auto load_batch = [&](int64_t k0, uint4(&raw)[kGateUpSteps][kRows]) {
#pragma unroll
    for (int s = 0; s < kGateUpSteps; ++s) {
      const int64_t k = k0 + int64_t{s} * 32 * kV;
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        raw[s][r] =
            warp_has_rows && k < K ? __ldg(reinterpret_cast<const uint4*>(row[r] + k)) : uint4{};
    }
  };
  // The first weights are requested before the token row is staged: the round trips overlap.
  uint4 raw[kGateUpSteps][kRows];
  load_batch(int64_t{lane} * kV, raw);

  // The token row as fp32 (fp8: the e4m3 values; the group scale is applied per 16 values).
  const W* x_row = static_cast<const W*>(a.x) + t * K;
  for (int64_t k = int64_t{threadIdx.x} * kV; k < K; k += int64_t{kThreads} * kV) {
    float f[kV];
    unpack(*reinterpret_cast<const uint4*>(x_row + k), f, W{});
#pragma unroll
    for (int i = 0; i < kV; i += 4)
      *reinterpret_cast<float4*>(x_s + k + i) = make_float4(f[i], f[i + 1], f[i + 2], f[i + 3]);
  }
  if constexpr (kFp8) {
    for (int64_t g = threadIdx.x; g < k_groups; g += kThreads)
      x_scale_s[g] = a.x_scale[t * k_groups + g];
  }
  __syncthreads();
  if (!warp_has_rows) return;
  const float* w_scale = nullptr;
  if constexpr (kFp8)
    w_scale = a.w13_scale + int64_t{e} * ceil_div(rows_per_expert, kGroup) * k_groups;

  // Software pipelined: the next batch is in flight while this one is multiplied.
  float acc[kRows] = {};
  for (int64_t k0 = int64_t{lane} * kV; k0 < K; k0 += kBatch) {
    uint4 next[kGateUpSteps][kRows];
    load_batch(k0 + kBatch, next);
#pragma unroll
    for (int s = 0; s < kGateUpSteps; ++s) {
      const int64_t k = k0 + int64_t{s} * 32 * kV;
      if (k >= K) break;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float f[kV];
        unpack(raw[s][r], f, W{});
        float p = dot_f32(f, x_s + k);
        if constexpr (kFp8) {
          const int64_t g = k / kGroup;
          p *= x_scale_s[g] * __ldg(w_scale + (row_index[r] / kGroup) * k_groups + g);
        }
        acc[r] += p;
      }
    }
#pragma unroll
    for (int s = 0; s < kGateUpSteps; ++s)
#pragma unroll
      for (int r = 0; r < kRows; ++r) raw[s][r] = next[s][r];
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = warp_sum(acc[r]);
  if (lane < kFeaturesPerWarp && n0 + lane < N) {
    // Lane f writes feature f (registers indexed by a compile-time f: no local memory).
#pragma unroll
    for (int f = 0; f < kFeaturesPerWarp; ++f) {
      if (f == lane)
        a.h[pair * N + n0 + f] = gated_function(a.activation, acc[2 * f], acc[2 * f + 1]);
    }
  }
  // down may launch once every CTA got here (or exited): it overlaps this grid's tail.
  allow_dependent_launch();
}

// ---- down + top-k weight + reduce -------------------------------------------------------------
//
// grid (M, ceil(K / (kWarps * kRowsPerWarp))). Shared, per pair j of the token: its 16-bit
// operand row a2_s[j] (N values), its per-group factor fold_s[j][g] (the router weight, times
// the group's fp8 scale when quantized) and its local expert.
struct DownShared {
  size_t fold_offset, expert_offset, bytes;
};
__host__ __device__ inline DownShared down_shared(int64_t topk, int64_t N) {
  DownShared s;
  const int64_t groups = (N + kGroup - 1) / kGroup;
  s.fold_offset = static_cast<size_t>((topk * N * 2 + 15) / 16 * 16);
  s.expert_offset = s.fold_offset + static_cast<size_t>(topk * groups * 4);
  s.bytes = s.expert_offset + static_cast<size_t>(topk * 4);
  return s;
}

template <typename W>
using OperandOf = std::conditional_t<std::is_same_v<W, uint8_t>, __half, W>;

// Units (pair j, step s), j-major, kDownSteps of them for every row of a warp: unit_j = -1 when
// there is nothing to do (past the end, past N, or a pair of no local expert).
struct DownBatch {
  uint4 raw[kDownSteps][kRowsPerWarp];
  int unit_j[kDownSteps];
  int64_t unit_n[kDownSteps];
};

template <typename W, typename Out>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
    decode_down_kernel(const DecodeMlpArgs a) {
  constexpr bool kFp8 = std::is_same_v<W, uint8_t>;
  constexpr int kV = WeightVector<W>::kValues;
  using S = OperandOf<W>;
  extern __shared__ float4 shared_raw[];
  char* base = reinterpret_cast<char*>(shared_raw);
  const int64_t K = a.K, N = a.N, topk = a.topk, t = blockIdx.x;
  const int64_t n_groups = ceil_div(N, kGroup);
  const DownShared layout = down_shared(topk, N);
  S* a2_s = reinterpret_cast<S*>(base);
  float* fold_s = reinterpret_cast<float*>(base + layout.fold_offset);
  int32_t* expert_s = reinterpret_cast<int32_t*>(base + layout.expert_offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  // The routing was written before gate_up was launched (which launched this grid): it may be
  // read before the wait; h may not.
  for (int64_t j = threadIdx.x; j < topk; j += kThreads)
    expert_s[j] = local_expert(a, t * topk + j);
  __syncthreads();

  const int64_t k_first = (int64_t{blockIdx.y} * kWarps + warp) * kRowsPerWarp;
  const bool warp_has_rows = k_first < K;
  int64_t k_row[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) k_row[r] = min(k_first + r, K - 1);
  const int steps = static_cast<int>(ceil_div(N, int64_t{32} * kV));  // per pair
  const int units = static_cast<int>(topk) * steps;
  const W* w2 = static_cast<const W*>(a.w2);
  auto load_batch = [&](int u0, DownBatch& b) {
#pragma unroll
    for (int i = 0; i < kDownSteps; ++i) {
      const int u = u0 + i, j = u / steps;
      b.unit_n[i] = int64_t{u % steps} * 32 * kV + int64_t{lane} * kV;
      const bool live =
          warp_has_rows && u < units && b.unit_n[i] < N && expert_s[j] < a.num_local_experts;
      b.unit_j[i] = live ? j : -1;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        b.raw[i][r] = live ? __ldg(reinterpret_cast<const uint4*>(
                                 w2 + (int64_t{expert_s[j]} * K + k_row[r]) * N + b.unit_n[i]))
                           : uint4{};
      }
    }
  };
  // The first weights are requested before waiting for gate_up: they do not depend on it.
  DownBatch cur;
  load_batch(0, cur);
  wait_for_prerequisite_grids();

  // GEMM2's operand rows, as the grouped path would see them. The loads of kFillLoads rounds
  // are issued before any is used (a CTA stages topk * N values: one round trip, not one per
  // round).
  if constexpr (kFp8) {
    // One warp per (pair, group of 128): amax, scale and e4m3 codes exactly as quantize_rows
    // computes them (NaN included: the bit-pattern max makes a NaN group's scale NaN).
    const int64_t tasks = topk * n_groups;
    for (int64_t u0 = warp; u0 < tasks; u0 += int64_t{kWarps} * kFillLoads) {
      float4 v[kFillLoads];
#pragma unroll
      for (int i = 0; i < kFillLoads; ++i) {
        const int64_t u = u0 + int64_t{i} * kWarps, j = u / n_groups,
                      n = (u % n_groups) * kGroup + lane * 4;
        // N % 16 == 0: a lane's 4 values are all in the row or all out.
        const bool load = u < tasks && n < N && expert_s[j] < a.num_local_experts;
        v[i] = load ? *reinterpret_cast<const float4*>(a.h + (t * topk + j) * N + n)
                    : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int i = 0; i < kFillLoads; ++i) {
        const int64_t u = u0 + int64_t{i} * kWarps, j = u / n_groups, g = u % n_groups,
                      n = g * kGroup + lane * 4;
        if (u >= tasks || expert_s[j] >= a.num_local_experts) continue;  // warp-uniform
        uint32_t amax =
            max(max(abs_bits(v[i].x), abs_bits(v[i].y)), max(abs_bits(v[i].z), abs_bits(v[i].w)));
        amax = __reduce_max_sync(0xffffffffu, amax);
        const float scale = fp8_scale_for_amax(__uint_as_float(amax));
        if (n < N) {
          const uint32_t lo = e4m3_pair(v[i].x, v[i].y, scale),
                         hi = e4m3_pair(v[i].z, v[i].w, scale);
          __half* dst = reinterpret_cast<__half*>(a2_s) + j * N + n;
          dst[0] = __float2half_rn(e4m3_value(lo & 0xffu));
          dst[1] = __float2half_rn(e4m3_value(lo >> 8));
          dst[2] = __float2half_rn(e4m3_value(hi & 0xffu));
          dst[3] = __float2half_rn(e4m3_value(hi >> 8));
        }
        if (lane == 0) {
          const float w = a.topk_weights ? a.topk_weights[t * topk + j] : 1.0f;
          fold_s[j * n_groups + g] = w * scale;
        }
      }
    }
  } else {
    const int64_t total = topk * N, round = int64_t{kThreads} * 4;
    for (int64_t i0 = int64_t{threadIdx.x} * 4; i0 < total; i0 += round * kFillLoads) {
      float4 v[kFillLoads];
#pragma unroll
      for (int r = 0; r < kFillLoads; ++r) {
        const int64_t i = i0 + r * round;
        const bool load = i < total && expert_s[i / N] < a.num_local_experts;
        v[r] = load ? *reinterpret_cast<const float4*>(a.h + t * topk * N + i)
                    : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int r = 0; r < kFillLoads; ++r) {
        const int64_t i = i0 + r * round;
        if (i >= total) break;
        a2_s[i] = from_float<S>(v[r].x);
        a2_s[i + 1] = from_float<S>(v[r].y);
        a2_s[i + 2] = from_float<S>(v[r].z);
        a2_s[i + 3] = from_float<S>(v[r].w);
      }
    }
    for (int64_t j = threadIdx.x; j < topk; j += kThreads)
      fold_s[j] = a.topk_weights ? a.topk_weights[t * topk + j] : 1.0f;
  }
  __syncthreads();
  if (!warp_has_rows) return;

  // Software pipelined: the next batch is in flight while this one is multiplied.
  const int64_t w2_scale_rows = ceil_div(K, kGroup);
  float acc[kRowsPerWarp] = {};
  for (int u0 = 0; u0 < units; u0 += kDownSteps) {
    DownBatch next;
    load_batch(u0 + kDownSteps, next);
#pragma unroll
    for (int i = 0; i < kDownSteps; ++i) {
      const int j = cur.unit_j[i];
      if (j < 0) continue;
      const int64_t n = cur.unit_n[i];
      const int64_t g = kFp8 ? n / kGroup : 0;
      const float fold = fold_s[j * (kFp8 ? n_groups : 1) + g];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        float f[kV];
        unpack(cur.raw[i][r], f, W{});
        float p = dot_16(f, a2_s + j * N + n) * fold;
        if constexpr (kFp8) {
          p *= __ldg(a.w2_scale +
                     (int64_t{expert_s[j]} * w2_scale_rows + k_row[r] / kGroup) * n_groups + g);
        }
        acc[r] += p;
      }
    }
    cur = next;
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) acc[r] = warp_sum(acc[r]);
  Out* out = static_cast<Out*>(a.out) + t * K;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (lane == r && k_first + r < K) out[k_first + r] = from_float<Out>(acc[r]);
  }
}

// ---- host side ----------------------------------------------------------------------------------

size_t gate_up_shared_bytes(int64_t K) { return static_cast<size_t>(K + ceil_div(K, kGroup)) * 4; }

template <typename F>
void dispatch_weight(DType w, F&& f) {
  switch (w) {
    case DType::bf16:
      return f(TypeTag<__nv_bfloat16>{});
    case DType::fp16:
      return f(TypeTag<__half>{});
    case DType::fp8_e4m3:
      return f(TypeTag<uint8_t>{});
    default:
      MODMOE_FAIL() << "decode_mlp: weights must be bf16, fp16 or fp8_e4m3, got " << dtype_name(w);
  }
}

// `programmatic`: launched as a programmatic dependent of the stream's previous kernel (it
// may start before that kernel ends; see allow_dependent_launch).
template <typename Kernel>
void launch(Kernel kernel, dim3 grid, size_t shared, const DecodeMlpArgs& a, bool programmatic,
            cudaStream_t stream) {
  if (shared > 48 * 1024) {
    MODMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(shared)));
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = programmatic ? 1 : 0;
  MODMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, a));
}

// Programmatic launches need sm_90; MODMOE_PDL=0 turns them off (to measure what they bring,
// or where a tool mishandles them).
bool programmatic_launch_available() {
  static const bool env_allows = [] {
    const char* v = std::getenv("MODMOE_PDL");
    return v == nullptr || std::string(v) != "0";
  }();
  int device = 0, major = 0;
  return env_allows && cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 9;
}

}  // namespace

bool decode_mlp_config_fits(const MoEConfig& c) {
  const int64_t K = c.hidden_size, N = c.intermediate_size;
  const QuantScheme q = c.quant.scheme;
  return is_gated(c.activation) &&
         (q == QuantScheme::none || (q == QuantScheme::fp8_block && !c.quant.static_act_scale)) &&
         K % 16 == 0 && N % 16 == 0 && gate_up_shared_bytes(K) <= kMaxSharedBytes &&
         down_shared(c.topk, N).bytes <= kMaxSharedBytes;
}

std::string decode_mlp_unsupported(const MoEConfig& c, const DecodeMlpArgs& a) {
  std::ostringstream why;
  if (!decode_mlp_config_fits(c)) {
    why << "the config is not one the decode path runs (gated, none or dynamic fp8_block, K and N "
           "multiples of 16, shared memory within "
        << kMaxSharedBytes << " bytes): " << c.str();
  } else if (!is_aligned(a.x, 16) || !is_aligned(a.w13, 16) || !is_aligned(a.w2, 16) ||
             !is_aligned(a.h, 16)) {
    why << "x, w13, w2 and h must be 16-byte aligned";
  }
  return why.str();
}

size_t decode_mlp_workspace_bytes(const MoEConfig& c, int64_t M) {
  return static_cast<size_t>(M * c.topk * c.intermediate_size) * sizeof(float);
}

void decode_mlp(const DecodeMlpArgs& a, cudaStream_t stream) {
  if (a.M == 0) return;
  // Pairs (tokens) are the fastest grid dimension: the CTAs of one weight slice run side by
  // side, so pairs that share an expert read its rows while they are in the L2.
  MODMOE_CHECK(ceil_div(a.N, kWarps * kFeaturesPerWarp) <= 65535 &&
               ceil_div(a.K, kWarps * kRowsPerWarp) <= 65535)
      << "decode_mlp: K and N must be <= " << 65535 * kWarps * kRowsPerWarp
      << " (grid.y), got K = " << a.K << ", N = " << a.N;
  const dim3 gate_up_grid(static_cast<unsigned>(a.M * a.topk),
                          static_cast<unsigned>(ceil_div(a.N, kWarps * kFeaturesPerWarp)));
  const dim3 down_grid(static_cast<unsigned>(a.M),
                       static_cast<unsigned>(ceil_div(a.K, kWarps * kRowsPerWarp)));
  const bool programmatic = programmatic_launch_available();
  dispatch_weight(a.w_dtype, [&](auto w_tag) {
    using W = typename decltype(w_tag)::type;
    launch(decode_gate_up_kernel<W>, gate_up_grid, gate_up_shared_bytes(a.K), a, false, stream);
    // Unquantized, the output dtype is the weights' (in_dtype); fp8 writes any of the three.
    if constexpr (std::is_same_v<W, uint8_t>) {
      dispatch_float_io(a.out_dtype, "decode_mlp", [&](auto out_tag) {
        using Out = typename decltype(out_tag)::type;
        launch(decode_down_kernel<W, Out>, down_grid, down_shared(a.topk, a.N).bytes, a,
               programmatic, stream);
      });
    } else {
      MODMOE_CHECK(a.out_dtype == a.w_dtype)
          << "decode_mlp: unquantized, out_dtype must be the weights' dtype "
          << dtype_name(a.w_dtype) << ", got " << dtype_name(a.out_dtype);
      launch(decode_down_kernel<W, W>, down_grid, down_shared(a.topk, a.N).bytes, a, programmatic,
             stream);
    }
  });
}

}  // namespace modmoe::cuda
