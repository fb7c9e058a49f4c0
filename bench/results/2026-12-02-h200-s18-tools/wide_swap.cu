// Session 18 feasibility study (not product code): Mixtral-8x7B M = 1024's two GEMMs as plain
// bf16 grouped GEMMs (GEMM1 = the gate_up weights as a plain N_b = 28672 GEMM), 2048 rows over 8
// experts from a random top-2 routing (256 +- ~15 rows each), on the 128x256 tile and on a
// swapped-operands tile with a 144-token side (two tiles per expert of <= 288 rows instead of
// three), built from s16's swapped-operands patch widened to n = 144 (bf16 only). Prints each
// tile's median time (L2 flushed before each run) and the relative RMS difference of the outs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda/sm90/sm90_gemm.h"

using namespace modmoe;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

__global__ void fill_kernel(__nv_bfloat16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
    x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull; x ^= x >> 29;
    p[i] = __float2bfloat16(scale * ((float)(x & 0xffffff) / 16777216.0f - 0.5f));
  }
}
__global__ void rms_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n, double* out) {
  double num = 0, den = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    num += (x - y) * (x - y); den += y * y;
  }
  atomicAdd(out, num); atomicAdd(out + 1, den);
}

struct Case { const char* name; int E, topk, M; int64_t N, K; };

int run_case(const Case& s, void* flush, size_t flush_bytes, cudaEvent_t e0, cudaEvent_t e1) {
  const int E = s.E, rows = s.M * s.topk;
  std::mt19937 rng(7);
  std::vector<int> counts(E, 0);
  for (int t = 0; t < s.M; ++t) {
    std::vector<int> picked;
    while ((int)picked.size() < s.topk) {
      int e = rng() % E;
      if (std::find(picked.begin(), picked.end(), e) == picked.end()) picked.push_back(e);
    }
    for (int e : picked) ++counts[e];
  }
  std::vector<int32_t> indptr(E + 1, 0);
  for (int e = 0; e < E; ++e) indptr[e + 1] = indptr[e] + counts[e];
  const int cmin = *std::min_element(counts.begin(), counts.end()), cmax = *std::max_element(counts.begin(), counts.end());
  int32_t* d_indptr; CK(cudaMalloc(&d_indptr, 4 * (E + 1)));
  CK(cudaMemcpy(d_indptr, indptr.data(), 4 * (E + 1), cudaMemcpyHostToDevice));
  __nv_bfloat16 *a, *b, *d[2];
  CK(cudaMalloc(&a, size_t(rows) * s.K * 2)); CK(cudaMalloc(&b, size_t(E) * s.N * s.K * 2));
  for (auto& p : d) CK(cudaMalloc(&p, size_t(rows) * s.N * 2));
  __nv_bfloat16* scratch_d; CK(cudaMalloc(&scratch_d, size_t(rows) * s.N * 2));
  fill_kernel<<<4096, 256>>>(a, size_t(rows) * s.K, 1, 2.0f);
  fill_kernel<<<4096, 256>>>(b, size_t(E) * s.N * s.K, 2, 2.0f / std::sqrt(float(s.K)));
  CK(cudaDeviceSynchronize());
  const char* tiles[5] = {"128x256", "144x256", "128x128", "64x256", "64x128"};
  float med[5] = {0, 0, 0, 0, 0};
  const int ntiles = getenv("WIDE_ALL_TILES") ? 5 : 2;
  for (int ti = 0; ti < ntiles; ++ti) {
    cuda::sm90::GemmArgs g;
    g.a = a; g.total_rows = rows; g.b = b; g.E = E; g.N_b = s.N; g.K = s.K; g.ab_dtype = DType::bf16;
    g.m_indptr = d_indptr; g.d = ti < 2 ? d[ti] : scratch_d; g.d_dtype = DType::bf16; g.tile = tiles[ti];
    const std::string why = cuda::sm90::can_implement(g);
    if (!why.empty()) { printf("%s %s: refused: %s\n", s.name, tiles[ti], why.c_str()); continue; }
    std::vector<float> us;
    for (int rep = 0; rep < 9; ++rep) {
      CK(cudaMemsetAsync(flush, rep, flush_bytes));
      cudaEventRecord(e0); cuda::sm90::launch(g, nullptr); cudaEventRecord(e1);
      CK(cudaEventSynchronize(e1)); float ms; cudaEventElapsedTime(&ms, e0, e1); us.push_back(ms * 1000);
    }
    std::sort(us.begin(), us.end());
    med[ti] = us[4];
  }
  double* acc; CK(cudaMalloc(&acc, 16)); CK(cudaMemset(acc, 0, 16));
  rms_kernel<<<1024, 256>>>(d[1], d[0], size_t(rows) * s.N, acc);
  double h[2]; CK(cudaMemcpy(h, acc, 16, cudaMemcpyDeviceToHost));
  const double flops = 2.0 * rows * s.N * s.K;
  printf("%-36s rows/expert %3d-%3d  128x256 %8.1f us (%5.1f TF/s)  144x256 %8.1f us (%5.1f TF/s)  ratio %.3f  rms diff %.1e",
         s.name, cmin, cmax, med[0], flops / med[0] / 1e6, med[1], flops / med[1] / 1e6, med[1] / med[0], std::sqrt(h[0] / h[1]));
  for (int ti = 2; ti < ntiles; ++ti) printf("  %s %.1f", tiles[ti], med[ti]);
  printf("\n");
  cudaFree(a); cudaFree(b); cudaFree(d[0]); cudaFree(d[1]); cudaFree(acc); cudaFree(d_indptr);
  return 0;
}

int main() {
  void* flush; const size_t flush_bytes = 256u << 20; CK(cudaMalloc(&flush, flush_bytes));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  const Case cases[] = {
      {"mixtral M1024 GEMM1 plain 28672x4096", 8, 2, 1024, 28672, 4096},
      {"mixtral M1024 GEMM2 4096x14336", 8, 2, 1024, 4096, 14336},
      {"mixtral M1024 GEMM1 half 14336x4096", 8, 2, 1024, 14336, 4096},
      {"qwen3.5 M8192 GEMM2 2048x512", 256, 8, 8192, 2048, 512},
      {"qwen3.5 M8192 GEMM1 plain 1024x2048", 256, 8, 8192, 1024, 2048},
      {"deepseek M8192 GEMM2 7168x2048", 256, 8, 8192, 7168, 2048},
      {"deepseek M8192 GEMM1 plain 4096x7168", 256, 8, 8192, 4096, 7168},
      {"gpt-oss M8192 GEMM2 2880x2880", 128, 4, 8192, 2880, 2880},
      {"qwen3 M8192 GEMM2 2048x768", 128, 8, 8192, 2048, 768},
  };
  const char* only = getenv("WIDE_ONLY");
  for (const Case& c : cases)
    if (!only || std::string(c.name).find(only) != std::string::npos) run_case(c, flush, flush_bytes, e0, e1);
  return 0;
}
