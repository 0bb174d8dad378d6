#pragma once
// What GPU tests in every folder share: the skip, with the reason printed, where this build or
// process has no CUDA device (tests labelled gpu run everywhere and check something only on a
// GPU host).

#include <gtest/gtest.h>

#include "tessel/tensor/cuda/cuda.h"

// Skips the calling test unless a CUDA device is visible, printing why.
#define TESSEL_REQUIRE_CUDA()                                                     \
  do {                                                                            \
    if (::tessel::cuda::device_count() == 0) {                                    \
      GTEST_SKIP() << "no CUDA device: " << ::tessel::cuda::unavailable_reason(); \
    }                                                                             \
  } while (0)
