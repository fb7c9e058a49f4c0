// The Hopper grouped GEMM kernel (sm_90a); the design is described in sm90_gemm.h.
//
// CTA = 3 warpgroups (384 threads):
//   warpgroup 0  warp 0 lane 0: TMA producer; warp 1: scheduler; 40 registers per thread
//   warpgroups 1, 2: wgmma consumers, 232 registers per thread. A 128-row tile gives each
//                consumer 64 rows x BN columns ("split M"); a 64-row tile of at most 128
//                columns gives each 64 rows x BN/2 columns ("split N"). The 64x256 tile is
//                "ping-pong": each consumer takes every other tile of the CTA whole, so one
//                consumer's epilogue runs while the other consumes the next tile's stages.
//                The bf16 144x256 tile swaps the operands (consume_swapped): each consumer
//                takes 128 weight rows as the wgmma's M side against the tile's 144 rows of a.
// Shared memory: kStages x [A tile BM x 128 B | B tile BN x 128 B] (128-byte swizzle, as TMA
// writes it and wgmma reads it), on 128-row tiles the TMA-store staging (2 KB per consumer warp:
// store_tile_tma), then the barriers and the work-tile ring (Control). A gated B
// tile is [BN/2 gate rows | BN/2 up rows] (two TMA boxes); each consumer runs one wgmma over
// its gate rows and one over the matching up rows, so its accumulators are [gate | up] and a
// thread holds the gate and up values of the same output columns.
// Synchronization: full[s] (TMA bytes landed) / empty[s] (every warp of the consumers that read
// the stage is done); work_full[w] (scheduler wrote slot w) / work_empty[w] (producer + every
// warp of the consumers that read it). Ping-pong: the stages and slots of a tile are its
// consumer's alone; the other consumer steps past them without waiting, and turn[c] orders the
// main loops: consumer c starts a tile's main loop once the other consumer's main loop of the
// tile before it has ended (its waits on every stage of that tile passed). A parity wait on a
// stage's barrier is only correct while the barrier is at most one phase behind the awaited
// one; a consumer that skipped past a whole tile of K blocks (more than kStages of them) would
// otherwise wait on a stage whose earlier phases have not completed and pass at once.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/activation_device.cuh"
#include "cuda/fp8_codec.cuh"
#include "cuda/programmatic_launch.cuh"
#include "cuda/sm90/sm90_gemm.h"
#include "cuda/sm90/sm90_ptx.cuh"
#include "cuda/sm90/sm90_scheduler.cuh"
#include "cuda/sm90/sm90_wgmma.cuh"

namespace modmoe::cuda::sm90 {

enum OutKind : int32_t { kOutBf16 = 0, kOutFp16 = 1, kOutFp32 = 2, kOutFp8 = 3 };
enum SchedulerKind : int32_t { kCooperative = 0, kLinearScan = 1, kPrecomputed = 2 };

struct KernelParams {
  ScheduleParams schedule;
  int32_t scheduler;     // SchedulerKind
  int32_t num_k_blocks;  // ceil(K / BK)
  int32_t N;             // gated: rows of one half of B (= N_out); plain: N_b
  int32_t N_out;

  // fp8 block scales: element (row, kb) of a at a_scale[row * a_row_stride + kb * a_k_stride];
  // block (e, nb, kb) of b at b_scale[e * b_e_stride + nb * b_n_stride + kb * b_k_stride].
  const float* a_scale;
  int64_t a_row_stride, a_k_stride;
  const float* b_scale;
  int64_t b_e_stride, b_n_stride, b_k_stride;
  int32_t b_n_blocks;

  // MX-FP8 instead (mx != 0): e8m0 bytes, a (rows, K/32) and b (E, N_b, K/32), K-major;
  // mx_row_bytes = K/32. One K block (128 elements) reads a 4-byte word of each row's scales.
  int32_t mx;
  const uint8_t* a_scale_mx;
  const uint8_t* b_scale_mx;
  int32_t mx_row_bytes;
  int32_t N_b;

  int32_t gated;        // gated tiles hold [BN/2 gate rows][BN/2 up rows] of B
  int32_t up_gate;      // UpGate layout: the gate is the second half of B's rows
  int32_t interleaved;  // Interleaved layout (gate 2j, up 2j + 1)
  Activation activation;

  void* d;
  int64_t ldd;
  int32_t out_kind;  // OutKind
  float* d_scale;    // fp8 out: (rows, ceil(N_out / 128))
  // Plain 16-bit out through TMA stores (map_d; 128-row tiles, N_out % 8 == 0, no fold): a
  // warp whose 16 rows all lie in the expert stages 16 x 64 pieces in shared memory and one
  // lane stores them, so the consumer goes on to its next tile while the stores drain.
  int32_t tma_store;

  // Folded top-k reduce (plain fp32 only): d[row_pair[r] / topk] += weight * row r.
  const int32_t* row_pair;
  const float* pair_weight;
  int32_t topk;

  // Launched programmatically (GemmArgs::programmatic): the producer requests the first tile's
  // weight stages before it waits for the previous kernel.
  int32_t programmatic;
};

constexpr int kSmemLimit = 232448;  // sm_90 per-block opt-in maximum
constexpr int kWorkSlots = 4;       // even: ping-pong consumers take alternate slots
// The scheduler warp copies m_indptr (or the batched counts) into shared memory once per CTA
// when it fits: its windows then cost a shared-memory read instead of a global-memory round
// trip each (decode with E = 256 walks 8 windows).
constexpr int kIndptrCache = 1025;
constexpr int kControlBytes = 2048 + 4 * kIndptrCache + 28;

// kSplitScales_: the fp8 kernel with 128-row accumulator halves (128x256, 64x256) that read a
// weight scale per 64 rows (halves that straddle two 128-row scale blocks; the host picks it,
// splits_scales in sm90_gemm.cu). A kernel of its own: a runtime branch between the two loops
// in one kernel left the common loop 3 % more instructions and time (perf.md, seventh session).
//
// Ping-pong (64x256): in the split-N form both consumers finished a tile together and ran
// their epilogues together, and with 1-64 rows per expert (weight streaming) the producer
// stopped for as long, its stages full: skipping the epilogue took 9 of 79 us off Qwen3 fp8
// M = 16's GEMM1 and 7 of 46 off its GEMM2 (H200, 2026-12-01, perf.md fourteenth session).
// The consumer shapes of a BMxBN tile (the host's tile rules use the same functions): the
// 128-row tiles split M, 64x256 is ping-pong, the other 64-row tiles split N. In the first two a
// consumer holds whole rows of its tile (all BN columns).
constexpr bool is_ping_pong_tile(int bm, int bn) { return bm == 64 && bn == 256; }
// A tile whose row count is not a multiple of 64 swaps the operands (consume_swapped): its BN
// weight rows are the wgmma's M side and its BM rows of a the N side (144x256: a BM of any
// multiple of 8 up to 256 fits one wgmma).
constexpr bool is_swapped_tile(int bm) { return bm % 64 != 0; }
constexpr bool consumer_holds_whole_rows(int bm, int bn) {
  return bm == 128 || is_ping_pong_tile(bm, bn);
}
// The tiles with TMA-store staging (store_tile_tma): the 128-row ones, whose consumer warps hold
// 16 whole rows each. (The ping-pong 64x256 fp8 kernel spilled 8-16 bytes with it.) The host's
// KernelParams::tma_store asks for it only on these tiles.
constexpr bool stages_tma_stores(int bm) { return bm == 128; }

template <int BM_, int BN_, bool kFp8_, bool kSplitScales_ = false>
struct TileConfig {
  static constexpr int BM = BM_, BN = BN_;
  static constexpr bool kFp8 = kFp8_, kSplitScales = kSplitScales_;
  static constexpr int kConsumers = 2;
  static constexpr bool kSplitM = BM == 128;
  static constexpr bool kPingPong = is_ping_pong_tile(BM, BN);
  static constexpr bool kWholeRows = consumer_holds_whole_rows(BM, BN);
  static constexpr int kWgN = kWholeRows ? BN : BN / 2;  // B rows (columns of D) per consumer
  static constexpr int kAcc = kWgN / 2;                  // fp32 accumulators per thread
  static constexpr int kGroups = kWgN / 8;               // 8-column groups per consumer
  // A consumer's accumulators are two halves of kWgN/2 columns, one wgmma each: plain, its
  // left and right columns; gated, its gate and up columns (the same output columns).
  static constexpr int kHalfAcc = kAcc / 2, kHalfGroups = kGroups / 2;
  static constexpr int kBK = kFp8 ? 128 : 64;    // K elements per stage: 128 bytes
  static constexpr int kKStep = kFp8 ? 32 : 16;  // K per wgmma instruction
  static constexpr int kABytes = BM * 128, kBBytes = BN * 128;
  static constexpr int kStageBytes = kABytes + kBBytes;
  // TMA-store staging: one 16-row x 64-column 16-bit piece per consumer warp.
  static constexpr bool kTmaStores = stages_tma_stores(BM);
  static constexpr int kStorePieceBytes = 16 * 128;
  static constexpr int kStoreBytes = kTmaStores ? 4 * kConsumers * kStorePieceBytes : 0;
  static constexpr int kStagesFit = (kSmemLimit - kControlBytes - 1024 - kStoreBytes) / kStageBytes;
  static constexpr int kStages = kStagesFit < 8 ? kStagesFit : 8;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kSmemBytes = kStages * kStageBytes + kStoreBytes + kControlBytes + 1024;
  static constexpr bool kSwapped = is_swapped_tile(BM);
  static_assert(kSplitM || BM == 64 || (kSwapped && BM == 144 && BN == 256 && !kFp8),
                "64- or 128-row tiles, or the bf16 144x256 swapped tile");
  static_assert(kGroups <= 32, "one bit per column group in a 32-bit mask");
  static_assert(!kSplitScales || (kFp8 && kWholeRows && BN == 256),
                "split weight scales are for the 128-row halves of the fp8 256-wide tiles");
  // Consumers that read a stage (they arrive on its empty barrier) and a work slot.
  static constexpr int kReadersPerStage = kPingPong ? 1 : kConsumers;
  // Epilogue stores in compact loops when every store of a warp is whole (store_tile,
  // gated_epilogue), for the ping-pong tile only: there a consumer's first epilogue on an SM
  // (its code fetched while the weight stream fills the memory queues) outlasted the other
  // consumer's main loop and held back the CTA's third tile. Built for every tile, the 128x256
  // fp8 kernels spilled 8-12 bytes and the fp8 M = 8192 layers ran 2-12 % slower (H200,
  // docs/perf.md seventeenth session); the other tiles keep the general loops.
  static constexpr bool kCompactStores = kPingPong;
};

struct Control {
  uint64_t full[8], empty[8];
  uint64_t turn[2];  // ping-pong: consumer c may start its next main loop
  uint64_t work_full[kWorkSlots], work_empty[kWorkSlots];
  WorkTile work[kWorkSlots];
  uint32_t row_amax[2][64];  // fp8 out, split N: each consumer's per-row |max| (float bits)
  int32_t indptr_cache[kIndptrCache];
};
static_assert(sizeof(Control) <= kControlBytes, "Control must fit its reserved bytes");

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

// ---- producer ---------------------------------------------------------------------------------

// The weight (B) boxes of K offset k of tile t into b_tile, completing on `full`.
template <class C>
__device__ __forceinline__ void load_b(const CUtensorMap* map_b, const KernelParams& p,
                                       const WorkTile& t, int k, uint8_t* b_tile, uint64_t* full) {
  if (p.gated) {
    // Map (K, half, N, E): the gate rows of the tile's output columns, then the up rows.
    const int n0 = t.n_block * (C::BN / 2);
    tma_load_4d(b_tile, map_b, full, k, p.up_gate, n0, t.expert);
    tma_load_4d(b_tile + C::kBBytes / 2, map_b, full, k, 1 - p.up_gate, n0, t.expert);
  } else {
    tma_load_3d(b_tile, map_b, full, k, t.n_block * C::BN, t.expert);
  }
}

// Launched programmatically (p.programmatic), the first tile's weight boxes go out for every
// stage (all empty at the start) before the wait for the previous kernel, its row boxes after
// it: the weight stream starts while that kernel (the gather, or GEMM1) finishes, and only A
// waits for it. Launched normally, each stage's boxes go out together (A first), as they did
// before (the B-first order is not measured there).
template <class C>
__device__ void produce(const CUtensorMap* map_a, const CUtensorMap* map_b, const KernelParams& p,
                        uint8_t* tiles, Control& ctl) {
  prefetch_tensor_map(map_a);
  prefetch_tensor_map(map_b);
  int stage = 0, slot = 0;
  uint32_t phase = 0, slot_phase = 0;
  bool first_tile = true;
  while (true) {
    mbar_wait(&ctl.work_full[slot], slot_phase);
    const WorkTile t = ctl.work[slot];
    mbar_arrive(&ctl.work_empty[slot]);
    if (++slot == kWorkSlots) slot = 0, slot_phase ^= 1;
    if (t.expert < 0) return;
    int kb = 0;
    if (first_tile && p.programmatic) {
      const int ahead = min(C::kStages, p.num_k_blocks);
      for (int s = 0; s < ahead; ++s) {
        mbar_arrive_expect_tx(&ctl.full[s], C::kStageBytes);
        load_b<C>(map_b, p, t, s * C::kBK, tiles + s * C::kStageBytes + C::kABytes, &ctl.full[s]);
      }
      wait_for_prerequisite_grids();
      for (int s = 0; s < ahead; ++s)
        tma_load_2d(tiles + s * C::kStageBytes, map_a, &ctl.full[s], s * C::kBK, t.row_begin);
      kb = stage = ahead;
      if (stage == C::kStages) stage = 0, phase ^= 1;
      first_tile = false;
    }
    for (; kb < p.num_k_blocks; ++kb) {
      mbar_wait(&ctl.empty[stage], phase ^ 1);
      uint8_t* a_tile = tiles + stage * C::kStageBytes;
      uint64_t* full = &ctl.full[stage];
      mbar_arrive_expect_tx(full, C::kStageBytes);
      const int k = kb * C::kBK;
      tma_load_2d(a_tile, map_a, full, k, t.row_begin);
      load_b<C>(map_b, p, t, k, a_tile + C::kABytes, full);
      if (++stage == C::kStages) stage = 0, phase ^= 1;
    }
  }
}

// ---- scheduler ----------------------------------------------------------------------------------

// `ends`: how many end-of-work tiles to write (ping-pong: one for each consumer, whose slots
// alternate; the producer stops at the first).
template <class Finder>
__device__ void schedule_with(Finder finder, Control& ctl, int ends) {
  const int lane = threadIdx.x % 32;
  int slot = 0;
  uint32_t slot_phase = 0;
  for (int32_t t = blockIdx.x;; t += gridDim.x) {
    const WorkTile tile = finder.find(t);  // end_of_work() again past the end
    mbar_wait(&ctl.work_empty[slot], slot_phase ^ 1);
    if (lane == 0) {
      ctl.work[slot] = tile;
      mbar_arrive(&ctl.work_full[slot]);
    }
    __syncwarp();
    if (++slot == kWorkSlots) slot = 0, slot_phase ^= 1;
    if (tile.expert < 0 && --ends == 0) {
      // No tile left to start here: a programmatic dependent (GEMM2 after GEMM1) may launch once
      // every CTA got here, its CTAs taking the SMs as this grid's leave them.
      allow_dependent_launch();
      return;
    }
  }
}

template <int BM>
__device__ void schedule(const KernelParams& p, Control& ctl, int ends) {
  if (p.scheduler == kPrecomputed) return schedule_with(ListFinder(p.schedule), ctl, ends);
  ScheduleParams sp = p.schedule;
  const bool batched = sp.expert_num_tokens != nullptr;
  const int32_t n = batched ? sp.E : sp.E + 1;
  if (n <= kIndptrCache) {
    // Asynchronous copies, all in flight at once: the first tile waits for this copy, and a
    // load-then-store loop took one memory round trip per 32 experts (9 for E = 256: the ~3 us
    // the cooperative scheduler lost to the precomputed list at M = 1, ncu 2026-11-30).
    const int32_t* src = batched ? sp.expert_num_tokens : sp.m_indptr;
    for (int32_t i = threadIdx.x % 32; i < n; i += 32) cp_async_4(&ctl.indptr_cache[i], src + i);
    cp_async_wait_all();
    __syncwarp();
    (batched ? sp.expert_num_tokens : sp.m_indptr) = ctl.indptr_cache;
  }
  if (p.scheduler == kLinearScan) {
    schedule_with(LinearScanFinder<BM>(sp), ctl, ends);
  } else {
    schedule_with(CooperativeFinder<BM>(sp), ctl, ends);
  }
}

// ---- consumers --------------------------------------------------------------------------------

// Which original B row the first column of 8-column group j of a consumer's accumulators
// comes from (gated: groups [0, kGroups/2) are gate columns, the rest the matching up columns).
template <class C>
__device__ __forceinline__ int32_t group_b_row(const KernelParams& p, int32_t wg_col0, int j) {
  if (!p.gated) return wg_col0 + 8 * j;
  const int up = j / (C::kGroups / 2);
  const int32_t out = wg_col0 / 2 + 8 * (j % (C::kGroups / 2));  // output column
  if (p.interleaved) return 2 * out + up;
  return (up ^ p.up_gate) * p.N + out;
}

// One wgmma K step of a consumer: one wgmma per accumulator half (the same instructions for
// plain and gated tiles; only where the second half's B rows are differs).
template <class C, bool kFp8>
__device__ __forceinline__ void mma_step(float (&d)[2][C::kHalfAcc], uint64_t desc_a,
                                         uint64_t desc_b0, uint64_t desc_b1, bool accumulate) {
  Wgmma<C::kWgN / 2, kFp8>::run(d[0], desc_a, desc_b0, accumulate);
  Wgmma<C::kWgN / 2, kFp8>::run(d[1], desc_a, desc_b1, accumulate);
}

// Two floats as one 32-bit word of T (bf16 / fp16), the lower column first.
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float v0, float v1);
template <>
__device__ __forceinline__ uint32_t pack_pair<__nv_bfloat16>(float v0, float v1) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack_pair<__half>(float v0, float v1) {
  const __half2 h = __floats2half2_rn(v0, v1);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Groups j and j + 1 of a consumer's results as 16-bit pairs, exchanged between neighbouring
// lanes (q, q ^ 1) so that each lane holds 4 contiguous columns of both its rows: words[h] =
// (row h) columns 8 j + 8 (q % 2) + 4 (q / 2) + 0..3 (see store_tile).
template <typename T, int kAcc>
__device__ __forceinline__ void exchange_words(const float (&v)[kAcc], int j, bool odd,
                                               uint32_t (&words)[2][2]) {
  // This lane's words of (group j + g, row h): w_g_h.
  const uint32_t w00 = pack_pair<T>(v[4 * j + 0], v[4 * j + 1]);
  const uint32_t w01 = pack_pair<T>(v[4 * j + 2], v[4 * j + 3]);
  const uint32_t w10 = pack_pair<T>(v[4 * j + 4], v[4 * j + 5]);
  const uint32_t w11 = pack_pair<T>(v[4 * j + 6], v[4 * j + 7]);
  // Send the other group's words, keep this lane's group's.
  const uint32_t got0 = __shfl_xor_sync(0xffffffffu, odd ? w00 : w10, 1);
  const uint32_t got1 = __shfl_xor_sync(0xffffffffu, odd ? w01 : w11, 1);
  // Row h, columns in order: the even lane's word first.
  words[0][0] = odd ? got0 : w00;
  words[0][1] = odd ? w10 : got0;
  words[1][0] = odd ? got1 : w01;
  words[1][1] = odd ? w11 : got1;
}

// Stores a consumer's results: `v[4 * j + q]` for j < kGroupsOut (group j = output columns
// col0 + 8 j + 2 (lane % 4) + {0, 1}; q / 2 picks the row r_lo or r_hi).
//
// 16-bit outs: each row of a group is 16 bytes held by the 4 lanes of a quad (4 bytes each), so
// stored as pairs a row got half of a 32-byte sector per instruction, and GEMM2 with a bf16 out
// ran 10-18 % longer than with an fp32 one on the H200, with up to 40 % more DRAM reads (half-
// written sectors read back before they are written, by all appearances; docs/perf.md, seventh
// session). So neighbouring lanes (q, q ^ 1) swap words first: for groups j, j+1, lane
// q keeps group j + q % 2 and takes its neighbour's words of it, so that it holds 4 contiguous
// columns (8 bytes) of each row, and a store instruction's 4 lanes write all 32 bytes of
// columns 8j .. 8j + 15 of a row.
template <typename T, int kGroupsOut, bool kCompact, int kAcc>
__device__ __forceinline__ void store_tile(const KernelParams& p, const float (&v)[kAcc],
                                           int32_t col0, int32_t r_lo, int32_t row_end) {
  const int lane = threadIdx.x % 32;
  if constexpr (sizeof(T) == 2) {
    static_assert(kGroupsOut % 2 == 0, "groups are exchanged in pairs");
    const int q = lane % 4;
    const bool odd = q & 1;
    const bool vector_ok = p.ldd % 4 == 0;  // 8-byte aligned rows (d itself is)
    // This lane's first column and its two rows' starts: group j's stores are 8 j further (an
    // immediate offset, so the unrolled loop keeps no address per store).
    const int32_t lane_col = col0 + 8 * (odd ? 1 : 0) + 4 * (q / 2);
    T* const row_start[2] = {
        static_cast<T*>(p.d) + static_cast<int64_t>(r_lo) * p.ldd + lane_col,
        static_cast<T*>(p.d) + static_cast<int64_t>(r_lo + 8) * p.ldd + lane_col};
    const bool row_ok[2] = {r_lo < row_end, r_lo + 8 < row_end};
    // kCompact, every store of the warp a whole 8-byte one inside N_out (the common case): a
    // loop with one predicated store per row and no per-store condition or branch. The size of
    // the code matters at 1-64 rows per expert: an SM's first epilogue fetches its instructions
    // while the weight stream fills the memory queues (Qwen3 fp8 M = 16's GEMM2: 10.2 us for the
    // first epilogue, 1.5 us for later ones; 7.7 and 0.6 us with this loop; H200 traces,
    // docs/perf.md seventeenth session).
    if (kCompact &&
        __all_sync(0xffffffffu, vector_ok && lane_col + 8 * (kGroupsOut - 2) + 4 <= p.N_out)) {
#pragma unroll
      for (int j = 0; j < kGroupsOut; j += 2) {
        uint32_t words[2][2];
        exchange_words<T>(v, j, odd, words);
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (row_ok[h])
            *reinterpret_cast<uint2*>(row_start[h] + 8 * j) = make_uint2(words[h][0], words[h][1]);
      }
      return;
    }
#pragma unroll
    for (int j = 0; j < kGroupsOut; j += 2) {
      uint32_t words[2][2];
      exchange_words<T>(v, j, odd, words);
      const int32_t col = lane_col + 8 * j;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!row_ok[h]) continue;
        T* dst = row_start[h] + 8 * j;
        if (vector_ok && col + 4 <= p.N_out) {
          *reinterpret_cast<uint2*>(dst) = make_uint2(words[h][0], words[h][1]);
        } else {
#pragma unroll
          for (int s = 0; s < 2; ++s)
            if (col + 2 * s < p.N_out) reinterpret_cast<uint32_t*>(dst)[s] = words[h][s];
        }
      }
    }
  } else {
    static_assert(sizeof(T) == 4, "fp32: each row's 8 columns of a group are one 32-byte sector");
#pragma unroll
    for (int j = 0; j < kGroupsOut; ++j) {
      const int32_t col = col0 + 8 * j + 2 * (lane % 4);
      if (col >= p.N_out) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int32_t row = r_lo + 8 * h;
        const int i = 4 * j + 2 * h;
        if (row < row_end)
          *reinterpret_cast<float2*>(static_cast<float*>(p.d) + row * p.ldd + col) =
              make_float2(v[i], v[i + 1]);
      }
    }
  }
}

// store_tile through TMA for one consumer half (kGroupsOut 8-column groups from col0), for a
// warp whose 16 rows [warp_row0, warp_row0 + 16) all lie in the expert (the caller checks; a box
// would also write the next expert's rows): each 64-column piece goes into the warp's staging
// buffer (the 128-byte swizzle the map_d box uses: 16-byte chunk g of row r at chunk g ^ (r % 8),
// so a store instruction's 32 lanes hit 32 banks), a fence, and lane 0 stores it; the next piece
// waits until the previous one has been read. Columns past N_out are clipped by the tensor map.
// (A fallback to store_tile inside, for the other warps, made the fp8 256-wide kernels spill.)
template <typename T, int kGroupsOut, int kAcc>
__device__ __forceinline__ void store_tile_tma(const CUtensorMap* map_d, uint8_t* buf,
                                               const float (&v)[kAcc], int32_t col0,
                                               int32_t warp_row0) {
  static_assert(kGroupsOut % 8 == 0, "64-column pieces");
  const int lane = threadIdx.x % 32;
  const int r = lane / 4;  // rows r and r + 8 of the piece
  // 32-bit shared addresses: this lane's word of row r; row r + 8 is 1024 bytes further, chunk
  // g at (g ^ r) * 16 (r < 8, so r + 8 swizzles the same way).
  const uint32_t lane_word = smem_addr(buf) + r * 128 + 4 * (lane % 4);
#pragma unroll
  for (int piece = 0; piece < kGroupsOut / 8; ++piece) {
    if (lane == 0) bulk_wait_group_read<0>();
    __syncwarp();
#pragma unroll
    for (int g = 0; g < 8; ++g) {
      const int j = 8 * piece + g;
      const uint32_t at = lane_word + ((g ^ r) << 4);
      st_shared_b32(at, pack_pair<T>(v[4 * j], v[4 * j + 1]));
      st_shared_b32(at + 1024, pack_pair<T>(v[4 * j + 2], v[4 * j + 3]));
    }
    fence_proxy_async_shared();
    __syncwarp();
    if (lane == 0) {
      tma_store_2d(map_d, buf, col0 + 64 * piece, warp_row0);
      bulk_commit_group();
    }
  }
}

// A consumer warp's read of work slot `slot`: lane 0 waits for it, reads it and frees it, and
// hands it to the warp by shuffles, so the arrive that frees the slot orders the only read of it
// (a read by every lane, ordered by __syncwarp before lane 0's arrive, was reported by
// compute-sanitizer racecheck against the scheduler's next write of the slot: 2026-11-29).
__device__ __forceinline__ WorkTile read_work_slot(Control& ctl, int slot, uint32_t slot_phase,
                                                   int lane) {
  WorkTile t{};
  if (lane == 0) {
    mbar_wait(&ctl.work_full[slot], slot_phase);
    t = ctl.work[slot];
    mbar_arrive(&ctl.work_empty[slot]);
  }
  t.expert = __shfl_sync(0xffffffffu, t.expert, 0);
  t.row_begin = __shfl_sync(0xffffffffu, t.row_begin, 0);
  t.row_end = __shfl_sync(0xffffffffu, t.row_end, 0);
  t.n_block = __shfl_sync(0xffffffffu, t.n_block, 0);
  return t;
}

// Frees a stage once every consumer warp has arrived (lane 0 of each warp, after __syncwarp).
__device__ __forceinline__ void release_stage(Control& ctl, int stage) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) mbar_arrive(&ctl.empty[stage]);
}

// A consumer's operand tiles of stage 0 as descriptor start fields (sm90_ptx.cuh): its A rows
// and the B rows of each accumulator half. Stage s is s * kStageBytes / 16 further, and each
// 32-byte K step of an instruction 2 further.
struct OperandFields {
  uint32_t a, b0, b1;
};

template <class C>
__device__ __forceinline__ uint32_t stage_field_offset(int stage) {
  return static_cast<uint32_t>(stage) * (C::kStageBytes >> 4);
}

// Waits for the next stage and issues its wgmmas into d (one K block: 128 bytes of K).
// `accumulate_first`: whether the block's first instruction adds to d (else overwrites it).
template <class C>
__device__ __forceinline__ void issue_k_block(float (&d)[2][C::kHalfAcc], const OperandFields& f,
                                              Control& ctl, int& stage, uint32_t& phase,
                                              bool accumulate_first) {
  mbar_wait(&ctl.full[stage], phase);
  const uint32_t at = stage_field_offset<C>(stage);
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < C::kBK / C::kKStep; ++s) {
    const uint32_t k = at + 2 * s;
    mma_step<C, C::kFp8>(d, kmajor_sw128_desc_at(f.a + k), kmajor_sw128_desc_at(f.b0 + k),
                         kmajor_sw128_desc_at(f.b1 + k), accumulate_first || s > 0);
  }
  wgmma_commit();
  if (++stage == C::kStages) stage = 0, phase ^= 1;
}

// bf16: the wgmmas accumulate in place; one K block stays in flight while the next is issued,
// and a stage is freed when the block after it has been issued and the block itself is done.
// After K block `current` was issued: waits for the block before it and frees its stage.
template <int kHalfAcc>
__device__ __forceinline__ void retire_previous_k_block(Control& ctl, float (&acc)[2][kHalfAcc],
                                                        int& previous_stage, int current) {
  wgmma_wait<1>();
  fence_accumulators(acc[0]);
  fence_accumulators(acc[1]);
  if (previous_stage >= 0) release_stage(ctl, previous_stage);
  previous_stage = current;
}
// After the last K block: waits for it and frees its stage.
template <int kHalfAcc>
__device__ __forceinline__ void retire_last_k_block(Control& ctl, float (&acc)[2][kHalfAcc],
                                                    int previous_stage) {
  wgmma_wait<0>();
  fence_accumulators(acc[0]);
  fence_accumulators(acc[1]);
  if (previous_stage >= 0) release_stage(ctl, previous_stage);
}

template <class C>
__device__ __forceinline__ void bf16_main_loop(const KernelParams& p, const OperandFields& f,
                                               Control& ctl, float (&acc)[2][C::kHalfAcc],
                                               int& stage, uint32_t& phase) {
  int previous_stage = -1;
  for (int kb = 0; kb < p.num_k_blocks; ++kb) {
    const int current = stage;
    issue_k_block<C>(acc, f, ctl, stage, phase, kb > 0);
    retire_previous_k_block(ctl, acc, previous_stage, current);
  }
  retire_last_k_block(ctl, acc, previous_stage);
}

// Where a consumer thread reads its fp8 block scales, advanced one K block at a time: the scale
// of each of its two rows, and the weight block of each accumulator half. A half is kWgN/2 B rows
// starting at a multiple of kWgN/2 (plain: wg_col0 + h kWgN/2; gated GateUp/UpGate: (gate|up) * N
// + out0; Interleaved: rows 2 out0 .. 2 out0 + kWgN - 1 with 2 out0 a multiple of kWgN). Halves of
// <= 64 rows (<= 32 outputs Interleaved) must lie in one 128-row weight block: one scale per half
// per K block. The 128-row halves of the 128x256 fp8 tile may straddle two blocks at their middle
// (gated GateUp/UpGate with N % 128 == 64, e.g. gpt-oss's N = 2880; Interleaved always): their
// first and last 64 columns (accumulator groups [0, 8) and [8, 16), a compile-time register
// split) each read their own scale. The host picks only tiles for which this holds
// (fp8_block_misfit in sm90_gemm.cu). Not one scale selected per 8-column group (ncu,
// 2026-11-30: the per-group select and the per-block address arithmetic were 2/3 of a 128x128
// consumer's ~300 instructions per K block).
// K % 128 != 0 costs the loop nothing: there are ceil(K/128) K blocks and as many scale
// groups per row, so block kb reads group kb (the last one partial); TMA zero-fills the A and B
// boxes past K, so the last block's products past K are 0.
struct ScaleCursor {
  const float* a[2];  // rows r_lo and r_lo + 8 (rows past the expert's end read its last row:
                      // their products are never stored)
  const float* b[2];  // the weight block of accumulator half 0 and half 1 (its first
                      // columns)
  int32_t b_mid[2];   // b[h] + b_mid[h]: the weight block of the half's last 64 columns
                      // (128-column halves only; 0 unless the half straddles two blocks)
  int64_t a_step, b_step;
};

template <class C>
__device__ __forceinline__ ScaleCursor fp8_scale_cursor(const KernelParams& p, const WorkTile& t,
                                                        int32_t r_lo, int32_t wg_col0) {
  ScaleCursor c;
  const int32_t last = t.row_end - 1;
  c.a[0] = p.a_scale + static_cast<int64_t>(min(r_lo, last)) * p.a_row_stride;
  c.a[1] = p.a_scale + static_cast<int64_t>(min(r_lo + 8, last)) * p.a_row_stride;
  const float* b_e = p.b_scale + t.expert * p.b_e_stride;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int32_t blk = min(group_b_row<C>(p, wg_col0, h * C::kHalfGroups) / 128, p.b_n_blocks - 1);
    c.b[h] = b_e + blk * p.b_n_stride;
    c.b_mid[h] = 0;
    if constexpr (C::kSplitScales) {
      const int32_t mid =
          min(group_b_row<C>(p, wg_col0, h * C::kHalfGroups + 8) / 128, p.b_n_blocks - 1);
      c.b_mid[h] = static_cast<int32_t>((mid - blk) * p.b_n_stride);
    }
  }
  c.a_step = p.a_k_stride;
  c.b_step = p.b_k_stride;
  return c;
}

// fp8 block scales apply to one K block's product at a time, so each block's wgmmas write a
// product buffer that is then scaled into acc ("promotion"); the two consumer warpgroups overlap
// one's promotion with the other's wgmmas. (Two alternating product buffers, block k's wgmmas
// running while block k-1 is promoted, were tried for consumer tiles of <= 64 columns: ptxas
// then serializes every wgmma of those kernels (C7514) and the 64x64 / 64x128 fp8 tiles ran
// 12-25 % slower on the H200, 2026-11-29; perf.md.)
//
// acc += part * (scale of the row): s_lo for the thread's row r_lo (elements 0, 1 of each
// 4-element group), s_hi for r_lo + 8 (elements 2, 3).
template <int kN>
__device__ __forceinline__ void promote_half(float (&acc)[kN], const float (&part)[kN], float s_lo,
                                             float s_hi) {
#pragma unroll
  for (int i = 0; i < kN; i += 4) {
    acc[i + 0] = fmaf(part[i + 0], s_lo, acc[i + 0]);
    acc[i + 1] = fmaf(part[i + 1], s_lo, acc[i + 1]);
    acc[i + 2] = fmaf(part[i + 2], s_hi, acc[i + 2]);
    acc[i + 3] = fmaf(part[i + 3], s_hi, acc[i + 3]);
  }
}

// promote_half for a 128-column half whose first and last 64 columns (accumulator groups [0, 8)
// and [8, 16)) have weight scales of their own: (s_lo, s_hi) and (m_lo, m_hi).
template <int kN>
__device__ __forceinline__ void promote_half_split(float (&acc)[kN], const float (&part)[kN],
                                                   float s_lo, float s_hi, float m_lo, float m_hi) {
  static_assert(kN == 64, "a 128-column half: 16 groups of 4 accumulators");
#pragma unroll
  for (int i = 0; i < kN; i += 4) {
    const float lo = i < kN / 2 ? s_lo : m_lo, hi = i < kN / 2 ? s_hi : m_hi;
    acc[i + 0] = fmaf(part[i + 0], lo, acc[i + 0]);
    acc[i + 1] = fmaf(part[i + 1], lo, acc[i + 1]);
    acc[i + 2] = fmaf(part[i + 2], hi, acc[i + 2]);
    acc[i + 3] = fmaf(part[i + 3], hi, acc[i + 3]);
  }
}

// The 64-row tiles' consumers of <= 128 columns (64x128, 64x64, decode-sized: their weight
// stream sets the pace): both halves' wgmmas of a K block into one product buffer, one wait,
// then the promotion. (In pairs, fp8_main_loop_paired, a pair holds its first stage until the
// second has arrived: one stage fewer in flight for the stream.)
template <class C>
__device__ __forceinline__ void fp8_main_loop_together(const KernelParams& p,
                                                       const OperandFields& f, Control& ctl,
                                                       ScaleCursor c, float (&acc)[2][C::kHalfAcc],
                                                       int& stage, uint32_t& phase) {
  float part[2][C::kHalfAcc];
  // The scales run one K block ahead: block kb + 1's are loaded as block kb starts, so the
  // promotion does not wait a memory round trip per block. Loaded just before the stage's wait
  // instead, at 1-2 rows per expert (the stages already full) the promotion's FMULs waited on
  // them in ~12 % of the 64x256 kernel's stall samples (ncu, H200, perf.md eighth session).
  float sa_lo = __ldg(c.a[0]), sa_hi = __ldg(c.a[1]), sb0 = __ldg(c.b[0]), sb1 = __ldg(c.b[1]);
  for (int kb = 0; kb < p.num_k_blocks; ++kb) {
    float next_sa_lo = 0.0f, next_sa_hi = 0.0f, next_sb0 = 0.0f, next_sb1 = 0.0f;
    if (kb + 1 < p.num_k_blocks) {
      c.a[0] += c.a_step, c.a[1] += c.a_step, c.b[0] += c.b_step, c.b[1] += c.b_step;
      next_sa_lo = __ldg(c.a[0]), next_sa_hi = __ldg(c.a[1]);
      next_sb0 = __ldg(c.b[0]), next_sb1 = __ldg(c.b[1]);
    }
    const int current = stage;
    issue_k_block<C>(part, f, ctl, stage, phase, false);
    wgmma_wait<0>();
    fence_accumulators(part[0]);
    fence_accumulators(part[1]);
    release_stage(ctl, current);
    promote_half(acc[0], part[0], sa_lo * sb0, sa_hi * sb0);
    promote_half(acc[1], part[1], sa_lo * sb1, sa_hi * sb1);
    sa_lo = next_sa_lo, sa_hi = next_sa_hi, sb0 = next_sb0, sb1 = next_sb1;
  }
}

// The 128x128 tile's consumers (64x128 each: prefill-sized, where the tensor cores set the
// pace): K blocks in pairs, each block's wgmmas (both halves) into a product buffer of its own;
// block kb is waited for and promoted while block kb + 1's wgmmas run, then block kb + 1; an
// odd last block runs alone. Each pair's scales are loaded before its stages' waits. One block
// per wait (fp8_main_loop_together) left the tensor cores idle through each promotion unless
// the other consumer filled them: 1.3-1.6x the ideal time per K block in a microbenchmark of
// the loop alone, against 1.1x paired (perf.md, thirtieth session); layers whose GEMMs were
// forced onto this tile ran 0.95-1.00x the time paired (thirty-first session). Block kb + 1
// issued before block kb was waited for, across the loop's back edge (the fully pipelined
// form), made ptxas serialize every wgmma (C7514; 2026-11-29): here no wgmma is in flight at a
// branch.
template <class C>
__device__ __forceinline__ void fp8_main_loop_paired(const KernelParams& p, const OperandFields& f,
                                                     Control& ctl, ScaleCursor c,
                                                     float (&acc)[2][C::kHalfAcc], int& stage,
                                                     uint32_t& phase) {
  float part0[2][C::kHalfAcc], part1[2][C::kHalfAcc];
  // s = {row r_lo, row r_lo + 8, weight block of half 0, of half 1} of the cursor's K block.
  const auto load_scales = [&](float(&s)[4]) {
    s[0] = __ldg(c.a[0]), s[1] = __ldg(c.a[1]), s[2] = __ldg(c.b[0]), s[3] = __ldg(c.b[1]);
    c.a[0] += c.a_step, c.a[1] += c.a_step, c.b[0] += c.b_step, c.b[1] += c.b_step;
  };
  const auto retire = [&](float(&part)[2][C::kHalfAcc], const float(&s)[4], int its_stage) {
    fence_accumulators(part[0]);
    fence_accumulators(part[1]);
    release_stage(ctl, its_stage);
    promote_half(acc[0], part[0], s[0] * s[2], s[1] * s[2]);
    promote_half(acc[1], part[1], s[0] * s[3], s[1] * s[3]);
  };
  int kb = 0;
  for (; kb + 1 < p.num_k_blocks; kb += 2) {
    float s0[4], s1[4];
    load_scales(s0);
    load_scales(s1);
    const int first = stage;
    issue_k_block<C>(part0, f, ctl, stage, phase, false);
    const int second = stage;
    issue_k_block<C>(part1, f, ctl, stage, phase, false);
    wgmma_wait<1>();
    retire(part0, s0, first);
    wgmma_wait<0>();
    retire(part1, s1, second);
  }
  if (kb < p.num_k_blocks) {
    float s0[4];
    load_scales(s0);
    const int first = stage;
    issue_k_block<C>(part0, f, ctl, stage, phase, false);
    wgmma_wait<0>();
    retire(part0, s0, first);
  }
}

// A 64x256 consumer (the 128x256 fp8 tile) has no registers for a product buffer of both
// halves (128 + 128 accumulators): it runs its K block one accumulator half at a time, each
// half's wgmmas (n = 128) into one 64-register buffer, waited for and promoted before the next.
// Its scales are loaded as the block starts: one block ahead, as in fp8_main_loop_together, was
// 1.5-14 % slower in three sessions (docs/hopper.md, "fp8 with block scales").
// C::kSplitScales: each half's last 64 columns have a weight scale of their own
// (ScaleCursor::b_mid). Used for every tile, the split promotion and its cursor cost Mixtral's
// fp8 GEMMs (no half straddles there) 7 % more instructions and ~6 % more time (ncu,
// 2026-12-01; docs/perf.md), hence the kernel of its own.
template <class C>
__device__ __forceinline__ void fp8_main_loop_by_halves(const KernelParams& p,
                                                        const OperandFields& f, Control& ctl,
                                                        ScaleCursor c, float (&acc)[2][C::kHalfAcc],
                                                        int& stage, uint32_t& phase) {
  constexpr bool kSplit = C::kSplitScales;
  float part[C::kHalfAcc];
  // kSplit keeps the cursor as one pointer per operand plus 32-bit offsets, stepped by the
  // parameters (this consumer has 232 registers, 192 of them hold acc and part; the pointer form
  // with two more scales spilled).
  const float* a_scale = c.a[0];
  const float* b_scale = c.b[0];
  const int32_t a_hi = static_cast<int32_t>(c.a[1] - c.a[0]);  // < 8 * 2^28 (can_implement)
  const int32_t b_half[2][2] = {
      {0, c.b_mid[0]},
      {static_cast<int32_t>(c.b[1] - c.b[0]), static_cast<int32_t>(c.b[1] - c.b[0]) + c.b_mid[1]}};
  for (int kb = 0; kb < p.num_k_blocks; ++kb) {
    float sa_lo, sa_hi, sb[2][2];  // sb[h][part of the half]
    if constexpr (kSplit) {
      sa_lo = __ldg(a_scale), sa_hi = __ldg(a_scale + a_hi);
#pragma unroll
      for (int h = 0; h < 2; ++h)
        sb[h][0] = __ldg(b_scale + b_half[h][0]), sb[h][1] = __ldg(b_scale + b_half[h][1]);
      a_scale += p.a_k_stride;
      b_scale += p.b_k_stride;
    } else {
      sa_lo = __ldg(c.a[0]), sa_hi = __ldg(c.a[1]);
      sb[0][0] = sb[0][1] = __ldg(c.b[0]);
      sb[1][0] = sb[1][1] = __ldg(c.b[1]);
      c.a[0] += c.a_step, c.a[1] += c.a_step, c.b[0] += c.b_step, c.b[1] += c.b_step;
    }
    mbar_wait(&ctl.full[stage], phase);
    const uint32_t at = stage_field_offset<C>(stage);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t b = (h == 0 ? f.b0 : f.b1) + at;
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < C::kBK / C::kKStep; ++s)
        Wgmma<C::kWgN / 2, true>::run(part, kmajor_sw128_desc_at(f.a + at + 2 * s),
                                      kmajor_sw128_desc_at(b + 2 * s), s > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(part);
      if (h == 1) release_stage(ctl, stage);
      if constexpr (kSplit) {
        promote_half_split(acc[h], part, sa_lo * sb[h][0], sa_hi * sb[h][0], sa_lo * sb[h][1],
                           sa_hi * sb[h][1]);
      } else {
        promote_half(acc[h], part, sa_lo * sb[h][0], sa_hi * sb[h][0]);
      }
    }
    if (++stage == C::kStages) stage = 0, phase ^= 1;
  }
}

template <class C>
__device__ __forceinline__ void fp8_main_loop(const KernelParams& p, const OperandFields& f,
                                              Control& ctl, const ScaleCursor& c,
                                              float (&acc)[2][C::kHalfAcc], int& stage,
                                              uint32_t& phase) {
  if constexpr (C::kHalfAcc > 32) {
    fp8_main_loop_by_halves<C>(p, f, ctl, c, acc, stage, phase);
  } else if constexpr (C::kSplitM) {
    fp8_main_loop_paired<C>(p, f, ctl, c, acc, stage, phase);
  } else {
    fp8_main_loop_together<C>(p, f, ctl, c, acc, stage, phase);
  }
}

// ---- MX-FP8: E8M0 scales per 32 along K ---------------------------------------------------------
//
// Every 32-wide K step (one wgmma) has its own scales, a per-row one for A and a per-column one
// for B, so each step's product is promoted on its own: acc += part * (sa[row] * sb[column]).
// That is two fp32 operations per accumulator per 32 K, more than the tensor cores need for
// the step itself: MX on Hopper (no hardware block scaling) is bounded by the CUDA cores when
// compute-bound (perf.md measures it against block-128).

// A thread's scale words for one K block (4 e8m0 bytes: its 4 K steps): its two rows, and its
// two columns of each 8-column group per accumulator half.
template <class C>
struct MxScaleWords {
  uint32_t a[2];
  uint32_t b[2][C::kHalfGroups][2];
};

// The B row of this thread's column c (0/1) of group jj in accumulator half h. Plain: the halves
// are the consumer's left and right columns; gated: its gate and up rows of the same outputs.
template <class C>
__device__ __forceinline__ int32_t mx_column_b_row(const KernelParams& p, int32_t wg_col0, int h,
                                                   int jj, int c) {
  const int32_t quad_col = 2 * (threadIdx.x % 4) + c;
  if (!p.gated) return wg_col0 + h * (C::kWgN / 2) + 8 * jj + quad_col;
  const int32_t out = wg_col0 / 2 + 8 * jj + quad_col;
  if (p.interleaved) return 2 * out + h;
  return (h ^ p.up_gate) * p.N + out;
}

// Rows past the expert's end and B rows past N_b are never stored; they get scale 1 (code 0x7f)
// rather than a read outside the scale tensors (or a code 0, which would send the thread down
// the exact decode in every partial tile).
constexpr uint32_t kMxUnitScales = 0x7f7f7f7fu;

template <class C>
__device__ __forceinline__ void load_mx_scales(const KernelParams& p, const WorkTile& t,
                                               int32_t r_lo, int32_t wg_col0, int kb,
                                               MxScaleWords<C>& w) {
  const int64_t k_word = 4 * kb;  // byte offset of this K block in a scale row
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const int32_t row = r_lo + 8 * q;
    w.a[q] = row < t.row_end ? __ldg(reinterpret_cast<const uint32_t*>(
                                   p.a_scale_mx + int64_t{row} * p.mx_row_bytes + k_word))
                             : kMxUnitScales;
  }
  const uint8_t* b_e = p.b_scale_mx + int64_t{t.expert} * p.N_b * p.mx_row_bytes + k_word;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int jj = 0; jj < C::kHalfGroups; ++jj) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int32_t row = mx_column_b_row<C>(p, wg_col0, h, jj, c);
        w.b[h][jj][c] =
            row < p.N_b
                ? __ldg(reinterpret_cast<const uint32_t*>(b_e + int64_t{row} * p.mx_row_bytes))
                : kMxUnitScales;
      }
    }
  }
}

// Whether any byte of the words is one of the two e8m0 codes the fast decode gets wrong (0x00:
// 2^-127, a subnormal; 0xff: NaN). A byte is 0x00 or 0xff iff its bits are all equal, i.e. iff
// its 7 low bits of w ^ (w >> 1) are zero; adding 0x7f to those 7 bits then leaves bit 7 clear.
template <class C>
__device__ __forceinline__ bool mx_has_special_codes(const MxScaleWords<C>& w) {
  uint32_t all_set = 0x80808080u;
  auto check = [&all_set](uint32_t word) {
    all_set &= ((word ^ (word >> 1)) & 0x7f7f7f7fu) + 0x7f7f7f7fu;
  };
  check(w.a[0]);
  check(w.a[1]);
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int jj = 0; jj < C::kHalfGroups; ++jj) check(w.b[h][jj][0]), check(w.b[h][jj][1]);
  return (all_set & 0x80808080u) != 0x80808080u;
}

// Byte kStep of a scale word as 2^(code - 127): the fast form shifts the code into the exponent
// field (right for codes 1..254); the exact one (e8m0_value) also decodes 0x00 and 0xff as the
// CPU does.
template <int kStep, bool kExact>
__device__ __forceinline__ float mx_scale(uint32_t word) {
  const uint32_t code = (word >> (8 * kStep)) & 0xffu;
  if constexpr (kExact) return e8m0_value(static_cast<uint8_t>(code));
  return __uint_as_float(code << 23);
}

// acc[kHalf] += part * sa(row) * sb(column) for K step kStep of the block.
template <class C, int kStep, int kHalf, bool kExact>
__device__ __forceinline__ void promote_mx(float (&acc)[C::kHalfAcc],
                                           const float (&part)[C::kHalfAcc],
                                           const MxScaleWords<C>& w) {
  const float sa_lo = mx_scale<kStep, kExact>(w.a[0]);
  const float sa_hi = mx_scale<kStep, kExact>(w.a[1]);
#pragma unroll
  for (int jj = 0; jj < C::kHalfGroups; ++jj) {
    const float sb0 = mx_scale<kStep, kExact>(w.b[kHalf][jj][0]);
    const float sb1 = mx_scale<kStep, kExact>(w.b[kHalf][jj][1]);
    const int i = 4 * jj;
    acc[i + 0] = fmaf(part[i + 0], sa_lo * sb0, acc[i + 0]);
    acc[i + 1] = fmaf(part[i + 1], sa_lo * sb1, acc[i + 1]);
    acc[i + 2] = fmaf(part[i + 2], sa_hi * sb0, acc[i + 2]);
    acc[i + 3] = fmaf(part[i + 3], sa_hi * sb1, acc[i + 3]);
  }
}

// One 32-wide K step of an MX block for one accumulator half: its wgmma into `part`, waited
// for, then promoted. A half at a time keeps one half-sized product buffer live (two, with the
// 32 scale words of a 128-column consumer, spilled: ptxas, 2026-11-29); the other consumer
// warpgroup's wgmmas fill the tensor cores meanwhile. `release`: free the stage once this
// wgmma (the block's last) is done.
template <class C, int kStep, int kHalf>
__device__ __forceinline__ void mx_k_step(float (&acc)[2][C::kHalfAcc], float (&part)[C::kHalfAcc],
                                          uint64_t desc_a, uint64_t desc_b,
                                          const MxScaleWords<C>& w, bool special, Control& ctl,
                                          int stage, bool release) {
  wgmma_fence();
  Wgmma<C::kWgN / 2, true>::run(part, desc_a + 2 * kStep, desc_b + 2 * kStep, false);
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(part);
  if (release) release_stage(ctl, stage);
  // Per thread (no wgmma inside): threads whose words hold a 0x00 or 0xff code decode exactly.
  if (special) {
    promote_mx<C, kStep, kHalf, true>(acc[kHalf], part, w);
  } else {
    promote_mx<C, kStep, kHalf, false>(acc[kHalf], part, w);
  }
}

template <class C, int kStep>
__device__ __forceinline__ void mx_k_step(float (&acc)[2][C::kHalfAcc], float (&part)[C::kHalfAcc],
                                          uint64_t desc_a, uint64_t desc_b0, uint64_t desc_b1,
                                          const MxScaleWords<C>& w, bool special, Control& ctl,
                                          int stage) {
  mx_k_step<C, kStep, 0>(acc, part, desc_a, desc_b0, w, special, ctl, stage, false);
  mx_k_step<C, kStep, 1>(acc, part, desc_a, desc_b1, w, special, ctl, stage, kStep == 3);
}

// The MX main loop: per K block, the scale words are loaded before the stage's barrier wait;
// the stage is freed once its last K step's wgmmas are done. The two consumer warpgroups
// overlap one's promotion with the other's wgmmas.
template <class C>
__device__ __forceinline__ void mx_main_loop(const KernelParams& p, const OperandFields& f,
                                             Control& ctl, const WorkTile& t,
                                             float (&acc)[2][C::kHalfAcc], int& stage,
                                             uint32_t& phase, int32_t r_lo, int32_t wg_col0) {
  static_assert(C::kFp8 && C::kBK == 128, "MX runs in the fp8 kernels: 4 K steps per block");
  float part[C::kHalfAcc];
  for (int kb = 0; kb < p.num_k_blocks; ++kb) {
    MxScaleWords<C> w;
    load_mx_scales<C>(p, t, r_lo, wg_col0, kb, w);
    mbar_wait(&ctl.full[stage], phase);
    const bool special = mx_has_special_codes<C>(w);
    const uint32_t at = stage_field_offset<C>(stage);
    const uint64_t desc_a = kmajor_sw128_desc_at(f.a + at);
    const uint64_t desc_b0 = kmajor_sw128_desc_at(f.b0 + at);
    const uint64_t desc_b1 = kmajor_sw128_desc_at(f.b1 + at);
    mx_k_step<C, 0>(acc, part, desc_a, desc_b0, desc_b1, w, special, ctl, stage);
    mx_k_step<C, 1>(acc, part, desc_a, desc_b0, desc_b1, w, special, ctl, stage);
    mx_k_step<C, 2>(acc, part, desc_a, desc_b0, desc_b1, w, special, ctl, stage);
    mx_k_step<C, 3>(acc, part, desc_a, desc_b0, desc_b1, w, special, ctl, stage);
    if (++stage == C::kStages) stage = 0, phase ^= 1;
  }
}

// The folded top-k reduce: adds weight(pair) * v into the fp32 row of the pair's token, two
// columns per atomic (sm_90's float2 atomicAdd). Summation order across CTAs is not fixed.
template <int kGroupsOut, int kAcc>
__device__ __forceinline__ void reduce_tile(const KernelParams& p, const float (&v)[kAcc],
                                            int32_t col0, int32_t r_lo, int32_t row_end) {
  const int lane = threadIdx.x % 32;
  float* d = static_cast<float*>(p.d);
  int64_t token_row[2] = {-1, -1};
  float weight[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int32_t row = r_lo + 8 * h;
    if (row < row_end) {
      const int32_t pair = p.row_pair[row];
      token_row[h] = static_cast<int64_t>(pair / p.topk) * p.ldd;
      weight[h] = p.pair_weight ? p.pair_weight[pair] : 1.0f;
    }
  }
#pragma unroll
  for (int j = 0; j < kGroupsOut; ++j) {
    const int32_t col = col0 + 8 * j + 2 * (lane % 4);
    if (col >= p.N_out) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = 4 * j + 2 * h;
      if (token_row[h] >= 0)
        atomicAdd(reinterpret_cast<float2*>(d + token_row[h] + col),
                  make_float2(weight[h] * v[i], weight[h] * v[i + 1]));
    }
  }
}

// A 4x4 transpose of 16-bit e4m3 code pairs across the 4 lanes of a quad. In: lane q holds the
// pairs of its row's groups 4s .. 4s + 3 (w0 = groups 4s, 4s + 1; w1 = 4s + 2, 4s + 3; the low
// half first), each pair at byte 2q of its group's 8 columns. Out: lane q holds group 4s + q's
// four pairs, lanes 0 .. 3 in order (w0 = lanes 0, 1; w1 = lanes 2, 3): its 8 bytes in memory
// order. Two shuffles: swap the off-diagonal 2x2 blocks (lanes q, q ^ 2), then transpose each
// block (lanes q, q ^ 1).
__device__ __forceinline__ void transpose_quad_codes(uint32_t& w0, uint32_t& w1, int q) {
  const bool upper = q & 2, odd = q & 1;
  const uint32_t got = __shfl_xor_sync(0xffffffffu, upper ? w0 : w1, 2);
  if (upper) {
    w0 = got;
  } else {
    w1 = got;
  }
  // The even lane sends both words' high halves, the odd lane both low halves.
  const uint32_t sent = odd ? __byte_perm(w0, w1, 0x5410) : __byte_perm(w0, w1, 0x7632);
  const uint32_t other = __shfl_xor_sync(0xffffffffu, sent, 1);
  // Words as (low half, high half): the odd lane takes w0 = (other's w0 high, own w0 high) and
  // w1 = (other's w1 high, own w1 high); the even lane w0 = (own w0 low, other's w0 low) and
  // w1 = (own w1 low, other's w1 low).
  if (odd) {
    w0 = __byte_perm(other, w0, 0x7610);
    w1 = __byte_perm(other, w1, 0x7632);
  } else {
    w0 = __byte_perm(w0, other, 0x5410);
    w1 = __byte_perm(w1, other, 0x7610);
  }
}

// The gated epilogue of one consumer's tile, for one activation (a compile-time choice keeps
// the unrolled loop to that activation's code: a runtime switch inlined per element made the
// 128x256 kernel ~19 000 instructions long).
template <class C, Activation kAct>
__device__ __forceinline__ void gated_epilogue(const KernelParams& p, float (&acc)[2][C::kHalfAcc],
                                               Control& ctl, const WorkTile& t, int wg,
                                               int32_t wg_col0, int32_t r_lo) {
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  // Gated: acc[0] = gate, acc[1] = up, of the same output columns. The result goes into acc[0].
  // A thread whose two rows are both past the expert's end stores nothing and skips the
  // activation (at 1 row per expert that is 63 of a 64-row tile's rows; its amax stays 0).
  uint32_t amax_lo = 0, amax_hi = 0;
  if (r_lo < t.row_end) {
#pragma unroll
    for (int g = 0; g < C::kGroups / 2; ++g) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        // The approximate sigmoid (activation_device.cuh): a few fp32 ulp, far below the
        // rounding to the bf16/fp8 out that Sm90Experts writes.
        const float v = gated_function<true>(kAct, acc[0][4 * g + q], acc[1][4 * g + q]);
        acc[0][4 * g + q] = v;
        if (q < 2) {
          amax_lo = max(amax_lo, abs_bits(v));
        } else {
          amax_hi = max(amax_hi, abs_bits(v));
        }
      }
    }
  }
  const int32_t out_col0 = wg_col0 / 2;
  if (p.out_kind != kOutFp8) {
    switch (p.out_kind) {
      case kOutBf16:
        store_tile<__nv_bfloat16, C::kHalfGroups, C::kCompactStores>(p, acc[0], out_col0, r_lo,
                                                                     t.row_end);
        break;
      case kOutFp16:
        store_tile<__half, C::kHalfGroups, C::kCompactStores>(p, acc[0], out_col0, r_lo, t.row_end);
        break;
      default:
        store_tile<float, C::kHalfGroups, C::kCompactStores>(p, acc[0], out_col0, r_lo, t.row_end);
        break;
    }
    return;
  }
  // fp8 out: the tile's 128 output columns are one quantization group per row. A row's
  // values sit in the 4 lanes of a quad (and, split N, in both consumers).
#pragma unroll
  for (int offset = 1; offset < 4; offset *= 2) {
    amax_lo = max(amax_lo, __shfl_xor_sync(0xffffffffu, amax_lo, offset));
    amax_hi = max(amax_hi, __shfl_xor_sync(0xffffffffu, amax_hi, offset));
  }
  if constexpr (!C::kWholeRows) {
    const int row_in_tile = warp * 16 + lane / 4;
    if (lane % 4 == 0) {
      ctl.row_amax[wg][row_in_tile] = amax_lo;
      ctl.row_amax[wg][row_in_tile + 8] = amax_hi;
    }
    named_barrier_sync(1, 128 * C::kConsumers);
    amax_lo = max(ctl.row_amax[0][row_in_tile], ctl.row_amax[1][row_in_tile]);
    amax_hi = max(ctl.row_amax[0][row_in_tile + 8], ctl.row_amax[1][row_in_tile + 8]);
    named_barrier_sync(1, 128 * C::kConsumers);  // before the next tile overwrites row_amax
  }
  // Both rows' scales and reciprocals as one branch-free stretch where both amaxes allow it
  // (every finite row but the tiniest), so the two chains interleave; else the exact forms.
  float scale_lo, scale_hi;
  Fp8Reciprocal reciprocal_lo, reciprocal_hi;
  if (fp8_scale_is_fast(amax_lo) && fp8_scale_is_fast(amax_hi)) {
    scale_lo = fp8_scale_for_amax_fast(__uint_as_float(amax_lo));
    scale_hi = fp8_scale_for_amax_fast(__uint_as_float(amax_hi));
    reciprocal_lo = {1.0f, fp8_reciprocal_fast(scale_lo)};
    reciprocal_hi = {1.0f, fp8_reciprocal_fast(scale_hi)};
  } else {
    scale_lo = fp8_scale_for_amax(__uint_as_float(amax_lo));
    scale_hi = fp8_scale_for_amax(__uint_as_float(amax_hi));
    reciprocal_lo = fp8_reciprocal(scale_lo);
    reciprocal_hi = fp8_reciprocal(scale_hi);
  }
  // ceil: with N_out % 128 != 0 the last group is partial; its columns past N_out hold
  // act(0) * 0 = 0 (TMA zero-fills B rows past N), so they do not move the amax.
  const int32_t scale_cols = (p.N_out + 127) / 128;
  if (lane % 4 == 0 && (C::kWholeRows || wg == 0)) {
    if (r_lo < t.row_end) p.d_scale[r_lo * scale_cols + out_col0 / 128] = scale_lo;
    if (r_lo + 8 < t.row_end) p.d_scale[(r_lo + 8) * scale_cols + out_col0 / 128] = scale_hi;
  }
  uint8_t* d8 = static_cast<uint8_t*>(p.d);
  if (C::kCompactStores && out_col0 + 4 * C::kGroups <= p.N_out) {
    // Every column of this consumer inside N_out (all but a partial last column block): one
    // branch per row, no condition per store (code size, as store_tile's whole-store loop).
    // Rows of finite values with a normal scale convert in 3 instructions per pair instead of
    // ~11 (e4m3_pair_plain); the others (NaN, inf, amax < 448 * 2^-126) take e4m3_pair.
    const bool plain_lo = e4m3_group_is_plain(amax_lo, reciprocal_lo);
    const bool plain_hi = e4m3_group_is_plain(amax_hi, reciprocal_hi);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int32_t row = r_lo + 8 * h;
      if (row >= t.row_end) break;
      uint8_t* const dst = d8 + row * p.ldd + out_col0 + 2 * (lane % 4);
      const Fp8Reciprocal r = h ? reciprocal_hi : reciprocal_lo;
      if (h ? plain_hi : plain_lo) {
#pragma unroll
        for (int g = 0; g < C::kGroups / 2; ++g) {
          const int i = 4 * g + 2 * h;
          *reinterpret_cast<uint16_t*>(dst + 8 * g) =
              static_cast<uint16_t>(e4m3_pair_plain(acc[0][i], acc[0][i + 1], r.inverse));
        }
      } else {
#pragma unroll
        for (int g = 0; g < C::kGroups / 2; ++g) {
          const int i = 4 * g + 2 * h;
          const uint32_t codes = e4m3_pair(acc[0][i], acc[0][i + 1], h ? scale_hi : scale_lo, r);
          *reinterpret_cast<uint16_t*>(dst + 8 * g) = static_cast<uint16_t>(codes);
        }
      }
    }
    return;
  }
  if (!C::kCompactStores && out_col0 + 4 * C::kGroups <= p.N_out && p.ldd % 8 == 0 &&
      __all_sync(0xffffffffu, e4m3_group_is_plain(amax_lo, reciprocal_lo) &&
                                  e4m3_group_is_plain(amax_hi, reciprocal_hi))) {
    // The 128-row tiles (every fp8 prefill GEMM1), all columns inside N_out, the warp's rows
    // all plain (e4m3_pair_plain): a quad's 4 lanes trade their code pairs
    // (transpose_quad_codes) so that each lane stores one group's 8 bytes, and a warp's store
    // writes whole 32-byte sectors: 8 stores per thread, not 32 two-byte ones into 8
    // quarter-filled sectors each.
    const int q = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int32_t row = r_lo + 8 * h;
      const float inverse = h ? reciprocal_hi.inverse : reciprocal_lo.inverse;
      uint8_t* const dst = d8 + static_cast<int64_t>(row) * p.ldd + out_col0 + 8 * q;
#pragma unroll
      for (int s = 0; s < C::kGroups / 8; ++s) {
        uint32_t w[2];  // the code pairs of groups 4s, 4s + 1 and 4s + 2, 4s + 3
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const int i = 4 * (4 * s + 2 * k) + 2 * h;
          w[k] = e4m3_pair_plain(acc[0][i], acc[0][i + 1], inverse) |
                 (e4m3_pair_plain(acc[0][i + 4], acc[0][i + 5], inverse) << 16);
        }
        transpose_quad_codes(w[0], w[1], q);  // the whole warp: shuffles
        if (row < t.row_end) *reinterpret_cast<uint2*>(dst + 32 * s) = make_uint2(w[0], w[1]);
      }
    }
    return;
  }
  // The general loop: a partial last column block, rows not 8-byte aligned, or a warp with a
  // row that is not plain (NaN, inf, a subnormal scale). (With the plain conversion for plain
  // rows it measured no faster than with e4m3_pair on every 128-row tile, before the branch
  // above: Qwen3.5 fp8 M = 8192 GEMM1 382.4 -> 382.0 us; docs/perf.md twenty-seventh session.)
#pragma unroll
  for (int g = 0; g < C::kGroups / 2; ++g) {
    const int32_t col = out_col0 + 8 * g + 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int32_t row = r_lo + 8 * h;
      const int i = 4 * g + 2 * h;
      if (row < t.row_end && col < p.N_out) {
        const uint32_t codes = e4m3_pair(acc[0][i], acc[0][i + 1], h ? scale_hi : scale_lo,
                                         h ? reciprocal_hi : reciprocal_lo);
        *reinterpret_cast<uint16_t*>(d8 + row * p.ldd + col) = static_cast<uint16_t>(codes);
      }
    }
  }
}

// Steps the stage ring past n stages (another consumer's tile) without waiting on them.
template <class C>
__device__ __forceinline__ void skip_stages(int n, int& stage, uint32_t& phase) {
  const int s = stage + n;
  phase ^= static_cast<uint32_t>(s / C::kStages) & 1u;
  stage = s % C::kStages;
}

template <class C>
__device__ void consume(const KernelParams& p, const CUtensorMap* map_d, uint8_t* tiles,
                        Control& ctl, int wg) {
  const int tid = threadIdx.x % 128, lane = tid % 32, warp = tid / 32;
  float acc[2][C::kHalfAcc];
  const int a_offset = C::kSplitM ? wg * 64 * 128 : 0;
  // This consumer's B rows inside the tile, per accumulator half: plain, its kWgN rows (left,
  // right); gated, its kWgN/2 gate rows and the matching up rows BN/2 rows further.
  const int b_offset0 = C::kWholeRows ? 0 : wg * (p.gated ? C::kWgN / 2 : C::kWgN) * 128;
  const int b_offset1 = b_offset0 + (p.gated ? C::BN / 2 : C::kWgN / 2) * 128;
  const OperandFields fields{sw128_start_field(tiles + a_offset),
                             sw128_start_field(tiles + C::kABytes + b_offset0),
                             sw128_start_field(tiles + C::kABytes + b_offset1)};
  int stage = 0, slot = 0;
  uint32_t phase = 0, slot_phase = 0;
  // Ping-pong: consumer wg takes the CTA's tiles wg, wg + 2, ..., i.e. the work slots wg, wg + 2,
  // ... (kWorkSlots is even), and steps past the stages of each tile of the other consumer
  // (as many as a tile has K blocks) before its own.
  if constexpr (C::kPingPong) slot = wg;
  bool first_tile = true;
  uint32_t turn_phase = 0;
  while (true) {
    const WorkTile t = read_work_slot(ctl, slot, slot_phase, lane);
    slot += C::kPingPong ? 2 : 1;
    if (slot >= kWorkSlots) slot -= kWorkSlots, slot_phase ^= 1;
    if (t.expert < 0) {
      if (C::kTmaStores && p.tma_store && lane == 0) bulk_wait_group<0>();  // stores landed
      return;
    }
    if constexpr (C::kPingPong) {
      if (!first_tile || wg == 1) {
        skip_stages<C>(p.num_k_blocks, stage, phase);
        mbar_wait(&ctl.turn[wg], turn_phase);  // the other consumer's main loop has ended
        turn_phase ^= 1;
      }
    }
    first_tile = false;

    const int32_t r_lo = t.row_begin + (C::kSplitM ? wg * 64 : 0) + warp * 16 + lane / 4;
    // This consumer's first B row of the tile.
    const int32_t wg_col0 = t.n_block * C::BN + (C::kWholeRows ? 0 : wg * C::kWgN);

    if constexpr (C::kFp8) {
#pragma unroll
      for (int i = 0; i < C::kHalfAcc; ++i) acc[0][i] = acc[1][i] = 0.0f;
      if (p.mx) {
        // MX keeps 32 scale words per accumulator half: not built for 64x256 consumers
        // (can_implement refuses MX on the 128x256 tile).
        if constexpr (C::kHalfAcc <= 32) {
          mx_main_loop<C>(p, fields, ctl, t, acc, stage, phase, r_lo, wg_col0);
        } else {
          __trap();
        }
      } else {
        fp8_main_loop<C>(p, fields, ctl, fp8_scale_cursor<C>(p, t, r_lo, wg_col0), acc, stage,
                         phase);
      }
    } else {
      bf16_main_loop<C>(p, fields, ctl, acc, stage, phase);
    }

    if constexpr (C::kPingPong) {
      __syncwarp();
      if (lane == 0) mbar_arrive(&ctl.turn[wg ^ 1]);
    }

    // ---- epilogue ----
    if (p.row_pair != nullptr) {
      reduce_tile<C::kHalfGroups>(p, acc[0], wg_col0, r_lo, t.row_end);
      reduce_tile<C::kHalfGroups>(p, acc[1], wg_col0 + C::kWgN / 2, r_lo, t.row_end);
      continue;
    }
    if (!p.gated) {
      if constexpr (C::kTmaStores) {
        const int32_t warp_row0 = r_lo - lane / 4;
        if (p.tma_store && warp_row0 + 16 <= t.row_end) {
          // Recomputed here rather than held through the main loop (registers).
          uint8_t* const store_buf =
              tiles + C::kStages * C::kStageBytes + (threadIdx.x / 32 - 4) * C::kStorePieceBytes;
          if (p.out_kind == kOutBf16) {
            store_tile_tma<__nv_bfloat16, C::kHalfGroups>(map_d, store_buf, acc[0], wg_col0,
                                                          warp_row0);
            store_tile_tma<__nv_bfloat16, C::kHalfGroups>(map_d, store_buf, acc[1],
                                                          wg_col0 + C::kWgN / 2, warp_row0);
          } else {
            store_tile_tma<__half, C::kHalfGroups>(map_d, store_buf, acc[0], wg_col0, warp_row0);
            store_tile_tma<__half, C::kHalfGroups>(map_d, store_buf, acc[1], wg_col0 + C::kWgN / 2,
                                                   warp_row0);
          }
          continue;
        }
      }
      switch (p.out_kind) {
        case kOutBf16:
          store_tile<__nv_bfloat16, C::kHalfGroups, C::kCompactStores>(p, acc[0], wg_col0, r_lo,
                                                                       t.row_end);
          store_tile<__nv_bfloat16, C::kHalfGroups, C::kCompactStores>(
              p, acc[1], wg_col0 + C::kWgN / 2, r_lo, t.row_end);
          break;
        case kOutFp16:
          store_tile<__half, C::kHalfGroups, C::kCompactStores>(p, acc[0], wg_col0, r_lo,
                                                                t.row_end);
          store_tile<__half, C::kHalfGroups, C::kCompactStores>(p, acc[1], wg_col0 + C::kWgN / 2,
                                                                r_lo, t.row_end);
          break;
        default:
          store_tile<float, C::kHalfGroups, C::kCompactStores>(p, acc[0], wg_col0, r_lo, t.row_end);
          store_tile<float, C::kHalfGroups, C::kCompactStores>(p, acc[1], wg_col0 + C::kWgN / 2,
                                                               r_lo, t.row_end);
          break;
      }
      continue;
    }
    switch (p.activation) {
      case Activation::gelu:
        gated_epilogue<C, Activation::gelu>(p, acc, ctl, t, wg, wg_col0, r_lo);
        break;
      case Activation::gelu_tanh:
        gated_epilogue<C, Activation::gelu_tanh>(p, acc, ctl, t, wg, wg_col0, r_lo);
        break;
      case Activation::swigluoai:
        gated_epilogue<C, Activation::swigluoai>(p, acc, ctl, t, wg, wg_col0, r_lo);
        break;
      default:
        gated_epilogue<C, Activation::silu>(p, acc, ctl, t, wg, wg_col0, r_lo);
        break;
    }
  }
}

// ---- swapped operands (few experts, long K) -----------------------------------------------------
//
// The 144x256 tile computes D^T = B A^T: the tile's 256 weight rows are the wgmma's M side
// (consumer wg takes rows [128 wg, 128 wg + 128) as two 64-row halves) and its 144 rows of a the
// N side, so one tile covers an expert of up to 144 rows where 64-row tiles take three (the
// heuristic's waves x tile-rows model, choose_tile). Plain bf16 GEMMs with a 16-bit or fp32 out
// and no folded reduce (can_implement). The main loop is bf16_main_loop's: the wgmmas accumulate
// in place, one K block in flight while the next is issued. Thread t's accumulator d[4 j + q] of
// half h is D^T[m, n] with m = 16 (t / 32) + (t % 32) / 4 + 8 (q / 2) (an out column of the
// half) and n = 8 j + 2 (t % 4) + q % 2 (a row of the tile): the epilogue's stores are 2-4 bytes,
// scattered, a small cost against a main loop of K >= 4096 (the only calls the heuristic gives
// this tile).
template <class C>
__device__ void consume_swapped(const KernelParams& p, uint8_t* tiles, Control& ctl, int wg) {
  static_assert(!C::kFp8, "the swapped tile is bf16 only");
  constexpr int kN = C::BM;         // rows of a per tile: the wgmma's N
  constexpr int kHalfAcc = kN / 2;  // accumulators per thread and half
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  const uint32_t a_field = sw128_start_field(tiles);
  const uint32_t w_field[2] = {sw128_start_field(tiles + C::kABytes + wg * 128 * 128),
                               sw128_start_field(tiles + C::kABytes + (wg * 128 + 64) * 128)};
  int stage = 0, slot = 0;
  uint32_t phase = 0, slot_phase = 0;
  float acc[2][kHalfAcc];
  while (true) {
    const WorkTile t = read_work_slot(ctl, slot, slot_phase, lane);
    if (++slot == kWorkSlots) slot = 0, slot_phase ^= 1;
    if (t.expert < 0) return;

    int previous_stage = -1;
    for (int kb = 0; kb < p.num_k_blocks; ++kb) {
      const int current = stage;
      mbar_wait(&ctl.full[stage], phase);
      const uint32_t at = stage_field_offset<C>(stage);
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < C::kBK / C::kKStep; ++s) {
        const uint64_t a_desc = kmajor_sw128_desc_at(a_field + at + 2 * s);
#pragma unroll
        for (int h = 0; h < 2; ++h)
          Wgmma<kN, false>::run(acc[h], kmajor_sw128_desc_at(w_field[h] + at + 2 * s), a_desc,
                                kb > 0 || s > 0);
      }
      wgmma_commit();
      if (++stage == C::kStages) stage = 0, phase ^= 1;
      retire_previous_k_block(ctl, acc, previous_stage, current);
    }
    retire_last_k_block(ctl, acc, previous_stage);

    // D[row, col] = D^T[m, n]. One call per half (a loop over the halves was not unrolled at
    // kN = 144 and acc went to local memory: eighteenth session's study).
    const auto store_half = [&](const float(&v)[kHalfAcc], int h) {
#pragma unroll
      for (int i = 0; i < kHalfAcc; ++i) {
        const int32_t row = t.row_begin + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
        const int32_t col =
            t.n_block * C::BN + wg * 128 + h * 64 + warp * 16 + lane / 4 + 8 * ((i % 4) / 2);
        if (row >= t.row_end || col >= p.N_out) continue;
        const int64_t at_d = static_cast<int64_t>(row) * p.ldd + col;
        if (p.out_kind == kOutBf16) {
          static_cast<__nv_bfloat16*>(p.d)[at_d] = __float2bfloat16_rn(v[i]);
        } else if (p.out_kind == kOutFp16) {
          static_cast<__half*>(p.d)[at_d] = __float2half_rn(v[i]);
        } else {
          static_cast<float*>(p.d)[at_d] = v[i];
        }
      }
    };
    store_half(acc[0], 0);
    store_half(acc[1], 1);
  }
}

#endif  // sm_90a

template <class C>
__global__ void __launch_bounds__(C::kThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ CUtensorMap map_a,
                        const __grid_constant__ CUtensorMap map_b,
                        const __grid_constant__ CUtensorMap map_d, const KernelParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  // TMA's 128-byte swizzle and the wgmma descriptors want 1024-byte aligned tiles.
  uint8_t* tiles = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                              ~static_cast<uintptr_t>(1023));
  Control& ctl = *reinterpret_cast<Control*>(tiles + C::kStages * C::kStageBytes + C::kStoreBytes);
  const int warp = threadIdx.x / 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(&ctl.full[s], 1);
      mbar_init(&ctl.empty[s], 4 * C::kReadersPerStage);
    }
    for (int w = 0; w < kWorkSlots; ++w) {
      mbar_init(&ctl.work_full[w], 1);
      mbar_init(&ctl.work_empty[w], 1 + 4 * C::kReadersPerStage);
    }
    for (int c = 0; c < 2; ++c) mbar_init(&ctl.turn[c], 4);  // every warp of the other consumer
    fence_barrier_init();
  }
  __syncthreads();

  if (warp < 4) {
    setmaxnreg_decrease<40>();
    if (warp == 0) {
      if (threadIdx.x == 0) produce<C>(&map_a, &map_b, p, tiles, ctl);
    } else if (warp == 1) {
      schedule<C::BM>(p, ctl, C::kPingPong ? 2 : 1);
    }
  } else {
    setmaxnreg_increase<232>();
    // The row scales (fp8) and d are the previous kernel's until it has finished (a programmatic
    // launch; at once otherwise). The consumers' first full stage comes after the producer's
    // wait anyway.
    wait_for_prerequisite_grids();
    if constexpr (C::kSwapped) {
      consume_swapped<C>(p, tiles, ctl, warp / 4 - 1);
    } else {
      consume<C>(p, &map_d, tiles, ctl, warp / 4 - 1);
    }
  }
#endif
}

}  // namespace modmoe::cuda::sm90
