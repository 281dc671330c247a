// Decode attention: grouped-query heads over the KV cache (kv_cache.h), 1..16 new query
// positions per request with a causal mask among them, split along the context
// (flash-decoding) and combined in a fixed order (deterministic, independent of timing).
//
// q:   [num_requests][q_len][num_q_heads][128] bf16, RoPE applied (rope_kv_append's q_out).
// out: [num_requests][q_len][num_q_heads][128] bf16.
// ctx_lens: device [num_requests], tokens cached before this step; the q_len new tokens are
//   already appended at positions ctx .. ctx + q_len - 1, and query j sees keys 0 .. ctx + j.
// Requires head_dim 128, num_q_heads % num_kv_heads == 0, (num_q_heads / num_kv_heads) * q_len
// <= 64, and ctx + q_len <= capacity_tokens.
// Row j of a q_len-query launch equals a 1-query launch at context ctx + j bit for bit (the
// partition depends on capacity, kv heads and num_requests only).
//
// workspace: caller-owned, at least attention_workspace_bytes() for every shape it serves; it
//   needs no initialisation (a launch reads only the partials it wrote), and launches of
//   different shapes may share one workspace, serially.
// PDL (pdl = true): the prologue before the dependency wait reads only ctx_lens, request_base
//   and KV tokens older than ctx, so none of these may be written by the kernel launched just
//   before; q, the new tokens, the workspace and out are touched after the wait.
// Two launches: a split kernel (partials to the workspace) and a combine kernel.
#pragma once

#include <cstddef>

#include "kernels/common.h"
#include "kernels/kv_cache.h"
#include "kernels/rope.h"

namespace twinstep::kernels {

struct AttentionShape {
  int num_requests = 1;
  int q_len = 1;
  int num_q_heads = 32;
  float softmax_scale = 0.08838834764831845f;  // 1 / sqrt(128)
};

size_t attention_workspace_bytes(const AttentionShape& shape, const KvCache& cache);

// Context splits per (request, KV head) of a launch of this shape over this cache (the partition
// above; q_len does not change it); a request of ctx + q_len tokens fills the first
// ceil((ctx + q_len) / split_tokens) of them, each a block of the split kernel.
int attention_num_splits(const AttentionShape& shape, const KvCache& cache);

void decode_attention(const bf16* q, const KvCache& cache, int layer, const int* ctx_lens,
                      bf16* out, const AttentionShape& shape, void* workspace, cudaStream_t stream,
                      bool pdl = false);

// rope_kv_append (rope.h) and decode_attention in one pair of launches: each split block rotates
// its query rows from qkv (rope_kv_append's input) into shared memory, and the blocks whose split
// holds positions ctx .. ctx + q_len - 1 rotate those tokens' k and append k and v to the cache
// (after the dependency wait, before reading them). out and the cache are bit-identical to
// rope_kv_append then decode_attention; no q_out is written. Same shapes and workspace as
// decode_attention; needs AttentionTuning::split_q_smem (the default). PDL: the prologue reads
// what decode_attention's does; qkv is read after the wait.
void decode_attention_rope(const bf16* qkv, const KvCache& cache, int layer, const int* ctx_lens,
                           const RopeTable& rope, bf16* out, const AttentionShape& shape,
                           void* workspace, cudaStream_t stream, bool pdl = false);

// Benchmark trace layout (detail::AttentionTuning::trace): per launch, the region at
// layer * kAttentionTraceSlotsPerLayer slots, kAttentionTraceWords words per slot; split block b
// (b = x + splits * (kv head + kv_heads * request)) in slot b, combine block c in slot
// kAttentionTraceSplitSlots + c. Words: globaltimer ns at entry, prologue issued (split), past the
// dependency wait, first tile resident (split), last tile consumed (split), exit; then the SM.
inline constexpr int kAttentionTraceWords = 8;
inline constexpr int kAttentionTraceSplitSlots = 4096;
inline constexpr int kAttentionTraceSlotsPerLayer = 8192;
enum AttentionTraceWord {
  kTraceEntry,
  kTraceIssued,
  kTraceWaited,
  kTraceFirstTile,
  kTraceLastTile,
  kTraceExit,
  kTraceSm
};

}  // namespace twinstep::kernels
