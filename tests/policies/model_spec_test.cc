#include "policies/model_spec.h"

#include <gtest/gtest.h>

#include "policies/error.h"

namespace twinstep {
namespace {

TEST(ModelSpec, Llama3_8bParameterCount) {
  const ModelSpec& m = model_preset("llama-3-8b");
  // Embedding and lm_head 2·128256·4096 = 1,050,673,152; per layer q,o 2·4096² + k,v 2·4096·1024
  // + SwiGLU 3·4096·14336 + two norms 2·4096 = 218,112,000, times 32 = 6,979,584,000; final
  // norm 4096. Sum 8,030,261,248 (the published count).
  EXPECT_EQ(m.param_count(), 8'030'261'248);
  EXPECT_EQ(m.weight_bytes_total(), 16'060'522'496);
}

TEST(ModelSpec, Llama32_3bTiedEmbeddingsCountedOnce) {
  const ModelSpec& m = model_preset("llama-3.2-3b");
  // Tied embedding 128256·3072 = 394,002,432 once; per layer q,o 2·3072² + k,v 2·3072·1024 +
  // SwiGLU 3·3072·8192 + two norms 2·3072 = 100,669,440, times 28 = 2,818,744,320; final norm
  // 3072. Sum 3,212,749,824 (the published count).
  EXPECT_TRUE(m.tie_embeddings);
  EXPECT_EQ(m.param_count(), 3'212'749'824);
  EXPECT_EQ(m.kv_bytes_per_token(), 28 * 2 * 8 * 128 * 2);
}

TEST(ModelSpec, Llama3_8bKvBytesPerToken) {
  const ModelSpec& m = model_preset("llama-3-8b");
  // K and V, 8 KV heads of 128, bf16: 2·8·128·2 = 4096 B per layer, 32 layers.
  EXPECT_EQ(layer_kv_bytes_per_token(m.layers[0], m.kv_bytes), 4096);
  EXPECT_EQ(m.kv_bytes_per_token(), 32 * 4096);
  EXPECT_EQ(m.state_bytes_per_request(), 0);
}

TEST(ModelSpec, Qwen3MoeTotalAndActive) {
  const ModelSpec& m = model_preset("qwen3-30b-a3b");
  // Per layer: attention 2048·(4096+2·512) + 4096·2048 = 18,874,368; router 2048·128 = 262,144;
  // experts 128·3·2048·768 = 603,979,776; norms 4096 → 623,120,384; ×48 = 29,909,778,432;
  // embeddings 2·151936·2048 = 622,329,856; final norm 2048. Total 30,532,110,336 (≈ 30.5 B).
  EXPECT_EQ(m.param_count(), 30'532'110'336);
  // Active: per layer attention + router + 8 experts (37,748,736) + norms = 56,889,344, ×48 =
  // 2,730,688,512; one embedding row 2048, lm_head 311,164,928, final norm 2048.
  EXPECT_EQ(m.active_param_count(), 3'041'857'536);
  // 4 KV heads of 128, K and V, bf16, 48 layers.
  EXPECT_EQ(m.kv_bytes_per_token(), 48 * 2 * 4 * 128 * 2);
}

TEST(ModelSpec, DeepseekLikeMatchesPublishedTotal) {
  const ModelSpec& m = model_preset("deepseek-like");
  // DeepSeek-V3 reports 671 B total and 37 B activated parameters (without the MTP module).
  EXPECT_EQ(m.param_count(), 671'026'404'352);
  EXPECT_EQ(m.active_param_count(), 36'625'610'752);
  // MLA caches the 512-wide latent plus 64 rope dims per token per layer: 576·2 B.
  EXPECT_EQ(m.kv_bytes_per_token(), 61 * 576 * 2);
}

TEST(ModelSpec, LingFlashLikeHybridLayout) {
  const ModelSpec& m = model_preset("ling-flash-like");
  ASSERT_EQ(m.layers.size(), 42u);
  int linear = 0, mla = 0, moe = 0;
  for (const LayerSpec& l : m.layers) {
    linear += l.attn.kind == AttentionKind::kLinear;
    mla += l.attn.kind == AttentionKind::kMla;
    moe += l.mlp.kind == MlpKind::kMoe;
    if (l.mlp.kind == MlpKind::kMoe) {
      EXPECT_EQ(l.mlp.num_experts, 512);
      EXPECT_EQ(l.mlp.top_k, 8);
      EXPECT_EQ(l.mlp.num_shared_experts, 1);
    }
  }
  EXPECT_EQ(linear, 35);
  EXPECT_EQ(mla, 7);
  EXPECT_EQ(moe, 41);
  // Only the 7 MLA layers grow with context; the linear layers hold a fixed fp32 state of
  // 32 heads · 128 · 128 · 4 B = 2 MiB each plus a short-conv tail.
  EXPECT_EQ(m.kv_bytes_per_token(), 7 * 576 * 2);
  EXPECT_GT(m.state_bytes_per_request(), 35 * 2 * 1024 * 1024);
}

TEST(ModelSpec, UnknownPresetListsKnownOnes) {
  try {
    model_preset("llama-9");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown model preset 'llama-9'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("llama-3-8b"), std::string::npos);
  }
}

}  // namespace
}  // namespace twinstep
