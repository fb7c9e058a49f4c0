// Host-side CUDA helpers of the GPU benchmark: checked calls, owned device buffers, graphs and
// event timing of graph replays; the device's properties, its read bandwidth and trimming the
// memory pools between cases (those three in bench_device.cu).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "modmoe/error.h"

// Throws modmoe::Error naming the call and the CUDA error.
#define BENCH_CUDA(expr)                                                                    \
  do {                                                                                      \
    const cudaError_t bench_err_ = (expr);                                                  \
    MODMOE_CHECK(bench_err_ == cudaSuccess)                                                 \
        << "modmoe-bench: " << #expr << " failed: " << cudaGetErrorName(bench_err_) << " (" \
        << cudaGetErrorString(bench_err_) << ") at " << __FILE__ << ":" << __LINE__;        \
  } while (0)

namespace modmoe::bench {

// cudaMalloc'ed bytes, freed on destruction. Plain cudaMalloc (not the stream-ordered pool):
// weights of one case are freed before the next case allocates its own.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) BENCH_CUDA(cudaMalloc(&data_, bytes));
  }
  ~DeviceBuffer() {
    if (data_) cudaFree(data_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Copies a host vector into a new device buffer (synchronously: setup code only).
template <typename T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer d(host.size() * sizeof(T));
  if (!host.empty()) {
    BENCH_CUDA(cudaMemcpy(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  return d;
}

// An instantiated graph of whatever `enqueue` puts on `stream`. modmoe's forward is captured in
// global mode (a synchronizing or allocating call anywhere fails the capture instead of timing
// a host round trip); the cuBLAS baseline in thread-local mode, the mode frameworks use.
class Graph {
 public:
  template <typename Enqueue>
  Graph(cudaStream_t stream, cudaStreamCaptureMode mode, Enqueue&& enqueue) {
    BENCH_CUDA(cudaStreamBeginCapture(stream, mode));
    try {
      enqueue();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(stream, &broken);
      if (broken) cudaGraphDestroy(broken);
      throw;
    }
    BENCH_CUDA(cudaStreamEndCapture(stream, &graph_));
    BENCH_CUDA(cudaGraphGetNodes(graph_, nullptr, &nodes_));
    BENCH_CUDA(cudaGraphInstantiate(&exec_, graph_, 0));
    BENCH_CUDA(cudaGraphUpload(exec_, stream));
  }
  ~Graph() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void launch(cudaStream_t stream) const { BENCH_CUDA(cudaGraphLaunch(exec_, stream)); }
  size_t nodes() const { return nodes_; }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  size_t nodes_ = 0;
};

// Evicts the L2 between timed replays by passing a buffer a few times its size through it, so
// every replay reads its weights from device memory, as a layer in a real model does (the other
// layers have run in between). Not timed.
//   read (default): plain loads (ld.global.cg, normal priority). The L2 is left full of clean
//     lines: evicting them costs the timed kernels nothing.
//   write: a memset (the benchmarks' flush until 2026-12-01). It leaves the L2 full of dirty
//     lines, and the timed kernels paid for writing them back: 4.9-12.2 MB of DRAM writes in
//     the first decode kernel of Qwen3 / Qwen3.5 M = 1, typically 6-10 us a case (ncu and an A/B
//     on the H200, docs/perf.md twelfth session). Kept to reproduce older numbers.
enum class L2FlushKind { read, write };
const char* l2_flush_kind_name(L2FlushKind kind);

class L2Flush {
 public:
  L2Flush() = default;
  explicit L2Flush(size_t l2_bytes, L2FlushKind kind = L2FlushKind::read);
  void run(cudaStream_t stream);

 private:
  DeviceBuffer buffer_, sink_;
  L2FlushKind kind_ = L2FlushKind::read;
  int value_ = 0;
};

struct Timing {
  double median_us = 0, min_us = 0, max_us = 0;
  int replays = 0;
};

// Idle time before each timing (modmoe-bench --settle-ms; default kDefaultSettleMs). Through a
// compute-bound case the H200 sits at its power cap and lowers its SM clock (1455-1605 MHz
// measured, "SW Power Cap" active), and a case timed right after it inherited the lower clock:
// Mixtral fp8 M = 1 took 121.8 us after the bf16 series and 111.3 us alone (docs/perf.md,
// twelfth session). The clock was back within 250 ms; idle clocks drop only after ~1 s.
constexpr int kDefaultSettleMs = 300;
void set_settle_ms(int ms);
int settle_ms();
// Waits for the device, then sleeps settle_ms().
void settle_before_timing();

// Times `replays` runs of `launch` on `stream` with one event pair each (after the settle and
// `warmup` untimed runs); `flush` (may be null) runs before each, outside the events.
template <typename Launch>
Timing time_replays(cudaStream_t stream, int replays, int warmup, L2Flush* flush, Launch&& launch) {
  settle_before_timing();
  for (int i = 0; i < warmup; ++i) {
    if (flush) flush->run(stream);
    launch();
  }
  std::vector<cudaEvent_t> events(2 * static_cast<size_t>(replays));
  for (auto& e : events) BENCH_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < replays; ++i) {
    if (flush) flush->run(stream);
    BENCH_CUDA(cudaEventRecord(events[2 * i], stream));
    launch();
    BENCH_CUDA(cudaEventRecord(events[2 * i + 1], stream));
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> us(replays);
  for (int i = 0; i < replays; ++i) {
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]));
    us[i] = ms * 1e3;
  }
  for (auto& e : events) cudaEventDestroy(e);
  std::sort(us.begin(), us.end());
  Timing t;
  t.replays = replays;
  t.median_us = us[us.size() / 2];
  t.min_us = us.front();
  t.max_us = us.back();
  return t;
}

// GPU 0's properties and the CUDA versions, as the benchmarks' headers and JSON report them.
struct DeviceInfo {
  std::string name;
  int sm_count = 0, cc_major = 0, cc_minor = 0;
  size_t l2_bytes = 0, memory_bytes = 0;
  int runtime = 0, driver = 0;
};

DeviceInfo device_info();

// Median read bandwidth in bytes/s of the streaming-read kernel (bench_kernels.h) over `bytes`
// (a multiple of 16), 20 timed replays after 3 untimed; the buffer is freed before it returns.
double measure_read_bandwidth(size_t bytes, cudaStream_t stream);

// The same for the streaming-write kernel over `bytes`, and for the copy kernel moving `bytes`
// between two buffers of bytes / 2 (bytes read + bytes written per second).
double measure_write_bandwidth(size_t bytes, cudaStream_t stream);
double measure_copy_bandwidth(size_t bytes, cudaStream_t stream);

// The time of a CUDA graph of 1 and of 2 empty kernel nodes, timed like every case (median of
// 30 replays between events, `flush` before each): the part of any case's time that is graph
// launch and kernel-boundary latency, not work. Context for the M = 1 floors, which have none.
// And of 1 empty kernel between two stream-ordered allocations and their frees: four graph
// memory nodes, as a captured forward had while ModularKernel::forward allocated its two
// workspaces separately (since the twenty-fourth session one allocation: two nodes of a decode
// layer's 4-5). Kept as it was measured, so the sessions' floors stay comparable.
struct LaunchFloor {
  double one_kernel_us = 0, two_kernels_us = 0, one_kernel_two_allocations_us = 0;
};
LaunchFloor measure_launch_floor(cudaStream_t stream, L2Flush* flush);

// Releases what the stream-ordered pool and graph memory nodes kept from a case.
void trim_device_memory();

}  // namespace modmoe::bench
