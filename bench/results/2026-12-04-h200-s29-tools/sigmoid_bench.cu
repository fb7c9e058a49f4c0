// Session 29 study tool: the cost (cycles per warp-element) and the accuracy of forms of
// act(gate) * up for the Hopper gated epilogue, in an epilogue-like loop: 64 independent
// elements per thread, the row amax, and (optionally) the fp8 e4m3 pair conversion.
#include <cuda_fp8.h>
#include <cstdio>
#include <cmath>
#include <cstdint>
#include <vector>

__device__ __forceinline__ float ex2f(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float rcpf(float x) { float y; asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float tanhf_approx(float x) { float y; asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }

template <int kForm>
__device__ __forceinline__ float silu_mul(float g, float u) {
  if constexpr (kForm == 0) {  // HEAD: ex2 + rcp (two MUFU)
    const float e = ex2f(g * -1.4426950408889634f);
    return g * rcpf(1.0f + e) * u;
  } else if constexpr (kForm == 1) {  // tanh: sigmoid(x) = 0.5 + 0.5 tanh(x / 2) (one MUFU)
    const float h = 0.5f * g * u;
    return fmaf(h, tanhf_approx(0.5f * g), h);
  } else {  // ex2 + Newton reciprocal from a bit-trick seed (kForm - 1 iterations)
    const float y = 1.0f + ex2f(fminf(g * -1.4426950408889634f, 126.0f));
    float r = __int_as_float(0x7EF311C3 - __float_as_int(y));
#pragma unroll
    for (int i = 0; i < kForm - 1; ++i) {
      const float e = fmaf(-y, r, 1.0f);
      r = fmaf(r, e, r);
    }
    return g * r * u;
  }
}

template <int kForm, bool kConvert>
__global__ void __launch_bounds__(256) bench(const float* in, uint32_t* sink, int iters) {
  float g[64], u[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    g[i] = in[(threadIdx.x + i) % 256] ;
    u[i] = in[(threadIdx.x + 3 * i + 7) % 256];
  }
  uint32_t acc = 0;
  for (int it = 0; it < iters; ++it) {
    float v[64];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      v[i] = silu_mul<kForm>(g[i], u[i]);
      amax = fmaxf(amax, fabsf(v[i]));
    }
    if constexpr (kConvert) {
      const float inv = 448.0f / fmaxf(amax, 1e-12f);
#pragma unroll
      for (int i = 0; i < 64; i += 2) {
        const __nv_fp8x2_storage_t c =
            __nv_cvt_float2_to_fp8x2(make_float2(v[i] * inv, v[i + 1] * inv), __NV_SATFINITE, __NV_E4M3);
        acc += c;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 64; ++i) acc += __float_as_uint(v[i]);
      acc += __float_as_uint(amax);
    }
    // Perturb the inputs a little so nothing is loop-invariant.
#pragma unroll
    for (int i = 0; i < 64; ++i) g[i] += 1e-7f;
  }
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

template <int kForm>
__global__ void accuracy(float* out, int n, float lo, float hi) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = lo + (hi - lo) * (static_cast<float>(i) / (n - 1));
  out[i] = silu_mul<kForm>(x, 1.0f);
}

template <int kForm, bool kConvert>
double time_form(const float* in, uint32_t* sink, int blocks, int iters) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  bench<kForm, kConvert><<<blocks, 256>>>(in, sink, 2);
  cudaEventRecord(a);
  bench<kForm, kConvert><<<blocks, 256>>>(in, sink, iters);
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms;
}

template <int kForm>
void report_accuracy(const char* name) {
  const int n = 1 << 20;
  float* d;
  cudaMalloc(&d, n * sizeof(float));
  std::vector<float> h(n);
  double worst_rel_pos = 0, worst_abs = 0, worst_rel_m6 = 0, worst_rel_m10 = 0;
  accuracy<kForm><<<(n + 255) / 256, 256>>>(d, n, -20.0f, 20.0f);
  cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
  for (int i = 0; i < n; ++i) {
    const float xf = -20.0f + 40.0f * (static_cast<float>(i) / (n - 1));
    const double x = xf;
    const double ref = x / (1.0 + std::exp(-x));
    const double err = std::fabs(h[i] - ref);
    worst_abs = std::fmax(worst_abs, err / std::fmax(std::fabs(x), 1e-30));  // relative to |gate*up|
    if (x > 0) worst_rel_pos = std::fmax(worst_rel_pos, err / std::fabs(ref));
    if (x >= -6 && x < 0) worst_rel_m6 = std::fmax(worst_rel_m6, err / std::fabs(ref));
    if (x >= -10 && x < -6) worst_rel_m10 = std::fmax(worst_rel_m10, err / std::fabs(ref));
  }
  printf("%-14s error/|gate*up| max %.2e; relative: x>0 %.2e, -6<=x<0 %.2e, -10<=x<-6 %.2e\n", name,
         worst_abs, worst_rel_pos, worst_rel_m6, worst_rel_m10);
  cudaFree(d);
}

int main() {
  int sms = 0, clock_khz = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  float* in;
  uint32_t* sink;
  cudaMalloc(&in, 256 * sizeof(float));
  std::vector<float> h(256);
  for (int i = 0; i < 256; ++i) h[i] = -4.0f + 8.0f * i / 255.0f;
  cudaMemcpy(in, h.data(), sizeof(float) * 256, cudaMemcpyHostToDevice);
  const int blocks = sms, iters = 4000;  // one 8-warp block per SM: two warps per scheduler
  cudaMalloc(&sink, blocks * 256 * sizeof(uint32_t));
  // cycles per warp-element on one scheduler (2 warps per scheduler, 64 elements each per iter)
  auto cycles = [&](double ms) { return ms * 1e-3 * clock_khz * 1e3 / (iters * 64.0 * 2.0); };
  const char* names[] = {"ex2+rcp (HEAD)", "tanh", "ex2+newton1", "ex2+newton2", "ex2+newton3"};
  double t[5][2];
  t[0][0] = time_form<0, false>(in, sink, blocks, iters); t[0][1] = time_form<0, true>(in, sink, blocks, iters);
  t[1][0] = time_form<1, false>(in, sink, blocks, iters); t[1][1] = time_form<1, true>(in, sink, blocks, iters);
  t[2][0] = time_form<2, false>(in, sink, blocks, iters); t[2][1] = time_form<2, true>(in, sink, blocks, iters);
  t[3][0] = time_form<3, false>(in, sink, blocks, iters); t[3][1] = time_form<3, true>(in, sink, blocks, iters);
  t[4][0] = time_form<4, false>(in, sink, blocks, iters); t[4][1] = time_form<4, true>(in, sink, blocks, iters);
  printf("SMs %d, clock %d MHz (nominal); cycles per warp-element per scheduler (2 warps each):\n", sms,
         clock_khz / 1000);
  for (int f = 0; f < 5; ++f)
    printf("%-14s  act+amax %.2f   act+amax+e4m3 pair %.2f   (%.3f / %.3f ms)\n", names[f],
           cycles(t[f][0]), cycles(t[f][1]), t[f][0], t[f][1]);
  report_accuracy<0>(names[0]);
  report_accuracy<1>(names[1]);
  report_accuracy<3>(names[3]);
  report_accuracy<4>(names[4]);
  const cudaError_t e = cudaDeviceSynchronize();
  printf("status: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
