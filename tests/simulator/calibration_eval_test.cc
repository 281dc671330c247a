// Held-out evaluation (simulator/calibration_eval.h): stored kernel and step samples priced by
// the simulator's CostModel, against hand-computed errors.
#include "simulator/calibration_eval.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "policies/error.h"
#include "policies/step_kernels.h"

namespace twinstep {
namespace {

KernelFit flat(double base_ns, double ns_per_byte = 0) {
  KernelFit f;
  f.fitted = true;
  f.base_ns = base_ns;
  f.ns_per_byte = ns_per_byte;
  f.samples = 3;
  return f;
}

CalibrationSample kernel(const char* model, const char* name, int64_t batch, int64_t bytes,
                         double ns) {
  CalibrationSample s;
  s.kind = "kernel";
  s.name = name;
  s.cls = kernel_class_name(KernelClass::kGemm);
  s.model = model;
  s.mode = "graph";
  s.batch = batch;
  s.bytes = bytes;
  s.value_ns = ns;
  return s;
}

CalibrationSample step(const char* mode, double ns) {
  CalibrationSample s;
  s.kind = "step";
  s.model = "llama-3-8b";
  s.mode = mode;
  s.batch = 1;
  s.ctx_tokens = 128;
  s.value_ns = ns;
  return s;
}

const KernelEvalRow* find(const std::vector<KernelEvalRow>& rows, const std::string& model,
                          const std::string& name, int64_t batch = 0) {
  for (const KernelEvalRow& r : rows) {
    if (r.model == model && r.name == name && r.batch == batch) return &r;
  }
  return nullptr;
}

TEST(CalibrationEval, KernelErrorsByModelAndNameUseTheFitsASimulatedRunWould) {
  HardwareSpec hw = hardware_preset("h200");
  hw.kernel_fits[size_t(KernelClass::kGemm)] = flat(1000, 1e-3);  // 1000 + bytes / 1000
  hw.kernel_name_fits = {{"o_proj", flat(2000)}};
  hw.kernel_model_fits = {{"llama-3-8b", {{"qkv_proj", flat(3000)}}}};
  const std::vector<CalibrationSample> samples = {
      // llama-3.2-3b has no fits of its own: qkv_proj by the class fit (2000 ns at 1 MB),
      // o_proj by the pooled name fit (2000 ns).
      kernel("llama-3.2-3b", "qkv_proj", 1, 1'000'000, 1600),  // +25 %
      kernel("llama-3.2-3b", "qkv_proj", 2, 1'000'000, 2500),  // -20 %
      kernel("llama-3.2-3b", "o_proj", 1, 5'000'000, 2000),    // 0 %
      kernel("llama-3.2-3b", "o_proj", 1, 5'000'000, 1000),    // +100 %
      // llama-3-8b's own qkv_proj fit (3000 ns) wins over the class fit (6000 ns at 5 MB).
      kernel("llama-3-8b", "qkv_proj", 1, 5'000'000, 2000),  // +50 %
  };
  const CalibrationEvaluation e = evaluate_calibration(hw, samples);
  ASSERT_EQ(e.kernels.size(), 3u);
  const KernelEvalRow* qkv = find(e.kernels, "llama-3.2-3b", "qkv_proj");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->samples, 2);
  EXPECT_NEAR(qkv->measured_us, 2.05, 1e-12);
  EXPECT_NEAR(qkv->priced_us, 2.0, 1e-12);
  EXPECT_NEAR(qkv->mean_err_pct, 2.5, 1e-12);
  EXPECT_NEAR(qkv->mean_abs_err_pct, 22.5, 1e-12);
  EXPECT_NEAR(qkv->max_abs_err_pct, 25, 1e-12);
  const KernelEvalRow* o = find(e.kernels, "llama-3.2-3b", "o_proj");
  ASSERT_NE(o, nullptr);
  EXPECT_NEAR(o->mean_err_pct, 50, 1e-12);
  EXPECT_NEAR(o->max_abs_err_pct, 100, 1e-12);
  const KernelEvalRow* own = find(e.kernels, "llama-3-8b", "qkv_proj");
  ASSERT_NE(own, nullptr);
  EXPECT_NEAR(own->mean_err_pct, 50, 1e-12);
  // Per batch: the two qkv_proj samples of llama-3.2-3b apart.
  const KernelEvalRow* b2 = find(e.kernels_by_batch, "llama-3.2-3b", "qkv_proj", 2);
  ASSERT_NE(b2, nullptr);
  EXPECT_EQ(b2->samples, 1);
  EXPECT_NEAR(b2->mean_err_pct, -20, 1e-12);
  ASSERT_EQ(e.priced_as.size(), 2u);
  EXPECT_EQ(e.priced_as[0], (std::pair<std::string, std::string>{"llama-3-8b", "llama-3-8b"}));
  EXPECT_EQ(e.priced_as[1], (std::pair<std::string, std::string>{"llama-3.2-3b", "(pooled)"}));
  EXPECT_NE(evaluation_report(e).find("llama-3.2-3b       qkv_proj"), std::string::npos);
  // llama-3-8b has no attention line here: nobody lends one.
  EXPECT_TRUE(e.attention_from.empty());
}

// A model never measured prices its attention with the line of a measured model whose attention
// kernel launches alike (attention_fit_model), and the report says whose.
TEST(CalibrationEval, AttentionOfANeverMeasuredModelByTheLineOfTheSameLaunch) {
  HardwareSpec hw = hardware_preset("h200");
  hw.kernel_model_fits = {{"llama-3-8b", {{"attention", flat(4000)}}}};
  KernelFit pooled = flat(9000);
  hw.kernel_name_fits = {{"attention", pooled}};
  CalibrationSample s = kernel("llama-3.2-3b", "attention", 1, 1'000'000, 5000);
  s.cls = kernel_class_name(KernelClass::kAttention);
  const CalibrationEvaluation e = evaluate_calibration(hw, {s});
  const KernelEvalRow* a = find(e.kernels, "llama-3.2-3b", "attention");
  ASSERT_NE(a, nullptr);
  EXPECT_NEAR(a->priced_us, 4.0, 1e-12);  // the 8B's line, not the pooled 9 us
  ASSERT_EQ(e.attention_from.size(), 1u);
  EXPECT_EQ(e.attention_from[0],
            (std::pair<std::string, std::string>{"llama-3.2-3b", "llama-3-8b"}));
  EXPECT_NE(evaluation_report(e).find("priced its attention with the fit of 'llama-3-8b'"),
            std::string::npos);
}

TEST(CalibrationEval, StepIsTheKernelSumPlusOneGapPerNodeInTheModesGap) {
  // Every kernel class at a flat 1000 ns. Llama-3-8B's decode step has 323 nodes: the embedding,
  // 32 layers of attn_norm, qkv_proj, rope, kv_append, attention, o_proj, mlp_norm,
  // gate_up_proj, swiglu, down_proj, then final_norm and lm_head.
  HardwareSpec hw = hardware_preset("h200");
  for (int c = 0; c < int(KernelClass::kCount); ++c) hw.kernel_fits[size_t(c)] = flat(1000);
  // A GPU fast enough that no fit falls below what it could do (CostModel holds every fit at
  // >= bytes / stream_read_tbps and flops / bf16_tflops: the 1 GB LM head takes 1 ns here).
  hw.stream_read_tbps = 1e6;
  hw.bf16_tflops = 1e9;
  hw.graph_node_gap_ns = 500;
  hw.eager_node_gap_ns = 1500;
  hw.pdl_node_gap_by_rows = {{"llama-3-8b", 1, -200}};
  const std::vector<CalibrationSample> samples = {
      step("graph", 400'000), step("graph", 420'000), step("graph", 410'000),
      step("pdl", 250'000),   step("eager", 850'000),
  };
  const CalibrationEvaluation e = evaluate_calibration(hw, samples);
  ASSERT_EQ(e.steps.size(), 3u);  // ordered by mode: eager, graph, pdl
  const StepEvalRow& eager = e.steps[0];
  const StepEvalRow& graph = e.steps[1];
  const StepEvalRow& pdl = e.steps[2];
  EXPECT_EQ(graph.mode, "graph");
  EXPECT_EQ(graph.nodes, 323);
  EXPECT_NEAR(graph.measured_us, 410, 1e-9);  // the median
  EXPECT_NEAR(graph.kernels_us, 323, 1e-9);
  EXPECT_NEAR(graph.priced_us, 323 * 1.5, 1e-9);
  EXPECT_NEAR(graph.err_pct, 100.0 * (484.5 - 410) / 410, 1e-9);
  EXPECT_EQ(pdl.gap_ns, -200);  // the model's own PDL gap at 1 row
  EXPECT_NEAR(pdl.priced_us, 323 * 0.8, 1e-9);
  EXPECT_NEAR(pdl.err_pct, 100.0 * (258.4 - 250) / 250, 1e-9);
  EXPECT_EQ(eager.gap_ns, 1500);
  EXPECT_NEAR(eager.priced_us, 323 * 2.5, 1e-9);
  EXPECT_NEAR(eager.err_pct, 100.0 * (807.5 - 850) / 850, 1e-9);
}

TEST(CalibrationEval, UnknownModelLabelIsAConfigError) {
  EXPECT_THROW(evaluate_calibration(hardware_preset("h200"),
                                    {kernel("no-such-model", "qkv_proj", 1, 1000, 1000)}),
               ConfigError);
}

}  // namespace
}  // namespace twinstep
