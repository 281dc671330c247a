// Device pieces of the decode-attention split kernel (attention.cu, nvcc only): the swizzled K/V
// stage layout, the per-warp online-softmax state and the 64-token tile step, and the in-CTA merge
// of the warps that share a row tile.
//
// Token partition (the q_len-invariance contract): a CTA has 4 warps per 16-row query tile
// (row = j * group + g); warp (row tile, sub) owns tokens [16 sub, 16 sub + 16) of every 64-token
// tile, and the 4 warps of a row tile are merged in sub order. Nothing here depends on the number
// of rows, so row r gives the same bits whether the launch has 4 rows or 64.
#pragma once

#include <cuda_bf16.h>

#include "kernels/device.cuh"
#include "kernels/kv_cache.h"

namespace twinstep::kernels::attn {

constexpr int kTileTokens = 64;
constexpr int kWarpsPerTile = 4;                          // warps sharing one 16-row query tile
constexpr int kWarpTokens = kTileTokens / kWarpsPerTile;  // 16 tokens per warp per tile
constexpr int kTokTiles = kWarpTokens / 8;                // n8 mma tiles per warp per tile
constexpr int kTileElems = kTileTokens * kHeadDim;        // one of K or V, bf16
constexpr int kThreadsPerRowTile = 32 * kWarpsPerTile;    // 128
constexpr float kLog2e = 1.4426950408889634f;
// Online softmax: the running base may trail the running max by this much (log2 units) before
// O and l are rescaled; P stays <= 256, far from any fp32 or bf16 limit.
constexpr float kRescaleSlack = 8.0f;

// Shared-memory tiles are [token][16 units of 16 bytes]; unit u of token t sits at
// u ^ swizzle(t), so ldmatrix (8 tokens, one unit) and the k-permuted 16-byte reads
// (tokens 2i, 2i+1 x units 4c..4c+3) both hit 32 distinct banks.
__device__ __forceinline__ int swizzle(int token) {
  return ((token & 1) << 2) | ((token >> 1) & 3);
}
__device__ __forceinline__ int smem_index(int token, int unit) {
  return token * kHeadDim + ((unit ^ swizzle(token)) * 8);
}

// Issues the cp.async copies of one K and one V tile (tokens [tok0, tok0 + 64) of a head) into a
// stage; tokens >= t_end are zero-filled without reading (src size 0). kThreads threads take part.
template <int kThreads>
__device__ __forceinline__ void issue_kv_tile(bf16* k_smem, bf16* v_smem, const bf16* k_base,
                                              const bf16* v_base, int tok0, int t_end,
                                              int fallback_token) {
  constexpr int kUnits = kTileElems / 8;  // 1024 (16 bytes each); 384 threads do not divide it
#pragma unroll
  for (int i = 0; i < (kUnits + kThreads - 1) / kThreads; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    if (kUnits % kThreads != 0 && idx >= kUnits) break;
    const int t = idx / 16, u = idx % 16;
    const bool valid = tok0 + t < t_end;
    const size_t src = static_cast<size_t>(valid ? tok0 + t : fallback_token) * kHeadDim + u * 8;
    detail::cp_async_16(k_smem + smem_index(t, u), k_base + src, valid ? 16 : 0);
    detail::cp_async_16(v_smem + smem_index(t, u), v_base + src, valid ? 16 : 0);
  }
}

// 2^x with denormal results flushed to zero (one MUFU.EX2; exp2f adds range fix-ups for
// denormal results, which are < 2^-126 and vanish in the bf16 P and the sums anyway).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// One warp's running softmax state for rows a = gid and b = gid + 8 of its 16-row tile.
struct WarpAcc {
  float m[2];  // running base, log2 units: max - kRescaleSlack <= m <= max (-inf: no key yet)
  float l[2];  // running sum of exp2(s - m), this lane's columns only
  float o[kHeadDim / 8][4];  // mma C fragments: o[d][0..1] row a, o[d][2..3] row b
};

__device__ __forceinline__ void warp_acc_init(WarpAcc& acc) {
  acc.m[0] = acc.m[1] = -INFINITY;
  acc.l[0] = acc.l[1] = 0.0f;
#pragma unroll
  for (int d = 0; d < kHeadDim / 8; ++d) acc.o[d][0] = acc.o[d][1] = acc.o[d][2] = acc.o[d][3] = 0;
}

// One 64-token stage for this warp's 16 tokens (in-tile offset tok_base, absolute position
// tok_abs of the first): S = Q K^T, mask (row a sees positions < limit_a, row b < limit_b),
// online softmax in log2 units, O += P V. qa/qb: Q fragments of rows a/b, k-permuted (lane holds
// the 16 bytes of units 4c + tq).
__device__ __forceinline__ void attend_tile(WarpAcc& acc, const uint4 (&qa)[4],
                                            const uint4 (&qb)[4], const bf16* k_smem,
                                            const bf16* v_smem, int tok_base, int tok_abs,
                                            int limit_a, int limit_b, float scale_log2) {
  const int lane = threadIdx.x % 32, gid = lane / 4, tq = lane % 4;
  float s[kTokTiles][4];
#pragma unroll
  for (int n = 0; n < kTokTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int n = 0; n < kTokTiles; ++n) {
      const int tok = tok_base + n * 8 + gid;
      const uint4 kv = *reinterpret_cast<const uint4*>(k_smem + smem_index(tok, 4 * c + tq));
      detail::mma_16816(s[n], qa[c].x, qb[c].x, qa[c].y, qb[c].y, kv.x, kv.y);
      detail::mma_16816(s[n], qa[c].z, qb[c].z, qa[c].w, qb[c].w, kv.z, kv.w);
    }

  // Mask, scale, online softmax (row a in s[n][0..1], row b in s[n][2..3]). A lane whose 16
  // tokens are all visible to both its rows (every tile but the causal tail) skips the mask.
  float mx_a = -INFINITY, mx_b = -INFINITY;
  if (tok_abs + kWarpTokens <= min(limit_a, limit_b)) {
#pragma unroll
    for (int n = 0; n < kTokTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= scale_log2;
      mx_a = fmaxf(mx_a, fmaxf(s[n][0], s[n][1]));
      mx_b = fmaxf(mx_b, fmaxf(s[n][2], s[n][3]));
    }
  } else {
#pragma unroll
    for (int n = 0; n < kTokTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = tok_abs + n * 8 + 2 * tq + (e & 1);
        const bool visible = t < (e < 2 ? limit_a : limit_b);
        s[n][e] = visible ? s[n][e] * scale_log2 : -INFINITY;
        if (e < 2)
          mx_a = fmaxf(mx_a, s[n][e]);
        else
          mx_b = fmaxf(mx_b, s[n][e]);
      }
  }
#pragma unroll
  for (int offset = 1; offset <= 2; offset *= 2) {
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, offset));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, offset));
  }
  // Lazy rescale: a row keeps its base acc.m while the tile's max stays within kRescaleSlack of
  // it (so P <= 2^kRescaleSlack); only a larger max moves the base to that max and rescales l and
  // O. A row decides from its own keys alone (row r gives the same bits for any row count), and
  // l and O are always relative to the stored base, which is what the merges read as the max.
  const bool move_a = mx_a > acc.m[0] + kRescaleSlack;  // false while the tile has no visible key
  const bool move_b = mx_b > acc.m[1] + kRescaleSlack;
  const float alpha_a = move_a ? exp2_ftz(acc.m[0] - mx_a) : 1.0f;  // 0 from -inf
  const float alpha_b = move_b ? exp2_ftz(acc.m[1] - mx_b) : 1.0f;
  if (move_a) acc.m[0] = mx_a;
  if (move_b) acc.m[1] = mx_b;
  const float base_a = acc.m[0] == -INFINITY ? 0.0f : acc.m[0];
  const float base_b = acc.m[1] == -INFINITY ? 0.0f : acc.m[1];
  float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
  for (int n = 0; n < kTokTiles; ++n) {
    s[n][0] = exp2_ftz(s[n][0] - base_a);
    s[n][1] = exp2_ftz(s[n][1] - base_a);
    s[n][2] = exp2_ftz(s[n][2] - base_b);
    s[n][3] = exp2_ftz(s[n][3] - base_b);
    sum_a += s[n][0] + s[n][1];
    sum_b += s[n][2] + s[n][3];
  }
  acc.l[0] = acc.l[0] * alpha_a + sum_a;
  acc.l[1] = acc.l[1] * alpha_b + sum_b;
  if (__any_sync(0xffffffffu, move_a || move_b)) {  // alpha is exactly 1 for a row that stays
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d) {
      acc.o[d][0] *= alpha_a;
      acc.o[d][1] *= alpha_a;
      acc.o[d][2] *= alpha_b;
      acc.o[d][3] *= alpha_b;
    }
  }

  // O += P V: P straight from the S accumulators (A layout), V via ldmatrix.trans.
#pragma unroll
  for (int ks = 0; ks < kTokTiles / 2; ++ks) {
    const uint32_t a0 = detail::pack_bf16x2(s[2 * ks][0], s[2 * ks][1]);
    const uint32_t a1 = detail::pack_bf16x2(s[2 * ks][2], s[2 * ks][3]);
    const uint32_t a2 = detail::pack_bf16x2(s[2 * ks + 1][0], s[2 * ks + 1][1]);
    const uint32_t a3 = detail::pack_bf16x2(s[2 * ks + 1][2], s[2 * ks + 1][3]);
    const int tok = tok_base + ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int dp = 0; dp < kHeadDim / 16; ++dp) {
      uint32_t b[4];
      detail::ldmatrix_x4_trans(b, v_smem + smem_index(tok, 2 * dp + (lane >> 4)));
      detail::mma_16816(acc.o[2 * dp], a0, a1, a2, a3, b[0], b[1]);
      detail::mma_16816(acc.o[2 * dp + 1], a0, a1, a2, a3, b[2], b[3]);
    }
  }
}

// Shared-memory image of every warp's partial: o [warp][16][kPartialStride] fp32 (dimension d
// at column d) then ml [warp][16] (max, sum). Bytes for kRowTiles row tiles. The 8 padding floats
// per row put rows gid and gid + 1 eight banks apart, so a half-warp's 8-byte stores of one
// fragment column (4 rows x 4 lanes) hit 32 distinct banks: rows of exactly 128 floats put all 8
// rows of a fragment on the same 4 banks (an 8-way conflict on each of the 64 stores per thread).
constexpr int kPartialStride = kHeadDim + 8;
__host__ __device__ constexpr size_t warp_partials_bytes(int row_tiles) {
  return static_cast<size_t>(row_tiles) * kWarpsPerTile * 16 * (kPartialStride * 4 + 8);
}

// Writes this warp's state into the image (sums reduced over the 4 lanes of a row first).
// Caller: __syncthreads() before (stage buffers are reused) and after.
__device__ __forceinline__ void store_warp_partial(WarpAcc& acc, float* o_smem, float2* ml_smem) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tq = lane % 4;
#pragma unroll
  for (int offset = 1; offset <= 2; offset *= 2) {
    acc.l[0] += __shfl_xor_sync(0xffffffffu, acc.l[0], offset);
    acc.l[1] += __shfl_xor_sync(0xffffffffu, acc.l[1], offset);
  }
#pragma unroll
  for (int d = 0; d < kHeadDim / 8; ++d) {
    const int col = d * 8 + 2 * tq;
    *reinterpret_cast<float2*>(o_smem + (warp * 16 + gid) * kPartialStride + col) =
        make_float2(acc.o[d][0], acc.o[d][1]);
    *reinterpret_cast<float2*>(o_smem + (warp * 16 + gid + 8) * kPartialStride + col) =
        make_float2(acc.o[d][2], acc.o[d][3]);
  }
  if (tq == 0) {
    ml_smem[warp * 16 + gid] = make_float2(acc.m[0], acc.l[0]);
    ml_smem[warp * 16 + gid + 8] = make_float2(acc.m[1], acc.l[1]);
  }
}

struct RowPartial {
  float m, l, o;  // max (log2 units, -inf: no visible key), sum of exp2, output element d
};

// Merges the 4 warps of row `row`'s tile for dimension d, in warp order. A warp that saw no key
// adds nothing (not even +0), so empty warps leave the bits unchanged.
__device__ __forceinline__ RowPartial merge_warps(const float* o_smem, const float2* ml_smem,
                                                  int row, int d) {
  const int rt = row / 16, r = row % 16;
  float m_max = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarpsPerTile; ++w)
    m_max = fmaxf(m_max, ml_smem[(rt * kWarpsPerTile + w) * 16 + r].x);
  float l_sum = 0.0f, o_sum = 0.0f;
  if (m_max != -INFINITY) {
#pragma unroll
    for (int w = 0; w < kWarpsPerTile; ++w) {
      const int ww = rt * kWarpsPerTile + w;
      const float2 ml = ml_smem[ww * 16 + r];
      if (ml.x == -INFINITY) continue;
      const float scale = exp2f(ml.x - m_max);
      l_sum += ml.y * scale;
      o_sum += o_smem[(ww * 16 + r) * kPartialStride + d] * scale;
    }
  }
  return {m_max, l_sum, o_sum};
}

}  // namespace twinstep::kernels::attn
