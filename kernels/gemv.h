// Skinny GEMM ("GEMV") for decode and verify: out[m][n] = sum_k x[m][k] * w[n][k].
//
// Shapes: 1 <= m <= 16 activation rows (tokens), n % 64 == 0, k % 64 == 0.
// Layouts: w row-major [n][k] bf16 (the PyTorch Linear weight), x row-major [m][k] bf16,
// out row-major [m][n] bf16. fp32 accumulation on tensor cores, one bf16 rounding at the end.
// Determinism: row i of out is bit-identical whatever m is (the K split and the reduction order
// depend on n and k only), so a verify pass over m tokens matches m plain decode steps.
// Buffers are the caller's; nothing is allocated; out must not alias w or x.
#pragma once

#include "kernels/common.h"

namespace twinstep::kernels {

constexpr int kGemvMaxRows = 16;

// pdl: launch with programmatic dependent launch where the tuning allows it (GemvTuning::
// pdl_max_rows: over 8 rows the launch waits for its predecessor, measured faster).
void gemv(const bf16* w, const bf16* x, bf16* out, int m, int n, int k, cudaStream_t stream,
          bool pdl = false);

// Gate/up projection with SwiGLU fused into the epilogue:
// out[m][i] = silu(g) * u, g = sum_k x[m][k] w[i][k], u = sum_k x[m][k] w[n + i][k].
// w_gate_up is row-major [2n][k]: the n gate rows, then the n up rows. g and u stay fp32 until the
// single bf16 rounding of the product. Shapes as gemv (n = intermediate size).
void gemv_swiglu(const bf16* w_gate_up, const bf16* x, bf16* out, int m, int n, int k,
                 cudaStream_t stream, bool pdl = false);

}  // namespace twinstep::kernels
