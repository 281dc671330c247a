// Llama-family checkpoints in the Hugging Face layout: config.json plus model.safetensors, or
// shards model-0000i-of-0000N.safetensors listed in model.safetensors.index.json. bf16 only.
// Dense models (model_type llama, mistral, qwen2) and Qwen3-MoE-style mixture-of-experts models
// (model_type qwen3_moe: every layer's FFN routed experts, optionally a shared expert).
// Plain C++ (no CUDA): the loader, the synthetic writer and their tests run on any machine.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "policies/model_spec.h"
#include "runtime/safetensors.h"

namespace twinstep {

// The GQA decoder the runtime executes: Llama 2/3 and any model of that shape, with a dense
// SwiGLU FFN in every layer, or a mixture-of-experts FFN in every layer (Qwen3-MoE style).
struct LlamaConfig {
  int64_t hidden = 0;
  int64_t intermediate = 0;  // dense FFN width; 0 in an MoE config (no dense FFN)
  int64_t vocab = 0;
  int32_t layers = 0;
  int32_t q_heads = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  double rms_eps = 1e-5;
  double rope_theta = 10000.0;
  // rope_scaling {"rope_type": "llama3"}; factor 1 means none.
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  double rope_original_context = 8192.0;
  bool tie_embeddings = false;
  // Mixture of experts (num_experts > 0), every layer alike (kernels/moe.h): a router of
  // num_experts logits, the top_k experts by logit, softmax weights (renormalised over the
  // selected experts when norm_topk_prob, else over all), SwiGLU experts of width
  // expert_intermediate, plus an ungated shared expert of width shared_intermediate (0: none).
  int32_t num_experts = 0;
  int32_t top_k = 0;
  int64_t expert_intermediate = 0;
  int64_t shared_intermediate = 0;
  bool norm_topk_prob = true;
  // Expert parallelism (runtime/tensor_parallel.h): a rank's shard config holds the routed
  // experts [expert_begin, expert_begin + local_experts()) and routes over all num_experts.
  // num_local_experts 0: every expert (an unsharded config).
  int32_t expert_begin = 0;
  int32_t num_local_experts = 0;
  // Pipeline parallelism (runtime/pipeline_parallel.h): a stage's config holds the model layers
  // [first_layer, first_layer + layers) (named by their model index), the embedding only when
  // holds_embedding (the first stage), the final norm and LM head only when holds_head (the last;
  // a tied LM head is the embedding matrix, so that stage holds it too). An unsplit config holds
  // everything. A stage config describes one engine's share, never a checkpoint.
  int32_t first_layer = 0;
  bool holds_embedding = true;
  bool holds_head = true;

  bool moe() const { return num_experts > 0; }
  int32_t local_experts() const { return num_local_experts > 0 ? num_local_experts : num_experts; }
  int64_t q_dim() const { return int64_t{q_heads} * head_dim; }
  int64_t kv_dim() const { return int64_t{kv_heads} * head_dim; }
  int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
};

// Throws ConfigError when `spec` is not a GQA model whose layers are all alike, all dense or all
// MoE (the runtime's scope: no MLA, no linear attention, no mix of dense and MoE layers). A
// spec's n shared experts of width s become one shared expert of width n * s (the same
// function: their gate/up rows and down columns side by side); norm_topk_prob is true (as in
// Qwen3-30B-A3B's config.json; a ModelSpec does not carry it, costs do not depend on it).
LlamaConfig llama_config_from_spec(const ModelSpec& spec);
ModelSpec model_spec_from_config(const LlamaConfig& c, const std::string& name);

// config.json text. MoE configs use the Hugging Face Qwen3-MoE keys (model_type qwen3_moe,
// num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob, decoder_sparse_step 1,
// mlp_only_layers []) plus shared_expert_intermediate_size (Qwen2-MoE's key) for a shared expert.
std::string llama_config_json(const LlamaConfig& c);
// Parses config.json text; `file` names it in errors (CheckpointError). A qwen3_moe config must
// make every layer sparse (decoder_sparse_step 1, mlp_only_layers empty); its intermediate_size
// (the dense FFN of mlp_only_layers) is then unused. num_experts <= 1024 and, over all layers,
// at most 2^18 experts. qwen2_moe (a sigmoid-gated shared expert) and other model types are
// refused.
LlamaConfig parse_llama_config(const std::string& json_text, const std::string& file);

// The model's tensors in Hugging Face names, shapes and init scale (the synthetic std).
struct WeightDesc {
  std::string name;
  std::vector<int64_t> shape;
  double init_std = 0;  // 0: a norm weight, all ones
  bool eye = false;     // [rows][cols], cols >= rows: 1 where col == row, else 0 (init_std unused)
};
// Per layer: input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm, then the FFN:
// dense: mlp.{gate,up,down}_proj. MoE (Hugging Face Qwen3-MoE names): mlp.gate.weight
// [num_experts][hidden] (the router), mlp.experts.J.{gate_proj,up_proj} [expert_inter][hidden]
// and mlp.experts.J.down_proj [hidden][expert_inter] for J in [0, num_experts), then with a
// shared expert mlp.shared_expert.{gate_proj,up_proj,down_proj} likewise. Init std
// 1/sqrt(fan_in) for every projection, the router included. An expert-parallel shard config
// lists only its experts (J in [expert_begin, expert_begin + local_experts()), global names); a
// pipeline stage config only its layers (model.layers.N for N from first_layer) and the
// embedding / final norm / LM head it holds.
std::vector<WeightDesc> llama_weight_list(const LlamaConfig& c);

// The speculative draft module (NEXTN/MTP style, docs/runtime.md), extra tensors of a checkpoint:
//   mtp.enorm.weight [H], mtp.hnorm.weight [H]        RMSNorm of the token embedding / target
//   hidden mtp.eh_proj.weight [H, 2H]                        input = [enorm(embed(t)); hnorm(h)]
//   mtp.layer.<suffix>                                one decoder layer, the suffixes of
//                                                     model.layers.N (input_layernorm, self_attn.*,
//                                                     post_attention_layernorm, mlp.*)
// The draft shares the target's embedding, final norm (model.norm) and LM head. Its layer is the
// target's kind: an MoE target's draft layer has a router, the config's block of experts
// (expert_begin ..) and the shared expert, like the simulator's nextn draft.
std::vector<WeightDesc> draft_weight_list(const LlamaConfig& c);

// Synthetic weights of a target (and draft, when with_draft). draft_fidelity < 0: the plain
// random init (llama_weight_list's; the draft random likewise, agreeing by chance). In [0, 1]: a
// pair whose greedy agreement grows with the fidelity: the target's LM head reads mostly the
// embedding of the current token (a "bigram" path; LM head std bigram_logit_std(vocab) / sqrt(H),
// so top-1 probabilities spread over (0, 1)), every layer's residual contribution (o_proj, every
// down_proj: dense, experts', shared expert's) scaled by draft_layer_scale(F, layers), and the
// draft reproduces the bigram path
// (eh_proj = [I | 0] on the embedding half, its own layer's contributions scaled by 1e-3).
std::vector<WeightDesc> synthetic_weight_list(const LlamaConfig& c, bool with_draft,
                                              double draft_fidelity = -1);
// Scale of each target layer's residual contribution at fidelity F in [0, 1]:
// 2 (1 - F)^2 / sqrt(2 layers) (at least 1e-4), so the layers' summed perturbation of the
// residual stream is ~2 (1 - F)^2 of the embedding term whatever the depth (F = 1: ~none).
double draft_layer_scale(double fidelity, int32_t layers);
// Logit std of the bigram path: 1.1 sqrt(2 ln vocab), about the gap at which the largest of
// `vocab` such logits stands out, so the top-1 probability varies from token to token (median
// ~0.4 for vocab 1024 and ~0.35 for 128256, by sampling Gaussian logits).
double bigram_logit_std(int64_t vocab);

// Synthetic bf16 values of tensor `w`, elements [offset, offset + count), as raw bits.
void synthetic_tensor_bits(const WeightDesc& w, uint64_t seed, uint64_t offset, uint64_t count,
                           uint16_t* out);

// Writes config.json and the weights of `spec` (bf16) into `dir`, which must not exist or be
// empty (a non-empty one is refused before anything is written: an older checkpoint's index or
// shards would mix with the new files). The files are staged in "<dir>.partial-<pid>" and renamed
// into place at the end, so an interrupted write never leaves a checkpoint that opens. Linear
// weights ~ normal(0, 1/sqrt(fan_in)) (Irwin-Hall approximation, synthetic.h), embeddings
// normal(0, 1), norm weights 1. Files above shard_bytes are split into shards with an index.
// The values are those the runtime's in-memory synthetic init produces for the same seed.
// draft_fidelity (>= 0, <= 1): also writes the draft module, the pair built as
// synthetic_weight_list(c, true, draft_fidelity) describes. < 0: target only, plain random init.
void write_synthetic_checkpoint(const ModelSpec& spec, const std::string& dir, uint64_t seed,
                                uint64_t shard_bytes = uint64_t{4} << 30,
                                double draft_fidelity = -1);

// An opened checkpoint: config and memory-mapped shards, every tensor the config needs present,
// BF16 and of the right shape (checked at open; errors name the tensor and the file). Tensors of
// computations the runtime lacks (Qwen3's per-head q/k norms, a gated shared expert) are refused.
class Checkpoint {
 public:
  static std::unique_ptr<Checkpoint> open(const std::string& dir);
  const LlamaConfig& config() const { return config_; }
  // True when the checkpoint holds the draft module (every tensor of draft_weight_list, checked);
  // always false for an MoE config.
  bool has_draft() const { return has_draft_; }
  // Raw bf16 bytes of a tensor of llama_weight_list(config()) (or draft_weight_list).
  std::span<const std::byte> tensor(const std::string& name) const;
  const std::string& file_of(const std::string& name) const;

 private:
  LlamaConfig config_;
  bool has_draft_ = false;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsFile*, const TensorInfo*>> tensors_;
};

// The runtime's small test model (head_dim 128, as decode_attention requires): hidden 512,
// 4 q heads, 2 KV heads, 2 layers, vocab 1024, intermediate 1024.
ModelSpec tiny_runtime_spec();
// Its MoE counterpart: hidden 256, 4 q heads (q_dim 512 > hidden, as in Qwen3-MoE), 2 KV heads,
// 2 layers, vocab 1024, 16 experts (the fewest kernels/moe.h takes) top 2 of width 128; with
// shared_expert, a shared expert of width 256.
ModelSpec tiny_moe_runtime_spec(bool shared_expert);

}  // namespace twinstep
