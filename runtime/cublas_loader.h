// cuBLAS entry points, loaded on first use (dlopen) instead of linked into every binary.
//
// Linking libcublas runs cuBLASLt's static initialisers in every process before main(): about
// 0.5 s and 200 MB of resident memory (`perf record twinstep --version`, Debian 12, CUDA 13.0),
// paid by simulator-only runs, queries and sweeps that never touch a GPU. The engine's prefill
// GEMM is the runtime's only cuBLAS user, so it calls through this table.
#pragma once

#include <cublas_v2.h>

namespace twinstep::runtime {

// cublasGemmEx with a cublasComputeType_t (C++ also sees an inline overload taking cudaDataType).
using CublasGemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                          int, int, const void*, const void*, cudaDataType, int,
                                          const void*, cudaDataType, int, const void*, void*,
                                          cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  CublasGemmExFn gemm_ex = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// The process's cuBLAS (libcublas.so.<CUBLAS_VER_MAJOR>: first beside the libcudart this binary
// runs with, then the loader's search path), loaded once, thread-safe. Throws Error naming the
// library and the loader's message when it cannot be loaded or lacks an entry point; a failed
// load is retried by the next call.
const CublasApi& cublas_api();

// Where the loaded library lives ("" before the first successful cublas_api()).
const char* cublas_library_path();

}  // namespace twinstep::runtime
