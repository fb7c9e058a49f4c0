// Shared helpers for the GPU tests: skip without a device, move problems to and from it.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "modmoe/cuda.h"

// Every GPU test starts with this: without a CUDA device (CI) the test is reported skipped.
#define MODMOE_REQUIRE_GPU()                                           \
  do {                                                                 \
    if (!::modmoe::cuda_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// A CUDA runtime call that must succeed, with the error's name and text when it does not.
#define ASSERT_CUDA(expr)                                                           \
  do {                                                                              \
    const cudaError_t err_ = (expr);                                                \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorName(err_) << " (" \
                                 << cudaGetErrorString(err_) << ")";                \
  } while (0)
