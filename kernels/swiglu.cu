#include <string>

#include "kernels/device.cuh"
#include "kernels/swiglu.h"

namespace twinstep::kernels {

namespace {

constexpr int kSwigluThreads = 256;

// ---------------------------------------------------------------------------------------------
// kernels

__global__ void __launch_bounds__(kSwigluThreads)
    swiglu_kernel(const bf16* gate_up, bf16* out, int n) {
  detail::pdl_wait_and_trigger();
  const int m = blockIdx.y;
  const int u = blockIdx.x * kSwigluThreads + threadIdx.x;  // 8-element unit
  if (u >= n / 8) return;
  const bf16* row = gate_up + static_cast<size_t>(m) * 2 * n;
  const uint4 g = *reinterpret_cast<const uint4*>(row + u * 8);
  const uint4 up = *reinterpret_cast<const uint4*>(row + n + u * 8);
  uint4 y;
  const uint32_t *gw = &g.x, *uw = &up.x;
  uint32_t* yw = &y.x;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 a = detail::unpack_bf16x2(gw[e]), b = detail::unpack_bf16x2(uw[e]);
    yw[e] =
        detail::pack_bf16x2(a.x / (1.0f + __expf(-a.x)) * b.x, a.y / (1.0f + __expf(-a.y)) * b.y);
  }
  *reinterpret_cast<uint4*>(out + static_cast<size_t>(m) * n + u * 8) = y;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// launchers

void swiglu(const bf16* gate_up, bf16* out, int m, int n, cudaStream_t stream, bool pdl) {
  TS_REQUIRE(gate_up != nullptr && out != nullptr, "null gate_up or out");
  TS_REQUIRE(m >= 1 && m <= 65535, "m = " + std::to_string(m) + " outside [1, 65535]");
  TS_REQUIRE(n > 0 && n % 8 == 0, "n = " + std::to_string(n) + " is not a positive multiple of 8");
  const dim3 grid((n / 8 + kSwigluThreads - 1) / kSwigluThreads, m);
  detail::launch(swiglu_kernel, grid, dim3(kSwigluThreads), 0, stream, pdl, gate_up, out, n);
}

}  // namespace twinstep::kernels
