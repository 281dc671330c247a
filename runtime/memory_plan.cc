#include "runtime/memory_plan.h"

#include <algorithm>
#include <cstdio>

namespace twinstep {
namespace {

int64_t pad128(int64_t elements) { return (elements + 127) / 128 * 128; }
int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", double(bytes) / double(int64_t{1} << 30));
  return buf;
}

}  // namespace

EngineMemoryPlan plan_engine_memory(const LlamaConfig& c, int32_t max_slots,
                                    int32_t capacity_tokens, int32_t max_prefill_tokens,
                                    bool draft) {
  const int64_t H = c.hidden, I = c.intermediate, V = c.vocab;
  EngineMemoryPlan p;
  // Weights, as Engine::allocate lays them out: embedding, per layer [input norm, qkv, o,
  // post norm, FFN], final norm, lm_head unless tied. FFN: dense [gate_up, down]; MoE [router,
  // every held expert's gate_up, every held expert's down, shared gate_up, shared down] (an
  // expert-parallel shard config holds local_experts() of them, the router all).
  int64_t ffn = pad128(2 * I * H) + pad128(H * I);
  if (c.moe()) {
    const int64_t E = c.num_experts, EL = c.local_experts(), EI = c.expert_intermediate,
                  S = c.shared_intermediate;
    ffn = pad128(E * H) + pad128(EL * 2 * EI * H) + pad128(EL * H * EI);
    if (S > 0) ffn += pad128(2 * S * H) + pad128(H * S);
  }
  // A pipeline stage's config (pipeline_parallel.h) holds its layers, the embedding on the first
  // stage and the final norm and lm_head on the last (a tied lm_head: the embedding matrix).
  const bool embedding = c.holds_embedding || (c.holds_head && c.tie_embeddings);
  int64_t elements = embedding ? pad128(V * H) : 0;
  const int64_t layer =
      pad128(H) + pad128(c.qkv_dim() * H) + pad128(H * c.q_dim()) + pad128(H) + ffn;
  elements += int64_t{c.layers} * layer;
  if (c.holds_head) elements += pad128(H) + (c.tie_embeddings ? 0 : pad128(V * H));
  // The draft module: enorm, hnorm, eh_proj [H][2 H], then one layer laid out as a model layer.
  if (draft) elements += 2 * pad128(H) + pad128(2 * H * H) + layer;
  p.weight_bytes = 2 * elements;

  // KV cache (kernels/kv_cache.h): [layer][K, V][kv_head][token][head_dim] bf16 per slot.
  p.kv_slots = max_slots + 1;
  p.capacity_tokens = capacity_tokens;
  const int64_t kv_layers = c.layers + (draft ? 1 : 0);
  p.kv_bytes = int64_t{p.kv_slots} * capacity_tokens * kv_layers * 2 * c.kv_heads * c.head_dim * 2;

  // Activations: rows of the widest pass (prefill of max(max_prefill, capacity) tokens in
  // chunks, or the largest decode bucket).
  int32_t bucket = 1;
  while (bucket < max_slots) bucket *= 2;
  const int64_t group = c.q_heads / std::max(c.kv_heads, 1);
  const int64_t chunk =
      std::min<int64_t>(16, std::max<int64_t>(1, 64 / std::max<int64_t>(group, 1)));
  const int64_t prefill_rows = align_up(std::max(max_prefill_tokens, capacity_tokens), chunk);
  // A verify pass of a bucket takes kMaxDraftTokens + 1 = 16 rows per request (device_ops.h).
  const int64_t rows = std::max<int64_t>(prefill_rows, int64_t{bucket} * (draft ? 16 : 1));
  // gate_up (2 I; with a draft at least 2 H, its input concatenation) and the SwiGLU output (I).
  const int64_t row_elements =
      4 * H + c.qkv_dim() + 2 * c.q_dim() + 2 * std::max(I, draft ? H : 0) + I;
  int64_t buffers = 2 * rows * row_elements;
  // Last-row residual and MLP outputs and the output ring of every slot.
  const int64_t out_rows = std::max<int64_t>(bucket, max_slots);
  buffers += 2 * 2 * out_rows * H + 64 * out_rows * 8;
  // Attention workspace of the widest prefill: one split of float partials (head_dim floats plus
  // max and sum) per query row and head, the count when the chunks alone fill the GPU.
  buffers += prefill_rows * c.q_heads * (int64_t{c.head_dim} * 4 + 8);
  buffers += int64_t{32} << 20;  // cuBLAS workspace (engine.cc kCublasWorkspaceBytes)
  // The MoE workspace (Engine::allocate): the larger of moe_forward's for its widest call (16
  // rows, Engine::moe_ffn) and moe_prefill's for min(kMoePrefillRowsPerCall, prefill rows) rows
  // (Engine::moe_ffn_prefill; none when a prefill pass cannot exceed 16 rows).
  const int64_t prefill_call_rows = std::min<int64_t>(kMoePrefillRowsPerCall, prefill_rows);
  buffers += std::max(
      plan_moe_workspace_bytes(c, 16),
      prefill_call_rows > 16 ? plan_moe_prefill_workspace_bytes(c, int32_t(prefill_call_rows)) : 0);
  p.buffer_bytes = buffers + EngineMemoryPlan::kAllowanceBytes;
  return p;
}

int64_t plan_moe_workspace_bytes(const LlamaConfig& c, int32_t rows) {
  if (!c.moe()) return 0;
  const int64_t m = rows, E = c.num_experts, k = c.top_k, EI = c.expert_intermediate;
  const int64_t S = std::max<int64_t>(c.shared_intermediate, 1), H = c.hidden;
  // kernels/moe.cu carve(): logits, ids, weights, expert list, count, slot_of, activations,
  // shared activations, fp32 partial outputs; each 256-byte aligned.
  int64_t bytes = 0;
  for (const int64_t part : {4 * m * E, 4 * m * k, 4 * m * k, 4 * E, int64_t{4}, m * E,
                             2 * m * k * EI, 2 * m * S, 4 * m * (k + 1) * H})
    bytes += align_up(part, 256);
  return bytes;
}

int64_t plan_moe_prefill_workspace_bytes(const LlamaConfig& c, int32_t rows) {
  if (!c.moe()) return 0;
  const int64_t m = rows, E = c.num_experts, k = c.top_k, EI = c.expert_intermediate;
  const int64_t S = std::max<int64_t>(c.shared_intermediate, 1), H = c.hidden;
  const int64_t pairs = m * k, route_blocks = (m + 31) / 32, tiles = (pairs + 63) / 64 + E;
  // kernels/moe_prefill.cu carve(): logits, ids, weights, per-block expert counts, tile table
  // (int4 entries), tile count, two permutation arrays, expert activations, shared activations,
  // fp32 partial outputs; each 256-byte aligned.
  int64_t bytes = 0;
  for (const int64_t part :
       {4 * m * E, 4 * pairs, 4 * pairs, 4 * route_blocks * E, 16 * tiles, int64_t{4}, 4 * pairs,
        4 * pairs, 2 * pairs * EI, 2 * m * S, 4 * m * (k + 1) * H})
    bytes += align_up(part, 256);
  return bytes;
}

std::string describe_shortfall(const EngineMemoryPlan& p, const LlamaConfig& c,
                               const std::string& model, int device, uint64_t free_bytes,
                               uint64_t total_bytes) {
  const std::string who = model.empty() ? "a model of " + std::to_string(c.layers) +
                                              " layers, hidden " + std::to_string(c.hidden) + ","
                                        : "model " + model;
  return who + " needs " + gib(p.total_bytes()) + " (weights " + gib(p.weight_bytes) + ", KV " +
         gib(p.kv_bytes) + " for " + std::to_string(p.kv_slots - 1) + " slots (+1 padding) x " +
         std::to_string(p.capacity_tokens) + " tokens, buffers " + gib(p.buffer_bytes) +
         ") but GPU " + std::to_string(device) + " has " + gib(int64_t(free_bytes)) + " free of " +
         gib(int64_t(total_bytes));
}

void require_fits(const EngineMemoryPlan& plan, const LlamaConfig& config, const std::string& model,
                  int device, uint64_t free_bytes, uint64_t total_bytes) {
  if (uint64_t(plan.total_bytes()) > free_bytes)
    throw OutOfMemoryError(
        describe_shortfall(plan, config, model, device, free_bytes, total_bytes));
}

std::string describe_bytes(uint64_t bytes) {
  char buf[64];
  if (bytes >= (uint64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(uint64_t{1} << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(uint64_t{1} << 20));
  return std::string(buf) + " (" + std::to_string(bytes) + " bytes)";
}

}  // namespace twinstep
