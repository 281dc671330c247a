// RoPE on q and k plus KV append, fused: one pass over the qkv projection output.
//
// qkv: [num_requests * q_len][(num_q_heads + 2 * num_kv_heads) * 128] bf16, the q heads, then
// the k heads, then the v heads (the fused qkv gemv output). Token (r, j) has position
// ctx_lens[r] + j. Writes q_out [num_requests * q_len][num_q_heads][128] (rotated q) and the
// rotated k and the v of each token into the cache (kv_cache.h) at its position; positions
// >= capacity_tokens are not written (the caller keeps ctx + q_len <= capacity).
// Rotation: rotate-half (Llama/NeoX), pairs (i, i + 64), angle = position * inv_freq[i] in
// double, reduced mod 2 pi, then a float sincos.
#pragma once

#include "kernels/common.h"
#include "kernels/kv_cache.h"

namespace twinstep::kernels {

struct RopeTable {
  float inv_freq[kHeadDim / 2];
};

// Llama-3 frequency scaling (defaults: Llama-3.1 8B config, rope_scaling "llama3").
RopeTable llama3_rope_table(double theta = 500000.0, double factor = 8.0,
                            double low_freq_factor = 1.0, double high_freq_factor = 4.0,
                            double original_context = 8192.0);

void rope_kv_append(const bf16* qkv, const int* ctx_lens, const KvCache& cache, int layer,
                    bf16* q_out, int num_requests, int q_len, int num_q_heads,
                    const RopeTable& rope, cudaStream_t stream, bool pdl = false);

}  // namespace twinstep::kernels
