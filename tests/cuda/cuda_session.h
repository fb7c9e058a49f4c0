// A stream and a CUDA context for one test, with helpers that move host tensors to and from
// the device through the library's own allocator and copy_tensor. Create it after
// MODMOE_REQUIRE_GPU(), before the tensors it makes (they are freed on its stream).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "modmoe/allocator.h"
#include "modmoe/context.h"
#include "modmoe/cuda.h"
#include "error_message.h"  // error_of, which these tests use with a session
#include "modmoe/error.h"
#include "oracle/problem.h"  // bytes_of, with the problems these tests move

namespace modmoe::testing {

class CudaSession {
 public:
  CudaSession() {
    const cudaError_t err = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (err != cudaSuccess) throw std::runtime_error(cudaGetErrorString(err));
    ctx_ = cuda_context(0, stream_);
  }
  ~CudaSession() {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  CudaSession(const CudaSession&) = delete;
  CudaSession& operator=(const CudaSession&) = delete;

  const Context& ctx() const { return ctx_; }
  cudaStream_t stream() const { return stream_; }

  // Uninitialized device memory.
  OwnedTensor empty(DType dtype, const Shape& shape) const {
    return OwnedTensor(ctx_.alloc(), dtype, shape, stream_);
  }
  // A device copy of a contiguous host tensor.
  OwnedTensor to_device(const Tensor& host) const {
    OwnedTensor device = empty(host.dtype(), host.shape());
    copy_tensor(ctx_, device, host);
    return device;
  }
  // A host copy of a contiguous device tensor (waits for the stream).
  OwnedTensor to_host(const Tensor& device) const {
    OwnedTensor host = host_tensor(device.dtype(), device.shape());
    copy_tensor(ctx_, host, device);
    return host;
  }
  void sync() const { synchronize(ctx_); }

 private:
  cudaStream_t stream_ = nullptr;
  Context ctx_;
};

}  // namespace modmoe::testing
