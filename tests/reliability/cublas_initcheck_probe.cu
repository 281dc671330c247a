// Probe for compute-sanitizer initcheck (scripts/gpu_sanitize.sh runs it under the tool): does
// initcheck see the output of a cuBLAS bf16 GEMM as written? The GEMM is the engine's prefill
// projection call (runtime/engine.cc Engine::proj: out[m][n] = x[m][k] · w[n][k]^T), into a
// buffer nothing else writes; a plain kernel then reads every element. The program checks the
// output against a CPU reference, so when initcheck reports "Uninitialized __global__ memory read"
// in read_kernel, the values were written (by the GEMM) and the report is the tool's.
//   cublas_initcheck_probe            prints one line per shape, exits 1 on a wrong product
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
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

// Sums every element of `in` into `out[0]` (one block; the order does not matter here).
__global__ void read_kernel(const __nv_bfloat16* in, size_t count, float* out) {
  float sum = 0;
  for (size_t i = threadIdx.x; i < count; i += blockDim.x) sum += __bfloat162float(in[i]);
  atomicAdd(out, sum);
}

// Returns true when the GEMM's output matches the CPU reference within bf16 rounding.
bool probe(cublasHandle_t handle, int m, int n, int k) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<__nv_bfloat16> w(size_t(n) * k), x(size_t(m) * k);
  for (auto& v : w) v = __float2bfloat16(dist(rng));
  for (auto& v : x) v = __float2bfloat16(dist(rng));
  __nv_bfloat16 *dw, *dx, *dout;
  float* dsum;
  check(cudaMalloc(&dw, w.size() * sizeof(w[0])), "cudaMalloc w");
  check(cudaMalloc(&dx, x.size() * sizeof(x[0])), "cudaMalloc x");
  check(cudaMalloc(&dout, size_t(m) * n * sizeof(__nv_bfloat16)), "cudaMalloc out");
  check(cudaMalloc(&dsum, sizeof(float)), "cudaMalloc sum");
  check(cudaMemcpy(dw, w.data(), w.size() * sizeof(w[0]), cudaMemcpyHostToDevice), "upload w");
  check(cudaMemcpy(dx, x.data(), x.size() * sizeof(x[0]), cudaMemcpyHostToDevice), "upload x");
  check(cudaMemset(dsum, 0, sizeof(float)), "memset sum");
  const float alpha = 1.0f, beta = 0.0f;
  check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, dw, CUDA_R_16BF, k, dx,
                     CUDA_R_16BF, k, &beta, dout, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  read_kernel<<<1, 256>>>(dout, size_t(m) * n, dsum);
  check(cudaGetLastError(), "read_kernel launch");
  check(cudaDeviceSynchronize(), "synchronize");
  std::vector<__nv_bfloat16> out(size_t(m) * n);
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
  const bool ok = worst < 1e-2;  // bf16 output rounding relative to the sum of |products|
  std::printf(
      "cublas_initcheck_probe m %d n %d k %d: output %s the CPU reference (worst error %.2e "
      "of the sum of |products|)\n",
      m, n, k, ok ? "matches" : "DOES NOT match", worst);
  return ok;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cublas_initcheck_probe: no CUDA device\n");
    return 0;
  }
  cublasHandle_t handle;
  check(cublasCreate(&handle), "cublasCreate");
  bool ok = probe(handle, 48, 1024, 512);  // the tiny runtime model's prefill qkv (37-token prompt)
  ok = probe(handle, 64, 6144, 4096) && ok;  // Llama-3-8B's qkv over 64 prompt rows
  check(cublasDestroy(handle), "cublasDestroy");
  return ok ? 0 : 1;
}
