#include "policies/step_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "policies/calibration_model.h"
#include "policies/error.h"

namespace twinstep {
namespace {

int64_t total_read(const StepKernels& s) {
  int64_t n = 0;
  for (const LayerRun& r : s.runs)
    for (int32_t i = r.first; i < r.first + r.count; ++i) n += r.repeat * s.kernels[i].bytes_read;
  return n;
}

const KernelDesc* find(const StepKernels& s, const char* name) {
  for (const KernelDesc& k : s.kernels)
    if (std::strcmp(k.name, name) == 0) return &k;
  return nullptr;
}

TEST(StepKernels, Llama8bDecodeReadsEveryWeightOnce) {
  const ModelSpec& m = model_preset("llama-3-8b");
  StepKernels s;
  step_kernels(m, decode_shape(1, 1, 0), s);
  // Every parameter but the embedding table is read once (2 B each), plus one embedding row:
  // (8,030,261,248 − 525,336,576) · 2 = 15,009,849,344 B. Activations read add about 170 KB per
  // layer (the SwiGLU input alone is 2·14336·2 B), under 8 MB in all.
  const int64_t weights = (8'030'261'248 - 525'336'576) * 2;
  EXPECT_GE(total_read(s), weights);
  EXPECT_LT(total_read(s), weights + 8'000'000);
  // Prologue, one run of 32 identical layers, epilogue.
  ASSERT_EQ(s.runs.size(), 3u);
  EXPECT_EQ(s.runs[1].repeat, 32);
  EXPECT_EQ(s.node_count(), 1 + 32 * 10 + 2);
}

// launch_work, hand-worked: the bucket's rows (3 requests -> 4), the module and the passes per
// phase; the verify's and the extend's row-exact (and KV-pass) shapes.
TEST(StepKernels, LaunchWorkPerPhase) {
  const LaunchWork decode = launch_work(Phase::kDecode, 3, 1, 300);
  EXPECT_FALSE(decode.draft_module);
  EXPECT_EQ(decode.passes, 1);
  EXPECT_EQ(decode.shape.requests, 4);
  EXPECT_EQ(decode.shape.tokens, 4);
  EXPECT_EQ(decode.shape.ctx_tokens, 300);
  EXPECT_EQ(decode.shape.attn_pairs, 300 + 4);  // q·ctx + requests·q(q+1)/2
  EXPECT_FALSE(decode.shape.row_exact);

  const LaunchWork draft = launch_work(Phase::kDraft, 5, 6, 1000, 4);
  EXPECT_TRUE(draft.draft_module);
  EXPECT_EQ(draft.passes, 4);
  EXPECT_EQ(draft.shape.requests, 8);
  EXPECT_EQ(draft.shape.tokens, 8);  // one position per forward
  EXPECT_FALSE(draft.shape.row_exact);
  EXPECT_EQ(launch_work(Phase::kDraft, 1, 6, 0, -2).passes, 0);

  const LaunchWork verify = launch_work(Phase::kVerify, 2, 6, 1000, 0, 9);
  EXPECT_FALSE(verify.draft_module);
  EXPECT_EQ(verify.passes, 1);
  EXPECT_EQ(verify.shape.requests, 2);
  EXPECT_EQ(verify.shape.tokens, 12);
  EXPECT_EQ(verify.shape.attn_pairs, 6 * 1000 + 2 * 6 * 7 / 2);
  EXPECT_EQ(verify.shape.moe_tokens, 9);
  EXPECT_TRUE(verify.shape.row_exact);
  EXPECT_FALSE(verify.shape.kv_pass);
  EXPECT_EQ(launch_work(Phase::kVerify, 2, 6, 1000).shape.moe_tokens, -1);

  const LaunchWork extend = launch_work(Phase::kExtend, 1, 6, 50);
  EXPECT_TRUE(extend.draft_module);
  EXPECT_EQ(extend.shape.tokens, 6);
  EXPECT_TRUE(extend.shape.row_exact);
  EXPECT_TRUE(extend.shape.kv_pass);

  EXPECT_THROW(launch_work(Phase::kPrefill, 1, 1, 0), Error);
  // The shapes are decode_shape's but for the speculative flags.
  const StepShape v = verify_shape(3, 4, 77), d = decode_shape(3, 4, 77);
  EXPECT_EQ(v.tokens, d.tokens);
  EXPECT_EQ(v.attn_pairs, d.attn_pairs);
}

// The kernels of every layer, flattened in execution order (runs repeated).
std::vector<std::string> flat_names(const StepKernels& s) {
  std::vector<std::string> names;
  for (const LayerRun& r : s.runs)
    for (int32_t rep = 0; rep < r.repeat; ++rep)
      for (int32_t i = r.first; i < r.first + r.count; ++i) names.push_back(s.kernels[i].name);
  return names;
}

int64_t count(const std::vector<std::string>& names, const char* name) {
  return std::count(names.begin(), names.end(), std::string(name));
}

// Llama-3-8B's decode step at batch 1 (context 1000) without fusion and with `fusion`.
struct PlainAndFused {
  ModelSpec model;
  StepKernels plain, fused;
  explicit PlainAndFused(KernelFusion fusion) : model(model_preset("llama-3-8b")) {
    step_kernels(model, decode_shape(1, 1, 1000), plain);
    model.fusion = fusion;
    step_kernels(model, decode_shape(1, 1, 1000), fused);
  }
};

// KernelFusion::norms (the runtime's fused_norms): Llama-3-8B decode at batch 1 runs one attn_norm
// (the first layer's, writing the rows' tile sums of squares: 4096 x 2 B read, 256 x 4 B written)
// and no mlp_norm; o_proj and down_proj read the residual row too (+4096 x 2 B each); everything
// else as without. 32 layers x 2 norms - 1 = 63 kernels fewer, the first layer a run of its own.
// Prefill, decode of more than 16 rows and the extend keep the norms; a verify of 48 rows
// (row-exact) carries them.
TEST(StepKernels, FusedNormsDropTheNormsOfCarriedSteps) {
  const PlainAndFused steps(KernelFusion{.norms = true});
  const ModelSpec& m = steps.model;
  const StepKernels &plain = steps.plain, &fused = steps.fused;
  EXPECT_EQ(fused.node_count(), plain.node_count() - 63);
  ASSERT_EQ(fused.runs.size(), 4u);  // prologue, layer 0, layers 1-31, epilogue
  EXPECT_EQ(fused.runs[1].repeat, 1);
  EXPECT_EQ(fused.runs[2].repeat, 31);
  const std::vector<std::string> names = flat_names(fused);
  EXPECT_EQ(count(names, "attn_norm"), 1);
  EXPECT_EQ(count(names, "mlp_norm"), 0);
  EXPECT_EQ(count(names, "final_norm"), 1);
  EXPECT_EQ(names[1], "attn_norm");  // after the embedding
  const KernelDesc* sq = find(fused, "attn_norm");
  ASSERT_NE(sq, nullptr);
  EXPECT_EQ(sq->bytes_read, 4096 * 2);
  EXPECT_EQ(sq->bytes_written, 256 * 4);
  EXPECT_EQ(find(fused, "o_proj")->bytes_read, find(plain, "o_proj")->bytes_read + 4096 * 2);
  EXPECT_EQ(find(fused, "down_proj")->bytes_read, find(plain, "down_proj")->bytes_read + 4096 * 2);
  EXPECT_EQ(find(fused, "qkv_proj")->bytes_read, find(plain, "qkv_proj")->bytes_read);
  // Bytes: the norms' (2 x 32 of them, each 2 x 4096 x 2 B in + 4096 x 2 B weight) out, the
  // sums' kernel and the residual reads (2 x 32 x 4096 x 2 B) in.
  const KernelDesc* norm = find(plain, "mlp_norm");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->bytes_read, 2 * 4096 * 2 + 4096 * 2);
  EXPECT_EQ(total_read(fused),
            total_read(plain) - 64 * norm->bytes_read + 4096 * 2 + 64 * 4096 * 2);

  StepKernels kept;
  for (const StepShape& shape : {decode_shape(32, 1, 32 * 1000), prefill_shape(1, 64, 64 * 64)}) {
    step_kernels(m, shape, kept);
    const std::vector<std::string> n = flat_names(kept);
    EXPECT_EQ(count(n, "attn_norm"), 32) << shape.tokens << " tokens";
    EXPECT_EQ(count(n, "mlp_norm"), 32) << shape.tokens << " tokens";
  }
  StepShape verify = decode_shape(4, 12, 4 * 1000);
  verify.row_exact = true;
  step_kernels(m, verify, kept);
  EXPECT_EQ(count(flat_names(kept), "mlp_norm"), 0);
  EXPECT_TRUE(step_carries_norms(m, verify));
  StepShape extend = verify;
  extend.kv_pass = true;
  EXPECT_FALSE(step_carries_norms(m, extend));
  EXPECT_FALSE(nextn_draft(m).fusion.any());  // the draft module never fuses
}

// KernelFusion::rope: no rope or kv_append kernel; the attention reads the new k and v rows and
// writes them into the cache instead (1 token, 8 KV heads x 128: 2 x 1024 x 2 B each way).
TEST(StepKernels, FusedRopeMovesRopeAndAppendIntoTheAttention) {
  const PlainAndFused steps(KernelFusion{.rope = true});
  const StepKernels &plain = steps.plain, &fused = steps.fused;
  EXPECT_EQ(fused.node_count(), plain.node_count() - 64);
  EXPECT_EQ(find(fused, "rope"), nullptr);
  EXPECT_EQ(find(fused, "kv_append"), nullptr);
  const KernelDesc* a = find(fused, "attention");
  const KernelDesc* b = find(plain, "attention");
  EXPECT_EQ(a->bytes_read, b->bytes_read + 2 * 1024 * 2);
  EXPECT_EQ(a->bytes_written, b->bytes_written + 2 * 1024 * 2);
  EXPECT_EQ(a->flops, b->flops + 6 * (4096 + 1024));
  // Prefill keeps them (Engine::prefill_pass runs rope_kv_append, then the attention).
  StepKernels prefill;
  step_kernels(steps.model, prefill_shape(1, 64, 64 * 64), prefill);
  EXPECT_NE(find(prefill, "rope"), nullptr);
  EXPECT_NE(find(prefill, "kv_append"), nullptr);
}

// A row-exact verify (StepShape::row_exact) of 4 requests x 12 positions = 48 rows runs each
// projection and the LM head as 3 launches of 16 rows, each reading the whole weight: qkv_proj
// 3 x (4096 x 6144 x 2 B + 16 x 4096 x 2 B in), 16 rows of FLOPs each; the same step without the
// flag is one launch of 48 rows. Everything else is unchanged.
TEST(StepKernels, RowExactProjectionsLaunchPerSixteenRows) {
  const ModelSpec& m = model_preset("llama-3-8b");
  StepShape shape = decode_shape(4, 12, 4 * 1000);
  StepKernels one, exact;
  step_kernels(m, shape, one);
  shape.row_exact = true;
  step_kernels(m, shape, exact);
  int qkv = 0, heads = 0;
  for (const KernelDesc& k : exact.kernels) {
    if (std::strcmp(k.name, "qkv_proj") == 0) {
      ++qkv;
      EXPECT_EQ(k.rows, 16);
      EXPECT_EQ(k.bytes_read, int64_t{4096} * 6144 * 2 + 16 * 4096 * 2);
      EXPECT_EQ(k.flops, int64_t{2} * 16 * 4096 * 6144);
    }
    if (std::strcmp(k.name, "lm_head") == 0) {
      ++heads;
      EXPECT_EQ(k.rows, 16);
      EXPECT_EQ(k.bytes_read, int64_t{128256} * 4096 * 2 + 16 * 4096 * 2);
    }
  }
  EXPECT_EQ(qkv, 3);  // one layer's run, repeated 32 times
  EXPECT_EQ(heads, 3);
  EXPECT_EQ(find(one, "qkv_proj")->rows, 48);
  // 4 projections per layer and the LM head: 2 more launches each.
  EXPECT_EQ(exact.node_count(), one.node_count() + 2 * (32 * 4 + 1));
  // The attention is not a projection: unchanged.
  EXPECT_EQ(find(one, "attention")->bytes_read, find(exact, "attention")->bytes_read);
  // At 16 rows or fewer the flag changes nothing.
  StepShape small = decode_shape(2, 8, 2 * 1000);
  StepKernels a, b;
  step_kernels(m, small, a);
  small.row_exact = true;
  step_kernels(m, small, b);
  EXPECT_EQ(a.node_count(), b.node_count());
  EXPECT_EQ(total_read(a), total_read(b));
}

// Decode-like attention counts its requests as its rows (the decode fit's domain,
// HardwareSpec::kernel_fit_max_rows): a verify of 32 requests x 6 positions is a 32-request
// decode launch, not 192 rows; a prefill's chunked attention keeps its token rows.
TEST(StepKernels, DecodeLikeAttentionRowsAreItsRequests) {
  const ModelSpec& m = model_preset("llama-3-8b");
  StepKernels s;
  step_kernels(m, decode_shape(32, 6, 32 * 8000), s);
  EXPECT_EQ(find(s, "attention")->rows, 32);
  EXPECT_EQ(find(s, "qkv_proj")->rows, 192);
  step_kernels(m, decode_shape(5, 1, 5 * 100), s);
  EXPECT_EQ(find(s, "attention")->rows, 5);
  step_kernels(m, prefill_shape(2, 2048, 2 * 1024 * 1024), s);
  EXPECT_EQ(find(s, "attention")->rows, 2048);
}

// The extend's KV pass (StepShape::kv_pass) on the NEXTN draft: embedding, enorm, hnorm,
// eh_proj, then the layer's attn_norm, qkv_proj, rope, kv_append (Engine::draft_kv), no
// attention, o_proj, MLP, final norm or LM head.
TEST(StepKernels, KvPassStopsAtTheKvAppend) {
  const ModelSpec draft = nextn_draft(model_preset("llama-3-8b"));
  StepShape shape = decode_shape(1, 6, 1000);
  shape.kv_pass = true;
  StepKernels s;
  step_kernels(draft, shape, s);
  std::vector<std::string> names;
  for (const LayerRun& r : s.runs)
    for (int32_t i = r.first; i < r.first + r.count; ++i) names.push_back(s.kernels[i].name);
  EXPECT_EQ(names, (std::vector<std::string>{"embedding", "enorm", "hnorm", "eh_proj", "attn_norm",
                                             "qkv_proj", "rope", "kv_append"}));
}

// bytes_read(): what a step's sample counts on both backends (the real backend from its engine's
// shard). One GPU: every kernel (no collectives). Rank 0 of TP2 (the runtime's layout:
// calibration_layout): the layers' projections halved, their two norms, the embedding row and the
// LM head whole, by hand (Llama-3-8B: per layer 218,112,000 parameters of which 8192 in norms,
// LM head 525,336,576, final norm 4096, one embedding row 4096, all 2 B); its all-reduces'
// bytes are not counted.
TEST(StepKernels, BytesReadIsTheRanksComputeKernels) {
  const ModelSpec& m = model_preset("llama-3-8b");
  StepKernels one, tp2;
  step_kernels(m, decode_shape(1, 1, 0), one);
  EXPECT_EQ(one.bytes_read(), total_read(one));
  step_kernels(m, decode_shape(1, 1, 0), calibration_layout(m, 2), 0, tp2);
  int64_t compute = 0, collectives = 0;
  for (const LayerRun& r : tp2.runs)
    for (int32_t i = r.first; i < r.first + r.count; ++i) {
      const KernelDesc& k = tp2.kernels[size_t(i)];
      (k.cls == KernelClass::kCollective ? collectives : compute) += r.repeat * k.bytes_read;
    }
  EXPECT_EQ(tp2.bytes_read(), compute);
  EXPECT_EQ(collectives, total_read(tp2) - compute);
  const int64_t weights =
      (int64_t{32} * ((218'112'000 - 8192) / 2 + 8192) + 525'336'576 + 4096 + 4096) * 2;
  EXPECT_GE(tp2.bytes_read(), weights);
  EXPECT_LT(tp2.bytes_read(), weights + 8'000'000);  // activations, as above
}

TEST(StepKernels, AttentionBytesGrowByKvPerToken) {
  const ModelSpec& m = model_preset("llama-3-8b");
  StepKernels a, b;
  step_kernels(m, decode_shape(1, 1, 0), a);
  step_kernels(m, decode_shape(1, 1, 8192), b);
  // 8192 more cached tokens · 131,072 B per token (all layers).
  EXPECT_EQ(total_read(b) - total_read(a), 8192LL * 131072);
  // One layer's attention at context 8192 with one query: KV (8192 + 1) · 4096 B, q 32·128·2 B.
  EXPECT_EQ(find(b, "attention")->bytes_read, 8193LL * 4096 + 4096 * 2);
  // FLOPs: 4 · pairs · q_dim, pairs = 8192 + 1.
  EXPECT_EQ(find(b, "attention")->flops, 4LL * 8193 * 4096);
}

TEST(StepKernels, VerifyCausalPairs) {
  // 6 verify positions after 100 cached tokens: 6·100 + 6·7/2 = 621 pairs.
  const StepShape s = decode_shape(1, 6, 100);
  EXPECT_EQ(s.tokens, 6);
  EXPECT_EQ(s.attn_pairs, 621);
  // Batch of 3 with one token each and contexts summing to 300: 300 + 3 pairs.
  EXPECT_EQ(decode_shape(3, 1, 300).attn_pairs, 303);
}

TEST(StepKernels, MoeReadsOnlySelectedExperts) {
  const ModelSpec& m = model_preset("qwen3-30b-a3b");
  StepKernels one, many;
  step_kernels(m, decode_shape(1, 1, 0), one);
  // One token hits exactly top_k = 8 experts: gate+up 8·2048·2·768·2 B of weights plus 8 routed
  // copies of the 2048-wide activation (2 B each).
  EXPECT_EQ(find(one, "moe_gate_up")->bytes_read, 8LL * 2048 * 2 * 768 * 2 + 8LL * 2048 * 2);
  // 1024 tokens hit all 128 experts (1 − (1 − 8/128)^1024 rounds to 1).
  step_kernels(m, decode_shape(1024, 1, 0), many);
  EXPECT_EQ(find(many, "moe_down")->bytes_read, 128LL * 768 * 2048 * 2 + 1024LL * 8 * 768 * 2);
}

// A verify of width 8 whose request drafted 2 tokens: the runtime routes 3 positions through the
// experts (kernels/moe.h active_rows), so the experts cost what 3 tokens' do and the combine reads
// 3 tokens' routed copies; the router and the attention still see all 8 rows. A dense model's
// price does not change.
TEST(StepKernels, VerifyPaddingRoutesThroughNoExpert) {
  const ModelSpec& m = model_preset("qwen3-30b-a3b");
  StepKernels padded, three, full;
  StepShape shape = decode_shape(1, 8, 1000);
  step_kernels(m, shape, full);
  shape.moe_tokens = 3;
  step_kernels(m, shape, padded);
  step_kernels(m, decode_shape(1, 3, 1000), three);
  for (const char* name : {"moe_gate_up", "moe_down"}) {
    EXPECT_EQ(find(padded, name)->bytes_read, find(three, name)->bytes_read) << name;
    EXPECT_EQ(find(padded, name)->flops, find(three, name)->flops) << name;
    EXPECT_LT(find(padded, name)->bytes_read, find(full, name)->bytes_read) << name;
  }
  // One token: its 8 experts' gate+up weights and its 8 routed activation copies, as above.
  shape.moe_tokens = 1;
  StepKernels one;
  step_kernels(m, shape, one);
  EXPECT_EQ(find(one, "moe_gate_up")->bytes_read, 8LL * 2048 * 2 * 768 * 2 + 8LL * 2048 * 2);
  EXPECT_LT(find(padded, "moe_combine")->bytes_read, find(full, "moe_combine")->bytes_read);
  for (const char* name : {"moe_router", "attention"}) {
    EXPECT_EQ(find(padded, name)->bytes_read, find(full, name)->bytes_read) << name;
    EXPECT_EQ(find(padded, name)->flops, find(full, name)->flops) << name;
  }
  const ModelSpec& dense = model_preset("llama-3-8b");
  StepKernels a, b;
  StepShape d = decode_shape(1, 8, 1000);
  step_kernels(dense, d, a);
  d.moe_tokens = 3;
  step_kernels(dense, d, b);
  EXPECT_EQ(total_read(a), total_read(b));
}

TEST(StepKernels, PrefillLogitsOnlyForLastToken) {
  const ModelSpec& m = model_preset("llama-3-8b");
  StepKernels s;
  step_kernels(m, prefill_shape(2, 200, 100 * 100 * 2), s);
  // Two prompts of 100: lm_head computes 2 rows, not 200.
  EXPECT_EQ(find(s, "lm_head")->flops, 2LL * 2 * 4096 * 128256);
  // Attention pairs Σ L(L+1)/2 = 2 · 5050.
  EXPECT_EQ(find(s, "attention")->flops, 4LL * 10100 * 4096);
}

// Every field of two kernel lists equal (names by content).
void expect_same_kernels(const std::vector<KernelDesc>& a, const KernelDesc* b, size_t n) {
  ASSERT_EQ(a.size(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_STREQ(a[i].name, b[i].name) << i;
    EXPECT_EQ(a[i].cls, b[i].cls) << a[i].name;
    EXPECT_EQ(a[i].bytes_read, b[i].bytes_read) << a[i].name;
    EXPECT_EQ(a[i].bytes_written, b[i].bytes_written) << a[i].name;
    EXPECT_EQ(a[i].flops, b[i].flops) << a[i].name;
    EXPECT_EQ(a[i].coll, b[i].coll) << a[i].name;
    EXPECT_EQ(a[i].group, b[i].group) << a[i].name;
    EXPECT_EQ(a[i].requests, b[i].requests) << a[i].name;
    EXPECT_EQ(a[i].gemv_n, b[i].gemv_n) << a[i].name;
    EXPECT_EQ(a[i].gemv_k, b[i].gemv_k) << a[i].name;
    EXPECT_EQ(a[i].rows, b[i].rows) << a[i].name;
  }
}

// The routing step_kernels prices (expected, uniform) given to layer_kernels: the kernels of
// step_kernels' run of that layer, collectives included, on one GPU, TP2-EP2 and DP2-EP2 ranks,
// and on the second stage of PP2-TP2-EP2.
TEST(LayerKernels, TheExpectedRoutingGivesTheStepsLayerRun) {
  const ModelSpec& m = model_preset("qwen3-30b-a3b");
  const MlpSpec& mlp = m.layers[0].mlp;
  struct Case {
    const char* layout;
    int32_t rank, layer;
  };
  for (const Case c : {Case{"TP1", 0, 0}, Case{"TP2-EP2", 0, 5}, Case{"TP2-EP2", 1, 47},
                       Case{"DP2-EP2", 1, 3}, Case{"PP2-TP2-EP2", 3, 30}}) {
    const LayoutSpec l = parse_layout(c.layout);
    for (const int32_t batch : {1, 4, 16}) {
      SCOPED_TRACE(std::string(c.layout) + " rank " + std::to_string(c.rank) + " batch " +
                   std::to_string(batch));
      const StepShape s = decode_shape(batch, 1, 1000 * batch);
      StepKernels sk;
      step_kernels(m, s, l, c.rank, sk);
      ASSERT_EQ(sk.runs.size(), 3u);  // every layer of the stage alike
      const int32_t index = c.rank % l.width();
      // EP (and TP1's whole layer): the routed copies of the stage's tokens.
      const ExpertShare expected =
          expert_share(l.expert_load, mlp, batch, l.ep, l.ep > 1 ? index : 0);
      std::vector<KernelDesc> got;
      layer_kernels(m, s, l, c.rank, c.layer, expected, got);
      expect_same_kernels(got, &sk.kernels[size_t(sk.runs[1].first)], size_t(sk.runs[1].count));
    }
  }
  // A layer of the other stage.
  std::vector<KernelDesc> got;
  EXPECT_THROW(layer_kernels(m, decode_shape(1, 1, 10), parse_layout("PP2-TP2-EP2"), 3, 3,
                             ExpertShare{}, got),
               ConfigError);
}

// One more distinct expert on the rank reads one more expert's weights, and nothing else
// changes: Qwen3-30B-A3B's expert is gate/up 2048 x 2·768 and down 768 x 2048 bf16,
// 6,291,456 + 3,145,728 B.
TEST(LayerKernels, EachDistinctExpertAddsOneExpertsWeightBytes) {
  const ModelSpec& m = model_preset("qwen3-30b-a3b");
  const LayoutSpec l = parse_layout("TP2-EP2");
  const StepShape s = decode_shape(2, 1, 2000);
  ExpertShare share{64, 16, 3};
  std::vector<KernelDesc> base, more;
  layer_kernels(m, s, l, 0, 9, share, base);
  ++share.distinct_experts;
  layer_kernels(m, s, l, 0, 9, share, more);
  ASSERT_EQ(base.size(), more.size());
  for (size_t i = 0; i < base.size(); ++i) {
    SCOPED_TRACE(base[i].name);
    const int64_t extra = std::strcmp(base[i].name, "moe_gate_up") == 0 ? 6'291'456
                          : std::strcmp(base[i].name, "moe_down") == 0  ? 3'145'728
                                                                        : 0;
    EXPECT_EQ(more[i].bytes_read - base[i].bytes_read, extra);
    EXPECT_EQ(more[i].bytes_written, base[i].bytes_written);
    EXPECT_EQ(more[i].flops, base[i].flops);
  }
  // 3 distinct experts, 16 routed copies (2 rows): gate_up reads 3 experts and 16 rows of 2048.
  for (const KernelDesc& k : base) {
    if (std::strcmp(k.name, "moe_gate_up") == 0) {
      EXPECT_EQ(k.bytes_read, 3 * 6'291'456 + 16 * 2048 * 2);
      EXPECT_EQ(k.flops, 2LL * 16 * 2048 * 2 * 768);
    }
  }
}

// A calibration shard label's measured rank is rank 0 of its layout: under qwen3-30b-a3b@tp2
// (ep 2) it holds experts [0, 64). One row's top-8 with experts 0, 5 and 63 below 64.
TEST(CalibrationRouting, ShardLabelCountsRankZerosBlock) {
  const std::vector<int32_t> ids = {0, 63, 64, 127, 5, 100, 70, 80};
  const ExpertShare shard = calibration_expert_share("qwen3-30b-a3b@tp2", 11, ids);
  EXPECT_EQ(shard.experts, 64);
  EXPECT_EQ(shard.routed_tokens, 3);
  EXPECT_EQ(shard.distinct_experts, 3);
  const ExpertShare whole = calibration_expert_share("qwen3-30b-a3b", 11, ids);
  EXPECT_EQ(whole.experts, 128);
  EXPECT_EQ(whole.routed_tokens, 8);
  EXPECT_EQ(whole.distinct_experts, 8);
  EXPECT_THROW(calibration_expert_share("llama-3-8b", 0, ids), ConfigError);
  // With the expected routing, the layer of calibration_step_kernels (no collectives).
  const ModelSpec& m = model_preset("qwen3-30b-a3b");
  for (const char* label : {"qwen3-30b-a3b", "qwen3-30b-a3b@tp2"}) {
    SCOPED_TRACE(label);
    const int32_t ep = std::strcmp(label, "qwen3-30b-a3b") == 0 ? 1 : 2;
    const StepShape s = decode_shape(4, 1, 4000);
    StepKernels sk;
    calibration_step_kernels(label, s, sk);
    std::vector<KernelDesc> got;
    calibration_layer_kernels(label, s, 20, expert_share(ExpertLoad{}, m.layers[0].mlp, 4, ep, 0),
                              got);
    for (const KernelDesc& k : got) EXPECT_NE(k.cls, KernelClass::kCollective) << k.name;
    expect_same_kernels(got, &sk.kernels[size_t(sk.runs[1].first)], size_t(sk.runs[1].count));
  }
}

}  // namespace
}  // namespace twinstep
