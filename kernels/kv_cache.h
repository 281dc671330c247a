// KV cache layout shared by rope_kv_append (writer) and decode_attention (reader).
//
// One contiguous buffer per request, allocated by the runtime:
//   cache[layer][kv][kv_head][token][kHeadDim] bf16, kv = 0 for K (RoPE applied), 1 for V.
// Token t holds sequence position t. A head's tokens are contiguous (a 64-token tile is one
// 16 KB read). request_base is a device array [num_requests] of per-request buffer pointers, so
// a batch may mix requests of different lengths (lengths come from a device array ctx_lens).
#pragma once

#include <cstddef>

#include "kernels/common.h"
#include "kernels/philox.h"  // TS_HOST_DEVICE

namespace twinstep::kernels {

constexpr int kHeadDim = 128;

struct KvCache {
  bf16* const* request_base = nullptr;  // device array [num_requests] of device buffers
  int num_layers = 0;
  int num_kv_heads = 0;
  int capacity_tokens = 0;  // tokens per (layer, kv, head) row; positions >= capacity are dropped
};

// Elements (not bytes) from a request's base to token 0 of (layer, kv, kv_head).
TS_HOST_DEVICE inline size_t kv_offset(const KvCache& cache, int layer, int kv, int kv_head) {
  return ((static_cast<size_t>(layer) * 2 + kv) * cache.num_kv_heads + kv_head) *
         static_cast<size_t>(cache.capacity_tokens) * kHeadDim;
}

inline size_t kv_cache_bytes_per_request(const KvCache& cache) {
  return kv_offset(cache, cache.num_layers, 0, 0) * sizeof(bf16);
}

}  // namespace twinstep::kernels
