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
// Top-k pass 2: candidates per thread of its one block per row, so at most kTopkThreads * 4
// (vocabularies up to 4096 / 16 chunks of 2048 tokens: 524288 at topk 16).
constexpr int kTopkMergePerThread = 4;

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

// Sorts a thread's P candidates best first (better(): larger value, then lower token).
template <int P>
__device__ __forceinline__ void sort_desc(float (&v)[P], int (&ix)[P]) {
#pragma unroll
  for (int i = 1; i < P; ++i)
#pragma unroll
    for (int j = i; j > 0; --j)
      if (better(v[j], ix[j], v[j - 1], ix[j - 1])) {
        const float tv = v[j];
        v[j] = v[j - 1];
        v[j - 1] = tv;
        const int ti = ix[j];
        ix[j] = ix[j - 1];
        ix[j - 1] = ti;
      }
}

// The warp's topk best of its lanes' sorted lists, in order, into out_val / out_idx (lane 0
// writes; (-inf, INT_MAX) past the candidates): topk rounds of a warp argmax over the list heads,
// the winning lane popping its head. Shuffles only: no block barrier per round.
template <int P>
__device__ __forceinline__ void warp_topk(float (&v)[P], int (&ix)[P], int topk, float* out_val,
                                          int* out_idx) {
  const int lane = threadIdx.x % 32;
  for (int round = 0; round < topk; ++round) {
    float bv = v[0];
    int bi = ix[0];
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
      out_val[round] = bv;
      out_idx[round] = bi;
    }
    // The owner of the winner pops it (real tokens are unique; a padding winner, (-inf,
    // INT_MAX), may be popped by several lanes, which changes nothing after it).
    if (ix[0] == bi && v[0] == bv) {
#pragma unroll
      for (int j = 0; j < P - 1; ++j) {
        v[j] = v[j + 1];
        ix[j] = ix[j + 1];
      }
      v[P - 1] = -INFINITY;
      ix[P - 1] = 0x7fffffff;
    }
  }
}

// The topk best of `count` candidates (load(i, value, token) for i < count) by a block of
// kThreads: each thread sorts the P candidates it strides over, each warp writes its topk best to
// `stage` (kMaxTopk entries per warp, shared), then warp 0 takes the block's best from those (Q
// per lane) to out_val / out_idx. count <= kThreads * P.
template <int kThreads, int P, int Q, typename Load>
__device__ __forceinline__ void block_topk(int count, int topk, Load load, float* stage_val,
                                           int* stage_idx, float* out_val, int* out_idx) {
  constexpr int kWarps = kThreads / 32;
  static_assert(kWarps * kMaxTopk <= 32 * Q, "Q too small for the warps' candidates");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float v[P];
  int ix[P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int i = threadIdx.x + j * kThreads;
    v[j] = -INFINITY;
    ix[j] = 0x7fffffff;
    if (i < count) load(i, v[j], ix[j]);
  }
  sort_desc(v, ix);
  warp_topk(v, ix, topk, stage_val + warp * kMaxTopk, stage_idx + warp * kMaxTopk);
  __syncthreads();
  if (warp == 0) {
    float w[Q];
    int wi[Q];
#pragma unroll
    for (int j = 0; j < Q; ++j) {
      const int e = lane + 32 * j;  // entry e: warp e / kMaxTopk, rank e % kMaxTopk
      const bool on = e < kWarps * kMaxTopk && e % kMaxTopk < topk;
      w[j] = on ? stage_val[e] : -INFINITY;
      wi[j] = on ? stage_idx[e] : 0x7fffffff;
    }
    sort_desc(w, wi);
    warp_topk(w, wi, topk, out_val, out_idx);
  }
}

// Pass 1, block (chunk, row): the topk best logits of tokens [chunk * kTopkChunk, + kTopkChunk),
// in order, to cand[row][chunk][0 .. topk) (padded with (-inf, INT_MAX) past the vocabulary).
__global__ void __launch_bounds__(kTopkChunkThreads)
    lm_head_topk_chunk_kernel(const float* logits, int vocab, int topk, int chunks, float* cand_val,
                              int* cand_idx) {
  __shared__ float stage_val[kTopkChunkThreads / 32 * kMaxTopk];
  __shared__ int stage_idx[kTopkChunkThreads / 32 * kMaxTopk];
  detail::pdl_wait_and_trigger();
  const int m = blockIdx.y, first = blockIdx.x * kTopkChunk;
  const float* row = logits + static_cast<size_t>(m) * vocab;
  const size_t at = (static_cast<size_t>(m) * chunks + blockIdx.x) * kMaxTopk;
  block_topk<kTopkChunkThreads, kTopkChunk / kTopkChunkThreads, 4>(
      min(kTopkChunk, vocab - first), topk,
      [&](int i, float& v, int& ix) {
        v = row[first + i];
        ix = first + i;
      },
      stage_val, stage_idx, cand_val + at, cand_idx + at);
}

// Pass 2, one block per row: the topk best of the row's chunks x topk candidates (each chunk's
// best topk holds every one of the row's best among its tokens), with their probabilities from
// the row's (max, sum of exp) of finalize. Deterministic: every pick is the unique best left.
__global__ void __launch_bounds__(kTopkThreads)
    lm_head_topk_merge_kernel(const float* cand_val, const int* cand_idx, int chunks, int topk,
                              const float2* row_stats, int* topk_tokens, float* topk_probs) {
  __shared__ float stage_val[kTopkThreads / 32 * kMaxTopk];
  __shared__ int stage_idx[kTopkThreads / 32 * kMaxTopk];
  __shared__ float best_val[kMaxTopk];
  __shared__ int best_idx[kMaxTopk];
  detail::pdl_wait_and_trigger();
  const int m = blockIdx.x;
  const size_t row = static_cast<size_t>(m) * chunks * kMaxTopk;
  block_topk<kTopkThreads, kTopkMergePerThread, kMaxTopk>(
      chunks * topk, topk,
      [&](int i, float& v, int& ix) {
        const size_t at = row + static_cast<size_t>(i / topk) * kMaxTopk + i % topk;
        v = cand_val[at];
        ix = cand_idx[at];
      },
      stage_val, stage_idx, best_val, best_idx);
  __syncthreads();
  if (threadIdx.x < topk) {
    const float2 stats = row_stats[m];
    topk_tokens[m * topk + threadIdx.x] = best_idx[threadIdx.x];
    topk_probs[m * topk + threadIdx.x] = __expf(best_val[threadIdx.x] - stats.x) / stats.y;
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
    TS_REQUIRE(chunks * out.topk <= kTopkThreads * kTopkMergePerThread,
               "vocab = " + std::to_string(vocab) + " with topk = " + std::to_string(out.topk) +
                   ": more top-k candidates than the merge holds (" +
                   std::to_string(kTopkThreads * kTopkMergePerThread) + ")");
    detail::launch(lm_head_topk_merge_kernel, dim3(m), dim3(kTopkThreads), 0, stream, pdl,
                   static_cast<const float*>(cand_val), static_cast<const int*>(cand_idx), chunks,
                   out.topk, static_cast<const float2*>(row_stats), out.topk_tokens,
                   out.topk_probs);
  }
}

}  // namespace twinstep::kernels
