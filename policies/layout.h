// LayoutSpec: how one model is spread over GPUs (TP/PP/DP/EP/CP degrees as the seeds write them,
// "PP2-TP8", "DP32-EP32", "PP2-CP8-TP8"), in which number formats its weights and KV are stored,
// and what each rank then holds in memory. The per-rank kernel list is in step_kernels.h.
//
// Interpretation (docs/layouts.md has the worked reasoning):
// - A pipeline stage has width = max(tp, dp, cp, ep) GPUs; every degree > 1 must equal the width,
//   and max(tp, dp, cp) must too (attention is always spread over the whole stage). world =
//   pp × width; rank r is stage r / width, index r % width within it.
// - Attention: CP if cp > 1 (KV split by context over the stage, weights replicated; decode
//   exchanges partial outputs + log-sum-exp, prefill splits the queries), else DP if dp > 1
//   (weights replicated, each rank serves requests i, i + width, ...), else TP over the width
//   (heads split; GQA KV heads replicated when num_kv_heads < width; MLA's latent KV and its
//   q_a/kv_a projections on every rank).
// - Dense MLP and shared experts follow attention: split over the width (TP/CP), replicated (DP).
// - Routed experts: EP if ep > 1 (contiguous blocks of experts per rank), else split like the
//   dense MLP (each expert's intermediate over the width; replicated under DP).
// - Embedding and lm_head: vocab-parallel over the stage width, on the first / last stage.
// - Layers: stage s gets ⌈L/pp⌉ layers if s < L mod pp, else ⌊L/pp⌋, in model order.
// - Not modelled (ConfigError): DP with CP, DP attention with TP MoE (tp > 1 and dp > 1).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "policies/hardware_spec.h"
#include "policies/model_spec.h"

namespace twinstep {

// bf16: 2 B. fp8 (e4m3): 1 B, weights with one fp32 scale per 128×128 block, activations one
// per 1×128 tile (DeepSeek-V3 technical report §3.3). mxfp4: 4 bits + one 8-bit scale per 32
// values (OCP Microscaling spec v1.0). Scales are counted per 16384 / 128 / 32 values of the
// whole tensor, as if its dimensions were multiples of the block.
enum class Dtype : uint8_t { kBf16, kFp8, kMxfp4 };
const char* dtype_name(Dtype d);
Dtype parse_dtype(const std::string& name);  // "bf16" | "fp8" | "mxfp4"; ConfigError otherwise
int64_t weight_storage_bytes(Dtype d, int64_t values);
int64_t activation_storage_bytes(Dtype d, int64_t values);
// `values` weights in `d`, or `model_bytes` per value when `d` is unset.
int64_t weight_bytes_in(const std::optional<Dtype>& d, int32_t model_bytes, int64_t values);

// How routed tokens spread over experts (expected values, no randomness). Expert e's share p_e:
// uniform 1/E; zipf ∝ (e + 1)^-s (expert 0 hottest); hot: experts [0, hot_experts) share
// hot_fraction, the rest share 1 − hot_fraction evenly. A token picks top_k distinct experts, so
// p_e ≤ 1/top_k: larger shares are capped and the excess spread over the others in proportion.
struct ExpertLoad {
  enum class Kind : uint8_t { kUniform, kZipf, kHot };
  Kind kind = Kind::kUniform;
  double zipf_s = 1.0;
  int32_t hot_experts = 0;
  double hot_fraction = 0.0;
  // Routing of each forward pass under EP: expected shares (false: every rank gets its expected
  // routed copies and distinct experts), or sampled (true: every token draws its top_k distinct
  // experts from the (placed) shares, so a rank's load varies from pass to pass and layer to
  // layer, and the collective after the experts waits for the busier rank, as with a real
  // router over 2 ranks: top-8 of 128 experts puts 5.1 on the busier rank on average, not 4).
  bool sampled = false;
  // Seeds the per-pass placement draws below (experiments set it from the run seed).
  uint64_t seed = 0;
};
std::vector<double> expert_probabilities(const ExpertLoad& load, int32_t experts, int32_t top_k);

// The shares of expert_probabilities placed on expert slots for one forward pass of one layer:
// popularity rank j goes to slot π(j), π a permutation drawn from (load.seed, pass_key, layer)
// (Fisher-Yates over counter-based draws). Which experts are hot, and so which EP rank
// straggles, moves from pass to pass and layer to layer; every rank draws the same π for the
// same (pass_key, layer). Uniform loads are returned as they are.
std::vector<double> placed_expert_probabilities(const ExpertLoad& load, int32_t experts,
                                                int32_t top_k, uint64_t pass_key, int32_t layer);

struct LayoutSpec;
// Bytes per cached KV value: kv_dtype (bf16 2, fp8 1 with a per-tensor scale; mxfp4 is rejected
// by validate_layout) or ModelSpec::kv_bytes. compressed_kv_bytes divides raw full-attention KV
// bytes by kv_compression (rounded to nearest; exact when it is 1).
int32_t kv_value_bytes(const ModelSpec& m, const LayoutSpec& l);
int64_t compressed_kv_bytes(const LayoutSpec& l, int64_t raw_bytes);

struct LayoutSpec {
  int32_t tp = 1, pp = 1, dp = 1, ep = 1, cp = 1;
  // Unset formats mean the ModelSpec's weight_bytes / kv_bytes per value, no scales (so the
  // default layout reproduces the single-GPU kernel list). weight_dtype: attention, dense-MLP,
  // shared-expert and eh_proj matrices. expert_dtype: routed experts (unset: weight_dtype).
  // expert_act_dtype: activations dispatched to and fed into routed experts (unset: bf16).
  // Embedding, lm_head, norms and router stay in ModelSpec::weight_bytes (DeepSeek-V3 keeps them
  // in BF16 in its FP8 checkpoint, report §3.3.1).
  std::optional<Dtype> weight_dtype, expert_dtype, expert_act_dtype, kv_dtype;
  // Full-attention KV bytes per token are divided by this (seed 004's "compact KV state" gains
  // 2.268×; taken as the seed's figure, not derived from any KV format).
  double kv_compression = 1.0;
  // Activations, CUDA-graph pools, NCCL/all-to-all buffers per rank. Assumption: 8 GiB (not
  // measured). Usable fraction of HBM after the CUDA context and allocator slack: assumption 0.95.
  int64_t runtime_buffer_bytes = 8LL << 30;
  double hbm_usable_fraction = 0.95;
  ExpertLoad expert_load;
  // Pipeline microbatching (pp > 1 only; docs/layouts.md). A decode-like launch's requests enter
  // the pipeline in `microbatches` groups (0: pp of them, as the batch allows); a prefill
  // launch's prompt tokens in chunks of prefill_chunk_tokens (0: as many chunks as microbatches).
  int32_t microbatches = 0;
  int64_t prefill_chunk_tokens = 0;
  // Embedding and LM head split by vocabulary rows over the stage's ranks (true: the seeds'
  // layouts; the embedding's partial rows all-reduced, the LM head's (argmax, value) pairs
  // all-gathered), or held whole and computed alike on every rank (false: what the real runtime
  // does, no collective). Only matters on stages of more than one rank.
  bool vocab_parallel = true;

  int32_t width() const;  // GPUs per pipeline stage
  int32_t world() const { return pp * width(); }
};

// "TP8", "PP2-TP8", "DP16-EP16", "PP2-CP8-TP8" (case-insensitive, any order); ConfigError on
// anything else. layout_name prints PP, CP, DP, TP, EP in that order, omitting 1s ("TP1" for all).
LayoutSpec parse_layout(const std::string& name);
std::string layout_name(const LayoutSpec& l);

// Throws ConfigError with a message naming the rule broken (see the header comment), a degree
// larger than a layer's heads or experts, or out-of-range numbers.
void validate_layout(const ModelSpec& m, const LayoutSpec& l);

enum class AttnSharding : uint8_t { kTp, kDp, kCp };
enum class MoeSharding : uint8_t { kSplit, kEp, kReplicated };  // kSplit: intermediate over width
AttnSharding attention_sharding(const LayoutSpec& l);
MoeSharding moe_sharding(const LayoutSpec& l);
bool mlp_split(const LayoutSpec& l);  // dense MLP and shared experts split over the width

struct StageLayers {
  int32_t first = 0;
  int32_t count = 0;
};
StageLayers stage_layers(int32_t num_layers, int32_t pp, int32_t stage);

// The slice of one layer that index `index` of a stage holds, by the rules above.
struct LayerShard {
  int32_t heads = 0;     // query heads (GQA, MLA, linear) this rank computes
  int32_t kv_heads = 0;  // GQA KV heads stored: own share, or 1 (replicated) if fewer than width
  int64_t intermediate = 0;               // dense MLP width
  int64_t shared_intermediate = 0;        // per shared expert
  int64_t expert_intermediate = 0;        // per routed expert
  int32_t expert_first = 0, experts = 0;  // routed experts held: [first, first + experts)
};
LayerShard layer_shard(const LayerSpec& layer, const LayoutSpec& l, int32_t index);

// n split into `parts` near-equal integer shares summing to n; part i gets ⌊n(i+1)/parts⌋ −
// ⌊n·i/parts⌋. Used for heads, vocab rows, intermediate widths and expert blocks.
int64_t balanced_share(int64_t n, int32_t parts, int32_t i);

// The routed work landing on EP rank `index` of `ep` when `tokens` tokens are routed through
// layer `mlp` under `load`: expected routed token copies (the ep shares sum exactly to
// tokens · top_k) and expected distinct experts hit (Σ over the rank's experts of
// 1 − (1 − top_k·p_e)^tokens, rounded). ep = 1 gives the whole layer.
struct ExpertShare {
  int32_t experts = 0;  // experts this rank holds
  int64_t routed_tokens = 0;
  int64_t distinct_experts = 0;
};
ExpertShare expert_share(const ExpertLoad& load, const MlpSpec& mlp, int64_t tokens, int32_t ep,
                         int32_t index);
// The same for per-slot shares `p` (placed_expert_probabilities), summing to 1.
ExpertShare expert_share(const std::vector<double>& p, const MlpSpec& mlp, int64_t tokens,
                         int32_t ep, int32_t index);
// The routed work on EP rank `index` of `ep` under a given routing: `ids` holds every routed
// copy of the layer's tokens as an expert id over all mlp.num_experts experts (ids[t * top_k +
// j], the whole stage's tokens: a real router's picks, or sampled_routing's). routed_tokens
// counts the ids in the rank's block [⌊E·index/ep⌋, ⌊E·(index + 1)/ep⌋), distinct_experts the
// distinct ones among them; ids outside [0, E) count for no rank.
ExpertShare routed_expert_share(const MlpSpec& mlp, std::span<const int32_t> ids, int32_t ep,
                                int32_t index);
// One draw of the routing (ExpertLoad::sampled): each of `tokens` tokens picks top_k distinct
// experts with probabilities proportional to `p` (successive draws, a repeat drawn again), a
// pure function of (seed, pass_key, layer, token): every rank of a pass sees the same routing,
// so the ranks' routed_tokens sum to tokens * top_k exactly. routed_expert_share of
// sampled_routing's ids.
ExpertShare sampled_expert_share(const std::vector<double>& p, const MlpSpec& mlp, int64_t tokens,
                                 int32_t ep, int32_t index, uint64_t seed, uint64_t pass_key,
                                 int32_t layer);
// The routing sampled_expert_share counts: token t's top_k experts in ids[t * top_k ..] (cleared
// first), in the order drawn.
void sampled_routing(const std::vector<double>& p, const MlpSpec& mlp, int64_t tokens,
                     uint64_t seed, uint64_t pass_key, int32_t layer, std::vector<int32_t>& ids);

// Microbatches a decode-like launch of `requests` requests is split into: 1 without PP, else
// layout.microbatches (pp when 0), at most `requests` (at least 1).
int32_t decode_microbatches(const LayoutSpec& l, int32_t requests);
// Tokens per prefill chunk for a launch of `tokens` prompt tokens: the whole launch without PP,
// else prefill_chunk_tokens, or ⌈tokens / microbatches⌉ (microbatches 0: pp) when it is 0.
int64_t prefill_chunk_tokens(const LayoutSpec& l, int64_t tokens);

// What one rank holds. Weight bytes by role; KV for full-attention layers of its stage only.
struct RankMemory {
  int32_t rank = 0, stage = 0;
  StageLayers layers;
  int64_t embedding_bytes = 0;  // vocab slice (first stage), plus eh_proj/enorm/hnorm if MTP
  int64_t attention_bytes = 0;  // projections and attention-internal norms
  int64_t mlp_bytes = 0;        // dense MLP and shared experts
  int64_t expert_bytes = 0;     // routed experts
  int64_t router_bytes = 0;
  int64_t norm_bytes = 0;        // per-layer RMSNorms, final norm (last stage)
  int64_t lm_head_bytes = 0;     // vocab slice (last stage; tied: a second copy if pp > 1)
  int64_t replicated_bytes = 0;  // of the above, bytes every rank of the stage holds alike
  int64_t weight_bytes = 0;      // sum of the roles
  // KV bytes per context token this rank stores (after kv_compression). Under TP every rank
  // stores every token (its heads, or the whole MLA latent); under DP and CP a token lives on
  // one rank of the stage with all its heads.
  int64_t kv_bytes_per_token = 0;
  int64_t state_bytes_per_request = 0;  // linear-attention state (fp32) + conv tail
  int64_t runtime_buffer_bytes = 0;
  int64_t usable_hbm_bytes = 0;  // hbm_bytes × hbm_usable_fraction, rounded down
  int64_t free_bytes = 0;        // usable − weights − buffers (negative: does not fit)
  // Full-token capacity (seed 004): max(0, free) / kv_bytes_per_token, rounded down; -1 when the
  // stage holds no full-attention layer. Per rank: under DP it counts that rank's requests only.
  int64_t kv_capacity_tokens = 0;
};
RankMemory rank_memory(const ModelSpec& m, const HardwareSpec& hw, const LayoutSpec& l,
                       int32_t rank);

// `twinstep capacity`: one row per layout, describing its binding rank (fewest KV tokens).
// replica_kv_tokens: context tokens one model replica (pp × width ranks) holds — the binding
// rank's capacity, × width under DP/CP (tokens spread over the stage), min over stages.
// ratio: capacity over that of the first row with the same degrees.
struct CapacityRow {
  std::string layout, weights, kv;  // "PP2-TP8", "fp8, experts mxfp4 (fp8 act)", "bf16 ÷2.268"
  int32_t world = 0;
  RankMemory binding;
  int64_t replica_kv_tokens = 0;
  double ratio = 1.0;
};
using CapacityCell = std::variant<int64_t, double, std::string>;
struct CapacityTable {
  std::vector<std::string> columns;  // names with units: "weights_gb", "kv_tokens", ...
  std::vector<CapacityRow> rows;
  std::vector<CapacityCell> cells(size_t row) const;  // in `columns` order
};
CapacityTable capacity_table(const ModelSpec& m, const HardwareSpec& hw,
                             const std::vector<LayoutSpec>& layouts);

// Seed 004's study for each layout name: baseline (fp8 weights, bf16 KV: DeepSeek-V3's native
// checkpoint), mxfp4 routed experts with fp8 activations, compact KV (÷2.268), both.
std::vector<LayoutSpec> seed004_capacity_layouts(const std::vector<std::string>& layout_names);

}  // namespace twinstep
