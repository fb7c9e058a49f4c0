// A kernel that writes a programmatic dependent's inputs late, for the tests of programmatic
// launches (programmatic_launch.cuh). It lets its dependents launch at once, spins ~2 ms, then
// copies the real inputs over poisoned ones and fills the dependent's output with 0xFF bytes
// (NaN as float, bf16 and fp16). A dependent that reads an input before its
// griddepcontrol.wait reads the poison; one that writes its output before the wait has it
// overwritten with NaN. Either way its result is non-finite or wrong.
//
// Launch the dependent normally once (and wait for it) before the late writer: a kernel's first
// launch in a process loads its module (lazy loading), which waits for the kernels in flight
// and so keeps the programmatic launch from starting early. Without that launch the GEMM's test
// passed with the producer's wait removed; with it, it fails (2026-12-04, docs/perf.md
// thirty-third session).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/programmatic_launch.cuh"
#include "modmoe/tensor.h"

namespace modmoe::testing {

struct LateWrites {
  struct Copy {
    const uint32_t* src = nullptr;
    uint32_t* dst = nullptr;
    int64_t words = 0;
  };
  Copy copies[2];               // the real inputs over the poisoned ones (unused: words = 0)
  uint32_t* nan_fill = nullptr;  // the dependent's output, then filled with 0xFFFFFFFF
  int64_t nan_words = 0;
};

// `src` over `dst` (two device tensors of the same size in bytes, a multiple of 4).
inline LateWrites::Copy late_copy(const Tensor& src, const Tensor& dst) {
  return {static_cast<const uint32_t*>(src.data()), static_cast<uint32_t*>(dst.data()),
          static_cast<int64_t>(src.nbytes() / 4)};
}

// ~4M SM cycles (~2 ms at the H200's clocks): far longer than the host takes to enqueue the
// dependent and the dependent's blocks take to start.
constexpr int64_t kLateWriterSpinCycles = 4000000;

static __global__ void late_writes_kernel(LateWrites w, int64_t spin_cycles) {
  cuda::allow_dependent_launch();
  const long long start = clock64();
  while (clock64() - start < spin_cycles) {
  }
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (const LateWrites::Copy& c : w.copies)
    for (int64_t i = first; i < c.words; i += stride) c.dst[i] = c.src[i];
  for (int64_t i = first; i < w.nan_words; i += stride) w.nan_fill[i] = 0xFFFFFFFFu;
}

// Four blocks: the dependent's blocks find free SMs while it spins.
inline cudaError_t launch_late_writes(const LateWrites& w, cudaStream_t stream) {
  late_writes_kernel<<<4, 256, 0, stream>>>(w, kLateWriterSpinCycles);
  return cudaGetLastError();
}

}  // namespace modmoe::testing
