// What a runtime Engine allocates on its GPU, computed before it allocates anything, so a model
// that does not fit is refused up front with what it needs and what the GPU has, rather than by
// a cudaMalloc failing halfway through. Pure arithmetic over the config and the engine options
// (CPU-testable: the free and total figures are passed in).
#pragma once

#include <cstdint>
#include <string>

#include "policies/error.h"
#include "runtime/checkpoint.h"

namespace twinstep {

// The model does not fit the GPU's free memory (or an allocation failed for lack of memory).
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

struct EngineMemoryPlan {
  int64_t weight_bytes = 0;  // every weight in one allocation, tensors padded to 128 elements
  int64_t kv_bytes = 0;      // K and V of every layer for kv_slots x capacity_tokens positions
  int32_t kv_slots = 0;      // max_slots + the padding slot of batch buckets
  int32_t capacity_tokens = 0;
  // Activations of the widest prefill pass, attention/lm-head/cuBLAS workspaces, relay, output
  // ring and staging; includes kAllowanceBytes for what depends on the device (attention split
  // counts follow the SM count) and what the CUDA runtime allocates for graphs and cuBLAS.
  int64_t buffer_bytes = 0;
  int64_t total_bytes() const { return weight_bytes + kv_bytes + buffer_bytes; }

  static constexpr int64_t kAllowanceBytes = int64_t{256} << 20;
};

// The plan of an Engine with these options (engine.h: EngineOptions; the same arithmetic as
// Engine::allocate). `draft`: the speculative draft module (draft_weight_list's tensors in the
// weight allocation, its layer laid out as a model layer, dense or MoE; one more KV layer per slot;
// verify rows of every bucket; its input concatenation of 2 hidden a row; its small per-row state
// is within the allowance). MoE configs: every held expert's weights (router,
// packed gate_up and down, shared expert; an expert-parallel shard config holds its block of
// local_experts() and its shared slice) and one MoE workspace: the larger of moe_forward's for its
// widest call (16 rows) and moe_prefill's for min(kMoePrefillRowsPerCall, prefill rows) rows.
// A pipeline stage's config (pipeline_parallel.h pp_stage_config): its layers' weights and KV,
// the embedding only on the first stage, the final norm and lm_head only on the last.
// Sizes are computed in 64 bits; configs come from parse_llama_config or a ModelSpec, whose
// ranges keep every product far below 2^63.
EngineMemoryPlan plan_engine_memory(const LlamaConfig& config, int32_t max_slots,
                                    int32_t capacity_tokens, int32_t max_prefill_tokens,
                                    bool draft = false);

// kernels::moe_workspace_bytes(rows, shape of `config`), computed without CUDA (the carve-up of
// kernels/moe.cu; a GPU test holds the two equal). 0 for a dense config.
int64_t plan_moe_workspace_bytes(const LlamaConfig& config, int32_t rows);

// Rows per moe_prefill call (Engine::moe_ffn_prefill): a longer prefill pass runs in calls of this
// many rows. Bounds the workspace (Qwen3-30B-A3B: 355 MB, mostly fp32 partial sums) while each
// call still gives 128 experts top-8 ~256 rows per expert, so the grouped GEMMs stay compute-bound
// (each expert's weights are read once per call).
constexpr int32_t kMoePrefillRowsPerCall = 4096;

// kernels::moe_prefill_workspace_bytes(rows, shape of `config`) without CUDA (the carve-up of
// kernels/moe_prefill.cu; a GPU test holds the two equal). 0 for a dense config.
int64_t plan_moe_prefill_workspace_bytes(const LlamaConfig& config, int32_t rows);

// "model M needs X GiB (weights W, KV K for N slots x C tokens, buffers B) but GPU D has F GiB
// free of T". `model` names the model ("llama-3-70b"); empty: its shape is described instead.
std::string describe_shortfall(const EngineMemoryPlan& plan, const LlamaConfig& config,
                               const std::string& model, int device, uint64_t free_bytes,
                               uint64_t total_bytes);

// Throws OutOfMemoryError with describe_shortfall's message when plan.total_bytes() > free_bytes.
void require_fits(const EngineMemoryPlan& plan, const LlamaConfig& config, const std::string& model,
                  int device, uint64_t free_bytes, uint64_t total_bytes);

// A size for messages: "1.50 GiB (1610612736 bytes)", "16.0 MiB (16777216 bytes)".
std::string describe_bytes(uint64_t bytes);

}  // namespace twinstep
