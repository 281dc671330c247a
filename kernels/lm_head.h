// LM head with fused greedy argmax, top-1 probability and seeded temperature sampling.
//
// logits[m][v] = sum_k x[m][k] * w[v][k] (w row-major [vocab][k] bf16, x row-major [m][k] bf16),
// computed by the gemv kernel; its epilogue reduces each 16-logit block to (max, argmax,
// sum of exp relative to the max, best Gumbel-perturbed score and index), and a finalize kernel
// combines the blocks in a fixed order (deterministic). Sampling is the Gumbel-max trick:
// sampled = argmax_v(logit_v / temperature + G(seed, step, m, v)), an exact draw from
// softmax(logits / temperature); G comes from philox.h, so (seed, step, row) gives the same draw.
// Shapes: 1 <= m <= 16, vocab % 64 == 0, k % 64 == 0.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common.h"

namespace twinstep::kernels {

struct SamplingParams {
  float temperature = 0.0f;        // <= 0: greedy (sampled_token = argmax_token)
  uint64_t seed = 0;               // per request stream of draws
  const uint64_t* step = nullptr;  // device counter read at run time (graph-safe); null = step 0
};

struct LmHeadOutputs {
  int* argmax_token = nullptr;   // [m] device, greedy token
  float* top1_prob = nullptr;    // [m] device, softmax probability of the argmax (temperature 1)
  int* sampled_token = nullptr;  // [m] device, Gumbel-max sample (== argmax when greedy)
  float* logits = nullptr;       // [m][vocab] fp32 device, optional (nullptr: not written)
  // Optional top-k (the draft's confidence): the topk largest logits of each row, descending (ties:
  // lower token id first), and their softmax probabilities at temperature 1. topk in [0, 16].
  int topk = 0;
  int* topk_tokens = nullptr;   // [m][topk] device
  float* topk_probs = nullptr;  // [m][topk] device
};

// Device scratch the caller owns, reused across calls on one stream. With topk > 0 it includes
// room for the fp32 logits (used when LmHeadOutputs::logits is null) and the top-k's first-pass
// candidates (topk best of each 2048-token chunk of a row; a second pass merges them).
size_t lm_head_workspace_bytes(int m, int vocab, int topk = 0);

void lm_head(const bf16* w, const bf16* x, int m, int vocab, int k, const SamplingParams& sampling,
             void* workspace, const LmHeadOutputs& out, cudaStream_t stream, bool pdl = false);

}  // namespace twinstep::kernels
