// Context: where and how a call runs (device, stream, allocator, options).
#pragma once

#include <cstdint>

#include "modmoe/allocator.h"
#include "modmoe/tensor.h"

namespace modmoe {

class Tracer;  // modmoe/trace.h

struct Context {
  Device device = Device::cpu();
  void* stream = nullptr;          // cudaStream_t on CUDA; unused on the CPU
  Allocator* allocator = nullptr;  // nullptr: the backend's default for `device`
  int sm_count = 0;                // filled by the CUDA backend; 0 on the CPU
  // No floating-point atomics anywhere in the forward. Every part today is deterministic
  // whatever this says (none uses float atomics); a faster non-deterministic part must honour it.
  bool deterministic = true;
  // ModularKernel::forward processes at most this many tokens per Experts::apply call, so
  // workspaces stay bounded for large M (vLLM: VLLM_FUSED_MOE_CHUNK_SIZE). <= 0: no limit.
  int64_t chunk_size = 32768;
  // Receives a named range around each stage of the forward (modmoe/trace.h); nullptr: none.
  Tracer* tracer = nullptr;

  static Context cpu() { return Context{}; }
  // The allocator to use: `allocator` if set, else the default for `device`.
  Allocator* alloc() const;
};

}  // namespace modmoe
