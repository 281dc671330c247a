#include "policies/model_spec.h"

namespace twinstep {
namespace {

int64_t swiglu_params(int64_t hidden, int64_t intermediate) { return 3 * hidden * intermediate; }

int64_t attention_params(const AttentionSpec& a, int64_t hidden) {
  switch (a.kind) {
    case AttentionKind::kGqa: {
      const int64_t q = int64_t{a.num_q_heads} * a.head_dim;
      const int64_t kv = int64_t{a.num_kv_heads} * a.head_dim;
      return hidden * (q + 2 * kv) + q * hidden;
    }
    case AttentionKind::kMla: {
      const int64_t qk_head = int64_t{a.qk_nope_head_dim} + a.qk_rope_head_dim;
      const int64_t q_proj = a.q_lora_rank > 0
                                 ? hidden * a.q_lora_rank + a.q_lora_rank +
                                       int64_t{a.q_lora_rank} * a.num_q_heads * qk_head
                                 : hidden * a.num_q_heads * qk_head;
      const int64_t kv_a = hidden * (int64_t{a.kv_lora_rank} + a.qk_rope_head_dim) + a.kv_lora_rank;
      const int64_t kv_b =
          int64_t{a.kv_lora_rank} * a.num_q_heads * (int64_t{a.qk_nope_head_dim} + a.v_head_dim);
      const int64_t o = int64_t{a.num_q_heads} * a.v_head_dim * hidden;
      return q_proj + kv_a + kv_b + o;
    }
    case AttentionKind::kLinear: {
      // q, k, v, output gate: hidden -> heads·dim each; decay gate (low rank, dim 2·head_dim
      // in and out) and beta: small; short convolutions over q/k/v; o_proj.
      const int64_t d = int64_t{a.num_q_heads} * a.head_dim;
      const int64_t qkvg = 4 * hidden * d;
      const int64_t decay = hidden * a.head_dim + int64_t{a.head_dim} * d;
      const int64_t beta = hidden * a.num_q_heads;
      const int64_t conv = 3 * d * a.conv_width;
      return qkvg + decay + beta + conv + d * hidden + d /*output norm*/;
    }
  }
  return 0;
}

int64_t mlp_params(const MlpSpec& m, int64_t hidden) {
  if (m.kind == MlpKind::kDense) return swiglu_params(hidden, m.intermediate);
  return hidden * m.num_experts /*router*/ +
         int64_t{m.num_experts} * swiglu_params(hidden, m.expert_intermediate) +
         int64_t{m.num_shared_experts} * swiglu_params(hidden, m.shared_intermediate);
}

int64_t mlp_active_params(const MlpSpec& m, int64_t hidden) {
  if (m.kind == MlpKind::kDense) return swiglu_params(hidden, m.intermediate);
  return hidden * m.num_experts + int64_t{m.top_k} * swiglu_params(hidden, m.expert_intermediate) +
         int64_t{m.num_shared_experts} * swiglu_params(hidden, m.shared_intermediate);
}

}  // namespace

int64_t layer_param_count(const LayerSpec& layer, int64_t hidden) {
  return attention_params(layer.attn, hidden) + mlp_params(layer.mlp, hidden) +
         2 * hidden /*two RMSNorm weights*/;
}

int64_t layer_kv_bytes_per_token(const LayerSpec& layer, int32_t kv_bytes) {
  const AttentionSpec& a = layer.attn;
  switch (a.kind) {
    case AttentionKind::kGqa:
      return 2 * int64_t{a.num_kv_heads} * a.head_dim * kv_bytes;
    case AttentionKind::kMla:
      return (int64_t{a.kv_lora_rank} + a.qk_rope_head_dim) * kv_bytes;
    case AttentionKind::kLinear:
      return 0;
  }
  return 0;
}

std::string kernel_fusion_error(const ModelSpec& model, const KernelFusion& fusion, int32_t world) {
  bool all_gqa = !model.layers.empty(), all_dense = true;
  for (const LayerSpec& l : model.layers) {
    all_gqa = all_gqa && l.attn.kind == AttentionKind::kGqa;
    all_dense = all_dense && l.mlp.kind == MlpKind::kDense;
  }
  if (fusion.norms && !(all_gqa && all_dense))
    return "fused norms need a dense GQA model (every layer GQA attention and a dense MLP); "
           "model " +
           model.name + " is not";
  if (fusion.norms && world != 1)
    return "fused norms run on one GPU (the runtime carries the norms only without tensor, "
           "pipeline or other parallelism), not on " +
           std::to_string(world) + " ranks";
  if (fusion.rope && !all_gqa)
    return "fused rope needs GQA attention in every layer; model " + model.name + " is not";
  return {};
}

ModelSpec nextn_draft(const ModelSpec& target) {
  ModelSpec d = target;
  d.name = target.name + "-nextn";
  d.mtp_input_proj = true;
  d.layers.assign(1, target.layers.back());
  d.fusion = {};  // the runtime's draft layer runs its norms, rope and KV append separately
  return d;
}

int64_t ModelSpec::param_count() const {
  int64_t n = vocab * hidden * (tie_embeddings ? 1 : 2) + hidden /*final norm*/;
  if (mtp_input_proj) n += 2 * hidden * hidden + 2 * hidden;  // eh_proj, enorm, hnorm
  for (const LayerSpec& l : layers) n += layer_param_count(l, hidden);
  return n;
}

bool ModelSpec::has_moe() const {
  for (const LayerSpec& l : layers)
    if (l.mlp.kind == MlpKind::kMoe) return true;
  return false;
}

int64_t ModelSpec::active_param_count() const {
  int64_t n = hidden /*one embedding row*/ + vocab * hidden /*lm_head*/ + hidden;
  for (const LayerSpec& l : layers) {
    n += attention_params(l.attn, hidden) + mlp_active_params(l.mlp, hidden) + 2 * hidden;
  }
  return n;
}

int64_t ModelSpec::kv_bytes_per_token() const {
  int64_t n = 0;
  for (const LayerSpec& l : layers) n += layer_kv_bytes_per_token(l, kv_bytes);
  return n;
}

int64_t ModelSpec::state_bytes_per_request() const {
  int64_t n = 0;
  for (const LayerSpec& l : layers) {
    if (l.attn.kind != AttentionKind::kLinear) continue;
    const int64_t d = int64_t{l.attn.num_q_heads} * l.attn.head_dim;
    n += int64_t{l.attn.num_q_heads} * l.attn.head_dim * l.attn.head_dim * 4 /*fp32 state*/ +
         3 * d * (l.attn.conv_width - 1) * kv_bytes /*conv tail*/;
  }
  return n;
}

}  // namespace twinstep
