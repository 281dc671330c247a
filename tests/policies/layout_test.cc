#include "policies/layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>

#include "policies/error.h"
#include "policies/step_kernels.h"

namespace twinstep {
namespace {

constexpr int64_t kGiB = 1LL << 30;

int count(const StepKernels& s, size_t run, CollectiveKind kind) {
  int n = 0;
  const LayerRun& r = s.runs.at(run);
  for (int32_t i = r.first; i < r.first + r.count; ++i)
    if (s.kernels[size_t(i)].coll == kind) ++n;
  return n;
}

const KernelDesc* find(const StepKernels& s, const char* name) {
  for (const KernelDesc& k : s.kernels)
    if (std::strcmp(k.name, name) == 0) return &k;
  return nullptr;
}

int64_t compute_bytes_read(const StepKernels& s) {  // collectives excluded
  int64_t n = 0;
  for (const LayerRun& r : s.runs)
    for (int32_t i = r.first; i < r.first + r.count; ++i)
      if (s.kernels[size_t(i)].cls != KernelClass::kCollective)
        n += r.repeat * s.kernels[size_t(i)].bytes_read;
  return n;
}

RankMemory memory(const char* model, const char* layout, int32_t rank) {
  return rank_memory(model_preset(model), hardware_preset("h200"), parse_layout(layout), rank);
}

TEST(Layout, ParseAndName) {
  const LayoutSpec a = parse_layout("PP2-CP8-TP8");
  EXPECT_EQ(a.pp, 2);
  EXPECT_EQ(a.cp, 8);
  EXPECT_EQ(a.tp, 8);
  EXPECT_EQ(a.width(), 8);
  EXPECT_EQ(a.world(), 16);
  EXPECT_EQ(layout_name(a), "PP2-CP8-TP8");
  const LayoutSpec b = parse_layout("dp32-ep32");
  EXPECT_EQ(b.world(), 32);
  EXPECT_EQ(layout_name(b), "DP32-EP32");
  EXPECT_EQ(layout_name(LayoutSpec{}), "TP1");
  for (const char* bad : {"", "TP", "TP0", "XP2", "TP8-TP8", "TP8--PP2", "TP8x"})
    EXPECT_THROW(parse_layout(bad), ConfigError) << bad;
}

TEST(Layout, RejectsLayoutsOutsideTheRules) {
  const ModelSpec& q = model_preset("qwen3-30b-a3b");
  for (const char* bad : {"TP8-EP4", "EP4", "DP8-TP8", "DP4-CP4", "TP64"})
    EXPECT_THROW(validate_layout(q, parse_layout(bad)), ConfigError) << bad;
  EXPECT_THROW(validate_layout(model_preset("llama-3-8b"), parse_layout("DP2-EP2")), ConfigError);
  EXPECT_THROW(validate_layout(q, parse_layout("PP49")), ConfigError);  // 48 layers
  EXPECT_NO_THROW(validate_layout(q, parse_layout("TP4-EP4")));
  StepKernels k;
  EXPECT_THROW(step_kernels(q, decode_shape(1, 1, 0), parse_layout("TP2"), 2, k), ConfigError);
}

TEST(Layout, Dtypes) {
  // fp8: 1 B + one fp32 per 128×128 block; mxfp4: 32 values in 16 B + one 8-bit scale.
  EXPECT_EQ(weight_storage_bytes(Dtype::kFp8, 128 * 128 * 3), 3 * 16384 + 12);
  EXPECT_EQ(weight_storage_bytes(Dtype::kMxfp4, 64), 32 + 2);
  EXPECT_EQ(activation_storage_bytes(Dtype::kFp8, 7168), 7168 + 56 * 4);
  EXPECT_EQ(weight_storage_bytes(Dtype::kBf16, 10), 20);
}

TEST(Layout, SingleGpuKernelListUnchanged) {
  for (const std::string& name : model_preset_names()) {
    const ModelSpec& m = model_preset(name);
    for (const StepShape& s : {decode_shape(3, 6, 5000), prefill_shape(2, 300, 50000)}) {
      StepKernels a, b;
      step_kernels(m, s, a);
      step_kernels(m, s, LayoutSpec{}, 0, b);
      ASSERT_EQ(a.kernels.size(), b.kernels.size()) << name;
      for (size_t i = 0; i < a.kernels.size(); ++i) {
        EXPECT_STREQ(a.kernels[i].name, b.kernels[i].name);
        EXPECT_EQ(a.kernels[i].bytes_read, b.kernels[i].bytes_read);
        EXPECT_EQ(a.kernels[i].bytes_written, b.kernels[i].bytes_written);
        EXPECT_EQ(a.kernels[i].flops, b.kernels[i].flops);
        EXPECT_NE(b.kernels[i].cls, KernelClass::kCollective) << name;
      }
    }
  }
  // Llama-3-8B keeps its 1 + 32·10 + 2 nodes (step_kernels_test.cc).
  StepKernels s;
  step_kernels(model_preset("llama-3-8b"), decode_shape(1, 1, 0), LayoutSpec{}, 0, s);
  EXPECT_EQ(s.node_count(), 1 + 32 * 10 + 2);
}

TEST(LayoutMemory, Llama8bTp2) {
  // bf16. Vocab 128256 / 2 = 64128 rows · 4096 · 2 B = 525,336,576 for the embedding and again
  // for lm_head. Per layer: q 16 heads·128 = 2048, k,v 4 heads·128 = 512 each: qkv 4096·3072 +
  // o 2048·4096 = 20,971,520 params; MLP 3·4096·7168 = 88,080,384; norms 2·4096 (replicated).
  // ×2 B ×32 layers: attention 1,342,177,280, MLP 5,637,144,576, norms 524,288 + final 8192.
  const RankMemory r = memory("llama-3-8b", "TP2", 1);
  EXPECT_EQ(r.embedding_bytes, 525'336'576);
  EXPECT_EQ(r.lm_head_bytes, 525'336'576);
  EXPECT_EQ(r.attention_bytes, 1'342'177'280);
  EXPECT_EQ(r.mlp_bytes, 5'637'144'576);
  EXPECT_EQ(r.norm_bytes, 532'480);
  EXPECT_EQ(r.replicated_bytes, 532'480);
  EXPECT_EQ(r.weight_bytes, 8'030'527'488);
  // KV: 4 KV heads · 128 · K and V · 2 B · 32 layers.
  EXPECT_EQ(r.kv_bytes_per_token, 65'536);
}

TEST(LayoutMemory, Llama8bTp8) {
  // Per layer: q 4 heads → 512, k,v 1 head → 128 each: 4096·768 + 512·4096 = 5,242,880; MLP
  // 3·4096·1792 = 22,020,096; ×2 B ×32 = 335,544,320 + 1,409,286,144. Vocab rows 16032:
  // 16032·4096·2 = 131,334,144, twice. Norms 532,480. Sum 2,008,031,232.
  const RankMemory r = memory("llama-3-8b", "TP8", 5);
  EXPECT_EQ(r.attention_bytes, 335'544'320);
  EXPECT_EQ(r.mlp_bytes, 1'409'286'144);
  EXPECT_EQ(r.embedding_bytes + r.lm_head_bytes, 262'668'288);
  EXPECT_EQ(r.weight_bytes, 2'008'031'232);
  EXPECT_EQ(r.kv_bytes_per_token, 2 * 128 * 2 * 32);  // one KV head per rank
}

TEST(LayoutMemory, Qwen3Dp2Ep2) {
  // Attention replicated (DP): (2048·(4096 + 2·512) + 4096·2048)·2 B = 37,748,736 per layer,
  // ×48 = 1,811,939,328. Experts: 64 of 128 per rank, 64·3·2048·768·2 B = 603,979,776 per layer,
  // ×48 = 28,991,029,248. Router 2048·128·2 ×48 = 25,165,824. Vocab rows 75968·2048·2 =
  // 311,164,928 twice. Norms (2·48 + 1)·2048·2 = 397,312. Sum 31,450,861,568.
  const RankMemory r = memory("qwen3-30b-a3b", "DP2-EP2", 0);
  EXPECT_EQ(r.attention_bytes, 1'811'939'328);
  EXPECT_EQ(r.expert_bytes, 28'991'029'248);
  EXPECT_EQ(r.router_bytes, 25'165'824);
  EXPECT_EQ(r.embedding_bytes, 311'164'928);
  EXPECT_EQ(r.weight_bytes, 31'450'861'568);
  // Every KV head on every rank (a DP rank stores its requests' tokens whole): 2·4·128·2·48.
  EXPECT_EQ(r.kv_bytes_per_token, 98'304);
}

TEST(LayoutMemory, KvHeadsReplicatedWhenFewerThanTp) {
  // Llama-3-8B has 8 KV heads: TP16 still stores one head per rank (2× replication), so the
  // per-rank KV per token stops shrinking at TP8.
  EXPECT_EQ(memory("llama-3-8b", "TP16", 3).kv_bytes_per_token, 16'384);
  EXPECT_EQ(memory("llama-3-8b", "TP4", 3).kv_bytes_per_token, 2 * 2 * 128 * 2 * 32);
  // Qwen3 (4 KV heads) at TP8: 1 head · 128 · 2 · 2 B · 48 layers.
  EXPECT_EQ(memory("qwen3-30b-a3b", "TP8", 7).kv_bytes_per_token, 24'576);
}

TEST(LayoutMemory, MlaLatentReplicatedOnEveryTpRank) {
  // DeepSeek-like: 512 + 64 latent values · 2 B = 1152 B per layer on every TP rank.
  EXPECT_EQ(memory("deepseek-like", "TP8", 6).kv_bytes_per_token, 61 * 1152);
  // PP2: stage 0 holds 31 layers, stage 1 30.
  EXPECT_EQ(memory("deepseek-like", "PP2-TP8", 0).kv_bytes_per_token, 31 * 1152);
  EXPECT_EQ(memory("deepseek-like", "PP2-TP8", 8).kv_bytes_per_token, 30 * 1152);
  // Compact KV state (seed 004): 70272 / 2.268 = 30984.1 → 30984.
  LayoutSpec l = parse_layout("TP8");
  l.kv_compression = 2.268;
  EXPECT_EQ(
      rank_memory(model_preset("deepseek-like"), hardware_preset("h20"), l, 0).kv_bytes_per_token,
      30'984);
}

TEST(LayoutMemory, CapacityByHand) {
  // H200 141e9 B · 0.95 = 133,950,000,000 usable; minus weights 8,030,527,488 (Llama8bTp2) and
  // 8 GiB = 8,589,934,592 of buffers: 117,329,537,920 free; / 65,536 B per token =
  // 1,790,306.67 → 1,790,306 tokens.
  const RankMemory r = memory("llama-3-8b", "TP2", 0);
  EXPECT_EQ(r.usable_hbm_bytes, 133'950'000'000);
  EXPECT_EQ(r.runtime_buffer_bytes, 8 * kGiB);
  EXPECT_EQ(r.free_bytes, 117'329'537'920);
  EXPECT_EQ(r.kv_capacity_tokens, 1'790'306);
}

TEST(LayoutMemory, ShardedWeightsSumToTheModel) {
  // Over every rank, each weight is held once except what every rank of a stage replicates:
  // the norms ((2L + 1)·hidden·2 B) and routers (hidden·experts·2 B per MoE layer), held width
  // times. KV heads are never replicated here (width <= KV heads).
  std::mt19937 rng(7);
  for (const char* name : {"llama-3-8b", "qwen3-30b-a3b"}) {
    const ModelSpec& m = model_preset(name);
    const int32_t max_w = m.layers[0].attn.num_kv_heads;
    int64_t replicated = (2 * int64_t(m.layers.size()) + 1) * m.hidden * 2;
    for (const LayerSpec& l : m.layers)
      if (l.mlp.kind == MlpKind::kMoe) replicated += m.hidden * l.mlp.num_experts * 2;
    for (int trial = 0; trial < 20; ++trial) {
      LayoutSpec l;
      l.tp = 1 << std::uniform_int_distribution<int>(0, 3)(rng);
      if (l.tp > max_w) l.tp = max_w;
      l.pp = std::uniform_int_distribution<int>(1, 5)(rng);
      if (m.layers[0].mlp.kind == MlpKind::kMoe && l.tp > 1 && trial % 2) l.ep = l.tp;
      int64_t sum = 0;
      for (int32_t r = 0; r < l.world(); ++r)
        sum += rank_memory(m, hardware_preset("h200"), l, r).weight_bytes;
      EXPECT_EQ(sum, m.weight_bytes_total() + (l.width() - 1) * replicated)
          << name << " " << layout_name(l);
    }
  }
}

TEST(LayoutMemory, KernelWeightReadsMatchMemory) {
  // One decode token on TP8 rank 3 reads every weight it holds once, except the embedding, of
  // which it reads one row's share (16032/128256 of 8192 B = 1024 B); activations add < 8 MB.
  const ModelSpec& m = model_preset("llama-3-8b");
  const LayoutSpec l = parse_layout("TP8");
  const RankMemory r = rank_memory(m, hardware_preset("h200"), l, 3);
  StepKernels s;
  step_kernels(m, decode_shape(1, 1, 0), l, 3, s);
  const int64_t weights = r.weight_bytes - r.embedding_bytes;
  EXPECT_GE(compute_bytes_read(s), weights);
  EXPECT_LT(compute_bytes_read(s), weights + 8'000'000);
}

TEST(LayoutKernels, TpPlacesTwoAllReducesPerLayer) {
  const ModelSpec& m = model_preset("llama-3-8b");
  StepKernels s;
  step_kernels(m, decode_shape(4, 1, 4000), parse_layout("TP8"), 2, s);
  ASSERT_EQ(s.runs.size(), 3u);
  EXPECT_EQ(count(s, 1, CollectiveKind::kAllReduce), 2);
  EXPECT_EQ(count(s, 0, CollectiveKind::kAllReduce), 1);  // vocab-parallel embedding
  EXPECT_EQ(count(s, 2, CollectiveKind::kAllGather), 1);  // argmax pairs
  // All-reduce message: 4 tokens · 4096 · 2 B; the argmax gather 4 rows · 8 B from each rank.
  EXPECT_EQ(find(s, "attn_all_reduce")->bytes_read, 4 * 4096 * 2);
  EXPECT_EQ(find(s, "attn_all_reduce")->group, 8);
  EXPECT_EQ(find(s, "argmax_gather")->bytes_read, 32);
  EXPECT_EQ(find(s, "argmax_gather")->bytes_written, 8 * 32);
  // Attention over the rank's single KV head: (4000 + 4) · 2·128·2 B + q 4·512·2 B.
  EXPECT_EQ(find(s, "attention")->bytes_read, 4004LL * 512 + 4 * 512 * 2);
}

TEST(LayoutKernels, WholeVocabularyPerRankHasNoVocabCollectives) {
  // vocab_parallel false (what the real runtime does): every TP rank reads the whole embedding
  // row and LM head, and neither the embedding all-reduce nor the argmax gather is placed.
  const ModelSpec& m = model_preset("llama-3-8b");
  LayoutSpec l = parse_layout("TP2");
  l.vocab_parallel = false;
  StepKernels s;
  step_kernels(m, decode_shape(4, 1, 4000), l, 1, s);
  EXPECT_EQ(count(s, 0, CollectiveKind::kAllReduce), 0);
  EXPECT_EQ(count(s, 2, CollectiveKind::kAllGather), 0);
  EXPECT_EQ(count(s, 1, CollectiveKind::kAllReduce), 2);  // the layers are still TP
  // LM head: 128256 · 4096 · 2 B of weights + 4 rows · 4096 · 2 B of activations.
  EXPECT_EQ(find(s, "lm_head")->bytes_read, 128256LL * 4096 * 2 + 4 * 4096 * 2);
  // Memory: both ranks hold the whole embedding and LM head, counted as replicated.
  const RankMemory r = rank_memory(m, hardware_preset("h200"), l, 1);
  EXPECT_EQ(r.embedding_bytes, 128256LL * 4096 * 2);
  EXPECT_EQ(r.lm_head_bytes, 128256LL * 4096 * 2);
  const RankMemory split = rank_memory(m, hardware_preset("h200"), parse_layout("TP2"), 1);
  EXPECT_EQ(r.replicated_bytes - split.replicated_bytes, 2 * 128256LL * 4096 * 2);
}

TEST(LayoutKernels, EpWithDpAttentionUsesAllToAll) {
  const ModelSpec& m = model_preset("qwen3-30b-a3b");
  StepKernels s;
  step_kernels(m, decode_shape(8, 1, 8000), parse_layout("DP4-EP4"), 1, s);
  EXPECT_EQ(count(s, 1, CollectiveKind::kAllToAll), 2);
  EXPECT_EQ(count(s, 1, CollectiveKind::kAllReduce), 0);
  // Rank 1 serves requests 1 and 5: 2 tokens · top-8 copies · 2048 · 2 B dispatched.
  EXPECT_EQ(find(s, "moe_dispatch")->bytes_read, 2 * 8 * 2048 * 2);
  // Uniform routing: 8 tokens · 8 copies over 4 ranks, 16 copies land here.
  EXPECT_EQ(find(s, "moe_dispatch")->bytes_written, 16 * 2048 * 2);
  // Its attention reads only its requests' context: 8000 · 2/8 = 2000 cached tokens.
  EXPECT_EQ(find(s, "attention")->bytes_read, (2000LL + 2) * 2 * 4 * 128 * 2 + 2 * 4096 * 2);
  // TP attention with EP: tokens are on every rank, the combine is an all-reduce.
  step_kernels(m, decode_shape(8, 1, 8000), parse_layout("TP4-EP4"), 1, s);
  EXPECT_EQ(count(s, 1, CollectiveKind::kAllToAll), 0);
  EXPECT_EQ(count(s, 1, CollectiveKind::kAllReduce), 2);
}

TEST(LayoutKernels, CpExchangesPartialOutputs) {
  const ModelSpec& m = model_preset("llama-3-8b");
  StepKernels s;
  step_kernels(m, decode_shape(1, 1, 8000), parse_layout("CP8-TP8"), 0, s);
  EXPECT_EQ(count(s, 1, CollectiveKind::kAllGather), 1);  // cp_exchange
  EXPECT_EQ(count(s, 1, CollectiveKind::kAllReduce), 1);  // MLP split over the width
  // Context 8000 / 8 = 1000 keys here, all 8 KV heads; the one new token's KV goes to rank 7.
  EXPECT_EQ(find(s, "attention")->bytes_read, 1000LL * 4096 + 4096 * 2);
  // Partial output (4096 values, bf16) and 32 fp32 log-sum-exps.
  EXPECT_EQ(find(s, "cp_exchange")->bytes_read, 4096 * 2 + 32 * 4);
}

// CP prefill splits the queries: llama-3-8b (hidden 4096, 32 query and 8 KV heads of 128) over
// CP8, one 8000-token prompt. Each rank projects its 1000 tokens, all-gathers every rank's keys
// (1000 · 2 · 1024 values of 2 B from each), attends its queries over all 8000 keys with 1/8 of
// the causal pairs, gathers the hidden states for the split MLP and reduce-scatters the partial
// sums back; no partial outputs are exchanged. The one logits row is on the rank holding the
// prompt's last token (index 7).
TEST(LayoutKernels, CpPrefillSplitsTheQueries) {
  const ModelSpec& m = model_preset("llama-3-8b");
  const LayoutSpec l = parse_layout("CP8-TP8");
  const StepShape prefill = prefill_shape(1, 8000, 8000LL * 8000);
  int64_t flops = 0;
  for (int32_t r = 0; r < 8; ++r) {
    StepKernels s;
    step_kernels(m, prefill, l, r, s);
    EXPECT_EQ(find(s, "qkv_proj")->flops, 2LL * 1000 * 4096 * (4096 + 2 * 1024));
    const KernelDesc* kv = find(s, "cp_kv_gather");
    ASSERT_NE(kv, nullptr);
    EXPECT_EQ(kv->coll, CollectiveKind::kAllGather);
    EXPECT_EQ(kv->bytes_read, 1000LL * 2 * 1024 * 2);
    EXPECT_EQ(kv->bytes_written, 8000LL * 2 * 1024 * 2);
    const KernelDesc* attn = find(s, "attention");
    EXPECT_EQ(attn->bytes_read, 8000LL * 2 * 1024 * 2 + 1000LL * 4096 * 2);
    flops += attn->flops;
    EXPECT_EQ(find(s, "cp_exchange"), nullptr);
    EXPECT_EQ(find(s, "cp_hidden_gather")->bytes_written, 8000LL * 4096 * 2);
    const KernelDesc* rs = find(s, "mlp_reduce_scatter");
    ASSERT_NE(rs, nullptr);
    EXPECT_EQ(rs->coll, CollectiveKind::kAllToAll);
    EXPECT_EQ(rs->bytes_read, 8000LL * 4096 * 2);
    EXPECT_EQ(find(s, "gate_up_proj")->flops, 2LL * 8000 * 4096 * 2 * (14336 / 8));
    EXPECT_EQ(find(s, "mlp_all_reduce"), nullptr);
    EXPECT_EQ(count(s, 1, CollectiveKind::kAllReduce), 0);
    EXPECT_EQ(find(s, "lm_head_hidden_gather")->bytes_read, (r == 7 ? 1 : 0) * 4096LL * 2);
  }
  // The ranks' attention covers the prompt's 8000 · 8001 / 2 causal pairs once: 4 FLOPs per
  // pair per query dimension.
  EXPECT_EQ(flops, 4LL * (8000LL * 8001 / 2) * 4096);
  // Decode under CP is unchanged (keys split, partial outputs exchanged).
  StepKernels d;
  step_kernels(m, decode_shape(1, 1, 8000), l, 0, d);
  EXPECT_NE(find(d, "cp_exchange"), nullptr);
  EXPECT_EQ(find(d, "cp_kv_gather"), nullptr);
}

// MLA prefill runs the non-absorbed form: DeepSeek-V3 (128 heads, qk 128 + 64 rope, v 128,
// latent 512) up-projects the 1000 prompt keys' latents to k_nope and v (2 · 1000 · 512 · 128 ·
// 256 FLOPs) and attends as MHA, 2 · (192 + 128) FLOPs per pair and head over the 1000 · 1001 / 2
// causal pairs; decode keeps the absorbed form (q_absorb, MQA over the latent, v_up).
TEST(LayoutKernels, MlaPrefillIsNotAbsorbed) {
  const ModelSpec& m = model_preset("deepseek-like");
  StepKernels s;
  step_kernels(m, prefill_shape(1, 1000, 1000LL * 1000), s);
  EXPECT_EQ(find(s, "q_absorb"), nullptr);
  EXPECT_EQ(find(s, "v_up"), nullptr);
  EXPECT_EQ(find(s, "kv_b_proj")->flops, 2LL * 1000 * 512 * 128 * 256);
  EXPECT_EQ(find(s, "attention")->flops, 2LL * (1000LL * 1001 / 2) * 128 * (192 + 128));
  step_kernels(m, decode_shape(1, 1, 1000), s);
  EXPECT_NE(find(s, "q_absorb"), nullptr);
  EXPECT_NE(find(s, "v_up"), nullptr);
  EXPECT_EQ(find(s, "kv_b_proj"), nullptr);
  EXPECT_EQ(find(s, "attention")->flops, 2LL * (1000 + 1) * 128 * (576 + 512));
}

TEST(LayoutKernels, PipelineStagesSendAndReceive) {
  const ModelSpec& m = model_preset("llama-3-8b");
  StepKernels s0, s1;
  const LayoutSpec l = parse_layout("PP2-TP2");
  step_kernels(m, decode_shape(3, 1, 0), l, 1, s0);  // stage 0
  step_kernels(m, decode_shape(3, 1, 0), l, 2, s1);  // stage 1
  const KernelDesc* send = find(s0, "pp_send");
  const KernelDesc* recv = find(s1, "pp_recv");
  ASSERT_NE(send, nullptr);
  ASSERT_NE(recv, nullptr);
  EXPECT_EQ(send->group, 1);
  EXPECT_EQ(recv->group, 0);
  // Hidden state and residual, 3 tokens · 4096 · 2 B each.
  EXPECT_EQ(send->bytes_read, 2 * 3 * 4096 * 2);
  EXPECT_EQ(recv->bytes_written, send->bytes_read);
  EXPECT_EQ(find(s0, "lm_head"), nullptr);
  EXPECT_EQ(find(s1, "embedding"), nullptr);
}

TEST(LayoutKernels, PipelineSplitCoversEveryLayerOnce) {
  for (int32_t layers = 1; layers <= 70; ++layers) {
    for (int32_t pp = 1; pp <= std::min(layers, 9); ++pp) {
      int32_t next = 0, lo = layers, hi = 0;
      for (int32_t s = 0; s < pp; ++s) {
        const StageLayers sl = stage_layers(layers, pp, s);
        EXPECT_EQ(sl.first, next);
        next += sl.count;
        lo = std::min(lo, sl.count);
        hi = std::max(hi, sl.count);
      }
      EXPECT_EQ(next, layers);
      EXPECT_LE(hi - lo, 1);
    }
  }
  // And in the kernel lists: DeepSeek-like PP4-TP8 stages repeat 61 layers in all.
  const ModelSpec& m = model_preset("deepseek-like");
  int32_t layers = 0;
  for (int32_t stage = 0; stage < 4; ++stage) {
    StepKernels s;
    step_kernels(m, decode_shape(1, 1, 0), parse_layout("PP4-TP8"), stage * 8, s);
    for (size_t r = 1; r + 1 < s.runs.size(); ++r) layers += s.runs[r].repeat;
  }
  EXPECT_EQ(layers, 61);
}

TEST(LayoutKernels, DpShapeSplitIsExactForUniformRequests) {
  // 10 requests of 2 tokens after 100 cached each over 4 ranks: requests 3, 3, 2, 2.
  const StepShape all = decode_shape(10, 2, 1000);  // pairs 2·1000 + 10·3 = 2030
  const int32_t want_requests[4] = {3, 3, 2, 2};
  int64_t pairs = 0;
  for (int32_t i = 0; i < 4; ++i) {
    const StepShape s = dp_rank_shape(all, 4, i);
    EXPECT_EQ(s.requests, want_requests[i]);
    EXPECT_EQ(s.tokens, 2 * want_requests[i]);
    EXPECT_EQ(s.ctx_tokens, 100 * want_requests[i]);
    EXPECT_EQ(s.attn_pairs, decode_shape(want_requests[i], 2, 100 * want_requests[i]).attn_pairs);
    pairs += s.attn_pairs;
  }
  EXPECT_EQ(pairs, 2030);
  // One request on DP8: rank 0 serves it, the others are idle.
  EXPECT_EQ(dp_rank_shape(decode_shape(1, 1, 77), 8, 0).ctx_tokens, 77);
  EXPECT_EQ(dp_rank_shape(decode_shape(1, 1, 77), 8, 1).tokens, 0);
}

TEST(LayoutKernels, ExpertSkewMakesHotRanksStragglers) {
  // 8 hot experts (all on EP rank 0 of 4, which holds experts 0-31) take half the routed tokens:
  // rank 0's share is 0.5 + 0.5·24/120 = 0.6 of 1000·8 copies = 4800; the others 0.5·32/120.
  const ModelSpec& m = model_preset("qwen3-30b-a3b");
  ExpertLoad hot;
  hot.kind = ExpertLoad::Kind::kHot;
  hot.hot_experts = 8;
  hot.hot_fraction = 0.5;
  int64_t total = 0;
  for (int32_t r = 0; r < 4; ++r)
    total += expert_share(hot, m.layers[0].mlp, 1000, 4, r).routed_tokens;
  EXPECT_EQ(total, 8000);
  EXPECT_EQ(expert_share(hot, m.layers[0].mlp, 1000, 4, 0).routed_tokens, 4800);
  EXPECT_NEAR(expert_share(hot, m.layers[0].mlp, 1000, 4, 2).routed_tokens, 8000 * 0.5 * 32 / 120,
              1);
  // In the kernel lists: rank 0 does more expert FLOPs than rank 3, and the 4 ranks together do
  // the single-GPU layer's (64 tokens · 8 = 512 copies, however they are spread).
  LayoutSpec l = parse_layout("DP4-EP4");
  l.expert_load = hot;
  const StepShape shape = decode_shape(64, 1, 64 * 100);
  int64_t flops = 0;
  int64_t rank_flops[4];
  for (int32_t r = 0; r < 4; ++r) {
    StepKernels s;
    step_kernels(m, shape, l, r, s);
    rank_flops[r] = find(s, "moe_gate_up")->flops;
    flops += rank_flops[r];
  }
  EXPECT_GT(rank_flops[0], 3 * rank_flops[3]);
  StepKernels one;
  step_kernels(m, shape, one);
  EXPECT_EQ(flops, find(one, "moe_gate_up")->flops);  // 2 · 512 copies · 2048 · 1536
}

TEST(LayoutKernels, ZipfIsCappedAtOneCopyPerToken) {
  ExpertLoad z;
  z.kind = ExpertLoad::Kind::kZipf;
  z.zipf_s = 1.2;
  const std::vector<double> p = expert_probabilities(z, 256, 8);
  double sum = 0;
  for (double x : p) {
    sum += x;
    EXPECT_LE(x, 1.0 / 8 + 1e-12);
  }
  EXPECT_NEAR(sum, 1.0, 1e-12);
  EXPECT_NEAR(p[0], 1.0 / 8, 1e-12);  // 1/H(256, 1.2) ≈ 0.23 before capping
  EXPECT_GT(p[1], p[2]);
}

TEST(LayoutCapacity, Seed004StudyRatios) {
  const CapacityTable t = capacity_table(model_preset("deepseek-like"), hardware_preset("h20"),
                                         seed004_capacity_layouts({"PP2-TP8", "DP32-EP32"}));
  ASSERT_EQ(t.rows.size(), 8u);
  ASSERT_EQ(t.cells(0).size(), t.columns.size());
  for (size_t layout = 0; layout < 2; ++layout) {
    const CapacityRow& base = t.rows[4 * layout];
    const CapacityRow& small = t.rows[4 * layout + 1];
    const CapacityRow& compact = t.rows[4 * layout + 2];
    const CapacityRow& both = t.rows[4 * layout + 3];
    EXPECT_EQ(base.ratio, 1.0);
    // mxfp4 experts: 17/32 B per parameter instead of 1 + 4/16384.
    EXPECT_NEAR(double(small.binding.expert_bytes) / double(base.binding.expert_bytes),
                (17.0 / 32) / (1 + 4.0 / 16384), 1e-4);
    EXPECT_GT(small.ratio, 1.0);
    // Compact KV only divides the KV bytes per token; combined is the product, as the seed's
    // 3.88 = 1.71 · 2.268 and 10.14 = 4.47 · 2.268.
    EXPECT_NEAR(compact.ratio, 2.268, 1e-4);
    EXPECT_NEAR(both.ratio, small.ratio * 2.268, 1e-3);
  }
  // As in the seed, PP2-TP8 gains more from smaller experts than DP32-EP32 (its ranks hold
  // twice the expert bytes: 1/16 of them rather than 1/32).
  EXPECT_GT(t.rows[1].ratio, t.rows[5].ratio);
  // DP32-EP32 capacity is per DP rank; one replica holds 32 times it.
  EXPECT_EQ(t.rows[4].replica_kv_tokens, 32 * t.rows[4].binding.kv_capacity_tokens);
}

// ---- Pipeline microbatches -------------------------------------------------------------------

TEST(LayoutPipeline, DecodeMicrobatchesDefaultToPpAsTheBatchAllows) {
  LayoutSpec l = parse_layout("PP4-TP8");
  EXPECT_EQ(decode_microbatches(l, 16), 4);
  EXPECT_EQ(decode_microbatches(l, 3), 3);
  EXPECT_EQ(decode_microbatches(l, 0), 1);
  l.microbatches = 8;
  EXPECT_EQ(decode_microbatches(l, 16), 8);
  EXPECT_EQ(decode_microbatches(parse_layout("TP8"), 16), 1);
  // Five requests over four groups: 1, 1, 1, 2 (balanced_share), contexts summed per group.
  std::vector<StepShape> mbs;
  const int64_t ctx[] = {10, 20, 30, 40, 50};
  decode_microbatch_shapes(parse_layout("PP4"), ctx, 2, mbs);
  ASSERT_EQ(mbs.size(), 4u);
  const int32_t requests[] = {1, 1, 1, 2};
  const int64_t ctx_sum[] = {10, 20, 30, 90};
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_EQ(mbs[j].requests, requests[j]);
    EXPECT_EQ(mbs[j].tokens, 2 * requests[j]);
    EXPECT_EQ(mbs[j].ctx_tokens, ctx_sum[j]);
    // q = 2 new tokens after c cached: 2c + 3 pairs per request.
    EXPECT_EQ(mbs[j].attn_pairs, 2 * ctx_sum[j] + 3 * requests[j]);
  }
}

// Prompts of 300 and 500 tokens in chunks of 250: [a0..249], [a250..299, b0..199], [b200..449],
// [b450..499]. A piece of q tokens after c earlier ones of its prompt has q·c + q(q+1)/2 pairs.
TEST(LayoutPipeline, PrefillChunksCarryTheirEarlierContext) {
  LayoutSpec l = parse_layout("PP2");
  l.prefill_chunk_tokens = 250;
  std::vector<StepShape> c;
  const int64_t lens[] = {300, 500};
  prefill_microbatch_shapes(l, lens, c);
  ASSERT_EQ(c.size(), 4u);
  auto pairs = [](int64_t q, int64_t ctx) { return q * ctx + q * (q + 1) / 2; };
  EXPECT_EQ(c[0].tokens, 250);
  EXPECT_EQ(c[0].ctx_tokens, 0);
  EXPECT_EQ(c[0].attn_pairs, pairs(250, 0));
  EXPECT_EQ(c[0].finishing_requests, 0);
  EXPECT_EQ(c[1].requests, 2);
  EXPECT_EQ(c[1].tokens, 250);
  EXPECT_EQ(c[1].ctx_tokens, 250);
  EXPECT_EQ(c[1].attn_pairs, pairs(50, 250) + pairs(200, 0));
  EXPECT_EQ(c[1].finishing_requests, 1);
  EXPECT_EQ(c[2].ctx_tokens, 200);
  EXPECT_EQ(c[2].attn_pairs, pairs(250, 200));
  EXPECT_EQ(c[2].finishing_requests, 0);
  EXPECT_EQ(c[3].tokens, 50);
  EXPECT_EQ(c[3].attn_pairs, pairs(50, 450));
  EXPECT_EQ(c[3].finishing_requests, 1);
  // The chunks' pairs add up to the unchunked prefill's Σ L(L+1)/2.
  int64_t total = 0;
  for (const StepShape& s : c) total += s.attn_pairs;
  EXPECT_EQ(total, prefill_shape(2, 800, 300 * 300 + 500 * 500).attn_pairs);
  // Default: as many chunks as microbatches (pp).
  prefill_microbatch_shapes(parse_layout("PP4"), lens, c);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].tokens, 200);
}

// Only the chunk where a prompt ends computes its logits row.
TEST(LayoutPipeline, LogitsRowsOnlyWhereAPromptEnds) {
  const ModelSpec m = model_preset("llama-3-8b");
  StepShape mid = prefill_shape(1, 256, 256 * 256);
  mid.finishing_requests = 0;
  StepKernels k;
  step_kernels(m, mid, LayoutSpec{}, 0, k);
  const KernelDesc& lm = k.kernels[size_t(k.runs.back().first + 1)];
  ASSERT_STREQ(lm.name, "lm_head");
  EXPECT_EQ(lm.bytes_written, 0);
  mid.finishing_requests = 1;
  step_kernels(m, mid, LayoutSpec{}, 0, k);
  EXPECT_EQ(k.kernels[size_t(k.runs.back().first + 1)].bytes_written, 8);
}

TEST(LayoutPipeline, SampledIdsReturnFromTheLastStageToTheFirst) {
  const ModelSpec m = model_preset("llama-3-8b");
  const LayoutSpec l = parse_layout("PP4-TP2");
  const StepShape mbs[] = {decode_shape(3, 1, 30), decode_shape(2, 1, 20)};
  KernelDesc k{};
  ASSERT_TRUE(pipeline_ids_kernel(l, 1, mbs, k));  // stage 0, index 1
  EXPECT_STREQ(k.name, "pp_ids_recv");
  EXPECT_EQ(k.bytes_written, 5 * 4);
  EXPECT_EQ(k.group, 3);
  ASSERT_TRUE(pipeline_ids_kernel(l, 7, mbs, k));  // stage 3
  EXPECT_STREQ(k.name, "pp_ids_send");
  EXPECT_EQ(k.bytes_read, 5 * 4);
  EXPECT_EQ(k.bytes_written, 0);
  EXPECT_EQ(k.group, 0);
  EXPECT_FALSE(pipeline_ids_kernel(l, 3, mbs, k));  // stage 1
  EXPECT_FALSE(pipeline_ids_kernel(parse_layout("TP2"), 0, mbs, k));
  // The pipelined list: each microbatch's kernels in order, then the ids.
  StepKernels one, all;
  step_kernels(m, mbs[0], l, 7, one);
  pipeline_step_kernels(m, mbs, l, 7, all);
  EXPECT_EQ(all.node_count(), 2 * one.node_count() + 1);
  EXPECT_STREQ(all.kernels.back().name, "pp_ids_send");
}

TEST(LayoutPipeline, MicrobatchKnobsNeedPipelineStages) {
  const ModelSpec m = model_preset("llama-3-8b");
  LayoutSpec l = parse_layout("TP2");
  l.microbatches = 4;
  EXPECT_THROW(validate_layout(m, l), ConfigError);
  l.microbatches = 1;
  EXPECT_NO_THROW(validate_layout(m, l));
  l.prefill_chunk_tokens = 4096;
  EXPECT_THROW(validate_layout(m, l), ConfigError);
  l.pp = 2;
  EXPECT_NO_THROW(validate_layout(m, l));
}

// ---- Drawn expert placement -------------------------------------------------------------------

TEST(LayoutSkew, PlacementIsADeterministicPermutationPerPassAndLayer) {
  ExpertLoad z;
  z.kind = ExpertLoad::Kind::kZipf;
  z.zipf_s = 1.2;
  z.seed = 42;
  const std::vector<double> ranked = expert_probabilities(z, 64, 8);
  const std::vector<double> a = placed_expert_probabilities(z, 64, 8, 5, 3);
  std::vector<double> sorted_a = a, sorted_r = ranked;
  std::sort(sorted_a.begin(), sorted_a.end());
  std::sort(sorted_r.begin(), sorted_r.end());
  EXPECT_EQ(sorted_a, sorted_r);  // the same shares, placed elsewhere
  EXPECT_EQ(placed_expert_probabilities(z, 64, 8, 5, 3), a);
  EXPECT_NE(placed_expert_probabilities(z, 64, 8, 6, 3), a);  // next pass
  EXPECT_NE(placed_expert_probabilities(z, 64, 8, 5, 4), a);  // next layer
  z.seed = 43;
  EXPECT_NE(placed_expert_probabilities(z, 64, 8, 5, 3), a);
  // A hot expert (10 %, under the 1/8 cap, so it is the one maximum) lands on every EP rank
  // of 4 with about equal frequency over passes (binomial sd √(4000 · 1/4 · 3/4) ≈ 27).
  ExpertLoad hot;
  hot.kind = ExpertLoad::Kind::kHot;
  hot.hot_experts = 1;
  hot.hot_fraction = 0.1;
  int on_rank[4] = {};
  for (uint64_t pass = 0; pass < 4000; ++pass) {
    const std::vector<double> p = placed_expert_probabilities(hot, 64, 8, pass, 0);
    const auto hottest = std::max_element(p.begin(), p.end()) - p.begin();
    ++on_rank[hottest / 16];
  }
  for (int r : on_rank) EXPECT_NEAR(r, 1000, 5 * 27);
  // Uniform loads are not permuted (and need no draw).
  EXPECT_EQ(placed_expert_probabilities(ExpertLoad{}, 64, 8, 5, 3),
            expert_probabilities({}, 64, 8));
}

// A drawn pass gives every MoE layer its own run; expected copies still sum to tokens · top_k.
TEST(LayoutSkew, DrawnPassesKeepRoutedTotals) {
  const ModelSpec m = model_preset("qwen3-30b-a3b");
  LayoutSpec l = parse_layout("DP4-EP4");
  l.expert_load.kind = ExpertLoad::Kind::kHot;
  l.expert_load.hot_experts = 4;
  l.expert_load.hot_fraction = 0.3;
  const StepShape s = prefill_shape(4, 4000, 4 * 1000 * 1000);
  int64_t copies = 0;
  for (int32_t r = 0; r < 4; ++r) {
    StepKernels k;
    step_kernels(m, s, l, r, k, 99);
    EXPECT_EQ(k.runs.size(), 48u + 2u);
    for (const KernelDesc& d : k.kernels) {
      // moe_gate_up writes routed · expert_intermediate · 2 bytes.
      if (std::strcmp(d.name, "moe_gate_up") == 0) copies += d.bytes_written / (768 * 2);
    }
  }
  EXPECT_EQ(copies, 48 * 4000 * 8);
}

// Sampled routing (ExpertLoad::sampled), TP2-EP2 of 128 experts, top-8, one token per pass.
TEST(LayoutSkew, SampledRoutingSplitsEachTokensExpertsBetweenTheRanks) {
  MlpSpec mlp;
  mlp.kind = MlpKind::kMoe;
  mlp.num_experts = 128;
  mlp.top_k = 8;
  const std::vector<double> uniform = expert_probabilities({}, 128, 8);
  // The busier rank's expected experts: X ~ hypergeometric(128 experts, 64 on rank 0, 8 drawn),
  // E[max(X, 8 - X)] from the exact pmf C(64, x) C(64, 8 - x) / C(128, 8).
  auto choose = [](double n, double k) {
    double c = 1;
    for (int i = 0; i < k; ++i) c = c * (n - i) / (i + 1);
    return c;
  };
  double busier = 0;
  for (int x = 0; x <= 8; ++x)
    busier += std::max(x, 8 - x) * choose(64, x) * choose(64, 8 - x) / choose(128, 8);
  double sum_busier = 0, sum_rank0 = 0;
  const int passes = 20000;
  for (int pass = 0; pass < passes; ++pass) {
    const ExpertShare a = sampled_expert_share(uniform, mlp, 1, 2, 0, 7, uint64_t(pass), 3);
    const ExpertShare b = sampled_expert_share(uniform, mlp, 1, 2, 1, 7, uint64_t(pass), 3);
    ASSERT_EQ(a.routed_tokens + b.routed_tokens, 8);  // the same draw on both ranks
    ASSERT_EQ(a.distinct_experts, a.routed_tokens);   // one token: distinct picks
    sum_busier += std::max(a.routed_tokens, b.routed_tokens);
    sum_rank0 += double(a.routed_tokens);
  }
  // busier = 5.10; sd of max(X, 8 - X) < 1.5, so the mean of 20000 is within 0.05 (> 4.5 sd).
  EXPECT_NEAR(sum_busier / passes, busier, 0.05);
  EXPECT_NEAR(sum_rank0 / passes, 4.0, 0.05);
  // Deterministic in (seed, pass, layer); another layer or seed draws differently.
  const ExpertShare x = sampled_expert_share(uniform, mlp, 16, 2, 0, 7, 11, 3);
  EXPECT_EQ(sampled_expert_share(uniform, mlp, 16, 2, 0, 7, 11, 3).routed_tokens, x.routed_tokens);
  int differ = 0;
  for (int layer = 0; layer < 20; ++layer)
    differ +=
        sampled_expert_share(uniform, mlp, 16, 2, 0, 7, 11, layer).routed_tokens != x.routed_tokens;
  EXPECT_GT(differ, 10);
  // 16 tokens: distinct experts <= routed copies, and <= the 64 the rank holds.
  EXPECT_LE(x.distinct_experts, x.routed_tokens);
  EXPECT_LE(x.distinct_experts, 64);
  // A single expert holding every share: each token still gets top_k distinct experts.
  std::vector<double> one(128, 0.0);
  one[5] = 1.0;
  const ExpertShare all0 = sampled_expert_share(one, mlp, 3, 1, 0, 7, 1, 0);
  EXPECT_EQ(all0.routed_tokens, 24);
  EXPECT_EQ(all0.distinct_experts, 8);  // expert 5 and the 7 lowest other ids
}

// A hand-worked routing: 2 rows, top-2 of 8 experts. Row 0 picks experts 1 and 6, row 1 picks 3
// and 1. Over 2 EP ranks, rank 0 holds [0, 4): copies 1, 3, 1 (3 routed, experts 1 and 3
// distinct); rank 1 holds [4, 8): copy 6.
TEST(RoutedExpertShare, HandWorkedTwoRowsTopTwoOfEightExperts) {
  MlpSpec mlp;
  mlp.kind = MlpKind::kMoe;
  mlp.num_experts = 8;
  mlp.top_k = 2;
  const std::vector<int32_t> ids = {1, 6, 3, 1};
  const ExpertShare r0 = routed_expert_share(mlp, ids, 2, 0);
  EXPECT_EQ(r0.experts, 4);
  EXPECT_EQ(r0.routed_tokens, 3);
  EXPECT_EQ(r0.distinct_experts, 2);
  const ExpertShare r1 = routed_expert_share(mlp, ids, 2, 1);
  EXPECT_EQ(r1.experts, 4);
  EXPECT_EQ(r1.routed_tokens, 1);
  EXPECT_EQ(r1.distinct_experts, 1);
  // One rank holds all 8: every copy, experts 1, 3 and 6.
  const ExpertShare all = routed_expert_share(mlp, ids, 1, 0);
  EXPECT_EQ(all.experts, 8);
  EXPECT_EQ(all.routed_tokens, 4);
  EXPECT_EQ(all.distinct_experts, 3);
  // 4 ranks of 2 experts: [0, 2) gets 1 twice, [2, 4) gets 3, [4, 6) nothing, [6, 8) gets 6.
  const int64_t routed[] = {2, 1, 0, 1}, distinct[] = {1, 1, 0, 1};
  for (int32_t r = 0; r < 4; ++r) {
    EXPECT_EQ(routed_expert_share(mlp, ids, 4, r).routed_tokens, routed[r]) << r;
    EXPECT_EQ(routed_expert_share(mlp, ids, 4, r).distinct_experts, distinct[r]) << r;
  }
  // An id outside [0, E) (an unwritten routing entry, -1) counts for no rank.
  const std::vector<int32_t> torn = {1, -1, 8, 1};
  EXPECT_EQ(routed_expert_share(mlp, torn, 2, 0).routed_tokens, 2);
  EXPECT_EQ(routed_expert_share(mlp, torn, 2, 1).routed_tokens, 0);
}

// sampled_expert_share counts sampled_routing's draw as routed_expert_share does.
TEST(RoutedExpertShare, IsTheCountOfTheSampledDraw) {
  MlpSpec mlp;
  mlp.kind = MlpKind::kMoe;
  mlp.num_experts = 128;
  mlp.top_k = 8;
  ExpertLoad zipf;
  zipf.kind = ExpertLoad::Kind::kZipf;
  const std::vector<double> p = expert_probabilities(zipf, 128, 8);
  std::vector<int32_t> ids;
  for (int32_t pass = 0; pass < 50; ++pass) {
    sampled_routing(p, mlp, 5, 3, uint64_t(pass), 2, ids);
    ASSERT_EQ(ids.size(), 40u);
    for (int32_t r = 0; r < 2; ++r) {
      const ExpertShare a = sampled_expert_share(p, mlp, 5, 2, r, 3, uint64_t(pass), 2);
      const ExpertShare b = routed_expert_share(mlp, ids, 2, r);
      EXPECT_EQ(a.routed_tokens, b.routed_tokens);
      EXPECT_EQ(a.distinct_experts, b.distinct_experts);
      EXPECT_EQ(a.experts, b.experts);
    }
  }
}

// Under sampled routing the simulator's EP ranks run different expert loads in each layer of a
// pass, and their routed copies sum to tokens * top_k in every layer.
TEST(LayoutSkew, SampledRoutingGivesEachLayerItsOwnRun) {
  const ModelSpec m = model_preset("qwen3-30b-a3b");
  LayoutSpec l = parse_layout("TP2-EP2");
  l.vocab_parallel = false;
  l.expert_load.sampled = true;
  const StepShape s = decode_shape(1, 1, 1000);
  StepKernels k[2];
  for (int32_t r = 0; r < 2; ++r) step_kernels(m, s, l, r, k[r], 17);
  ASSERT_EQ(k[0].runs.size(), 48u + 2u);
  std::vector<int64_t> copies[2];
  for (int32_t r = 0; r < 2; ++r)
    for (const KernelDesc& d : k[r].kernels)
      if (std::strcmp(d.name, "moe_gate_up") == 0) copies[r].push_back(d.bytes_written / (768 * 2));
  ASSERT_EQ(copies[0].size(), 48u);
  int unequal = 0;
  for (size_t i = 0; i < 48; ++i) {
    EXPECT_EQ(copies[0][i] + copies[1][i], 8) << "layer " << i;
    unequal += copies[0][i] != copies[1][i];
  }
  EXPECT_GT(unequal, 24);  // P(X = 4) = 0.28: about 35 of 48 layers are unbalanced
  // Without a pass key (no draw) the expected split: 4 and 4 in one run of 48 layers.
  StepKernels expected;
  step_kernels(m, s, l, 0, expected);
  EXPECT_EQ(expected.runs.size(), 3u);
}

// add_sampled_routing records the routing the kernel list is priced by: per MoE layer, each EP
// rank's distinct experts and routed copies as read off its moe_gate_up kernel (bytes_written =
// copies · 768 · 2; bytes_read = distinct · 2048 · 2 · 768 · 2 + copies · 2048 · 2), summed, and
// the busier rank's, for several launches and batch sizes.
TEST(LayoutSkew, RecordedRoutingIsTheRoutingPriced) {
  const ModelSpec m = model_preset("qwen3-30b-a3b");
  LayoutSpec l = parse_layout("TP2-EP2");
  l.vocab_parallel = false;
  l.expert_load.sampled = true;
  l.expert_load.seed = 99;
  const int64_t h = 2048, ie = 768;
  for (const int32_t batch : {1, 5, 16}) {
    for (const uint64_t key : {uint64_t{3}, (uint64_t{41} << 16) ^ 2}) {
      const StepShape s = decode_shape(batch, 1, 1000);
      int64_t sum = 0, busier = 0, copies = 0;
      std::vector<int64_t> distinct[2];
      for (int32_t r = 0; r < 2; ++r) {
        StepKernels k;
        pipeline_step_kernels(m, {&s, 1}, l, r, k, key);
        for (const KernelDesc& d : k.kernels) {
          if (std::strcmp(d.name, "moe_gate_up") != 0) continue;
          const int64_t routed = d.bytes_written / (ie * 2);
          copies += routed;
          distinct[r].push_back((d.bytes_read - routed * h * 2) / (h * 2 * ie * 2));
        }
      }
      ASSERT_EQ(distinct[0].size(), 48u);
      for (size_t i = 0; i < 48; ++i) {
        sum += distinct[0][i] + distinct[1][i];
        busier += std::max(distinct[0][i], distinct[1][i]);
      }
      MoeRoutingStats st;
      add_sampled_routing(m, {&s, 1}, l, 0, key, st);
      EXPECT_EQ(st.passes, 48);
      EXPECT_EQ(st.rank_experts, sum) << "batch " << batch;
      EXPECT_EQ(st.rank_experts_max, busier) << "batch " << batch;
      int64_t picks = 0;
      for (const int64_t p : st.picks) picks += p;
      EXPECT_EQ(picks, copies);
      EXPECT_EQ(picks, 48 * batch * 8);
    }
  }
  // Expected routing (not sampled), or no EP: nothing drawn, nothing recorded.
  MoeRoutingStats none;
  const StepShape one = decode_shape(1, 1, 1000);
  LayoutSpec expected = l;
  expected.expert_load.sampled = false;
  add_sampled_routing(m, {&one, 1}, expected, 0, 3, none);
  EXPECT_EQ(none.passes, 0);
}

// group_collective_name knows every group collective the emitter writes, and nothing else: all
// kernels of every rank of a spread of layouts (TP, TP with a vocabulary-parallel head, EP over TP
// and DP attention, CP decode and prefill, pipelines), decode and prefill shapes.
TEST(LayoutKernels, GroupCollectiveNamesAreTheEmittersCollectives) {
  struct Case {
    const char* model;
    const char* layout;
  };
  std::set<std::string> seen;
  for (const Case c :
       {Case{"llama-3-8b", "TP2"}, Case{"llama-3-8b", "TP8"}, Case{"llama-3-8b", "CP8-TP8"},
        Case{"llama-3-8b", "PP2-TP2"}, Case{"qwen3-30b-a3b", "TP2-EP2"},
        Case{"qwen3-30b-a3b", "DP4-EP4"}, Case{"qwen3-30b-a3b", "PP2-TP2-EP2"},
        Case{"deepseek-like", "PP2-CP8-TP8"}}) {
    const ModelSpec& m = model_preset(c.model);
    for (const bool vocab_parallel : {false, true}) {
      LayoutSpec l = parse_layout(c.layout);
      l.vocab_parallel = vocab_parallel;
      for (const StepShape& shape :
           {decode_shape(4, 1, 4000), prefill_shape(1, 2048, 2048LL * 2048)}) {
        for (int32_t r = 0; r < l.world(); ++r) {
          StepKernels s;
          step_kernels(m, shape, l, r, s);
          for (const KernelDesc& k : s.kernels) {
            const bool group =
                k.cls == KernelClass::kCollective && k.coll != CollectiveKind::kSendRecv;
            EXPECT_EQ(group_collective_name(k.name), group)
                << c.model << " " << c.layout << " rank " << r << " " << k.name;
            if (group) seen.insert(k.name);
          }
        }
      }
    }
  }
  // The walk reaches the collectives of each placement (a name never emitted would not be caught).
  for (const char* name : {"attn_all_reduce", "mlp_all_reduce", "moe_all_reduce", "moe_dispatch",
                           "moe_combine_a2a", "cp_exchange", "cp_kv_gather", "cp_hidden_gather",
                           "mlp_reduce_scatter", "embedding_all_reduce", "argmax_gather"})
    EXPECT_TRUE(seen.count(name)) << name;
  EXPECT_FALSE(group_collective_name("pp_recv"));
  EXPECT_FALSE(group_collective_name("moe_combine"));  // the weighted sum, a compute kernel
}

}  // namespace
}  // namespace twinstep
