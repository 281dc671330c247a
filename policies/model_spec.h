// ModelSpec: the shape of a decoder-only LLM, layer by layer, enough to count the bytes and
// FLOPs of every kernel of a decode step. Presets cover the seeds' models; every dimension that
// is an assumption says so in model_presets.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace twinstep {

enum class AttentionKind : uint8_t { kGqa, kMla, kLinear };
enum class MlpKind : uint8_t { kDense, kMoe };

struct AttentionSpec {
  AttentionKind kind = AttentionKind::kGqa;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;  // GQA: KV heads; linear: heads of the recurrent state
  int32_t head_dim = 0;      // GQA / linear: per-head q/k/v dim
  // MLA (DeepSeek-style, absorbed at decode): latent KV of kv_lora_rank + rope dims per token.
  int32_t q_lora_rank = 0;  // 0 = q projected directly from the hidden state
  int32_t kv_lora_rank = 0;
  int32_t qk_nope_head_dim = 0;
  int32_t qk_rope_head_dim = 0;
  int32_t v_head_dim = 0;
  // Linear attention (KDA-style gated delta rule): short conv width over q/k/v.
  int32_t conv_width = 0;
};

struct MlpSpec {
  MlpKind kind = MlpKind::kDense;
  int64_t intermediate = 0;  // dense SwiGLU width
  int32_t num_experts = 0;   // MoE routed experts
  int32_t top_k = 0;
  int64_t expert_intermediate = 0;  // per routed expert SwiGLU width
  int32_t num_shared_experts = 0;
  int64_t shared_intermediate = 0;  // per shared expert SwiGLU width
};

struct LayerSpec {
  AttentionSpec attn;
  MlpSpec mlp;
};

// How the runtime runs a step's small kernels inside their neighbours (EngineOptions::fused_norms
// and fused_rope; docs/kernels.md rounds 19 and 21), so the kernels step_kernels lists. Set from
// an experiment's policies.fusion; nextn_draft clears it (the draft module never fuses).
struct KernelFusion {
  // Dense GQA models on one GPU: each layer's two RMSNorms carried by the GEMVs around them in
  // decode launches of at most 16 rows and in row-exact (verify) passes: no attn_norm after the
  // first layer (whose attn_norm writes the rows' tile sums of squares), no mlp_norm; o_proj and
  // down_proj read and write the residual. Prefill and larger decode launches keep the norms.
  bool norms = false;
  // GQA layers: rope and the KV append inside the attention kernel (no rope, kv_append) in
  // decode and verify launches; prefill keeps them.
  bool rope = false;
  bool any() const { return norms || rope; }
};

struct ModelSpec {
  std::string name;
  int64_t hidden = 0;
  int64_t vocab = 0;
  bool tie_embeddings = false;
  int32_t weight_bytes = 2;  // bytes per parameter (bf16)
  int32_t kv_bytes = 2;      // bytes per cached KV element
  double rope_theta = 10000.0;
  // A NEXTN/MTP draft module: embeds the next token, normalises it and the target's hidden
  // state, projects their concatenation (eh_proj, 2·hidden → hidden) before its layers. It
  // shares the target's embedding and lm_head (read, not owned).
  bool mtp_input_proj = false;
  std::vector<LayerSpec> layers;
  KernelFusion fusion;

  int64_t param_count() const;
  int64_t weight_bytes_total() const { return param_count() * weight_bytes; }
  bool has_moe() const;  // any layer's MLP is a mixture of experts
  // Parameters read for one token: dense weights, top_k routed + shared experts, one embedding
  // row (lm_head counted whole).
  int64_t active_param_count() const;
  // Full-attention KV cache bytes per context token, over all layers (linear layers hold a
  // fixed-size state instead and add nothing per token).
  int64_t kv_bytes_per_token() const;
  // Recurrent state bytes per request (linear-attention layers, fp32 state).
  int64_t state_bytes_per_request() const;
};

int64_t layer_param_count(const LayerSpec& layer, int64_t hidden);
int64_t layer_kv_bytes_per_token(const LayerSpec& layer, int32_t kv_bytes);

// Empty where the runtime runs `fusion` for `model` on `world` ranks, else why not (what
// experiments' policies.fusion and calibration labels check): norms need every layer GQA with a
// dense MLP and one rank; rope needs every layer GQA.
std::string kernel_fusion_error(const ModelSpec& model, const KernelFusion& fusion, int32_t world);

// The one-layer NEXTN draft module of `target`: its last layer's kind, mtp_input_proj set.
ModelSpec nextn_draft(const ModelSpec& target);

// Presets by name (llama-3-8b, llama-3-70b, qwen3-30b-a3b, ling-flash-like, deepseek-like,
// tiny-llama). Throws ConfigError listing the known names for an unknown one.
const ModelSpec& model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

}  // namespace twinstep
