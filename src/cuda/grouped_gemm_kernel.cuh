// The portable grouped GEMM kernel: D[rows of e] = A[rows of e] * B[e]^T for every expert e,
// with the rows of each expert read from the device (m_indptr or expert_num_tokens).
//
// One kernel body, templated on the CTA tile, the operand type and how fp8 scales are
// applied. Read top to bottom:
//   1. schedule: every CTA reads the per-expert row counts once, turns them into tile counts
//      (ceil(rows / BLOCK_M) * n_tiles) and prefix-sums them in shared memory; a linear tile
//      id then maps to (expert, m-tile, n-tile) by a binary search and a banded raster (bands
//      of 512 rows, m fastest inside a band) so CTAs running together share A and B tiles in
//      L2. The grid is persistent: a CTA walks tile ids blockIdx.x, + gridDim.x, ...
//   2. per tile: the source row of each A row (the a_row_index gather, -1 past the expert's
//      end) and the B row behind each of the tile's B rows (gated: gate and up rows
//      interleaved, see below) go to shared memory.
//   3. mainloop: a runtime-depth (4, or 3 where shared memory is short) cp.async ring of 128-byte-wide K slices of A and B
//      (XOR-swizzled 16-byte chunks: conflict-free cp.async stores and ldmatrix loads),
//      ldmatrix fragments, mma.sync into fp32 accumulators. Loads past an expert's rows, past
//      N_b or past K are zero-filled, never issued.
//      fp8_block: each 128-wide K slice (= one scale block) is accumulated from zero and then
//      promoted into the main accumulator with a_scale(row) * b_scale(column); mxfp8 does the
//      same for every 32-wide MMA step. Those per-slice scales travel through the same ring
//      (loaded into registers one slice early, stored to shared memory one iteration later).
//   4. epilogue: per-tensor / per-token scales, the gated activation, conversion to the output
//      dtype, staged through shared memory so every row is written in 16-byte stores; rows
//      past the expert's end and columns past N_out are not written.
//
// Gated mode costs nothing extra in the mainloop: tile B row 2i is the gate row and 2i+1 the
// up row of output column n0 + i. An mma accumulator fragment holds two adjacent columns per
// thread, so each thread ends with (gate, up) pairs for the same row and output column.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/fp8_codec.cuh"
#include "cuda/grouped_gemm_ptx.cuh"

namespace modmoe::cuda::gemm {

enum class Operand : int { bf16, fp16, e4m3 };

// Where fp8 scales enter: none (16-bit operands), in the epilogue (per-tensor, per-token /
// per-channel), per 128-wide K block (fp8_block) or per 32-wide K group (mxfp8).
enum class ScaleMode : int { none, epilogue, block128, mx32 };

// Runtime values of the kernel. Enums of the public API travel as ints: the host maps them.
struct Params {
  const uint8_t* A;
  int64_t lda_bytes;
  const int32_t* a_row_index;
  const uint8_t* B;
  int64_t b_expert_bytes;  // N_b * K * element size
  int32_t b_row_bytes;     // K * element size
  int32_t E, N_b, N_out;
  int32_t k_bytes, num_k_tiles, n_tiles;  // n_tiles: tiles along N_out per expert

  const int32_t* m_indptr;
  const int32_t* expert_num_tokens;
  int32_t batch_rows;

  int32_t per_token_scales;  // ScaleMode::epilogue: 1 fp8_token, 0 fp8_tensor
  const void* a_scale;
  const void* b_scale;
  int32_t k_groups;      // block128 / mx32: scale groups along K
  int32_t b_row_blocks;  // block128: ceil(N_b / 128)

  int32_t gated;
  int32_t activation;    // 0 silu, 1 gelu (erf), 2 gelu_tanh, 3 swigluoai
  int32_t gated_layout;  // 0 GateUp, 1 UpGate, 2 Interleaved
  void* D;
  int64_t ldd;
  int32_t d_dtype;      // 0 bf16, 1 fp16, 2 fp32
  int32_t d_vector_ok;  // D and ldd allow 16-byte row stores
  int32_t num_stages;   // kMinStages .. kMaxStages (cp_async_wait handles up to 6)
};

constexpr int kActSilu = 0, kActGelu = 1, kActGeluTanh = 2, kActSwigluOai = 3;
constexpr int kLayoutGateUp = 0, kLayoutUpGate = 1, kLayoutInterleaved = 2;
constexpr int kOutBf16 = 0, kOutFp16 = 1, kOutFp32 = 2;
constexpr int kMinStages = 3, kMaxStages = 6;
constexpr int kSliceBytes = 128;  // K bytes per stage row: 64 bf16/fp16 or 128 fp8 elements
constexpr int kRasterRows = 512;  // rows of an expert whose tiles are walked together

template <int BLOCK_M_, int BLOCK_N_, int WARPS_M_, int WARPS_N_, int MIN_BLOCKS_, int STEP_UNROLL_>
struct TileConfig {
  static constexpr int kMinBlocksPerSm = MIN_BLOCKS_;  // caps registers (__launch_bounds__)
  static constexpr int kStepUnroll = STEP_UNROLL_;     // MMA steps of a slice unrolled
  static constexpr int BLOCK_M = BLOCK_M_, BLOCK_N = BLOCK_N_;  // rows x B rows
  static constexpr int WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  static constexpr int kThreads = 32 * WARPS_M * WARPS_N;
  static constexpr int WARP_M = BLOCK_M / WARPS_M, WARP_N = BLOCK_N / WARPS_N;
  static constexpr int MMA_M = WARP_M / 16, MMA_N = WARP_N / 8;  // mma tiles per warp
  static constexpr int kChunksPerRow = kSliceBytes / 16;
  static constexpr int kAChunksPerThread = BLOCK_M * kChunksPerRow / kThreads;
  static constexpr int kBChunksPerThread = BLOCK_N * kChunksPerRow / kThreads;
  static_assert(WARP_M % 16 == 0 && WARP_N % 16 == 0, "warp tile: whole m16 and pairs of n8");
  static_assert(BLOCK_M * kChunksPerRow % kThreads == 0, "A chunks spread evenly");
  static_assert(BLOCK_N * kChunksPerRow % kThreads == 0, "B chunks spread evenly");
  static_assert(kThreads % kChunksPerRow == 0, "a thread keeps one chunk column");
  static_assert(BLOCK_M <= kThreads && BLOCK_N <= kThreads, "one table entry per thread");
};

using TileLarge = TileConfig<64, 128, 2, 2, 2, 4>;
// fp8 keeps a second (partial) accumulator and, on sm90, widens fragments to fp16 for the
// MMA: with 4 warps of 32 x 64 it would spill, so its prefill tile uses 8 warps of 32 x 32.
using TileLargeFp8 = TileConfig<64, 128, 2, 4, 1, 2>;
using TileSmall = TileConfig<16, 64, 1, 4, 3, 4>;

// Scale groups per 128-byte K slice (fp8: 128 elements).
template <ScaleMode SM>
constexpr int slice_scale_groups() {
  return SM == ScaleMode::block128 ? 1 : SM == ScaleMode::mx32 ? 4 : 0;
}

template <class Tile, ScaleMode SM>
struct SmemLayout {
  static constexpr int kABytes = Tile::BLOCK_M * kSliceBytes;  // (BLOCK_M, 128 B) swizzled
  static constexpr int kBBytes = Tile::BLOCK_N * kSliceBytes;  // (BLOCK_N, 128 B) swizzled
  // fp32 scales of the slice: A (G, BLOCK_M) then B (G, BLOCK_N), G = slice_scale_groups.
  static constexpr int kScaleEntries = slice_scale_groups<SM>() * (Tile::BLOCK_M + Tile::BLOCK_N);
  static constexpr int kScaleBytes = kScaleEntries * 4;
  static constexpr int kStageBytes = (kABytes + kBBytes + kScaleBytes + 127) / 128 * 128;
  // Epilogue staging (reuses the ring): (BLOCK_M, BLOCK_N fp32 + 16 B pad) at most.
  static constexpr int kStagingPitchMax = Tile::BLOCK_N * 4 + 16;
  static_assert(Tile::BLOCK_M * kStagingPitchMax <= kMinStages * kStageBytes,
                "the output tile fits in the pipeline ring");
  // Schedule tables after the ring: tile_start (E + 1 ints, padded to 8 bytes), then the
  // rows of each expert (E int2). The host sizes them with the same formula.
  static __host__ __device__ int64_t schedule_offset_pad(int E) {
    return (int64_t(E) + 1 + 1) / 2 * 8;
  }
};

// ---- small device helpers ------------------------------------------------------------------

// Byte offset of 16-byte chunk `chunk` of row `row` in a (rows, 128 B) tile: chunks are
// XOR-swizzled by row % 8, so the 8 rows an ldmatrix reads sit in 8 distinct bank groups.
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  return static_cast<uint32_t>(row * kSliceBytes + ((chunk ^ (row & 7)) << 4));
}

// gate_column / up_column of activation.h, on the device.
__device__ __forceinline__ int gate_row(int layout, int j, int N) {
  return layout == kLayoutGateUp ? j : layout == kLayoutUpGate ? N + j : 2 * j;
}
__device__ __forceinline__ int up_row(int layout, int j, int N) {
  return layout == kLayoutGateUp ? N + j : layout == kLayoutUpGate ? j : 2 * j + 1;
}

// activation_gated of activation.h in fp32 (same formulas; std::min/max NaN behaviour kept:
// a NaN gate or up stays NaN).
__device__ __forceinline__ float activation_gated_device(int act, float gate, float up) {
  float g;
  switch (act) {
    case kActGelu:
      g = 0.5f * gate * (1.0f + erff(gate * 0.70710678118654752f));
      break;
    case kActGeluTanh: {
      const float c = 0.79788456080286536f;
      g = 0.5f * gate * (1.0f + tanhf(c * (gate + 0.044715f * gate * gate * gate)));
      break;
    }
    case kActSwigluOai: {
      const float x = 7.0f < gate ? 7.0f : gate;  // std::min(gate, 7)
      g = x / (1.0f + expf(-1.702f * x));
      up = 7.0f < up ? 7.0f : up;    // std::min(up, 7)
      up = up < -7.0f ? -7.0f : up;  // std::max(.., -7)
      return g * (up + 1.0f);
    }
    default:
      g = gate / (1.0f + expf(-gate));
      break;  // silu
  }
  return g * up;
}

template <Operand OP>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                    const float (&c)[4]) {
  if constexpr (OP == Operand::bf16) {
    mma_bf16_16816(d, a, b, c);
  } else if constexpr (OP == Operand::fp16) {
    mma_fp16_16816(d, a, b, c);
  } else {
    mma_e4m3_16832(d, a, b, c);
  }
}

// Inclusive prefix sum over a warp.
__device__ __forceinline__ int warp_inclusive_scan(int v, int lane) {
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int other = __shfl_up_sync(0xffffffffu, v, offset);
    if (lane >= offset) v += other;
  }
  return v;
}

// ---- the kernel ----------------------------------------------------------------------------

template <class Tile, Operand OP, ScaleMode SM>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocksPerSm)
    grouped_gemm_kernel(const Params p) {
  using Smem = SmemLayout<Tile, SM>;
  constexpr int BLOCK_M = Tile::BLOCK_M, BLOCK_N = Tile::BLOCK_N, kThreads = Tile::kThreads;
  constexpr int MMA_M = Tile::MMA_M, MMA_N = Tile::MMA_N;
  constexpr int kGroups = slice_scale_groups<SM>();
  constexpr bool kSliceScales = kGroups > 0;
  constexpr int kScalesPerThread = (Smem::kScaleEntries + kThreads - 1) / kThreads;
  constexpr int kBandTiles = kRasterRows / BLOCK_M;  // m-tiles per raster band

  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int s_row_src[BLOCK_M];  // A source row of each tile row, -1 past the expert
  __shared__ int s_b_row[BLOCK_N];    // B row (in the expert) of each tile B row, -1 past N
  __shared__ int s_warp_sums[32];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / Tile::WARPS_N, warp_n = warp % Tile::WARPS_N;
  const int num_stages = p.num_stages;
  const int E = p.E;

  // (E + 1) exclusive tile prefix, then each expert's logical rows [begin, end).
  int* tile_start = reinterpret_cast<int*>(smem + int64_t(num_stages) * Smem::kStageBytes);
  int2* expert_rows = reinterpret_cast<int2*>(smem + int64_t(num_stages) * Smem::kStageBytes +
                                              Smem::schedule_offset_pad(E));

  // ---- 1. schedule ----
  {
    const int per_thread = (E + kThreads - 1) / kThreads;
    const int first = min(tid * per_thread, E), last = min(first + per_thread, E);
    int sum = 0;
    for (int e = first; e < last; ++e) {
      int begin, end;
      if (p.m_indptr != nullptr) {
        begin = __ldg(p.m_indptr + e);
        end = max(begin, __ldg(p.m_indptr + e + 1));
      } else {
        begin = e * p.batch_rows;
        end = begin + min(max(__ldg(p.expert_num_tokens + e), 0), p.batch_rows);
      }
      expert_rows[e] = make_int2(begin, end);
      const int tiles = (end - begin + BLOCK_M - 1) / BLOCK_M * p.n_tiles;
      tile_start[e] = tiles;  // the count for now; the prefix below
      sum += tiles;
    }
    const int inclusive = warp_inclusive_scan(sum, lane);
    if (lane == 31) s_warp_sums[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
      constexpr int kWarps = kThreads / 32;
      const int v = lane < kWarps ? s_warp_sums[lane] : 0;
      const int scanned = warp_inclusive_scan(v, lane);
      __syncwarp();
      if (lane < kWarps) s_warp_sums[lane] = scanned;
    }
    __syncthreads();
    int offset = (warp > 0 ? s_warp_sums[warp - 1] : 0) + inclusive - sum;
    for (int e = first; e < last; ++e) {
      const int count = tile_start[e];
      tile_start[e] = offset;
      offset += count;
    }
    if (tid == kThreads - 1) tile_start[E] = offset;  // the last thread ends at the total
    __syncthreads();
  }
  const int total_tiles = tile_start[E];

  const int chunk = tid % Tile::kChunksPerRow;          // this thread's 16-byte column
  const int row_step = kThreads / Tile::kChunksPerRow;  // rows between a thread's chunks
  const int first_row = tid / Tile::kChunksPerRow;

  for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    // The owning expert: the last e with tile_start[e] <= tile (it is never empty).
    int lo = 0, hi = E - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (tile_start[mid] <= tile) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int e = lo;
    const int local = tile - tile_start[e];
    const int2 rows = expert_rows[e];
    // Raster inside the expert: bands of kRasterRows rows, m fastest within a band, then n.
    // CTAs running together then share both B tiles (across the band's m-tiles) and A tiles
    // (across its n-tiles) in L2. N fastest over all rows would stream the expert's whole B
    // from HBM once per m-tile; m fastest over all rows, its whole A once per n-tile.
    const int m_tiles = (rows.y - rows.x + BLOCK_M - 1) / BLOCK_M;
    const int band = local / (kBandTiles * p.n_tiles);
    const int band_m = min(kBandTiles, m_tiles - band * kBandTiles);  // m-tiles in this band
    const int in_band = local - band * kBandTiles * p.n_tiles;
    const int n_tile = in_band / band_m;
    const int m_tile = band * kBandTiles + (in_band - n_tile * band_m);
    const int m0 = rows.x + m_tile * BLOCK_M;
    const int rows_valid = min(BLOCK_M, rows.y - m0);
    const int out_cols = p.gated ? BLOCK_N / 2 : BLOCK_N;  // output columns per tile
    const int n0_out = n_tile * out_cols;

    // ---- 2. row tables (after every warp has left the previous tile's epilogue) ----
    __syncthreads();
    if (tid < BLOCK_M) {
      int src = -1;
      if (tid < rows_valid) src = p.a_row_index ? __ldg(p.a_row_index + m0 + tid) : m0 + tid;
      s_row_src[tid] = src;
    }
    if (tid < BLOCK_N) {
      int b_row = -1;
      if (p.gated) {
        const int j = n0_out + (tid >> 1);
        if (j < p.N_out) {
          b_row =
              (tid & 1) ? up_row(p.gated_layout, j, p.N_out) : gate_row(p.gated_layout, j, p.N_out);
        }
      } else if (n0_out + tid < p.N_b) {
        b_row = n0_out + tid;
      }
      s_b_row[tid] = b_row;
    }
    __syncthreads();

    // This thread's cp.async sources: a row start (nullptr: zero-fill) per A chunk, a byte
    // offset in the expert's B (-1: zero-fill) per B chunk.
    const uint8_t* b_expert = p.B + int64_t(e) * p.b_expert_bytes;
    const uint8_t* a_src[Tile::kAChunksPerThread];
    int b_off[Tile::kBChunksPerThread];
#pragma unroll
    for (int i = 0; i < Tile::kAChunksPerThread; ++i) {
      const int src = s_row_src[first_row + i * row_step];
      a_src[i] = src >= 0 ? p.A + int64_t(src) * p.lda_bytes + chunk * 16 : nullptr;
    }
#pragma unroll
    for (int i = 0; i < Tile::kBChunksPerThread; ++i) {
      const int b_row = s_b_row[first_row + i * row_step];
      b_off[i] = b_row >= 0 ? b_row * p.b_row_bytes + chunk * 16 : -1;
    }

    auto stage_ptr = [&](int slot) { return smem + slot * Smem::kStageBytes; };

    // One 128-byte K slice of A and B into ring slot `slot` (one cp.async group).
    auto load_slice = [&](int k_tile, int slot) {
      const int k_byte = k_tile * kSliceBytes + chunk * 16;
      const bool k_ok = k_byte < p.k_bytes;  // k_bytes % 16 == 0: a chunk is all in or all out
      const uint32_t a_dst = shared_address(stage_ptr(slot));
      const uint32_t b_dst = a_dst + Smem::kABytes;
#pragma unroll
      for (int i = 0; i < Tile::kAChunksPerThread; ++i) {
        const bool ok = k_ok && a_src[i] != nullptr;
        cp_async_16(a_dst + swizzled(first_row + i * row_step, chunk),
                    ok ? a_src[i] + k_tile * kSliceBytes : p.A, ok);
      }
#pragma unroll
      for (int i = 0; i < Tile::kBChunksPerThread; ++i) {
        const bool ok = k_ok && b_off[i] >= 0;
        cp_async_16(b_dst + swizzled(first_row + i * row_step, chunk),
                    ok ? b_expert + b_off[i] + k_tile * kSliceBytes : p.B, ok);
      }
    };

    // Slice scales (block128 / mx32): this thread's entries of the (G, BLOCK_M) + (G, BLOCK_N)
    // table of a slice (SmemLayout), entry tid + i * kThreads. Per entry: where its row's or
    // column's K groups start (nullptr: no such row / column, the scale is 0: its partial
    // sums are 0 too, and a 0 scale keeps garbage from turning them into NaN), and which
    // group of the slice it is.
    constexpr int kScaleSlots = kScalesPerThread > 0 ? kScalesPerThread : 1;
    [[maybe_unused]] const uint8_t* scale_src[kScaleSlots];
    [[maybe_unused]] int scale_group[kScaleSlots];
    if constexpr (kSliceScales) {
      constexpr int kScaleBytesEach = SM == ScaleMode::block128 ? 4 : 1;
#pragma unroll
      for (int i = 0; i < kScalesPerThread; ++i) {
        const int entry = tid + i * kThreads;
        const uint8_t* src = nullptr;
        int g = 0;
        if (entry < kGroups * BLOCK_M) {
          g = entry / BLOCK_M;
          const int row = s_row_src[entry - g * BLOCK_M];
          if (row >= 0) {
            src = static_cast<const uint8_t*>(p.a_scale) +
                  int64_t(row) * p.k_groups * kScaleBytesEach;
          }
        } else if (entry < Smem::kScaleEntries) {
          const int b_entry = entry - kGroups * BLOCK_M;
          g = b_entry / BLOCK_N;
          const int b_row = s_b_row[b_entry - g * BLOCK_N];
          if (b_row >= 0) {
            // block128: (E, ceil(N_b / 128), groups) fp32; mx32: (E, N_b, groups) e8m0.
            const int64_t scale_row = SM == ScaleMode::block128
                                          ? int64_t(e) * p.b_row_blocks + b_row / 128
                                          : int64_t(e) * p.N_b + b_row;
            src = static_cast<const uint8_t*>(p.b_scale) + scale_row * p.k_groups * kScaleBytesEach;
          }
        }
        scale_src[i] = src;
        scale_group[i] = g;
      }
    }
    auto fetch_scales = [&](float(&out)[kScaleSlots], int k_tile) {
#pragma unroll
      for (int i = 0; i < kScalesPerThread; ++i) {
        const int group = k_tile * kGroups + scale_group[i];
        float v = 0.0f;
        if (scale_src[i] != nullptr && group < p.k_groups) {
          if constexpr (SM == ScaleMode::block128) {
            v = __ldg(reinterpret_cast<const float*>(scale_src[i]) + group);
          } else {
            v = e8m0_value(__ldg(scale_src[i] + group));  // fp8_codec.cuh: as the CPU
          }
        }
        out[i] = v;
      }
    };
    auto store_scales = [&](const float(&in)[kScaleSlots], int slot) {
      float* scales = reinterpret_cast<float*>(stage_ptr(slot) + Smem::kABytes + Smem::kBBytes);
#pragma unroll
      for (int i = 0; i < kScalesPerThread; ++i) {
        const int entry = tid + i * kThreads;
        if (entry < Smem::kScaleEntries) scales[entry] = in[i];
      }
    };

    // ---- 3. mainloop ----
    float acc[MMA_M][MMA_N][4];
#pragma unroll
    for (int mi = 0; mi < MMA_M; ++mi)
#pragma unroll
      for (int ni = 0; ni < MMA_N; ++ni)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[mi][ni][v] = 0.0f;

    const int num_k_tiles = p.num_k_tiles;
    // Prologue: slices 0 .. S-2 in flight. Their scales: 0 .. S-3 stored now, S-2 held in
    // registers and stored by iteration 0 (the steady-state rhythm below).
    [[maybe_unused]] float pending[kScaleSlots];
    for (int s = 0; s < num_stages - 1; ++s) {
      if (s < num_k_tiles) load_slice(s, s);
      cp_async_commit();
    }
    if constexpr (kSliceScales) {
      for (int s = 0; s < num_stages - 2; ++s) {
        if (s < num_k_tiles) {
          fetch_scales(pending, s);
          store_scales(pending, s);
        }
      }
      if (num_stages - 2 < num_k_tiles) fetch_scales(pending, num_stages - 2);
    }

    int read_slot = 0, write_slot = num_stages - 1;
    for (int k_tile = 0; k_tile < num_k_tiles; ++k_tile) {
      // Slice k_tile has landed (this thread's copies), then everyone's: the barrier also
      // tells that slot write_slot (read in iteration k_tile - 1) is free again.
      cp_async_wait(num_stages - 2);
      __syncthreads();

      if constexpr (kSliceScales) {
        // Slice k_tile + S - 2 (fetched last iteration) into its slot, write_slot - 1. Its
        // previous slice (k_tile - 2) was consumed before the last barrier, and its readers
        // (iteration k_tile + S - 2 >= k_tile + 1) come after the next one.
        const int k_store = k_tile + num_stages - 2;
        if (k_store < num_k_tiles) {
          store_scales(pending, write_slot == 0 ? num_stages - 1 : write_slot - 1);
        }
      }
      const int k_load = k_tile + num_stages - 1;
      if (k_load < num_k_tiles) load_slice(k_load, write_slot);
      cp_async_commit();
      if constexpr (kSliceScales) {
        if (k_load < num_k_tiles) fetch_scales(pending, k_load);  // lands while we compute
      }

      const uint32_t a_base = shared_address(stage_ptr(read_slot));
      const uint32_t b_base = a_base + Smem::kABytes;
      const float* slice_scales =
          reinterpret_cast<const float*>(stage_ptr(read_slot) + Smem::kABytes + Smem::kBBytes);

      // Group g's scales of this slice for this thread's rows (lane / 4, + 8 per m16 tile) and
      // columns (2 * (lane % 4), + 1 per n8 tile).
      [[maybe_unused]] float sa[MMA_M][2], sb[MMA_N][2];
      auto load_group_scales = [&](int g) {
#pragma unroll
        for (int mi = 0; mi < MMA_M; ++mi) {
          const int r = warp_m * Tile::WARP_M + mi * 16 + (lane >> 2);
          sa[mi][0] = slice_scales[g * BLOCK_M + r];
          sa[mi][1] = slice_scales[g * BLOCK_M + r + 8];
        }
#pragma unroll
        for (int ni = 0; ni < MMA_N; ++ni) {
          const int c = warp_n * Tile::WARP_N + ni * 8 + 2 * (lane & 3);
          const float2 v =
              *reinterpret_cast<const float2*>(slice_scales + kGroups * BLOCK_M + g * BLOCK_N + c);
          sb[ni][0] = v.x;
          sb[ni][1] = v.y;
        }
      };
      // acc += part * a_scale(row) * b_scale(column).
      auto promote = [&](int mi, int ni, const float(&part)[4]) {
        acc[mi][ni][0] = fmaf(part[0], sa[mi][0] * sb[ni][0], acc[mi][ni][0]);
        acc[mi][ni][1] = fmaf(part[1], sa[mi][0] * sb[ni][1], acc[mi][ni][1]);
        acc[mi][ni][2] = fmaf(part[2], sa[mi][1] * sb[ni][0], acc[mi][ni][2]);
        acc[mi][ni][3] = fmaf(part[3], sa[mi][1] * sb[ni][1], acc[mi][ni][3]);
      };

      // block128: the slice's partial sums (one scale block), promoted after the last step.
      [[maybe_unused]] float part[SM == ScaleMode::block128 ? MMA_M : 1]
                                 [SM == ScaleMode::block128 ? MMA_N : 1][4];
      const float kZero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll(Tile::kStepUnroll)
      for (int ks = 0; ks < kSliceBytes / 32; ++ks) {  // 32 bytes of K per MMA step
        uint32_t a_frag[MMA_M][4];
        uint32_t b_frag[MMA_N][2];
#pragma unroll
        for (int mi = 0; mi < MMA_M; ++mi) {
          // Matrices: rows 0-7 / 8-15 (lanes 0-15 by lane % 16) x K bytes 0-15 / 16-31.
          const int row = warp_m * Tile::WARP_M + mi * 16 + (lane & 15);
          ldmatrix_x4(a_frag[mi], a_base + swizzled(row, ks * 2 + (lane >> 4)));
        }
#pragma unroll
        for (int nj = 0; nj < MMA_N / 2; ++nj) {
          // Matrices: (n 0-7, k 0-15 B), (n 0-7, k 16-31 B), (n 8-15, ..), (n 8-15, ..).
          const int row = warp_n * Tile::WARP_N + nj * 16 + ((lane >> 4) << 3) + (lane & 7);
          uint32_t t[4];
          ldmatrix_x4(t, b_base + swizzled(row, ks * 2 + ((lane >> 3) & 1)));
          b_frag[2 * nj][0] = t[0];
          b_frag[2 * nj][1] = t[1];
          b_frag[2 * nj + 1][0] = t[2];
          b_frag[2 * nj + 1][1] = t[3];
        }
        if constexpr (SM == ScaleMode::mx32) load_group_scales(ks);  // one e8m0 group a step
#pragma unroll
        for (int mi = 0; mi < MMA_M; ++mi) {
#pragma unroll
          for (int ni = 0; ni < MMA_N; ++ni) {
            if constexpr (SM == ScaleMode::block128) {
              if (ks == 0) {
                mma<OP>(part[mi][ni], a_frag[mi], b_frag[ni], kZero);
              } else {
                mma<OP>(part[mi][ni], a_frag[mi], b_frag[ni], part[mi][ni]);
              }
            } else if constexpr (SM == ScaleMode::mx32) {
              float step[4];
              mma<OP>(step, a_frag[mi], b_frag[ni], kZero);
              promote(mi, ni, step);
            } else {
              mma<OP>(acc[mi][ni], a_frag[mi], b_frag[ni], acc[mi][ni]);
            }
          }
        }
      }
      if constexpr (SM == ScaleMode::block128) {
        load_group_scales(0);
#pragma unroll
        for (int mi = 0; mi < MMA_M; ++mi)
#pragma unroll
          for (int ni = 0; ni < MMA_N; ++ni) promote(mi, ni, part[mi][ni]);
      }

      read_slot = read_slot + 1 == num_stages ? 0 : read_slot + 1;
      write_slot = write_slot + 1 == num_stages ? 0 : write_slot + 1;
    }

    // ---- 4. epilogue ----
    cp_async_wait(0);  // only empty groups remain; the ring becomes the staging tile
    __syncthreads();

    const int out_size = p.d_dtype == kOutFp32 ? 4 : 2;
    const int pitch = out_cols * out_size + 16;  // bytes; 16-byte rows, shifted banks
    // Epilogue scales of this thread's rows and columns (fp8_tensor: alpha; fp8_token: the
    // A row's scale times the B row's channel scale), loaded once per tile.
    [[maybe_unused]] float row_scale[MMA_M][2];
    [[maybe_unused]] float col_scale[MMA_N][2];
    if constexpr (SM == ScaleMode::epilogue) {
      const float* a_scale = static_cast<const float*>(p.a_scale);
      const float* b_scale = static_cast<const float*>(p.b_scale);
      const float alpha = p.per_token_scales ? 1.0f : __ldg(a_scale) * __ldg(b_scale + e);
#pragma unroll
      for (int mi = 0; mi < MMA_M; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int src = s_row_src[warp_m * Tile::WARP_M + mi * 16 + (lane >> 2) + 8 * h];
          row_scale[mi][h] = !p.per_token_scales ? alpha : src >= 0 ? __ldg(a_scale + src) : 0.0f;
        }
      }
#pragma unroll
      for (int ni = 0; ni < MMA_N; ++ni) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int b_row = s_b_row[warp_n * Tile::WARP_N + ni * 8 + 2 * (lane & 3) + j];
          col_scale[ni][j] = !p.per_token_scales ? 1.0f
                             : b_row >= 0        ? __ldg(b_scale + int64_t(e) * p.N_b + b_row)
                                                 : 0.0f;
        }
      }
    }
    auto stage_value = [&](int r, int c, float v) {  // tile row r, tile output column c
      uint8_t* dst = smem + r * pitch + c * out_size;
      if (p.d_dtype == kOutFp32) {
        *reinterpret_cast<float*>(dst) = v;
      } else if (p.d_dtype == kOutFp16) {
        *reinterpret_cast<__half*>(dst) = __float2half_rn(v);
      } else {
        *reinterpret_cast<__nv_bfloat16*>(dst) = __float2bfloat16_rn(v);
      }
    };
#pragma unroll
    for (int mi = 0; mi < MMA_M; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // rows lane / 4 and lane / 4 + 8
        const int r = warp_m * Tile::WARP_M + mi * 16 + (lane >> 2) + 8 * h;
#pragma unroll
        for (int ni = 0; ni < MMA_N; ++ni) {
          const int c = warp_n * Tile::WARP_N + ni * 8 + 2 * (lane & 3);  // tile B row
          float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
          if constexpr (SM == ScaleMode::epilogue) {
            v0 *= row_scale[mi][h] * col_scale[ni][0];
            v1 *= row_scale[mi][h] * col_scale[ni][1];
          }
          if (p.gated) {
            stage_value(r, c >> 1, activation_gated_device(p.activation, v0, v1));
          } else {
            stage_value(r, c, v0);
            stage_value(r, c + 1, v1);
          }
        }
      }
    }
    __syncthreads();

    // Staged rows -> D in 16-byte pieces; only rows of this expert, only columns < N_out.
    const int per_chunk = 16 / out_size;
    const int chunks_per_row = out_cols / per_chunk;
    for (int id = tid; id < rows_valid * chunks_per_row; id += kThreads) {
      const int r = id / chunks_per_row, ch = id - r * chunks_per_row;
      const int col = n0_out + ch * per_chunk;
      if (col >= p.N_out) continue;
      const uint8_t* src = smem + r * pitch + ch * 16;
      uint8_t* dst = static_cast<uint8_t*>(p.D) + ((int64_t(m0) + r) * p.ldd + col) * out_size;
      if (p.d_vector_ok && col + per_chunk <= p.N_out) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
      } else if (out_size == 4) {
        for (int j = 0; j < per_chunk && col + j < p.N_out; ++j)
          reinterpret_cast<float*>(dst)[j] = reinterpret_cast<const float*>(src)[j];
      } else {
        for (int j = 0; j < per_chunk && col + j < p.N_out; ++j)
          reinterpret_cast<uint16_t*>(dst)[j] = reinterpret_cast<const uint16_t*>(src)[j];
      }
    }
  }
}

}  // namespace modmoe::cuda::gemm
