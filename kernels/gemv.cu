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

namespace {

// gemv_rmsnorm / gemv_swiglu_rmsnorm: shapes as the GEMV, m <= 8, the norm's buffers.
detail::GemvParams norm_params(const char* launcher, const bf16* w, const bf16* delta,
                               const bf16* residual_in, bf16* residual_out, const bf16* norm_weight,
                               bf16* out, int m, int n, int k, float eps) {
  check_shape(launcher, w, residual_in, out, m, n, k);
  if (residual_out == nullptr || norm_weight == nullptr)
    throw_invalid_argument(launcher, "null residual_out or norm_weight");
  if (m > kGemvNormMaxRows)
    throw_invalid_argument(launcher, "m = " + std::to_string(m) + " outside [1, 8]");
  if (residual_out == residual_in || residual_out == delta)
    throw_invalid_argument(launcher, "residual_out must not alias residual_in or delta");
  if (!(eps > 0.0f)) throw_invalid_argument(launcher, "eps must be > 0");
  if (detail::gemv_tuning().fill != 3)
    throw_invalid_argument(launcher, "needs the split-K GEMV (GemvTuning::fill 3)");
  detail::GemvParams p = {};
  p.w = w;
  p.m = m;
  p.n = n;
  p.k = k;
  p.out = out;
  p.res_in = residual_in;
  p.delta = delta;
  p.res_out = residual_out;
  p.norm_w = norm_weight;
  p.eps = eps;
  return p;
}

}  // namespace

void gemv_rmsnorm(const bf16* w, const bf16* delta, const bf16* residual_in, bf16* residual_out,
                  const bf16* norm_weight, bf16* out, int m, int n, int k, float eps,
                  cudaStream_t stream, bool pdl) {
  const detail::GemvParams p =
      norm_params(__func__, w, delta, residual_in, residual_out, norm_weight, out, m, n, k, eps);
  detail::launch_gemv_split<detail::GemvEpilogue::kStore, true>(
      p, detail::gemv_tuning(), stream, pdl && m <= detail::gemv_tuning().pdl_max_rows);
}

void gemv_swiglu_rmsnorm(const bf16* w_gate_up, const bf16* delta, const bf16* residual_in,
                         bf16* residual_out, const bf16* norm_weight, bf16* out, int m, int n,
                         int k, float eps, cudaStream_t stream, bool pdl) {
  const detail::GemvParams p = norm_params(__func__, w_gate_up, delta, residual_in, residual_out,
                                           norm_weight, out, m, n, k, eps);
  detail::launch_gemv_split<detail::GemvEpilogue::kSwiglu, true>(
      p, detail::gemv_tuning(), stream, pdl && m <= detail::gemv_tuning().pdl_max_rows);
}

}  // namespace twinstep::kernels
