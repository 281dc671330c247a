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

// Block = one row: each thread keeps a sorted top-16 of its strided logits in registers (its
// tokens ascend, so ties keep the lower id), then topk rounds of a block argmax over the list
// heads pop the winners in order. Probabilities use the row's (max, sum of exp) from finalize.
__global__ void __launch_bounds__(kTopkThreads)
    lm_head_topk_kernel(const float* logits, int vocab, int topk, const float2* row_stats,
                        int* topk_tokens, float* topk_probs) {
  __shared__ float warp_val[kTopkThreads / 32];
  __shared__ int warp_idx[kTopkThreads / 32];
  __shared__ int winner;
  detail::pdl_wait_and_trigger();
  const int m = blockIdx.x;
  const float* row = logits + static_cast<size_t>(m) * vocab;
  float val[kMaxTopk];
  int idx[kMaxTopk];
#pragma unroll
  for (int j = 0; j < kMaxTopk; ++j) {
    val[j] = -INFINITY;
    idx[j] = 0x7fffffff;
  }
  // Loads in batches of 8 independent reads (one L2 round trip per batch, not per logit: the
  // unbatched loop measured 138 us for 128256 logits on one block).
  constexpr int kBatch = 8;
  for (int v0 = threadIdx.x; v0 < vocab; v0 += kBatch * kTopkThreads) {
    float xs[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int v = v0 + b * kTopkThreads;
      xs[b] = v < vocab ? row[v] : -INFINITY;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int v = v0 + b * kTopkThreads;
      const float x = xs[b];
      if (v < vocab && better(x, v, val[kMaxTopk - 1], idx[kMaxTopk - 1])) {
        val[kMaxTopk - 1] = x;
        idx[kMaxTopk - 1] = v;
#pragma unroll
        for (int j = kMaxTopk - 1; j > 0; --j)
          if (better(val[j], idx[j], val[j - 1], idx[j - 1])) {
            const float tv = val[j];
            val[j] = val[j - 1];
            val[j - 1] = tv;
            const int ti = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = ti;
          }
      }
    }
  }
  const float2 stats = row_stats[m];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int round = 0; round < topk; ++round) {
    float bv = val[0];
    int bi = idx[0];
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
    if (warp == 0) {
      bv = warp_val[lane];
      bi = warp_idx[lane];
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
        winner = bi;
        topk_tokens[m * topk + round] = bi;
        topk_probs[m * topk + round] = __expf(bv - stats.x) / stats.y;
      }
    }
    __syncthreads();
    if (idx[0] == winner) {  // token ids are unique: exactly one thread pops its head
#pragma unroll
      for (int j = 0; j < kMaxTopk - 1; ++j) {
        val[j] = val[j + 1];
        idx[j] = idx[j + 1];
      }
      val[kMaxTopk - 1] = -INFINITY;
      idx[kMaxTopk - 1] = 0x7fffffff;
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// launchers

size_t lm_head_workspace_bytes(int m, int vocab, int topk) {
  size_t bytes = partials_bytes(m, vocab);
  if (topk > 0) bytes += 256 + static_cast<size_t>(m) * vocab * sizeof(float);  // stats, logits
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
  if (out.topk > 0)
    detail::launch(lm_head_topk_kernel, dim3(m), dim3(kTopkThreads), 0, stream, pdl,
                   static_cast<const float*>(logits), vocab, out.topk,
                   static_cast<const float2*>(row_stats), out.topk_tokens, out.topk_probs);
}

}  // namespace twinstep::kernels
