// The kernels of one forward step of a ModelSpec, each with bytes read/written and FLOPs.
// A step serves `requests` requests with `tokens` new tokens in all (decode: 1 per request;
// verify: the draft positions; prefill: the prompt). Both backends use this list: the
// simulator prices it, the runtime launches kernels with the same names.
#pragma once

#include <cstdint>
#include <vector>

#include "policies/layout.h"
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
  kCollective,  // communication between ranks (KernelDesc::coll says which)
  kCount
};
const char* kernel_class_name(KernelClass c);

enum class CollectiveKind : uint8_t { kNone, kAllReduce, kAllGather, kAllToAll, kSendRecv };
const char* collective_kind_name(CollectiveKind c);

// A collective's bytes_read is the message this rank contributes (a receive: 0) and
// bytes_written what it ends up receiving (all-reduce: the message; all-gather: group × message;
// all-to-all: its share of everyone's messages). `group` is the number of ranks taking part; for
// kSendRecv the peer stage (send: stage + 1, receive: stage − 1).
struct KernelDesc {
  const char* name;  // static storage: "qkv_proj", "attention", ...
  KernelClass cls;
  int64_t bytes_read;
  int64_t bytes_written;
  int64_t flops;
  CollectiveKind coll = CollectiveKind::kNone;
  int32_t group = 0;
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
// routing: E·(1 − (1 − k/E)^T). The same as the layout overload with LayoutSpec{} and rank 0.
void step_kernels(const ModelSpec& model, const StepShape& shape, StepKernels& out);

// The kernels rank `rank` of `layout` runs for one forward pass, collectives included (placement
// in docs/layouts.md). `shape` is the whole step as the pipeline sees it (every request of the
// micro-batch); under DP attention the rank's attention, dense MLP and norms see
// dp_rank_shape(shape, width, rank % width). Throws ConfigError for an invalid layout or a rank
// outside [0, world).
void step_kernels(const ModelSpec& model, const StepShape& shape, const LayoutSpec& layout,
                  int32_t rank, StepKernels& out);

// The share of `shape` that index `index` of a DP group of `width` serves: requests index,
// index + width, ...; tokens, ctx_tokens and attn_pairs split in proportion to the request count
// (⌊X·c(i+1)/R⌋ − ⌊X·c(i)/R⌋, c(i) = requests of indices < i), exact when every request has the
// same shape, and summing to the totals always. lm_head_all_tokens is kept.
StepShape dp_rank_shape(const StepShape& shape, int32_t width, int32_t index);

}  // namespace twinstep
