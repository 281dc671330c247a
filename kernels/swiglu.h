// Standalone SwiGLU: out[m][i] = silu(gate_up[m][i]) * gate_up[m][n + i].
// gate_up row-major [m][2n] bf16 (the plain gemv output of the stacked gate/up weight), out
// [m][n]. n % 8 == 0. The decode path uses gemv_swiglu (fused epilogue) instead; this kernel is
// the unfused baseline the benchmark compares against.
#pragma once

#include "kernels/common.h"

namespace twinstep::kernels {

void swiglu(const bf16* gate_up, bf16* out, int m, int n, cudaStream_t stream, bool pdl = false);

}  // namespace twinstep::kernels
