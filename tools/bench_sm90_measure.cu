// `modmoe-bench --gemm`, what every case uses: one variant run eagerly, checked against the
// portable kernel's output and timed as a graph (bench_sm90.cu says how), and the operands.
#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>

#include "bench_device.h"
#include "bench_kernels.h"
#include "bench_sm90_cases.h"
#include "modmoe/error.h"
#include "modmoe/quant.h"

namespace modmoe::bench::gemm_bench {

// Clears a pending launch error; throws ContextLost when the context itself is broken.
void ensure_context_alive(const std::string& after) {
  cudaDeviceSynchronize();
  cudaGetLastError();
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    throw ContextLost("CUDA context lost (" + std::string(cudaGetErrorString(e)) + ") after " +
                      after);
  }
}

// out and ref: n bf16 values on the device.
Diff compare(Env& env, const void* out, const void* ref, int64_t n) {
  compare_bf16(out, ref, n, env.stats.as<double>(), env.partials.as<double>(), env.stream);
  std::array<double, 3> s{};
  BENCH_CUDA(
      cudaMemcpyAsync(s.data(), env.stats.get(), sizeof(s), cudaMemcpyDeviceToHost, env.stream));
  BENCH_CUDA(cudaStreamSynchronize(env.stream));
  Diff d;
  d.rel = std::sqrt(s[0] / std::max(s[1], 1e-300));
  d.non_finite = static_cast<int64_t>(s[2]);
  return d;
}

void poison(const DeviceBuffer& b, cudaStream_t stream) {  // 0xff: NaN in bf16, e4m3 and fp32
  BENCH_CUDA(cudaMemsetAsync(b.get(), 0xff, b.bytes(), stream));
}

Tensor on_gpu(const DeviceBuffer& b, DType dtype, const Shape& shape) {
  return Tensor(b.get(), dtype, shape, Device::cuda(0));
}

// Poisons the outputs, runs `enqueue` once, checks it, then times a graph of it. With
// `declinable`, a modmoe::Error from the eager run means "not applicable", not a failure.
void measure(Env& env, Measured& m, const std::function<void()>& poison_outputs,
             const std::function<void()>& enqueue, const std::function<Diff()>& check,
             bool declinable) {
  m.attempted = true;
  try {
    poison_outputs();
    enqueue();
    BENCH_CUDA(cudaStreamSynchronize(env.stream));
  } catch (const std::exception& e) {
    ensure_context_alive(e.what());
    if (declinable && dynamic_cast<const Error*>(&e)) {
      m.not_applicable = true;
      m.note = e.what();
    } else {
      m.error = e.what();
    }
    return;
  }
  try {
    m.diff = check();
    const Graph graph(env.stream, cudaStreamCaptureModeGlobal, enqueue);
    m.graph_nodes = graph.nodes();
    m.time =
        time_replays(env.stream, env.o.replays, 2, env.flush, [&] { graph.launch(env.stream); });
  } catch (const std::exception& e) {
    ensure_context_alive(e.what());
    m.error = e.what();
  }
}

// ---- operands -----------------------------------------------------------------------------------

Weights make_weights(DType dtype, const Fc1Shape& s, uint64_t seed, cudaStream_t stream) {
  Weights w;
  const int64_t n = s.E * s.N2 * s.K;
  if (dtype == DType::bf16) {
    w.b = DeviceBuffer(size_t(n) * 2);
    fill_normal(w.b.get(), DType::bf16, n, seed, 1.0f / std::sqrt(float(s.K)), stream);
    w.tb = on_gpu(w.b, DType::bf16, {s.E, s.N2, s.K});
    w.bytes_per_expert = 2.0 * s.N2 * s.K;
  } else {
    w.b = DeviceBuffer(size_t(n));
    fill_e4m3(w.b.as<uint8_t>(), n, seed, stream);
    const Shape ss = weight_scale_shape(QuantScheme::fp8_block, s.E, s.N2, s.K);
    w.b_scale = DeviceBuffer(size_t(shape_numel(ss)) * 4);
    // Codes are z * 112: scales u / (112 sqrt(K)), u in [0.5, 1.5), give weights ~ N(0, 1/K).
    const float sk = 1.0f / (112.0f * std::sqrt(float(s.K)));
    fill_uniform(w.b_scale.as<float>(), shape_numel(ss), seed + 1, 0.5f * sk, 1.5f * sk, stream);
    w.tb = on_gpu(w.b, DType::fp8_e4m3, {s.E, s.N2, s.K});
    w.tb_scale = on_gpu(w.b_scale, DType::fp32, ss);
    w.bytes_per_expert = double(s.N2 * s.K) + 4.0 * double(shape_numel(ss)) / s.E;
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  return w;
}

Activations make_activations(const Env& env, DType dtype, int64_t rows, int64_t K, uint64_t seed) {
  Activations x;
  if (dtype == DType::bf16) {
    x.a = DeviceBuffer(size_t(rows * K) * 2);
    fill_normal(x.a.get(), DType::bf16, rows * K, seed, 1.0f, env.stream);
    x.ta = on_gpu(x.a, DType::bf16, {rows, K});
  } else {
    DeviceBuffer staging(size_t(rows * K) * 2);
    fill_normal(staging.get(), DType::bf16, rows * K, seed, 1.0f, env.stream);
    const Shape ss = act_scale_shape(QuantScheme::fp8_block, rows, K);
    x.a = DeviceBuffer(size_t(rows * K));
    x.a_scale = DeviceBuffer(size_t(shape_numel(ss)) * 4);
    x.ta = on_gpu(x.a, DType::fp8_e4m3, {rows, K});
    x.ta_scale = on_gpu(x.a_scale, DType::fp32, ss);
    quantize_activations(env.ctx, on_gpu(staging, DType::bf16, {rows, K}), QuantScheme::fp8_block,
                         false, x.ta, x.ta_scale);
  }
  BENCH_CUDA(cudaStreamSynchronize(env.stream));
  x.bytes = double(x.ta.nbytes()) + (x.ta_scale.defined() ? double(x.ta_scale.nbytes()) : 0.0);
  return x;
}

}  // namespace modmoe::bench::gemm_bench
