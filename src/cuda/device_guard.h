// Makes a context's device current for the duration of a call (host side), restoring the
// previous one after: kernels launch on the current device, and a stream only accepts work
// from its own device.
#pragma once

#include <cuda_runtime.h>

#include "cuda/cuda_check.h"

namespace modmoe::cuda {

class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    MODMOE_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != index) MODMOE_CUDA_CHECK(cudaSetDevice(index));
    switched_ = previous_ != index;
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);  // a destructor must not throw
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace modmoe::cuda
