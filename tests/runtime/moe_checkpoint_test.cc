// Mixture-of-experts configs and weights without a GPU: config.json in the Hugging Face Qwen3-MoE
// keys round-trips and rejects what the runtime cannot run with the file and key named; presets
// map to and from LlamaConfig; the weight list's names and shapes; the memory plan of
// Qwen3-30B-A3B by hand; a synthetic MoE checkpoint loads back; the CPU reference's MoE FFN
// against a direct evaluation of kernels/moe.h's formula.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "policies/error.h"
#include "runtime/checkpoint.h"
#include "runtime/memory_plan.h"
#include "runtime/synthetic.h"
#include "tests/runtime/cpu_reference.h"

namespace twinstep {
namespace {

namespace fs = std::filesystem;

// Qwen/Qwen3-30B-A3B's config.json as published on the Hugging Face Hub.
constexpr const char* kQwen3MoeConfig = R"({
  "architectures": ["Qwen3MoeForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "max_window_layers": 48,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

void expect_same(const LlamaConfig& a, const LlamaConfig& b) {
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.intermediate, b.intermediate);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.layers, b.layers);
  EXPECT_EQ(a.q_heads, b.q_heads);
  EXPECT_EQ(a.kv_heads, b.kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_DOUBLE_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.expert_intermediate, b.expert_intermediate);
  EXPECT_EQ(a.shared_intermediate, b.shared_intermediate);
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
}

TEST(MoeConfig, PresetMapsToConfigAndBack) {
  const ModelSpec& preset = model_preset("qwen3-30b-a3b");
  const LlamaConfig c = llama_config_from_spec(preset);
  EXPECT_TRUE(c.moe());
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.top_k, 8);
  EXPECT_EQ(c.expert_intermediate, 768);
  EXPECT_EQ(c.shared_intermediate, 0);
  EXPECT_EQ(c.intermediate, 0);  // no dense FFN
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.layers, 48);
  EXPECT_EQ(c.q_heads, 32);
  EXPECT_EQ(c.kv_heads, 4);
  const ModelSpec back = model_spec_from_config(c, "back");
  EXPECT_EQ(back.param_count(), preset.param_count());
  EXPECT_EQ(back.active_param_count(), preset.active_param_count());
  EXPECT_EQ(back.kv_bytes_per_token(), preset.kv_bytes_per_token());
  expect_same(llama_config_from_spec(back), c);
}

TEST(MoeConfig, SharedExpertsBecomeOneOfTheirSummedWidth) {
  ModelSpec spec = tiny_moe_runtime_spec(false);
  for (LayerSpec& l : spec.layers) {
    l.mlp.num_shared_experts = 2;
    l.mlp.shared_intermediate = 128;
  }
  const LlamaConfig c = llama_config_from_spec(spec);
  EXPECT_EQ(c.shared_intermediate, 256);
  // The same parameters: two SwiGLUs of width 128 side by side are one of width 256.
  EXPECT_EQ(model_spec_from_config(c, "x").param_count(), spec.param_count());
}

TEST(MoeConfig, UnsupportedSpecsNameTheLayer) {
  auto message = [](const ModelSpec& s) {
    try {
      llama_config_from_spec(s);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(model_preset("deepseek-like")).find("layer 0 has MLA attention"),
            std::string::npos)
      << message(model_preset("deepseek-like"));
  EXPECT_NE(message(model_preset("ling-flash-like")).find("layer 0 has linear attention"),
            std::string::npos)
      << message(model_preset("ling-flash-like"));
  ModelSpec mixed = tiny_moe_runtime_spec(false);
  mixed.layers[0].mlp = tiny_runtime_spec().layers[0].mlp;  // dense layer 0, MoE layer 1
  const std::string m = message(mixed);
  EXPECT_NE(m.find("mixes dense and MoE layers (layer 0 dense, layer 1 MoE)"), std::string::npos)
      << m;
  ModelSpec uneven = tiny_moe_runtime_spec(false);
  uneven.layers[1].mlp.top_k = 4;
  EXPECT_NE(message(uneven).find("layers differ in shape (layer 0 and layer 1)"),
            std::string::npos);
}

TEST(MoeConfig, HuggingFaceQwen3MoeConfigParses) {
  const LlamaConfig c = parse_llama_config(kQwen3MoeConfig, "config.json");
  LlamaConfig want = llama_config_from_spec(model_preset("qwen3-30b-a3b"));
  expect_same(c, want);
  EXPECT_DOUBLE_EQ(c.rms_eps, 1e-6);
}

TEST(MoeConfig, JsonRoundTrip) {
  for (const bool shared : {false, true}) {
    for (const bool renorm : {false, true}) {
      LlamaConfig c = llama_config_from_spec(tiny_moe_runtime_spec(shared));
      c.norm_topk_prob = renorm;
      const std::string text = llama_config_json(c);
      EXPECT_NE(text.find("\"model_type\": \"qwen3_moe\""), std::string::npos) << text;
      EXPECT_EQ(text.find("intermediate_size\": 0"), std::string::npos) << text;
      expect_same(parse_llama_config(text, "config.json"), c);
    }
  }
  // A dense config stays a Llama one, with no MoE key.
  const LlamaConfig dense = llama_config_from_spec(tiny_runtime_spec());
  const std::string text = llama_config_json(dense);
  EXPECT_EQ(text.find("experts"), std::string::npos) << text;
  expect_same(parse_llama_config(text, "config.json"), dense);
}

TEST(MoeConfig, BadConfigsNameFileAndKey) {
  const std::string base = R"("hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 1024)";
  const std::string moe = base + R"(, "model_type": "qwen3_moe", "num_experts": 16,
      "num_experts_per_tok": 2, "moe_intermediate_size": 128)";
  EXPECT_EQ(parse_llama_config("{" + moe + "}", "ok.json").num_experts, 16);
  EXPECT_FALSE(parse_llama_config("{" + moe + "}", "ok.json").norm_topk_prob);  // HF default
  const std::vector<std::pair<std::string, std::string>> cases = {
      {base + R"(, "model_type": "qwen3_moe", "num_experts_per_tok": 2,
           "moe_intermediate_size": 128)",
       "missing \"num_experts\""},
      {base + R"(, "model_type": "qwen3_moe", "num_experts": 16, "moe_intermediate_size": 128)",
       "missing \"num_experts_per_tok\""},
      {base + R"(, "model_type": "qwen3_moe", "num_experts": 16, "num_experts_per_tok": 2)",
       "missing \"moe_intermediate_size\""},
      {base + R"(, "model_type": "qwen3_moe", "num_experts": 16, "num_experts_per_tok": 17,
           "moe_intermediate_size": 128)",
       "\"num_experts_per_tok\" = 17 outside [1, 16]"},
      {base + R"(, "model_type": "qwen3_moe", "num_experts": 0, "num_experts_per_tok": 1,
           "moe_intermediate_size": 128)",
       "\"num_experts\" = 0 outside"},
      {moe + R"(, "norm_topk_prob": 1)", "norm_topk_prob is not a boolean"},
      {moe + R"(, "shared_expert_intermediate_size": -64)", "\"shared_expert_intermediate_size\""},
      {moe + R"(, "decoder_sparse_step": 2)", "\"decoder_sparse_step\" = 2 makes some layers"},
      {moe + R"(, "mlp_only_layers": [0])", "\"mlp_only_layers\" makes some layers dense"},
      {base + R"(, "model_type": "qwen2_moe", "num_experts": 16)", "sigmoid-gated"},
      {base + R"(, "model_type": "mixtral", "intermediate_size": 512)", "\"mixtral\" is neither"},
      {base + R"(, "model_type": "llama", "intermediate_size": 512, "num_experts": 8)",
       "\"num_experts\" in a model_type \"llama\" config"},
      {base, "missing \"intermediate_size\""},
      {R"("hidden_size": 256, "num_hidden_layers": 1024, "num_attention_heads": 4,
          "vocab_size": 1024, "model_type": "qwen3_moe", "num_experts": 512,
          "num_experts_per_tok": 8, "moe_intermediate_size": 128)",
       "num_hidden_layers x num_experts = 524288 exceeds 262144"},
      {base + R"(, "model_type": "qwen3_moe", "num_experts": 2048, "num_experts_per_tok": 8,
           "moe_intermediate_size": 128)",
       "\"num_experts\" = 2048 outside [1, 1024]"},
  };
  for (const auto& [body, want] : cases) {
    try {
      parse_llama_config("{" + body + "}", "bad.json");
      ADD_FAILURE() << "no error for " << body;
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("bad.json: ", 0), 0u) << what;
      EXPECT_NE(what.find(want), std::string::npos) << "want '" << want << "' in: " << what;
    }
  }
}

TEST(MoeWeights, HuggingFaceNamesAndShapes) {
  const LlamaConfig c = llama_config_from_spec(tiny_moe_runtime_spec(true));
  const std::vector<WeightDesc> list = llama_weight_list(c);
  std::map<std::string, std::vector<int64_t>> shape;
  int64_t elements = 0;
  for (const WeightDesc& w : list) {
    EXPECT_TRUE(shape.emplace(w.name, w.shape).second) << "duplicate " << w.name;
    int64_t n = 1;
    for (const int64_t d : w.shape) n *= d;
    elements += n;
    EXPECT_EQ(w.name.find("mlp.gate_proj"), std::string::npos) << "dense tensor " << w.name;
  }
  // embed, lm_head, final norm; per layer 2 norms, q/k/v/o, router, 16 x 3 experts, 3 shared.
  EXPECT_EQ(list.size(), 3u + 2 * (2 + 4 + 1 + 16 * 3 + 3));
  using S = std::vector<int64_t>;
  EXPECT_EQ(shape.at("model.layers.1.mlp.gate.weight"), (S{16, 256}));
  EXPECT_EQ(shape.at("model.layers.0.mlp.experts.0.gate_proj.weight"), (S{128, 256}));
  EXPECT_EQ(shape.at("model.layers.0.mlp.experts.15.up_proj.weight"), (S{128, 256}));
  EXPECT_EQ(shape.at("model.layers.1.mlp.experts.7.down_proj.weight"), (S{256, 128}));
  EXPECT_EQ(shape.at("model.layers.1.mlp.shared_expert.gate_proj.weight"), (S{256, 256}));
  EXPECT_EQ(shape.at("model.layers.1.mlp.shared_expert.down_proj.weight"), (S{256, 256}));
  EXPECT_EQ(shape.at("model.layers.0.self_attn.q_proj.weight"), (S{512, 256}));
  EXPECT_EQ(shape.at("model.layers.0.self_attn.o_proj.weight"), (S{256, 512}));
  // policies/model_spec.cc counts the same parameters independently.
  EXPECT_EQ(elements, tiny_moe_runtime_spec(true).param_count());
  EXPECT_EQ(llama_weight_list(llama_config_from_spec(tiny_moe_runtime_spec(false))).size(),
            3u + 2 * (2 + 4 + 1 + 16 * 3));
}

TEST(MoeWeights, FidelityScalesEveryDownProjection) {
  const LlamaConfig c = llama_config_from_spec(tiny_moe_runtime_spec(true));
  const double scale = draft_layer_scale(0.5, c.layers);
  int seen = 0;
  for (const WeightDesc& w : synthetic_weight_list(c, false, 0.5)) {
    double want = -1;
    if (w.name == "model.layers.0.mlp.experts.3.down_proj.weight") want = scale / std::sqrt(128.0);
    if (w.name == "model.layers.1.mlp.shared_expert.down_proj.weight")
      want = scale / std::sqrt(256.0);
    if (w.name == "model.layers.1.mlp.gate.weight") want = 1 / 16.0;
    if (want < 0) continue;
    ++seen;
    EXPECT_DOUBLE_EQ(w.init_std, want) << w.name;
  }
  EXPECT_EQ(seen, 3);
}

// The draft module of an MoE target: its input tensors, then one MoE layer (router over every
// expert, the config's block of experts, the shared expert), as the simulator's nextn draft.
TEST(MoeWeights, DraftModuleIsAnMoeLayer) {
  const LlamaConfig c = llama_config_from_spec(tiny_moe_runtime_spec(true));
  using S = std::vector<int64_t>;
  std::map<std::string, S> shape;
  int64_t elements = 0;
  for (const WeightDesc& w : draft_weight_list(c)) {
    shape[w.name] = w.shape;
    int64_t n = 1;
    for (int64_t d : w.shape) n *= d;
    elements += n;
  }
  // enorm, hnorm, eh_proj; 2 norms, q, k, v, o; router; 16 experts x 3; shared x 3.
  EXPECT_EQ(shape.size(), 3u + 6 + 1 + 48 + 3);
  EXPECT_EQ(shape.at("mtp.eh_proj.weight"), (S{256, 512}));
  EXPECT_EQ(shape.at("mtp.layer.mlp.gate.weight"), (S{16, 256}));
  EXPECT_EQ(shape.at("mtp.layer.mlp.experts.15.gate_proj.weight"), (S{128, 256}));
  EXPECT_EQ(shape.at("mtp.layer.mlp.experts.0.down_proj.weight"), (S{256, 128}));
  EXPECT_EQ(shape.at("mtp.layer.mlp.shared_expert.down_proj.weight"), (S{256, 256}));
  // By hand: input 256 + 256 + 256 x 512; layer norms 2 x 256, qkv 1024 x 256, o 256 x 512,
  // router 16 x 256, experts 16 x (2 x 128 x 256 + 256 x 128), shared 2 x 256 x 256 + 256 x 256.
  EXPECT_EQ(elements, 131584 + 512 + 262144 + 131072 + 4096 + 1572864 + 196608);
  // Every tensor here is a multiple of 128 elements: the plan adds exactly their bytes.
  EXPECT_EQ(plan_engine_memory(c, 2, 64, 16, true).weight_bytes -
                plan_engine_memory(c, 2, 64, 16, false).weight_bytes,
            2 * elements);
  // An expert-parallel rank's draft holds its block of experts, like its model layers.
  LlamaConfig rank1 = c;
  rank1.expert_begin = 8;
  rank1.num_local_experts = 8;
  int experts = 0;
  for (const WeightDesc& w : draft_weight_list(rank1)) {
    if (w.name.find(".experts.") == std::string::npos) continue;
    ++experts;
    const int j = std::stoi(w.name.substr(w.name.find(".experts.") + 9));
    EXPECT_TRUE(j >= 8 && j < 16) << w.name;
  }
  EXPECT_EQ(experts, 8 * 3);
  // Fidelity: the draft's own residual outputs (every expert's down, the shared expert's, o) at
  // 1e-3 of their init, eh_proj the identity on the embedding half.
  int checked = 0;
  for (const WeightDesc& w : synthetic_weight_list(c, true, 0.5)) {
    if (w.name == "mtp.layer.mlp.experts.7.down_proj.weight") {
      EXPECT_DOUBLE_EQ(w.init_std, 1e-3 / std::sqrt(128.0));
      ++checked;
    } else if (w.name == "mtp.layer.mlp.shared_expert.down_proj.weight") {
      EXPECT_DOUBLE_EQ(w.init_std, 1e-3 / std::sqrt(256.0));
      ++checked;
    } else if (w.name == "mtp.eh_proj.weight") {
      EXPECT_TRUE(w.eye);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3);
  // A synthetic checkpoint with the draft opens with it, every tensor checked.
  const fs::path dir = fs::temp_directory_path() / "twinstep_moe_ck_draft";
  fs::remove_all(dir);
  write_synthetic_checkpoint(tiny_moe_runtime_spec(true), dir.string(), 1, uint64_t{1} << 30, 0.5);
  EXPECT_TRUE(Checkpoint::open(dir.string())->has_draft());
  fs::remove_all(dir);
}

TEST(MoeMemoryPlan, Qwen3_30bA3bByHand) {
  const LlamaConfig c = llama_config_from_spec(model_preset("qwen3-30b-a3b"));
  const EngineMemoryPlan p = plan_engine_memory(c, 16, 1216, 16384);
  // Per layer 623,120,384 elements: norms 2 x 2048, qkv 5120 x 2048, o 2048 x 4096, router
  // 128 x 2048, experts' gate_up 128 x 1536 x 2048, down 128 x 2048 x 768 (all multiples of
  // 128); x 48 layers, plus embed and lm_head 151936 x 2048 each and the final norm 2048:
  // 30,532,110,336 parameters, as policies/model_spec.cc counts them.
  EXPECT_EQ(p.weight_bytes, int64_t{61'064'220'672});
  EXPECT_EQ(p.weight_bytes, 2 * model_preset("qwen3-30b-a3b").param_count());
  // 96 KiB per token (48 layers x K,V x 4 heads x 128 x 2 bytes), 17 slots x 1216 tokens.
  EXPECT_EQ(p.kv_bytes, int64_t{17} * 1216 * 98'304);
  // moe_forward workspace of 16 rows, each part 256-byte aligned: logits 16 x 128 x 4 = 8192,
  // ids and weights 512 each, expert list 512, count 256, slot_of 2048, activations
  // 16 x 8 x 768 x 2 = 196608, shared activations 256, partial sums 16 x 9 x 2048 x 4 = 1179648.
  EXPECT_EQ(plan_moe_workspace_bytes(c, 16), 1'388'544);
  EXPECT_EQ(plan_moe_workspace_bytes(llama_config_from_spec(tiny_runtime_spec()), 16), 0);
  // moe_prefill workspace of 4096 rows (32768 pairs), each part 256-byte aligned: logits
  // 4096 x 128 x 4 = 2097152, ids and weights 131072 each, per-block counts 128 x 128 x 4 =
  // 65536, tile table (32768 / 64 + 128) x 16 = 10240, tile count 256, two permutations 131072
  // each, activations 32768 x 768 x 2 = 50331648, shared activations 4096 x 2 = 8192, partial sums
  // 4096 x 9 x 2048 x 4 = 301989888.
  EXPECT_EQ(plan_moe_prefill_workspace_bytes(c, 4096), 355'027'200);
  EXPECT_EQ(plan_moe_prefill_workspace_bytes(llama_config_from_spec(tiny_runtime_spec()), 64), 0);
  // The plan's buffers hold the larger, one MoE workspace (prefill passes of 16384 rows run in
  // calls of kMoePrefillRowsPerCall = 4096; the same plan with a dense FFN of width 0 lacks only
  // it); a plan whose prefill passes stay within 16 rows holds moe_forward's alone.
  LlamaConfig no_ffn = c;
  no_ffn.num_experts = 0;
  EXPECT_EQ(p.buffer_bytes - plan_engine_memory(no_ffn, 16, 1216, 16384).buffer_bytes, 355'027'200);
  EXPECT_EQ(plan_engine_memory(c, 1, 16, 16).buffer_bytes -
                plan_engine_memory(no_ffn, 1, 16, 16).buffer_bytes,
            1'388'544);
  EXPECT_LT(p.total_bytes(), int64_t{100} << 30);  // fits an H200 (about 139 GiB) with room
}

class MoeCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("twinstep_moe_ck_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(MoeCheckpointTest, SyntheticRoundTripSharded) {
  const ModelSpec spec = tiny_moe_runtime_spec(true);
  write_synthetic_checkpoint(spec, dir_.string(), 5, /*shard_bytes=*/1 << 20);
  EXPECT_TRUE(fs::exists(dir_ / "model.safetensors.index.json"));
  auto ck = Checkpoint::open(dir_.string());
  expect_same(ck->config(), llama_config_from_spec(spec));
  EXPECT_FALSE(ck->has_draft());
  for (const WeightDesc& w : llama_weight_list(ck->config())) {
    const auto bytes = ck->tensor(w.name);
    const uint64_t n = bytes.size() / 2;
    std::vector<uint16_t> want(n), got(n);
    synthetic_tensor_bits(w, 5, 0, n, want.data());
    std::memcpy(got.data(), bytes.data(), bytes.size());
    ASSERT_EQ(got, want) << w.name;
  }
}

TEST_F(MoeCheckpointTest, MissingExpertAndQkNormAreRefused) {
  const LlamaConfig c = llama_config_from_spec(tiny_moe_runtime_spec(false));
  auto write = [&](const std::vector<WeightDesc>& list) {
    fs::create_directories(dir_);
    std::ofstream(dir_ / "config.json") << llama_config_json(c);
    std::vector<TensorSource> sources;
    for (const WeightDesc& w : list)
      sources.push_back(
          {w.name, DType::kBF16, w.shape, [w](std::byte* dst, uint64_t offset, uint64_t count) {
             synthetic_tensor_bits(w, 1, offset, count, reinterpret_cast<uint16_t*>(dst));
           }});
    write_safetensors((dir_ / "model.safetensors").string(), sources);
  };
  auto open_error = [&]() {
    try {
      Checkpoint::open(dir_.string());
    } catch (const CheckpointError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::vector<WeightDesc> list = llama_weight_list(c);
  std::vector<WeightDesc> missing;
  for (const WeightDesc& w : list)
    if (w.name != "model.layers.1.mlp.experts.9.up_proj.weight") missing.push_back(w);
  write(missing);
  EXPECT_NE(open_error().find("tensor model.layers.1.mlp.experts.9.up_proj.weight is missing"),
            std::string::npos)
      << open_error();
  list.push_back({"model.layers.0.self_attn.q_norm.weight", {128}, 0});
  write(list);
  EXPECT_NE(open_error().find("per-head q/k RMSNorm"), std::string::npos) << open_error();
}

// The CPU reference's MoE layer against kernels/moe.h's formula evaluated directly in double on
// one token: softmax over the selected logits, each expert's SwiGLU. Checks the reference
// itself (its routing and weighting), independently of any GPU.
TEST(MoeCpuReference, OneTokenMatchesTheFormula) {
  for (const bool shared : {false, true}) {
    const LlamaConfig c = llama_config_from_spec(tiny_moe_runtime_spec(shared));
    testing::CpuLlama cpu(c, 3);
    const int H = int(c.hidden);
    std::vector<float> x(static_cast<size_t>(H));
    for (int i = 0; i < H; ++i) x[size_t(i)] = testing::bf16_round(std::sin(0.37f * float(i)));
    const std::vector<float> got = cpu.moe_layer(0, x);

    std::map<std::string, std::vector<float>> w;
    for (const WeightDesc& d : llama_weight_list(c)) {
      uint64_t n = 1;
      for (const int64_t s : d.shape) n *= uint64_t(s);
      std::vector<uint16_t> bits(n);
      synthetic_tensor_bits(d, 3, 0, n, bits.data());
      std::vector<float>& f = w[d.name];
      for (const uint16_t b : bits) f.push_back(synthetic::bf16_bits_to_float(b));
    }
    auto dot = [&](const std::vector<float>& m, int row, const std::vector<double>& v) {
      double s = 0;
      for (size_t i = 0; i < v.size(); ++i) s += double(m[size_t(row) * v.size() + i]) * v[i];
      return s;
    };
    const std::vector<double> xd(x.begin(), x.end());
    auto swiglu = [&](const std::string& f, int inter) {
      std::vector<double> act(static_cast<size_t>(inter));
      for (int i = 0; i < inter; ++i) {
        const double g = dot(w.at(f + "gate_proj.weight"), i, xd);
        const double u = dot(w.at(f + "up_proj.weight"), i, xd);
        act[size_t(i)] = g / (1 + std::exp(-g)) * u;
      }
      std::vector<double> y(static_cast<size_t>(H));
      for (int h = 0; h < H; ++h) y[size_t(h)] = dot(w.at(f + "down_proj.weight"), h, act);
      return y;
    };
    const std::string p = "model.layers.0.mlp.";
    std::vector<std::pair<double, int>> logits;
    for (int e = 0; e < c.num_experts; ++e)
      logits.push_back({dot(w.at(p + "gate.weight"), e, xd), e});
    std::sort(logits.begin(), logits.end(), std::greater<>());
    double denom = 0;
    for (int j = 0; j < c.top_k; ++j) denom += std::exp(logits[size_t(j)].first);
    std::vector<double> want(static_cast<size_t>(H), 0.0);
    for (int j = 0; j < c.top_k; ++j) {
      const double wt = std::exp(logits[size_t(j)].first) / denom;
      const auto y = swiglu(p + "experts." + std::to_string(logits[size_t(j)].second) + ".",
                            int(c.expert_intermediate));
      for (int h = 0; h < H; ++h) want[size_t(h)] += wt * y[size_t(h)];
    }
    if (shared) {
      const auto y = swiglu(p + "shared_expert.", int(c.shared_intermediate));
      for (int h = 0; h < H; ++h) want[size_t(h)] += y[size_t(h)];
    }
    double err = 0, norm = 0;
    for (int h = 0; h < H; ++h) {
      err += std::pow(double(got[size_t(h)]) - want[size_t(h)], 2);
      norm += want[size_t(h)] * want[size_t(h)];
    }
    // bf16 roundings of the activation and the output: ~2^-8 relative each.
    EXPECT_LT(std::sqrt(err / norm), 1e-2) << "shared " << shared;
    EXPECT_GT(norm, 1.0) << "the layer's output should not be negligible";
  }
}

}  // namespace
}  // namespace twinstep
