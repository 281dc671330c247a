#include <string>

#include "kernels/gemv.h"
#include "kernels/gemv_kernel.cuh"
#include "kernels/gemv_norm.h"

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

void check_norm_sq(const char* launcher, const void* sq) {
  if (sq == nullptr) throw_invalid_argument(launcher, "null sq (the tile sums of squares)");
}

constexpr int kNormThreads = 256;

// Block = one row; half-warp h of the block owns tiles h, h + 16, ...: lane i squares column
// 16 t + i and the half-warp sums with gemv_residual's butterfly (same bits for the same row).
__global__ void __launch_bounds__(kNormThreads)
    rms_sq_partials_kernel(const bf16* residual, float* sq, int hidden) {
  detail::pdl_wait_and_trigger();
  const int tiles = hidden / 16, lane16 = threadIdx.x % 16;
  const unsigned mask = 0xFFFFu << (threadIdx.x & 16);
  const bf16* row = residual + static_cast<size_t>(blockIdx.x) * hidden;
  for (int t = threadIdx.x / 16; t < tiles; t += kNormThreads / 16) {
    const float v = __bfloat162float(row[t * 16 + lane16]);
    const float s = detail::half_warp_sum(__fmul_rn(v, v), mask);
    if (lane16 == 0) sq[static_cast<size_t>(blockIdx.x) * tiles + t] = s;
  }
}

// 8 elements (16 bytes) per thread and iteration; k % 8 == 0, so a vector never straddles rows.
__global__ void fold_norm_weight_kernel(const bf16* w, const bf16* gamma, bf16* out, size_t vectors,
                                        int k) {
  for (size_t v = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 x = reinterpret_cast<const uint4*>(w)[v];
    const uint4 g = *reinterpret_cast<const uint4*>(gamma + (v * 8) % k);
    uint4 y;
    const uint32_t *xw = &x.x, *gw = &g.x;
    uint32_t* yw = &y.x;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 a = detail::unpack_bf16x2(xw[e]), b = detail::unpack_bf16x2(gw[e]);
      yw[e] = detail::pack_bf16x2(a.x * b.x, a.y * b.y);
    }
    reinterpret_cast<uint4*>(out)[v] = y;
  }
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

namespace {

// The shape checked (errors name `launcher`), the dense-mode parameters filled.
detail::GemvParams checked_params(const char* launcher, const bf16* w, const bf16* x, bf16* out,
                                  int m, int n, int k) {
  check_shape(launcher, w, x, out, m, n, k);
  detail::GemvParams p = {};
  p.w = w;
  p.x = x;
  p.m = m;
  p.n = n;
  p.k = k;
  p.out = out;
  return p;
}

// PDL where the tuning allows it for m rows (GemvTuning::pdl_max_rows).
bool pdl_for_rows(bool pdl, int m) { return pdl && m <= detail::gemv_tuning().pdl_max_rows; }

}  // namespace

void gemv(const bf16* w, const bf16* x, bf16* out, int m, int n, int k, cudaStream_t stream,
          bool pdl) {
  const detail::GemvParams p = checked_params(__func__, w, x, out, m, n, k);
  detail::launch_gemv<detail::GemvEpilogue::kStore>(p, stream, pdl_for_rows(pdl, m));
}

void gemv_swiglu(const bf16* w_gate_up, const bf16* x, bf16* out, int m, int n, int k,
                 cudaStream_t stream, bool pdl) {
  const detail::GemvParams p = checked_params(__func__, w_gate_up, x, out, m, n, k);
  detail::launch_gemv<detail::GemvEpilogue::kSwiglu>(p, stream, pdl_for_rows(pdl, m));
}

// ---------------------------------------------------------------------------------------------
// the RMSNorm carried by the GEMVs (gemv_norm.h): the split kernel's epilogues (fill 3) always

void gemv_residual(const bf16* w, const bf16* x, bf16* residual, float* sq, int m, int n, int k,
                   cudaStream_t stream, bool pdl) {
  detail::GemvParams p = checked_params(__func__, w, x, residual, m, n, k);
  check_norm_sq(__func__, sq);
  p.norm_sq_out = sq;
  detail::launch_gemv_split<detail::GemvEpilogue::kResidual>(p, detail::gemv_tuning(), stream,
                                                             pdl_for_rows(pdl, m));
}

namespace {

template <detail::GemvEpilogue kEpilogue>
void launch_normed(const char* launcher, const bf16* w_folded, const bf16* x, const float* sq,
                   float eps, bf16* out, int m, int n, int k, cudaStream_t stream, bool pdl) {
  detail::GemvParams p = checked_params(launcher, w_folded, x, out, m, n, k);
  check_norm_sq(launcher, sq);
  if (!(eps > 0.0f)) throw_invalid_argument(launcher, "eps must be > 0");
  p.norm_sq_in = sq;
  p.norm_eps = eps;
  detail::launch_gemv_split<kEpilogue>(p, detail::gemv_tuning(), stream, pdl_for_rows(pdl, m));
}

}  // namespace

void gemv_normed(const bf16* w_folded, const bf16* x, const float* sq, float eps, bf16* out, int m,
                 int n, int k, cudaStream_t stream, bool pdl) {
  launch_normed<detail::GemvEpilogue::kStoreNormed>(__func__, w_folded, x, sq, eps, out, m, n, k,
                                                    stream, pdl);
}

void gemv_swiglu_normed(const bf16* w_gate_up_folded, const bf16* x, const float* sq, float eps,
                        bf16* out, int m, int n, int k, cudaStream_t stream, bool pdl) {
  launch_normed<detail::GemvEpilogue::kSwigluNormed>(__func__, w_gate_up_folded, x, sq, eps, out, m,
                                                     n, k, stream, pdl);
}

void rms_sq_partials(const bf16* residual, float* sq, int m, int hidden, cudaStream_t stream,
                     bool pdl) {
  TS_REQUIRE(residual != nullptr && sq != nullptr, "null residual or sq");
  TS_REQUIRE(m >= 1, "m = " + std::to_string(m) + " must be >= 1");
  TS_REQUIRE(hidden > 0 && hidden % 64 == 0,
             "hidden = " + std::to_string(hidden) + " is not a positive multiple of 64");
  detail::launch(rms_sq_partials_kernel, dim3(m), dim3(kNormThreads), 0, stream, pdl, residual, sq,
                 hidden);
}

void fold_norm_weight(const bf16* w, const bf16* gamma, bf16* w_folded, int rows, int k,
                      cudaStream_t stream) {
  TS_REQUIRE(w != nullptr && gamma != nullptr && w_folded != nullptr, "null w, gamma or w_folded");
  TS_REQUIRE(rows >= 1, "rows = " + std::to_string(rows) + " must be >= 1");
  TS_REQUIRE(k > 0 && k % 8 == 0, "k = " + std::to_string(k) + " is not a positive multiple of 8");
  const size_t vectors = static_cast<size_t>(rows) * k / 8;
  const int blocks = static_cast<int>(std::min<size_t>((vectors + 255) / 256, 8192));
  detail::launch(fold_norm_weight_kernel, dim3(blocks), dim3(256), 0, stream, false, w, gamma,
                 w_folded, vectors, k);
}

}  // namespace twinstep::kernels
