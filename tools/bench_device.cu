// The non-template helpers of bench_device.h: the device's properties, its streaming-read
// bandwidth and trimming the memory pools. Shared by the suite (bench_gpu.cu) and --gemm
// (bench_sm90.cu).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

#include "bench_device.h"
#include "bench_kernels.h"

namespace modmoe::bench {

DeviceInfo device_info() {
  DeviceInfo d;
  cudaDeviceProp p{};
  BENCH_CUDA(cudaGetDeviceProperties(&p, 0));
  d.name = p.name;
  d.sm_count = p.multiProcessorCount;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.l2_bytes = p.l2CacheSize;
  d.memory_bytes = p.totalGlobalMem;
  cudaRuntimeGetVersion(&d.runtime);
  cudaDriverGetVersion(&d.driver);
  return d;
}

double measure_read_bandwidth(size_t bytes, cudaStream_t stream) {
  DeviceBuffer data(bytes), sink(size_t(stream_read_sink_words()) * 4);
  BENCH_CUDA(cudaMemsetAsync(data.get(), 0x5a, bytes, stream));
  const Timing t = time_replays(
      stream, 20, 3, nullptr, [&] { stream_read(data.get(), bytes, sink.as<uint32_t>(), stream); });
  return double(bytes) / (t.median_us * 1e-6);
}

double measure_write_bandwidth(size_t bytes, cudaStream_t stream) {
  DeviceBuffer data(bytes);
  uint32_t seed = 0;
  const Timing t = time_replays(stream, 20, 3, nullptr,
                                [&] { stream_write(data.get(), bytes, ++seed, stream); });
  return double(bytes) / (t.median_us * 1e-6);
}

double measure_copy_bandwidth(size_t bytes, cudaStream_t stream) {
  const size_t half = bytes / 32 * 16;
  DeviceBuffer src(half), dst(half);
  BENCH_CUDA(cudaMemsetAsync(src.get(), 0x5a, half, stream));
  const Timing t = time_replays(stream, 20, 3, nullptr,
                                [&] { stream_copy(src.get(), dst.get(), half, stream); });
  return double(2 * half) / (t.median_us * 1e-6);
}

LaunchFloor measure_launch_floor(cudaStream_t stream, L2Flush* flush) {
  LaunchFloor f;
  const Graph one(stream, cudaStreamCaptureModeThreadLocal, [&] { empty_kernels(1, stream); });
  f.one_kernel_us = time_replays(stream, 30, 3, flush, [&] { one.launch(stream); }).median_us;
  const Graph two(stream, cudaStreamCaptureModeThreadLocal, [&] { empty_kernels(2, stream); });
  f.two_kernels_us = time_replays(stream, 30, 3, flush, [&] { two.launch(stream); }).median_us;
  const Graph allocating(stream, cudaStreamCaptureModeThreadLocal, [&] {
    void *ws13 = nullptr, *ws2 = nullptr;
    BENCH_CUDA(cudaMallocAsync(&ws13, size_t(1) << 20, stream));
    BENCH_CUDA(cudaMallocAsync(&ws2, size_t(64) << 10, stream));
    empty_kernels(1, stream);
    BENCH_CUDA(cudaFreeAsync(ws2, stream));
    BENCH_CUDA(cudaFreeAsync(ws13, stream));
  });
  f.one_kernel_two_allocations_us =
      time_replays(stream, 30, 3, flush, [&] { allocating.launch(stream); }).median_us;
  return f;
}

const char* l2_flush_kind_name(L2FlushKind kind) {
  return kind == L2FlushKind::read ? "read" : "write";
}

L2Flush::L2Flush(size_t l2_bytes, L2FlushKind kind)
    : buffer_(std::max<size_t>(3 * l2_bytes, size_t(64) << 20)),
      sink_(size_t(stream_read_sink_words()) * 4),
      kind_(kind) {
  BENCH_CUDA(cudaMemset(buffer_.get(), 0x5a, buffer_.bytes()));
}

void L2Flush::run(cudaStream_t stream) {
  if (!buffer_.get()) return;
  if (kind_ == L2FlushKind::read) {
    stream_read(buffer_.get(), buffer_.bytes(), sink_.as<uint32_t>(), stream, ReadCaching::normal);
  } else {
    BENCH_CUDA(cudaMemsetAsync(buffer_.get(), ++value_ & 0xff, buffer_.bytes(), stream));
  }
}

namespace {
int g_settle_ms = kDefaultSettleMs;
}  // namespace

void set_settle_ms(int ms) { g_settle_ms = ms; }
int settle_ms() { return g_settle_ms; }

void settle_before_timing() {
  if (g_settle_ms <= 0) return;
  BENCH_CUDA(cudaDeviceSynchronize());
  std::this_thread::sleep_for(std::chrono::milliseconds(g_settle_ms));
}

void trim_device_memory() {
  cudaDeviceSynchronize();
  cudaDeviceGraphMemTrim(0);
  cudaMemPool_t pool = nullptr;
  if (cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
}

}  // namespace modmoe::bench
