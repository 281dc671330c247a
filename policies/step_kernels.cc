#include "policies/step_kernels.h"

#include "kernels/gemv_split.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "policies/error.h"
#include "policies/rng.h"

namespace twinstep {
namespace {

constexpr int64_t kActBytes = 2;     // bf16 activations
constexpr int64_t kStateBytes = 4;   // fp32 recurrent state
constexpr int64_t kIdBytes = 4;      // token id
constexpr int64_t kArgmaxBytes = 8;  // (token id, probability) per logits row

// ⌊a·b/c⌋ without overflow.
int64_t mul_div(int64_t a, int64_t b, int64_t c) {
  return static_cast<int64_t>(static_cast<__int128>(a) * b / c);
}

constexpr int64_t kNormSqBytes = 4;  // one fp32 sum of squares per 16 residual columns

// One rank's view of the step. `own` is the shape its attention, norms and dense projections
// see (DP: its requests; otherwise the whole stage), `stage` the whole step.
struct Emitter {
  StepKernels& out;
  const ModelSpec& m;
  const LayoutSpec& l;
  const StepShape& stage;
  const StepShape& own;
  int32_t w;      // stage width
  int32_t index;  // index within the stage
  AttnSharding attn;
  MoeSharding moe;
  const std::vector<double>* placed = nullptr;  // this layer's drawn expert shares, if any
  // CP prefill (query-split): `own` is this rank's slice of the new tokens; the MLP runs on every
  // token of the stage and its partial sums are reduce-scattered back to the slices.
  bool cp_prefill = false;
  bool scatter_reduce = false;  // set on the MLP's emitter under cp_prefill
  // ExpertLoad::sampled: the pass and layer the routing draw of this layer is keyed by.
  uint64_t pass_key = 0;
  int32_t layer = 0;
  // The MoE routing on this rank, given (layer_kernels), instead of the expected or drawn one.
  const ExpertShare* routing = nullptr;
  // KernelFusion::norms applies to this step (step_carries_norms).
  bool carry_norms = false;

  int64_t wgt(int64_t values) const {
    return weight_bytes_in(l.weight_dtype, m.weight_bytes, values);
  }
  void add(const char* name, KernelClass cls, int64_t read, int64_t written, int64_t flops) {
    out.kernels.push_back(
        {name, cls, read, written, flops, CollectiveKind::kNone, 0, own.requests});
    out.kernels.back().rows = rows_of(own.tokens);
  }
  static int32_t rows_of(int64_t tokens) {
    return static_cast<int32_t>(std::min<int64_t>(tokens, std::numeric_limits<int32_t>::max()));
  }
  // y[T, n] = x[T, k] · W[k, n] over the rank's own tokens; row-exact (StepShape::row_exact):
  // one launch per kGemvRowsPerLaunch rows, each reading the whole weight.
  // adds_residual: the output is added into the residual stream (carried norms: o_proj and
  // down_proj read the residual rows too).
  void gemm(const char* name, int64_t k, int64_t n, bool adds_residual = false) {
    for (int64_t first = 0; first < std::max<int64_t>(own.tokens, 1);
         first += row_chunk(own.tokens)) {
      const int64_t t = std::min(own.tokens - first, row_chunk(own.tokens));
      add(name, KernelClass::kGemm,
          wgt(k * n) + t * k * kActBytes + (adds_residual ? t * n * kActBytes : 0),
          t * n * kActBytes, 2 * t * k * n);
      out.kernels.back().rows = rows_of(t);
      out.kernels.back().gemv_n = static_cast<int32_t>(n);
      out.kernels.back().gemv_k = static_cast<int32_t>(k);
    }
  }
  // Rows per projection launch for `rows` rows: all of them, or kGemvRowsPerLaunch when
  // row-exact and more (never 0).
  int64_t row_chunk(int64_t rows) const {
    return own.row_exact && rows > kGemvRowsPerLaunch ? kGemvRowsPerLaunch
                                                      : std::max<int64_t>(rows, 1);
  }
  void norm(const char* name, int64_t width, bool residual) {
    const int64_t rw = residual ? 2 : 1;
    add(name, KernelClass::kNorm, rw * own.tokens * width * kActBytes + width * m.weight_bytes,
        rw * own.tokens * width * kActBytes, 4 * own.tokens * width);
  }
  void swiglu(const char* name, int64_t inter) {
    add(name, KernelClass::kActivation, 2 * own.tokens * inter * kActBytes,
        own.tokens * inter * kActBytes, 5 * own.tokens * inter);
  }
  // A collective over the stage's `w` ranks; nothing on a stage of one.
  void coll(const char* name, CollectiveKind kind, int64_t sent, int64_t received) {
    if (w > 1) out.kernels.push_back({name, KernelClass::kCollective, sent, received, 0, kind, w});
  }
  void all_reduce(const char* name, int64_t bytes) {
    coll(name, CollectiveKind::kAllReduce, bytes, bytes);
  }
  // The partial sums of an MLP split over the width: all-reduced, or under CP prefill
  // reduce-scattered to each rank's token slice — an all-to-all of the partials (each rank sends
  // the others their slices: (w − 1)/w of the message, a ring reduce-scatter's traffic), the sum
  // folded into the next norm.
  void reduce_partials(const char* all_reduce_name, const char* scatter_name, int64_t bytes) {
    if (!scatter_reduce) {
      all_reduce(all_reduce_name, bytes);
      return;
    }
    coll(scatter_name, CollectiveKind::kAllToAll, bytes,
         balanced_share(stage.tokens, w, index) * m.hidden * kActBytes * w);
  }
  // CP prefill: every rank's stored keys (its share of the cached context and its new tokens'),
  // `raw_bytes` per token before kv_compression, are all-gathered so that its queries see all.
  void cp_kv_gather(int64_t raw_bytes) {
    if (!cp_prefill) return;
    const int64_t mine = balanced_share(own.ctx_tokens, w, index) + own.tokens;
    coll("cp_kv_gather", CollectiveKind::kAllGather, compressed_kv_bytes(l, mine * raw_bytes),
         compressed_kv_bytes(l, (own.ctx_tokens + stage.tokens) * raw_bytes));
  }
  // CP: partial outputs (`values` per token, bf16) and one fp32 log-sum-exp per head and token
  // are all-gathered, then merged.
  void cp_exchange(int64_t values, int64_t heads) {
    if (attn != AttnSharding::kCp || cp_prefill) return;
    const int64_t part = own.tokens * (values * kActBytes + heads * 4);
    coll("cp_exchange", CollectiveKind::kAllGather, part, w * part);
    add("cp_merge", KernelClass::kActivation, w * part, own.tokens * values * kActBytes,
        3 * w * own.tokens * values);
  }
};

// Keys this rank's attention reads and appends: CP splits the context and the new tokens' KV
// over the stage; TP and DP keep the own shape's.
struct KvShare {
  int64_t ctx, append, pairs;
};

KvShare kv_share(const Emitter& e) {
  if (e.attn != AttnSharding::kCp) return {e.own.ctx_tokens, e.own.tokens, e.own.attn_pairs};
  if (e.cp_prefill) {
    // Its query slice attends over every cached key and every new one (gathered): the keys of
    // the other ranks' new tokens count as context read, its own are appended.
    return {e.own.ctx_tokens + e.stage.tokens - e.own.tokens, e.own.tokens, e.own.attn_pairs};
  }
  return {balanced_share(e.own.ctx_tokens, e.w, e.index),
          balanced_share(e.own.tokens, e.w, e.index),
          balanced_share(e.own.attn_pairs, e.w, e.index)};
}

void emit_attention(Emitter& e, const LayerSpec& layer, const LayerShard& sh) {
  const ModelSpec& m = e.m;
  const AttentionSpec& a = layer.attn;
  const StepShape& s = e.own;
  const int64_t h = m.hidden;
  const int64_t kvb = kv_value_bytes(m, e.l);
  const KvShare kv_at = kv_share(e);
  const bool tp_reduce = e.attn == AttnSharding::kTp;
  if (!e.carry_norms) {
    e.norm("attn_norm", h, /*residual=*/true);
  } else if (e.layer == 0) {
    // The embedded rows' tile sums of squares (kernels' rms_sq_partials); later layers' come
    // from the down projection before them.
    e.add("attn_norm", KernelClass::kNorm, s.tokens * h * kActBytes,
          s.tokens * (h / 16) * kNormSqBytes, 2 * s.tokens * h);
  }
  switch (a.kind) {
    case AttentionKind::kGqa: {
      const int64_t q = int64_t{sh.heads} * a.head_dim;
      const int64_t kv = int64_t{sh.kv_heads} * a.head_dim;
      e.gemm("qkv_proj", h, q + 2 * kv);
      const int64_t rope_bytes = s.tokens * (q + kv) * kActBytes;
      const int64_t append_read = kv_at.append * 2 * kv * kActBytes;
      const int64_t append_written = compressed_kv_bytes(e.l, kv_at.append * 2 * kv * kvb);
      const bool fused = step_fuses_rope(m, s);
      if (!fused) {
        e.add("rope", KernelClass::kRope, rope_bytes, rope_bytes, 6 * s.tokens * (q + kv));
        e.add("kv_append", KernelClass::kKvAppend, append_read, append_written, 0);
      }
      e.cp_kv_gather(2 * kv * kvb);
      if (s.kv_pass) break;  // the extend: the layer's KV only
      // Prefill (not CP): chunks of decode attention over the growing prefix, each reading every
      // key before its end (prefill_chunk_keys), one pseudo-request per chunk. Decode-like steps:
      // each request reads its context and new keys once.
      const bool chunked = !s.lm_head_all_tokens && !e.cp_prefill;
      const int32_t chunk = prefill_attention_chunk(sh.heads, sh.kv_heads);
      const int64_t keys =
          chunked ? prefill_chunk_keys(kv_at.pairs, kv_at.append, chunk) : kv_at.ctx + kv_at.append;
      const int64_t kv_read = compressed_kv_bytes(e.l, keys * 2 * kv * kvb);
      // KernelFusion::rope: the attention rotates q and the new k and appends k and v itself
      // (kernels' decode_attention_rope), reading the qkv rows instead of q.
      e.add("attention", KernelClass::kAttention,
            kv_read + s.tokens * q * kActBytes + (fused ? append_read : 0),
            s.tokens * q * kActBytes + (fused ? append_written : 0),
            4 * kv_at.pairs * q + (fused ? 6 * s.tokens * (q + kv) : 0));
      if (chunked) {
        e.out.kernels.back().requests = Emitter::rows_of((kv_at.append + chunk - 1) / chunk);
      } else if (s.lm_head_all_tokens) {
        // Decode-like (decode, verify): one block per (split, KV head, request) serves all of a
        // request's query rows, so the launch is the one the decode fit measured at this many
        // requests (KernelDesc::rows), whatever the verify width.
        e.out.kernels.back().rows = Emitter::rows_of(s.requests);
      }
      e.cp_exchange(q, sh.heads);
      e.gemm("o_proj", q, h, e.carry_norms);
      break;
    }
    case AttentionKind::kMla: {
      const int64_t heads = sh.heads;
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
      const bool absorbed = s.lm_head_all_tokens;  // decode-like steps; prefill: see below
      if (absorbed) {
        // Absorbed decode: q_nope is mapped into the latent space (W_UK), attention runs as MQA
        // over the cached latent, and the output is mapped back per head (W_UV).
        e.add("q_absorb", KernelClass::kGemm,
              e.wgt(heads * a.qk_nope_head_dim * a.kv_lora_rank) +
                  s.tokens * heads * a.qk_nope_head_dim * kActBytes,
              s.tokens * heads * a.kv_lora_rank * kActBytes,
              2 * s.tokens * heads * a.qk_nope_head_dim * a.kv_lora_rank);
      }
      e.add("rope", KernelClass::kRope, s.tokens * (heads + 1) * a.qk_rope_head_dim * kActBytes,
            s.tokens * (heads + 1) * a.qk_rope_head_dim * kActBytes,
            6 * s.tokens * (heads + 1) * a.qk_rope_head_dim);
      e.add("kv_append", KernelClass::kKvAppend, kv_at.append * latent * kActBytes,
            compressed_kv_bytes(e.l, kv_at.append * latent * kvb), 0);
      e.cp_kv_gather(latent * kvb);
      if (!absorbed) {
        // Prefill runs the non-absorbed form (as FlashAttention-based MLA prefill does): the
        // latent of every key read is up-projected to per-head k_nope and v (W_UK, W_UV), and
        // attention runs as MHA with qk_head-wide keys and v_head-wide values.
        const int64_t keys = kv_at.ctx + kv_at.append;
        const int64_t kv_up = heads * (int64_t{a.qk_nope_head_dim} + a.v_head_dim);
        e.add("kv_b_proj", KernelClass::kGemm,
              e.wgt(a.kv_lora_rank * kv_up) +
                  compressed_kv_bytes(e.l, keys * int64_t{a.kv_lora_rank} * kvb),
              keys * kv_up * kActBytes, 2 * keys * a.kv_lora_rank * kv_up);
        e.add("attention", KernelClass::kAttention,
              keys * kv_up * kActBytes +
                  compressed_kv_bytes(e.l, keys * int64_t{a.qk_rope_head_dim} * kvb) +
                  s.tokens * heads * qk_head * kActBytes,
              s.tokens * heads * a.v_head_dim * kActBytes,
              2 * kv_at.pairs * heads * (qk_head + a.v_head_dim));
        e.cp_exchange(heads * a.v_head_dim, heads);
        e.gemm("o_proj", heads * a.v_head_dim, h);
        break;
      }
      e.add("attention", KernelClass::kAttention,
            compressed_kv_bytes(e.l, (kv_at.ctx + kv_at.append) * latent * kvb) +
                s.tokens * heads * latent * kActBytes,
            s.tokens * heads * a.kv_lora_rank * kActBytes,
            2 * kv_at.pairs * heads * (latent + a.kv_lora_rank));
      e.cp_exchange(heads * a.kv_lora_rank, heads);
      e.add("v_up", KernelClass::kGemm,
            e.wgt(heads * a.kv_lora_rank * a.v_head_dim) +
                s.tokens * heads * a.kv_lora_rank * kActBytes,
            s.tokens * heads * a.v_head_dim * kActBytes,
            2 * s.tokens * heads * a.kv_lora_rank * a.v_head_dim);
      e.gemm("o_proj", heads * a.v_head_dim, h);
      break;
    }
    case AttentionKind::kLinear: {
      // Under CP the recurrent state cannot be split by context: every rank runs the layer
      // whole (replicated), with no exchange.
      const int64_t heads = sh.heads;
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
      break;
    }
  }
  if (tp_reduce) e.all_reduce("attn_all_reduce", s.tokens * h * kActBytes);
}

// The MLP after its norm, over e.own's tokens.
void emit_mlp_body(Emitter& e, const LayerSpec& layer, const LayerShard& sh) {
  const ModelSpec& m = e.m;
  const LayoutSpec& l = e.l;
  const MlpSpec& p = layer.mlp;
  const StepShape& s = e.own;
  const int64_t h = m.hidden;
  const bool split = mlp_split(l);
  if (p.kind == MlpKind::kDense) {
    e.gemm("gate_up_proj", h, 2 * sh.intermediate);
    e.swiglu("swiglu", sh.intermediate);
    e.gemm("down_proj", sh.intermediate, h, e.carry_norms);
    if (split) e.reduce_partials("mlp_all_reduce", "mlp_reduce_scatter", s.tokens * h * kActBytes);
    return;
  }
  const int64_t experts = p.num_experts;
  e.add("moe_router", KernelClass::kMoeRouter,
        h * experts * m.weight_bytes + s.tokens * h * kActBytes, s.tokens * p.top_k * 8,
        2 * s.tokens * h * experts);
  // Tokens whose routed copies this rank's experts may serve: the whole stage's (EP, split),
  // or its own under replicated experts (DP without EP).
  const bool ep = e.moe == MoeSharding::kEp;
  const bool a2a = ep && e.attn == AttnSharding::kDp;  // tokens live on one rank: all-to-all
  int64_t route_tokens = e.moe == MoeSharding::kReplicated ? s.tokens : e.stage.tokens;
  // Padded positions route nowhere (StepShape::moe_tokens), in the same proportion on every rank.
  if (e.stage.moe_tokens >= 0 && e.stage.tokens > 0)
    route_tokens = (route_tokens * e.stage.moe_tokens + e.stage.tokens - 1) / e.stage.tokens;
  const int32_t ep_width = ep ? l.ep : 1, ep_index = ep ? e.index : 0;
  const ExpertShare es =
      e.routing != nullptr    ? *e.routing
      : e.placed == nullptr   ? expert_share(l.expert_load, p, route_tokens, ep_width, ep_index)
      : l.expert_load.sampled ? sampled_expert_share(*e.placed, p, route_tokens, ep_width, ep_index,
                                                     l.expert_load.seed, e.pass_key, e.layer)
                              : expert_share(*e.placed, p, route_tokens, ep_width, ep_index);
  const int64_t routed = es.routed_tokens;
  const int64_t distinct = es.distinct_experts;
  const int64_t ie = sh.expert_intermediate;
  const std::optional<Dtype> efmt = l.expert_dtype ? l.expert_dtype : l.weight_dtype;
  auto ewgt = [&](int64_t values) { return weight_bytes_in(efmt, m.weight_bytes, values); };
  auto act = [&](int64_t values) {
    return l.expert_act_dtype ? activation_storage_bytes(*l.expert_act_dtype, values)
                              : values * kActBytes;
  };
  const int64_t own_copies = s.tokens * p.top_k;
  if (a2a) e.coll("moe_dispatch", CollectiveKind::kAllToAll, own_copies * act(h), routed * act(h));
  e.add("moe_gate_up", KernelClass::kMoeExperts, ewgt(distinct * h * 2 * ie) + routed * act(h),
        routed * ie * kActBytes, 2 * routed * h * 2 * ie);
  e.add("moe_down", KernelClass::kMoeExperts, ewgt(distinct * ie * h) + routed * act(ie),
        routed * h * kActBytes, 2 * routed * ie * h);
  if (a2a)
    e.coll("moe_combine_a2a", CollectiveKind::kAllToAll, routed * h * kActBytes,
           own_copies * h * kActBytes);
  if (p.num_shared_experts > 0) {
    const int64_t is = sh.shared_intermediate * p.num_shared_experts;
    e.gemm("shared_gate_up", h, 2 * is);
    e.gemm("shared_down", is, h);
  }
  // Weighted sum of each token's expert outputs (with the shared expert's).
  const int64_t copies = a2a ? own_copies : routed;
  e.add("moe_combine", KernelClass::kActivation, copies * h * kActBytes + s.tokens * h * kActBytes,
        s.tokens * h * kActBytes, 2 * copies * h);
  // Split experts, or EP over replicated tokens (TP/CP attention): partial sums all-reduced.
  if (e.moe == MoeSharding::kSplit || (ep && !a2a))
    e.reduce_partials("moe_all_reduce", "moe_reduce_scatter", s.tokens * h * kActBytes);
}

void emit_mlp(Emitter& e, const LayerSpec& layer, const LayerShard& sh) {
  if (!e.carry_norms) e.norm("mlp_norm", e.m.hidden, /*residual=*/true);
  if (!e.cp_prefill) {
    emit_mlp_body(e, layer, sh);
    return;
  }
  // CP prefill: the MLP is split over the width like TP, so every rank needs every token.
  e.coll("cp_hidden_gather", CollectiveKind::kAllGather, e.own.tokens * e.m.hidden * kActBytes,
         e.stage.tokens * e.m.hidden * kActBytes);
  Emitter all{e.out,
              e.m,
              e.l,
              e.stage,
              e.stage,
              e.w,
              e.index,
              e.attn,
              e.moe,
              e.placed,
              /*cp_prefill=*/false,
              /*scatter_reduce=*/true,
              e.pass_key,
              e.layer,
              e.routing};
  emit_mlp_body(all, layer, sh);
}

// The sampled (or drafted) token ids going from the last stage to stage 0: `rows` ids of 4 B;
// the receive on stage 0, the send on the last stage.
KernelDesc ids_transfer(const LayoutSpec& l, int32_t stage, int64_t rows) {
  const int64_t bytes = rows * kIdBytes;
  if (stage == 0) {
    return {"pp_ids_recv", KernelClass::kCollective, 0, bytes, 0, CollectiveKind::kSendRecv,
            l.pp - 1};
  }
  return {"pp_ids_send", KernelClass::kCollective, bytes, 0, 0, CollectiveKind::kSendRecv, 0};
}

bool has_linear_attention(const ModelSpec& m) {
  for (const LayerSpec& l : m.layers)
    if (l.attn.kind == AttentionKind::kLinear) return true;
  return false;
}

// CP prefill: index `index` of `width` takes a contiguous share of the new tokens (as queries)
// and of the attention pairs (the causal load balanced, as zig-zag placement does), every cached
// key, and its share of the prompts that end in the step.
StepShape cp_prefill_shape(const StepShape& shape, int32_t width, int32_t index) {
  StepShape s = shape;
  s.tokens = balanced_share(shape.tokens, width, index);
  s.attn_pairs = balanced_share(shape.attn_pairs, width, index);
  const int32_t finishing =
      shape.finishing_requests >= 0 ? shape.finishing_requests : shape.requests;
  s.finishing_requests = static_cast<int32_t>(balanced_share(finishing, width, index));
  return s;
}

// Rows the lm_head computes: every new token, or one per request whose prompt ends here.
int64_t logit_rows(const StepShape& s) {
  if (s.lm_head_all_tokens) return s.tokens;
  return s.finishing_requests >= 0 ? s.finishing_requests : s.requests;
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

double gemv_split_rows(const KernelDesc& k, int32_t sms) {
  if (k.cls != KernelClass::kGemm || k.gemv_n <= 0 || k.gemv_k <= 0 || sms <= 0) return 0;
  const double rows = double(k.flops) / (2.0 * k.gemv_n * double(k.gemv_k));
  if (rows <= 0 || rows > 16.5) return 0;
  const int split = kernels::gemv_default_split(k.gemv_n, k.gemv_k, sms);
  return split > 1 ? (rows - 1) * (split - 1) : 0.0;
}

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
    case KernelClass::kCollective:
      return "collective";
    case KernelClass::kCount:
      break;
  }
  return "?";
}

std::string_view runtime_node_name(std::string_view name) {
  if (name == "rope" || name == "kv_append") return "rope_kv_append";
  if (name == "gate_up_proj" || name == "swiglu") return "gate_up_swiglu";
  if (name == "moe_router" || name == "moe_gate_up" || name == "moe_down" ||
      name == "shared_gate_up" || name == "shared_down" || name == "moe_combine")
    return "moe";
  return name;
}

bool group_collective_name(std::string_view name) {
  // Every name the emitter gives a collective other than kSendRecv (a test walks the layouts).
  static constexpr std::string_view kNames[] = {
      "attn_all_reduce",       "mlp_all_reduce",       "mlp_reduce_scatter", "moe_all_reduce",
      "moe_reduce_scatter",    "embedding_all_reduce", "moe_dispatch",       "moe_combine_a2a",
      "cp_kv_gather",          "cp_exchange",          "cp_hidden_gather",   "embedding_ids_gather",
      "lm_head_hidden_gather", "argmax_gather"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

const char* collective_kind_name(CollectiveKind c) {
  switch (c) {
    case CollectiveKind::kNone:
      return "none";
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
    case CollectiveKind::kSendRecv:
      return "send_recv";
  }
  return "?";
}

bool step_fuses_rope(const ModelSpec& model, const StepShape& shape) {
  return model.fusion.rope && shape.lm_head_all_tokens && !shape.kv_pass;
}

bool step_carries_norms(const ModelSpec& model, const StepShape& shape) {
  return shape.lm_head_all_tokens && !shape.kv_pass &&
         carries_norms(model.fusion.norms, shape.tokens, shape.row_exact);
}

int32_t batch_bucket(int32_t requests) {
  int32_t bucket = 1;
  while (bucket < requests) bucket *= 2;
  return bucket;
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

StepShape verify_shape(int32_t requests, int32_t positions, int64_t ctx_sum) {
  StepShape s = decode_shape(requests, positions, ctx_sum);
  s.row_exact = true;
  return s;
}

StepShape extend_shape(int32_t requests, int32_t positions, int64_t ctx_sum) {
  StepShape s = decode_shape(requests, positions, ctx_sum);
  s.row_exact = true;
  s.kv_pass = true;
  return s;
}

LaunchWork launch_work(Phase phase, int32_t requests, int32_t q_tokens, int64_t ctx_sum,
                       int32_t draft_passes, int64_t moe_tokens) {
  const int32_t rows = batch_bucket(requests);
  switch (phase) {
    case Phase::kDecode:
      return {false, decode_shape(rows, q_tokens, ctx_sum), 1};
    case Phase::kDraft:
      return {true, decode_shape(rows, 1, ctx_sum), std::max(0, draft_passes)};
    case Phase::kVerify: {
      LaunchWork w{false, verify_shape(rows, q_tokens, ctx_sum), 1};
      w.shape.moe_tokens = moe_tokens;
      return w;
    }
    case Phase::kExtend:
      return {true, extend_shape(rows, q_tokens, ctx_sum), 1};
    case Phase::kPrefill:
      break;
  }
  throw Error("launch_work: prefill is not a decode-phase launch");
}

int32_t prefill_attention_chunk(int32_t q_heads, int32_t kv_heads) {
  const int32_t group = kv_heads > 0 ? std::max(1, q_heads / kv_heads) : 1;
  return std::min(16, std::max(1, 64 / group));
}

int64_t prefill_chunk_keys(int64_t attn_pairs, int64_t tokens, int32_t chunk) {
  assert(chunk >= 1 && attn_pairs >= 0 && tokens >= 0);
  const int64_t twice = 2 * attn_pairs + tokens * (chunk - 1);
  return (twice + 2 * chunk - 1) / (2 * chunk);
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

int64_t StepKernels::bytes_read() const {
  int64_t n = 0;
  for (const LayerRun& r : runs)
    for (int32_t i = r.first; i < r.first + r.count; ++i) {
      const KernelDesc& k = kernels[static_cast<size_t>(i)];
      if (k.cls != KernelClass::kCollective) n += int64_t{r.repeat} * k.bytes_read;
    }
  return n;
}

StepShape dp_rank_shape(const StepShape& shape, int32_t width, int32_t index) {
  const int64_t r = shape.requests;
  // Requests index, index + width, ...: c(i) of them go to indices below i.
  auto below = [&](int64_t i) { return i * (r / width) + std::min<int64_t>(i, r % width); };
  const int64_t lo = below(index), hi = below(index + 1);
  auto part = [&](int64_t x) { return r == 0 ? 0 : mul_div(x, hi, r) - mul_div(x, lo, r); };
  StepShape s;
  s.requests = static_cast<int32_t>(hi - lo);
  s.tokens = part(shape.tokens);
  s.ctx_tokens = part(shape.ctx_tokens);
  s.attn_pairs = part(shape.attn_pairs);
  s.lm_head_all_tokens = shape.lm_head_all_tokens;
  s.row_exact = shape.row_exact;
  s.kv_pass = shape.kv_pass;
  if (shape.finishing_requests >= 0) {
    s.finishing_requests = static_cast<int32_t>(part(shape.finishing_requests));
  }
  return s;
}

void step_kernels(const ModelSpec& m, const StepShape& s, StepKernels& out) {
  step_kernels(m, s, LayoutSpec{}, 0, out);
}

namespace {

// Rank `rank`'s view of a step of `shape` (the rules in step_kernels' header). Throws ConfigError
// for an invalid layout or a rank outside [0, world).
struct RankView {
  int32_t w, stage, index;
  AttnSharding attn;
  bool cp_prefill;
  StepShape own;  // the shape its attention, norms and dense projections see
};

RankView rank_view(const ModelSpec& m, const StepShape& shape, const LayoutSpec& l, int32_t rank) {
  validate_layout(m, l);
  if (rank < 0 || rank >= l.world())
    throw ConfigError("", "rank " + std::to_string(rank) + " outside layout " + layout_name(l));
  RankView v;
  v.w = l.width();
  v.stage = rank / v.w;
  v.index = rank % v.w;
  v.attn = attention_sharding(l);
  v.cp_prefill = v.attn == AttnSharding::kCp && v.w > 1 && !shape.lm_head_all_tokens &&
                 !has_linear_attention(m);
  v.own = v.attn == AttnSharding::kDp ? dp_rank_shape(shape, v.w, v.index)
          : v.cp_prefill              ? cp_prefill_shape(shape, v.w, v.index)
                                      : shape;
  return v;
}

}  // namespace

void layer_kernels(const ModelSpec& m, const StepShape& shape, const LayoutSpec& l, int32_t rank,
                   int32_t layer, const ExpertShare& routing, std::vector<KernelDesc>& out) {
  const RankView v = rank_view(m, shape, l, rank);
  const StageLayers sl = stage_layers(static_cast<int32_t>(m.layers.size()), l.pp, v.stage);
  if (layer < sl.first || layer >= sl.first + sl.count)
    throw ConfigError("", "layer " + std::to_string(layer) + " is not on rank " +
                              std::to_string(rank) + " of layout " + layout_name(l));
  thread_local StepKernels sk;
  sk.kernels.clear();
  sk.runs.clear();
  Emitter e{sk, m, l, shape, v.own, v.w, v.index, v.attn, moe_sharding(l)};
  e.cp_prefill = v.cp_prefill;
  e.carry_norms = step_carries_norms(m, v.own);
  e.layer = layer;
  e.routing = &routing;
  const LayerSpec& spec = m.layers[size_t(layer)];
  const LayerShard sh = layer_shard(spec, l, v.index);
  emit_attention(e, spec, sh);
  emit_mlp(e, spec, sh);
  out.assign(sk.kernels.begin(), sk.kernels.end());
}

void step_kernels(const ModelSpec& m, const StepShape& shape, const LayoutSpec& l, int32_t rank,
                  StepKernels& out, std::optional<uint64_t> pass_key) {
  const RankView v = rank_view(m, shape, l, rank);
  out.kernels.clear();
  out.runs.clear();
  const int32_t w = v.w;
  const int32_t stage = v.stage;
  const int32_t index = v.index;
  const AttnSharding attn = v.attn;
  const bool cp_prefill = v.cp_prefill;
  const StepShape& own = v.own;
  Emitter e{out, m, l, shape, own, w, index, attn, moe_sharding(l)};
  e.cp_prefill = cp_prefill;
  e.carry_norms = step_carries_norms(m, own);
  const int64_t h = m.hidden;
  const int64_t vocab_rows = l.vocab_parallel ? balanced_share(m.vocab, w, index) : m.vocab;
  const bool dp = attn == AttnSharding::kDp;
  // Token slices (DP requests, CP prefill queries) meet again for the vocab-parallel lm_head.
  const bool sliced = dp || cp_prefill;

  if (stage == 0) {
    // Vocab-parallel embedding: every rank looks up the stage's tokens in its rows, the partial
    // rows are summed. Under DP the token ids are gathered first.
    if (dp)
      e.coll("embedding_ids_gather", CollectiveKind::kAllGather, own.tokens * kIdBytes,
             shape.tokens * kIdBytes);
    e.add("embedding", KernelClass::kEmbedding,
          mul_div(shape.tokens * h * m.weight_bytes, vocab_rows, m.vocab) + shape.tokens * kIdBytes,
          shape.tokens * h * kActBytes, 0);
    if (l.vocab_parallel) e.all_reduce("embedding_all_reduce", shape.tokens * h * kActBytes);
    if (m.mtp_input_proj) {
      e.norm("enorm", h, /*residual=*/false);
      e.norm("hnorm", h, /*residual=*/false);
      e.gemm("eh_proj", 2 * h, h);
    }
  } else {
    // Hidden state and residual from the previous stage.
    out.kernels.push_back({"pp_recv", KernelClass::kCollective, 0, 2 * own.tokens * h * kActBytes,
                           0, CollectiveKind::kSendRecv, stage - 1});
  }
  out.runs.push_back({1, 0, static_cast<int32_t>(out.kernels.size())});

  const StageLayers sl = stage_layers(static_cast<int32_t>(m.layers.size()), l.pp, stage);
  // Drawn expert placement: every MoE layer routes differently, so it is a run of its own.
  const bool drawn = pass_key.has_value() && e.moe == MoeSharding::kEp &&
                     (l.expert_load.kind != ExpertLoad::Kind::kUniform || l.expert_load.sampled);
  std::vector<double> placed;
  size_t i = static_cast<size_t>(sl.first);
  const size_t end = static_cast<size_t>(sl.first + sl.count);
  while (i < end) {
    const bool own_run = drawn && m.layers[i].mlp.kind == MlpKind::kMoe;
    // Carried norms: the first layer keeps an attn_norm kernel (its sums of squares).
    const bool alone = own_run || (e.carry_norms && i == 0);
    size_t j = i + 1;
    while (!alone && j < end && same_layer(m.layers[i], m.layers[j])) ++j;
    const auto first = static_cast<int32_t>(out.kernels.size());
    const LayerShard sh = layer_shard(m.layers[i], l, index);
    if (own_run) {
      const MlpSpec& p = m.layers[i].mlp;
      placed = placed_expert_probabilities(l.expert_load, p.num_experts, p.top_k, *pass_key,
                                           static_cast<int32_t>(i));
    }
    e.placed = own_run ? &placed : nullptr;
    e.pass_key = pass_key.value_or(0);
    e.layer = static_cast<int32_t>(i);
    emit_attention(e, m.layers[i], sh);
    // The extend's KV pass stops after a GQA layer's KV append (emit_attention).
    if (!(own.kv_pass && m.layers[i].attn.kind == AttentionKind::kGqa))
      emit_mlp(e, m.layers[i], sh);
    out.runs.push_back(
        {static_cast<int32_t>(j - i), first, static_cast<int32_t>(out.kernels.size()) - first});
    i = j;
  }

  const auto first = static_cast<int32_t>(out.kernels.size());
  if (own.kv_pass) {
    // The extend computes no logits.
  } else if (stage < l.pp - 1) {
    out.kernels.push_back({"pp_send", KernelClass::kCollective, 2 * own.tokens * h * kActBytes, 0,
                           0, CollectiveKind::kSendRecv, stage + 1});
  } else {
    const int64_t own_rows = logit_rows(own);
    const int64_t stage_rows = logit_rows(shape);
    e.norm("final_norm", h, /*residual=*/true);
    if (sliced)
      e.coll("lm_head_hidden_gather", CollectiveKind::kAllGather, own_rows * h * kActBytes,
             stage_rows * h * kActBytes);
    const int64_t rows = sliced ? stage_rows : own_rows;
    // LM head with the greedy argmax fused: logits never reach memory; one token id plus its
    // probability per row are written. Vocab-parallel ranks then all-gather their local
    // (argmax, value) pairs: rows · 8 B each, instead of rows · vocab/width logits.
    // Row-exact (verify): one launch per kGemvRowsPerLaunch rows, each reading the whole head.
    for (int64_t done = 0; done < std::max<int64_t>(rows, 1); done += e.row_chunk(rows)) {
      const int64_t r = std::min(rows - done, e.row_chunk(rows));
      e.add("lm_head", KernelClass::kLmHead, vocab_rows * h * m.weight_bytes + r * h * kActBytes,
            r * kArgmaxBytes, 2 * r * h * vocab_rows);
      out.kernels.back().rows = Emitter::rows_of(r);
    }
    if (l.vocab_parallel)
      e.coll("argmax_gather", CollectiveKind::kAllGather, rows * kArgmaxBytes,
             w * rows * kArgmaxBytes);
  }
  out.runs.push_back({1, first, static_cast<int32_t>(out.kernels.size()) - first});
}

void decode_microbatch_shapes(const LayoutSpec& l, std::span<const int64_t> ctx, int32_t q_tokens,
                              std::vector<StepShape>& out) {
  out.clear();
  const auto n = static_cast<int32_t>(ctx.size());
  const int32_t m = decode_microbatches(l, n);
  size_t next = 0;
  for (int32_t j = 0; j < m; ++j) {
    const auto count = static_cast<int32_t>(balanced_share(n, m, j));
    int64_t sum = 0;
    for (int32_t i = 0; i < count; ++i) sum += ctx[next++];
    out.push_back(decode_shape(count, q_tokens, sum));
  }
}

void prefill_microbatch_shapes(const LayoutSpec& l, std::span<const int64_t> prompt_lens,
                               std::vector<StepShape>& out) {
  out.clear();
  int64_t total = 0;
  for (int64_t len : prompt_lens) total += len;
  const int64_t chunk = prefill_chunk_tokens(l, total);
  StepShape s = prefill_shape(0, 0, 0);
  s.finishing_requests = 0;
  for (int64_t len : prompt_lens) {
    int64_t done = 0;  // tokens of this prompt already placed in chunks
    while (done < len) {
      const int64_t q = std::min(len - done, chunk - s.tokens);
      s.requests += 1;
      s.tokens += q;
      s.ctx_tokens += done;
      s.attn_pairs += q * done + q * (q + 1) / 2;
      done += q;
      if (done == len) s.finishing_requests += 1;
      if (s.tokens == chunk) {
        out.push_back(s);
        s = prefill_shape(0, 0, 0);
        s.finishing_requests = 0;
      }
    }
  }
  if (s.tokens > 0) out.push_back(s);
}

bool pipeline_ids_kernel(const LayoutSpec& l, int32_t rank, std::span<const StepShape> microbatches,
                         KernelDesc& out) {
  const int32_t w = l.width();
  const int32_t stage = rank / w;
  if (l.pp <= 1 || (stage != 0 && stage != l.pp - 1)) return false;
  const bool dp = attention_sharding(l) == AttnSharding::kDp;
  int64_t rows = 0;
  for (const StepShape& s : microbatches) {
    rows += logit_rows(dp ? dp_rank_shape(s, w, rank % w) : s);
  }
  out = ids_transfer(l, stage, rows);
  return true;
}

void draft_module_kernels(const ModelSpec& draft, const StepShape& shape, const LayoutSpec& layout,
                          int32_t rank, StepKernels& out, std::optional<uint64_t> pass_key) {
  if (layout.pp <= 1) {
    step_kernels(draft, shape, layout, rank, out, pass_key);
    return;
  }
  LayoutSpec degrees;  // the stage's degrees alone (no pipeline), dtypes and loads default
  degrees.tp = layout.tp;
  degrees.dp = layout.dp;
  degrees.ep = layout.ep;
  degrees.cp = layout.cp;
  validate_layout(draft, degrees);
  if (rank < 0 || rank >= layout.world())
    throw ConfigError("",
                      "rank " + std::to_string(rank) + " outside layout " + layout_name(layout));
  const int32_t w = layout.width();
  out.kernels.clear();
  out.runs.clear();
  if (rank / w != layout.pp - 1) return;
  LayoutSpec one_stage = layout;
  one_stage.pp = 1;
  one_stage.microbatches = 0;
  one_stage.prefill_chunk_tokens = 0;
  step_kernels(draft, shape, one_stage, rank % w, out, pass_key);
}

void pipeline_step_kernels(const ModelSpec& model, std::span<const StepShape> microbatches,
                           const LayoutSpec& layout, int32_t rank, StepKernels& out,
                           std::optional<uint64_t> pass_key) {
  out.kernels.clear();
  out.runs.clear();
  StepKernels one;
  for (size_t j = 0; j < microbatches.size(); ++j) {
    std::optional<uint64_t> key;
    if (pass_key) key = splitmix64(*pass_key + j);
    step_kernels(model, microbatches[j], layout, rank, one, key);
    const auto offset = static_cast<int32_t>(out.kernels.size());
    out.kernels.insert(out.kernels.end(), one.kernels.begin(), one.kernels.end());
    for (LayerRun r : one.runs) {
      r.first += offset;
      out.runs.push_back(r);
    }
  }
  KernelDesc ids{};
  if (pipeline_ids_kernel(layout, rank, microbatches, ids)) {
    out.runs.push_back({1, static_cast<int32_t>(out.kernels.size()), 1});
    out.kernels.push_back(ids);
  }
}

void add_sampled_routing(const ModelSpec& model, std::span<const StepShape> microbatches,
                         const LayoutSpec& layout, int32_t rank, uint64_t pass_key,
                         MoeRoutingStats& out) {
  if (layout.ep <= 1 || !layout.expert_load.sampled) return;
  const StageLayers sl =
      stage_layers(static_cast<int32_t>(model.layers.size()), layout.pp, rank / layout.width());
  std::vector<int32_t> ids;
  for (size_t j = 0; j < microbatches.size(); ++j) {
    const uint64_t key = splitmix64(pass_key + j);  // as pipeline_step_kernels keys microbatch j
    for (int32_t i = sl.first; i < sl.first + sl.count; ++i) {
      const MlpSpec& p = model.layers[size_t(i)].mlp;
      if (p.kind != MlpKind::kMoe) continue;
      // As step_kernels: the placed shares of (key, layer), the stage's tokens routed.
      const std::vector<double> placed =
          placed_expert_probabilities(layout.expert_load, p.num_experts, p.top_k, key, i);
      // Routed tokens as step_kernels counts them: a verify's padded positions route nowhere.
      const StepShape& mb = microbatches[j];
      const int64_t tokens = mb.moe_tokens >= 0 && mb.tokens > 0 ? mb.moe_tokens : mb.tokens;
      sampled_routing(placed, p, tokens, layout.expert_load.seed, key, i, ids);
      add_moe_routing(out, i, ids, std::min(p.top_k, p.num_experts), p.num_experts, layout.ep);
    }
  }
}

}  // namespace twinstep
