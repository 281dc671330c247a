// The kernels of one forward step of a ModelSpec, each with bytes read/written and FLOPs.
// A step serves `requests` requests with `tokens` new tokens in all (decode: 1 per request;
// verify: the draft positions; prefill: the prompt). Both backends use this list: the
// simulator prices it, the runtime launches kernels with the same names.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "policies/layout.h"
#include "policies/model_spec.h"
#include "policies/moe_routing.h"
#include "policies/plan.h"

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

// The real runtime's node that runs step kernel `name`: it fuses some of the kernels this file
// lists (rope + kv_append -> rope_kv_append; gate_up_proj + swiglu -> gate_up_swiglu; the MoE's
// router, expert, shared-expert and combine kernels -> moe). Other names are returned unchanged.
// `compare --ops` merges consecutive kernels of one node on both timelines by this rule.
std::string_view runtime_node_name(std::string_view name);

// Whether step kernel (or runtime node) `name` is a group collective: an all-reduce,
// reduce-scatter, all-gather or all-to-all that every member of its group runs under that name
// once per instance, so the members' spans of one instance can be set side by side (`compare
// --collectives`). Sends and receives (a pipeline's) and compute kernels: false.
bool group_collective_name(std::string_view name);

// A collective's bytes_read is the message this rank contributes (a receive: 0) and
// bytes_written what it ends up receiving (all-reduce: the message; all-gather: group × message;
// all-to-all: its share of everyone's messages). `group` is the number of ranks taking part; for
// kSendRecv the peer stage (hidden states: send to stage + 1, receive from stage − 1; sampled
// ids: the last stage sends to stage 0). A kSendRecv with bytes_written == 0 is the send.
struct KernelDesc {
  const char* name;  // static storage: "qkv_proj", "attention", ...
  KernelClass cls;
  int64_t bytes_read;
  int64_t bytes_written;
  int64_t flops;
  CollectiveKind coll = CollectiveKind::kNone;
  int32_t group = 0;
  // Requests of the rank's own shape the kernel serves (0: not set). Fixed for a decode shape, so
  // prices stay affine in the cached context; calibrated attention pays a cost per request.
  int32_t requests = 0;
  // kGemm: the projection's weight shape, output rows × input columns (one rank's shard; 0: not
  // set). With the row count flops / (2·n·k) it gives the split-K the runtime's GEMV picks
  // (kernels/gemv_split.h), whose cost per row grows with the split (CostModel).
  int32_t gemv_n = 0;
  int32_t gemv_k = 0;
  // Token rows the kernel processes (the rank's new tokens; lm_head: its logits rows; decode-like
  // attention: its requests, each request's query rows sharing its blocks; 0: not set,
  // collectives). A calibrated fit holds up to the rows it was measured at
  // (HardwareSpec::kernel_fit_max_rows); beyond them CostModel prices the roofline.
  int32_t rows = 0;
};

// The split-K regressor of a kGemm kernel: (rows − 1) · (S − 1), S the split the runtime's GEMV
// picks for the kernel's weight shape on `sms` SMs (kernels/gemv_split.h) and rows = flops /
// (2·n·k), where rows <= 16 (kGemvMaxRows: more rows go to cuBLAS); 0 for any other kernel, a
// GEMV without its shape (gemv_n, gemv_k unset) or sms <= 0. The GEMV's cost per added row grows
// with S, not with bytes or FLOPs (in situ, H200, under the split rule before d6e1903: ~0.04-0.17
// us per row at S = 1, 0.29-0.35 at S = 2, 0.67-0.82 at S = 4; the rule now splits only shapes of
// at most ~100 tiles, S = 2); the first row's cost stays with the base and byte terms (counting
// it too priced Llama-3.2-3B's batch-1 TPOT 1.2 points further above the real runs).
double gemv_split_rows(const KernelDesc& k, int32_t sms);

// What a step computes. attn_pairs is the number of (query, key) pairs summed over every
// request: Σ_i [q_i·ctx_i + q_i(q_i+1)/2] for q_i new tokens after ctx_i cached tokens.
struct StepShape {
  int32_t requests = 0;
  int64_t tokens = 0;      // new tokens across all requests
  int64_t ctx_tokens = 0;  // Σ_i ctx_i: cached tokens read by attention
  int64_t attn_pairs = 0;
  bool lm_head_all_tokens = true;  // false for prefill: logits of the last token only
  // Prefill: requests whose prompt ends in this step, one logits row each (a chunk that stops
  // mid-prompt computes none for that request); -1: every request.
  int32_t finishing_requests = -1;
  // Tokens the MoE layers route through their experts; -1: every token. A speculative verify
  // pads each request to the launch's width, and the runtime routes only the request's draft
  // positions and its committed token (kernels/moe.h active_rows): Σ (draft length + 1).
  int64_t moe_tokens = -1;
  // Speculative launches as the runtime runs them (runtime/engine_spec.cc). row_exact: verify and
  // extend project in row-exact chunks of kGemvRowsPerLaunch rows (Engine::project_rows: the
  // decode GEMV, so a request's rows round as in plain decode), so a projection or LM head of more
  // rows is that many launches, each reading the whole weight, instead of one GEMM.
  // kv_pass: the extend (Engine::draft_kv) runs only the draft's embedding, input norms and
  // eh_proj and each GQA layer's input norm, qkv projection, rope and KV append: no attention
  // output, MLP, final norm or LM head (other attention kinds keep their whole layer).
  bool row_exact = false;
  bool kv_pass = false;
};

// Rows per launch of a row-exact projection (kernels::kGemvMaxRows).
inline constexpr int32_t kGemvRowsPerLaunch = 16;

// The one rule for carried norms (KernelFusion::norms), shared by the runtime's target layers
// (Engine::carries_norms) and step_carries_norms: a decode or verify launch of `rows` rows carries
// them when fused, row-exact (verify, in 16-row chunks) or at most kGemvRowsPerLaunch rows.
inline bool carries_norms(bool fused_norms, int64_t rows, bool row_exact) {
  return fused_norms && (row_exact || rows <= kGemvRowsPerLaunch);
}
// Whether a step of `shape` runs its layers' norms inside the GEMVs: carries_norms for decode-like
// launches (logits for every row); never prefill or the extend.
bool step_carries_norms(const ModelSpec& model, const StepShape& shape);
// Whether a step of `shape` runs rope and the KV append inside the attention (KernelFusion::rope,
// the runtime's target layers in decode and verify launches): decode-like steps; never prefill
// (Engine::prefill_pass runs them separately) or the extend.
bool step_fuses_rope(const ModelSpec& model, const StepShape& shape);

// The runtime's batch bucket for a launch of `requests` requests (Engine::bucket_for): the
// smallest power of two >= requests (1 for requests <= 1). Decode and speculative launches run
// every row of their bucket (the padding rows point at the padding slot), so the simulator prices
// them at it.
int32_t batch_bucket(int32_t requests);

StepShape decode_shape(int32_t requests, int32_t q_tokens_each, int64_t ctx_tokens_sum);
// A speculative verify / extend launch of `requests` requests, `positions` rows each, over
// `ctx_sum` cached tokens: decode_shape with row_exact (both) and kv_pass (the extend), as the
// runtime runs them (runtime/engine_spec.cc).
StepShape verify_shape(int32_t requests, int32_t positions, int64_t ctx_sum);
StepShape extend_shape(int32_t requests, int32_t positions, int64_t ctx_sum);

// What one launch of a decode-phase `phase` (decode, draft, verify, extend) runs, as both
// backends count it (the simulator prices it; the real backend sums a step's bytes_read from it):
// the module (the NEXTN draft, nextn_draft, for drafts and the extend; else the target), the
// shape of one pass over batch_bucket(requests) rows (the padding rows run too, as in the
// runtime's graphs) with the real requests' `ctx_sum` cached tokens and `q_tokens` positions each
// (drafts: one per forward), and its passes: `draft_passes` for a draft (draft_passes()), else 1.
// moe_tokens: a verify's positions routed through the experts (StepShape::moe_tokens; -1: every
// row). Prefill is not a decode-phase launch (Error).
struct LaunchWork {
  bool draft_module = false;
  StepShape shape;
  int32_t passes = 1;
};
LaunchWork launch_work(Phase phase, int32_t requests, int32_t q_tokens, int64_t ctx_sum,
                       int32_t draft_passes = 0, int64_t moe_tokens = -1);

StepShape prefill_shape(int32_t requests, int64_t prompt_tokens_sum, int64_t prompt_sq_sum);

// ---- Prefill attention as the runtime runs it (runtime/engine.cc Engine::prefill_pass) ----
// The prompt is cut into pseudo-requests of `chunk` queries, chunk = min(16, max(1, 64 / group))
// for `group` query heads per KV head (decode_attention serves group · chunk <= 64 rows), and
// chunk k of a prompt piece with ctx cached tokens runs as a decode request at context
// ctx + chunk·k: it reads the keys of the whole prefix up to its own, ctx + chunk·(k + 1).
int32_t prefill_attention_chunk(int32_t q_heads, int32_t kv_heads);
// Keys read by the chunks of a prefill with `attn_pairs` causal (query, key) pairs over `tokens`
// new tokens (StepShape): Σ over chunks of ctx + chunk·(k + 1) = (2·attn_pairs + tokens·(chunk −
// 1)) / (2·chunk), rounded up. Exact when every piece's new tokens and cached context are
// multiples of `chunk` (the runtime pads a prompt to one; the padding, < chunk rows per prompt, is
// not modelled, as for every other prefill kernel). Closed form: no loop over the chunks.
int64_t prefill_chunk_keys(int64_t attn_pairs, int64_t tokens, int32_t chunk);

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
  // Bytes the compute kernels read (runs repeated; collectives left out): a step's bytes_read.
  int64_t bytes_read() const;
};

// Fills `out` (cleared first). Expected distinct MoE experts for T tokens assume uniform
// routing: E·(1 − (1 − k/E)^T). The same as the layout overload with LayoutSpec{} and rank 0.
void step_kernels(const ModelSpec& model, const StepShape& shape, StepKernels& out);

// The kernels rank `rank` of `layout` runs for one forward pass, collectives included (placement
// in docs/layouts.md). `shape` is the whole step as the pipeline sees it (every request of the
// micro-batch); under DP attention the rank's attention, dense MLP and norms see
// dp_rank_shape(shape, width, rank % width); a CP prefill splits the new tokens (queries) over
// the stage and gathers keys and hidden states (docs/layouts.md). With `pass_key` and a skewed
// ExpertLoad under EP, each MoE layer's experts are placed by placed_expert_probabilities(load, ..,
// *pass_key, layer) (one run per layer); without it the hottest experts sit on the lowest slots.
// Throws ConfigError for an invalid layout or a rank outside [0, world).
void step_kernels(const ModelSpec& model, const StepShape& shape, const LayoutSpec& layout,
                  int32_t rank, StepKernels& out, std::optional<uint64_t> pass_key = std::nullopt);

// The kernels of layer `layer` (one of rank's stage) as step_kernels(model, shape, layout, rank,
// ..) emits them, collectives included, except that an MoE layer's routed work on the rank is
// `routing` (routed_expert_share of a measured launch's routing, say) instead of the expected or
// drawn one; a dense layer ignores it. With `routing` equal to the one step_kernels prices, the
// kernels of step_kernels' run of that layer. Fills `out` (cleared first). Throws
// ConfigError as step_kernels does, and for a layer outside rank's stage.
void layer_kernels(const ModelSpec& model, const StepShape& shape, const LayoutSpec& layout,
                   int32_t rank, int32_t layer, const ExpertShare& routing,
                   std::vector<KernelDesc>& out);

// ---- Pipeline parallelism (docs/layouts.md, "Pipeline microbatches") ----------------------
// A launch under PP is split into microbatches that enter the pipeline one after another; a
// stage starts microbatch j once it has finished j − 1 and j's hidden state has arrived.

// A decode-like launch over requests with cached contexts `ctx` (in launch order) and q_tokens
// new tokens each: decode_microbatches(l, n) contiguous groups, group j of
// balanced_share(n, m, j) requests. Appends to `out` (cleared first).
void decode_microbatch_shapes(const LayoutSpec& l, std::span<const int64_t> ctx, int32_t q_tokens,
                              std::vector<StepShape>& out);
// A prefill launch: the prompts (lengths in launch order) back to back, cut into chunks of
// prefill_chunk_tokens(l, Σ lengths) tokens. A chunk's piece of a request attends over the
// request's earlier pieces (ctx_tokens) and itself; a request's logits row is computed in the
// chunk where its prompt ends.
void prefill_microbatch_shapes(const LayoutSpec& l, std::span<const int64_t> prompt_lens,
                               std::vector<StepShape>& out);

// The sampled ids returning from the last stage to stage 0 at the end of a pipelined launch
// (pp > 1): on the last stage the send, on stage 0 the receive (one token id per logits row of
// the rank's requests over all microbatches); false on other stages and without PP.
bool pipeline_ids_kernel(const LayoutSpec& l, int32_t rank, std::span<const StepShape> microbatches,
                         KernelDesc& out);

// Speculative decoding under PP: the draft module (nextn_draft) runs on the last stage, which
// holds the target's final hidden state, sharded over that stage's width as in a one-stage
// layout; the other stages' lists are empty. The drafts then reach stage 0 (where the next
// verify starts) as pipeline_ids_kernel over decode_shape(requests, drafts each, 0). Without PP
// this is step_kernels(draft, shape, layout, rank, out, pass_key).
void draft_module_kernels(const ModelSpec& draft, const StepShape& shape, const LayoutSpec& layout,
                          int32_t rank, StepKernels& out,
                          std::optional<uint64_t> pass_key = std::nullopt);

// Every microbatch's step_kernels in order (microbatch j keyed by splitmix64(*pass_key + j)),
// then pipeline_ids_kernel, in one list. Runs keep execution order; runs[0] and runs.back() are
// no longer the only prologue and epilogue.
void pipeline_step_kernels(const ModelSpec& model, std::span<const StepShape> microbatches,
                           const LayoutSpec& layout, int32_t rank, StepKernels& out,
                           std::optional<uint64_t> pass_key = std::nullopt);

// The routing pipeline_step_kernels(model, microbatches, layout, rank, .., pass_key) draws under
// ExpertLoad::sampled with EP: for every microbatch (keyed as there) and every MoE layer of
// rank's stage, the microbatch's tokens' top_k experts (sampled_routing over the placed shares),
// added to `out` (add_moe_routing, ep = layout.ep). No-op unless layout.ep > 1 and
// layout.expert_load.sampled (the simulator draws no routing otherwise).
void add_sampled_routing(const ModelSpec& model, std::span<const StepShape> microbatches,
                         const LayoutSpec& layout, int32_t rank, uint64_t pass_key,
                         MoeRoutingStats& out);

// The share of `shape` that index `index` of a DP group of `width` serves: requests index,
// index + width, ...; tokens, ctx_tokens and attn_pairs split in proportion to the request count
// (⌊X·c(i+1)/R⌋ − ⌊X·c(i)/R⌋, c(i) = requests of indices < i), exact when every request has the
// same shape, and summing to the totals always (finishing_requests likewise). lm_head_all_tokens
// is kept.
StepShape dp_rank_shape(const StepShape& shape, int32_t width, int32_t index);

}  // namespace twinstep
