// `modmoe-bench --stages`: the stages of the portable CUDA path timed one by one, by calling the
// kernels of src/cuda/ directly with the shapes and buffers CudaExperts uses.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "bench_device.h"
#include "bench_models.h"
#include "modmoe/moe_types.h"

namespace modmoe::bench {

struct StageInputs {
  MoEConfig config;  // bf16 in, quant none or an fp8 scheme
  int64_t M = 0;
  Routing routing = Routing::softmax_topk;
  const void* x = nullptr;                 // (M, K) bf16, device
  const float* logits = nullptr;           // (M, E) fp32, device
  const float* correction_bias = nullptr;  // (E) fp32, device (DeepSeek routing), or null
  ExpertWeights weights;                   // device
};

struct StageTiming {
  std::string name;
  std::string covers;  // what the stage does, in one line
  Timing time;         // replays == 0: not part of this configuration's path
  std::string error;   // the kernel refused the arguments
};

// Runs the whole path once (so each stage's inputs hold real data), then times each stage
// alone as its own CUDA graph: `replays` replays, L2 flushed before each (when `flush` is set).
std::vector<StageTiming> time_stages(const StageInputs& in, cudaStream_t stream, int replays,
                                     L2Flush* flush);

}  // namespace modmoe::bench
