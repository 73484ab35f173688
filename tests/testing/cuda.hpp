// The GPU tests' guard (tests/test_gpu_*.cpp, ctest label gpu): without a CUDA device a test
// skips, saying why; scripts/gpu-check.sh runs them on the GPU machine.
#pragma once

#include <gtest/gtest.h>

#include "host/cuda_runtime.hpp"

#define ZW_SKIP_WITHOUT_CUDA()                                                                 \
  do {                                                                                         \
    if (!::zerowait::internal::cuda_runtime().ok) {                                            \
      GTEST_SKIP() << "no CUDA: " << ::zerowait::internal::cuda_runtime().reason;              \
    }                                                                                          \
  } while (0)
