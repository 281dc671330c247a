#include "policies/step_kernels.h"

#include <cassert>
#include <cmath>

namespace twinstep {
namespace {

constexpr int64_t kActBytes = 2;    // bf16 activations
constexpr int64_t kStateBytes = 4;  // fp32 recurrent state

struct Emitter {
  StepKernels& out;
  const StepShape& s;
  int64_t wb;  // weight bytes per parameter

  void add(const char* name, KernelClass cls, int64_t read, int64_t written, int64_t flops) {
    out.kernels.push_back({name, cls, read, written, flops});
  }
  // y[T, n] = x[T, k] · W[k, n]
  void gemm(const char* name, int64_t k, int64_t n) {
    add(name, KernelClass::kGemm, k * n * wb + s.tokens * k * kActBytes, s.tokens * n * kActBytes,
        2 * s.tokens * k * n);
  }
  void norm(const char* name, int64_t width, bool residual) {
    const int64_t rw = residual ? 2 : 1;
    add(name, KernelClass::kNorm, rw * s.tokens * width * kActBytes + width * wb,
        rw * s.tokens * width * kActBytes, 4 * s.tokens * width);
  }
  void swiglu(const char* name, int64_t inter) {
    add(name, KernelClass::kActivation, 2 * s.tokens * inter * kActBytes,
        s.tokens * inter * kActBytes, 5 * s.tokens * inter);
  }
};

void emit_attention(Emitter& e, const ModelSpec& m, const LayerSpec& layer) {
  const AttentionSpec& a = layer.attn;
  const StepShape& s = e.s;
  const int64_t h = m.hidden;
  e.norm("attn_norm", h, /*residual=*/true);
  switch (a.kind) {
    case AttentionKind::kGqa: {
      const int64_t q = int64_t{a.num_q_heads} * a.head_dim;
      const int64_t kv = int64_t{a.num_kv_heads} * a.head_dim;
      e.gemm("qkv_proj", h, q + 2 * kv);
      e.add("rope", KernelClass::kRope, s.tokens * (q + kv) * kActBytes,
            s.tokens * (q + kv) * kActBytes, 6 * s.tokens * (q + kv));
      e.add("kv_append", KernelClass::kKvAppend, s.tokens * 2 * kv * kActBytes,
            s.tokens * 2 * kv * m.kv_bytes, 0);
      const int64_t kv_read =
          (s.ctx_tokens + s.tokens) * layer_kv_bytes_per_token(layer, m.kv_bytes);
      e.add("attention", KernelClass::kAttention, kv_read + s.tokens * q * kActBytes,
            s.tokens * q * kActBytes, 4 * s.attn_pairs * q);
      e.gemm("o_proj", q, h);
      return;
    }
    case AttentionKind::kMla: {
      const int64_t heads = a.num_q_heads;
      const int64_t qk_head = int64_t{a.qk_nope_head_dim} + a.qk_rope_head_dim;
      const int64_t latent = int64_t{a.kv_lora_rank} + a.qk_rope_head_dim;
      if (a.q_lora_rank > 0) {
        e.gemm("q_a_proj", h, a.q_lora_rank);
        e.norm("q_a_norm", a.q_lora_rank, /*residual=*/false);
        e.gemm("q_b_proj", a.q_lora_rank, heads * qk_head);
      } else {
        e.gemm("q_proj", h, heads * qk_head);
      }
      e.gemm("kv_a_proj", h, latent);
      e.norm("kv_a_norm", a.kv_lora_rank, /*residual=*/false);
      // Absorbed decode: q_nope is mapped into the latent space (W_UK), attention runs as MQA
      // over the cached latent, and the output is mapped back per head (W_UV).
      e.add("q_absorb", KernelClass::kGemm,
            heads * a.qk_nope_head_dim * a.kv_lora_rank * e.wb +
                s.tokens * heads * a.qk_nope_head_dim * kActBytes,
            s.tokens * heads * a.kv_lora_rank * kActBytes,
            2 * s.tokens * heads * a.qk_nope_head_dim * a.kv_lora_rank);
      e.add("rope", KernelClass::kRope, s.tokens * (heads + 1) * a.qk_rope_head_dim * kActBytes,
            s.tokens * (heads + 1) * a.qk_rope_head_dim * kActBytes,
            6 * s.tokens * (heads + 1) * a.qk_rope_head_dim);
      e.add("kv_append", KernelClass::kKvAppend, s.tokens * latent * kActBytes,
            s.tokens * latent * m.kv_bytes, 0);
      e.add("attention", KernelClass::kAttention,
            (s.ctx_tokens + s.tokens) * latent * m.kv_bytes + s.tokens * heads * latent * kActBytes,
            s.tokens * heads * a.kv_lora_rank * kActBytes,
            2 * s.attn_pairs * heads * (latent + a.kv_lora_rank));
      e.add("v_up", KernelClass::kGemm,
            heads * a.kv_lora_rank * a.v_head_dim * e.wb +
                s.tokens * heads * a.kv_lora_rank * kActBytes,
            s.tokens * heads * a.v_head_dim * kActBytes,
            2 * s.tokens * heads * a.kv_lora_rank * a.v_head_dim);
      e.gemm("o_proj", heads * a.v_head_dim, h);
      return;
    }
    case AttentionKind::kLinear: {
      const int64_t heads = a.num_q_heads;
      const int64_t d = heads * a.head_dim;
      // q, k, v, output gate, decay (low rank) and beta projections as one GEMM.
      e.gemm("qkvg_proj", h, 4 * d + a.head_dim + heads);
      e.gemm("decay_up", a.head_dim, d);
      e.add("short_conv", KernelClass::kActivation,
            s.requests * 3 * d * (a.conv_width - 1) * kActBytes + s.tokens * 3 * d * kActBytes,
            s.requests * 3 * d * (a.conv_width - 1) * kActBytes + s.tokens * 3 * d * kActBytes,
            2 * s.tokens * 3 * d * a.conv_width);
      // Gated delta rule: the per-request state [heads, dk, dv] is read and written once per
      // step; each token costs a few passes over it.
      const int64_t state = heads * a.head_dim * a.head_dim * kStateBytes;
      e.add("linear_attention", KernelClass::kLinearAttn,
            s.requests * state + s.tokens * 4 * d * kActBytes,
            s.requests * state + s.tokens * d * kActBytes,
            8 * s.tokens * heads * a.head_dim * a.head_dim);
      e.norm("o_gate_norm", d, /*residual=*/false);
      e.gemm("o_proj", d, h);
      return;
    }
  }
}

void emit_mlp(Emitter& e, const ModelSpec& m, const LayerSpec& layer) {
  const MlpSpec& p = layer.mlp;
  const StepShape& s = e.s;
  const int64_t h = m.hidden;
  e.norm("mlp_norm", h, /*residual=*/true);
  if (p.kind == MlpKind::kDense) {
    e.gemm("gate_up_proj", h, 2 * p.intermediate);
    e.swiglu("swiglu", p.intermediate);
    e.gemm("down_proj", p.intermediate, h);
    return;
  }
  const int64_t experts = p.num_experts;
  e.add("moe_router", KernelClass::kMoeRouter, h * experts * e.wb + s.tokens * h * kActBytes,
        s.tokens * p.top_k * 8, 2 * s.tokens * h * experts);
  // Expected number of distinct experts hit by T tokens under uniform routing.
  const double miss = std::pow(1.0 - double(p.top_k) / double(experts), double(s.tokens));
  const auto distinct = static_cast<int64_t>(std::llround(double(experts) * (1.0 - miss)));
  const int64_t routed = s.tokens * p.top_k;
  const int64_t ie = p.expert_intermediate;
  e.add("moe_gate_up", KernelClass::kMoeExperts,
        distinct * h * 2 * ie * e.wb + routed * h * kActBytes, routed * ie * kActBytes,
        2 * routed * h * 2 * ie);
  e.add("moe_down", KernelClass::kMoeExperts, distinct * ie * h * e.wb + routed * ie * kActBytes,
        routed * h * kActBytes, 2 * routed * ie * h);
  if (p.num_shared_experts > 0) {
    const int64_t is = p.shared_intermediate * p.num_shared_experts;
    e.gemm("shared_gate_up", h, 2 * is);
    e.gemm("shared_down", is, h);
  }
  e.add("moe_combine", KernelClass::kActivation, routed * h * kActBytes + s.tokens * h * kActBytes,
        s.tokens * h * kActBytes, 2 * routed * h);
}

bool same_layer(const LayerSpec& a, const LayerSpec& b) {
  const AttentionSpec& x = a.attn;
  const AttentionSpec& y = b.attn;
  return x.kind == y.kind && x.num_q_heads == y.num_q_heads && x.num_kv_heads == y.num_kv_heads &&
         x.head_dim == y.head_dim && x.q_lora_rank == y.q_lora_rank &&
         x.kv_lora_rank == y.kv_lora_rank && x.qk_nope_head_dim == y.qk_nope_head_dim &&
         x.qk_rope_head_dim == y.qk_rope_head_dim && x.v_head_dim == y.v_head_dim &&
         x.conv_width == y.conv_width && a.mlp.kind == b.mlp.kind &&
         a.mlp.intermediate == b.mlp.intermediate && a.mlp.num_experts == b.mlp.num_experts &&
         a.mlp.top_k == b.mlp.top_k && a.mlp.expert_intermediate == b.mlp.expert_intermediate &&
         a.mlp.num_shared_experts == b.mlp.num_shared_experts &&
         a.mlp.shared_intermediate == b.mlp.shared_intermediate;
}

}  // namespace

const char* kernel_class_name(KernelClass c) {
  switch (c) {
    case KernelClass::kEmbedding:
      return "embedding";
    case KernelClass::kNorm:
      return "norm";
    case KernelClass::kGemm:
      return "gemm";
    case KernelClass::kRope:
      return "rope";
    case KernelClass::kKvAppend:
      return "kv_append";
    case KernelClass::kAttention:
      return "attention";
    case KernelClass::kLinearAttn:
      return "linear_attention";
    case KernelClass::kActivation:
      return "activation";
    case KernelClass::kMoeRouter:
      return "moe_router";
    case KernelClass::kMoeExperts:
      return "moe_experts";
    case KernelClass::kLmHead:
      return "lm_head";
    case KernelClass::kSample:
      return "sample";
    case KernelClass::kCount:
      break;
  }
  return "?";
}

StepShape decode_shape(int32_t requests, int32_t q_tokens_each, int64_t ctx_tokens_sum) {
  StepShape s;
  s.requests = requests;
  s.tokens = int64_t{requests} * q_tokens_each;
  s.ctx_tokens = ctx_tokens_sum;
  const int64_t q = q_tokens_each;
  s.attn_pairs = q * ctx_tokens_sum + int64_t{requests} * q * (q + 1) / 2;
  s.lm_head_all_tokens = true;
  return s;
}

StepShape prefill_shape(int32_t requests, int64_t prompt_tokens_sum, int64_t prompt_sq_sum) {
  StepShape s;
  s.requests = requests;
  s.tokens = prompt_tokens_sum;
  s.ctx_tokens = 0;
  s.attn_pairs = (prompt_sq_sum + prompt_tokens_sum) / 2;  // Σ L(L+1)/2
  s.lm_head_all_tokens = false;
  return s;
}

int64_t StepKernels::node_count() const {
  int64_t n = 0;
  for (const LayerRun& r : runs) n += int64_t{r.repeat} * r.count;
  return n;
}

void step_kernels(const ModelSpec& m, const StepShape& s, StepKernels& out) {
  out.kernels.clear();
  out.runs.clear();
  Emitter e{out, s, m.weight_bytes};
  const int64_t h = m.hidden;

  e.add("embedding", KernelClass::kEmbedding, s.tokens * (h * m.weight_bytes + 4),
        s.tokens * h * kActBytes, 0);
  if (m.mtp_input_proj) {
    e.norm("enorm", h, /*residual=*/false);
    e.norm("hnorm", h, /*residual=*/false);
    e.gemm("eh_proj", 2 * h, h);
  }
  out.runs.push_back({1, 0, static_cast<int32_t>(out.kernels.size())});

  size_t i = 0;
  while (i < m.layers.size()) {
    size_t j = i + 1;
    while (j < m.layers.size() && same_layer(m.layers[i], m.layers[j])) ++j;
    const auto first = static_cast<int32_t>(out.kernels.size());
    emit_attention(e, m, m.layers[i]);
    emit_mlp(e, m, m.layers[i]);
    out.runs.push_back(
        {static_cast<int32_t>(j - i), first, static_cast<int32_t>(out.kernels.size()) - first});
    i = j;
  }

  const auto first = static_cast<int32_t>(out.kernels.size());
  const int64_t logits_rows = s.lm_head_all_tokens ? s.tokens : s.requests;
  e.norm("final_norm", h, /*residual=*/true);
  // LM head with the greedy argmax fused: logits never reach memory; one token id plus its
  // probability per row are written.
  e.add("lm_head", KernelClass::kLmHead, m.vocab * h * m.weight_bytes + logits_rows * h * kActBytes,
        logits_rows * 8, 2 * logits_rows * h * m.vocab);
  out.runs.push_back({1, first, static_cast<int32_t>(out.kernels.size()) - first});
}

}  // namespace twinstep
