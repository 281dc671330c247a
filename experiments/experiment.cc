// The experiment YAML schema. Every key is listed here and in experiments/examples/
// full_schema.yaml (which loads). Unknown keys are errors at every level; so are duplicate
// keys. Integers are plain YAML integers (no quotes, no fractions, no exponents); numbers accept
// integers; booleans are true or false. Durations are strings with a unit: 120us, 1.5ms, 2s,
// 0ns (units ns, us, ms, s; never negative; at most 3600s; rounded to whole nanoseconds).
//
//   name: quickstart               required; [A-Za-z0-9_.-]+, at most 128 characters
//   description: "..."             optional text
//   seed: 42                       optional, default 0; unsigned 64-bit; Variant::seed
//   backends: [sim, real]          optional, default [sim]; a non-empty list without repeats
//
//   model: llama-3-8b              required; one of three forms:
//     1. a preset name (model_preset_names()).
//     2. {preset: NAME, overrides...}: overrides are name, hidden (1..1048576),
//        vocab (1..16777216), num_layers (1..10000: layer i is the preset's layer
//        i mod its layer count, so the preset's layer pattern repeats or is cut short),
//        tie_embeddings, weight_bytes (1..8), kv_bytes (1..8), rope_theta (> 0).
//        The name stays the preset's unless `name` is given.
//     3. inline: name (required), hidden (required), vocab (required), tie_embeddings
//        (default false), weight_bytes (default 2), kv_bytes (default 2), rope_theta
//        (default 10000), layers (required): a non-empty list of layer groups
//          {count: N (1..10000, default 1), attention: {...}, mlp: {...}}
//        expanded in order; at most 10000 layers in all.
//        attention.kind (default gqa) picks the keys that apply:
//          gqa:    num_q_heads, num_kv_heads, head_dim (all required, > 0);
//                  num_q_heads a multiple of num_kv_heads.
//          mla:    num_q_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
//                  (required, > 0), q_lora_rank (default 0: q from the hidden state).
//                  num_kv_heads is 1 (one shared latent), as in the presets.
//          linear: num_q_heads, head_dim (required, > 0), num_kv_heads (default
//                  num_q_heads; num_q_heads a multiple of it), conv_width (default 0).
//        Head counts are at most 65536, dimensions and ranks at most 1048576.
//        mlp.kind (default dense):
//          dense:  intermediate (required, 1..16777216).
//          moe:    num_experts (1..65536), top_k (1..num_experts), expert_intermediate
//                  (1..16777216) required; num_shared_experts (default 0, 0..65536),
//                  shared_intermediate (required > 0 exactly when num_shared_experts > 0).
//     Every form is bounded by a rough parameter count of 1e15.
//
//   hardware: h200                 required; a preset name (hardware_preset_names()) or a
//     calibrated profile's name (a file NAME.yaml in calibration_profile_dir(): results/profiles
//     or $TWINSTEP_PROFILES; docs/calibration.md), or
//     {preset: NAME, FIELD: value...} overriding HardwareSpec fields by their exact names, or
//     the same mapping without `preset` (inline: name, hbm_bytes, hbm_tbps, stream_read_tbps,
//     bf16_tflops required; the rest default as in HardwareSpec). Fields and ranges:
//       name, source: text
//       hbm_bytes 1..1e15, l2_bytes 0..1e12, sm_count 0..100000 (integers)
//       hbm_tbps, stream_read_tbps (0, 1000]; bf16_tflops (0, 1e6]; interconnect_gbps
//       [0, 1e6]; d2h_gbps (0, 1e6]; mem_efficiency, flop_efficiency (0, 1]
//       kernel_floor_ns, eager_launch_ns, graph_launch_ns, graph_node_gap_ns,
//       pdl_node_gap_ns, d2h_latency_ns, host_wake_ns: a duration, or an integer in ns
//     Overriding a preset appends "; overridden by the experiment: FIELDS" to its source.
//     Overriding interconnect_gbps drops a calibrated profile's measured collective times
//     (HardwareSpec::collective_tables): collectives then use the alpha-beta model.
//
//   workload:                      required
//     input_len: 8192              required; 1..10000000, or {uniform: [lo, hi]}, lo <= hi
//     output_len: 1024             required; the same form
//     requests: 100                1..10000000; or requests_per_client: N (N x concurrency)
//     concurrency: 1               optional, default 1; 1..1000000
//     arrival_rate_per_s: 2.0      optional; (0, 1e9]; absent: closed loop
//     seed: 1                      optional; default splitmix64(seed ^ 0x776f726b6c6f6164)
//
//   policies:                      optional; defaults as in PolicySpec
//     host_schedule: runahead      lockstep | runahead (default runahead)
//     runahead_depth: 1            1..64; only with runahead
//     graph_mode: cuda_graph       eager | cuda_graph | cuda_graph_pdl
//     seq_lens_sync: false
//     output_copy_bytes_per_request: 64   0..1048576
//     fusion: {norms: false, rope: false}   how the runtime fuses small kernels into their
//                                  neighbours (both backends; ModelSpec::fusion, docs/kernels.md
//                                  rounds 19 and 21): norms: each layer's RMSNorms carried by
//                                  the GEMVs around them in decode launches of <= 16 rows and
//                                  verify passes (dense GQA models on one GPU); rope: rope and
//                                  the KV append inside the attention kernel (GQA layers)
//     spec:                        optional speculative decoding (default {method: none})
//       method: none | chain | confidence                 (required)
//       chain:      steps (1..64, default 5), draft_tokens (= steps + 1, default)
//       confidence: threshold (0..1, default 0.5), min_steps (default 1) <= max_steps
//                   (default 8, at most 64), mode: device | host_late | host_blocking
//                   (default device), lag (1..64, only with host_late), early_exit (default
//                   true; device and host_blocking: skip the draft steps once every request
//                   stopped, through conditional graph nodes; false runs all max_steps)
//
//   sweep.cases: [{name: LABEL, dotted.key: value, ...}, ...]   settings varied together, one
//                                  variant per case (times the other axes); label: the name
//
//   layout: PP2-TP8                optional; the seeds' notation (TP8, DP16-EP16, PP2-CP8-TP8),
//                                  or {tp, pp, dp, ep, cp (1..4096), weight_dtype, expert_dtype,
//                                  expert_act_dtype, kv_dtype (bf16 | fp8 | mxfp4),
//                                  kv_compression (>= 1), runtime_buffer_gb, hbm_usable_fraction,
//                                  microbatches (0 = pp, 1..4096), prefill_chunk_tokens (both
//                                  only with pp > 1), expert_load: {kind: uniform | zipf | hot;
//                                  zipf: zipf_s (0..100, default 1); hot: hot_experts
//                                  (1..experts-1) and hot_fraction (0..1), both required;
//                                  routing: expected (default) | sampled (each pass draws every
//                                  token's experts: EP ranks straggle by chance)},
//                                  vocab_parallel (default true: embedding and LM head split by
//                                  vocabulary; false: whole on every rank, as the real runtime)};
//                                  placements drawn per step from the run seed; rules in
//                                  docs/layouts.md
//
//   acceptance:                    optional; draft/target agreement (AcceptanceSpec)
//     draft_fidelity: 0.9          real backend: the synthetic draft's agreement dial, 0..1
//                                  (make-checkpoint --draft-fidelity); default 0.9
//     the simulator's model, parametric (the default):
//     accept_rate: 0.7             per-position acceptance, 0..1; or instead
//     chain_accept_len: 3.25       the mean tokens per verify of a chain of chain_draft tokens
//     chain_draft: 5               (default 5; only with chain_accept_len)
//     decay: 1.0                   position i accepts with accept_rate * decay^(i-1)
//     confidence_signal: 0.4       0 (confidence is noise) .. 1 (a perfect predictor)
//     or calibrated (replaces the parametric keys): the verify rounds of a measured chain run
//     in the results database, replayed (policies/acceptance_spec.h)
//     calibrated: {experiment: NAME, variant: LABEL}   the newest complete real run of that
//                                  experiment (and variant label, optional), or {run: ID};
//                                  db: PATH (optional; default the database being written)
//                                  align: round (default) | position: replay the source round
//                                  covering the same output position of the same request (a
//                                  source that decoded the same texts: same model, draft,
//                                  prompts and output lengths, batch 1, greedy)
//
//   host:                          optional; an absent op costs 0
//     schedule | prepare_prefill | prepare_decode | process_outputs:
//       a duration (fixed), or {dist: KIND, ...} with
//         fixed: mean; normal: mean, std; lognormal: mean (> 0), std; uniform: lo, hi
//         (lo <= hi; mean becomes (lo + hi) / 2). All required, all durations.
//     spikes: a list of {op (required), extra (required duration > 0), and exactly one of
//       every_steps (1..1e9, with optional phase_step 0..1e9) or probability (0, 1]; rank:
//       only that rank's host (default: every rank)}
//
//   trace: {first_step: 100, steps: 8}   optional; first_step 0..1e9 (default 0),
//                                        steps 0..100000 (required; 0: no timeline),
//                                        nodes: bool (default false; real runs time every
//                                        kernel of the traced decode steps)
//
//   sweep:                         optional; a non-empty mapping from a dotted path to a
//                                  non-empty list of values
//     policies.host_schedule: [lockstep, runahead]
//     host.prepare_decode: [100us, 485us]
//   The variants are the cartesian product in key order (the first key varies slowest), at
//   most 1000000. Each is the document with every path set to its value (missing keys and
//   mappings are created), then validated in full; errors in a substituted value point at the
//   value in the sweep list and name the variant. A path descends through mappings; a number
//   component indexes a list (host.spikes.0.extra); a preset name given as `model: NAME` or
//   `hardware: NAME` counts as {preset: NAME}, so model.num_layers and
//   hardware.stream_read_tbps can be swept over a preset. Paths may not start with name,
//   description, backends or sweep, nor overlap (model and model.hidden).
//   Variant::label is "path=value, path=value" with values as written (flow style); "base"
//   without a sweep.
#include "experiments/experiment.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <regex>
#include <sstream>
#include <system_error>

#include "experiments/yaml_fields.h"
#include "experiments/yaml_tree.h"
#include "policies/calibration_profile.h"
#include "policies/error.h"
#include "policies/rng.h"

namespace twinstep {

const char* backend_kind_name(BackendKind b) {
  switch (b) {
    case BackendKind::kSim:
      return "sim";
    case BackendKind::kReal:
      return "real";
  }
  return "?";
}

namespace {

using yaml::Context;
using yaml::Entry;
using yaml::MapReader;
using yaml::Mark;
using yaml::Node;
using yaml::read_bool;
using yaml::read_double;
using yaml::read_duration_ns;
using yaml::read_int;
using yaml::read_string;

constexpr int64_t kMaxLength = 10'000'000;  // tokens, per input or output
constexpr int64_t kMaxRequests = 10'000'000;
constexpr int64_t kMaxConcurrency = 1'000'000;
constexpr int64_t kMaxVariants = 1'000'000;
constexpr int64_t kMaxLayers = 10'000;
constexpr int64_t kMaxHeads = 65'536;
constexpr int64_t kMaxDim = 1'048'576;
constexpr int64_t kMaxWidth = 16'777'216;  // vocab, MLP intermediates
constexpr int64_t kMaxExperts = 65'536;
constexpr double kMaxParams = 1e15;
constexpr int64_t kMaxSteps = 1'000'000'000;
constexpr uint64_t kWorkloadSeedSalt = 0x776f726b6c6f6164ULL;  // "workload"
constexpr uint64_t kRoutingSeedSalt = 0x726f7574696e67ULL;     // "routing"
// Run size limits (check_run_size). The simulator counts time in int64 ns, bytes and FLOPs in
// int64, and indexes samples with int32; these keep every value a variant can produce in range.
constexpr int64_t kMaxOutputTokensPerRun = std::numeric_limits<int32_t>::max();
constexpr double kMaxArrivalSpanS = 1e7;    // ~116 days: arrival times stay far below 2^63 ns
constexpr double kMaxStepCount = 0x1p62;    // bytes of one step, FLOPs of one kernel
constexpr double kMaxSimulatedNs = 0x1p62;  // ~146 years of simulated time
// Model layers held by all the variants of a sweep together (~90 bytes each: ~9 GB).
constexpr int64_t kMaxSweepLayers = 100'000'000;

std::vector<std::string> top_level_keys() {
  return {"name",     "description", "seed",       "backends", "model", "hardware", "workload",
          "policies", "host",        "acceptance", "layout",   "trace", "sweep"};
}

// ---- model ------------------------------------------------------------------------------------

std::string known_model_presets() { return yaml::join_list(model_preset_names()); }

const ModelSpec& preset_model(const Context& ctx, const Node& node, const std::string& field) {
  const std::string name = read_string(ctx, node, field);
  for (const std::string& known : model_preset_names()) {
    if (known == name) return model_preset(name);
  }
  ctx.fail(node.mark, "unknown model preset '" + name + "'; known: " + known_model_presets() +
                          yaml::did_you_mean(name, model_preset_names()));
}

int32_t read_i32(const Context& ctx, const MapReader& m, std::string_view key, int64_t lo,
                 int64_t hi) {
  return static_cast<int32_t>(read_int(ctx, m.require(key), m.field(key), lo, hi));
}

int32_t read_i32_or(const Context& ctx, const MapReader& m, std::string_view key, int64_t lo,
                    int64_t hi, int32_t fallback) {
  const Node* n = m.get(key);
  return n == nullptr ? fallback : static_cast<int32_t>(read_int(ctx, *n, m.field(key), lo, hi));
}

AttentionSpec parse_attention(const Context& ctx, const Node& node, const std::string& field) {
  AttentionSpec a;
  if (!node.is_mapping()) ctx.fail(node.mark, field + " must be a mapping, got " + describe(node));
  if (const Entry* kind = node.find("kind")) {
    a.kind = yaml::read_enum<AttentionKind>(ctx, kind->value, field + ".kind",
                                            {{"gqa", AttentionKind::kGqa},
                                             {"mla", AttentionKind::kMla},
                                             {"linear", AttentionKind::kLinear}});
  }
  switch (a.kind) {
    case AttentionKind::kGqa: {
      MapReader m(ctx, node, field, {"kind", "num_q_heads", "num_kv_heads", "head_dim"});
      a.num_q_heads = read_i32(ctx, m, "num_q_heads", 1, kMaxHeads);
      a.num_kv_heads = read_i32(ctx, m, "num_kv_heads", 1, kMaxHeads);
      a.head_dim = read_i32(ctx, m, "head_dim", 1, kMaxDim);
      break;
    }
    case AttentionKind::kMla: {
      MapReader m(ctx, node, field,
                  {"kind", "num_q_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                   "qk_rope_head_dim", "v_head_dim"});
      a.num_q_heads = read_i32(ctx, m, "num_q_heads", 1, kMaxHeads);
      a.num_kv_heads = 1;
      a.q_lora_rank = read_i32_or(ctx, m, "q_lora_rank", 0, kMaxDim, 0);
      a.kv_lora_rank = read_i32(ctx, m, "kv_lora_rank", 1, kMaxDim);
      a.qk_nope_head_dim = read_i32(ctx, m, "qk_nope_head_dim", 1, kMaxDim);
      a.qk_rope_head_dim = read_i32(ctx, m, "qk_rope_head_dim", 1, kMaxDim);
      a.v_head_dim = read_i32(ctx, m, "v_head_dim", 1, kMaxDim);
      break;
    }
    case AttentionKind::kLinear: {
      MapReader m(ctx, node, field,
                  {"kind", "num_q_heads", "num_kv_heads", "head_dim", "conv_width"});
      a.num_q_heads = read_i32(ctx, m, "num_q_heads", 1, kMaxHeads);
      a.num_kv_heads = read_i32_or(ctx, m, "num_kv_heads", 1, kMaxHeads, a.num_q_heads);
      a.head_dim = read_i32(ctx, m, "head_dim", 1, kMaxDim);
      a.conv_width = read_i32_or(ctx, m, "conv_width", 0, 1024, 0);
      break;
    }
  }
  if (a.kind != AttentionKind::kMla && a.num_q_heads % a.num_kv_heads != 0) {
    ctx.fail(node.find("num_kv_heads") ? node.find("num_kv_heads")->value.mark : node.mark,
             field + ": num_q_heads (" + std::to_string(a.num_q_heads) +
                 ") must be a multiple of num_kv_heads (" + std::to_string(a.num_kv_heads) + ")");
  }
  return a;
}

MlpSpec parse_mlp(const Context& ctx, const Node& node, const std::string& field) {
  MlpSpec mlp;
  if (!node.is_mapping()) ctx.fail(node.mark, field + " must be a mapping, got " + describe(node));
  if (const Entry* kind = node.find("kind")) {
    mlp.kind = yaml::read_enum<MlpKind>(ctx, kind->value, field + ".kind",
                                        {{"dense", MlpKind::kDense}, {"moe", MlpKind::kMoe}});
  }
  if (mlp.kind == MlpKind::kDense) {
    MapReader m(ctx, node, field, {"kind", "intermediate"});
    mlp.intermediate =
        read_int(ctx, m.require("intermediate"), m.field("intermediate"), 1, kMaxWidth);
    return mlp;
  }
  MapReader m(ctx, node, field,
              {"kind", "num_experts", "top_k", "expert_intermediate", "num_shared_experts",
               "shared_intermediate"});
  mlp.num_experts = read_i32(ctx, m, "num_experts", 1, kMaxExperts);
  mlp.top_k = read_i32(ctx, m, "top_k", 1, mlp.num_experts);
  mlp.expert_intermediate =
      read_int(ctx, m.require("expert_intermediate"), m.field("expert_intermediate"), 1, kMaxWidth);
  mlp.num_shared_experts = read_i32_or(ctx, m, "num_shared_experts", 0, kMaxExperts, 0);
  if (mlp.num_shared_experts > 0) {
    mlp.shared_intermediate =
        read_int(ctx, m.require("shared_intermediate", "needed when num_shared_experts > 0"),
                 m.field("shared_intermediate"), 1, kMaxWidth);
  } else if (m.has("shared_intermediate")) {
    ctx.fail(m.key_mark("shared_intermediate"),
             m.field("shared_intermediate") + " applies only when num_shared_experts > 0");
  }
  return mlp;
}

// A generous over-estimate of the parameter count in floating point, so absurd dimensions are
// rejected before int64 arithmetic elsewhere can overflow.
double rough_param_count(const ModelSpec& m) {
  double total = 2.0 * double(m.vocab) * double(m.hidden);
  for (const LayerSpec& l : m.layers) {
    const AttentionSpec& a = l.attn;
    double head_width =
        std::max({a.head_dim, a.qk_nope_head_dim + a.qk_rope_head_dim, a.v_head_dim});
    double attn = double(m.hidden) * (4.0 * std::max(a.num_q_heads, a.num_kv_heads) * head_width +
                                      a.q_lora_rank + a.kv_lora_rank) +
                  double(std::max(a.q_lora_rank, a.kv_lora_rank)) * a.num_q_heads * head_width * 2;
    const MlpSpec& p = l.mlp;
    double mlp = 3.0 * double(m.hidden) *
                 (double(p.intermediate) + double(p.num_experts) * double(p.expert_intermediate) +
                  double(p.num_shared_experts) * double(p.shared_intermediate) + p.num_experts);
    total += attn + mlp;
  }
  return total;
}

void read_model_scalars(const Context& ctx, const MapReader& m, ModelSpec* model) {
  if (const Node* n = m.get("name")) model->name = read_string(ctx, *n, m.field("name"));
  if (const Node* n = m.get("hidden"))
    model->hidden = read_int(ctx, *n, m.field("hidden"), 1, kMaxDim);
  if (const Node* n = m.get("vocab"))
    model->vocab = read_int(ctx, *n, m.field("vocab"), 1, kMaxWidth);
  if (const Node* n = m.get("tie_embeddings")) {
    model->tie_embeddings = read_bool(ctx, *n, m.field("tie_embeddings"));
  }
  model->weight_bytes = read_i32_or(ctx, m, "weight_bytes", 1, 8, model->weight_bytes);
  model->kv_bytes = read_i32_or(ctx, m, "kv_bytes", 1, 8, model->kv_bytes);
  if (const Node* n = m.get("rope_theta")) {
    model->rope_theta = read_double(ctx, *n, m.field("rope_theta"), 0, 1e12, true);
  }
}

ModelSpec parse_model(const Context& ctx, const Node& node) {
  const std::string field = "model";
  ModelSpec model;
  if (node.is_scalar()) {
    model = preset_model(ctx, node, field);
  } else if (!node.is_mapping()) {
    ctx.fail(node.mark, "model must be a preset name (" + known_model_presets() +
                            ") or a mapping, got " + describe(node));
  } else if (node.find("preset") != nullptr) {
    MapReader m(ctx, node, field,
                {"preset", "name", "hidden", "vocab", "num_layers", "tie_embeddings",
                 "weight_bytes", "kv_bytes", "rope_theta"});
    model = preset_model(ctx, *m.get("preset"), m.field("preset"));
    read_model_scalars(ctx, m, &model);
    if (const Node* n = m.get("num_layers")) {
      const int64_t count = read_int(ctx, *n, m.field("num_layers"), 1, kMaxLayers);
      const std::vector<LayerSpec> pattern = model.layers;
      model.layers.clear();
      for (int64_t i = 0; i < count; ++i) model.layers.push_back(pattern[i % pattern.size()]);
    }
  } else {
    MapReader m(ctx, node, field,
                {"name", "hidden", "vocab", "tie_embeddings", "weight_bytes", "kv_bytes",
                 "rope_theta", "layers"});
    m.require("name", "or give a preset: {preset: NAME}");
    m.require("hidden");
    m.require("vocab");
    read_model_scalars(ctx, m, &model);
    const Node& layers = m.require("layers", "a list of {count, attention, mlp} groups");
    if (!layers.is_sequence() || layers.items.empty()) {
      ctx.fail(layers.mark,
               "model.layers must be a non-empty list of {count, attention, mlp} "
               "groups, got " +
                   describe(layers));
    }
    for (size_t i = 0; i < layers.items.size(); ++i) {
      const std::string group_field = "model.layers[" + std::to_string(i) + "]";
      MapReader g(ctx, layers.items[i], group_field, {"count", "attention", "mlp"});
      const int64_t count =
          g.has("count") ? read_int(ctx, *g.get("count"), g.field("count"), 1, kMaxLayers) : 1;
      LayerSpec layer;
      layer.attn = parse_attention(ctx, g.require("attention"), g.field("attention"));
      layer.mlp = parse_mlp(ctx, g.require("mlp"), g.field("mlp"));
      if (int64_t(model.layers.size()) + count > kMaxLayers) {
        ctx.fail(layers.items[i].mark,
                 "model has more than " + std::to_string(kMaxLayers) + " layers");
      }
      model.layers.insert(model.layers.end(), count, layer);
    }
  }
  const double params = rough_param_count(model);
  if (params > kMaxParams) {
    std::ostringstream s;
    s << "model has about " << params << " parameters, over the limit of " << kMaxParams;
    ctx.fail(node.mark, s.str());
  }
  return model;
}

// ---- hardware ---------------------------------------------------------------------------------

struct HardwareField {
  const char* name;
  enum class Type { kText, kInt, kNumber, kDuration } type;
  double lo;
  double hi;
  bool lo_exclusive;
  std::string HardwareSpec::*text;
  int64_t HardwareSpec::*i64;
  int32_t HardwareSpec::*i32;
  double HardwareSpec::*number;
};

const std::vector<HardwareField>& hardware_fields() {
  using T = HardwareField::Type;
  using H = HardwareSpec;
  static const std::vector<HardwareField> kFields = {
      {"name", T::kText, 0, 0, false, &H::name, nullptr, nullptr, nullptr},
      {"source", T::kText, 0, 0, false, &H::source, nullptr, nullptr, nullptr},
      {"hbm_bytes", T::kInt, 1, 1e15, false, nullptr, &H::hbm_bytes, nullptr, nullptr},
      {"hbm_tbps", T::kNumber, 0, 1000, true, nullptr, nullptr, nullptr, &H::hbm_tbps},
      {"stream_read_tbps", T::kNumber, 0, 1000, true, nullptr, nullptr, nullptr,
       &H::stream_read_tbps},
      {"bf16_tflops", T::kNumber, 0, 1e6, true, nullptr, nullptr, nullptr, &H::bf16_tflops},
      {"sm_count", T::kInt, 0, 100000, false, nullptr, nullptr, &H::sm_count, nullptr},
      {"l2_bytes", T::kInt, 0, 1e12, false, nullptr, &H::l2_bytes, nullptr, nullptr},
      {"interconnect_gbps", T::kNumber, 0, 1e6, false, nullptr, nullptr, nullptr,
       &H::interconnect_gbps},
      {"mem_efficiency", T::kNumber, 0, 1, true, nullptr, nullptr, nullptr, &H::mem_efficiency},
      {"flop_efficiency", T::kNumber, 0, 1, true, nullptr, nullptr, nullptr, &H::flop_efficiency},
      {"kernel_floor_ns", T::kDuration, 0, 0, false, nullptr, &H::kernel_floor_ns, nullptr,
       nullptr},
      {"eager_launch_ns", T::kDuration, 0, 0, false, nullptr, &H::eager_launch_ns, nullptr,
       nullptr},
      {"graph_launch_ns", T::kDuration, 0, 0, false, nullptr, &H::graph_launch_ns, nullptr,
       nullptr},
      {"graph_node_gap_ns", T::kDuration, 0, 0, false, nullptr, &H::graph_node_gap_ns, nullptr,
       nullptr},
      {"pdl_node_gap_ns", T::kDuration, 0, 0, false, nullptr, &H::pdl_node_gap_ns, nullptr,
       nullptr},
      {"d2h_latency_ns", T::kDuration, 0, 0, false, nullptr, &H::d2h_latency_ns, nullptr, nullptr},
      {"d2h_gbps", T::kNumber, 0, 1e6, true, nullptr, nullptr, nullptr, &H::d2h_gbps},
      {"host_wake_ns", T::kDuration, 0, 0, false, nullptr, &H::host_wake_ns, nullptr, nullptr},
  };
  return kFields;
}

void read_hardware_field(const Context& ctx, const HardwareField& f, const Node& node,
                         const std::string& field, HardwareSpec* hw) {
  switch (f.type) {
    case HardwareField::Type::kText:
      hw->*f.text = read_string(ctx, node, field);
      break;
    case HardwareField::Type::kInt: {
      const int64_t v = read_int(ctx, node, field, int64_t(f.lo), int64_t(f.hi));
      if (f.i64 != nullptr) hw->*f.i64 = v;
      if (f.i32 != nullptr) hw->*f.i32 = static_cast<int32_t>(v);
      break;
    }
    case HardwareField::Type::kNumber:
      hw->*f.number = read_double(ctx, node, field, f.lo, f.hi, f.lo_exclusive);
      break;
    case HardwareField::Type::kDuration:
      hw->*f.i64 = read_duration_ns(ctx, node, field, /*bare_is_ns=*/true);
      break;
  }
}

HardwareSpec parse_hardware(const Context& ctx, const Node& node) {
  // Datasheet presets and the calibrated profiles of calibration_profile_dir().
  const std::vector<std::string> presets = hardware_names();
  auto preset = [&](const Node& n, const std::string& field) -> HardwareSpec {
    const std::string name = read_string(ctx, n, field);
    if (std::find(presets.begin(), presets.end(), name) == presets.end()) {
      ctx.fail(n.mark, "unknown hardware preset '" + name + "'; known: " +
                           yaml::join_list(presets) + " (calibrated profiles are read from " +
                           calibration_profile_dir() + ")" + yaml::did_you_mean(name, presets));
    }
    try {
      return hardware_by_name(name);
    } catch (const ConfigError& e) {
      ctx.fail(n.mark, "hardware '" + name + "': " + e.what());
    }
  };
  if (node.is_scalar()) return preset(node, "hardware");
  if (!node.is_mapping()) {
    ctx.fail(node.mark, "hardware must be a preset name (" + yaml::join_list(presets) +
                            ") or a mapping, got " + describe(node));
  }
  std::vector<std::string> allowed = {"preset"};
  for (const HardwareField& f : hardware_fields()) allowed.push_back(f.name);
  MapReader m(ctx, node, "hardware", allowed);
  HardwareSpec hw;
  const bool from_preset = m.has("preset");
  if (from_preset) {
    hw = preset(*m.get("preset"), m.field("preset"));
  } else {
    for (const char* key : {"name", "hbm_bytes", "hbm_tbps", "stream_read_tbps", "bf16_tflops"}) {
      m.require(key, "or give a preset: {preset: NAME}");
    }
    hw.source = "inline in " + ctx.source;
  }
  std::vector<std::string> overridden;
  for (const HardwareField& f : hardware_fields()) {
    if (const Node* n = m.get(f.name)) {
      read_hardware_field(ctx, f, *n, m.field(f.name), &hw);
      if (std::string_view(f.name) != "source") overridden.push_back(f.name);
    }
  }
  // Measured collective tables price collectives before interconnect_gbps does: overriding the
  // link asks for another link, so its alpha-beta model applies.
  if (m.has("interconnect_gbps")) {
    hw.collective_tables.clear();
  }
  if (from_preset && !overridden.empty() && !m.has("source")) {
    hw.source += "; overridden by the experiment: " + yaml::join_list(overridden);
  }
  return hw;
}

// ---- workload ---------------------------------------------------------------------------------

LengthDist parse_length(const Context& ctx, const Node& node, const std::string& field) {
  if (node.is_mapping()) {
    MapReader m(ctx, node, field, {"uniform"});
    const Node& range = m.require("uniform");
    if (!range.is_sequence() || range.items.size() != 2) {
      ctx.fail(range.mark, field + ".uniform must be a list [lo, hi], got " + describe(range));
    }
    const std::string uniform = field + ".uniform";
    LengthDist d;
    d.lo = static_cast<int32_t>(read_int(ctx, range.items[0], uniform + "[0]", 1, kMaxLength));
    d.hi = static_cast<int32_t>(read_int(ctx, range.items[1], uniform + "[1]", 1, kMaxLength));
    if (d.lo > d.hi) {
      ctx.fail(range.mark, uniform + ": lo (" + std::to_string(d.lo) + ") is greater than hi (" +
                               std::to_string(d.hi) + ")");
    }
    return d;
  }
  if (!node.is_scalar()) {
    ctx.fail(node.mark, field + " must be an integer (1 to " + std::to_string(kMaxLength) +
                            ") or {uniform: [lo, hi]}, got " + describe(node));
  }
  const auto len = static_cast<int32_t>(read_int(ctx, node, field, 1, kMaxLength));
  return LengthDist{len, len};
}

WorkloadSpec parse_workload(const Context& ctx, const Node& node, uint64_t seed) {
  MapReader m(ctx, node, "workload",
              {"input_len", "output_len", "requests", "requests_per_client", "concurrency",
               "arrival_rate_per_s", "seed"});
  WorkloadSpec w;
  w.input_len = parse_length(ctx, m.require("input_len"), "workload.input_len");
  w.output_len = parse_length(ctx, m.require("output_len"), "workload.output_len");
  w.max_concurrency = read_i32_or(ctx, m, "concurrency", 1, kMaxConcurrency, 1);
  if (m.has("requests") == m.has("requests_per_client")) {
    ctx.fail(node.mark,
             "workload needs exactly one of requests or requests_per_client (requests "
             "= requests_per_client x concurrency)");
  }
  if (const Node* n = m.get("requests_per_client")) {
    const int64_t per = read_int(ctx, *n, "workload.requests_per_client", 1, kMaxRequests);
    const int64_t total = per * w.max_concurrency;
    if (total > kMaxRequests) {
      ctx.fail(n->mark, "workload.requests_per_client x concurrency = " + std::to_string(total) +
                            " requests, over the limit of " + std::to_string(kMaxRequests));
    }
    w.num_requests = static_cast<int32_t>(total);
  } else {
    w.num_requests = static_cast<int32_t>(
        read_int(ctx, *m.get("requests"), "workload.requests", 1, kMaxRequests));
  }
  if (const Node* n = m.get("arrival_rate_per_s")) {
    w.arrival_rate_per_s = read_double(ctx, *n, "workload.arrival_rate_per_s", 0, 1e9, true);
  }
  w.seed = m.has("seed") ? yaml::read_uint64(ctx, *m.get("seed"), "workload.seed")
                         : splitmix64(seed ^ kWorkloadSeedSalt);
  return w;
}

// ---- policies, host, trace --------------------------------------------------------------------

// policies.spec: {method: none} | {method: chain, steps, draft_tokens} |
// {method: confidence, threshold, min_steps, max_steps, mode, lag}.
SpecSpec parse_spec(const Context& ctx, const Node& node) {
  MapReader m(ctx, node, "policies.spec",
              {"method", "steps", "draft_tokens", "threshold", "min_steps", "max_steps", "mode",
               "lag", "early_exit"});
  SpecSpec s;
  std::vector<std::pair<std::string, SpecMethod>> methods;
  for (SpecMethod x : {SpecMethod::kNone, SpecMethod::kChain, SpecMethod::kConfidence}) {
    methods.emplace_back(spec_method_name(x), x);
  }
  s.method = yaml::read_enum(ctx, m.require("method"), "policies.spec.method", methods);
  const auto only_for = [&](std::initializer_list<const char*> keys, SpecMethod method) {
    for (const char* k : keys) {
      if (m.has(k) && s.method != method) {
        ctx.fail(m.key_mark(k), std::string("policies.spec.") + k + " applies only to method " +
                                    spec_method_name(method) + " (method is " +
                                    spec_method_name(s.method) + ")");
      }
    }
  };
  only_for({"steps", "draft_tokens"}, SpecMethod::kChain);
  only_for({"threshold", "min_steps", "max_steps", "mode", "lag", "early_exit"},
           SpecMethod::kConfidence);
  constexpr int64_t kMaxDraftTokens = 64;
  if (s.method == SpecMethod::kChain) {
    s.steps = read_i32_or(ctx, m, "steps", 1, kMaxDraftTokens, s.steps);
    s.draft_tokens = read_i32_or(ctx, m, "draft_tokens", 2, kMaxDraftTokens + 1, s.steps + 1);
    if (s.draft_tokens != s.steps + 1) {
      ctx.fail(m.key_mark(m.has("draft_tokens") ? "draft_tokens" : "steps"),
               "policies.spec.draft_tokens must be steps + 1 with topk 1 (steps " +
                   std::to_string(s.steps) + ", draft_tokens " + std::to_string(s.draft_tokens) +
                   ")");
    }
  } else if (s.method == SpecMethod::kConfidence) {
    if (const Node* n = m.get("threshold")) {
      s.threshold = read_double(ctx, *n, "policies.spec.threshold", 0, 1, false);
    }
    s.min_steps = read_i32_or(ctx, m, "min_steps", 1, kMaxDraftTokens, s.min_steps);
    s.max_steps = read_i32_or(ctx, m, "max_steps", 1, kMaxDraftTokens, s.max_steps);
    if (s.min_steps > s.max_steps) {
      ctx.fail(m.key_mark("min_steps"), "policies.spec.min_steps (" + std::to_string(s.min_steps) +
                                            ") exceeds max_steps (" + std::to_string(s.max_steps) +
                                            ")");
    }
    if (const Node* n = m.get("mode")) {
      std::vector<std::pair<std::string, DraftMode>> modes;
      for (DraftMode x : {DraftMode::kDevice, DraftMode::kHostLate, DraftMode::kHostBlocking}) {
        modes.emplace_back(draft_mode_name(x), x);
      }
      s.mode = yaml::read_enum(ctx, *n, "policies.spec.mode", modes);
    }
    if (m.has("lag") && s.mode != DraftMode::kHostLate) {
      ctx.fail(m.key_mark("lag"), "policies.spec.lag applies only to mode host_late");
    }
    s.lag = read_i32_or(ctx, m, "lag", 1, 64, s.lag);
    if (const Node* n = m.get("early_exit")) {
      if (s.mode == DraftMode::kHostLate) {
        ctx.fail(m.key_mark("early_exit"),
                 "policies.spec.early_exit applies only to modes device and host_blocking (the "
                 "host sets host_late's draft length)");
      }
      s.early_exit = read_bool(ctx, *n, "policies.spec.early_exit");
    }
  }
  return s;
}

// layout.expert_load: each kind's parameters, and only those, checked where they are written.
ExpertLoad parse_expert_load(const Context& ctx, const Node& node, const ModelSpec& model) {
  MapReader e(ctx, node, "layout.expert_load",
              {"kind", "zipf_s", "hot_experts", "hot_fraction", "routing"});
  const std::vector<std::pair<std::string, ExpertLoad::Kind>> kinds = {
      {"uniform", ExpertLoad::Kind::kUniform},
      {"zipf", ExpertLoad::Kind::kZipf},
      {"hot", ExpertLoad::Kind::kHot}};
  ExpertLoad load;
  const Node& kind = e.require("kind");
  load.kind = yaml::read_enum(ctx, kind, "layout.expert_load.kind", kinds);
  const bool zipf = load.kind == ExpertLoad::Kind::kZipf;
  const bool hot = load.kind == ExpertLoad::Kind::kHot;
  for (const char* key : {"zipf_s", "hot_experts", "hot_fraction"}) {
    const bool applies = std::string_view(key) == "zipf_s" ? zipf : hot;
    if (e.has(key) && !applies) {
      ctx.fail(e.key_mark(key),
               "layout.expert_load." + std::string(key) + " does not apply to kind " + kind.scalar);
    }
  }
  if (const Node* x = e.get("zipf_s")) {
    load.zipf_s = read_double(ctx, *x, "layout.expert_load.zipf_s", 0, 100, false);
  }
  if (const Node* x = e.get("routing")) {
    load.sampled = yaml::read_enum(
        ctx, *x, "layout.expert_load.routing",
        std::vector<std::pair<std::string, bool>>{{"expected", false}, {"sampled", true}});
  }
  if (hot) {
    int32_t experts = 0;  // the fewest experts of any MoE layer
    for (const LayerSpec& layer : model.layers) {
      if (layer.mlp.kind == MlpKind::kMoe && (experts == 0 || layer.mlp.num_experts < experts)) {
        experts = layer.mlp.num_experts;
      }
    }
    if (experts < 2) {
      ctx.fail(e.key_mark("kind"), "layout.expert_load kind hot needs a model with MoE layers");
    }
    load.hot_experts = static_cast<int32_t>(
        yaml::read_int(ctx, e.require("hot_experts", "the number of hot experts"),
                       "layout.expert_load.hot_experts", 1, experts - 1));
    load.hot_fraction = read_double(ctx, e.require("hot_fraction", "their share of routed tokens"),
                                    "layout.expert_load.hot_fraction", 0, 1, false);
  }
  return load;
}

// layout: "PP2-TP8" (the seeds' notation), or a mapping of degrees, dtypes and memory terms.
LayoutSpec parse_layout_node(const Context& ctx, const Node& node, const ModelSpec& model) {
  LayoutSpec l;
  try {
    if (node.is_scalar()) {
      l = parse_layout(read_string(ctx, node, "layout"));
    } else {
      MapReader m(ctx, node, "layout",
                  {"tp", "pp", "dp", "ep", "cp", "weight_dtype", "expert_dtype", "expert_act_dtype",
                   "kv_dtype", "kv_compression", "runtime_buffer_gb", "hbm_usable_fraction",
                   "microbatches", "prefill_chunk_tokens", "expert_load", "vocab_parallel"});
      l.tp = read_i32_or(ctx, m, "tp", 1, 4096, 1);
      l.pp = read_i32_or(ctx, m, "pp", 1, 4096, 1);
      l.dp = read_i32_or(ctx, m, "dp", 1, 4096, 1);
      l.ep = read_i32_or(ctx, m, "ep", 1, 4096, 1);
      l.cp = read_i32_or(ctx, m, "cp", 1, 4096, 1);
      const auto dtype = [&](const char* key, std::optional<Dtype>& out) {
        if (const Node* n = m.get(key)) out = parse_dtype(read_string(ctx, *n, m.field(key)));
      };
      dtype("weight_dtype", l.weight_dtype);
      dtype("expert_dtype", l.expert_dtype);
      dtype("expert_act_dtype", l.expert_act_dtype);
      dtype("kv_dtype", l.kv_dtype);
      if (const Node* n = m.get("kv_compression")) {
        l.kv_compression = read_double(ctx, *n, "layout.kv_compression", 1, 1000, false);
      }
      if (const Node* n = m.get("runtime_buffer_gb")) {
        l.runtime_buffer_bytes =
            int64_t(read_double(ctx, *n, "layout.runtime_buffer_gb", 0, 1e6, false) * 1e9);
      }
      if (const Node* n = m.get("hbm_usable_fraction")) {
        l.hbm_usable_fraction = read_double(ctx, *n, "layout.hbm_usable_fraction", 0, 1, true);
      }
      for (const char* key : {"microbatches", "prefill_chunk_tokens"}) {
        if (m.has(key) && l.pp == 1) {
          ctx.fail(m.key_mark(key), std::string("layout.") + key +
                                        " applies to pipeline stages only; give layout.pp > 1");
        }
      }
      l.microbatches = read_i32_or(ctx, m, "microbatches", 0, 4096, 0);
      if (const Node* n = m.get("prefill_chunk_tokens")) {
        l.prefill_chunk_tokens =
            yaml::read_int(ctx, *n, m.field("prefill_chunk_tokens"), 1, 1'000'000'000);
      }
      if (const Node* n = m.get("expert_load")) l.expert_load = parse_expert_load(ctx, *n, model);
      if (const Node* n = m.get("vocab_parallel"))
        l.vocab_parallel = read_bool(ctx, *n, "layout.vocab_parallel");
    }
    validate_layout(model, l);
  } catch (const ConfigError& e) {
    if (!e.where().empty()) throw;
    ctx.fail(node.mark, e.what());
  }
  return l;
}

// acceptance.calibrated: {experiment, variant} or {run}, optional db, align and (with align:
// position) bonus_from: {experiment, variant}.
std::shared_ptr<const AcceptanceSource> parse_calibrated(const Context& ctx, const Node& node) {
  MapReader m(ctx, node, "acceptance.calibrated",
              {"experiment", "variant", "run", "db", "align", "bonus_from"});
  auto s = std::make_shared<AcceptanceSource>();
  s->where = yaml::where(ctx.source, node.mark);
  if (m.has("run") == m.has("experiment")) {
    ctx.fail(node.mark,
             "acceptance.calibrated needs exactly one of experiment (with an optional variant) "
             "or run (a run id)");
  }
  if (const Node* n = m.get("run")) {
    s->run_id = read_int(ctx, *n, "acceptance.calibrated.run", 1, int64_t{1} << 62);
    if (m.has("variant")) {
      ctx.fail(m.key_mark("variant"), "acceptance.calibrated.variant goes with experiment");
    }
  }
  if (const Node* n = m.get("experiment")) {
    s->experiment = read_string(ctx, *n, "acceptance.calibrated.experiment");
    if (s->experiment.empty()) ctx.fail(n->mark, "acceptance.calibrated.experiment is empty");
  }
  if (const Node* n = m.get("variant")) {
    s->variant = read_string(ctx, *n, "acceptance.calibrated.variant");
  }
  if (const Node* n = m.get("db")) s->db = read_string(ctx, *n, "acceptance.calibrated.db");
  if (const Node* n = m.get("align")) {
    const std::string align = read_string(ctx, *n, "acceptance.calibrated.align");
    if (align != "round" && align != "position")
      ctx.fail(n->mark, "acceptance.calibrated.align is \"" + align +
                            "\"; expected round (replay the source's rounds in order) or position "
                            "(the round covering the same output position of the same request)");
    s->align_position = align == "position";
  }
  if (const Node* n = m.get("bonus_from")) {
    if (!s->align_position) {
      ctx.fail(m.key_mark("bonus_from"),
               "acceptance.calibrated.bonus_from needs align: position (its tokens stand in by "
               "output position)");
    }
    MapReader b(ctx, *n, "acceptance.calibrated.bonus_from", {"experiment", "variant"});
    const Node* e = b.get("experiment");
    if (e == nullptr) ctx.fail(n->mark, "acceptance.calibrated.bonus_from needs experiment");
    s->bonus_experiment = read_string(ctx, *e, "acceptance.calibrated.bonus_from.experiment");
    if (s->bonus_experiment.empty())
      ctx.fail(e->mark, "acceptance.calibrated.bonus_from.experiment is empty");
    if (const Node* v = b.get("variant"))
      s->bonus_variant = read_string(ctx, *v, "acceptance.calibrated.bonus_from.variant");
  }
  return s;
}

// acceptance: {accept_rate | chain_accept_len + chain_draft, decay, confidence_signal} or
// {calibrated}, and draft_fidelity.
AcceptanceSpec parse_acceptance(const Context& ctx, const Node& node) {
  MapReader m(ctx, node, "acceptance",
              {"accept_rate", "chain_accept_len", "chain_draft", "decay", "confidence_signal",
               "calibrated", "draft_fidelity"});
  AcceptanceSpec a;
  if (const Node* n = m.get("draft_fidelity")) {
    a.draft_fidelity = read_double(ctx, *n, "acceptance.draft_fidelity", 0, 1, false);
  }
  if (const Node* n = m.get("calibrated")) {
    for (const char* k :
         {"accept_rate", "chain_accept_len", "chain_draft", "decay", "confidence_signal"}) {
      if (m.has(k)) {
        ctx.fail(m.key_mark(k), std::string("acceptance.") + k +
                                    " is a parametric setting; acceptance.calibrated replaces "
                                    "the parametric model");
      }
    }
    a.calibrated_from = parse_calibrated(ctx, *n);
    return a;
  }
  if (m.has("accept_rate") && m.has("chain_accept_len")) {
    ctx.fail(m.key_mark("chain_accept_len"),
             "give acceptance.accept_rate or acceptance.chain_accept_len, not both");
  }
  if (const Node* n = m.get("accept_rate")) {
    a.accept_rate = read_double(ctx, *n, "acceptance.accept_rate", 0, 1, false);
  }
  if (const Node* n = m.get("chain_accept_len")) {
    const auto draft = read_i32_or(ctx, m, "chain_draft", 1, 64, 5);
    const double len = read_double(ctx, *n, "acceptance.chain_accept_len", 1, draft + 1, false);
    a.accept_rate = rate_for_chain_accept_len(len, draft);
  } else if (m.has("chain_draft")) {
    ctx.fail(m.key_mark("chain_draft"), "acceptance.chain_draft goes with chain_accept_len");
  }
  if (const Node* n = m.get("decay"))
    a.decay = read_double(ctx, *n, "acceptance.decay", 0, 1, false);
  if (const Node* n = m.get("confidence_signal")) {
    a.confidence_signal = read_double(ctx, *n, "acceptance.confidence_signal", 0, 1, false);
  }
  return a;
}

PolicySpec parse_policies(const Context& ctx, const Node& node) {
  // fusion is read by parse_fusion, which needs the model and layout.
  MapReader m(ctx, node, "policies",
              {"host_schedule", "runahead_depth", "graph_mode", "seq_lens_sync", "spec",
               "output_copy_bytes_per_request", "fusion"});
  PolicySpec p;
  if (const Node* n = m.get("host_schedule")) {
    std::vector<std::pair<std::string, HostSchedule>> choices;
    for (HostSchedule s : {HostSchedule::kLockstep, HostSchedule::kRunahead}) {
      choices.emplace_back(host_schedule_name(s), s);
    }
    p.host_schedule = yaml::read_enum(ctx, *n, "policies.host_schedule", choices);
  }
  if (const Node* n = m.get("runahead_depth")) {
    if (p.host_schedule != HostSchedule::kRunahead) {
      ctx.fail(m.key_mark("runahead_depth"),
               "policies.runahead_depth applies only to host_schedule runahead (host_schedule "
               "is " +
                   std::string(host_schedule_name(p.host_schedule)) + ")");
    }
    p.runahead_depth = static_cast<int32_t>(read_int(ctx, *n, "policies.runahead_depth", 1, 64));
  }
  if (const Node* n = m.get("graph_mode")) {
    std::vector<std::pair<std::string, GraphMode>> choices;
    for (GraphMode g : {GraphMode::kEager, GraphMode::kCudaGraph, GraphMode::kCudaGraphPdl}) {
      choices.emplace_back(graph_mode_name(g), g);
    }
    p.graph_mode = yaml::read_enum(ctx, *n, "policies.graph_mode", choices);
  }
  if (const Node* n = m.get("seq_lens_sync")) {
    p.seq_lens_sync = read_bool(ctx, *n, "policies.seq_lens_sync");
  }
  p.output_copy_bytes_per_request = read_i32_or(ctx, m, "output_copy_bytes_per_request", 0, 1 << 20,
                                                p.output_copy_bytes_per_request);
  if (const Node* n = m.get("spec")) p.spec = parse_spec(ctx, *n);
  return p;
}

// policies.fusion: {norms: bool, rope: bool} (KernelFusion), checked against the model and
// layout the runtime fuses for.
KernelFusion parse_fusion(const Context& ctx, const Node& node, const ModelSpec& model,
                          const LayoutSpec& layout) {
  MapReader m(ctx, node, "policies.fusion", {"norms", "rope"});
  KernelFusion f;
  // Each field checked alone (kernel_fusion_error), so an error points at the field.
  auto check = [&](const Node& n, const char* key, const KernelFusion& one) {
    const std::string why = kernel_fusion_error(model, one, layout.world());
    if (!why.empty()) {
      ctx.fail(n.mark, std::string("policies.fusion.") + key + ": " + why + " (layout " +
                           layout_name(layout) + ")");
    }
  };
  if (const Node* n = m.get("norms")) {
    f.norms = read_bool(ctx, *n, "policies.fusion.norms");
    check(*n, "norms", KernelFusion{.norms = f.norms});
  }
  if (const Node* n = m.get("rope")) {
    f.rope = read_bool(ctx, *n, "policies.fusion.rope");
    check(*n, "rope", KernelFusion{.rope = f.rope});
  }
  return f;
}

std::vector<std::pair<std::string, HostOp>> host_op_choices() {
  std::vector<std::pair<std::string, HostOp>> choices;
  for (int i = 0; i < kHostOpCount; ++i) {
    const auto op = static_cast<HostOp>(i);
    choices.emplace_back(host_op_name(op), op);
  }
  return choices;
}

DurationDist parse_duration_dist(const Context& ctx, const Node& node, const std::string& field) {
  DurationDist d;
  if (node.is_scalar()) {
    d.mean_ns = read_duration_ns(ctx, node, field);
    return d;
  }
  if (!node.is_mapping()) {
    ctx.fail(node.mark,
             field + " must be a duration (e.g. 120us) or {dist: ...}, got " + describe(node));
  }
  const Entry* dist = node.find("dist");
  if (dist == nullptr) {
    ctx.fail(node.mark,
             "missing required key 'dist' in " + field + " (fixed, normal, lognormal, uniform)");
  }
  d.kind = yaml::read_enum<DistKind>(ctx, dist->value, field + ".dist",
                                     {{"fixed", DistKind::kFixed},
                                      {"normal", DistKind::kNormal},
                                      {"lognormal", DistKind::kLognormal},
                                      {"uniform", DistKind::kUniform}});
  auto duration = [&](const MapReader& m, std::string_view key) {
    return read_duration_ns(ctx, m.require(key), m.field(key));
  };
  switch (d.kind) {
    case DistKind::kFixed: {
      MapReader m(ctx, node, field, {"dist", "mean"});
      d.mean_ns = duration(m, "mean");
      break;
    }
    case DistKind::kNormal:
    case DistKind::kLognormal: {
      MapReader m(ctx, node, field, {"dist", "mean", "std"});
      d.mean_ns = duration(m, "mean");
      d.std_ns = duration(m, "std");
      if (d.kind == DistKind::kLognormal && d.mean_ns == 0) {
        ctx.fail(m.get("mean")->mark, field + ".mean must be > 0 for a lognormal distribution");
      }
      break;
    }
    case DistKind::kUniform: {
      MapReader m(ctx, node, field, {"dist", "lo", "hi"});
      d.lo_ns = duration(m, "lo");
      d.hi_ns = duration(m, "hi");
      if (d.lo_ns > d.hi_ns) {
        ctx.fail(m.get("hi")->mark, field + ": lo (" + to_flow(*m.get("lo")) +
                                        ") is greater than hi (" + to_flow(*m.get("hi")) + ")");
      }
      d.mean_ns = (d.lo_ns + d.hi_ns) / 2;
      break;
    }
  }
  return d;
}

HostSpike parse_spike(const Context& ctx, const Node& node, const std::string& field) {
  MapReader m(ctx, node, field,
              {"op", "every_steps", "phase_step", "probability", "extra", "rank"});
  HostSpike s;
  s.rank = read_i32_or(ctx, m, "rank", 0, 1 << 20, -1);
  s.op = yaml::read_enum(ctx, m.require("op"), m.field("op"), host_op_choices());
  s.extra_ns =
      read_duration_ns(ctx, m.require("extra", "the added duration, e.g. 2ms"), m.field("extra"));
  if (s.extra_ns <= 0) ctx.fail(m.get("extra")->mark, m.field("extra") + " must be > 0");
  if (m.has("every_steps") == m.has("probability")) {
    ctx.fail(node.mark, field + " needs exactly one of every_steps or probability");
  }
  if (const Node* n = m.get("every_steps")) {
    s.every_steps = read_int(ctx, *n, m.field("every_steps"), 1, kMaxSteps);
    if (const Node* p = m.get("phase_step")) {
      s.phase_step = read_int(ctx, *p, m.field("phase_step"), 0, kMaxSteps);
    }
  } else {
    if (m.has("phase_step")) {
      ctx.fail(m.key_mark("phase_step"), m.field("phase_step") + " applies only with every_steps");
    }
    s.probability = read_double(ctx, *m.get("probability"), m.field("probability"), 0, 1, true);
  }
  return s;
}

HostCostSpec parse_host(const Context& ctx, const Node& node) {
  std::vector<std::string> allowed;
  for (const auto& [name, op] : host_op_choices()) allowed.push_back(name);
  allowed.push_back("spikes");
  MapReader m(ctx, node, "host", allowed);
  HostCostSpec h;
  for (const auto& [name, op] : host_op_choices()) {
    if (const Node* n = m.get(name)) {
      h.ops[static_cast<int>(op)] = parse_duration_dist(ctx, *n, m.field(name));
    }
  }
  if (const Node* spikes = m.get("spikes")) {
    if (!spikes->is_sequence()) {
      ctx.fail(spikes->mark,
               "host.spikes must be a list of {op, extra, every_steps | "
               "probability}, got " +
                   describe(*spikes));
    }
    for (size_t i = 0; i < spikes->items.size(); ++i) {
      h.spikes.push_back(
          parse_spike(ctx, spikes->items[i], "host.spikes[" + std::to_string(i) + "]"));
    }
  }
  return h;
}

TraceSpec parse_trace(const Context& ctx, const Node& node) {
  MapReader m(ctx, node, "trace", {"first_step", "steps", "nodes"});
  TraceSpec t;
  if (const Node* n = m.get("first_step")) {
    t.first_step = read_int(ctx, *n, "trace.first_step", 0, kMaxSteps);
  }
  t.step_count = read_int(ctx, m.require("steps"), "trace.steps", 0, 100'000);
  if (const Node* n = m.get("nodes")) t.nodes = read_bool(ctx, *n, "trace.nodes");
  return t;
}

// ---- run size limits --------------------------------------------------------------------------

std::string sci(double v) {
  std::ostringstream s;
  s << std::setprecision(3) << v;
  return s.str();
}

// Upper bounds, in floating point, on what the simulator computes in integers for `v`; throws
// at `workload` (the workload mapping) when one is out of range. Each bound over-estimates its
// quantity (prefill of every concurrent request at once at the longest lengths, every output
// token a step of its own), so a variant that passes cannot overflow; typical experiments sit
// many orders of magnitude below every limit.
void check_run_size(const Context& ctx, const Node& workload, const Variant& v) {
  const WorkloadSpec& w = v.workload;
  const int64_t output_tokens = int64_t{w.num_requests} * w.output_len.hi;
  if (output_tokens > kMaxOutputTokensPerRun) {
    ctx.fail(workload.mark,
             "workload.requests x workload.output_len = " + std::to_string(w.num_requests) + " x " +
                 std::to_string(w.output_len.hi) + " = " + std::to_string(output_tokens) +
                 " output tokens, over the limit of " + std::to_string(kMaxOutputTokensPerRun) +
                 " per run (samples are indexed with 32-bit integers); lower "
                 "requests or output_len");
  }
  double arrival_span_s = 0;
  if (w.arrival_rate_per_s > 0) {
    arrival_span_s = double(w.num_requests) / w.arrival_rate_per_s;
    if (arrival_span_s > kMaxArrivalSpanS) {
      ctx.fail(workload.mark, "workload.arrival_rate_per_s = " + sci(w.arrival_rate_per_s) +
                                  " spreads " + std::to_string(w.num_requests) +
                                  " requests over about " + sci(arrival_span_s) +
                                  " s, over the limit of " + sci(kMaxArrivalSpanS) +
                                  " s of arrivals; raise the rate or lower requests");
    }
  }

  const ModelSpec& m = v.model;
  const double concurrent = double(std::min(w.max_concurrency, w.num_requests));
  const double prefill_tokens = concurrent * double(w.input_len.hi);  // one step's prefill
  const double seq = double(w.input_len.hi) + double(w.output_len.hi);
  const double pairs = concurrent * seq * seq;  // >= attention (query, key) pairs of any step
  double widest = double(std::max(m.hidden, m.vocab));
  double largest_matrix = double(m.vocab) * double(m.hidden);
  double max_attn_width = 0, attn_width_sum = 0, max_state = 0, kv_per_token = 0;
  for (const LayerSpec& l : m.layers) {
    const AttentionSpec& a = l.attn;
    const double heads = a.num_q_heads;
    const double width = a.kind == AttentionKind::kMla
                             ? heads * (2.0 * a.kv_lora_rank + a.qk_rope_head_dim +
                                        a.qk_nope_head_dim + a.v_head_dim)
                             : heads * a.head_dim;
    max_attn_width = std::max(max_attn_width, width);
    attn_width_sum += width;
    if (a.kind == AttentionKind::kLinear) {
      max_state = std::max(max_state, heads * double(a.head_dim) * double(a.head_dim));
    }
    kv_per_token += double(layer_kv_bytes_per_token(l, m.kv_bytes));
    const double mlp_width = std::max(
        {double(l.mlp.intermediate), double(l.mlp.expert_intermediate) * l.mlp.top_k,
         double(l.mlp.shared_intermediate) * l.mlp.num_shared_experts, double(l.mlp.num_experts)});
    widest = std::max({widest, width, mlp_width});
    largest_matrix = std::max(largest_matrix, double(layer_param_count(l, m.hidden)));
  }
  const double layers = double(m.layers.size());
  const double params = rough_param_count(m);
  // FLOPs of the largest kernel and bytes of a whole step, in the worst (all-prefill) step.
  const double kernel_flops =
      std::max({2.0 * prefill_tokens * largest_matrix, 4.0 * pairs * max_attn_width,
                8.0 * prefill_tokens * max_state});
  const double step_bytes = params * 8 + concurrent * seq * kv_per_token +
                            concurrent * max_state * 4 * layers +
                            64.0 * prefill_tokens * widest * (layers + 1);
  if (kernel_flops > kMaxStepCount || step_bytes > kMaxStepCount) {
    ctx.fail(workload.mark,
             "a prefill step of this workload (" + sci(concurrent) + " concurrent requests of " +
                 std::to_string(w.input_len.hi) + " input tokens on model " + m.name +
                 ") would need about " + sci(std::max(kernel_flops, step_bytes)) +
                 " FLOPs or bytes, over the simulator's limit of " + sci(kMaxStepCount) +
                 " (64-bit counters); lower workload.concurrency or workload.input_len");
  }

  // Simulated time: every step pays the host loop, launches and its kernels; every token pays
  // the weights and its KV cache; arrivals add their span.
  const HardwareSpec& hw = v.hardware;
  const double ns_per_byte = 1e9 / (hw.stream_read_tbps * 1e12 * hw.mem_efficiency);
  const double ns_per_flop = 1e9 / (hw.bf16_tflops * 1e12 * hw.flop_efficiency);
  double host_step_ns = 0;
  for (const DurationDist& d : v.host_costs.ops) {
    host_step_ns += double(std::max(d.mean_ns, d.hi_ns)) + 10.0 * double(d.std_ns);
  }
  for (const HostSpike& spike : v.host_costs.spikes) host_step_ns += double(spike.extra_ns);
  const double kernels = 24.0 * (layers + 1);
  const double launch_step_ns =
      double(hw.graph_launch_ns + hw.d2h_latency_ns + hw.host_wake_ns) +
      kernels * double(std::max({hw.eager_launch_ns, hw.graph_node_gap_ns, hw.pdl_node_gap_ns,
                                 hw.kernel_floor_ns}));
  const double steps = double(w.num_requests) * (double(w.output_len.hi) + 2.0);
  const double work_ns =
      steps * (params * 8 + concurrent * seq * kv_per_token + kernels * 4096) * ns_per_byte +
      double(w.num_requests) * (2.0 * seq * params + 4.0 * seq * seq * attn_width_sum) *
          ns_per_flop;
  const double total_ns = steps * (host_step_ns + launch_step_ns) + work_ns + arrival_span_s * 40e9;
  if (!(total_ns <= kMaxSimulatedNs)) {
    ctx.fail(workload.mark,
             "this variant could simulate up to about " +
                 (std::isfinite(total_ns) ? sci(total_ns / 1e9 / 86400 / 365) : "infinitely many") +
                 " years (" + std::to_string(w.num_requests) + " requests of up to " +
                 std::to_string(w.output_len.hi) + " output tokens, host loop up to " +
                 sci(host_step_ns / 1e6) + " ms per step on " + hw.name + "), over the limit of " +
                 sci(kMaxSimulatedNs / 1e9 / 86400 / 365) +
                 " years (64-bit nanosecond clock); lower requests, output_len or host costs, or "
                 "raise the hardware rates");
  }
}

// ---- the whole document -----------------------------------------------------------------------

// Validates every per-variant key of `doc` (a top-level mapping without `sweep`).
Variant parse_variant(const Context& ctx, const Node& doc) {
  MapReader top(ctx, doc, "", top_level_keys());
  Variant v;
  if (const Node* n = top.get("seed")) v.seed = yaml::read_uint64(ctx, *n, "seed");
  v.model = parse_model(ctx, top.require("model", "a preset name: " + known_model_presets()));
  v.hardware = parse_hardware(
      ctx, top.require("hardware", "a preset name: " + yaml::join_list(hardware_names())));
  v.workload = parse_workload(ctx, top.require("workload"), v.seed);
  if (const Node* n = top.get("policies")) v.policy = parse_policies(ctx, *n);
  if (const Node* n = top.get("host")) v.host_costs = parse_host(ctx, *n);
  if (const Node* n = top.get("acceptance")) v.acceptance = parse_acceptance(ctx, *n);
  if (const Node* n = top.get("layout")) v.layout = parse_layout_node(ctx, *n, v.model);
  if (const Node* p = top.get("policies")) {
    if (const Entry* f = p->find("fusion")) {
      v.model.fusion = parse_fusion(ctx, f->value, v.model, v.layout);
    }
  }
  v.layout.expert_load.seed = splitmix64(v.seed ^ kRoutingSeedSalt);
  if (const Node* n = top.get("trace")) v.trace = parse_trace(ctx, *n);
  check_run_size(ctx, *top.get("workload"), v);
  return v;
}

std::vector<BackendKind> parse_backends(const Context& ctx, const Node& node) {
  if (!node.is_sequence() || node.items.empty()) {
    ctx.fail(node.mark, "backends must be a non-empty list such as [sim] or [sim, real], got " +
                            describe(node));
  }
  std::vector<BackendKind> out;
  for (const Node& item : node.items) {
    const BackendKind b = yaml::read_enum<BackendKind>(
        ctx, item, "backend", {{"sim", BackendKind::kSim}, {"real", BackendKind::kReal}});
    if (std::find(out.begin(), out.end(), b) != out.end()) {
      ctx.fail(item.mark, "backend '" + item.scalar + "' is listed twice");
    }
    out.push_back(b);
  }
  return out;
}

struct SweepAxis {
  std::string key;
  std::vector<std::string> path;
  Mark key_mark;
  std::vector<Node> values;
};

std::vector<std::string> split_path(const Context& ctx, const std::string& key, Mark mark) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (parts.back().empty()) {
      ctx.fail(mark, "sweep key '" + key + "' has an empty path component");
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

bool is_index(const std::string& s) {
  return !s.empty() && s.size() < 10 &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(uint8_t(c)); });
}

// Sets `axis.path` in `doc` to `value`, creating missing mappings. Throws at the sweep key when
// the path runs through something that is not a mapping (nor a list indexed by a number).
void substitute(const Context& ctx, const SweepAxis& axis, const Node& value, Node* doc) {
  Node* cur = doc;
  for (size_t i = 0; i < axis.path.size(); ++i) {
    const std::string& part = axis.path[i];
    const bool last = i + 1 == axis.path.size();
    if (i == 1 && cur->is_scalar() && (axis.path[0] == "model" || axis.path[0] == "hardware")) {
      Node preset = *cur;
      cur->kind = Node::Kind::kMapping;
      cur->scalar.clear();
      cur->entries.push_back(Entry{"preset", preset.mark, preset});
    }
    if (cur->is_sequence() && is_index(part)) {
      const size_t index = std::stoul(part);
      if (index >= cur->items.size()) {
        ctx.fail(axis.key_mark, "sweep key '" + axis.key + "': index " + part + " is past the " +
                                    std::to_string(cur->items.size()) + " items of that list");
      }
      cur = &cur->items[index];
      if (last) *cur = value;
      continue;
    }
    if (!cur->is_mapping()) {
      std::string through = axis.path[0];
      for (size_t j = 1; j < i; ++j) through += "." + axis.path[j];
      ctx.fail(axis.key_mark, "sweep key '" + axis.key + "' goes through '" + through +
                                  "', which is " + describe(*cur) + ", not a mapping");
    }
    Entry* e = cur->find(part);
    if (e == nullptr) {
      Node child;
      child.kind = Node::Kind::kMapping;
      child.mark = value.mark;
      cur->entries.push_back(Entry{part, value.mark, child});
      e = &cur->entries.back();
    }
    if (last) e->value = value;
    cur = &e->value;
  }
}

// sweep.cases: a list of cases, each a mapping from dotted keys to values set together (what
// a cartesian axis cannot express: a speculative policy with its acceptance), with an optional
// `name` that labels the case.
constexpr const char* kCasesKey = "cases";

SweepAxis parse_cases(const Context& ctx, const Entry& e, const Node& base) {
  if (!e.value.is_sequence() || e.value.items.empty()) {
    ctx.fail(e.value.mark,
             "sweep.cases must be a non-empty list of mappings {dotted.key: value, "
             "..., name: LABEL}, got " +
                 describe(e.value));
  }
  SweepAxis axis{kCasesKey, {kCasesKey}, e.key_mark, e.value.items};
  for (const Node& c : axis.values) {
    if (!c.is_mapping() || c.entries.empty()) {
      ctx.fail(c.mark,
               "each of sweep.cases must be a non-empty mapping {dotted.key: value, ...}, "
               "got " +
                   describe(c));
    }
    Node scratch = base;
    for (const Entry& set : c.entries) {
      if (set.key == "name") {
        read_string(ctx, set.value, "sweep.cases[].name");
        continue;
      }
      const SweepAxis one{set.key, split_path(ctx, set.key, set.key_mark), set.key_mark, {}};
      for (const char* fixed : {"name", "description", "backends", "sweep"}) {
        if (one.path[0] == fixed) ctx.fail(set.key_mark, "'" + set.key + "' cannot be swept");
      }
      substitute(ctx, one, set.value, &scratch);
    }
  }
  return axis;
}

// A case's label: its name, or its settings in flow style.
std::string case_label(const Node& c) {
  if (const Entry* n = c.find("name")) return n->value.scalar;
  return yaml::to_flow(c);
}

std::vector<SweepAxis> parse_sweep(const Context& ctx, const Node& sweep, const Node& base,
                                   Mark sweep_mark) {
  if (!sweep.is_mapping() || sweep.entries.empty()) {
    ctx.fail(sweep.is_mapping() ? sweep_mark : sweep.mark,
             "sweep must be a non-empty mapping from a dotted key (e.g. workload.concurrency) "
             "to a list of values, got " +
                 (sweep.is_mapping() ? std::string("an empty mapping") : describe(sweep)));
  }
  std::vector<SweepAxis> axes;
  for (const Entry& e : sweep.entries) {
    if (e.key == kCasesKey) {
      axes.push_back(parse_cases(ctx, e, base));
      continue;
    }
    SweepAxis axis{e.key, split_path(ctx, e.key, e.key_mark), e.key_mark, {}};
    for (const char* fixed : {"name", "description", "backends", "sweep"}) {
      if (axis.path[0] == fixed) {
        ctx.fail(e.key_mark, "sweep key '" + e.key + "': '" + fixed +
                                 "' cannot be swept; sweep seed, model, hardware, workload, "
                                 "policies, host or trace");
      }
    }
    for (const SweepAxis& other : axes) {
      if (other.key == kCasesKey) continue;  // a case may set what an axis also sweeps: it wins
      const size_t n = std::min(other.path.size(), axis.path.size());
      if (std::equal(other.path.begin(), other.path.begin() + n, axis.path.begin())) {
        ctx.fail(e.key_mark, "sweep keys '" + other.key + "' and '" + e.key + "' overlap");
      }
    }
    if (!e.value.is_sequence()) {
      ctx.fail(e.value.mark, "sweep." + e.key + " must be a list of values, e.g. [a, b], got " +
                                 describe(e.value));
    }
    if (e.value.items.empty()) {
      ctx.fail(e.value.mark, "sweep." + e.key + " is an empty list; give at least one value");
    }
    axis.values = e.value.items;
    Node scratch = base;
    substitute(ctx, axis, axis.values[0], &scratch);
    axes.push_back(std::move(axis));
  }
  return axes;
}

void check_name(const Context& ctx, const Node& node) {
  const std::string name = read_string(ctx, node, "name");
  static const std::regex kPattern("[A-Za-z0-9_.-]+");
  if (name.size() > 128 || !std::regex_match(name, kPattern)) {
    ctx.fail(node.mark, "name '" + name +
                            "' must be 1 to 128 characters of A-Z a-z 0-9 _ . - (it names the "
                            "experiment in the results database)");
  }
}

}  // namespace

Experiment load_experiment_text(const std::string& yaml_text, const std::string& source_name) {
  const Node doc = yaml::parse_document(yaml_text, source_name);
  const Context ctx{source_name, ""};
  MapReader top(ctx, doc, "", top_level_keys());

  Experiment exp;
  exp.source_path = source_name;
  exp.yaml_text = yaml_text;
  check_name(ctx, top.require("name"));
  exp.name = top.get("name")->scalar;
  if (const Node* n = top.get("description")) {
    exp.description = read_string(ctx, *n, "description");
  }
  exp.backends = top.has("backends") ? parse_backends(ctx, *top.get("backends"))
                                     : std::vector<BackendKind>{BackendKind::kSim};

  Node base = doc;
  std::erase_if(base.entries, [](const Entry& e) { return e.key == "sweep"; });
  if (!top.has("sweep")) {
    Variant v = parse_variant(ctx, base);
    v.label = "base";
    exp.variants.push_back(std::move(v));
    return exp;
  }

  const std::vector<SweepAxis> axes =
      parse_sweep(ctx, *top.get("sweep"), base, top.key_mark("sweep"));
  int64_t count = 1;
  for (const SweepAxis& axis : axes) {
    count *= int64_t(axis.values.size());
    if (count > kMaxVariants) {
      std::string sizes;
      double total = 1;
      for (const SweepAxis& a : axes) {
        sizes += (sizes.empty() ? "" : " x ") + std::to_string(a.values.size());
        total *= double(a.values.size());
      }
      std::ostringstream s;
      s << "sweep expands to " << std::fixed << std::setprecision(0) << total << " variants ("
        << sizes << "), over the limit of " << kMaxVariants;
      ctx.fail(top.key_mark("sweep"), s.str());
    }
  }
  exp.variants.reserve(count);
  std::vector<size_t> pick(axes.size(), 0);
  int64_t sweep_layers = 0;
  for (int64_t index = 0; index < count; ++index) {
    Variant v;
    Node doc_v = base;
    std::vector<std::pair<std::string, std::string>> params;
    std::string label;
    for (size_t a = 0; a < axes.size(); ++a) {
      const Node& value = axes[a].values[pick[a]];
      if (axes[a].key == kCasesKey) {
        for (const Entry& set : value.entries) {
          if (set.key == "name") continue;
          const SweepAxis one{set.key, split_path(ctx, set.key, set.key_mark), set.key_mark, {}};
          substitute(ctx, one, set.value, &doc_v);
        }
        params.emplace_back(kCasesKey, case_label(value));
      } else {
        substitute(ctx, axes[a], value, &doc_v);
        params.emplace_back(axes[a].key, yaml::to_flow(value));
      }
      label += (label.empty() ? "" : ", ") + axes[a].key + "=" + params.back().second;
    }
    const Context vctx{source_name,
                       " (in sweep variant " + std::to_string(index) + ": " + label + ")"};
    v = parse_variant(vctx, doc_v);
    // Every variant holds its model's layers: bound the total before memory runs out. The first
    // variant predicts the whole sweep; the running total catches swept layer counts.
    sweep_layers += int64_t(v.model.layers.size());
    const int64_t predicted = index == 0 ? count * sweep_layers : sweep_layers;
    if (predicted > kMaxSweepLayers) {
      ctx.fail(top.key_mark("sweep"),
               "sweep of " + std::to_string(count) + " variants holds about " +
                   std::to_string(index == 0 ? predicted : sweep_layers * count / (index + 1)) +
                   " model layers in memory (" + std::to_string(v.model.layers.size()) +
                   " in variant " + std::to_string(index) + "), over the limit of " +
                   std::to_string(kMaxSweepLayers) +
                   "; sweep fewer variants or split the experiment");
    }
    v.index = static_cast<int32_t>(index);
    v.label = std::move(label);
    v.params = std::move(params);
    exp.variants.push_back(std::move(v));
    for (size_t a = axes.size(); a-- > 0;) {
      if (++pick[a] < axes[a].values.size()) break;
      pick[a] = 0;
    }
  }
  return exp;
}

Experiment load_experiment_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw ConfigError(path, "cannot read experiment file '" + path + "': no such file");
  }
  if (std::filesystem::is_directory(path, ec)) {
    throw ConfigError(path, "cannot read experiment file '" + path + "': it is a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError(path, "cannot read experiment file '" + path +
                                "': " + std::error_code(errno, std::generic_category()).message());
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    throw ConfigError(path, "cannot read experiment file '" + path + "': read failed");
  }
  return load_experiment_text(text.str(), path);
}

}  // namespace twinstep
