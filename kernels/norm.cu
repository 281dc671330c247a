#include <string>

#include "kernels/device.cuh"
#include "kernels/norm.h"
#include "kernels/tuning.h"

namespace twinstep::kernels {

namespace {

constexpr int kNormThreads = 256;

// ---------------------------------------------------------------------------------------------
// kernels

// Block = one row. Sum of squares in a fixed order (per thread, then a fixed tree), so the
// result of a row never depends on m.
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_residual_kernel(const bf16* delta, bf16* residual, const bf16* weight, bf16* out,
                            int hidden, float eps, int trigger_mode) {
  __shared__ float warp_sums[kNormThreads / 32];
  detail::pdl_small_wait(trigger_mode);
  const size_t row = static_cast<size_t>(blockIdx.x) * hidden;
  float sum_sq = 0.0f;
  for (int u = threadIdx.x; u < hidden / 8; u += kNormThreads) {
    uint4 r = *reinterpret_cast<const uint4*>(residual + row + u * 8);
    if (delta != nullptr) {
      const uint4 d = *reinterpret_cast<const uint4*>(delta + row + u * 8);
      uint32_t* rw = &r.x;
      const uint32_t* dw = &d.x;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 a = detail::unpack_bf16x2(rw[e]), b = detail::unpack_bf16x2(dw[e]);
        rw[e] = detail::pack_bf16x2(a.x + b.x, a.y + b.y);
      }
      *reinterpret_cast<uint4*>(residual + row + u * 8) = r;
    }
    const uint32_t* rw = &r.x;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 a = detail::unpack_bf16x2(rw[e]);
      sum_sq += a.x * a.x + a.y * a.y;
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum_sq;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kNormThreads / 32; ++w) total += warp_sums[w];
  const float inv_rms = rsqrtf(total / hidden + eps);
  for (int u = threadIdx.x; u < hidden / 8; u += kNormThreads) {
    const uint4 r = *reinterpret_cast<const uint4*>(residual + row + u * 8);  // own write
    const uint4 w = *reinterpret_cast<const uint4*>(weight + u * 8);
    uint4 y;
    const uint32_t *rw = &r.x, *ww = &w.x;
    uint32_t* yw = &y.x;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 a = detail::unpack_bf16x2(rw[e]), g = detail::unpack_bf16x2(ww[e]);
      yw[e] = detail::pack_bf16x2(a.x * inv_rms * g.x, a.y * inv_rms * g.y);
    }
    *reinterpret_cast<uint4*>(out + row + u * 8) = y;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// launchers

void rmsnorm_residual(const bf16* delta, bf16* residual, const bf16* weight, bf16* out, int m,
                      int hidden, float eps, cudaStream_t stream, bool pdl) {
  TS_REQUIRE(residual != nullptr && weight != nullptr && out != nullptr,
             "null residual, weight or out");
  TS_REQUIRE(m >= 1, "m = " + std::to_string(m) + " must be >= 1");
  TS_REQUIRE(hidden > 0 && hidden % 8 == 0,
             "hidden = " + std::to_string(hidden) + " is not a positive multiple of 8");
  TS_REQUIRE(eps > 0.0f, "eps must be > 0");
  detail::launch(rmsnorm_residual_kernel, dim3(m), dim3(kNormThreads), 0, stream, pdl, delta,
                 residual, weight, out, hidden, eps, detail::small_kernel_trigger_mode());
}

}  // namespace twinstep::kernels
