// Probe for compute-sanitizer initcheck (scripts/gpu_sanitize.sh runs it under the tool): does
// initcheck see the output of a cuBLAS bf16 GEMM as written? The GEMM is the engine's prefill
// projection call (runtime/engine.cc Engine::proj: out[m][n] = x[m][k] · w[n][k]^T), into a
// buffer nothing else writes; a plain kernel then reads every element. Three writers: a plain
// store kernel (the control), cuBLAS with the engine's settings, cuBLAS in pedantic math. The
// program checks every output against a CPU reference, so when initcheck reports "Uninitialized
// __global__ memory read" in read_kernel<V>, the values were written (by writer V) and the report
// is the tool's.
//   cublas_initcheck_probe [WRITER]   WRITER 0, 1 or 2 (default all): prints one line per writer
//                                     and shape, exits 1 on a wrong product
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: cuBLAS status %d\n", what, static_cast<int>(s));
    std::exit(2);
  }
}

// How the probe's output buffer is written before read_kernel<V> reads it (the kernel's template
// argument names the variant in initcheck's reports).
enum Variant : int {
  kOwnKernel = 0,       // a plain store kernel: the control, initcheck must stay silent
  kEngineCublas = 1,    // cuBLAS as runtime/engine.cc configures it (workspace, default math)
  kPedanticCublas = 2,  // cuBLAS with CUBLAS_PEDANTIC_MATH (TWINSTEP_CUBLAS_MATH=pedantic)
};

const char* variant_name(int v) {
  switch (v) {
    case kOwnKernel:
      return "own store kernel";
    case kEngineCublas:
      return "cuBLAS, engine settings";
    default:
      return "cuBLAS, pedantic math";
  }
}

// Sums every element of `in` into `out[0]` (one block; the order does not matter here).
template <int V>
__global__ void read_kernel(const __nv_bfloat16* in, size_t count, float* out) {
  float sum = 0;
  for (size_t i = threadIdx.x; i < count; i += blockDim.x) sum += __bfloat162float(in[i]);
  atomicAdd(out, sum);
}

// out[r][c] = sum_i x[r][i] * w[c][i], one thread per output, fp32 accumulation.
__global__ void store_kernel(const __nv_bfloat16* w, const __nv_bfloat16* x, __nv_bfloat16* out,
                             int m, int n, int k) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(m) * n) return;
  const int r = int(idx / n), c = int(idx % n);
  float acc = 0;
  for (int i = 0; i < k; ++i)
    acc += __bfloat162float(x[size_t(r) * k + i]) * __bfloat162float(w[size_t(c) * k + i]);
  out[idx] = __float2bfloat16(acc);
}

// Returns true when the output written by `variant` matches the CPU reference within bf16
// rounding.
bool probe(int variant, int m, int n, int k) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<__nv_bfloat16> w(size_t(n) * k), x(size_t(m) * k);
  for (auto& v : w) v = __float2bfloat16(dist(rng));
  for (auto& v : x) v = __float2bfloat16(dist(rng));
  __nv_bfloat16 *dw, *dx, *dout;
  float* dsum;
  void* workspace = nullptr;
  check(cudaMalloc(&dw, w.size() * sizeof(w[0])), "cudaMalloc w");
  check(cudaMalloc(&dx, x.size() * sizeof(x[0])), "cudaMalloc x");
  check(cudaMalloc(&dout, size_t(m) * n * sizeof(__nv_bfloat16)), "cudaMalloc out");
  check(cudaMalloc(&dsum, sizeof(float)), "cudaMalloc sum");
  check(cudaMemcpy(dw, w.data(), w.size() * sizeof(w[0]), cudaMemcpyHostToDevice), "upload w");
  check(cudaMemcpy(dx, x.data(), x.size() * sizeof(x[0]), cudaMemcpyHostToDevice), "upload x");
  check(cudaMemset(dsum, 0, sizeof(float)), "memset sum");
  const size_t count = size_t(m) * n;
  if (variant == kOwnKernel) {
    store_kernel<<<unsigned((count + 255) / 256), 256>>>(dw, dx, dout, m, n, k);
    check(cudaGetLastError(), "store_kernel launch");
    read_kernel<kOwnKernel><<<1, 256>>>(dout, count, dsum);
  } else {
    cublasHandle_t handle;
    check(cublasCreate(&handle), "cublasCreate");
    if (variant == kEngineCublas) {  // the engine's settings (runtime/engine.cc Engine::Engine)
      const size_t workspace_bytes = size_t{32} << 20;
      check(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc workspace");
      check(cublasSetWorkspace(handle, workspace, workspace_bytes), "cublasSetWorkspace");
      check(cublasSetMathMode(handle, static_cast<cublasMath_t>(
                                          CUBLAS_DEFAULT_MATH |
                                          CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
            "cublasSetMathMode");
    } else {
      check(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode pedantic");
    }
    const float alpha = 1.0f, beta = 0.0f;
    check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, dw, CUDA_R_16BF, k, dx,
                       CUDA_R_16BF, k, &beta, dout, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
    if (variant == kEngineCublas)
      read_kernel<kEngineCublas><<<1, 256>>>(dout, count, dsum);
    else
      read_kernel<kPedanticCublas><<<1, 256>>>(dout, count, dsum);
    check(cudaDeviceSynchronize(), "synchronize");
    check(cublasDestroy(handle), "cublasDestroy");
  }
  check(cudaGetLastError(), "read_kernel launch");
  check(cudaDeviceSynchronize(), "synchronize");
  std::vector<__nv_bfloat16> out(count);
  check(cudaMemcpy(out.data(), dout, out.size() * sizeof(out[0]), cudaMemcpyDeviceToHost),
        "download out");
  double worst = 0;
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < n; ++c) {
      double ref = 0, mag = 0;
      for (int i = 0; i < k; ++i) {
        const double p = double(__bfloat162float(x[size_t(r) * k + i])) *
                         double(__bfloat162float(w[size_t(c) * k + i]));
        ref += p;
        mag += std::fabs(p);
      }
      const double got = __bfloat162float(out[size_t(r) * n + c]);
      worst = std::fmax(worst, std::fabs(got - ref) / (mag + 1e-30));
    }
  check(cudaFree(dw), "cudaFree");
  check(cudaFree(dx), "cudaFree");
  check(cudaFree(dout), "cudaFree");
  check(cudaFree(dsum), "cudaFree");
  if (workspace != nullptr) check(cudaFree(workspace), "cudaFree");
  const bool ok = worst < 1e-2;  // bf16 output rounding relative to the sum of |products|
  std::printf(
      "cublas_initcheck_probe variant %d (%s) m %d n %d k %d: output %s the CPU reference (worst "
      "error %.2e of the sum of |products|); initcheck reports for it name read_kernel<%d>\n",
      variant, variant_name(variant), m, n, k, ok ? "matches" : "DOES NOT match", worst, variant);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int only = -1;
  if (argc > 1) {
    only = std::atoi(argv[1]);
    if (only < kOwnKernel || only > kPedanticCublas) {
      std::fprintf(stderr, "cublas_initcheck_probe: writer %s is not 0, 1 or 2\n", argv[1]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cublas_initcheck_probe: no CUDA device\n");
    return 0;
  }
  bool ok = true;
  for (int variant : {kOwnKernel, kEngineCublas, kPedanticCublas}) {
    if (only >= 0 && variant != only) continue;
    ok = probe(variant, 48, 1024, 512) && ok;   // the tiny runtime model's prefill qkv (37 tokens)
    ok = probe(variant, 64, 6144, 4096) && ok;  // Llama-3-8B's qkv over 64 prompt rows
  }
  return ok ? 0 : 1;
}
