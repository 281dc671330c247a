#include "policies/step_kernels.h"

#include <gtest/gtest.h>

#include <cstring>

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

TEST(StepKernels, PrefillLogitsOnlyForLastToken) {
  const ModelSpec& m = model_preset("llama-3-8b");
  StepKernels s;
  step_kernels(m, prefill_shape(2, 200, 100 * 100 * 2), s);
  // Two prompts of 100: lm_head computes 2 rows, not 200.
  EXPECT_EQ(find(s, "lm_head")->flops, 2LL * 2 * 4096 * 128256);
  // Attention pairs Σ L(L+1)/2 = 2 · 5050.
  EXPECT_EQ(find(s, "attention")->flops, 4LL * 10100 * 4096);
}

}  // namespace
}  // namespace twinstep
