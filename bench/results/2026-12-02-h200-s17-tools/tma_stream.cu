// Session 16 tool for the next session (not part of the library): at what rate does the Hopper
// GEMM's weight stream read the DRAM when nothing else runs? The same persistent grid (one CTA
// per SM, tiles c, c + grid, ...), the same 32 KB stages of 256 weight rows x 128 bytes through
// TMA with full/empty mbarriers, and a consumer that only frees each stage (the fourteenth
// session's no-MMA bound, alone). Against: the same with the boxes of 4 K blocks asked for in
// the L2 together (grouped-l2-prefetch-of-b.patch), 128-row boxes, contiguous 32 KB bulk copies
// (a weight layout pre-arranged per stage), and a plain vectorized read of the same bytes.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I src -o /tmp/tma_stream \
//        build-run/tma_stream.cu -lcuda && /tmp/tma_stream
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/sm90/sm90_ptx.cuh"

using namespace modmoe::cuda::sm90;

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

enum Mode : int { kBox = 0, kBoxGrouped = 1, kBulk = 2, kBoxA = 3, kGatedA = 4 };

struct Params {
  int mode, experts, n_blocks, k_blocks, box_rows;
  int a_rows;  // kBoxA / kGatedA: rows of the activation buffer (expert e's rows start at e * a_rows / experts)
  const uint8_t* w;  // kBulk: stage s of tile t at w + (t * k_blocks + s) * stage_bytes
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SM90_DEVICE 1
#endif

#ifdef SM90_DEVICE
__device__ __forceinline__ void prefetch_box(const CUtensorMap* map, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}

__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

#endif

template <int kStages>
__global__ void __launch_bounds__(384, 1) stream_kernel(const __grid_constant__ CUtensorMap map,
                                                        const __grid_constant__ CUtensorMap map_a,
                                                        const Params p) {
#ifdef SM90_DEVICE
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const bool with_a = p.mode == kBoxA || p.mode == kGatedA;
  const uint32_t b_bytes = p.box_rows * 128, stage_bytes = b_bytes + (with_a ? 64 * 128 : 0);
  __shared__ uint64_t full[kStages], empty[kStages];
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], 1);
    fence_barrier_init();
  }
  __syncthreads();
  const int tiles = p.experts * p.n_blocks;
  int stage = 0;
  uint32_t phase = 0;
  if (threadIdx.x == 0) {  // producer
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const int e = t / p.n_blocks, nb = t % p.n_blocks;
      for (int kb = 0; kb < p.k_blocks; ++kb) {
        if (p.mode == kBoxGrouped && kb % 4 == 0)
          for (int g = kb; g < min(kb + 4, p.k_blocks); ++g) prefetch_box(&map, g * 128, nb * p.box_rows, e);
        mbar_wait(&empty[stage], phase ^ 1);
        mbar_arrive_expect_tx(&full[stage], stage_bytes);
        uint8_t* dst = ring + stage * stage_bytes;
        if (with_a) {
          tma_load_2d(dst + b_bytes, &map_a, &full[stage], kb * 128, e * p.a_rows / p.experts);
        }
        if (p.mode == kBulk) {
          bulk_load(dst, p.w + (static_cast<int64_t>(t) * p.k_blocks + kb) * stage_bytes, stage_bytes,
                    &full[stage]);
        } else if (p.mode == kGatedA) {  // (K, half, N/2, E): gate box, then up box, of 128 rows each
          tma_load_4d(dst, &map, &full[stage], kb * 128, 0, nb * (p.box_rows / 2), e);
          tma_load_4d(dst + b_bytes / 2, &map, &full[stage], kb * 128, 1, nb * (p.box_rows / 2), e);
        } else {
          tma_load_3d(dst, &map, &full[stage], kb * 128, nb * p.box_rows, e);
        }
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
    }
  } else if (threadIdx.x == 32) {  // consumer: frees each stage once it has landed
    for (int t = blockIdx.x; t < tiles; t += gridDim.x)
      for (int kb = 0; kb < p.k_blocks; ++kb) {
        mbar_wait(&full[stage], phase);
        mbar_arrive(&empty[stage]);
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
  }
#endif
}

__global__ void read_kernel(const uint4* w, int64_t n, uint32_t* sink) {
  uint32_t x = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldg(w + i);
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x12345678u) *sink = x;
}


int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status));
  auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  const int reps = getenv("REPS") ? atoi(getenv("REPS")) : 7;
  const int64_t flush_bytes = int64_t{256} << 20;
  uint4* flush = nullptr;
  uint32_t* sink = nullptr;
  CK(cudaMalloc(&flush, flush_bytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(flush, 1, flush_bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // (experts, weight rows per expert, K bytes): Qwen3-30B-A3B fp8 at M = 16, GEMM2 and GEMM1.
  struct Shape {
    const char* name;
    int experts, rows, k;
  };
  const Shape shapes[] = {{"GEMM2 81x2048x768", 81, 2048, 768}, {"GEMM1 81x1536x2048", 81, 1536, 2048}};
  std::printf("%-22s %-30s %9s %9s %7s\n", "shape", "pattern", "us", "GB/s", "%read");
  for (const Shape& sh : shapes) {
    const int64_t bytes = int64_t{sh.experts} * sh.rows * sh.k;
    uint8_t* w = nullptr;
    CK(cudaMalloc(&w, bytes));
    CK(cudaMemset(w, 3, bytes));
    auto time_it = [&](auto launch) {
      std::vector<float> t;
      for (int r = 0; r < reps; ++r) {
        read_kernel<<<sms * 8, 256>>>(flush, flush_bytes / 16, sink);
        CK(cudaEventRecord(e0));
        launch();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms * 1000.0f);
      }
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    const float read_us = time_it([&] { read_kernel<<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(w), bytes / 16, sink); });
    auto report = [&](const char* pattern, float us) {
      std::printf("%-22s %-30s %9.1f %9.0f %6.0f%%\n", sh.name, pattern, us, bytes / us / 1e3, 100.0 * read_us / us);
    };
    report("ld.global.v4 (reference)", read_us);
    // The activations: 128 rows (M = 16, top-8) of K bytes, L2-resident after the first tile.
    const int a_rows = 128;
    uint8_t* a = nullptr;
    CK(cudaMalloc(&a, int64_t{a_rows} * sh.k));
    CK(cudaMemset(a, 5, int64_t{a_rows} * sh.k));
    auto map3 = [&](int box_rows) {
      CUtensorMap map;
      const cuuint64_t dims[3] = {cuuint64_t(sh.k), cuuint64_t(sh.rows), cuuint64_t(sh.experts)};
      const cuuint64_t strides[2] = {cuuint64_t(sh.k), cuuint64_t(sh.k) * sh.rows};
      const cuuint32_t box[3] = {128, cuuint32_t(box_rows), 1}, elem[3] = {1, 1, 1};
      if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, w, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        std::printf("encode 3d failed\n"), std::exit(1);
      return map;
    };
    CUtensorMap map_gated;  // (K, half, rows / 2, E): GateUp halves
    {
      const cuuint64_t half = sh.rows / 2;
      const cuuint64_t dims[4] = {cuuint64_t(sh.k), 2, half, cuuint64_t(sh.experts)};
      const cuuint64_t strides[3] = {cuuint64_t(sh.k) * half, cuuint64_t(sh.k), cuuint64_t(sh.k) * sh.rows};
      const cuuint32_t box[4] = {128, 1, 128, 1}, elem[4] = {1, 1, 1, 1};
      if (encode(&map_gated, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, w, dims, strides, box, elem,
                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        std::printf("encode 4d failed\n"), std::exit(1);
    }
    CUtensorMap map_a;
    {
      const cuuint64_t dims[2] = {cuuint64_t(sh.k), cuuint64_t(a_rows)};
      const cuuint64_t strides[1] = {cuuint64_t(sh.k)};
      const cuuint32_t box[2] = {128, 64}, elem[2] = {1, 1};
      if (encode(&map_a, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, a, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        std::printf("encode 2d failed\n"), std::exit(1);
    }
    const CUtensorMap map256 = map3(256), map128 = map3(128);
    struct Variant {
      const char* name;
      int mode, box_rows, threads;
      bool full_smem;  // the real kernel's 232448 bytes (L1 left small)
    };
    const Variant variants[] = {
        {"box 256r", kBox, 256, 64, false},
        {"box 128r", kBox, 128, 64, false},
        {"bulk 32KB", kBulk, 256, 64, false},
        {"box 256r + A 64r", kBoxA, 256, 64, false},
        {"box 256r + A, 384t full smem", kBoxA, 256, 384, true},
        {"gated 2x128r + A", kGatedA, 256, 64, false},
        {"gated 2x128r + A, 384t full", kGatedA, 256, 384, true},
    };
    for (const Variant& v : variants) {
      const int stages = 5;
      const int stage_bytes = v.box_rows * 128 + (v.mode == kBoxA || v.mode == kGatedA ? 64 * 128 : 0);
      const int smem = v.full_smem ? 232448 - 8192 : stages * stage_bytes + 1024;
      CK(cudaFuncSetAttribute(stream_kernel<5>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      Params p{v.mode, sh.experts, sh.rows / v.box_rows, sh.k / 128, v.box_rows, a_rows, w};
      const CUtensorMap& map = v.mode == kGatedA ? map_gated : v.box_rows == 256 ? map256 : map128;
      const float us = time_it([&] { stream_kernel<5><<<sms, v.threads, smem>>>(map, map_a, p); });
      CK(cudaGetLastError());
      report(v.name, us);
    }
    CK(cudaFree(a));
    CK(cudaFree(w));
  }
  return 0;
}
