// The GPU side of modmoe-bench (compiled only in CUDA builds). modmoe_bench.cpp parses the
// command line; these run the measurements.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench_device.h"
#include "bench_models.h"
#include "modmoe/modular_kernel.h"

namespace modmoe::bench {

struct GpuSuiteOptions {
  std::vector<const ModelShape*> models;
  std::vector<int64_t> Ms;
  std::vector<QuantScheme> schemes;  // none (bf16) and/or fp8_block
  std::string prepare_finalize = "NoEPPrepareAndFinalize";
  std::string experts = "auto";  // "auto": the best registered CUDA experts for the case
  int replays = 30;              // timed graph replays per case (median reported); >= 20
  bool flush_l2 = true;          // evict the L2 before every timed replay
  L2FlushKind flush_kind = L2FlushKind::read;  // how (bench_device.h)
  bool baseline = true;                        // time the cuBLAS per-expert baseline too
  bool stages = false;  // also time each stage of the portable path on its own
  // The forward's workspaces from an ArenaAllocator sized by an eager forward's peak, instead
  // of the default cudaMallocAsync pool: the captured graph then has no memory nodes.
  bool arena = false;
  uint64_t seed = 1;
  std::string json_path;  // empty: no JSON file
};

// Measures the read bandwidth and the GEMM peaks, then runs every (model, M, scheme) case on
// GPU 0 and prints a table last. Returns 0 when every case ran and matched the baseline
// (where one ran), 1 otherwise.
int run_gpu_suite(const GpuSuiteOptions& options);

struct GpuForwardTiming {
  double median_us = 0, min_us = 0;
  int replays = 0;
  size_t graph_nodes = 0;
  std::string device_name;
};

// Copies the host tensors of `host_args` to GPU 0, runs `kernel` once eagerly, captures one
// forward in a CUDA graph, times `replays` replays (L2 flushed before each), and copies the
// output back into host_args.output. The kernel must have been built for Device::cuda(0).
GpuForwardTiming time_forward_on_gpu(const ModularKernel& kernel, const ForwardArgs& host_args,
                                     int replays);

// The device's name ("NVIDIA H200"), for messages.
std::string gpu_name();

}  // namespace modmoe::bench
