// Experiment YAML loading: good files parse to the values written in them, sweeps expand in
// order, and every malformed file under bad/ fails at the position and with the phrase its
// first line names ("# expect: LINE:COLUMN phrase").
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "experiments/experiment.h"
#include "experiments/yaml_fields.h"
#include "policies/error.h"

namespace twinstep {
namespace {

const std::string kDir = std::string(TWINSTEP_SOURCE_DIR) + "/tests/experiments";

Experiment load(const std::string& relative) { return load_experiment_file(kDir + "/" + relative); }

// Written out here, not taken from policies/rng.h, so the test checks the documented formula.
uint64_t reference_splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::string error_of(const std::string& text, const std::string& source = "t.yaml") {
  try {
    load_experiment_text(text, source);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

constexpr char kMinimal[] =
    "name: t\nmodel: tiny-llama\nhardware: h200\n"
    "workload: {input_len: 10, output_len: 5, requests: 2}\n";

TEST(ExperimentGood, QuickstartFields) {
  const Experiment exp = load("good/quickstart_like.yaml");
  EXPECT_EQ(exp.name, "quickstart");
  EXPECT_EQ(exp.description, "Lockstep vs run-ahead on Llama-3-8B, H200");
  EXPECT_EQ(exp.source_path, kDir + "/good/quickstart_like.yaml");
  EXPECT_NE(exp.yaml_text.find("name: quickstart"), std::string::npos);
  ASSERT_EQ(exp.backends.size(), 1u);
  EXPECT_EQ(exp.backends[0], BackendKind::kSim);
  ASSERT_EQ(exp.variants.size(), 1u);
  const Variant& v = exp.variants[0];
  EXPECT_EQ(v.index, 0);
  EXPECT_EQ(v.label, "base");
  EXPECT_TRUE(v.params.empty());
  EXPECT_EQ(v.seed, 42u);

  EXPECT_EQ(v.model.name, "llama-3-8b");
  EXPECT_EQ(v.model.hidden, 4096);
  EXPECT_EQ(v.model.vocab, 128256);
  ASSERT_EQ(v.model.layers.size(), 32u);
  EXPECT_EQ(v.model.layers[0].attn.num_q_heads, 32);
  EXPECT_EQ(v.model.layers[0].attn.num_kv_heads, 8);
  EXPECT_EQ(v.hardware.name, "h200");

  EXPECT_EQ(v.workload.input_len.lo, 8192);
  EXPECT_EQ(v.workload.input_len.hi, 8192);
  EXPECT_EQ(v.workload.output_len.lo, 1024);
  EXPECT_EQ(v.workload.num_requests, 100);
  EXPECT_EQ(v.workload.max_concurrency, 1);
  EXPECT_DOUBLE_EQ(v.workload.arrival_rate_per_s, 2.0);
  EXPECT_EQ(v.workload.seed, 1u);

  EXPECT_EQ(v.policy.host_schedule, HostSchedule::kRunahead);
  EXPECT_EQ(v.policy.runahead_depth, 1);
  EXPECT_EQ(v.policy.graph_mode, GraphMode::kCudaGraph);
  EXPECT_FALSE(v.policy.seq_lens_sync);
  EXPECT_EQ(v.policy.output_copy_bytes_per_request, 64);

  const auto& ops = v.host_costs.ops;
  const DurationDist& schedule = ops[static_cast<int>(HostOp::kSchedule)];
  EXPECT_EQ(schedule.kind, DistKind::kFixed);
  EXPECT_EQ(schedule.mean_ns, 120'000);
  const DurationDist& prefill = ops[static_cast<int>(HostOp::kPreparePrefill)];
  EXPECT_EQ(prefill.kind, DistKind::kFixed);
  EXPECT_EQ(prefill.mean_ns, 0);
  const DurationDist& decode = ops[static_cast<int>(HostOp::kPrepareDecode)];
  EXPECT_EQ(decode.kind, DistKind::kNormal);
  EXPECT_EQ(decode.mean_ns, 300'000);
  EXPECT_EQ(decode.std_ns, 30'000);
  const DurationDist& outputs = ops[static_cast<int>(HostOp::kProcessOutputs)];
  EXPECT_EQ(outputs.kind, DistKind::kLognormal);
  EXPECT_EQ(outputs.mean_ns, 200'000);
  EXPECT_EQ(outputs.std_ns, 50'000);

  ASSERT_EQ(v.host_costs.spikes.size(), 2u);
  EXPECT_EQ(v.host_costs.spikes[0].op, HostOp::kProcessOutputs);
  EXPECT_EQ(v.host_costs.spikes[0].every_steps, 100);
  EXPECT_EQ(v.host_costs.spikes[0].phase_step, 0);
  EXPECT_EQ(v.host_costs.spikes[0].extra_ns, 2'000'000);
  EXPECT_EQ(v.host_costs.spikes[1].op, HostOp::kSchedule);
  EXPECT_EQ(v.host_costs.spikes[1].every_steps, 0);
  EXPECT_DOUBLE_EQ(v.host_costs.spikes[1].probability, 0.01);
  EXPECT_EQ(v.host_costs.spikes[1].extra_ns, 500'000);

  EXPECT_EQ(v.trace.first_step, 100);
  EXPECT_EQ(v.trace.step_count, 8);
  EXPECT_TRUE(v.trace.nodes);
}

TEST(ExperimentGood, MinimalTakesDefaults) {
  const Experiment exp = load("good/minimal.yaml");
  ASSERT_EQ(exp.variants.size(), 1u);
  const Variant& v = exp.variants[0];
  EXPECT_EQ(exp.description, "");
  ASSERT_EQ(exp.backends.size(), 1u);
  EXPECT_EQ(exp.backends[0], BackendKind::kSim);
  EXPECT_EQ(v.seed, 0u);
  EXPECT_EQ(v.model.name, "tiny-llama");
  EXPECT_EQ(v.hardware.name, "h100");
  EXPECT_EQ(v.workload.input_len.lo, 128);
  EXPECT_EQ(v.workload.output_len.hi, 16);
  EXPECT_EQ(v.workload.num_requests, 3);
  EXPECT_EQ(v.workload.max_concurrency, 1);
  EXPECT_EQ(v.workload.arrival_rate_per_s, 0);
  EXPECT_EQ(v.workload.seed, reference_splitmix64(0 ^ 0x776f726b6c6f6164ULL));
  const PolicySpec defaults;
  EXPECT_EQ(v.policy.host_schedule, defaults.host_schedule);
  EXPECT_EQ(v.policy.graph_mode, defaults.graph_mode);
  EXPECT_EQ(v.policy.runahead_depth, defaults.runahead_depth);
  for (const DurationDist& d : v.host_costs.ops) {
    EXPECT_EQ(d.kind, DistKind::kFixed);
    EXPECT_EQ(d.mean_ns, 0);
  }
  EXPECT_TRUE(v.host_costs.spikes.empty());
  EXPECT_EQ(v.trace.step_count, 0);
  EXPECT_FALSE(v.trace.nodes);
}

// policies.fusion sets the variant's ModelSpec::fusion (what step_kernels lists and the real
// runtime's EngineOptions take); a sweep over it makes one variant per value; absent: no fusion.
TEST(ExperimentGood, FusionSetsTheModelsKernelFusion) {
  const std::string text = std::string(kMinimal) +
                           "policies:\n  fusion: {rope: true}\n"
                           "sweep:\n  policies.fusion.norms: [false, true]\n";
  const Experiment exp = load_experiment_text(text, "t.yaml");
  ASSERT_EQ(exp.variants.size(), 2u);
  EXPECT_FALSE(exp.variants[0].model.fusion.norms);
  EXPECT_TRUE(exp.variants[0].model.fusion.rope);
  EXPECT_TRUE(exp.variants[1].model.fusion.norms);
  EXPECT_TRUE(exp.variants[1].model.fusion.rope);
  EXPECT_FALSE(load_experiment_text(kMinimal, "t.yaml").variants[0].model.fusion.any());
}

TEST(ExperimentGood, WorkloadSeedDerivesFromExperimentSeed) {
  const std::string text = std::string(kMinimal) + "seed: 12345\n";
  const Experiment exp = load_experiment_text(text, "t.yaml");
  EXPECT_EQ(exp.variants[0].seed, 12345u);
  EXPECT_EQ(exp.variants[0].workload.seed, reference_splitmix64(12345 ^ 0x776f726b6c6f6164ULL));
  const Experiment max_seed =
      load_experiment_text(std::string(kMinimal) + "seed: 18446744073709551615\n", "t.yaml");
  EXPECT_EQ(max_seed.variants[0].seed, 18446744073709551615ULL);
}

TEST(ExperimentGood, SweepOrderLabelsAndValues) {
  const Experiment exp = load("good/sweep.yaml");
  ASSERT_EQ(exp.backends.size(), 2u);
  EXPECT_EQ(exp.backends[1], BackendKind::kReal);
  ASSERT_EQ(exp.variants.size(), 6u);
  const int concurrency[] = {1, 1, 2, 2, 4, 4};
  const HostSchedule schedule[] = {HostSchedule::kLockstep, HostSchedule::kRunahead};
  const char* schedule_name[] = {"lockstep", "runahead"};
  for (int i = 0; i < 6; ++i) {
    const Variant& v = exp.variants[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(v.index, i);
    EXPECT_EQ(v.seed, 7u);
    EXPECT_EQ(v.workload.max_concurrency, concurrency[i]);
    EXPECT_EQ(v.policy.host_schedule, schedule[i % 2]);
    EXPECT_EQ(v.policy.graph_mode, GraphMode::kEager);
    EXPECT_EQ(v.workload.input_len.lo, 100);
    EXPECT_EQ(v.workload.input_len.hi, 200);
    const std::string c = std::to_string(concurrency[i]);
    EXPECT_EQ(v.label,
              "workload.concurrency=" + c + ", policies.host_schedule=" + schedule_name[i % 2]);
    ASSERT_EQ(v.params.size(), 2u);
    EXPECT_EQ(v.params[0], std::make_pair(std::string("workload.concurrency"), c));
    EXPECT_EQ(v.params[1].first, "policies.host_schedule");
    EXPECT_EQ(v.params[1].second, schedule_name[i % 2]);
  }
}

TEST(ExperimentGood, PresetOverridesAndMappingSweepValues) {
  const Experiment exp = load("good/overrides.yaml");
  ASSERT_EQ(exp.variants.size(), 4u);
  const ModelSpec& preset = model_preset("llama-3-8b");
  const int layers[] = {1, 1, 40, 40};
  for (int i = 0; i < 4; ++i) {
    const Variant& v = exp.variants[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(v.model.name, "llama-small");
    EXPECT_EQ(v.model.hidden, 2048);
    EXPECT_EQ(v.model.vocab, 1000);
    ASSERT_EQ(v.model.layers.size(), size_t(layers[i]));
    EXPECT_EQ(v.model.layers.back().attn.head_dim, preset.layers[0].attn.head_dim);
    EXPECT_EQ(v.model.layers.back().mlp.intermediate, preset.layers[0].mlp.intermediate);
    EXPECT_DOUBLE_EQ(v.hardware.stream_read_tbps, 4.25);
    EXPECT_EQ(v.hardware.eager_launch_ns, 3500);
    EXPECT_EQ(v.hardware.graph_launch_ns, 6000);
    EXPECT_EQ(v.hardware.sm_count, 100);
    EXPECT_DOUBLE_EQ(v.hardware.hbm_tbps, hardware_preset("h200").hbm_tbps);
    EXPECT_NE(v.hardware.source.find("; overridden by the experiment: stream_read_tbps, "
                                     "sm_count, eager_launch_ns, graph_launch_ns"),
              std::string::npos)
        << v.hardware.source;
    const DurationDist& prefill = v.host_costs.ops[static_cast<int>(HostOp::kPreparePrefill)];
    EXPECT_EQ(prefill.kind, DistKind::kUniform);
    EXPECT_EQ(prefill.lo_ns, 1'000'000);
    EXPECT_EQ(prefill.hi_ns, 3'000'000);
    EXPECT_EQ(prefill.mean_ns, 2'000'000);
  }
  const DurationDist& fixed =
      exp.variants[0].host_costs.ops[static_cast<int>(HostOp::kProcessOutputs)];
  EXPECT_EQ(fixed.kind, DistKind::kFixed);
  EXPECT_EQ(fixed.mean_ns, 250);
  const DurationDist& normal =
      exp.variants[1].host_costs.ops[static_cast<int>(HostOp::kProcessOutputs)];
  EXPECT_EQ(normal.kind, DistKind::kNormal);
  EXPECT_EQ(normal.mean_ns, 2000);
  EXPECT_EQ(normal.std_ns, 1000);
  EXPECT_EQ(exp.variants[1].label,
            "model.num_layers=1, hardware.sm_count=100, "
            "host.process_outputs={dist: normal, mean: 2us, std: 1us}");
}

TEST(ExperimentGood, NumLayersRepeatsThePresetPattern) {
  const std::string text =
      "name: t\nmodel: {preset: ling-flash-like, num_layers: 50}\nhardware: h200\n"
      "workload: {input_len: 10, output_len: 5, requests: 2}\n";
  const Variant v = load_experiment_text(text, "t.yaml").variants[0];
  const ModelSpec& preset = model_preset("ling-flash-like");
  ASSERT_EQ(preset.layers.size(), 42u);
  ASSERT_EQ(v.model.layers.size(), 50u);
  for (size_t i = 0; i < 50; ++i) {
    EXPECT_EQ(v.model.layers[i].attn.kind, preset.layers[i % 42].attn.kind) << i;
    EXPECT_EQ(v.model.layers[i].mlp.kind, preset.layers[i % 42].mlp.kind) << i;
  }
  EXPECT_EQ(v.model.layers[47].attn.kind, AttentionKind::kMla);
  EXPECT_EQ(v.model.layers[42].mlp.kind, MlpKind::kDense);
  EXPECT_EQ(v.model.layers[43].mlp.kind, MlpKind::kMoe);
  EXPECT_EQ(v.model.name, "ling-flash-like");
}

TEST(ExperimentGood, SweepOverPresetFieldsListItemsAndAbsentKeys) {
  const Experiment exp = load("good/preset_sweep.yaml");
  ASSERT_EQ(exp.variants.size(), 4u);
  const double tbps[] = {2.5, 2.5, 3.0, 3.0};
  const int64_t extra_ns[] = {1'000'000, 5'000'000, 1'000'000, 5'000'000};
  for (int i = 0; i < 4; ++i) {
    const Variant& v = exp.variants[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(v.hardware.name, "h100");
    EXPECT_DOUBLE_EQ(v.hardware.stream_read_tbps, tbps[i]);
    ASSERT_EQ(v.host_costs.spikes.size(), 1u);
    EXPECT_EQ(v.host_costs.spikes[0].extra_ns, extra_ns[i]);
    EXPECT_EQ(v.host_costs.spikes[0].every_steps, 10);
    EXPECT_EQ(v.trace.step_count, 4);
    EXPECT_EQ(v.trace.first_step, 0);
  }
  EXPECT_EQ(exp.variants[2].label,
            "hardware.stream_read_tbps=3.0, host.spikes.0.extra=1ms, trace.steps=4");
}

TEST(ExperimentGood, InlineModelAndHardware) {
  const Variant v = load("good/inline_hw.yaml").variants[0];
  EXPECT_EQ(v.model.name, "toy");
  EXPECT_EQ(v.model.hidden, 512);
  EXPECT_EQ(v.model.vocab, 1000);
  EXPECT_TRUE(v.model.tie_embeddings);
  EXPECT_EQ(v.model.weight_bytes, 2);
  ASSERT_EQ(v.model.layers.size(), 2u);
  EXPECT_EQ(v.model.layers[1].attn.kind, AttentionKind::kGqa);
  EXPECT_EQ(v.model.layers[1].attn.num_q_heads, 8);
  EXPECT_EQ(v.model.layers[1].attn.num_kv_heads, 2);
  EXPECT_EQ(v.model.layers[1].attn.head_dim, 64);
  EXPECT_EQ(v.model.layers[1].mlp.kind, MlpKind::kDense);
  EXPECT_EQ(v.model.layers[1].mlp.intermediate, 1536);
  EXPECT_EQ(v.hardware.name, "toy-gpu");
  EXPECT_EQ(v.hardware.hbm_bytes, 80'000'000'000);
  EXPECT_DOUBLE_EQ(v.hardware.hbm_tbps, 2.0);
  EXPECT_DOUBLE_EQ(v.hardware.stream_read_tbps, 1.8);
  EXPECT_DOUBLE_EQ(v.hardware.bf16_tflops, 300);
  const HardwareSpec defaults;
  EXPECT_EQ(v.hardware.eager_launch_ns, defaults.eager_launch_ns);
  EXPECT_NE(v.hardware.source.find("inline in "), std::string::npos);
  EXPECT_EQ(v.policy.host_schedule, HostSchedule::kLockstep);
  EXPECT_EQ(v.policy.graph_mode, GraphMode::kCudaGraphPdl);
  EXPECT_TRUE(v.policy.seq_lens_sync);
}

TEST(ExperimentGood, FullSchemaExampleLoads) {
  const Experiment exp = load_experiment_file(std::string(TWINSTEP_SOURCE_DIR) +
                                              "/experiments/examples/full_schema.yaml");
  EXPECT_EQ(exp.name, "full_schema");
  ASSERT_EQ(exp.variants.size(), 4u);
  const Variant& v = exp.variants[3];
  EXPECT_EQ(v.label,
            "policies.graph_mode=cuda_graph_pdl, "
            "host.prepare_decode={dist: uniform, lo: 400us, hi: 500us}");
  ASSERT_EQ(v.model.layers.size(), 6u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(v.model.layers[i].attn.kind, AttentionKind::kLinear);
    EXPECT_EQ(v.model.layers[i].attn.conv_width, 4);
    EXPECT_EQ(v.model.layers[i].mlp.kind, MlpKind::kMoe);
    EXPECT_EQ(v.model.layers[i].mlp.num_experts, 64);
    EXPECT_EQ(v.model.layers[i].mlp.top_k, 4);
    EXPECT_EQ(v.model.layers[i].mlp.shared_intermediate, 1024);
  }
  const AttentionSpec& mla = v.model.layers[3].attn;
  EXPECT_EQ(mla.kind, AttentionKind::kMla);
  EXPECT_EQ(mla.num_kv_heads, 1);
  EXPECT_EQ(mla.q_lora_rank, 512);
  EXPECT_EQ(mla.kv_lora_rank, 256);
  EXPECT_EQ(mla.qk_rope_head_dim, 32);
  EXPECT_EQ(v.model.layers[5].attn.num_kv_heads, 4);
  EXPECT_EQ(v.model.layers[5].mlp.intermediate, 4096);
  EXPECT_EQ(v.hardware.eager_launch_ns, 4000);
  EXPECT_EQ(v.workload.output_len.lo, 256);
  EXPECT_EQ(v.workload.output_len.hi, 1024);
  EXPECT_EQ(v.policy.graph_mode, GraphMode::kCudaGraphPdl);
  EXPECT_EQ(v.host_costs.ops[static_cast<int>(HostOp::kPrepareDecode)].kind, DistKind::kUniform);
  EXPECT_EQ(v.host_costs.ops[static_cast<int>(HostOp::kPreparePrefill)].mean_ns, 1'000'000);
}

// acceptance.calibrated names a source, resolved at run time (the loader never opens a
// database); draft_fidelity goes to the real backend.
TEST(ExperimentGood, CalibratedAcceptanceSource) {
  const Experiment exp = load_experiment_text(
      std::string(kMinimal) +
          "acceptance:\n  draft_fidelity: 0.55\n"
          "  calibrated: {experiment: calib, variant: \"f=0.55\", db: other.db}\n",
      "c.yaml");
  const AcceptanceSpec& a = exp.variants[0].acceptance;
  EXPECT_DOUBLE_EQ(a.draft_fidelity, 0.55);
  ASSERT_TRUE(a.calibrated_from);
  EXPECT_FALSE(a.calibrated);
  EXPECT_EQ(a.calibrated_from->experiment, "calib");
  EXPECT_EQ(a.calibrated_from->variant, "f=0.55");
  EXPECT_EQ(a.calibrated_from->db, "other.db");
  EXPECT_EQ(a.calibrated_from->run_id, 0);
  EXPECT_EQ(a.calibrated_from->where, "c.yaml:7:15");
  const Experiment by_id = load_experiment_text(
      std::string(kMinimal) + "acceptance: {calibrated: {run: 12}}\n", "c.yaml");
  EXPECT_EQ(by_id.variants[0].acceptance.calibrated_from->run_id, 12);
  EXPECT_DOUBLE_EQ(by_id.variants[0].acceptance.draft_fidelity, 0.9);  // the default
}

// acceptance.calibrated.bonus_from: {experiment, variant}, with align: position only.
TEST(ExperimentGood, CalibratedAcceptanceBonusFrom) {
  auto load = [](const std::string& tail) {
    return load_experiment_text(
        std::string(kMinimal) + "acceptance:\n  calibrated: {experiment: calib" + tail + "}\n",
        "c.yaml");
  };
  const Experiment e =
      load(", align: position, bonus_from: {experiment: offset, variant: \"chain6\"}");
  const AcceptanceSource& s = *e.variants[0].acceptance.calibrated_from;
  EXPECT_EQ(s.bonus_experiment, "offset");
  EXPECT_EQ(s.bonus_variant, "chain6");
  EXPECT_EQ(load(", align: position, bonus_from: {experiment: offset}")
                .variants[0]
                .acceptance.calibrated_from->bonus_variant,
            "");
  auto error_of = [&](const std::string& tail) {
    try {
      load(tail);
    } catch (const ConfigError& x) {
      return std::string(x.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(error_of(", bonus_from: {experiment: offset}")
                .find("c.yaml:6:35: acceptance.calibrated.bonus_from needs align: position"),
            std::string::npos)
      << error_of(", bonus_from: {experiment: offset}");
  EXPECT_NE(error_of(", align: position, bonus_from: {variant: x}")
                .find("acceptance.calibrated.bonus_from needs experiment"),
            std::string::npos);
  EXPECT_NE(error_of(", align: position, bonus_from: {experiment: offset, run: 3}")
                .find("c.yaml:6:85: unknown key 'run' in acceptance.calibrated.bonus_from; "
                      "allowed: experiment, variant"),
            std::string::npos)
      << error_of(", align: position, bonus_from: {experiment: offset, run: 3}");
}

// acceptance.calibrated.align: position or round (the default); anything else is refused at its
// position.
TEST(ExperimentGood, CalibratedAcceptanceAlign) {
  auto load = [](const std::string& align) {
    return load_experiment_text(
        std::string(kMinimal) + "acceptance:\n  calibrated: {experiment: calib" + align + "}\n",
        "c.yaml");
  };
  EXPECT_TRUE(load(", align: position").variants[0].acceptance.calibrated_from->align_position);
  EXPECT_FALSE(load(", align: round").variants[0].acceptance.calibrated_from->align_position);
  EXPECT_FALSE(load("").variants[0].acceptance.calibrated_from->align_position);
  try {
    load(", align: text");
    ADD_FAILURE() << "align: text was accepted";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("c.yaml:6:42: "), std::string::npos) << m;  // the value
    EXPECT_NE(m.find("acceptance.calibrated.align is \"text\""), std::string::npos) << m;
  }
}

TEST(ExperimentGood, DurationsRoundToNanoseconds) {
  const std::string base = std::string(kMinimal) + "host:\n  schedule: ";
  auto schedule_ns = [&](const std::string& d) {
    return load_experiment_text(base + d + "\n", "t.yaml")
        .variants[0]
        .host_costs.ops[static_cast<int>(HostOp::kSchedule)]
        .mean_ns;
  };
  EXPECT_EQ(schedule_ns("1.1us"), 1100);
  EXPECT_EQ(schedule_ns("0.5s"), 500'000'000);
  EXPECT_EQ(schedule_ns("7ns"), 7);
  EXPECT_EQ(schedule_ns("0ns"), 0);
  EXPECT_EQ(schedule_ns("3600s"), 3'600'000'000'000);
  EXPECT_NE(error_of(base + "3601s\n").find("longer than the limit of 3600s"), std::string::npos);
}

TEST(ExperimentGood, LargeSweepExpandsInOrder) {
  std::string text = std::string(kMinimal) + "sweep:\n  workload.requests: [";
  for (int i = 1; i <= 100; ++i) text += (i > 1 ? ", " : "") + std::to_string(i);
  text += "]\n  workload.concurrency: [";
  for (int i = 1; i <= 30; ++i) text += (i > 1 ? ", " : "") + std::to_string(i);
  text += "]\n";
  const Experiment exp = load_experiment_text(text, "t.yaml");
  ASSERT_EQ(exp.variants.size(), 3000u);
  for (int i = 0; i < 3000; ++i) {
    ASSERT_EQ(exp.variants[i].workload.num_requests, i / 30 + 1);
    ASSERT_EQ(exp.variants[i].workload.max_concurrency, i % 30 + 1);
  }
}

TEST(ExperimentGood, EveryExperimentInTheRepositoryLoads) {
  const std::filesystem::path root = std::string(TWINSTEP_SOURCE_DIR) + "/experiments";
  int loaded = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    try {
      const Experiment exp = load_experiment_file(entry.path().string());
      EXPECT_FALSE(exp.variants.empty());
    } catch (const ConfigError& e) {
      ADD_FAILURE() << e.what();
    }
    ++loaded;
  }
  EXPECT_GE(loaded, 1);
}

// ---- errors ---------------------------------------------------------------------------------

struct Expectation {
  std::string location;  // "LINE:COLUMN"
  std::string phrase;
};

Expectation read_expectation(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  const std::string tag = "# expect: ";
  if (line.rfind(tag, 0) != 0) return {};
  const std::string rest = line.substr(tag.size());
  const size_t space = rest.find(' ');
  return {rest.substr(0, space), rest.substr(space + 1)};
}

std::vector<std::string> bad_files() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(kDir + "/bad")) {
    if (entry.path().extension() == ".yaml") names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class BadExperiment : public testing::TestWithParam<std::string> {};

TEST_P(BadExperiment, FailsAtTheExpectedPlaceWithTheExpectedPhrase) {
  const std::string path = kDir + "/bad/" + GetParam();
  const Expectation expect = read_expectation(path);
  ASSERT_FALSE(expect.location.empty()) << path << ": first line must be '# expect: L:C phrase'";
  try {
    load_experiment_file(path);
    FAIL() << path << " loaded without an error";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.where(), path + ":" + expect.location) << what;
    EXPECT_EQ(what.rfind(path + ":" + expect.location + ": ", 0), 0u) << what;
    EXPECT_NE(what.find(expect.phrase), std::string::npos)
        << "message: " << what << "\nexpected phrase: " << expect.phrase;
  }
}

INSTANTIATE_TEST_SUITE_P(Files, BadExperiment, testing::ValuesIn(bad_files()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return std::filesystem::path(info.param).stem().string();
                         });

TEST(ExperimentErrors, ManyBadFiles) { EXPECT_GE(bad_files().size(), 20u); }

// The suggestion appended to unknown keys, enum values and preset names: the closest name within
// two edits and a third of the longer length, the first of equals; none past that.
TEST(ExperimentErrors, SuggestsOnlyCloseNames) {
  using yaml::did_you_mean;
  EXPECT_EQ(did_you_mean("runahed", {"lockstep", "runahead"}), "; did you mean 'runahead'?");
  EXPECT_EQ(did_you_mean("reqeusts", {"input_len", "requests"}), "; did you mean 'requests'?");
  EXPECT_EQ(did_you_mean("ahead", {"lockstep", "runahead"}), "");  // three edits
  EXPECT_EQ(did_you_mean("a100", {"h200"}), "");                   // two edits of four
  EXPECT_EQ(did_you_mean("h2000", {"b200", "h200"}), "; did you mean 'h200'?");
  EXPECT_EQ(did_you_mean("h300", {"h200", "b300"}), "; did you mean 'h200'?");  // tie: first
  EXPECT_EQ(did_you_mean("x", {}), "");
}

TEST(ExperimentErrors, MissingFileNamesThePath) {
  const std::string path = kDir + "/bad/does_not_exist.yaml";
  try {
    load_experiment_file(path);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.where(), path);
    EXPECT_EQ(std::string(e.what()),
              path + ": cannot read experiment file '" + path + "': no such file");
  }
}

TEST(ExperimentErrors, DirectoryIsNotAFile) {
  const std::string what = [&] {
    try {
      load_experiment_file(kDir);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  }();
  EXPECT_NE(what.find("cannot read experiment file '" + kDir + "': it is a directory"),
            std::string::npos)
      << what;
}

TEST(ExperimentErrors, EmptyFile) {
  const std::string path = testing::TempDir() + "/twinstep_empty_experiment.yaml";
  std::ofstream(path).close();
  try {
    load_experiment_file(path);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), path + ":1:1: the experiment is empty (no YAML content)");
  }
  std::filesystem::remove(path);
  EXPECT_EQ(error_of("", "e.yaml"), "e.yaml:1:1: the experiment is empty (no YAML content)");
  EXPECT_EQ(error_of("\n\n   \n", "e.yaml"),
            "e.yaml:1:1: the experiment is empty (no YAML content)");
}

TEST(ExperimentErrors, MessagesForScalarsOfTheWrongKind) {
  const std::string wl = "name: t\nmodel: tiny-llama\nhardware: h200\nworkload:\n";
  EXPECT_EQ(error_of(wl + "  input_len: 1e3\n  output_len: 1\n  requests: 1\n"),
            "t.yaml:5:14: workload.input_len must be an integer (1 to 10000000), got a number "
            "1e3");
  EXPECT_EQ(error_of(wl + "  input_len: [1]\n  output_len: 1\n  requests: 1\n"),
            "t.yaml:5:14: workload.input_len must be an integer (1 to 10000000) or {uniform: "
            "[lo, hi]}, got a list");
  EXPECT_EQ(error_of(wl + "  input_len: 1\n  output_len: 1\n  requests: 1\n"
                          "  arrival_rate_per_s: 0\n"),
            "t.yaml:8:23: workload.arrival_rate_per_s = 0 is out of range (> 0 and <= 1e+09)");
  EXPECT_EQ(error_of(wl + "  input_len: 1\n  output_len: 1\n  requests: 1\n"
                          "  arrival_rate_per_s: .nan\n"),
            "t.yaml:8:23: workload.arrival_rate_per_s must be a finite number (> 0 and <= "
            "1e+09), got a string '.nan'");
  EXPECT_EQ(error_of(std::string(kMinimal) + "policies: {seq_lens_sync: yes}\n"),
            "t.yaml:5:27: policies.seq_lens_sync must be true or false, got a boolean 'yes'");
}

TEST(ExperimentErrors, SweepValueErrorsPointIntoTheSweepList) {
  const std::string text = std::string(kMinimal) +
                           "sweep:\n"
                           "  workload.requests: [1, 2]\n"
                           "  host.schedule: [1us, 5parsecs]\n";
  EXPECT_EQ(error_of(text),
            "t.yaml:7:24: host.schedule has unknown duration unit 'parsecs'; allowed: ns, us, "
            "ms, s (in sweep variant 1: workload.requests=1, host.schedule=5parsecs)");
}

TEST(ExperimentErrors, UnknownKeySuggestsTheClosestName) {
  const std::string text = std::string(kMinimal) + "policies: {graph_mdoe: eager}\n";
  EXPECT_EQ(
      error_of(text),
      "t.yaml:5:12: unknown key 'graph_mdoe' in policies; allowed: host_schedule, "
      "runahead_depth, graph_mode, seq_lens_sync, spec, output_copy_bytes_per_request, fusion; "
      "did you "
      "mean 'graph_mode'?");
}

}  // namespace
}  // namespace twinstep
