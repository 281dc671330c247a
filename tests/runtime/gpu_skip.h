// GPU suites of the runtime: skip (never pass vacuously) where no CUDA device is visible.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "runtime/real_backend.h"

#define SKIP_WITHOUT_GPU()                                                \
  do {                                                                    \
    std::string why_;                                                     \
    if (!::twinstep::real_backend_available(&why_)) GTEST_SKIP() << why_; \
  } while (0)
