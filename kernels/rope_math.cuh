// The rotation rope_kv_append applies (rope.h) to one pair (i, i + 64) of a head at a position,
// shared by rope.cu and the fused form in attention.cu (decode_attention_rope), so that both round
// alike (nvcc only).
#pragma once

#include <cmath>

#include "kernels/common.h"

namespace twinstep::kernels::detail {

// Angle in double, reduced to [0, 2 pi) before the float sincos: accurate at any position.
__device__ __forceinline__ void rope_rotate_pair(float x1, float x2, int position, float inv_freq,
                                                 bf16* y1, bf16* y2) {
  const double angle = static_cast<double>(position) * inv_freq;
  const double two_pi = 6.283185307179586;
  float s, c;
  sincosf(static_cast<float>(angle - floor(angle / two_pi) * two_pi), &s, &c);
  *y1 = __float2bfloat16(x1 * c - x2 * s);
  *y2 = __float2bfloat16(x2 * c + x1 * s);
}

}  // namespace twinstep::kernels::detail
