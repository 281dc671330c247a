// Shared types and error handling for the twinstep CUDA kernels (host-includable).
//
// Every launcher in kernels/ validates its shapes and throws std::invalid_argument (message names
// the launcher and the bad value) before touching the GPU; CUDA failures throw std::runtime_error
// with file:line and cudaGetErrorString. Launchers never synchronize; all work goes on `stream`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

namespace twinstep::kernels {

using bf16 = __nv_bfloat16;

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void throw_invalid_argument(const char* launcher, const std::string& message);

}  // namespace twinstep::kernels

// Checks a CUDA runtime call; throws std::runtime_error("file:line: expr: error string").
#define TS_CUDA_CHECK(expr)                                                      \
  do {                                                                           \
    cudaError_t ts_err_ = (expr);                                                \
    if (ts_err_ != cudaSuccess)                                                  \
      ::twinstep::kernels::throw_cuda_error(ts_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// Shape/argument precondition of a launcher: throws std::invalid_argument naming the launcher.
#define TS_REQUIRE(cond, message)                                                  \
  do {                                                                             \
    if (!(cond)) ::twinstep::kernels::throw_invalid_argument(__func__, (message)); \
  } while (0)
