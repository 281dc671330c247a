// The context partition of the runtime's decode attention (attention_split_kernel, kernels/
// attention.cu), as pure host code: the launcher calls it with the device's SM count and its
// tuning, the simulator with HardwareSpec::sm_count and the default tuning, so that the price of
// an attention launch can follow the partition the engine's KV capacity gives it
// (docs/calibration.md "Attention partition"). No CUDA: usable from policies/ and simulator/.
#pragma once

#include <algorithm>

namespace twinstep::kernels {

// Tokens of one KV tile of the split kernel (attention_tile.cuh kTileTokens): splits are whole
// tiles.
inline constexpr int kAttentionTileTokens = 64;
// AttentionTuning's defaults (kernels/tuning.h), which the simulator prices.
inline constexpr int kAttentionCtasPerSm = 2;
inline constexpr bool kAttentionSplitsWithinOneWave = true;

struct AttentionPartition {
  int split_tokens = 0;  // a multiple of kAttentionTileTokens
  int splits = 0;        // per (request, KV head): ceil(capacity / split_tokens)
};

// The split size: a multiple of 64 tokens chosen from the capacity, the request count and the KV
// head count (never from q_len or the live lengths), so that a full cache gives at most
// ctas_per_sm blocks per SM (one wave; within_one_wave, else at least that many). For one cache
// and batch it is fixed, so a verify pass and plain decode steps split the context identically.
// Lumpy in the capacity: Qwen3-30B-A3B's 4 KV heads, one request, 132 SMs give 128-token splits
// at capacity 8256 (65 of them) and 192-token ones at 9280 (49).
inline AttentionPartition attention_partition(
    int capacity_tokens, int requests, int kv_heads, int sms, int ctas_per_sm = kAttentionCtasPerSm,
    bool within_one_wave = kAttentionSplitsWithinOneWave) {
  const int blocks_per_split = std::max(1, requests * kv_heads);
  const int target_blocks = ctas_per_sm * std::max(1, sms);
  const int target_splits =
      std::max(1, within_one_wave ? target_blocks / blocks_per_split
                                  : (target_blocks + blocks_per_split - 1) / blocks_per_split);
  const int tokens = (std::max(1, capacity_tokens) + target_splits - 1) / target_splits;
  AttentionPartition p;
  p.split_tokens = std::max(kAttentionTileTokens, (tokens + kAttentionTileTokens - 1) /
                                                      kAttentionTileTokens * kAttentionTileTokens);
  p.splits = (std::max(1, capacity_tokens) + p.split_tokens - 1) / p.split_tokens;
  return p;
}

// Splits a request of `tokens` keys (its context plus its q_len new ones) fills: the blocks of the
// split kernel that stream KV for it and the partials the combine reads, per KV head.
inline int attention_active_splits(const AttentionPartition& p, long long tokens) {
  if (p.split_tokens <= 0 || tokens <= 0) return 0;
  return static_cast<int>(
      std::min<long long>(p.splits, (tokens + p.split_tokens - 1) / p.split_tokens));
}

}  // namespace twinstep::kernels
