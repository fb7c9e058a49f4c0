// Shared helpers for the GPU tests: skip without a device, move problems to and from it.
#pragma once

#include <gtest/gtest.h>

#include "modmoe/cuda.h"

// Every GPU test starts with this: without a CUDA device (CI) the test is reported skipped.
#define MODMOE_REQUIRE_GPU()                                           \
  do {                                                                 \
    if (!::modmoe::cuda_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)
