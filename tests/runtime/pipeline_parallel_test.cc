// runtime/pipeline_parallel: stage configs (the simulator's layer split), the stages' weight lists
// (together the model, names as the model's) and their memory plans, against hand-worked sizes
// and the simulator's per-rank memory (policies/layout.h rank_memory). CPU only.
#include "runtime/pipeline_parallel.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "policies/error.h"
#include "policies/hardware_spec.h"
#include "policies/layout.h"
#include "policies/model_spec.h"
#include "runtime/memory_plan.h"

namespace twinstep {
namespace {

using runtime::pp_stage_config;

// Element count of each tensor of `c`'s weight list, by name.
std::map<std::string, int64_t> listed(const LlamaConfig& c) {
  std::map<std::string, int64_t> out;
  for (const WeightDesc& w : llama_weight_list(c)) {
    int64_t n = 1;
    for (const int64_t d : w.shape) n *= d;
    EXPECT_TRUE(out.emplace(w.name, n).second) << w.name << " listed twice";
  }
  return out;
}

// Llama-3-8B PP2: 16 + 16 layers; PP4 of 30 layers: 8 + 8 + 7 + 7 (earlier stages take the
// extra layer, docs/layouts.md "Pipeline split"); the ends on the first and last stage.
TEST(PipelineParallel, StageConfigsSplitLayersAsTheSimulator) {
  const LlamaConfig full = llama_config_from_spec(model_preset("llama-3-8b"));
  const LlamaConfig s0 = pp_stage_config(full, 0, 2), s1 = pp_stage_config(full, 1, 2);
  EXPECT_EQ(s0.first_layer, 0);
  EXPECT_EQ(s0.layers, 16);
  EXPECT_TRUE(s0.holds_embedding);
  EXPECT_FALSE(s0.holds_head);
  EXPECT_EQ(s1.first_layer, 16);
  EXPECT_EQ(s1.layers, 16);
  EXPECT_FALSE(s1.holds_embedding);
  EXPECT_TRUE(s1.holds_head);
  EXPECT_EQ(s1.hidden, full.hidden);
  EXPECT_EQ(s1.q_heads, full.q_heads);
  LlamaConfig thirty = full;
  thirty.layers = 30;
  const int want_first[] = {0, 8, 16, 23}, want_count[] = {8, 8, 7, 7};
  for (int s = 0; s < 4; ++s) {
    const LlamaConfig c = pp_stage_config(thirty, s, 4);
    EXPECT_EQ(c.first_layer, want_first[s]) << "stage " << s;
    EXPECT_EQ(c.layers, want_count[s]) << "stage " << s;
    const StageLayers sl = stage_layers(30, 4, s);
    EXPECT_EQ(c.first_layer, sl.first);
    EXPECT_EQ(c.layers, sl.count);
  }
  // One stage: the model itself.
  const LlamaConfig one = pp_stage_config(full, 0, 1);
  EXPECT_EQ(one.layers, full.layers);
  EXPECT_TRUE(one.holds_embedding && one.holds_head);
  EXPECT_EQ(listed(one), listed(full));
}

TEST(PipelineParallel, StageConfigErrors) {
  const LlamaConfig tiny = llama_config_from_spec(tiny_runtime_spec());  // 2 layers
  EXPECT_THROW(pp_stage_config(tiny, 0, 3), ConfigError);                // a stage with none
  EXPECT_THROW(pp_stage_config(tiny, 2, 2), ConfigError);
  EXPECT_THROW(pp_stage_config(tiny, -1, 2), ConfigError);
  EXPECT_THROW(pp_stage_config(pp_stage_config(tiny, 1, 2), 0, 1), ConfigError);  // a stage's
  LlamaConfig shard = llama_config_from_spec(tiny_moe_runtime_spec(false));
  shard.expert_begin = 8;
  shard.num_local_experts = 8;
  try {
    pp_stage_config(shard, 0, 2);
    ADD_FAILURE() << "an expert-parallel shard was split into stages";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("expert-parallel"), std::string::npos) << e.what();
  }
}

// The stages' weight lists are the model's, each tensor on one stage under its model name (a
// tied embedding on both ends: stage 0 embeds with it, the last stage's LM head is it).
TEST(PipelineParallel, StagesListTheModelsTensorsOnce) {
  for (const bool tied : {false, true}) {
    LlamaConfig full = llama_config_from_spec(tiny_runtime_spec());
    full.tie_embeddings = tied;
    const std::map<std::string, int64_t> s0 = listed(pp_stage_config(full, 0, 2));
    const std::map<std::string, int64_t> s1 = listed(pp_stage_config(full, 1, 2));
    std::map<std::string, int64_t> both = s0;
    for (const auto& [name, n] : s1) {
      const bool shared = name == "model.embed_tokens.weight";
      EXPECT_EQ(both.count(name), shared && tied ? 1u : 0u) << name << (tied ? " (tied)" : "");
      both[name] = n;
    }
    EXPECT_EQ(both, listed(full)) << (tied ? "tied" : "untied");
    EXPECT_EQ(s0.count("model.layers.0.self_attn.q_proj.weight"), 1u);
    EXPECT_EQ(s0.count("model.layers.1.self_attn.q_proj.weight"), 0u);
    EXPECT_EQ(s1.count("model.layers.1.self_attn.q_proj.weight"), 1u);
    EXPECT_EQ(s0.count("model.norm.weight"), 0u);
    EXPECT_EQ(s1.count("model.norm.weight"), 1u);
    EXPECT_EQ(s0.count("lm_head.weight"), 0u);
    EXPECT_EQ(s1.count("lm_head.weight"), tied ? 0u : 1u);
    EXPECT_EQ(s1.count("model.embed_tokens.weight"), tied ? 1u : 0u);
  }
}

// Llama-3-8B PP2 by hand (every tensor a multiple of 128 elements: no padding). Per layer: norms
// 2H, qkv 6144 H, o H x 4096, gate_up 2 x 14336 H, down H x 14336; embedding and lm_head V H,
// final norm H (H 4096, V 128256). Stage 0: embedding + 16 layers; stage 1: 16 layers + final
// norm + lm_head; KV 16 layers x K,V x 8 heads x 128 x 2 B = 64 KiB per token on each. The same
// bytes as the simulator's rank_memory of PP2 (weights by role, KV per token), and the two
// stages' weights add up to the one-GPU plan's.
TEST(PipelineParallel, Llama8BStageMemoryPlans) {
  const ModelSpec& spec = model_preset("llama-3-8b");
  const LlamaConfig full = llama_config_from_spec(spec);
  const int64_t H = 4096, V = 128256, I = 14336;
  const int64_t layer = 2 * H + 6144 * H + H * 4096 + 2 * I * H + H * I;
  const EngineMemoryPlan p0 = plan_engine_memory(pp_stage_config(full, 0, 2), 16, 1216, 16384);
  const EngineMemoryPlan p1 = plan_engine_memory(pp_stage_config(full, 1, 2), 16, 1216, 16384);
  const EngineMemoryPlan one = plan_engine_memory(full, 16, 1216, 16384);
  EXPECT_EQ(p0.weight_bytes, 2 * (V * H + 16 * layer));
  EXPECT_EQ(p1.weight_bytes, 2 * (16 * layer + H + V * H));
  EXPECT_EQ(p0.weight_bytes + p1.weight_bytes, one.weight_bytes);
  EXPECT_EQ(p0.kv_bytes, int64_t{17} * 1216 * 65536);
  EXPECT_EQ(p1.kv_bytes, p0.kv_bytes);
  EXPECT_EQ(2 * p0.kv_bytes, one.kv_bytes);
  EXPECT_EQ(p0.buffer_bytes, one.buffer_bytes);  // every stage keeps the widest pass's buffers
  LayoutSpec pp2;
  pp2.pp = 2;
  pp2.microbatches = 1;
  const HardwareSpec& hw = hardware_preset("h200");
  for (int r = 0; r < 2; ++r) {
    const RankMemory m = rank_memory(spec, hw, pp2, r);
    EXPECT_EQ(m.weight_bytes, (r == 0 ? p0 : p1).weight_bytes) << "rank " << r;
    EXPECT_EQ(m.kv_bytes_per_token, 65536) << "rank " << r;
  }
}

}  // namespace
}  // namespace twinstep
