// CUDA error checks for the CUDA backend (host side).
#pragma once

#include <cuda_runtime.h>

#include "modmoe/error.h"

// Throws modmoe::Error naming the call, the CUDA error and where it happened.
#define MODMOE_CUDA_CHECK(expr)                                                              \
  do {                                                                                       \
    const cudaError_t modmoe_cuda_err_ = (expr);                                             \
    MODMOE_CHECK(modmoe_cuda_err_ == cudaSuccess)                                            \
        << #expr << " failed: " << cudaGetErrorName(modmoe_cuda_err_) << " ("               \
        << cudaGetErrorString(modmoe_cuda_err_) << ") at " << __FILE__ << ":" << __LINE__;   \
  } while (0)

// After a kernel launch: catches launch-configuration errors without synchronizing.
#define MODMOE_CUDA_CHECK_LAUNCH() MODMOE_CUDA_CHECK(cudaGetLastError())
