#include <cmath>
#include <string>

#include "kernels/gemv.h"
#include "kernels/gemv_kernel.cuh"
#include "kernels/lm_head.h"

namespace twinstep::kernels {

namespace {

constexpr int kFinalizeThreads = 256;
constexpr int kTopkThreads = 1024;
constexpr int kMaxTopk = 16;
// Top-k pass 1: tokens per block (a row's vocabulary spread over vocab / kTopkChunk blocks, so a
// decode row's 128256 logits are scanned by 63 SMs, not one) and its threads.
constexpr int kTopkChunk = 2048;
constexpr int kTopkChunkThreads = 256;

size_t partials_bytes(int m, int vocab) {
  return (static_cast<size_t>(m) * (vocab / detail::kGemvRowsPerBlock) *
              sizeof(detail::LogitPartial) +
          255) /
         256 * 256;
}

struct Running {
  float max_logit;
  int argmax;
  float sum_exp;
  float score;
  int score_index;
};

__device__ Running merge(const Running& a, const Running& b) {
  Running r;
  const bool b_wins =
      b.max_logit > a.max_logit || (b.max_logit == a.max_logit && b.argmax < a.argmax);
  r.max_logit = b_wins ? b.max_logit : a.max_logit;
  r.argmax = b_wins ? b.argmax : a.argmax;
  r.sum_exp = (a.sum_exp > 0.0f ? a.sum_exp * __expf(a.max_logit - r.max_logit) : 0.0f) +
              (b.sum_exp > 0.0f ? b.sum_exp * __expf(b.max_logit - r.max_logit) : 0.0f);
  const bool b_scores = b.score > a.score || (b.score == a.score && b.score_index < a.score_index);
  r.score = b_scores ? b.score : a.score;
  r.score_index = b_scores ? b.score_index : a.score_index;
  return r;
}

// ---------------------------------------------------------------------------------------------
// kernels

// One block per row m: merges the per-block partials in a fixed order (strided per thread, then a
// fixed tree), so the result is deterministic.
__global__ void __launch_bounds__(kFinalizeThreads)
    lm_head_finalize_kernel(const detail::LogitPartial* partials, int num_blocks, bool sampling,
                            int* argmax_token, float* top1_prob, int* sampled_token,
                            float2* row_stats) {
  __shared__ Running shared[kFinalizeThreads];
  detail::pdl_wait_and_trigger();
  const int m = blockIdx.x;
  Running r = {-INFINITY, 0x7fffffff, 0.0f, -INFINITY, 0x7fffffff};
  for (int j = threadIdx.x; j < num_blocks; j += kFinalizeThreads) {
    const detail::LogitPartial& q = partials[static_cast<size_t>(m) * num_blocks + j];
    r = merge(r, Running{q.max_logit, q.argmax, q.sum_exp, q.sample_score, q.sample_index});
  }
  shared[threadIdx.x] = r;
  __syncthreads();
  for (int stride = kFinalizeThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      shared[threadIdx.x] = merge(shared[threadIdx.x], shared[threadIdx.x + stride]);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const Running& total = shared[0];
    argmax_token[m] = total.argmax;
    top1_prob[m] = 1.0f / total.sum_exp;
    sampled_token[m] = sampling ? total.score_index : total.argmax;
    if (row_stats != nullptr) row_stats[m] = make_float2(total.max_logit, total.sum_exp);
  }
}

// A (value, token) candidate; better = larger value, then lower token.
__device__ __forceinline__ bool better(float a, int ai, float b, int bi) {
  return a > b || (a == b && ai < bi);
}

// Block-wide best (value, token) of each thread's candidate (better(): larger value, then lower
// token); every thread gets the winner. `warp_val` / `warp_idx` hold one entry per warp.
template <int kThreads>
__device__ __forceinline__ void block_best(float& bv, int& bi, float* warp_val, int* warp_idx) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, offset);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, offset);
    if (better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  if (lane == 0) {
    warp_val[warp] = bv;
    warp_idx[warp] = bi;
  }
  __syncthreads();
  bv = lane < kThreads / 32 ? warp_val[lane] : -INFINITY;
  bi = lane < kThreads / 32 ? warp_idx[lane] : 0x7fffffff;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, offset);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, offset);
    if (better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  __syncthreads();  // warp_val / warp_idx free for the next call
}

// Pass 1, block (chunk, row): the topk best logits of tokens [chunk * kTopkChunk, + kTopkChunk)
// in order, by topk rounds of a block argmax over the chunk held in shared memory (each round's
// winner struck out); written to cand[row][chunk][0 .. topk), padded with (-inf, INT_MAX).
__global__ void __launch_bounds__(kTopkChunkThreads)
    lm_head_topk_chunk_kernel(const float* logits, int vocab, int topk, int chunks, float* cand_val,
                              int* cand_idx) {
  __shared__ float chunk_val[kTopkChunk];
  __shared__ float warp_val[kTopkChunkThreads / 32];
  __shared__ int warp_idx[kTopkChunkThreads / 32];
  detail::pdl_wait_and_trigger();
  const int m = blockIdx.y, first = blockIdx.x * kTopkChunk;
  const float* row = logits + static_cast<size_t>(m) * vocab;
  for (int i = threadIdx.x; i < kTopkChunk; i += kTopkChunkThreads)
    chunk_val[i] = first + i < vocab ? row[first + i] : -INFINITY;
  __syncthreads();
  float* out_val = cand_val + (static_cast<size_t>(m) * chunks + blockIdx.x) * kMaxTopk;
  int* out_idx = cand_idx + (static_cast<size_t>(m) * chunks + blockIdx.x) * kMaxTopk;
  for (int round = 0; round < topk; ++round) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < kTopkChunk; i += kTopkChunkThreads) {
      const float v = chunk_val[i];
      if (first + i < vocab && better(v, first + i, bv, bi)) {
        bv = v;
        bi = first + i;
      }
    }
    block_best<kTopkChunkThreads>(bv, bi, warp_val, warp_idx);
    if (threadIdx.x == 0) {
      out_val[round] = bv;
      out_idx[round] = bi;
    }
    // Strike the winner out: its owner alone writes, read only after the next round's barrier.
    if (bi >= first && bi < first + kTopkChunk && (bi - first) % kTopkChunkThreads == threadIdx.x)
      chunk_val[bi - first] = -INFINITY;
    __syncthreads();
  }
}

// Pass 2, one block per row: the topk best of the row's chunks * topk candidates (every chunk's
// best topk contains the row's best among its tokens), the same rounds over shared memory; a
// candidate is struck out by its position. Probabilities use the row's (max, sum of exp) from
// finalize. Deterministic: each round's winner is unique (tokens are), whatever the order.
__global__ void __launch_bounds__(kTopkThreads)
    lm_head_topk_merge_kernel(const float* cand_val, const int* cand_idx, int chunks, int topk,
                              const float2* row_stats, int* topk_tokens, float* topk_probs) {
  extern __shared__ unsigned char merge_smem[];
  float* val = reinterpret_cast<float*>(merge_smem);
  int* idx = reinterpret_cast<int*>(val + chunks * topk);
  __shared__ float warp_val[kTopkThreads / 32];
  __shared__ int warp_idx[kTopkThreads / 32];
  detail::pdl_wait_and_trigger();
  const int m = blockIdx.x, n = chunks * topk;
  for (int i = threadIdx.x; i < n; i += kTopkThreads) {
    const size_t at = (static_cast<size_t>(m) * chunks + i / topk) * kMaxTopk + i % topk;
    val[i] = cand_val[at];
    idx[i] = cand_idx[at];
  }
  __syncthreads();
  const float2 stats = row_stats[m];
  for (int round = 0; round < topk; ++round) {
    float bv = -INFINITY;
    int bi = 0x7fffffff, bpos = -1;
    for (int i = threadIdx.x; i < n; i += kTopkThreads) {
      if (better(val[i], idx[i], bv, bi)) {
        bv = val[i];
        bi = idx[i];
        bpos = i;
      }
    }
    const int mine = bi;
    block_best<kTopkThreads>(bv, bi, warp_val, warp_idx);
    if (threadIdx.x == 0) {
      topk_tokens[m * topk + round] = bi;
      topk_probs[m * topk + round] = __expf(bv - stats.x) / stats.y;
    }
    if (bpos >= 0 && mine == bi) {
      val[bpos] = -INFINITY;
      idx[bpos] = 0x7fffffff;
    }
    __syncthreads();
  }
}

int topk_chunks(int vocab) { return (vocab + kTopkChunk - 1) / kTopkChunk; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// launchers

// Workspace, in order: the GEMV's partials; with topk > 0 the row stats (256 B), the fp32 logits,
// and pass 1's candidates ([m][chunks][kMaxTopk] values, then as many tokens).
size_t lm_head_workspace_bytes(int m, int vocab, int topk) {
  size_t bytes = partials_bytes(m, vocab);
  if (topk > 0)
    bytes += 256 + static_cast<size_t>(m) * vocab * sizeof(float) +
             2 * static_cast<size_t>(m) * topk_chunks(vocab) * kMaxTopk * sizeof(float);
  return bytes;
}

void lm_head(const bf16* w, const bf16* x, int m, int vocab, int k, const SamplingParams& sampling,
             void* workspace, const LmHeadOutputs& out, cudaStream_t stream, bool pdl) {
  TS_REQUIRE(w != nullptr && x != nullptr && workspace != nullptr, "null w, x or workspace");
  TS_REQUIRE(
      out.argmax_token != nullptr && out.top1_prob != nullptr && out.sampled_token != nullptr,
      "null argmax_token, top1_prob or sampled_token");
  TS_REQUIRE(m >= 1 && m <= kGemvMaxRows, "m = " + std::to_string(m) + " outside [1, 16]");
  TS_REQUIRE(vocab > 0 && vocab % 64 == 0,
             "vocab = " + std::to_string(vocab) + " is not a positive multiple of 64 (pad it)");
  TS_REQUIRE(k > 0 && k % 64 == 0,
             "k = " + std::to_string(k) + " is not a positive multiple of 64");
  TS_REQUIRE(std::isfinite(sampling.temperature), "temperature is not finite");
  TS_REQUIRE(out.topk >= 0 && out.topk <= kMaxTopk && out.topk <= vocab,
             "topk = " + std::to_string(out.topk) + " outside [0, 16]");
  TS_REQUIRE(out.topk == 0 || (out.topk_tokens != nullptr && out.topk_probs != nullptr),
             "topk > 0 needs topk_tokens and topk_probs");
  // Workspace: partials, then (top-k only) the row stats and the fp32 logits.
  float2* row_stats = nullptr;
  float* logits = out.logits;
  if (out.topk > 0) {
    row_stats = reinterpret_cast<float2*>(static_cast<char*>(workspace) + partials_bytes(m, vocab));
    if (logits == nullptr)
      logits = reinterpret_cast<float*>(reinterpret_cast<char*>(row_stats) + 256);
  }
  detail::GemvParams p = {};
  p.w = w;
  p.x = x;
  p.m = m;
  p.n = vocab;
  p.k = k;
  p.logits = logits;
  p.partials = static_cast<detail::LogitPartial*>(workspace);
  p.inv_temperature = sampling.temperature > 0.0f ? 1.0f / sampling.temperature : 0.0f;
  p.seed = sampling.seed;
  p.step = sampling.step;
  detail::launch_gemv<detail::GemvEpilogue::kLogits>(p, stream, pdl);
  detail::launch(lm_head_finalize_kernel, dim3(m), dim3(kFinalizeThreads), 0, stream, pdl,
                 static_cast<const detail::LogitPartial*>(p.partials),
                 vocab / detail::kGemvRowsPerBlock, sampling.temperature > 0.0f, out.argmax_token,
                 out.top1_prob, out.sampled_token, row_stats);
  if (out.topk > 0) {
    const int chunks = topk_chunks(vocab);
    float* cand_val = reinterpret_cast<float*>(reinterpret_cast<char*>(row_stats) + 256 +
                                               static_cast<size_t>(m) * vocab * sizeof(float));
    int* cand_idx = reinterpret_cast<int*>(cand_val + static_cast<size_t>(m) * chunks * kMaxTopk);
    detail::launch(lm_head_topk_chunk_kernel, dim3(chunks, m), dim3(kTopkChunkThreads), 0, stream,
                   pdl, static_cast<const float*>(logits), vocab, out.topk, chunks, cand_val,
                   cand_idx);
    const size_t merge_smem =
        static_cast<size_t>(chunks) * out.topk * (sizeof(float) + sizeof(int));
    TS_REQUIRE(merge_smem <= 48 * 1024, "vocab = " + std::to_string(vocab) +
                                            " with topk = " + std::to_string(out.topk) +
                                            ": top-k candidates exceed 48 KB of shared memory");
    detail::launch(lm_head_topk_merge_kernel, dim3(m), dim3(kTopkThreads), merge_smem, stream, pdl,
                   static_cast<const float*>(cand_val), static_cast<const int*>(cand_idx), chunks,
                   out.topk, static_cast<const float2*>(row_stats), out.topk_tokens,
                   out.topk_probs);
  }
}

}  // namespace twinstep::kernels
