#include "runtime/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "runtime/json_lite.h"
#include "runtime/synthetic.h"

namespace twinstep {
namespace {

namespace fs = std::filesystem;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(path + ": cannot open");
  std::ostringstream s;
  s << in.rdbuf();
  if (s.str().size() > kMaxSafetensorsHeaderBytes) throw CheckpointError(path + ": too large");
  return s.str();
}

std::string shape_text(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Bounds on untrusted configs (config.json is a fuzz target), far above published MoE models
// (DeepSeek-V3: 58 MoE layers x 256 experts; Qwen3-Next-80B-A3B: 48 x 512).
constexpr int64_t kMaxExperts = 1024;
constexpr int64_t kMaxExpertsTotal = int64_t{1} << 18;

std::string number_text(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  std::string t = s.str();
  if (t.find_first_of(".eE") == std::string::npos) t += ".0";
  return t;
}

}  // namespace

LlamaConfig llama_config_from_spec(const ModelSpec& spec) {
  auto fail = [&](const std::string& why) -> ConfigError {
    return ConfigError("", "model '" + spec.name + "': " + why);
  };
  if (spec.layers.empty()) throw fail("has no layers");
  const LayerSpec& l0 = spec.layers[0];
  auto mlp_name = [](const MlpSpec& m) { return m.kind == MlpKind::kMoe ? "MoE" : "dense"; };
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& l = spec.layers[i];
    const std::string at = "layer " + std::to_string(i);
    if (l.attn.kind == AttentionKind::kMla)
      throw fail(at + " has MLA attention; the real runtime runs GQA attention only");
    if (l.attn.kind == AttentionKind::kLinear)
      throw fail(at + " has linear attention; the real runtime runs GQA attention only");
    if (l.mlp.kind != l0.mlp.kind)
      throw fail("mixes dense and MoE layers (layer 0 " + std::string(mlp_name(l0.mlp)) + ", " +
                 at + " " + mlp_name(l.mlp) + "); the real runtime runs uniform layers only");
    const MlpSpec &a = l.mlp, &b = l0.mlp;
    if (l.attn.num_q_heads != l0.attn.num_q_heads || l.attn.num_kv_heads != l0.attn.num_kv_heads ||
        l.attn.head_dim != l0.attn.head_dim || a.intermediate != b.intermediate ||
        a.num_experts != b.num_experts || a.top_k != b.top_k ||
        a.expert_intermediate != b.expert_intermediate ||
        a.num_shared_experts != b.num_shared_experts ||
        a.shared_intermediate != b.shared_intermediate)
      throw fail("layers differ in shape (layer 0 and " + at + ")");
  }
  if (spec.weight_bytes != 2 || spec.kv_bytes != 2)
    throw fail("the real runtime runs bf16 weights and KV");
  LlamaConfig c;
  c.hidden = spec.hidden;
  c.vocab = spec.vocab;
  c.layers = static_cast<int32_t>(spec.layers.size());
  c.q_heads = l0.attn.num_q_heads;
  c.kv_heads = l0.attn.num_kv_heads;
  c.head_dim = l0.attn.head_dim;
  c.rope_theta = spec.rope_theta;
  c.tie_embeddings = spec.tie_embeddings;
  if (l0.mlp.kind == MlpKind::kMoe) {
    c.num_experts = l0.mlp.num_experts;
    c.top_k = l0.mlp.top_k;
    c.expert_intermediate = l0.mlp.expert_intermediate;
    c.shared_intermediate = int64_t{l0.mlp.num_shared_experts} * l0.mlp.shared_intermediate;
    c.norm_topk_prob = true;
  } else {
    c.intermediate = l0.mlp.intermediate;
  }
  return c;
}

ModelSpec model_spec_from_config(const LlamaConfig& c, const std::string& name) {
  ModelSpec m;
  m.name = name;
  m.hidden = c.hidden;
  m.vocab = c.vocab;
  m.tie_embeddings = c.tie_embeddings;
  m.rope_theta = c.rope_theta;
  LayerSpec l;
  l.attn.kind = AttentionKind::kGqa;
  l.attn.num_q_heads = c.q_heads;
  l.attn.num_kv_heads = c.kv_heads;
  l.attn.head_dim = c.head_dim;
  if (c.moe()) {
    l.mlp.kind = MlpKind::kMoe;
    l.mlp.num_experts = c.num_experts;
    l.mlp.top_k = c.top_k;
    l.mlp.expert_intermediate = c.expert_intermediate;
    l.mlp.num_shared_experts = c.shared_intermediate > 0 ? 1 : 0;
    l.mlp.shared_intermediate = c.shared_intermediate;
  } else {
    l.mlp.kind = MlpKind::kDense;
    l.mlp.intermediate = c.intermediate;
  }
  m.layers.assign(size_t(c.layers), l);
  return m;
}

namespace {
// The tiny test models' attention: 2 layers, 4 query heads of 128 over 2 KV heads, vocab 1024.
LlamaConfig tiny_attention_config(int64_t hidden) {
  LlamaConfig c;
  c.hidden = hidden;
  c.vocab = 1024;
  c.layers = 2;
  c.q_heads = 4;
  c.kv_heads = 2;
  c.head_dim = 128;
  c.rope_theta = 10000.0;
  return c;
}
}  // namespace

ModelSpec tiny_runtime_spec() {
  LlamaConfig c = tiny_attention_config(512);
  c.intermediate = 1024;
  return model_spec_from_config(c, "tiny-runtime");
}

ModelSpec tiny_moe_runtime_spec(bool shared_expert) {
  LlamaConfig c = tiny_attention_config(256);
  c.num_experts = 16;
  c.top_k = 2;
  c.expert_intermediate = 128;
  c.shared_intermediate = shared_expert ? 256 : 0;
  return model_spec_from_config(c, shared_expert ? "tiny-moe-shared-runtime" : "tiny-moe-runtime");
}

std::string llama_config_json(const LlamaConfig& c) {
  std::ostringstream s;
  s << "{\n";
  if (c.moe())
    s << "  \"architectures\": [\"Qwen3MoeForCausalLM\"],\n"
      << "  \"model_type\": \"qwen3_moe\",\n";
  else
    s << "  \"architectures\": [\"LlamaForCausalLM\"],\n"
      << "  \"model_type\": \"llama\",\n";
  s << "  \"torch_dtype\": \"bfloat16\",\n"
    << "  \"hidden_size\": " << c.hidden << ",\n";
  if (c.moe()) {
    s << "  \"num_experts\": " << c.num_experts << ",\n"
      << "  \"num_experts_per_tok\": " << c.top_k << ",\n"
      << "  \"moe_intermediate_size\": " << c.expert_intermediate << ",\n"
      << "  \"norm_topk_prob\": " << (c.norm_topk_prob ? "true" : "false") << ",\n"
      << "  \"decoder_sparse_step\": 1,\n"
      << "  \"mlp_only_layers\": [],\n";
    if (c.shared_intermediate > 0)
      s << "  \"shared_expert_intermediate_size\": " << c.shared_intermediate << ",\n";
  } else {
    s << "  \"intermediate_size\": " << c.intermediate << ",\n";
  }
  s << "  \"num_hidden_layers\": " << c.layers << ",\n"
    << "  \"num_attention_heads\": " << c.q_heads << ",\n"
    << "  \"num_key_value_heads\": " << c.kv_heads << ",\n"
    << "  \"head_dim\": " << c.head_dim << ",\n"
    << "  \"vocab_size\": " << c.vocab << ",\n"
    << "  \"rms_norm_eps\": " << number_text(c.rms_eps) << ",\n"
    << "  \"rope_theta\": " << number_text(c.rope_theta) << ",\n";
  if (c.rope_factor != 1.0) {
    s << "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": "
      << number_text(c.rope_factor)
      << ", \"low_freq_factor\": " << number_text(c.rope_low_freq_factor)
      << ", \"high_freq_factor\": " << number_text(c.rope_high_freq_factor)
      << ", \"original_max_position_embeddings\": " << static_cast<int64_t>(c.rope_original_context)
      << "},\n";
  }
  s << "  \"tie_word_embeddings\": " << (c.tie_embeddings ? "true" : "false") << "\n}\n";
  return s.str();
}

LlamaConfig parse_llama_config(const std::string& text, const std::string& file) {
  JsonValue root;
  try {
    root = parse_json(text, 16);
  } catch (const JsonError& e) {
    throw CheckpointError(file + ": " + e.what());
  }
  if (root.kind != JsonValue::Kind::kObject)
    throw CheckpointError(file + ": config is not a JSON object");
  auto need = [&](const char* key) -> const JsonValue& {
    const JsonValue* v = root.find(key);
    if (v == nullptr) throw CheckpointError(file + ": missing \"" + key + "\"");
    return *v;
  };
  auto positive = [&](const char* key, int64_t max) {
    int64_t v = 0;
    try {
      v = need(key).as_i64(key);
    } catch (const JsonError& e) {
      throw CheckpointError(file + ": " + e.what());
    }
    if (v <= 0 || v > max)
      throw CheckpointError(file + ": \"" + key + "\" = " + std::to_string(v) + " outside [1, " +
                            std::to_string(max) + "]");
    return v;
  };
  LlamaConfig c;
  try {
    std::string type;  // empty: not given
    if (const JsonValue* mt = root.find("model_type")) {
      type = mt->as_string("model_type");
      if (type == "qwen2_moe")
        throw CheckpointError(file +
                              ": model_type \"qwen2_moe\" is not supported (its shared expert is "
                              "sigmoid-gated; the runtime adds the shared expert ungated)");
      if (type != "llama" && type != "mistral" && type != "qwen2" && type != "qwen3_moe")
        throw CheckpointError(file + ": model_type \"" + type +
                              "\" is neither a Llama-family dense model (llama, mistral, qwen2) " +
                              "nor a Qwen3-MoE model (qwen3_moe)");
    }
    // MoE: model_type qwen3_moe, or no model_type and a num_experts key.
    const bool moe = type == "qwen3_moe" || (type.empty() && root.find("num_experts") != nullptr);
    if (!moe && root.find("num_experts") != nullptr)
      throw CheckpointError(file + ": \"num_experts\" in a model_type \"" + type +
                            "\" config (mixture-of-experts configs are model_type qwen3_moe)");
    if (const JsonValue* dt = root.find("torch_dtype")) {
      if (dt->as_string("torch_dtype") != "bfloat16")
        throw CheckpointError(file + ": torch_dtype \"" + dt->text +
                              "\" is not supported (bfloat16 only)");
    }
    c.hidden = positive("hidden_size", 1 << 20);
    if (moe) {
      c.num_experts = static_cast<int32_t>(positive("num_experts", kMaxExperts));
      c.top_k = static_cast<int32_t>(positive("num_experts_per_tok", c.num_experts));
      c.expert_intermediate = positive("moe_intermediate_size", 1 << 22);
      // Qwen3MoeConfig's default: no renormalisation unless norm_topk_prob is true.
      c.norm_topk_prob = false;
      if (const JsonValue* v = root.find("norm_topk_prob")) {
        if (v->kind != JsonValue::Kind::kBool)
          throw CheckpointError(file + ": norm_topk_prob is not a boolean");
        c.norm_topk_prob = v->boolean;
      }
      if (const JsonValue* v = root.find("shared_expert_intermediate_size");
          v != nullptr && v->kind != JsonValue::Kind::kNull) {
        const int64_t n = v->as_i64("shared_expert_intermediate_size");
        if (n < 0 || n > (1 << 22))
          throw CheckpointError(
              file + ": \"shared_expert_intermediate_size\" = " + std::to_string(n) +
              " outside [0, " + std::to_string(1 << 22) + "] (0: no shared expert)");
        c.shared_intermediate = n;
      }
      // Dense layers among the MoE ones (Qwen3MoeConfig: layer i is sparse when i is not in
      // mlp_only_layers and (i + 1) % decoder_sparse_step == 0).
      if (const JsonValue* v = root.find("decoder_sparse_step")) {
        if (v->as_i64("decoder_sparse_step") != 1)
          throw CheckpointError(file + ": \"decoder_sparse_step\" = " + v->text +
                                " makes some layers dense; the runtime runs every layer MoE (1)");
      }
      if (const JsonValue* v = root.find("mlp_only_layers");
          v != nullptr && v->kind != JsonValue::Kind::kNull) {
        if (v->kind != JsonValue::Kind::kArray || !v->items.empty())
          throw CheckpointError(file + ": \"mlp_only_layers\" makes some layers dense; the " +
                                "runtime runs every layer MoE ([])");
      }
      // intermediate_size is the FFN width of mlp_only_layers, none here: unused.
    } else {
      c.intermediate = positive("intermediate_size", 1 << 22);
    }
    c.vocab = positive("vocab_size", 1 << 24);
    c.layers = static_cast<int32_t>(positive("num_hidden_layers", 1024));
    if (int64_t{c.layers} * c.num_experts > kMaxExpertsTotal)
      throw CheckpointError(file + ": num_hidden_layers x num_experts = " +
                            std::to_string(int64_t{c.layers} * c.num_experts) + " exceeds " +
                            std::to_string(kMaxExpertsTotal) + " (3 tensors per expert)");
    c.q_heads = static_cast<int32_t>(positive("num_attention_heads", 1024));
    c.kv_heads = root.find("num_key_value_heads")
                     ? static_cast<int32_t>(positive("num_key_value_heads", 1024))
                     : c.q_heads;
    c.head_dim = root.find("head_dim") && root.find("head_dim")->kind != JsonValue::Kind::kNull
                     ? static_cast<int32_t>(positive("head_dim", 4096))
                     : static_cast<int32_t>(c.hidden / c.q_heads);
    if (c.head_dim < 1)
      throw CheckpointError(file + ": hidden_size " + std::to_string(c.hidden) +
                            " / num_attention_heads " + std::to_string(c.q_heads) +
                            " gives head_dim 0; give \"head_dim\"");
    if (c.q_heads % c.kv_heads != 0)
      throw CheckpointError(file +
                            ": num_attention_heads is not a multiple of num_key_value_heads");
    if (const JsonValue* v = root.find("rms_norm_eps")) c.rms_eps = v->as_double("rms_norm_eps");
    if (const JsonValue* v = root.find("rope_theta")) c.rope_theta = v->as_double("rope_theta");
    if (const JsonValue* v = root.find("tie_word_embeddings")) {
      if (v->kind != JsonValue::Kind::kBool)
        throw CheckpointError(file + ": tie_word_embeddings is not a boolean");
      c.tie_embeddings = v->boolean;
    }
    if (const JsonValue* rs = root.find("rope_scaling");
        rs != nullptr && rs->kind != JsonValue::Kind::kNull) {
      const JsonValue* type = rs->find("rope_type");
      if (type == nullptr) type = rs->find("type");
      if (type == nullptr || type->as_string("rope_scaling.rope_type") != "llama3")
        throw CheckpointError(file + ": only rope_scaling of rope_type \"llama3\" is supported");
      auto num = [&](const char* k, double& out) {
        if (const JsonValue* v = rs->find(k)) out = v->as_double(std::string("rope_scaling.") + k);
      };
      num("factor", c.rope_factor);
      num("low_freq_factor", c.rope_low_freq_factor);
      num("high_freq_factor", c.rope_high_freq_factor);
      if (const JsonValue* v = rs->find("original_max_position_embeddings")) {
        const int64_t n = v->as_i64("rope_scaling.original_max_position_embeddings");
        if (n < 1 || n > (int64_t{1} << 30))
          throw CheckpointError(file + ": rope_scaling.original_max_position_embeddings = " +
                                std::to_string(n) + " outside [1, 2^30]");
        c.rope_original_context = double(n);
      }
      // The llama3 rule divides by high_freq_factor - low_freq_factor (kernels/rope.h).
      if (!(c.rope_low_freq_factor > 0) || !(c.rope_high_freq_factor > c.rope_low_freq_factor))
        throw CheckpointError(
            file + ": rope_scaling needs 0 < low_freq_factor < high_freq_factor, got " +
            number_text(c.rope_low_freq_factor) + " and " + number_text(c.rope_high_freq_factor));
    }
  } catch (const JsonError& e) {
    throw CheckpointError(file + ": " + e.what());
  }
  if (!(c.rms_eps > 0) || !(c.rope_theta > 0) || !(c.rope_factor >= 1.0))
    throw CheckpointError(file + ": rms_norm_eps, rope_theta must be > 0 and rope factor >= 1");
  return c;
}

namespace {

// One decoder layer's tensors under `p` ("model.layers.N." or "mtp.layer.").
void push_layer(const LlamaConfig& c, const std::string& p, std::vector<WeightDesc>& w) {
  const double in_h = 1.0 / std::sqrt(double(c.hidden));
  w.push_back({p + "input_layernorm.weight", {c.hidden}, 0});
  w.push_back({p + "self_attn.q_proj.weight", {c.q_dim(), c.hidden}, in_h});
  w.push_back({p + "self_attn.k_proj.weight", {c.kv_dim(), c.hidden}, in_h});
  w.push_back({p + "self_attn.v_proj.weight", {c.kv_dim(), c.hidden}, in_h});
  w.push_back(
      {p + "self_attn.o_proj.weight", {c.hidden, c.q_dim()}, 1.0 / std::sqrt(double(c.q_dim()))});
  w.push_back({p + "post_attention_layernorm.weight", {c.hidden}, 0});
  // One SwiGLU FFN of width `inter` under prefix `f`.
  auto swiglu = [&](const std::string& f, int64_t inter) {
    w.push_back({f + "gate_proj.weight", {inter, c.hidden}, in_h});
    w.push_back({f + "up_proj.weight", {inter, c.hidden}, in_h});
    w.push_back({f + "down_proj.weight", {c.hidden, inter}, 1.0 / std::sqrt(double(inter))});
  };
  if (!c.moe()) {
    swiglu(p + "mlp.", c.intermediate);
    return;
  }
  w.push_back({p + "mlp.gate.weight", {c.num_experts, c.hidden}, in_h});
  for (int32_t j = c.expert_begin; j < c.expert_begin + c.local_experts(); ++j)
    swiglu(p + "mlp.experts." + std::to_string(j) + ".", c.expert_intermediate);
  if (c.shared_intermediate > 0) swiglu(p + "mlp.shared_expert.", c.shared_intermediate);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A projection whose output is added to the residual stream: o_proj and every down_proj (the
// dense FFN's, each expert's, the shared expert's; an MoE layer's output is their weighted sum).
bool residual_output(const std::string& name) {
  return ends_with(name, "self_attn.o_proj.weight") || ends_with(name, "down_proj.weight");
}

}  // namespace

std::vector<WeightDesc> llama_weight_list(const LlamaConfig& c) {
  std::vector<WeightDesc> w;
  if (c.holds_embedding || (c.holds_head && c.tie_embeddings))
    w.push_back({"model.embed_tokens.weight", {c.vocab, c.hidden}, 1.0});
  for (int32_t i = 0; i < c.layers; ++i)
    push_layer(c, "model.layers." + std::to_string(c.first_layer + i) + ".", w);
  if (!c.holds_head) return w;
  w.push_back({"model.norm.weight", {c.hidden}, 0});
  if (!c.tie_embeddings)
    w.push_back({"lm_head.weight", {c.vocab, c.hidden}, 1.0 / std::sqrt(double(c.hidden))});
  return w;
}

std::vector<WeightDesc> draft_weight_list(const LlamaConfig& c) {
  std::vector<WeightDesc> w;
  w.push_back({"mtp.enorm.weight", {c.hidden}, 0});
  w.push_back({"mtp.hnorm.weight", {c.hidden}, 0});
  w.push_back({"mtp.eh_proj.weight", {c.hidden, 2 * c.hidden}, 1.0 / std::sqrt(2.0 * c.hidden)});
  push_layer(c, "mtp.layer.", w);
  return w;
}

double draft_layer_scale(double fidelity, int32_t layers) {
  const double f = std::clamp(fidelity, 0.0, 1.0);
  // Floored above zero: an init_std of 0 means "all ones" (a norm weight).
  return std::max(2.0 * (1.0 - f) * (1.0 - f) / std::sqrt(2.0 * std::max(layers, 1)), 1e-4);
}

double bigram_logit_std(int64_t vocab) {
  return 1.1 * std::sqrt(2.0 * std::log(double(std::max<int64_t>(vocab, 2))));
}

std::vector<WeightDesc> synthetic_weight_list(const LlamaConfig& c, bool with_draft,
                                              double draft_fidelity) {
  std::vector<WeightDesc> w = llama_weight_list(c);
  std::vector<WeightDesc> d;
  if (with_draft) d = draft_weight_list(c);
  if (draft_fidelity >= 0) {
    if (draft_fidelity > 1)
      throw ConfigError("", "draft fidelity " + std::to_string(draft_fidelity) + " outside [0, 1]");
    const double layer_scale = draft_layer_scale(draft_fidelity, c.layers);
    for (WeightDesc& t : w) {
      if (residual_output(t.name)) t.init_std *= layer_scale;
      if (t.name == "lm_head.weight") t.init_std *= bigram_logit_std(c.vocab);
    }
    for (WeightDesc& t : d) {
      if (residual_output(t.name)) t.init_std *= 1e-3;
      if (t.name == "mtp.eh_proj.weight") t.eye = true;
    }
  }
  w.insert(w.end(), d.begin(), d.end());
  return w;
}

void synthetic_tensor_bits(const WeightDesc& w, uint64_t seed, uint64_t offset, uint64_t count,
                           uint16_t* out) {
  if (w.eye) {
    const uint64_t cols = uint64_t(w.shape.at(1));
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t e = offset + i;
      out[i] = e / cols == e % cols ? 0x3f80 : 0;
    }
    return;
  }
  if (w.init_std == 0) {
    for (uint64_t i = 0; i < count; ++i) out[i] = 0x3f80;  // 1.0
    return;
  }
  const uint64_t stream = synthetic::tensor_stream(w.name);
  const float scale = synthetic::scale_for_std(w.init_std);
  for (uint64_t i = 0; i < count; ++i)
    out[i] = synthetic::element_bits(seed, stream, offset + i, scale);
}

namespace {

// The files of write_synthetic_checkpoint, into `dir` (exists, empty).
void write_synthetic_files(const LlamaConfig& c, const std::vector<WeightDesc>& weights,
                           const std::string& dir, uint64_t seed, uint64_t shard_bytes,
                           double draft_fidelity) {
  {
    std::ofstream cfg(fs::path(dir) / "config.json");
    cfg << llama_config_json(c);
    if (!cfg) throw CheckpointError(dir + "/config.json: write failed");
  }
  std::vector<std::vector<TensorSource>> shards(1);
  uint64_t in_shard = 0;
  for (const WeightDesc& w : weights) {
    uint64_t bytes = 2;
    for (const int64_t d : w.shape) bytes *= uint64_t(d);
    if (in_shard > 0 && in_shard + bytes > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    in_shard += bytes;
    shards.back().push_back(
        {w.name, DType::kBF16, w.shape, [w, seed](std::byte* dst, uint64_t offset, uint64_t count) {
           synthetic_tensor_bits(w, seed, offset, count, reinterpret_cast<uint16_t*>(dst));
         }});
  }
  std::vector<std::pair<std::string, std::string>> meta = {
      {"format", "pt"}, {"twinstep_synthetic_seed", std::to_string(seed)}};
  if (draft_fidelity >= 0) {
    std::ostringstream f;
    f << draft_fidelity;  // 6 significant digits: the value as typed
    meta.push_back({"twinstep_draft_fidelity", f.str()});
  }
  if (shards.size() == 1) {
    write_safetensors((fs::path(dir) / "model.safetensors").string(), shards[0], meta);
    return;
  }
  std::ostringstream index;
  uint64_t total = 0;
  std::vector<std::string> lines;
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    write_safetensors((fs::path(dir) / name).string(), shards[s], meta);
    for (const TensorSource& t : shards[s]) {
      uint64_t bytes = 2;
      for (const int64_t d : t.shape) bytes *= uint64_t(d);
      total += bytes;
      lines.push_back("    \"" + t.name + "\": \"" + name + "\"");
    }
  }
  index << "{\n  \"metadata\": {\"total_size\": " << total << "},\n  \"weight_map\": {\n";
  for (size_t i = 0; i < lines.size(); ++i)
    index << lines[i] << (i + 1 < lines.size() ? ",\n" : "\n");
  index << "  }\n}\n";
  std::ofstream out(fs::path(dir) / "model.safetensors.index.json");
  out << index.str();
  out.close();
  if (!out) throw CheckpointError(dir + "/model.safetensors.index.json: write failed");
}

}  // namespace

void write_synthetic_checkpoint(const ModelSpec& spec, const std::string& dir, uint64_t seed,
                                uint64_t shard_bytes, double draft_fidelity) {
  const LlamaConfig c = llama_config_from_spec(spec);
  // Before anything is written: a model or fidelity the weight list refuses leaves no directory.
  const std::vector<WeightDesc> weights =
      synthetic_weight_list(c, draft_fidelity >= 0, draft_fidelity);
  fs::path target = fs::path(dir).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "out/" names "out"
  if (target.empty() || !target.has_filename() || target.filename() == "." ||
      target.filename() == "..")
    throw CheckpointError("\"" + dir + "\": not a directory name a checkpoint can be written to");
  std::error_code ec;
  if (fs::exists(target, ec)) {
    if (!fs::is_directory(target, ec))
      throw CheckpointError(dir + ": exists and is not a directory");
    if (!fs::is_empty(target, ec))
      throw CheckpointError(dir +
                            ": exists and is not empty; a checkpoint is written to a new or "
                            "empty directory (remove it or choose another)");
  }
  // Staged beside the target and renamed into place: an interrupted write leaves only a
  // "<dir>.partial-<pid>" directory, never a checkpoint that opens with part of its weights.
  const fs::path staging =
      target.parent_path() / (target.filename().string() + ".partial-" + std::to_string(getpid()));
  fs::remove_all(staging, ec);
  fs::create_directories(staging, ec);
  if (ec) throw CheckpointError(staging.string() + ": cannot create directory: " + ec.message());
  try {
    write_synthetic_files(c, weights, staging.string(), seed, shard_bytes, draft_fidelity);
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
  if (fs::exists(target, ec)) fs::remove(target, ec);  // empty, checked above
  fs::rename(staging, target, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove_all(staging, ec);
    throw CheckpointError(dir + ": cannot move the written checkpoint into place: " + why);
  }
}

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  const fs::path root(dir);
  const std::string cfg_path = (root / "config.json").string();
  ck->config_ = parse_llama_config(read_text(cfg_path), cfg_path);

  // Which file holds each tensor.
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> file_names;
  const fs::path index_path = root / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    const std::string ip = index_path.string();
    JsonValue idx;
    try {
      idx = parse_json(read_text(ip), 8);
    } catch (const JsonError& e) {
      throw CheckpointError(ip + ": " + e.what());
    }
    const JsonValue* wm = idx.find("weight_map");
    if (wm == nullptr || wm->kind != JsonValue::Kind::kObject)
      throw CheckpointError(ip + ": missing \"weight_map\" object");
    for (const auto& [name, v] : wm->fields) {
      if (v.kind != JsonValue::Kind::kString)
        throw CheckpointError(ip + ": weight_map entry of \"" + name + "\" is not a file name");
      const std::string& f = v.text;
      if (f.empty() || f.find('/') != std::string::npos || f.find('\\') != std::string::npos ||
          f == "." || f == "..")
        throw CheckpointError(ip + ": weight_map file name \"" + f +
                              "\" must be a plain file name in the checkpoint directory");
      weight_map[name] = f;
      if (std::find(file_names.begin(), file_names.end(), f) == file_names.end())
        file_names.push_back(f);
    }
  } else if (fs::exists(root / "model.safetensors")) {
    file_names.push_back("model.safetensors");
  } else {
    throw CheckpointError(dir + ": neither model.safetensors nor model.safetensors.index.json");
  }
  std::map<std::string, const SafetensorsFile*> by_name;
  for (const std::string& f : file_names) {
    ck->files_.push_back(SafetensorsFile::open((root / f).string()));
    by_name[f] = ck->files_.back().get();
  }

  auto present = [&](const std::string& name) {
    return weight_map.empty() ? ck->files_[0]->find(name) != nullptr : weight_map.count(name) > 0;
  };
  // Tensors of computations the runtime does not implement: loading around them would run a
  // different model without a word.
  const std::pair<const char*, const char*> unsupported[] = {
      {"model.layers.0.self_attn.q_norm.weight", "per-head q/k RMSNorm (Qwen3 attention)"},
      {"model.layers.0.mlp.shared_expert_gate.weight", "a sigmoid-gated shared expert"},
  };
  for (const auto& [name, what] : unsupported)
    if (present(name))
      throw CheckpointError(dir + ": tensor " + name + " means " + what +
                            ", which the runtime does not implement");
  // The draft module is optional: present when its projection is, then checked like the rest.
  const bool draft = present("mtp.eh_proj.weight");
  ck->has_draft_ = draft;
  std::vector<WeightDesc> wanted = llama_weight_list(ck->config_);
  if (draft) {
    const std::vector<WeightDesc> d = draft_weight_list(ck->config_);
    wanted.insert(wanted.end(), d.begin(), d.end());
  }
  for (const WeightDesc& w : wanted) {
    const SafetensorsFile* file = nullptr;
    if (!weight_map.empty()) {
      auto it = weight_map.find(w.name);
      if (it == weight_map.end())
        throw CheckpointError(index_path.string() + ": tensor " + w.name + " is not in weight_map");
      file = by_name.at(it->second);
    } else {
      file = ck->files_[0].get();
    }
    const TensorInfo* t = file->find(w.name);
    if (t == nullptr) throw CheckpointError(file->path() + ": tensor " + w.name + " is missing");
    if (t->dtype != DType::kBF16)
      throw CheckpointError(file->path() + ": tensor " + w.name + " is " + dtype_name(t->dtype) +
                            ", expected BF16");
    if (t->shape != w.shape)
      throw CheckpointError(file->path() + ": tensor " + w.name + " has shape " +
                            shape_text(t->shape) + " but config.json implies " +
                            shape_text(w.shape));
    ck->tensors_[w.name] = {file, t};
  }
  return ck;
}

std::span<const std::byte> Checkpoint::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw CheckpointError("checkpoint has no tensor " + name);
  return it->second.first->bytes(*it->second.second);
}

const std::string& Checkpoint::file_of(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw CheckpointError("checkpoint has no tensor " + name);
  return it->second.first->path();
}

}  // namespace twinstep
