#include <cmath>
#include <string>

#include "kernels/gemv.h"
#include "kernels/gemv_kernel.cuh"
#include "kernels/lm_head.h"

namespace twinstep::kernels {

namespace {

constexpr int kFinalizeThreads = 256;

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
                            int* argmax_token, float* top1_prob, int* sampled_token) {
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
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// launchers

size_t lm_head_workspace_bytes(int m, int vocab) {
  return static_cast<size_t>(m) * (vocab / detail::kGemvRowsPerBlock) *
         sizeof(detail::LogitPartial);
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
  detail::GemvParams p = {};
  p.w = w;
  p.x = x;
  p.m = m;
  p.n = vocab;
  p.k = k;
  p.logits = out.logits;
  p.partials = static_cast<detail::LogitPartial*>(workspace);
  p.inv_temperature = sampling.temperature > 0.0f ? 1.0f / sampling.temperature : 0.0f;
  p.seed = sampling.seed;
  p.step = sampling.step;
  detail::launch_gemv<detail::GemvEpilogue::kLogits>(p, stream, pdl);
  detail::launch(lm_head_finalize_kernel, dim3(m), dim3(kFinalizeThreads), 0, stream, pdl,
                 static_cast<const detail::LogitPartial*>(p.partials),
                 vocab / detail::kGemvRowsPerBlock, sampling.temperature > 0.0f, out.argmax_token,
                 out.top1_prob, out.sampled_token);
}

}  // namespace twinstep::kernels
