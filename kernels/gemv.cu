#include <string>

#include "kernels/gemv.h"
#include "kernels/gemv_kernel.cuh"

namespace twinstep::kernels {

namespace {

void check_shape(const char* launcher, const void* w, const void* x, const void* out, int m, int n,
                 int k) {
  if (w == nullptr || x == nullptr || out == nullptr)
    throw_invalid_argument(launcher, "null pointer (w, x, out must be device buffers)");
  if (m < 1 || m > kGemvMaxRows)
    throw_invalid_argument(launcher, "m = " + std::to_string(m) + " outside [1, 16]");
  if (n <= 0 || n % 64 != 0)
    throw_invalid_argument(launcher,
                           "n = " + std::to_string(n) + " is not a positive multiple of 64");
  if (k <= 0 || k % 64 != 0)
    throw_invalid_argument(launcher,
                           "k = " + std::to_string(k) + " is not a positive multiple of 64");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// launchers (the kernel is in gemv_kernel.cuh, shared with lm_head.cu and moe.cu)

namespace detail {

GemvTuning& gemv_tuning() {
  static GemvTuning tuning;
  return tuning;
}

int num_sms() {
  static const int count = [] {
    int device = 0, sms = 0;
    TS_CUDA_CHECK(cudaGetDevice(&device));
    TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return sms;
  }();
  return count;
}

}  // namespace detail

void gemv(const bf16* w, const bf16* x, bf16* out, int m, int n, int k, cudaStream_t stream,
          bool pdl) {
  check_shape(__func__, w, x, out, m, n, k);
  detail::GemvParams p = {};
  p.w = w;
  p.x = x;
  p.m = m;
  p.n = n;
  p.k = k;
  p.out = out;
  detail::launch_gemv<detail::GemvEpilogue::kStore>(p, stream,
                                                    pdl && m <= detail::gemv_tuning().pdl_max_rows);
}

void gemv_swiglu(const bf16* w_gate_up, const bf16* x, bf16* out, int m, int n, int k,
                 cudaStream_t stream, bool pdl) {
  check_shape(__func__, w_gate_up, x, out, m, n, k);
  detail::GemvParams p = {};
  p.w = w_gate_up;
  p.x = x;
  p.m = m;
  p.n = n;
  p.k = k;
  p.out = out;
  detail::launch_gemv<detail::GemvEpilogue::kSwiglu>(
      p, stream, pdl && m <= detail::gemv_tuning().pdl_max_rows);
}

}  // namespace twinstep::kernels
