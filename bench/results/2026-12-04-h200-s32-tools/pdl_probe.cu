// Session 32 probe: does a programmatic dependent launch start before its primary ends on this
// machine, in a plain stream and in a graph, for a small dependent and for one shaped like the
// Hopper GEMM (384 threads, 1 CTA per SM, ~200 KB shared memory), and when only thread 0 of each
// primary CTA triggers? The primary (4 CTAs) triggers at entry, then spins ~2 ms; the dependent
// (132 CTAs) stamps %globaltimer at entry, before griddepcontrol.wait. Printed: the dependent's
// first entry minus the primary's last exit (negative: it started early).
//   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a pdl_probe.cu -o pdl_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void primary(unsigned long long* end, long long spin, int all_threads_trigger) {
  if (all_threads_trigger || threadIdx.x == 0) asm volatile("griddepcontrol.launch_dependents;");
  const long long s = clock64();
  while (clock64() - s < spin) {
  }
  __syncthreads();
  if (threadIdx.x == 0) end[blockIdx.x] = now_ns();
}

__global__ void __launch_bounds__(384, 1) dependent(unsigned long long* start) {
  extern __shared__ char smem[];
  if (threadIdx.x == 0) {
    start[blockIdx.x] = now_ns();
    smem[0] = 1;
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

int main() {
  unsigned long long *end, *start;
  cudaMalloc(&end, 4 * sizeof(unsigned long long));
  cudaMalloc(&start, 132 * sizeof(unsigned long long));
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const int big_smem = 200 * 1024;
  cudaFuncSetAttribute(dependent, cudaFuncAttributeMaxDynamicSharedMemorySize, big_smem);
  for (int graph = 0; graph < 2; ++graph)
    for (int big = 0; big < 2; ++big)
      for (int all = 0; all < 2; ++all)
        for (int pdl = 0; pdl < 2; ++pdl) {
          const auto enqueue = [&] {
            primary<<<4, 256, 0, stream>>>(end, 4000000, all);
            cudaLaunchConfig_t c = {};
            c.gridDim = dim3(132);
            c.blockDim = dim3(big ? 384 : 128);
            c.dynamicSmemBytes = big ? big_smem : 1024;  // (0 here made smem[0] illegal: first run)
            c.stream = stream;
            cudaLaunchAttribute a;
            a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
            a.val.programmaticStreamSerializationAllowed = 1;
            c.attrs = &a;
            c.numAttrs = pdl;
            cudaLaunchKernelEx(&c, dependent, start);
          };
          cudaGraphExec_t exec = nullptr;
          if (graph) {
            cudaGraph_t g;
            cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
            enqueue();
            cudaStreamEndCapture(stream, &g);
            cudaGraphInstantiate(&exec, g, 0);
            cudaGraphLaunch(exec, stream);
          } else {
            enqueue();
          }
          cudaStreamSynchronize(stream);
          const cudaError_t err = cudaGetLastError();
          std::vector<unsigned long long> e(4), s(132);
          cudaMemcpy(e.data(), end, 4 * 8, cudaMemcpyDeviceToHost);
          cudaMemcpy(s.data(), start, 132 * 8, cudaMemcpyDeviceToHost);
          const long long last_end = static_cast<long long>(*std::max_element(e.begin(), e.end()));
          const long long first_start = static_cast<long long>(*std::min_element(s.begin(), s.end()));
          int early = 0;
          for (unsigned long long x : s) early += static_cast<long long>(x) < last_end;
          std::printf("%-6s %-5s dependent, trigger by %-11s pdl=%d: first dependent entry - primary end = %9.1f us, %3d of 132 CTAs entered early  %s\n",
                      graph ? "graph" : "stream", big ? "big" : "small", all ? "all threads" : "thread 0",
                      pdl, (first_start - last_end) / 1e3, early,
                      err == cudaSuccess ? "" : cudaGetErrorString(err));
          if (exec) cudaGraphExecDestroy(exec);
        }
  return 0;
}
