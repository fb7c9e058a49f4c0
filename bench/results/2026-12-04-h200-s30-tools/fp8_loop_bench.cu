// Session 30 study tool: what the fp8 block-scaled consumer main loop can reach on the tensor
// cores, schedule by schedule. The operands sit in shared memory already (no TMA, no producer,
// no barrier waits, no epilogue): what is left is the consumers' own loop — wgmmas, waits,
// scale loads, promotion — with two consumer warpgroups per SM and setmaxnreg 232 as in the
// Hopper kernel (sm90_gemm_kernel.cuh), whose promotion (promote_half) it calls. It says how
// fast each schedule could be at best, not how fast a GEMM built on it will be (the stage
// traffic and the epilogue come on top). (Calls 1, 3 and 4 ran an identical copy of
// promote_half, written out here; it is called since the review.) The thirty-first session
// added three variants with the kernel's stage barriers and a producer (halves256-barriers,
// -filled, -skewed; run in the thirty-second session's call 1), the thirty-second six more
// (-nofullwait, -prewait, -prewait-filled in call 3; -relaxedarrive, -relaxedboth, -testwait,
// -allarrive in call 4; -hintproducer, -hintboth in call 5).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -Xptxas -v \
//        bench/results/2026-12-04-h200-s30-tools/fp8_loop_bench.cu -o fp8_loop_bench
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <vector>

#include "cuda/sm90/sm90_gemm_kernel.cuh"  // promote_half, and the ptx / wgmma wrappers
#include "fp8_loop_bench_wgmma.cuh"

using namespace modmoe::cuda::sm90;

constexpr int kStages = 4;
constexpr int kAStageBytes = 128 * 128;  // 128 rows x one 128-byte K block
constexpr int kBStageBytes = 256 * 128;  // up to 256 B rows
constexpr int kRingBytes = kStages * (kAStageBytes + kBStageBytes);
// The emulated stage fills' target (16 KB: with 32 KB the static shared memory of the smem-scales
// variant took the block past 227 KB and its launch failed, "invalid argument", in call 4).
constexpr int kScratchBytes = 16 * 1024;
constexpr int kSmemBytes = kRingBytes + kScratchBytes + 1024;
// Bytes TMA writes into shared memory per K block of the tile (A 128 rows + B kTileN rows).
__host__ __device__ constexpr int kStageFillBytes(int n) { return 128 * 128 + n * 128; }

enum Variant {
  kHalves256,            // HEAD's 128x256: per K block two halves (4 x n128 into one 64-reg
                         // product buffer, wait, promote)
  kHalves256Unscaled,    // the same waits, no promotion: each half accumulates in place
  kInPlace256,           // no promotion, no wait per block (bf16's loop): the ceiling
  kTogether192,          // 128x192: 2 x n96 per K step into two 48-reg buffers, one wait, promote
  kTogether192Wide,      // 128x192: 1 x n192 per K step into one 96-reg buffer, one wait, promote
  kTogether128,          // HEAD's 128x128: 2 x n64 per K step, one wait, promote
  kTogether128Wide,      // 128x128: 1 x n128 per K step
  kInPlace192,           // 128x192 ceiling: n192 in place, no wait per block
  kPipelined128,         // 128x128: n128 per K step into two alternating 64-reg buffers, block
                         // k + 1's wgmmas in flight while block k is promoted
  kPaired128,            // 128x128: K blocks in pairs, both issued, block k promoted under
                         // block k + 1's wgmmas, the pair waited for at its end
  kHalves256RegA,        // halves256 with A from registers: each thread loads its 64 bytes of A
                         // once per K block, both halves' wgmmas read only B from shared memory
  kHalves256L2Scales,    // halves256 with its row scales from a 16 MB array through L2 only
                         // (ld.global.cg, a new row block per tile): the real kernel's latency
  kHalves256SmemScales,  // halves256 with every scale from shared memory (as if the producer
                         // had put them in the stage)
  // Added in the thirty-first session (not run yet): halves256 under the kernel's stage protocol.
  kHalves256Barriers,  // each K block waits on its stage's full barrier and frees it on its
                       // empty barrier (each consumer warp's lane 0, after the second half), a
                       // producer thread waiting on empty and arriving on full, no data moved
  kHalves256Filled,    // the same, the producer filling each stage's A and B bytes with bulk
                       // copies from an L2-resident buffer (TMA's path and byte count)
  kHalves256Skewed,    // halves256-barriers with consumer 1 running its halves in the other
                       // order (1, then 0): the two consumers' promotions never coincide
  // Added in the thirty-second session, after run160 measured barriers 1.30x and filled 1.40x:
  kHalves256NoFullWait,   // halves256-barriers without the consumers' full-barrier wait (the
                          // stages still freed, the producer still paced): what the wait costs
  kHalves256Prewait,      // halves256-barriers with block k + 1's full wait moved under block
                          // k's second-half wgmmas (after their commit, before their wait)
  kHalves256PrewaitFilled,  // the same with halves256-filled's producer
  // Added after call 3 (nofullwait 1.21x, prewait 1.44x against barriers 1.32-1.37x):
  kHalves256RelaxedArrive,  // halves256-barriers with the consumers' arrive .relaxed (no
                            // release: the stage's readers are wgmmas, already waited for)
  kHalves256RelaxedBoth,    // and the full wait .relaxed too (a timing study only: TMA-written
                            // data needs the acquire)
  kHalves256TestWait,       // halves256-barriers with the full wait as a test_wait loop (never
                            // suspends) instead of try_wait
  kHalves256AllArrive,      // halves256-barriers with every consumer thread arriving on the
                            // empty barrier (256 arrivals), no __syncwarp or lane-0 branch
  // Added after call 4 (none of the four above differs from barriers beyond its spread):
  kHalves256HintProducer,   // halves256-barriers, the producer's empty wait a try_wait with a
                            // suspend-time hint (10 ms: the thread sleeps until the phase
                            // completes) instead of try_wait's default time limit
  kHalves256HintBoth,       // and the consumers' full wait with the hint too
  kVariants
};
constexpr const char* kNames[kVariants] = {"halves256",
                                           "halves256-unscaled",
                                           "inplace256",
                                           "together192",
                                           "together192-wide",
                                           "together128",
                                           "together128-wide",
                                           "inplace192",
                                           "pipelined128",
                                           "paired128",
                                           "halves256-rega",
                                           "halves256-l2scales",
                                           "halves256-smemscales",
                                           "halves256-barriers",
                                           "halves256-filled",
                                           "halves256-skewed",
                                           "halves256-nofullwait",
                                           "halves256-prewait",
                                           "halves256-prewait-filled",
                                           "halves256-relaxedarrive",
                                           "halves256-relaxedboth",
                                           "halves256-testwait",
                                           "halves256-allarrive",
                                           "halves256-hintproducer",
                                           "halves256-hintboth"};
constexpr int kTileN[kVariants] = {256, 256, 256, 192, 192, 128, 128, 192, 128, 128,
                                   256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256,
                                   256, 256, 256};
__host__ __device__ constexpr bool uses_stage_barriers(int v) {
  return v == kHalves256Barriers || v == kHalves256Filled || v == kHalves256Skewed ||
         v == kHalves256NoFullWait || v == kHalves256Prewait || v == kHalves256PrewaitFilled ||
         v == kHalves256RelaxedArrive || v == kHalves256RelaxedBoth || v == kHalves256TestWait ||
         v == kHalves256AllArrive || v == kHalves256HintProducer || v == kHalves256HintBoth;
}
__host__ __device__ constexpr bool fills_stages(int v) {
  return v == kHalves256Filled || v == kHalves256PrewaitFilled;
}
__host__ __device__ constexpr bool prewaits(int v) {
  return v == kHalves256Prewait || v == kHalves256PrewaitFilled;
}

// The device code exists in the sm_90a pass only (the project's wgmma headers are guarded so).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// E4<N>: the project's Wgmma<N, true> (64, 128), and 96 / 192 from fp8_loop_bench_wgmma.cuh.
template <int N>
using E4 = Wgmma<N, true>;

// The barrier variants' own forms of the consumers' arrive and full wait.
__device__ __forceinline__ void mbar_arrive_relaxed(uint64_t* bar) {
  asm volatile("mbarrier.arrive.relaxed.cta.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar))
               : "memory");
}
// The waits under test, one loop: kRelaxed try_wait.relaxed, kTest test_wait (never suspends),
// kHinted try_wait with a suspend-time hint of 10 ms (0x989680 ns: the thread is suspended until
// the phase completes rather than for the default, system-dependent limit).
enum WaitForm { kRelaxed, kTest, kHinted };
template <WaitForm kForm>
__device__ __forceinline__ void mbar_wait_as(uint64_t* bar, uint32_t parity) {
  const uint32_t at = smem_addr(bar);
  uint32_t done = 0;
  do {
    if constexpr (kForm == kRelaxed) {
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.relaxed.cta.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(at), "r"(parity)
          : "memory");
    } else if constexpr (kForm == kTest) {
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(at), "r"(parity)
          : "memory");
    } else {
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
          "selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(at), "r"(parity), "r"(0x989680u)
          : "memory");
    }
  } while (!done);
}
template <int V>
__device__ __forceinline__ void consumer_full_wait(uint64_t* bar, uint32_t parity) {
  if constexpr (V == kHalves256HintBoth) {
    mbar_wait_as<kHinted>(bar, parity);
  } else if constexpr (V == kHalves256RelaxedBoth) {
    mbar_wait_as<kRelaxed>(bar, parity);
  } else if constexpr (V == kHalves256TestWait) {
    mbar_wait_as<kTest>(bar, parity);
  } else {
    mbar_wait(bar, parity);
  }
}

// A 192-column consumer's columns span two 128-column weight blocks; its boundary lies at a
// 64-column step (0, 64 or 128 columns in, by the tile's position): each 16-accumulator chunk
// (32 columns) picks its block's scale at run time. `part` is the chunk's accumulators.
template <int kN>
__device__ __forceinline__ void promote_chunks(float (&acc)[kN], const float (&part)[kN],
                                               int chunk0, int boundary, float lo0, float hi0,
                                               float lo1, float hi1) {
#pragma unroll
  for (int c = 0; c < kN / 16; ++c) {
    const bool first = chunk0 + c < boundary;
    const float lo = first ? lo0 : lo1, hi = first ? hi0 : hi1;
#pragma unroll
    for (int i = 16 * c; i < 16 * c + 16; i += 4) {
      acc[i + 0] = fmaf(part[i + 0], lo, acc[i + 0]);
      acc[i + 1] = fmaf(part[i + 1], lo, acc[i + 1]);
      acc[i + 2] = fmaf(part[i + 2], hi, acc[i + 2]);
      acc[i + 3] = fmaf(part[i + 3], hi, acc[i + 3]);
    }
  }
}

template <int kN>
__device__ __forceinline__ void zero(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) d[i] = 0.0f;
}
template <int kN>
__device__ __forceinline__ void sink(float* out, const float (&d)[kN], int flag) {
  if (flag) {
#pragma unroll
    for (int i = 0; i < kN; ++i) out[i * 256 + threadIdx.x] = d[i];
  }
}

struct Fields {
  uint32_t a, b;  // stage-0 start fields of this consumer's A rows and of the B tile
  __device__ uint32_t a_at(int s) const {
    return a + static_cast<uint32_t>(s) * (kAStageBytes >> 4);
  }
  __device__ uint32_t b_at(int s) const {
    return b + static_cast<uint32_t>(s) * (kBStageBytes >> 4);
  }
};

__shared__ uint32_t g_done;  // 1: consumer 0 has finished

// The stage protocol's barriers (the variants of uses_stage_barriers): full[s] completes when the
// producer has filled stage s, empty[s] when both consumers' 4 warps have freed it.
__shared__ uint64_t g_full[kStages], g_empty[kStages];

template <int V>
__device__ __forceinline__ void consume(const Fields& f, const float* sa_lo_p, const float* sa_hi_p,
                                        const float* sb, int tiles, int kblocks, float* out,
                                        int flag, const float* sa_big, const float* scale_s) {
  constexpr int kN = kTileN[V];
  int stage = 0;
  uint32_t phase = 0;  // the stage ring's parity (the barrier variants)
  // (The emulated writer paces itself by the clock: counting K blocks here, even into a static
  // shared word, made the 256-wide variants spill 16-24 bytes.)
  const auto count_block = [] {};
  for (int tile = 0; tile < tiles; ++tile) {
    if constexpr (V == kHalves256 || V == kHalves256Unscaled || V == kInPlace256 ||
                  V == kHalves256L2Scales || V == kHalves256SmemScales || uses_stage_barriers(V)) {
      float acc[2][64];
      zero(acc[0]), zero(acc[1]);
      float part[64];
      for (int kb = 0; kb < kblocks; ++kb) {
        const uint32_t a = f.a_at(stage), b = f.b_at(stage);
        if constexpr (V == kHalves256 || V == kHalves256L2Scales || V == kHalves256SmemScales ||
                      uses_stage_barriers(V)) {
          float sa_lo, sa_hi, sb0, sb1;
          if constexpr (V == kHalves256 || uses_stage_barriers(V)) {
            sa_lo = __ldg(sa_lo_p + kb), sa_hi = __ldg(sa_hi_p + kb);
            sb0 = __ldg(sb + kb), sb1 = __ldg(sb + kblocks + kb);
          } else if constexpr (V == kHalves256L2Scales) {
            // Rows of 132 * 128 * tiles distinct rows (a new row block per tile), read at L2.
            const float* row = sa_big + static_cast<int64_t>(tile) * 132 * 128 * kblocks;
            sa_lo = __ldcg(row + kb), sa_hi = __ldcg(row + 8 * kblocks + kb);
            sb0 = __ldcg(sb + kb), sb1 = __ldcg(sb + kblocks + kb);
          } else {
            // scale_s points at this thread's row r_lo: the stage's weight scales are its
            // elements 128 and 129, 128 - r_lo and 129 - r_lo from here.
            const float* st = scale_s + stage * 130;
            const int r_lo =
                (threadIdx.x / 128) * 64 + (threadIdx.x % 128) / 32 * 16 + (threadIdx.x % 32) / 4;
            sa_lo = st[0], sa_hi = st[8];
            sb0 = st[128 - r_lo], sb1 = st[129 - r_lo];
          }
          if constexpr (uses_stage_barriers(V) && V != kHalves256NoFullWait) {
            if (!prewaits(V) || kb == 0) consumer_full_wait<V>(&g_full[stage], phase);
          }
          // One half: its wgmmas, wait, (the barrier variants, after the block's last half) the
          // stage freed, promote.
          const auto half = [&](auto half_index, bool last) {
            constexpr int h = decltype(half_index)::value;
            wgmma_fence();
#pragma unroll
            for (int s = 0; s < 4; ++s)
              E4<128>::run(part, kmajor_sw128_desc_at(a + 2 * s),
                           kmajor_sw128_desc_at(b + h * (128 * 128 >> 4) + 2 * s), s > 0);
            wgmma_commit();
            if (prewaits(V) && last && kb + 1 < kblocks) {  // the next block's stage, waited
              const int next = stage + 1 == kStages ? 0 : stage + 1;  // for under these wgmmas
              mbar_wait(&g_full[next], next == 0 ? phase ^ 1 : phase);
            }
            wgmma_wait<0>();
            fence_accumulators(part);
            if (uses_stage_barriers(V) && last) {  // as the kernel's release_stage
              if constexpr (V == kHalves256AllArrive) {
                mbar_arrive(&g_empty[stage]);
              } else {
                __syncwarp();
                if (threadIdx.x % 32 == 0) {
                  if constexpr (V == kHalves256RelaxedArrive || V == kHalves256RelaxedBoth) {
                    mbar_arrive_relaxed(&g_empty[stage]);
                  } else {
                    mbar_arrive(&g_empty[stage]);
                  }
                }
              }
            }
            const float s_b = h == 0 ? sb0 : sb1;
            promote_half(acc[h], part, sa_lo * s_b, sa_hi * s_b);
          };
          if (V == kHalves256Skewed && threadIdx.x >= 128) {  // consumer 1: halves 1, then 0
            half(std::integral_constant<int, 1>{}, false);
            half(std::integral_constant<int, 0>{}, true);
          } else {
            half(std::integral_constant<int, 0>{}, false);
            half(std::integral_constant<int, 1>{}, true);
          }
        } else if constexpr (V == kHalves256Unscaled) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            wgmma_fence();
#pragma unroll
            for (int s = 0; s < 4; ++s)
              E4<128>::run(acc[h], kmajor_sw128_desc_at(a + 2 * s),
                           kmajor_sw128_desc_at(b + h * (128 * 128 >> 4) + 2 * s), true);
            wgmma_commit();
            wgmma_wait<0>();
            fence_accumulators(acc[h]);
          }
        } else {
          wgmma_fence();
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            E4<128>::run(acc[0], kmajor_sw128_desc_at(a + 2 * s), kmajor_sw128_desc_at(b + 2 * s),
                         true);
            E4<128>::run(acc[1], kmajor_sw128_desc_at(a + 2 * s),
                         kmajor_sw128_desc_at(b + (128 * 128 >> 4) + 2 * s), true);
          }
          wgmma_commit();
          wgmma_wait<1>();
          fence_accumulators(acc[0]);
          fence_accumulators(acc[1]);
        }
        if (++stage == kStages) stage = 0, phase ^= 1;
        count_block();
      }
      wgmma_wait<0>();
      fence_accumulators(acc[0]);
      fence_accumulators(acc[1]);
      sink(out, acc[0], flag);
      sink(out + 64 * 256, acc[1], flag);
    } else if constexpr (V == kHalves256RegA) {
      float acc[2][64];
      zero(acc[0]), zero(acc[1]);
      float part[64];
      const int t = threadIdx.x % 128;
      for (int kb = 0; kb < kblocks; ++kb) {
        const uint32_t b = f.b_at(stage);
        const float sa_lo = __ldg(sa_lo_p + kb), sa_hi = __ldg(sa_hi_p + kb);
        const float sb0 = __ldg(sb + kb), sb1 = __ldg(sb + kblocks + kb);
        // This thread's 16 bytes of A per K step (timing only: not the wgmma fragment layout).
        uint32_t a[4][4];
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const uint32_t at = (f.a_at(stage) << 4) + (s * 128 + t) * 16;
          asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                       : "=r"(a[s][0]), "=r"(a[s][1]), "=r"(a[s][2]), "=r"(a[s][3])
                       : "r"(at));
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          wgmma_fence();
#pragma unroll
          for (int s = 0; s < 4; ++s)
            wgmma_m64n128k32_e4m3_rs(part, a[s],
                                     kmajor_sw128_desc_at(b + h * (128 * 128 >> 4) + 2 * s), s > 0);
          wgmma_commit();
          wgmma_wait<0>();
          fence_accumulators(part);
          const float s_b = h == 0 ? sb0 : sb1;
          promote_half(acc[h], part, sa_lo * s_b, sa_hi * s_b);
        }
        if (++stage == kStages) stage = 0;
        count_block();
      }
      sink(out, acc[0], flag);
      sink(out + 64 * 256, acc[1], flag);
    } else if constexpr (V == kPaired128) {
      float acc[64];
      zero(acc);
      float p0[64], p1[64];
      for (int kb = 0; kb < kblocks; kb += 2) {  // kblocks even
        const float b0 = __ldg(sb + kb), b1 = __ldg(sb + kb + 1);
        const float lo0 = __ldg(sa_lo_p + kb) * b0, hi0 = __ldg(sa_hi_p + kb) * b0;
        const float lo1 = __ldg(sa_lo_p + kb + 1) * b1, hi1 = __ldg(sa_hi_p + kb + 1) * b1;
        const int st1 = stage + 1 == kStages ? 0 : stage + 1;
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
          E4<128>::run(p0, kmajor_sw128_desc_at(f.a_at(stage) + 2 * s),
                       kmajor_sw128_desc_at(f.b_at(stage) + 2 * s), s > 0);
        wgmma_commit();
#pragma unroll
        for (int s = 0; s < 4; ++s)
          E4<128>::run(p1, kmajor_sw128_desc_at(f.a_at(st1) + 2 * s),
                       kmajor_sw128_desc_at(f.b_at(st1) + 2 * s), s > 0);
        wgmma_commit();
        wgmma_wait<1>();
        fence_accumulators(p0);
        promote_half(acc, p0, lo0, hi0);
        wgmma_wait<0>();
        fence_accumulators(p1);
        promote_half(acc, p1, lo1, hi1);
        stage = st1 + 1 == kStages ? 0 : st1 + 1;
        count_block();
        count_block();
      }
      sink(out, acc, flag);
    } else if constexpr (V == kPipelined128) {
      // kblocks even (main); block kb's product in p0 for even kb, p1 for odd.
      float acc[64];
      zero(acc);
      float p0[64], p1[64];
      const auto issue = [&](float(&p)[64], int st) {
        const uint32_t a = f.a_at(st), b = f.b_at(st);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
          E4<128>::run(p, kmajor_sw128_desc_at(a + 2 * s), kmajor_sw128_desc_at(b + 2 * s), s > 0);
        wgmma_commit();
        count_block();
      };
      const auto scale = [&](int kb, float& lo, float& hi) {
        const float b = __ldg(sb + kb);
        lo = __ldg(sa_lo_p + kb) * b, hi = __ldg(sa_hi_p + kb) * b;
      };
      issue(p0, stage);
      if (++stage == kStages) stage = 0;
      int kb = 0;
      for (; kb + 2 < kblocks; kb += 2) {
        float lo, hi;
        scale(kb, lo, hi);
        issue(p1, stage);
        if (++stage == kStages) stage = 0;
        wgmma_wait<1>();
        fence_accumulators(p0);
        promote_half(acc, p0, lo, hi);
        scale(kb + 1, lo, hi);
        issue(p0, stage);
        if (++stage == kStages) stage = 0;
        wgmma_wait<1>();
        fence_accumulators(p1);
        promote_half(acc, p1, lo, hi);
      }
      float lo, hi;
      scale(kb, lo, hi);
      issue(p1, stage);
      if (++stage == kStages) stage = 0;
      wgmma_wait<1>();
      fence_accumulators(p0);
      promote_half(acc, p0, lo, hi);
      scale(kb + 1, lo, hi);
      wgmma_wait<0>();
      fence_accumulators(p1);
      promote_half(acc, p1, lo, hi);
      sink(out, acc, flag);
    } else if constexpr (V == kInPlace192) {
      float acc[96];
      zero(acc);
      for (int kb = 0; kb < kblocks; ++kb) {
        const uint32_t a = f.a_at(stage), b = f.b_at(stage);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
          E4<192>::run(acc, kmajor_sw128_desc_at(a + 2 * s), kmajor_sw128_desc_at(b + 2 * s), true);
        wgmma_commit();
        wgmma_wait<1>();
        fence_accumulators(acc);
        if (++stage == kStages) stage = 0;
        count_block();
      }
      wgmma_wait<0>();
      fence_accumulators(acc);
      sink(out, acc, flag);
    } else {
      // The one-wait loops: the block's product in kN/2 registers, scales one K block ahead
      // (HEAD's fp8_main_loop_together).
      constexpr bool kWide = V == kTogether192Wide || V == kTogether128Wide;
      constexpr int kHalf = kN / 4;  // accumulators per half (two halves of kN/2 columns)
      // 192: where this tile's two weight blocks meet, in 32-column chunks (0, 2 or 4 in: the
      // tile's first column is 192 j, so the boundary moves with j).
      const int boundary = kN == 192 ? (tile % 2 == 0 ? 4 : 2) : 6;
      float acc[2][kHalf];
      zero(acc[0]), zero(acc[1]);
      float sa_lo = __ldg(sa_lo_p), sa_hi = __ldg(sa_hi_p), sb0 = __ldg(sb),
            sb1 = __ldg(sb + kblocks);
      for (int kb = 0; kb < kblocks; ++kb) {
        float n_lo = 0.f, n_hi = 0.f, n_b0 = 0.f, n_b1 = 0.f;
        if (kb + 1 < kblocks) {
          n_lo = __ldg(sa_lo_p + kb + 1), n_hi = __ldg(sa_hi_p + kb + 1);
          n_b0 = __ldg(sb + kb + 1), n_b1 = __ldg(sb + kblocks + kb + 1);
        }
        const uint32_t a = f.a_at(stage), b = f.b_at(stage);
        if constexpr (kWide) {
          float part[2 * kHalf];
          wgmma_fence();
#pragma unroll
          for (int s = 0; s < 4; ++s)
            E4<kN>::run(part, kmajor_sw128_desc_at(a + 2 * s), kmajor_sw128_desc_at(b + 2 * s),
                        s > 0);
          wgmma_commit();
          wgmma_wait<0>();
          fence_accumulators(part);
          // Promote each half from its slice of the one buffer.
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float slice[kHalf];
#pragma unroll
            for (int i = 0; i < kHalf; ++i) slice[i] = part[h * kHalf + i];
            if constexpr (kN == 192)
              promote_chunks(acc[h], slice, h * kHalf / 16, boundary, sa_lo * sb0, sa_hi * sb0,
                             sa_lo * sb1, sa_hi * sb1);
            else
              promote_half(acc[h], slice, sa_lo * sb0, sa_hi * sb0);
          }
        } else {
          float part[2][kHalf];
          wgmma_fence();
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            E4<kN / 2>::run(part[0], kmajor_sw128_desc_at(a + 2 * s),
                            kmajor_sw128_desc_at(b + 2 * s), s > 0);
            E4<kN / 2>::run(part[1], kmajor_sw128_desc_at(a + 2 * s),
                            kmajor_sw128_desc_at(b + (kN / 2 * 128 >> 4) + 2 * s), s > 0);
          }
          wgmma_commit();
          wgmma_wait<0>();
          fence_accumulators(part[0]);
          fence_accumulators(part[1]);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if constexpr (kN == 192)
              promote_chunks(acc[h], part[h], h * kHalf / 16, boundary, sa_lo * sb0, sa_hi * sb0,
                             sa_lo * sb1, sa_hi * sb1);
            else
              promote_half(acc[h], part[h], sa_lo * sb0, sa_hi * sb0);
          }
        }
        sa_lo = n_lo, sa_hi = n_hi, sb0 = n_b0, sb1 = n_b1;
        if (++stage == kStages) stage = 0;
        count_block();
      }
      sink(out, acc[0], flag);
      sink(out + kHalf * 256, acc[1], flag);
    }
  }
}

// The emulated stage fills: one thread issues bulk copies (cp.async.bulk, the TMA engine's
// path: no load/store instructions of the SM) of a stage fill's bytes (A 128 rows + B kTileN rows)
// every `pace` clocks, from an L2-resident global buffer into a scratch area the consumers never
// read, each round waited for on an mbarrier, until consumer 0 is done. Out of line: inlined into
// the kernel, its 40-register region made ptxas spill in the 256-wide variants.
template <int V>
__device__ __noinline__ void emulate_stage_fills(uint8_t* scratch_area, uint64_t* bar,
                                                 const uint8_t* src, int pace) {
  volatile uint32_t* done = &g_done;
  constexpr uint32_t kFill = kStageFillBytes(kTileN[V]);
  constexpr uint32_t kPiece = 16 * 1024;
  const uint32_t scratch = static_cast<uint32_t>(__cvta_generic_to_shared(scratch_area));
  const uint32_t t0 = static_cast<uint32_t>(clock());
  uint32_t due = 0, phase = 0;
  for (uint32_t n = 0; *done == 0; ++n, due += static_cast<uint32_t>(pace)) {
    while (static_cast<uint32_t>(clock()) - t0 < due && *done == 0) __nanosleep(32);
    mbar_arrive_expect_tx(bar, kFill);
    for (uint32_t off = 0; off < kFill; off += kPiece) {
      const uint32_t bytes = kFill - off < kPiece ? kFill - off : kPiece;
      const uint8_t* from = src + ((blockIdx.x * 61 + n * 7 + off / kPiece) % 1024) * kPiece;
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
          "[%3];" ::"r"(scratch + off % kScratchBytes),
          "l"(from), "r"(bytes), "r"(smem_addr(bar))
          : "memory");
    }
    mbar_wait(bar, phase);
    phase ^= 1;
  }
}

// The barrier variants' producer (one thread): for each of the consumers' K blocks, waits for the
// stage to be free, then completes its full barrier — at once (halves256-barriers), or through
// bulk copies of the stage's A and B bytes from an L2-resident buffer (halves256-filled: the
// bytes and the completion TMA would give; the operands become 0x38 codes, finite).
template <int V>
__device__ __noinline__ void produce_stages(uint8_t* ring, const uint8_t* src, int blocks) {
  int stage = 0;
  uint32_t phase = 0;
  constexpr uint32_t kPiece = 16 * 1024;
  const uint32_t ring_at = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  for (int n = 0; n < blocks; ++n) {
    if constexpr (V == kHalves256HintProducer || V == kHalves256HintBoth) {
      mbar_wait_as<kHinted>(&g_empty[stage], phase ^ 1);
    } else {
      mbar_wait(&g_empty[stage], phase ^ 1);
    }
    if constexpr (fills_stages(V)) {
      mbar_arrive_expect_tx(&g_full[stage], kAStageBytes + kBStageBytes);
      const uint32_t a = ring_at + stage * kAStageBytes;
      const uint32_t b = ring_at + kStages * kAStageBytes + stage * kBStageBytes;
      const uint32_t dst[3] = {a, b, b + kPiece};
      const uint32_t bytes[3] = {kAStageBytes, kPiece, kBStageBytes - kPiece};
#pragma unroll
      for (int i = 0; i < 3; ++i) {
        const uint8_t* from = src + ((blockIdx.x * 61 + n * 7 + i) % 1000) * kPiece;
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
            "[%3];" ::"r"(dst[i]),
            "l"(from), "r"(bytes[i]), "r"(smem_addr(&g_full[stage]))
            : "memory");
      }
    } else {
      mbar_arrive(&g_full[stage]);
    }
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
}

#endif  // sm_90a

template <int V>
__global__ void __launch_bounds__(384, 1)
    loop_bench(const float* __restrict__ sa, const float* __restrict__ sb, float* out,
               long long* cycles, int tiles, int kblocks, int flag, int pace,
               const uint8_t* fill_src, const float* sa_big) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t raw[];
  uint8_t* base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
  uint32_t* words = reinterpret_cast<uint32_t*>(base);
  // e4m3 codes near 1.0 (0x38) with small variations: finite values, never all zero.
  for (int i = threadIdx.x; i < kStages * (kAStageBytes + kBStageBytes) / 4; i += blockDim.x)
    words[i] = 0x30383038u ^ ((static_cast<uint32_t>(i) * 2654435761u) & 0x03030303u);
  __syncthreads();
  const int wg = threadIdx.x / 128;
  volatile uint32_t* done = &g_done;
  __shared__ uint64_t fill_bar_word;
  uint64_t* fill_bar = &fill_bar_word;
  // The smem-scales variant's per-stage scales: 128 row scales and 2 weight scales per stage
  // (filled once: the values do not matter for the timing).
  __shared__ float scale_s[kStages][130];
  for (int i = threadIdx.x; i < kStages * 130; i += blockDim.x) (&scale_s[0][0])[i] = 1.0f + i;
  if (threadIdx.x == 0) {
    *done = 0;
    mbar_init(fill_bar, 1);
    for (int s = 0; s < kStages; ++s) mbar_init(&g_full[s], 1), mbar_init(&g_empty[s], V == kHalves256AllArrive ? 256 : 8);
    fence_barrier_init();
  }
  __syncthreads();
  if (wg == 2) {  // the producer warpgroup's place: gives its registers to the consumers
    setmaxnreg_decrease<40>();
    // `pace` > 0: its first warp emulates TMA's shared-memory writes, a stage fill's bytes (A 128
    // rows + B kTileN rows) every `pace` clocks (the variant's own time per K block without the
    // writer), into a scratch area the consumers never read, until consumer 0 is done.
    if constexpr (uses_stage_barriers(V)) {
      if (threadIdx.x == 256) produce_stages<V>(base, fill_src, tiles * kblocks);
    } else if (pace > 0 && threadIdx.x == 256) {
      emulate_stage_fills<V>(base + kRingBytes, fill_bar, fill_src, pace);
    }
    named_barrier_sync(1, 384);
    return;
  }
  setmaxnreg_increase<232>();
  const int t = threadIdx.x % 128;
  const int r_lo = wg * 64 + 16 * (t / 32) + (t % 32) / 4;
  Fields f;
  f.a = sw128_start_field(base + wg * 64 * 128);
  f.b = sw128_start_field(base + kStages * kAStageBytes);
  const long long start = clock64();
  consume<V>(f, sa + r_lo * kblocks, sa + (r_lo + 8) * kblocks, sb, tiles, kblocks,
             out + blockIdx.x * 128 * 256, flag, sa_big + (blockIdx.x * 128 + r_lo) * kblocks,
             &scale_s[0][0] + r_lo);
  if (threadIdx.x == 0) {
    cycles[blockIdx.x] = clock64() - start;
    *done = 1;
  }
  named_barrier_sync(1, 384);
#endif
}

template <int V>
double run(int sms, int tiles, int kblocks, const float* sa, const float* sb, float* out,
           long long* cycles, double* ceiling_tflops, int pace, const uint8_t* fill_src,
           const float* sa_big) {
  cudaFuncSetAttribute(loop_bench<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  loop_bench<V>
      <<<sms, 384, kSmemBytes>>>(sa, sb, out, cycles, tiles, kblocks, 0, pace, fill_src, sa_big);
  float best = 1e30f;
  for (int r = 0; r < 10; ++r) {
    cudaEventRecord(e0);
    loop_bench<V>
        <<<sms, 384, kSmemBytes>>>(sa, sb, out, cycles, tiles, kblocks, 0, pace, fill_src, sa_big);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (ms < best) best = ms;
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    std::printf("%s: %s\n", kNames[V], cudaGetErrorString(err));
    return 0;
  }
  std::vector<long long> c(sms);
  cudaMemcpy(c.data(), cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost);
  long long cmax = 0;
  for (long long x : c) cmax = x > cmax ? x : cmax;
  const double flops = 2.0 * sms * tiles * kblocks * 128.0 * kTileN[V] * 128.0;
  const double tflops = flops / (best * 1e-3) / 1e12;
  // Cycles per K block of the tile, and the ideal at 8192 fp8 flop/clk/SM (dense peak).
  const double per_block = static_cast<double>(cmax) / (tiles * kblocks);
  const double ideal = 128.0 * kTileN[V] * 128.0 * 2.0 / 8192.0;
  if (V == kInPlace256) *ceiling_tflops = tflops;
  std::printf("%s%-20s N=%3d  %8.1f us  %7.1f TFLOP/s  %6.1f clk/K-block (ideal %6.1f, %4.2fx)\n",
              pace ? "+fills " : "       ", kNames[V], kTileN[V], best * 1e3, tflops, per_block,
              ideal, per_block / ideal);
  return per_block;
}

// The variant alone, then with the emulated stage writes at its own pace (the barrier variants
// once: their producer is part of the variant).
template <int V>
void both(int sms, int tiles, int kblocks, const float* sa, const float* sb, float* out,
          long long* cycles, double* ceiling, const uint8_t* fill_src, const float* sa_big) {
  const double per_block =
      run<V>(sms, tiles, kblocks, sa, sb, out, cycles, ceiling, 0, fill_src, sa_big);
  if (uses_stage_barriers(V)) return;
  run<V>(sms, tiles, kblocks, sa, sb, out, cycles, ceiling, static_cast<int>(per_block + 0.5),
         fill_src, sa_big);
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int kblocks = 16, tiles = 24;  // K = 2048 (the Qwen GEMM1s), 24 tiles per SM
  std::vector<float> h_sa(256 * kblocks), h_sb(8 * kblocks);
  for (size_t i = 0; i < h_sa.size(); ++i) h_sa[i] = 1.0f + 0.001f * static_cast<float>(i % 97);
  for (size_t i = 0; i < h_sb.size(); ++i) h_sb[i] = 0.5f + 0.001f * static_cast<float>(i % 31);
  float *sa, *sb, *out;
  long long* cycles;
  cudaMalloc(&sa, h_sa.size() * 4);
  cudaMalloc(&sb, h_sb.size() * 4);
  cudaMalloc(&out, static_cast<size_t>(sms) * 128 * 256 * 4);
  cudaMalloc(&cycles, sms * sizeof(long long));
  cudaMemcpy(sa, h_sa.data(), h_sa.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(sb, h_sb.data(), h_sb.size() * 4, cudaMemcpyHostToDevice);
  uint8_t* fill_src;  // 16 MB the emulated stage fills copy from (L2-resident)
  cudaMalloc(&fill_src, 16 << 20);
  cudaMemset(fill_src, 0x38, 16 << 20);
  float* sa_big;  // row scales of sms * 128 * tiles rows (the L2-scales variant)
  const size_t big = static_cast<size_t>(sms) * 128 * tiles * kblocks + 16 * kblocks;
  cudaMalloc(&sa_big, big * 4);
  cudaMemset(sa_big, 0, big * 4);
  double ceiling = 0;
  std::printf("%d SMs, %d tiles per SM, %d K blocks per tile, operands in shared memory\n", sms,
              tiles, kblocks);
  for (int round = 0; round < 2; ++round) {
    std::printf(
        "round %d (each variant alone, then with its stage fills emulated by bulk copies "
        "at its own pace)\n",
        round + 1);
    both<kInPlace256>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kHalves256>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kHalves256Barriers>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kHalves256Filled>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kHalves256Skewed>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kHalves256NoFullWait>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src,
                               sa_big);
    both<kHalves256Prewait>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kHalves256PrewaitFilled>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src,
                                  sa_big);
    both<kHalves256RelaxedArrive>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src,
                                  sa_big);
    both<kHalves256RelaxedBoth>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src,
                                sa_big);
    both<kHalves256TestWait>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kHalves256AllArrive>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kHalves256HintProducer>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src,
                                 sa_big);
    both<kHalves256HintBoth>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kHalves256RegA>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kHalves256L2Scales>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kHalves256SmemScales>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src,
                               sa_big);
    both<kHalves256Unscaled>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kInPlace192>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kTogether192>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kTogether192Wide>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kTogether128>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kTogether128Wide>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kPipelined128>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
    both<kPaired128>(sms, tiles, kblocks, sa, sb, out, cycles, &ceiling, fill_src, sa_big);
  }
  return 0;
}
