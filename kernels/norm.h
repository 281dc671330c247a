// Fused residual add + RMSNorm (Llama): residual += delta; out = residual / rms(residual) * weight.
//
// delta, residual, out: row-major [m][hidden] bf16; weight [hidden] bf16. delta may be null
// (first layer: plain RMSNorm of residual). The sum is rounded to bf16 and stored back into
// residual (the model's residual stream is bf16); the norm is computed in fp32 from that value.
// hidden % 8 == 0; m >= 1 (any number of rows: one block per row).
#pragma once

#include "kernels/common.h"

namespace twinstep::kernels {

void rmsnorm_residual(const bf16* delta, bf16* residual, const bf16* weight, bf16* out, int m,
                      int hidden, float eps, cudaStream_t stream, bool pdl = false);

}  // namespace twinstep::kernels
