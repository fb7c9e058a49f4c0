// persistent_skeleton.cu: the byte stream of a persistent decode layer, without its math, to put
// a measured number under docs/perf.md's twenty-fourth-session estimate ("What is left at M = 1").
//
// Layer (by default; other sizes from the command line, see main): Qwen3-30B-A3B bf16 at M = 1 —
// 8 routed experts, w13 = 8 x 1536 x 2048 x 2 B = 50.3 MB,
// w2 = 8 x 2048 x 768 x 2 B = 25.2 MB. One CTA per SM (132), 16 warps, one kernel:
//   phase 0  the CTA asks for `hold` bytes of its w2 share into shared memory (TMA bulk copies,
//            one mbarrier), to be read only after the barrier (what an on-chip `down` would do);
//   phase 1  its w13 share through per-warp cp.async rings (depth stages of 2 KiB per warp, as
//            decode_mlp.cu's rings: each lane 4 chunks of 16 B per stage), each chunk read back
//            and folded into a checksum (the loads are not dead);
//   barrier  a grid barrier: __threadfence, one atomicAdd per CTA on a counter that a memset
//            node zeroes before the kernel in the graph, spin on it;
//   phase 2  waits for the held w2, reads it back, and streams the rest of its w2 share through
//            the rings.
// The graph is [memset, kernel] (the launch cooperative when the runtime allows it in a capture;
// the line says which), timed like modmoe-bench: the L2 flushed (256 MB read) before each of 30
// replays, median of event times. Beside it, in the same run: the read-only kernel over the same
// 75.5 MB (modmoe-bench's stream_read: 1056 x 256 threads, 4 loads in flight per thread) and over
// the w13 bytes alone. Not a library part; built and run by run125-persistent-skeleton.sh and
// run126-persistent-skeleton-gpt-oss.sh (docs/perf.md, twenty-fourth session, section 4).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                            \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, \
                  cudaGetErrorString(e_));                                                  \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

constexpr int kWarps = 16;
constexpr int kChunks = 4;  // 16-byte chunks a lane copies per stage: 2 KiB per warp stage
constexpr int kStageBytes = kChunks * 32 * 16;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int n>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(n));
}

// Streams `stages` stages of kStageBytes from src through the warps' rings of kDepth stages
// (warp w takes stages w, w + kWarps, ...), folding every chunk it reads into `acc`.
template <int kDepth>
__device__ uint32_t stream(const uint4* src, int64_t stages, uint4* ring, uint32_t acc) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint4* mine = ring + lane;
  const uint32_t base = smem_addr(mine);
  const int64_t count = stages > warp ? (stages - warp + kWarps - 1) / kWarps : 0;
  int64_t ahead = warp;
  auto request = [&](int slot) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
      cp_async_16(base + (slot * kChunks + c) * 32 * 16, src + (ahead * kChunks + c) * 32 + lane);
    ahead += kWarps;
  };
#pragma unroll
  for (int i = 0; i < kDepth - 1; ++i) {
    if (i < count) request(i);
    cp_async_commit();
  }
  int slot = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (i + kDepth - 1 < count) request(slot == 0 ? kDepth - 1 : slot - 1);
    cp_async_commit();
    cp_async_wait<kDepth - 1>();
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const uint4 v = mine[(slot * kChunks + c) * 32];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    slot = slot + 1 == kDepth ? 0 : slot + 1;
  }
  cp_async_wait<0>();
  return acc;
}

struct Params {
  const uint4* w13;
  const uint4* w2;
  int64_t w13_stages_per_cta;  // in kStageBytes units
  int64_t w2_stages_per_cta;
  int64_t hold_bytes;  // of the CTA's w2 share, into shared memory (multiple of 16)
  unsigned int* counter;
  uint32_t* sink;
  int barrier;  // 0: no grid barrier (the two phases back to back)
};

template <int kDepth>
__global__ void __launch_bounds__(kWarps * 32, 1) skeleton_kernel(const Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t held_bar;
  uint4* ring = reinterpret_cast<uint4*>(smem) + (threadIdx.x / 32) * kDepth * kChunks * 32;
  unsigned char* held = smem + kWarps * kDepth * kStageBytes;
  const char* w2_share = reinterpret_cast<const char*>(p.w2) +
                         static_cast<int64_t>(blockIdx.x) * p.w2_stages_per_cta * kStageBytes;
  const uint32_t bar = smem_addr(&held_bar);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(bar));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  if (threadIdx.x == 0 && p.hold_bytes > 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(bar),
                 "r"(static_cast<uint32_t>(p.hold_bytes)));
    constexpr int64_t kPiece = 16384;
    for (int64_t off = 0; off < p.hold_bytes; off += kPiece) {
      const uint32_t n = static_cast<uint32_t>(min(kPiece, p.hold_bytes - off));
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
          "[%3];" ::"r"(smem_addr(held + off)),
          "l"(w2_share + off), "r"(n), "r"(bar)
          : "memory");
    }
  }
  uint32_t acc = 0;
  // Phase 1: this CTA's w13 share.
  acc =
      stream<kDepth>(p.w13 + static_cast<int64_t>(blockIdx.x) * p.w13_stages_per_cta * kChunks * 32,
                     p.w13_stages_per_cta, ring, acc);
  // The grid barrier.
  if (p.barrier) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(p.counter, 1u);
      while (atomicAdd(p.counter, 0u) < gridDim.x) __nanosleep(32);
      __threadfence();
    }
    __syncthreads();
  }
  // Phase 2: the held w2 (on chip), then the rest of the share through the rings.
  if (p.hold_bytes > 0) {
    asm volatile(
        "{\n .reg .pred done;\n wait:\n mbarrier.try_wait.parity.shared.b64 done, [%0], 0;\n"
        " @!done bra wait;\n}" ::"r"(bar));
    for (int64_t i = threadIdx.x; i < p.hold_bytes / 16; i += blockDim.x) {
      const uint4 v = reinterpret_cast<const uint4*>(held)[i];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  const int64_t held_stages = p.hold_bytes / kStageBytes;
  acc = stream<kDepth>(reinterpret_cast<const uint4*>(w2_share) + held_stages * kChunks * 32,
                       p.w2_stages_per_cta - held_stages, ring, acc);
  for (int off = 16; off > 0; off /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, off);
  if (threadIdx.x % 32 == 0) p.sink[blockIdx.x * kWarps + threadIdx.x / 32] = acc;
}

// modmoe-bench's read-only kernel (tools/bench_kernels.cu), restated.
__global__ void __launch_bounds__(256) read_kernel(const uint4* data, int64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldcg(data + i), b = __ldcg(data + i + stride),
                c = __ldcg(data + i + 2 * stride), d = __ldcg(data + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^
           d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = __ldcg(data + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  for (int off = 16; off > 0; off >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, off);
  if ((threadIdx.x & 31) == 0) sink[(blockIdx.x * blockDim.x + threadIdx.x) / 32] = acc;
}

__global__ void fill_kernel(uint4* d, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t v = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    d[i] = make_uint4(v, v + 1, v + 2, v + 3);
  }
}

struct Timer {
  cudaStream_t stream;
  uint4* flush;
  int64_t flush_n;
  uint32_t* sink;
  // Median of 30 replays of `graph`, each after a 256 MB L2 flush (a read) and an idle gap.
  float median_us(cudaGraphExec_t graph) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int i = 0; i < 33; ++i) {
      read_kernel<<<1056, 256, 0, stream>>>(flush, flush_n, sink);
      CHECK(cudaStreamSynchronize(stream));
      CHECK(cudaEventRecord(a, stream));
      CHECK(cudaGraphLaunch(graph, stream));
      CHECK(cudaEventRecord(b, stream));
      CHECK(cudaEventSynchronize(b));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, a, b));
      if (i >= 3) t.push_back(ms * 1000.0f);
    }
    std::sort(t.begin(), t.end());
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return t[t.size() / 2];
  }
};

template <typename F>
cudaGraphExec_t capture(cudaStream_t s, F&& f) {
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  f();
  CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e;
  CHECK(cudaGraphInstantiate(&e, g, 0));
  CHECK(cudaGraphDestroy(g));
  return e;
}

template <int kDepth>
float run_skeleton(Timer& timer, Params p, int sms, bool cooperative, const char* what) {
  const size_t smem = size_t(kWarps) * kDepth * kStageBytes + p.hold_bytes;
  CHECK(cudaFuncSetAttribute(skeleton_kernel<kDepth>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(sms);
  cfg.blockDim = dim3(kWarps * 32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = timer.stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = cooperative ? 1 : 0;
  cudaGraphExec_t g = capture(timer.stream, [&] {
    if (p.barrier) CHECK(cudaMemsetAsync(p.counter, 0, sizeof(unsigned int), timer.stream));
    CHECK(cudaLaunchKernelEx(&cfg, skeleton_kernel<kDepth>, p));
  });
  const float us = timer.median_us(g);
  CHECK(cudaGraphExecDestroy(g));
  std::printf("%-58s depth %d  ring %3zu KiB/SM  hold %3lld KiB  %s  %7.1f us\n", what, kDepth,
              size_t(kWarps) * kDepth * kStageBytes / 1024, (long long)(p.hold_bytes / 1024),
              cooperative ? "coop" : "    ", us);
  return us;
}

// persistent_skeleton [W13_BYTES W2_BYTES]: the routed experts' w13 and w2 bytes of another
// layer at M = 1 (default Qwen3-30B-A3B bf16's), e.g. gpt-oss-120b fp8: 4 x 5760 x 2880 and
// 4 x 2880 x 2880.
int main(int argc, char** argv) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int64_t w13_bytes = 8ll * 1536 * 2048 * 2, w2_bytes = 8ll * 2048 * 768 * 2;
  if (argc == 3) w13_bytes = std::atoll(argv[1]), w2_bytes = std::atoll(argv[2]);
  // Per-CTA shares in whole warp stages (the few bytes over the layer's round up).
  const int64_t w13_stages = (w13_bytes / kStageBytes + sms - 1) / sms;
  const int64_t w2_stages = (w2_bytes / kStageBytes + sms - 1) / sms;
  const int64_t total = (w13_stages + w2_stages) * sms * kStageBytes;
  uint4 *data, *flush;
  uint32_t* sink;
  unsigned int* counter;
  const int64_t flush_bytes = 256ll << 20;
  CHECK(cudaMalloc(&data, total));
  CHECK(cudaMalloc(&flush, flush_bytes));
  CHECK(cudaMalloc(&sink, 1 << 20));
  CHECK(cudaMalloc(&counter, sizeof(unsigned int)));
  fill_kernel<<<1024, 256>>>(data, total / 16, 1);
  fill_kernel<<<1024, 256>>>(flush, flush_bytes / 16, 2);
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaDeviceSynchronize());
  Timer timer{s, flush, flush_bytes / 16, sink};
  std::printf("w13 %.1f MB + w2 %.1f MB per layer; per CTA %lld + %lld stages of %d B; %d SMs\n",
              w13_bytes / 1e6, w2_bytes / 1e6, (long long)w13_stages, (long long)w2_stages,
              kStageBytes, sms);

  for (int64_t bytes : {total, w13_stages * sms * kStageBytes}) {
    cudaGraphExec_t g =
        capture(s, [&] { read_kernel<<<1056, 256, 0, s>>>(data, bytes / 16, sink); });
    std::printf("%-58s %7.1f us\n",
                bytes == total ? "read-only kernel, w13 + w2" : "read-only kernel, w13 alone",
                timer.median_us(g));
    CHECK(cudaGraphExecDestroy(g));
  }

  Params p{};
  p.w13 = data;
  p.w2 = data + w13_stages * sms * kStageBytes / 16;
  p.w13_stages_per_cta = w13_stages;
  p.w2_stages_per_cta = w2_stages;
  p.counter = counter;
  p.sink = sink;
  // Half of each CTA's w2 share on chip (96 KiB: a multiple of the stage size).
  const int64_t half = (w2_stages / 2) * kStageBytes;
  bool coop = true;
  {
    // Is a cooperative launch capturable here? Try once; fall back to plain launches if not.
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(sms);
    cfg.blockDim = dim3(kWarps * 32);
    cfg.dynamicSmemBytes = size_t(kWarps) * 3 * kStageBytes;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CHECK(cudaFuncSetAttribute(skeleton_kernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(cfg.dynamicSmemBytes)));
    p.barrier = 1;
    const cudaError_t launch = cudaLaunchKernelEx(&cfg, skeleton_kernel<3>, p);
    const cudaError_t end = cudaStreamEndCapture(s, &g);
    if (launch != cudaSuccess || end != cudaSuccess) {
      std::printf("cooperative launch in a capture: %s / %s -> plain launches\n",
                  cudaGetErrorName(launch), cudaGetErrorName(end));
      coop = false;
      cudaGetLastError();
    } else {
      std::printf("cooperative launch in a capture: accepted\n");
      CHECK(cudaGraphDestroy(g));
    }
  }

  p.barrier = 0;
  p.hold_bytes = 0;
  run_skeleton<3>(timer, p, sms, false, "one kernel, no barrier, w13 then w2 streamed");
  p.barrier = 1;
  run_skeleton<2>(timer, p, sms, coop, "barrier, all w2 after it");
  run_skeleton<3>(timer, p, sms, coop, "barrier, all w2 after it");
  run_skeleton<4>(timer, p, sms, coop, "barrier, all w2 after it");
  p.hold_bytes = half;
  run_skeleton<2>(timer, p, sms, coop, "barrier, half of w2 held on chip from the start");
  if (size_t(kWarps) * 3 * kStageBytes + p.hold_bytes <= 227 * 1024)
    run_skeleton<3>(timer, p, sms, coop, "barrier, half of w2 held on chip from the start");
  p.hold_bytes = w2_stages * kStageBytes;
  if (size_t(kWarps) * 1 * kStageBytes + p.hold_bytes <= 227 * 1024) {
    // The whole share on chip leaves room for a ring of... depth 1 is no ring; depth 2 if it fits.
    if (size_t(kWarps) * 2 * kStageBytes + p.hold_bytes <= 227 * 1024)
      run_skeleton<2>(timer, p, sms, coop, "barrier, all of w2 held on chip");
    else
      std::printf("all of w2 held on chip: %lld KiB + a 2-stage ring do not fit in 227 KiB\n",
                  (long long)(p.hold_bytes / 1024));
  }
  CHECK(cudaDeviceSynchronize());
  std::printf("done\n");
  return 0;
}
