// The decode path's device building blocks (decode_mlp.h), shared by its kernels
// (decode_mlp.cu: gate_up, quantize_h, down): the tile's tensor-core step over weights streamed
// through a per-warp cp.async ring, the warps' partial sums, and the staging of each GEMM's
// vector operand.
//
// A 16-row tile of weights (gate_up: the gate and up rows of 8 features; down: 16 output rows)
// is multiplied by one vector:
//
//   * The weights go through a per-warp ring of cp.async stages in shared memory. Each lane
//     copies its own 16-byte chunks and reads back only those (so no barrier guards the ring),
//     and the copies of several stages are in flight while one is multiplied: the bytes in
//     flight cost shared memory, not registers. (The first version kept them in registers, and
//     its copy of the next batch into the current one waited for the loads: one batch in flight,
//     10-60 % of the read bandwidth; docs/perf.md.)
//   * The products run on the tensor cores: mma.sync m16n8k16 with the 16 weight rows as A and
//     the vector as every column of B. The k order inside an MMA is free, so lane (g, t) feeds
//     the 16 contiguous bytes it loaded of rows g and g + 8 (a quad of lanes covers 64 contiguous
//     bytes of 8 rows per load) and the vector's values at the same k; every column of D is the
//     tile's result. fp8 weights become fp16 pairs exactly (one conversion per 2 values, instead
//     of a conversion and an FMA per value on the CUDA cores), the vector is stored as fp16 (fp8
//     values are exact in fp16) or in the weights' 16-bit dtype, and the fp8 group scales are
//     applied once per stage: a stage of fp8 is 128 values along the row, one scale group.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "cuda/decode_mlp.h"
#include "cuda/float_io.cuh"
#include "cuda/fp8_codec.cuh"
#include "cuda/grouped_gemm_ptx.cuh"
#include "cuda/pair_key.cuh"
#include "cuda/programmatic_launch.cuh"

namespace modmoe::cuda::decode {

using gemm::cp_async_16;
using gemm::cp_async_commit;
using gemm::cp_async_wait_pending;
using gemm::shared_address;

constexpr int kGroup = 128;      // fp8 scale group along a row
constexpr int kTileRows = 16;    // output rows of a CTA: the M of one m16n8k16 MMA
constexpr int kStageChunks = 4;  // 16-byte chunks a lane copies per stage: 2 steps x 2 rows
constexpr int kMaxWarps = 16;    // per CTA, gate_up and down
constexpr int kFillLoads = 8;    // down: rounds of h loads in flight while staging

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The reduction geometry of weight type W. A step is what one load of a lane quad covers along
// a row (4 lanes x 16 bytes); a stage is two steps (fp8: 128 values, one scale group).
template <typename W>
struct Span {
  static constexpr int kValues = 16 / static_cast<int>(sizeof(W));  // per 16-byte chunk
  static constexpr int kStep = 4 * kValues;
  static constexpr int kStage = 2 * kStep;
};
__host__ __device__ constexpr int stage_span(size_t weight_bytes) {
  return weight_bytes == 1 ? 128 : 64;
}

// The vector operand's 16-bit type: fp16 for fp8 weights (e4m3 values are exact in fp16),
// else the weights' own.
template <typename W>
using OperandOf = std::conditional_t<std::is_same_v<W, uint8_t>, __half, W>;

// ---- one step of the tile's MMAs ----------------------------------------------------------------

// Two e4m3 codes (the low 16 bits) as an fp16 pair, exactly.
__device__ __forceinline__ uint32_t e4m3x2_to_half2(uint32_t two_codes) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes), __NV_E4M3);
  return uint32_t{h.x} | (uint32_t{h.y} << 16);
}

// d += A * B over one step: lo / hi are the 16 bytes this lane loaded of rows g and g + 8, b the
// vector's values at the same k (kValues 16-bit values, as 32-bit pairs).
template <typename W>
__device__ __forceinline__ void mma_step(float (&d)[4], const uint4& lo, const uint4& hi,
                                         const uint32_t* b) {
  const uint32_t* l = reinterpret_cast<const uint32_t*>(&lo);
  const uint32_t* h = reinterpret_cast<const uint32_t*>(&hi);
  if constexpr (std::is_same_v<W, uint8_t>) {
    // Word i holds values 4i .. 4i + 3: MMA i takes them as its k slots (2t, 2t+1 | 2t+8, 2t+9).
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t a[4] = {e4m3x2_to_half2(l[i] & 0xffffu), e4m3x2_to_half2(h[i] & 0xffffu),
                             e4m3x2_to_half2(l[i] >> 16), e4m3x2_to_half2(h[i] >> 16)};
      const uint32_t bb[2] = {b[2 * i], b[2 * i + 1]};
      gemm::mma_fp16_16816(d, a, bb, d);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t a[4] = {l[2 * i], h[2 * i], l[2 * i + 1], h[2 * i + 1]};
      const uint32_t bb[2] = {b[2 * i], b[2 * i + 1]};
      if constexpr (std::is_same_v<W, __nv_bfloat16>) {
        gemm::mma_bf16_16816(d, a, bb, d);
      } else {
        gemm::mma_fp16_16816(d, a, bb, d);
      }
    }
  }
}

// This lane's kValues vector values at element k of a 16-bit operand row in shared memory.
template <typename W>
__device__ __forceinline__ void load_operand(const OperandOf<W>* v, int64_t k,
                                             uint32_t (&b)[Span<W>::kValues / 2]) {
  const uint4* src = reinterpret_cast<const uint4*>(v + k);
#pragma unroll
  for (int i = 0; i < Span<W>::kValues / 8; ++i) {
    const uint4 q = src[i];
    b[4 * i] = q.x, b[4 * i + 1] = q.y, b[4 * i + 2] = q.z, b[4 * i + 3] = q.w;
  }
}

// The tile's product over one stage: d = the 16 weight rows this lane holds in `chunks` (two
// steps, rows g and g + 8) times the vector's values from v on (this lane's first).
template <typename W>
__device__ __forceinline__ void stage_product(float (&d)[4], const uint4 (&chunks)[kStageChunks],
                                              const OperandOf<W>* v) {
  d[0] = d[1] = d[2] = d[3] = 0.0f;
#pragma unroll
  for (int step = 0; step < 2; ++step) {
    uint32_t b[Span<W>::kValues / 2];
    load_operand<W>(v, step * Span<W>::kStep, b);
    mma_step<W>(d, chunks[2 * step], chunks[2 * step + 1], b);
  }
}

// ---- the per-warp cp.async ring ---------------------------------------------------------------

// A warp's ring: kDepth slots of kStageChunks x 32 chunks; lane l's chunk c of slot s at
// [s][c][l], so a warp's reads and copies of one chunk are 512 contiguous bytes (no conflicts).
// The depth is a compile-time constant: the wait is one instruction (a runtime depth went
// through a switch, and with the per-stage index arithmetic the loop was bound by its own
// instructions, not by memory; ncu, docs/perf.md). gate_up's ring is one slot shorter than
// down's: its CTAs are many and short, and more of them per SM beat more stages in flight per
// warp (a sweep of depths 2-8, docs/perf.md twenty-first session); down's few long CTAs keep 4.
constexpr int kGateUpDepth = 3;
constexpr int kDownDepth = 4;
__host__ __device__ constexpr size_t ring_bytes_per_warp(int depth) {
  return static_cast<size_t>(depth) * kStageChunks * 32 * 16;
}

// Streams `count` stages of this warp through its ring (`ring`: the warp's slot 0). A cursor
// names a stage: `source(cursor, c, &src)` gives this lane's global chunk c of it (false:
// zero-fill), `next(cursor)` moves to the warp's next stage, `use(cursor, chunks)` consumes one.
// `prologue()` runs after the first stages are requested, before any is used (the vector
// operand is staged there, so its round trips overlap the weights').
template <int kDepth, typename Cursor, typename Source, typename Next, typename Use,
          typename Prologue>
__device__ __forceinline__ void stream_stages(uint4* ring, int count, Cursor first, Source&& source,
                                              Next&& next, Use&& use, Prologue&& prologue) {
  const int lane = threadIdx.x % 32;
  uint4* mine = ring + lane;
  const uint32_t mine_address = shared_address(mine);
  Cursor ahead = first, at = first;
  auto request = [&](int slot) {
#pragma unroll
    for (int c = 0; c < kStageChunks; ++c) {
      const void* src = nullptr;
      const bool valid = source(ahead, c, &src);
      cp_async_16(mine_address + (slot * kStageChunks + c) * 32 * 16, src, valid);
    }
    next(ahead);
  };
#pragma unroll
  for (int i = 0; i < kDepth - 1; ++i) {
    if (i < count) request(i);
    cp_async_commit();
  }
  prologue();
  int slot = 0;
  for (int i = 0; i < count; ++i) {
    // Refill the slot used last iteration: this lane read it into registers already.
    if (i + kDepth - 1 < count) request(slot == 0 ? kDepth - 1 : slot - 1);
    cp_async_commit();
    cp_async_wait_pending<kDepth - 1>();
    uint4 chunks[kStageChunks];
#pragma unroll
    for (int c = 0; c < kStageChunks; ++c) chunks[c] = mine[(slot * kStageChunks + c) * 32];
    use(at, chunks);
    next(at);
    slot = slot + 1 == kDepth ? 0 : slot + 1;
  }
  cp_async_wait_pending<0>();
}

// How many of `units` stages taken round-robin by `warps` warps warp `warp` gets.
__device__ __forceinline__ int stages_of_warp(int units, int warp, int warps) {
  return warp < units ? (units - warp + warps - 1) / warps : 0;
}

// The warps' partial sums of the tile's 16 rows (lanes of t == 0 hold rows g and g + 8) into
// red (warps x 16 floats), then row r's total is sum_w red[w][r], summed in warp order.
__device__ __forceinline__ void publish_partials(float* red, int warp, float lo, float hi) {
  const int lane = threadIdx.x % 32;
  if (lane % 4 == 0) {
    red[warp * kTileRows + lane / 4] = lo;
    red[warp * kTileRows + lane / 4 + 8] = hi;
  }
}
__device__ __forceinline__ float tile_row_total(const float* red, int warps, int r) {
  float s = 0.0f;
  for (int w = 0; w < warps; ++w) s += red[w * kTileRows + r];
  return s;
}

// Programmatic dependent launch (programmatic_launch.cuh): gate_up lets down launch as soon as
// every gate_up CTA has started, so down's CTAs take SMs as gate_up's last wave leaves them and
// request their first w2 stages; down waits for gate_up's completion before it reads h.

__device__ __forceinline__ int32_t local_expert(const DecodeMlpArgs& a, int64_t pair) {
  const int32_t E_local = static_cast<int32_t>(a.num_local_experts);
  return a.ids_dtype == DType::int64 ? pair_key(static_cast<const int64_t*>(a.topk_ids), pair,
                                                a.expert_map, a.num_experts, E_local)
                                     : pair_key(static_cast<const int32_t*>(a.topk_ids), pair,
                                                a.expert_map, a.num_experts, E_local);
}

// ---- the vector operands ------------------------------------------------------------------------

// gate_up's vector: token t's row of x into x_s as OperandOf<W> values (fp8: the e4m3 values as
// fp16), zero up to k_pad (whole stages), and with fp8 weights the groups' x scales into
// x_scale_s. X is x's element type: W, or with fp8 weights 16-bit rows that are quantized here
// (group-128 scales, the bits quantize_rows writes). Every thread of the CTA takes part; the
// caller synchronizes before the values are read.
template <typename W, typename X>
__device__ __forceinline__ void stage_token_row(const DecodeMlpArgs& a, int64_t t,
                                                OperandOf<W>* x_s, float* x_scale_s,
                                                int64_t k_pad) {
  constexpr bool kFp8 = std::is_same_v<W, uint8_t>;
  constexpr bool kQuantizeX = kFp8 && !std::is_same_v<X, uint8_t>;
  static_assert(kFp8 || std::is_same_v<W, X>, "16-bit weights take tokens of their own dtype");
  using Sp = Span<W>;
  const int64_t K = a.K;
  if constexpr (kQuantizeX) {
    // 8 values per thread and pass, so a group of 128 is 16 neighbouring lanes (as in
    // quantize_rows); the loads of kFillLoads passes are issued before any is used (one round
    // trip for K <= 4096 * kFillLoads / 4, not one per pass). Amax, scale and e4m3 codes
    // exactly as quantize_rows computes them; the codes as fp16 (zero past K: the loads give
    // zeros there), the scale into x_scale_s.
    const int pass = static_cast<int>(blockDim.x) * 8;
    const X* x_row = static_cast<const X*>(a.x) + t * K;
    for (int64_t base = 0; base < k_pad; base += int64_t{pass} * kFillLoads) {
      uint4 raw[kFillLoads];
#pragma unroll
      for (int i = 0; i < kFillLoads; ++i) {
        const int64_t k = base + i * pass + threadIdx.x * 8;  // K % 16 == 0: whole chunks
        raw[i] = k < K ? *reinterpret_cast<const uint4*>(x_row + k) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < kFillLoads; ++i) {
        if (base + i * pass >= k_pad) break;  // block-uniform
        const int64_t k = base + i * pass + threadIdx.x * 8;
        const X* x8 = reinterpret_cast<const X*>(&raw[i]);
        float v[8];
        uint32_t amax = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = to_float(x8[j]), amax = max(amax, abs_bits(v[j]));
#pragma unroll
        for (int offset = 8; offset > 0; offset /= 2)
          amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
        if (k >= k_pad) continue;
        const float scale = fp8_scale_for_amax(__uint_as_float(amax));
        const Fp8Reciprocal r = fp8_reciprocal(scale);
        uint32_t half2s[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          half2s[j] = e4m3x2_to_half2(e4m3_pair(v[2 * j], v[2 * j + 1], scale, r));
        *reinterpret_cast<uint4*>(x_s + k) = make_uint4(half2s[0], half2s[1], half2s[2], half2s[3]);
        if (threadIdx.x % 16 == 0) x_scale_s[k / kGroup] = scale;
      }
    }
  } else {
    // The row as 16-bit values (fp8: the e4m3 values as fp16), zero past K; fp8: the groups'
    // x scales.
    const W* x_row = static_cast<const W*>(a.x) + t * K;
    for (int64_t k = int64_t{threadIdx.x} * Sp::kValues; k < k_pad;
         k += int64_t{blockDim.x} * Sp::kValues) {
      uint32_t v[Sp::kValues / 2] = {};
      if (k < K) {
        const uint4 raw = *reinterpret_cast<const uint4*>(x_row + k);
        const uint32_t* r = reinterpret_cast<const uint32_t*>(&raw);
        if constexpr (kFp8) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            v[2 * i] = e4m3x2_to_half2(r[i] & 0xffffu);
            v[2 * i + 1] = e4m3x2_to_half2(r[i] >> 16);
          }
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) v[i] = r[i];
        }
      }
      uint4* dst = reinterpret_cast<uint4*>(x_s + k);
#pragma unroll
      for (int i = 0; i < Sp::kValues / 8; ++i)
        dst[i] = make_uint4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
    }
    if constexpr (kFp8) {
      const int64_t k_groups = ceil_div(K, kGroup);
      for (int64_t i = threadIdx.x; i < k_groups; i += blockDim.x)
        x_scale_s[i] = a.x_scale[t * k_groups + i];
    }
  }
}

// fp8: one group of 128 values of pair `pair`'s row of h (fp32, as gate_up wrote it) quantized
// by one warp — amax, scale and e4m3 codes exactly as quantize_rows computes them (NaN included:
// the bit-pattern max makes a NaN group's scale NaN), codes past N zero (the padding of the last
// group, which down's stages read) — into h_codes / h_scale.
__device__ __forceinline__ void quantize_h_group(const DecodeMlpArgs& a, int64_t pair,
                                                 int64_t grp) {
  const int lane = threadIdx.x % 32;
  const int64_t N = a.N, groups = ceil_div(N, kGroup), n_pad = groups * kGroup;
  const int64_t n = grp * kGroup + lane * 4;
  // N % 16 == 0: a lane's 4 values are all in the row or all out.
  const float4 v = n < N ? *reinterpret_cast<const float4*>(static_cast<const float*>(a.h) +
                                                            pair * N + n)
                         : make_float4(0.f, 0.f, 0.f, 0.f);
  uint32_t amax = max(max(abs_bits(v.x), abs_bits(v.y)), max(abs_bits(v.z), abs_bits(v.w)));
  amax = __reduce_max_sync(0xffffffffu, amax);
  const float scale = fp8_scale_for_amax(__uint_as_float(amax));
  const Fp8Reciprocal r = fp8_reciprocal(scale);
  const uint32_t lo = n < N ? e4m3_pair(v.x, v.y, scale, r) : 0u,
                 hi = n < N ? e4m3_pair(v.z, v.w, scale, r) : 0u;
  *reinterpret_cast<uint32_t*>(a.h_codes + pair * n_pad + n) = lo | (hi << 16);
  if (lane == 0) a.h_scale[pair * groups + grp] = scale;
}

// down's vector operands: the rows of pairs first_pair .. first_pair + rows - 1 into a2_s
// (row j at j * n_pad) as GEMM2's operand — fp8: h's codes as exact fp16 (their scales are
// folded in by the caller), else h as gate_up wrote it, in the operand dtype — zero past N and
// for pairs of no local expert (local(j) false). The loads of kFillLoads rounds are issued
// before any is used (one round trip, not one per round). Every thread of the CTA takes part;
// the caller synchronizes before the values are read.
template <typename W, typename Local>
__device__ __forceinline__ void stage_h_rows(const DecodeMlpArgs& a, int64_t first_pair, int rows,
                                             int64_t n_pad, Local&& local, OperandOf<W>* a2_s) {
  using S = OperandOf<W>;
  const int64_t N = a.N;
  const int threads = static_cast<int>(blockDim.x);
  if constexpr (std::is_same_v<W, uint8_t>) {
    // 16 codes per load.
    const int row_chunks = static_cast<int>(n_pad / 16), total = rows * row_chunks;
    for (int i0 = static_cast<int>(threadIdx.x); i0 < total; i0 += threads * kFillLoads) {
      uint4 v[kFillLoads];
#pragma unroll
      for (int r = 0; r < kFillLoads; ++r) {
        const int i = i0 + r * threads, j = i / row_chunks, c = i % row_chunks;
        const bool load = i < total && local(j);
        v[r] = load ? *reinterpret_cast<const uint4*>(a.h_codes + (first_pair + j) * n_pad +
                                                     c * 16)
                    : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int r = 0; r < kFillLoads; ++r) {
        const int i = i0 + r * threads, j = i / row_chunks, c = i % row_chunks;
        if (i >= total) break;
        const uint32_t w[4] = {v[r].x, v[r].y, v[r].z, v[r].w};
        uint32_t half2s[8];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          half2s[2 * k] = e4m3x2_to_half2(w[k] & 0xffffu);
          half2s[2 * k + 1] = e4m3x2_to_half2(w[k] >> 16);
        }
        uint4* dst = reinterpret_cast<uint4*>(a2_s + j * n_pad + c * 16);
        dst[0] = make_uint4(half2s[0], half2s[1], half2s[2], half2s[3]);
        dst[1] = make_uint4(half2s[4], half2s[5], half2s[6], half2s[7]);
      }
    }
  } else {
    // 8 values per load.
    const int row_chunks = static_cast<int>(n_pad / 8), total = rows * row_chunks;
    const S* h = static_cast<const S*>(a.h);
    for (int i0 = static_cast<int>(threadIdx.x); i0 < total; i0 += threads * kFillLoads) {
      uint4 v[kFillLoads];
#pragma unroll
      for (int r = 0; r < kFillLoads; ++r) {
        const int i = i0 + r * threads, j = i / row_chunks, n = (i % row_chunks) * 8;
        // N % 16 == 0: a load's 8 values are all in the row or all out.
        const bool load = i < total && n < N && local(j);
        v[r] = load ? *reinterpret_cast<const uint4*>(h + (first_pair + j) * N + n)
                    : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int r = 0; r < kFillLoads; ++r) {
        const int i = i0 + r * threads, j = i / row_chunks, n = (i % row_chunks) * 8;
        if (i >= total) break;
        *reinterpret_cast<uint4*>(a2_s + j * n_pad + n) = v[r];
      }
    }
  }
}

}  // namespace modmoe::cuda::decode
