// The persistent decode layer (decode_layer.h): one cooperative grid, one CTA of 16 warps per SM,
// gate_up tiles → [fp8: h quantized by the last writer of each group] → grid barrier → down
// tiles, built from the separate kernels' blocks (decode_device.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <sstream>
#include <string>

#include "cuda/activation_device.cuh"
#include "cuda/cuda_check.h"
#include "cuda/decode_device.cuh"
#include "cuda/decode_layer.h"
#include "cuda/float_io.cuh"
#include "modmoe/error.h"

namespace modmoe::cuda {
namespace {

using namespace decode;  // NOLINT: the building blocks of the kernel

constexpr int kLayerWarps = 16;
constexpr int kLayerDepth = 4;  // ring stages per warp (3 in flight while one is multiplied)
constexpr int kTilePartials = kLayerWarps * kTileRows;  // floats of one tile's warp partials
// A CTA keeps every tile's partials in shared memory until its phase ends: at most this many
// tiles per CTA per phase (beyond, the separate kernels run).
constexpr int kMaxTilesPerCta = 64;

__host__ __device__ constexpr size_t align16(size_t bytes) { return (bytes + 15) / 16 * 16; }

// What the host works out once per call: the grid, the tiles and the shared-memory layout.
struct LayerPlan {
  int ctas = 0;
  int tiles1 = 0, tiles2 = 0;      // gate_up tiles (pair, 8 features); down tiles (token, rows2)
  int per_cta1 = 0, per_cta2 = 0;  // at most, per CTA
  int rows2 = 16;                  // output rows of a down tile: 8 or 16
  size_t x_off = 0, x_scale_off = 0, scale1_off = 0, expert1_off = 0, red1_off = 0,
         quantize_off = 0, a2_off = 0, fold2_off = 0, expert2_off = 0, tile2_off = 0, red2_off = 0,
         bytes = 0;
};

LayerPlan make_plan(int64_t M, int64_t K, int64_t N, int64_t topk, size_t weight_bytes, int sms) {
  LayerPlan p;
  p.ctas = sms;
  const int64_t pairs = M * topk, span = stage_span(weight_bytes);
  const int64_t k_pad = ceil_div(K, span) * span, n_pad = ceil_div(N, span) * span;
  const int64_t k_groups = ceil_div(K, kGroup);
  const bool fp8 = weight_bytes == 1;
  const int64_t tiles1 = pairs * (N / 8);
  // The down tile's rows: whichever of 8 and 16 deals the fewer rows to the busiest CTA (ties:
  // 16, the whole MMA). gpt-oss-120b M = 1: 180 tiles of 16 on 132 SMs put 32 rows on some,
  // 360 of 8 put 24.
  const int64_t rows16 = ceil_div(M * (K / 16), sms) * 16, rows8 = ceil_div(M * (K / 8), sms) * 8;
  p.rows2 = rows8 < rows16 ? 8 : 16;
  const int64_t tiles2 = M * (K / p.rows2);
  p.tiles1 = static_cast<int>(std::min<int64_t>(tiles1, INT32_MAX));
  p.tiles2 = static_cast<int>(std::min<int64_t>(tiles2, INT32_MAX));
  p.per_cta1 = static_cast<int>(std::min<int64_t>(ceil_div(tiles1, sms), INT32_MAX));
  p.per_cta2 = static_cast<int>(std::min<int64_t>(ceil_div(tiles2, sms), INT32_MAX));
  const int64_t folds = fp8 ? ceil_div(N, kGroup) : 1;
  // The rings, then phase 1's buffers, and phase 2's over them (phase 2 writes its own only
  // after phase 1's last read).
  const size_t rings = kLayerWarps * ring_bytes_per_warp(kLayerDepth);
  size_t at = rings;
  auto take = [&](size_t& offset, int64_t bytes) {
    offset = at;
    at += align16(static_cast<size_t>(bytes));
  };
  take(p.x_off, M * k_pad * 2);
  take(p.x_scale_off, fp8 ? M * k_groups * 4 : 0);
  take(p.scale1_off, fp8 ? int64_t{p.per_cta1} * 2 * k_groups * 4 : 0);
  take(p.expert1_off, int64_t{p.per_cta1} * 3 * 4);  // expert, pair, first feature
  take(p.red1_off, int64_t{p.per_cta1} * kTilePartials * 4);
  take(p.quantize_off, fp8 ? (int64_t{p.per_cta1} + 1) * 4 : 0);
  const size_t phase1_end = at;
  at = rings;
  take(p.a2_off, pairs * n_pad * 2);
  take(p.fold2_off, int64_t{p.per_cta2} * topk * folds * 4);
  take(p.expert2_off, pairs * 4);
  take(p.tile2_off, int64_t{p.per_cta2} * 2 * 4);  // token, first row
  take(p.red2_off, int64_t{p.per_cta2} * kTilePartials * 4);
  p.bytes = std::max(phase1_end, at);
  return p;
}

// Every CTA of the grid arrives, then all go on: thread 0 of each counts itself in and waits
// until the count is the grid's. The writes before it are fenced by the threads that made them.
__device__ __forceinline__ void grid_barrier(int32_t* count) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicAdd(count, 1);
    int32_t seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
    } while (seen < static_cast<int32_t>(gridDim.x));
  }
  __syncthreads();
}

// A warp's stages of a phase: one run of the CTA's stages (tiles in order, each tile's stages in
// order), the runs of the 16 warps as even as can be. Round-robin stages (the separate kernels'
// split of one tile) measured 1.3x slower here: with tiles of fewer than 32 stages every warp
// changed tiles at almost every stage, and the lookups that a change costs were on each
// stage's path (docs/perf.md, twenty-seventh session).
struct Run {
  int first, count;
};
__device__ __forceinline__ Run run_of_warp(int stages, int warp) {
  const int first = static_cast<int>(int64_t{stages} * warp / kLayerWarps);
  const int end = static_cast<int>(int64_t{stages} * (warp + 1) / kLayerWarps);
  return {first, end - first};
}

template <typename Out>
__device__ __forceinline__ void store_out(void* out, int64_t index, float value) {
  static_cast<Out*>(out)[index] = from_float<Out>(value);
}

template <typename W>
__global__ void __launch_bounds__(kLayerWarps * 32, 1)
    decode_layer_kernel(const DecodeMlpArgs a, const LayerPlan p) {
  constexpr bool kFp8 = std::is_same_v<W, uint8_t>;
  using S = OperandOf<W>;
  using Sp = Span<W>;
  extern __shared__ float4 shared_raw[];
  char* base = reinterpret_cast<char*>(shared_raw);
  const int64_t M = a.M, K = a.K, N = a.N, topk = a.topk, pairs = M * topk;
  const int32_t E_local = static_cast<int32_t>(a.num_local_experts);
  const int ctas = static_cast<int>(gridDim.x), cta = static_cast<int>(blockIdx.x);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int threads = static_cast<int>(blockDim.x);
  uint4* ring = reinterpret_cast<uint4*>(base + warp * ring_bytes_per_warp(kLayerDepth));

  // ---- phase 1: gate_up tiles. Tile i of this CTA is the grid's tile cta + i * ctas.
  const int n1 = cta < p.tiles1 ? (p.tiles1 - cta + ctas - 1) / ctas : 0;
  const int units1 = static_cast<int>(ceil_div(K, Sp::kStage));
  const int64_t k_pad = int64_t{units1} * Sp::kStage, k_groups = ceil_div(K, kGroup);
  S* x_s = reinterpret_cast<S*>(base + p.x_off);
  float* x_scale_s = reinterpret_cast<float*>(base + p.x_scale_off);
  float* scale1_s = reinterpret_cast<float*>(base + p.scale1_off);  // per tile: gate, up scales
  // Per tile: its pair's local expert, the pair, the first of its 8 features (looked up, not
  // divided out, in the stream's per-stage arithmetic).
  int32_t* expert1_s = reinterpret_cast<int32_t*>(base + p.expert1_off);
  int32_t* pair1_s = expert1_s + p.per_cta1;
  int32_t* feature1_s = pair1_s + p.per_cta1;
  float* red1 = reinterpret_cast<float*>(base + p.red1_off);
  auto pair1 = [&](int i) { return int64_t{pair1_s[i]}; };
  auto feature1 = [&](int i) { return int64_t{feature1_s[i]}; };

  for (int i = threadIdx.x; i < n1; i += threads) {
    const int64_t tile = cta + int64_t{i} * ctas;
    pair1_s[i] = static_cast<int32_t>(tile % pairs);
    feature1_s[i] = static_cast<int32_t>(tile / pairs * 8);
    expert1_s[i] = local_expert(a, tile % pairs);
  }
  for (int i = threadIdx.x; i < n1 * kTilePartials; i += threads) red1[i] = 0.0f;
  __syncthreads();

  const W* w13 = static_cast<const W*>(a.w13);
  const int lane_k = q * Sp::kValues;
  struct Cursor1 {
    int tile, u;  // u: the stage along K
  };
  // What a stage needs of its tile is looked up when the tile changes (a few times per warp:
  // its stages are one run), not per stage.
  int source_tile = -1;
  bool source_local = false;
  const W* source_rows[2] = {w13, w13};  // this lane's rows g (gate) and g + 8 (up) at lane_k
  auto source1 = [&](const Cursor1& c, int chunk, const void** src) {
    if (c.tile != source_tile) {
      source_tile = c.tile;
      const int32_t e = expert1_s[c.tile];
      source_local = e < E_local;
      const int64_t f = feature1(c.tile) + g, first = (source_local ? int64_t{e} : 0) * 2 * N;
      source_rows[0] = w13 + (first + gate_column(a.gated_layout, f, N)) * K + lane_k;
      source_rows[1] = w13 + (first + up_column(a.gated_layout, f, N)) * K + lane_k;
    }
    const int k = c.u * Sp::kStage + (chunk / 2) * Sp::kStep;
    const bool valid = source_local && k + lane_k < K;
    *src = valid ? static_cast<const void*>(source_rows[chunk % 2] + k) : a.w13;
    return valid;
  };
  auto next1 = [&](Cursor1& c) {
    if (++c.u == units1) c.u = 0, ++c.tile;
  };
  auto prologue1 = [&] {
    if constexpr (kFp8) {
      // The w13 scales of each tile's gate and up blocks, per group of K.
      const int64_t row_blocks = ceil_div(2 * N, kGroup);
      for (int64_t i = threadIdx.x; i < n1 * k_groups; i += threads) {
        const int tile = static_cast<int>(i / k_groups);
        const int64_t kg = i % k_groups, f = feature1(tile);
        const int32_t e = expert1_s[tile];
        if (e >= E_local) continue;
        const float* ws = a.w13_scale + int64_t{e} * row_blocks * k_groups;
        scale1_s[tile * 2 * k_groups + kg] =
            ws[gate_column(a.gated_layout, f, N) / kGroup * k_groups + kg];
        scale1_s[tile * 2 * k_groups + k_groups + kg] =
            ws[up_column(a.gated_layout, f, N) / kGroup * k_groups + kg];
      }
    }
    // Every token's row: the tiles of all pairs meet in this CTA.
    for (int64_t t = 0; t < M; ++t) {
      S* x_row = x_s + t * k_pad;
      float* scales = x_scale_s + t * k_groups;
      if constexpr (kFp8) {
        switch (a.x_dtype) {
          case DType::bf16:
            stage_token_row<W, __nv_bfloat16>(a, t, x_row, scales, k_pad);
            break;
          case DType::fp16:
            stage_token_row<W, __half>(a, t, x_row, scales, k_pad);
            break;
          default:
            stage_token_row<W, W>(a, t, x_row, scales, k_pad);
            break;
        }
      } else {
        stage_token_row<W, W>(a, t, x_row, scales, k_pad);
      }
    }
    __syncthreads();
  };
  float acc_gate = 0.0f, acc_up = 0.0f;
  int acc_tile = -1;  // the tile the sums above belong to
  bool use_local = false;
  const S* use_x = x_s;               // the tile's token row at lane_k
  const float* use_x_scale = x_scale_s;  // fp8: the token row's scales
  const float* use_w_scale = scale1_s;   // fp8: the tile's gate scales, then its up scales
  auto use1 = [&](const Cursor1& c, const uint4(&chunks)[kStageChunks]) {
    if (c.tile != acc_tile) {
      use_local = expert1_s[c.tile] < E_local;
      if (!use_local) return;  // warp-uniform; its h is never read
      if (acc_tile >= 0) publish_partials(red1 + acc_tile * kTilePartials, warp, acc_gate, acc_up);
      acc_gate = acc_up = 0.0f;
      acc_tile = c.tile;
      const int64_t t = pair1(c.tile) / topk;
      use_x = x_s + t * k_pad + lane_k;
      use_x_scale = x_scale_s + t * k_groups;
      use_w_scale = scale1_s + c.tile * 2 * k_groups;
    }
    float d[4];
    stage_product<W>(d, chunks, use_x + c.u * Sp::kStage);
    if constexpr (kFp8) {
      const float xs = use_x_scale[c.u];
      acc_gate = fmaf(d[0], xs * use_w_scale[c.u], acc_gate);
      acc_up = fmaf(d[2], xs * use_w_scale[k_groups + c.u], acc_up);
    } else {
      acc_gate += d[0];
      acc_up += d[2];
    }
  };
  const Run run1 = run_of_warp(n1 * units1, warp);
  stream_stages<kLayerDepth>(ring, run1.count, Cursor1{run1.first / units1, run1.first % units1},
                             source1, next1, use1, prologue1);
  if (acc_tile >= 0) publish_partials(red1 + acc_tile * kTilePartials, warp, acc_gate, acc_up);
  __syncthreads();

  // h: fp32 for fp8 weights (quantized below), else down's 16-bit operand.
  for (int i = threadIdx.x; i < n1 * 8; i += threads) {
    const int tile = i / 8, f = i % 8;
    if (expert1_s[tile] >= E_local) continue;
    const float* red = red1 + tile * kTilePartials;
    const float value = gated_function(a.activation, tile_row_total(red, kLayerWarps, f),
                                       tile_row_total(red, kLayerWarps, f + 8));
    const int64_t at = pair1(tile) * N + feature1(tile) + f;
    if constexpr (kFp8) {
      static_cast<float*>(a.h)[at] = value;
    } else {
      static_cast<S*>(a.h)[at] = from_float<S>(value);
    }
  }

  if constexpr (kFp8) {
    // Each tile counts itself into its (pair, group of 128 of h); the CTA whose count completes
    // a group quantizes it. The h writes are fenced before the counts (every writer fences,
    // then the CTA synchronizes), and the quantizing CTA fences after it saw the count.
    const int64_t groups = ceil_div(N, kGroup);
    int32_t* to_quantize = reinterpret_cast<int32_t*>(base + p.quantize_off);  // [0]: how many
    if (threadIdx.x == 0) to_quantize[0] = 0;
    __threadfence();
    __syncthreads();
    for (int tile = threadIdx.x; tile < n1; tile += threads) {
      if (expert1_s[tile] >= E_local) continue;
      const int64_t pair = pair1(tile), grp = feature1(tile) / kGroup;
      const int need = static_cast<int>((std::min(N, (grp + 1) * kGroup) - grp * kGroup) / 8);
      if (atomicAdd(a.counters + 1 + pair * groups + grp, 1) == need - 1) {
        __threadfence();
        to_quantize[1 + atomicAdd(to_quantize, 1)] = static_cast<int32_t>(pair * groups + grp);
      }
    }
    __syncthreads();
    for (int i = warp; i < to_quantize[0]; i += kLayerWarps) {
      const int32_t task = to_quantize[1 + i];
      quantize_h_group(a, task / groups, task % groups);
    }
  }

  __syncthreads();  // phase 1's shared memory is read for the last time above: phase 2's now

  // ---- phase 2: down tiles (token t, rows k0 .. k0 + rows2 - 1), tile i = cta + i * ctas.
  const int n2 = cta < p.tiles2 ? (p.tiles2 - cta + ctas - 1) / ctas : 0;
  const int n_stages = static_cast<int>(ceil_div(N, Sp::kStage));
  const int64_t n_pad = int64_t{n_stages} * Sp::kStage;
  const int folds = kFp8 ? n_stages : 1;  // per pair (fp8: a stage is a scale group)
  const int rows2 = p.rows2;
  S* a2_s = reinterpret_cast<S*>(base + p.a2_off);
  float* fold2_s = reinterpret_cast<float*>(base + p.fold2_off);
  int32_t* expert2_s = reinterpret_cast<int32_t*>(base + p.expert2_off);  // per pair
  int32_t* token2_s = reinterpret_cast<int32_t*>(base + p.tile2_off);     // per tile
  int32_t* row2_s = token2_s + p.per_cta2;
  float* red2 = reinterpret_cast<float*>(base + p.red2_off);
  auto token2 = [&](int i) { return int64_t{token2_s[i]}; };
  auto row2 = [&](int i) { return int64_t{row2_s[i]}; };

  for (int64_t i = threadIdx.x; i < pairs; i += threads) expert2_s[i] = local_expert(a, i);
  for (int i = threadIdx.x; i < n2; i += threads) {
    const int64_t tile = cta + int64_t{i} * ctas;
    token2_s[i] = static_cast<int32_t>(tile % M);
    row2_s[i] = static_cast<int32_t>(tile / M * rows2);
  }
  for (int i = threadIdx.x; i < n2 * kTilePartials; i += threads) red2[i] = 0.0f;
  __syncthreads();
  // The folds start as the router weight (fp8: times the w2 scale of the tile's row block);
  // the h scales multiply in after the barrier.
  for (int64_t i = threadIdx.x; i < int64_t{n2} * topk * folds; i += threads) {
    const int tile = static_cast<int>(i / (topk * folds));
    const int64_t j = i / folds % topk, grp = i % folds, pair = token2(tile) * topk + j;
    const int32_t e = expert2_s[pair];
    float fold = a.topk_weights ? a.topk_weights[pair] : 1.0f;
    if (kFp8 && e < E_local)
      fold *= a.w2_scale[(int64_t{e} * ceil_div(K, kGroup) + row2(tile) / kGroup) * folds + grp];
    fold2_s[i] = fold;
  }

  const W* w2 = static_cast<const W*>(a.w2);
  const int lane_n = q * Sp::kValues;
  struct Cursor2 {
    int tile, j, stage;  // j: the token's pair; stage: along N
  };
  int source_tile2 = -1, source_j = -1;
  const W* source_row = w2;  // this lane's row g of the tile in the pair's expert, at lane_n
  auto source2 = [&](const Cursor2& c, int chunk, const void** src) {
    if (c.tile != source_tile2 || c.j != source_j) {
      source_tile2 = c.tile, source_j = c.j;
      const int32_t e = expert2_s[token2(c.tile) * topk + c.j];
      source_local = e < E_local;
      source_row = w2 + ((source_local ? int64_t{e} : 0) * K + row2(c.tile) + g) * N + lane_n;
    }
    const int n = c.stage * Sp::kStage + (chunk / 2) * Sp::kStep;
    const int half = chunk % 2;  // rows g or g + 8 of the tile
    const bool valid = source_local && n + lane_n < N && (half == 0 || rows2 == 16);
    *src = valid ? static_cast<const void*>(source_row + half * 8 * N + n) : a.w2;
    return valid;
  };
  auto next2 = [&](Cursor2& c) {
    if (++c.stage == n_stages) {
      c.stage = 0;
      if (++c.j == topk) c.j = 0, ++c.tile;
    }
  };
  auto prologue2 = [&] {
    // The first w2 stages are on their way: now wait for every CTA's h.
    grid_barrier(a.counters);
    stage_h_rows<W>(a, 0, static_cast<int>(pairs), n_pad,
                    [&](int j) { return expert2_s[j] < E_local; }, a2_s);
    if constexpr (kFp8) {
      for (int64_t i = threadIdx.x; i < int64_t{n2} * topk * folds; i += threads) {
        const int tile = static_cast<int>(i / (topk * folds));
        const int64_t j = i / folds % topk, grp = i % folds, pair = token2(tile) * topk + j;
        if (expert2_s[pair] < E_local) fold2_s[i] *= __ldcg(a.h_scale + pair * folds + grp);
      }
    }
    __syncthreads();
  };
  float acc_lo = 0.0f, acc_hi = 0.0f;
  acc_tile = -1;
  int use_j = -1;
  const S* use_a2 = a2_s;         // the pair's operand row at lane_n
  const float* use_fold = fold2_s;  // the (tile, pair)'s folds
  auto use2 = [&](const Cursor2& c, const uint4(&chunks)[kStageChunks]) {
    if (c.tile != acc_tile || c.j != use_j) {
      const int64_t pair = token2(c.tile) * topk + c.j;
      use_local = expert2_s[pair] < E_local;
      if (!use_local) return;  // warp-uniform; its chunks were zero-filled
      use_j = c.j;
      if (c.tile != acc_tile) {
        if (acc_tile >= 0) publish_partials(red2 + acc_tile * kTilePartials, warp, acc_lo, acc_hi);
        acc_lo = acc_hi = 0.0f;
        acc_tile = c.tile;
      }
      use_a2 = a2_s + pair * n_pad + lane_n;
      use_fold = fold2_s + (c.tile * topk + c.j) * folds;
    }
    float d[4];
    stage_product<W>(d, chunks, use_a2 + c.stage * Sp::kStage);
    const float fold = use_fold[kFp8 ? c.stage : 0];
    acc_lo = fmaf(d[0], fold, acc_lo);
    acc_hi = fmaf(d[2], fold, acc_hi);
  };
  const int units2 = static_cast<int>(topk) * n_stages;
  const Run run2 = run_of_warp(n2 * units2, warp);
  stream_stages<kLayerDepth>(ring, run2.count,
                             Cursor2{run2.first / units2, run2.first % units2 / n_stages,
                                     run2.first % n_stages},
                             source2, next2, use2, prologue2);
  if (acc_tile >= 0) publish_partials(red2 + acc_tile * kTilePartials, warp, acc_lo, acc_hi);
  __syncthreads();

  for (int i = threadIdx.x; i < n2 * rows2; i += threads) {
    const int tile = i / rows2, r = i % rows2;
    const float total = tile_row_total(red2 + tile * kTilePartials, kLayerWarps, r);
    const int64_t at = token2(tile) * K + row2(tile) + r;
    switch (a.out_dtype) {
      case DType::fp32:
        store_out<float>(a.out, at, total);
        break;
      case DType::fp16:
        store_out<__half>(a.out, at, total);
        break;
      default:
        store_out<__nv_bfloat16>(a.out, at, total);
        break;
    }
  }
}

template <typename F>
void with_kernel(DType w, F&& f) {
  switch (w) {
    case DType::bf16:
      return f(decode_layer_kernel<__nv_bfloat16>);
    case DType::fp16:
      return f(decode_layer_kernel<__half>);
    case DType::fp8_e4m3:
      return f(decode_layer_kernel<uint8_t>);
    default:
      MODMOE_FAIL() << "decode_layer: weights must be bf16, fp16 or fp8_e4m3, got "
                    << dtype_name(w);
  }
}

struct DeviceFacts {
  int sms = 0, cooperative = 0;
  size_t per_block = 0;
};
DeviceFacts device_facts() {
  int device = 0, sms = 0, cooperative = 0, per_block = 0;
  MODMOE_CUDA_CHECK(cudaGetDevice(&device));
  MODMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  MODMOE_CUDA_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
  MODMOE_CUDA_CHECK(
      cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return {sms, cooperative, static_cast<size_t>(per_block)};
}

// The plan, and whether one CTA of it fits on an SM (it must, for the cooperative launch).
std::string plan_for(int64_t M, int64_t K, int64_t N, int64_t topk, DType w_dtype,
                     LayerPlan* plan) {
  std::ostringstream why;
  const DeviceFacts d = device_facts();
  if (!d.cooperative) return "the device does not support cooperative launches";
  *plan = make_plan(M, K, N, topk, dtype_size(w_dtype), d.sms);
  if (plan->per_cta1 > kMaxTilesPerCta || plan->per_cta2 > kMaxTilesPerCta) {
    why << "more than " << kMaxTilesPerCta << " tiles per CTA (gate_up " << plan->per_cta1
        << ", down " << plan->per_cta2 << " on " << d.sms << " SMs)";
  } else if (plan->bytes > d.per_block) {
    why << "its shared memory (" << plan->bytes << " bytes) exceeds the device's " << d.per_block
        << " per CTA";
  } else {
    with_kernel(w_dtype, [&](auto kernel) {
      MODMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(plan->bytes)));
      int per_sm = 0;
      MODMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, kernel, kLayerWarps * 32, plan->bytes));
      if (per_sm < 1) why << "one CTA of " << kLayerWarps << " warps does not fit on an SM";
    });
  }
  return why.str();
}

}  // namespace

int64_t decode_layer_counters(int64_t M, int64_t topk, int64_t N, bool fp8_weights) {
  return 1 + (fp8_weights ? M * topk * ceil_div(N, kGroup) : 0);
}

std::string decode_layer_unsupported(int64_t M, int64_t K, int64_t N, int64_t topk,
                                     DType w_dtype) {
  LayerPlan plan;
  return plan_for(M, K, N, topk, w_dtype, &plan);
}

std::string decode_layer_unsupported(const DecodeMlpArgs& a) {
  if (a.counters == nullptr) return "counters is null (carve_decode_workspace)";
  LayerPlan plan;
  return plan_for(a.M, a.K, a.N, a.topk, a.w_dtype, &plan);
}

void decode_layer(const DecodeMlpArgs& a, cudaStream_t stream) {
  if (a.M == 0) return;
  MODMOE_CHECK(a.counters != nullptr) << "decode_layer: counters is null (carve_decode_workspace)";
  LayerPlan plan;
  const std::string why = plan_for(a.M, a.K, a.N, a.topk, a.w_dtype, &plan);
  MODMOE_CHECK(why.empty()) << "decode_layer: cannot run K = " << a.K << ", N = " << a.N
                            << ", topk = " << a.topk << ", M = " << a.M << ": " << why;
  const bool fp8 = a.w_dtype == DType::fp8_e4m3;
  MODMOE_CUDA_CHECK(cudaMemsetAsync(
      a.counters, 0,
      static_cast<size_t>(decode_layer_counters(a.M, a.topk, a.N, fp8)) * sizeof(int32_t),
      stream));
  with_kernel(a.w_dtype, [&](auto kernel) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(plan.ctas));
    config.blockDim = dim3(kLayerWarps * 32);
    config.dynamicSmemBytes = plan.bytes;
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeCooperative;
    attribute[0].val.cooperative = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    MODMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, a, plan));
  });
}

}  // namespace modmoe::cuda
