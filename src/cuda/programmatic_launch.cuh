// Programmatic dependent launch (sm_90+, "PDL"). A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start before the stream's previous
// kernel has finished: once every CTA of that kernel has called allow_dependent_launch() (or
// exited). Until the dependent calls wait_for_prerequisite_grids() it may read only what was
// written before the previous kernel began (weights, or what a kernel two launches back wrote)
// and must write nothing that kernel reads or writes; after the wait, everything the previous
// kernel wrote is visible. Both instructions are no-ops in a kernel launched normally, so a
// kernel may call them unconditionally.
//
// What the previous kernel writes must not be read through a `const T* __restrict__` kernel
// parameter: the compiler may load such memory as invariant (LDG.CONSTANT) and hoist the loads
// above the wait, whose memory clobber holds back only ordinary loads. The weighted reduce did
// (docs/perf.md, thirty-third session); tests/cuda/late_writer.cuh is the test for it.
//
// Users: the decode path (down after gate_up), Sm90Experts' decode-sized applies (GEMM1 after
// the gather or quantize-scatter, GEMM2 after GEMM1, the weighted reduce after GEMM2) and
// BatchedSm90Experts' (GEMM2 after GEMM1), each of which loads what is older than its previous
// kernel (weights, row indices, counts) before it waits.
// MODMOE_PDL=0 turns every programmatic launch off (to measure what they bring, or where a tool
// mishandles them).
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

namespace modmoe::cuda {

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prerequisite_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Whether launches on the current device may be programmatic: sm_90+ and MODMOE_PDL != "0".
inline bool programmatic_launch_available() {
  static const bool env_allows = [] {
    const char* v = std::getenv("MODMOE_PDL");
    return v == nullptr || std::string(v) != "0";
  }();
  int device = 0, major = 0;
  return env_allows && cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 9;
}

// Points `config` at `attribute`, filled in: a programmatic launch when `programmatic`, a normal
// one otherwise.
inline void set_programmatic(cudaLaunchConfig_t& config, cudaLaunchAttribute& attribute,
                             bool programmatic) {
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = programmatic ? 1 : 0;
}

}  // namespace modmoe::cuda
