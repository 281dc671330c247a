// The RMSNorm between two GEMVs carried by the GEMVs themselves (no norm launch in a layer).
//
// A Llama layer's  residual += delta; y = W (rmsnorm(residual) * gamma)  is computed as
//   gemv_residual: residual[m][j] = bf16(residual + bf16(sum_k x[m][k] w[j][k]))
//   (rmsnorm_residual's
//                  sum, same bits) and sq[m][t] = the sum of squares of columns [16 t, 16 t + 16)
//                  of the new residual row (fixed butterfly order; no other kernel reads them);
//   gemv_normed:   y[m][j] = bf16(inv_rms[m] * sum_k residual[m][k] w_folded[j][k]), inv_rms[m] =
//                  rsqrt(sum_t sq[m][t] / k + eps), the sum in a fixed order (32 interleaved sums
//                  and a butterfly), w_folded = fold_norm_weight(w, gamma): gamma applied to the
//                  weights once.
// Against rmsnorm_residual + gemv this moves two roundings (the normalised row's to bf16, and
// gamma's into the folded weight) and the order of the sum of squares: equal to bf16 accuracy,
// not bit for bit. Row i's results never depend on m (bit-identical for m = 1, 6, 16).
// Shapes as gemv (1 <= m <= 16, n and k multiples of 64); the residual stream's width is the
// producer's n and the consumer's k. Launch on the layer's stream in order; pdl as gemv.
#pragma once

#include "kernels/common.h"

namespace twinstep::kernels {

// Producer (o and down projections): see above. sq: [m][n / 16] fp32. residual must not alias
// w or x.
void gemv_residual(const bf16* w, const bf16* x, bf16* residual, float* sq, int m, int n, int k,
                   cudaStream_t stream, bool pdl = false);

// Consumer (qkv): x is the residual stream [m][k], sq its [m][k / 16] tile sums of squares.
void gemv_normed(const bf16* w_folded, const bf16* x, const float* sq, float eps, bf16* out, int m,
                 int n, int k, cudaStream_t stream, bool pdl = false);

// Consumer with SwiGLU (gate+up, as gemv_swiglu): g and u are scaled by inv_rms before silu(g) u.
void gemv_swiglu_normed(const bf16* w_gate_up_folded, const bf16* x, const float* sq, float eps,
                        bf16* out, int m, int n, int k, cudaStream_t stream, bool pdl = false);

// The tile sums of squares of rows no gemv_residual wrote (the first layer's embeddings): the
// same butterfly, so a row's sums are those gemv_residual would have written. hidden % 64 == 0.
void rms_sq_partials(const bf16* residual, float* sq, int m, int hidden, cudaStream_t stream,
                     bool pdl = false);

// w_folded[j][i] = bf16(w[j][i] * gamma[i]) for a [rows][k] weight (in place when equal; k % 8
// == 0, 16-byte aligned buffers). Once, when the weights are loaded.
void fold_norm_weight(const bf16* w, const bf16* gamma, bf16* w_folded, int rows, int k,
                      cudaStream_t stream);

}  // namespace twinstep::kernels
