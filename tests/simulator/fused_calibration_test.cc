// Calibration of the runtime's kernel fusions (calibrate --fusion, policies.fusion): fused labels
// "<preset>[@tp<N>]+norms+rope", their step kernels, fits and gaps priced for fused runs only,
// and nothing pooled over models changed by a fused session's samples.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "policies/calibration_model.h"
#include "policies/calibration_profile.h"
#include "policies/error.h"
#include "policies/step_kernels.h"
#include "simulator/calibration.h"
#include "simulator/cost_model.h"

namespace twinstep {
namespace {

std::string parse_error(const std::string& label) {
  try {
    parse_calibration_model(label);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(FusedLabels, ParseRoundTripAndRefusals) {
  const CalibrationModel both = parse_calibration_model("llama-3-8b+norms+rope");
  EXPECT_EQ(both.preset, "llama-3-8b");
  EXPECT_EQ(both.tp, 1);
  EXPECT_TRUE(both.fusion.norms);
  EXPECT_TRUE(both.fusion.rope);
  const CalibrationModel rope = parse_calibration_model("qwen3-30b-a3b@tp2+rope");
  EXPECT_EQ(rope.preset, "qwen3-30b-a3b");
  EXPECT_EQ(rope.tp, 2);
  EXPECT_FALSE(rope.fusion.norms);
  EXPECT_TRUE(rope.fusion.rope);
  for (const char* label : {"llama-3-8b", "llama-3-8b+norms", "llama-3-8b+rope",
                            "llama-3-8b+norms+rope", "llama-3-8b@tp2+rope"}) {
    const CalibrationModel m = parse_calibration_model(label);
    EXPECT_EQ(calibration_model_label(m.preset, m.tp, m.fusion), label);
    EXPECT_EQ(is_fused_calibration_label(label), m.fusion.any()) << label;
  }
  EXPECT_EQ(calibration_model_label("llama-3-8b", 1, KernelFusion{.norms = true, .rope = true}),
            "llama-3-8b+norms+rope");
  EXPECT_EQ(calibration_model_spec(both).fusion.norms, true);
  EXPECT_EQ(calibration_model_spec(both).name, "llama-3-8b");

  const std::string order = "a fused label ends in +norms, +rope or +norms+rope";
  EXPECT_NE(parse_error("llama-3-8b+rope+norms").find(order), std::string::npos);
  EXPECT_NE(parse_error("llama-3-8b+norm").find(order), std::string::npos);
  EXPECT_NE(parse_error("llama-3-8b+").find(order), std::string::npos);
  EXPECT_NE(parse_error("qwen3-30b-a3b+norms").find("need a dense GQA model"), std::string::npos);
  EXPECT_NE(parse_error("llama-3-8b@tp2+norms").find("not on 2 ranks"), std::string::npos);
  EXPECT_NE(parse_error("llama-3-8b@tp1+rope").find("<preset>@tp<N>"), std::string::npos);
}

// The fused label's step is the fused model's (what the fused engine runs, checked against its
// nodes by RealRuntime.FusedNodesAreTheSimulatorsStepKernels), fewer nodes than the plain one.
TEST(FusedLabels, StepKernelsAreTheFusedModelsStep) {
  const StepShape shape = decode_shape(4, 1, 4 * 1000);
  StepKernels fused, direct, plain;
  calibration_step_kernels("llama-3-8b+norms+rope", shape, fused);
  ModelSpec m = model_preset("llama-3-8b");
  m.fusion = KernelFusion{.norms = true, .rope = true};
  step_kernels(m, shape, direct);
  calibration_step_kernels("llama-3-8b", shape, plain);
  ASSERT_EQ(fused.kernels.size(), direct.kernels.size());
  for (size_t i = 0; i < fused.kernels.size(); ++i) {
    EXPECT_EQ(fused.kernels[i].name, direct.kernels[i].name);
    EXPECT_EQ(fused.kernels[i].bytes_read, direct.kernels[i].bytes_read);
  }
  EXPECT_EQ(fused.node_count(), direct.node_count());
  // Per layer after the first: attn_norm, mlp_norm, rope and kv_append gone (31 layers), and
  // layer 0 keeps its attn_norm but loses mlp_norm, rope and kv_append.
  EXPECT_EQ(plain.node_count() - fused.node_count(), 31 * 4 + 3);
}

TEST(FusedLabels, FitAndGapModelsTakeTheFusedLabelWhereMeasuredElseTheUnfused) {
  HardwareSpec hw = hardware_preset("h200");
  const KernelFusion norms{.norms = true};
  EXPECT_EQ(kernel_fit_model(hw, "llama-3-8b", 1, norms), "llama-3-8b");
  hw.kernel_model_fits.push_back({"llama-3-8b+norms", {}});
  hw.pdl_node_gap_by_rows.push_back({"llama-3-8b+norms", 1, -500});
  EXPECT_EQ(kernel_fit_model(hw, "llama-3-8b", 1, norms), "llama-3-8b+norms");
  EXPECT_EQ(pdl_gap_model(hw, "llama-3-8b", 1, norms), "llama-3-8b+norms");
  // Another fusion, or none: not the norms label.
  EXPECT_EQ(kernel_fit_model(hw, "llama-3-8b", 1), "llama-3-8b");
  EXPECT_EQ(kernel_fit_model(hw, "llama-3-8b", 1, KernelFusion{.rope = true}), "llama-3-8b");
  EXPECT_EQ(pdl_gap_model(hw, "llama-3-8b", 1, KernelFusion{.norms = true, .rope = true}),
            "llama-3-8b");
  // A fused shard falls back to the shard, then the model.
  const KernelFusion rope{.rope = true};
  EXPECT_EQ(kernel_fit_model(hw, "llama-3-8b", 2, rope), "llama-3-8b");
  hw.kernel_model_fits.push_back({"llama-3-8b@tp2", {}});
  EXPECT_EQ(kernel_fit_model(hw, "llama-3-8b", 2, rope), "llama-3-8b@tp2");
  hw.kernel_model_fits.push_back({"llama-3-8b@tp2+rope", {}});
  EXPECT_EQ(kernel_fit_model(hw, "llama-3-8b", 2, rope), "llama-3-8b@tp2+rope");
}

// A model never measured takes the median of the measured models' PDL gaps: the fused labels'
// entries are not among them.
TEST(FusedLabels, PooledPdlGapLeavesFusedLabelsOut) {
  HardwareSpec hw = hardware_preset("h200");
  hw.pdl_node_gap_by_rows = {{"llama-3-8b", 1, -700},
                             {"llama-3-8b+norms", 1, -100},
                             {"llama-3-8b+norms+rope", 1, -50},
                             {"qwen3-30b-a3b", 1, -300}};
  // Over {-700, -300}: the lower middle; with the fused entries it would be -300.
  EXPECT_EQ(pdl_node_gap_for(hw, "llama-3.2-3b", 1), -700);
  EXPECT_EQ(pdl_node_gap_for(hw, "llama-3-8b+norms", 1), -100);
}

// Attention donors for a model never measured: one of the same KernelFusion::rope first.
TEST(FusedLabels, AttentionDonorOfTheSameRopeFusionFirst) {
  KernelFit line;
  line.fitted = true;
  line.base_ns = 8000;
  line.samples = 8;
  HardwareSpec hw = hardware_preset("h200");
  hw.kernel_model_fits = {{"llama-3-8b", {{"attention", line}}},
                          {"llama-3-8b+rope", {{"attention", line}}}};
  ModelSpec l3 = model_preset("llama-3.2-3b");
  EXPECT_EQ(attention_fit_model(hw, l3, LayoutSpec{}), "llama-3-8b");
  l3.fusion.rope = true;
  EXPECT_EQ(attention_fit_model(hw, l3, LayoutSpec{}), "llama-3-8b+rope");
  l3.fusion = KernelFusion{.norms = true};  // norms do not change the attention launch
  EXPECT_EQ(attention_fit_model(hw, l3, LayoutSpec{}), "llama-3-8b");
  hw.kernel_model_fits.erase(hw.kernel_model_fits.begin());
  EXPECT_EQ(attention_fit_model(hw, l3, LayoutSpec{}), "llama-3-8b+rope");  // the other, else
}

CalibrationSample sample(const char* kind, const std::string& model, const char* name,
                         const char* mode, double bytes, double flops, double ns) {
  CalibrationSample s;
  s.kind = kind;
  s.model = model;
  s.name = name;
  s.mode = mode;
  s.cls = kernel_class_name(KernelClass::kGemm);
  s.batch = 1;
  s.bytes = int64_t(bytes);
  s.flops = int64_t(flops);
  s.value_ns = ns;
  return s;
}

// Plain samples of llama-3-8b: o_proj on 2000 + 2.5e-4 B + 1e-6 F over 12 shapes, figures.
std::vector<CalibrationSample> plain_session(const std::string& label, double scale) {
  std::vector<CalibrationSample> v;
  for (const double bytes : {1e6, 2e6, 4e6, 8e6}) {
    for (const double intensity : {1.0, 2.0, 4.0}) {
      const double flops = intensity * bytes;
      v.push_back(sample("kernel", label, "o_proj", "graph", bytes, flops,
                         scale * (2000 + 2.5e-4 * bytes + 1e-6 * flops)));
    }
  }
  for (const double ns : {600.0, 700.0, 650.0}) {
    v.push_back(sample("node_gap", "", "", "graph", 0, 0, scale * ns));
    v.push_back(sample("node_gap", label, "", "graph", 0, 0, scale * ns));
    CalibrationSample g = sample("graph_launch", label, "decode", "", 0, 0, scale * 2 * ns);
    g.nodes = 300;
    v.push_back(g);
    v.push_back(sample("host_op", label, "launch_calls", "", 0, 0, scale * 10 * ns));
  }
  return v;
}

bool same_fit(const KernelFit& a, const KernelFit& b) {
  return a.fitted == b.fitted && a.base_ns == b.base_ns && a.ns_per_byte == b.ns_per_byte &&
         a.ns_per_flop == b.ns_per_flop && a.samples == b.samples;
}

TEST(FusedFit, AFusedSessionChangesNothingPooledAndFitsItsOwnLabel) {
  const ProfileHeader h{"calibrate", "abc", "NVIDIA H200", "570", "now"};
  const std::vector<CalibrationSample> plain = plain_session("llama-3-8b", 1.0);
  std::vector<CalibrationSample> with = plain;
  // The fused engine 20 % faster on every sample, its figures too.
  for (const CalibrationSample& s : plain_session("llama-3-8b+norms", 0.8)) {
    if (!s.model.empty()) with.push_back(s);
  }
  const CalibrationProfile a = fit_calibration(plain, "a", "h200", h);
  const CalibrationProfile b = fit_calibration(with, "b", "h200", h);
  for (size_t c = 0; c < a.hw.kernel_fits.size(); ++c)
    EXPECT_TRUE(same_fit(a.hw.kernel_fits[c], b.hw.kernel_fits[c])) << c;
  ASSERT_EQ(a.hw.kernel_name_fits.size(), b.hw.kernel_name_fits.size());
  for (size_t i = 0; i < a.hw.kernel_name_fits.size(); ++i)
    EXPECT_TRUE(same_fit(a.hw.kernel_name_fits[i].second, b.hw.kernel_name_fits[i].second));
  EXPECT_EQ(a.hw.graph_node_gap_ns, 650);
  EXPECT_EQ(b.hw.graph_node_gap_ns, 650);
  EXPECT_EQ(b.hw.graph_launch_ns, a.hw.graph_launch_ns);
  EXPECT_EQ(b.hw.kernel_fit_max_rows, a.hw.kernel_fit_max_rows);
  ASSERT_EQ(b.host_ops.size(), 1u);
  EXPECT_EQ(b.host_ops[0].second.n, 3);
  EXPECT_EQ(b.host_ops[0].second.p50_ns, 6500);
  // Its own label: the scaled line, 0.8 x (2000 + 2.5e-4 B + 1e-6 F).
  ASSERT_EQ(b.hw.kernel_model_fits.size(), 2u);
  const HardwareSpec::ModelKernelFits* own = kernel_model_fits_for(b.hw, "llama-3-8b+norms");
  ASSERT_NE(own, nullptr);
  ASSERT_EQ(own->names.size(), 1u);
  const KernelFit& f = own->names[0].second;
  EXPECT_NEAR(f.base_ns, 1600, 1e-6 * 1600);
  EXPECT_NEAR(f.ns_per_byte, 2e-4, 1e-6 * 2e-4);
  EXPECT_NEAR(f.ns_per_flop, 8e-7, 1e-6 * 8e-7);
  EXPECT_TRUE(same_fit(kernel_model_fits_for(a.hw, "llama-3-8b")->names[0].second,
                       kernel_model_fits_for(b.hw, "llama-3-8b")->names[0].second));
}

// A fused label's PDL gap is its steps less its own step kernels priced (fewer nodes than the
// plain step): a known gap per node comes back only if the fit lists the fused kernels.
TEST(FusedFit, NodeGapOfAFusedLabelIsAgainstItsFusedStep) {
  const HardwareSpec preset = hardware_preset("h200");
  const std::string label = "llama-3-8b+norms+rope";
  std::vector<CalibrationSample> s;
  for (const int64_t ctx : {146, 2066, 8210}) {
    StepKernels sk;
    calibration_step_kernels(label, decode_shape(1, 1, ctx), sk);
    const GraphCost c = calibration_cost_model(preset, label)->graph_cost(sk);
    CalibrationSample x = sample("step", label, "", "pdl", 0, 0, 0);
    x.ctx_tokens = ctx;
    x.value_ns = double(c.busy_ns) - 300.0 * double(c.nodes);
    s.push_back(x);
  }
  const std::vector<HardwareSpec::NodeGap> g = node_gap_by_rows(s, preset, "pdl");
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].model, label);
  EXPECT_EQ(g[0].gap_ns, -300);
}

}  // namespace
}  // namespace twinstep
