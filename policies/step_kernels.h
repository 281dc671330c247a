// The kernels of one forward step of a ModelSpec, each with bytes read/written and FLOPs.
// A step serves `requests` requests with `tokens` new tokens in all (decode: 1 per request;
// verify: the draft positions; prefill: the prompt). Both backends use this list: the
// simulator prices it, the runtime launches kernels with the same names.
#pragma once

#include <cstdint>
#include <vector>

#include "policies/model_spec.h"

namespace twinstep {

enum class KernelClass : uint8_t {
  kEmbedding,
  kNorm,  // RMSNorm (+ residual add)
  kGemm,  // dense projection (GEMV at decode)
  kRope,
  kKvAppend,
  kAttention,   // softmax attention over the KV cache (GQA or MLA)
  kLinearAttn,  // recurrent-state update (gated delta rule)
  kActivation,  // SwiGLU
  kMoeRouter,   // router logits + top-k + renormalise
  kMoeExperts,  // grouped expert GEMVs over the selected experts
  kLmHead,      // vocabulary projection
  kSample,      // argmax / top-k / sampling
  kCount
};
const char* kernel_class_name(KernelClass c);

struct KernelDesc {
  const char* name;  // static storage: "qkv_proj", "attention", ...
  KernelClass cls;
  int64_t bytes_read;
  int64_t bytes_written;
  int64_t flops;
};

// What a step computes. attn_pairs is the number of (query, key) pairs summed over every
// request: Σ_i [q_i·ctx_i + q_i(q_i+1)/2] for q_i new tokens after ctx_i cached tokens.
struct StepShape {
  int32_t requests = 0;
  int64_t tokens = 0;      // new tokens across all requests
  int64_t ctx_tokens = 0;  // Σ_i ctx_i: cached tokens read by attention
  int64_t attn_pairs = 0;
  bool lm_head_all_tokens = true;  // false for prefill: logits of the last token only
};

StepShape decode_shape(int32_t requests, int32_t q_tokens_each, int64_t ctx_tokens_sum);
StepShape prefill_shape(int32_t requests, int64_t prompt_tokens_sum, int64_t prompt_sq_sum);

// One run of identical consecutive layers: `repeat` times the kernels [first, first + count).
struct LayerRun {
  int32_t repeat;
  int32_t first;
  int32_t count;
};

// The whole step: prologue kernels, layer runs in model order, epilogue kernels, all indexing
// one flat kernel vector. Reused across steps without reallocating.
struct StepKernels {
  std::vector<KernelDesc> kernels;
  std::vector<LayerRun> runs;  // runs[0] is the prologue, runs.back() the epilogue (repeat 1)
  int64_t node_count() const;
};

// Fills `out` (cleared first). Expected distinct MoE experts for T tokens assume uniform
// routing: E·(1 − (1 − k/E)^T).
void step_kernels(const ModelSpec& model, const StepShape& shape, StepKernels& out);

}  // namespace twinstep
