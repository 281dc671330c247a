// Per-(model, kernel name) fits: fitted from each model's own samples, written and read in the
// profile's kernel_model_fits section, and priced by the cost model of a run of that model
// before the pooled name fit and the class fit.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "policies/calibration_model.h"
#include "policies/calibration_profile.h"
#include "policies/decode_loop.h"
#include "policies/error.h"
#include "policies/step_kernels.h"
#include "simulator/calibration.h"
#include "simulator/cost_model.h"
#include "simulator/sim_backend.h"
#include "tests/simulator/profile_text.h"
#include "tests/support/sim_fixtures.h"

namespace twinstep {
namespace {

// Two models' o_proj on two lines (narrow regime: flops / bytes <= 4 < 16.5):
//   llama-3-8b:    t = 2000 + 2.5e-4 · bytes + 1e-6 · flops
//   qwen3-30b-a3b: t = 5000 + 4.0e-4 · bytes + 3e-6 · flops
// 12 samples each over 4 byte counts (1..8 MB, a 8x span: all three coefficients fitted).
struct Line {
  const char* model;
  double base, per_byte, per_flop;
};
constexpr Line kLlama{"llama-3-8b", 2000, 2.5e-4, 1e-6};
constexpr Line kQwen{"qwen3-30b-a3b", 5000, 4e-4, 3e-6};

CalibrationSample kernel_sample(const char* model, const char* name, double bytes, double flops,
                                double ns) {
  CalibrationSample s;
  s.kind = "kernel";
  s.name = name;
  s.cls = kernel_class_name(KernelClass::kGemm);
  s.model = model;
  s.mode = "graph";
  s.bytes = int64_t(bytes);
  s.flops = int64_t(flops);
  s.value_ns = ns;
  return s;
}

std::vector<CalibrationSample> two_lines() {
  std::vector<CalibrationSample> v;
  for (const Line& l : {kLlama, kQwen}) {
    for (const double bytes : {1e6, 2e6, 4e6, 8e6}) {
      for (const double intensity : {1.0, 2.0, 4.0}) {
        const double flops = intensity * bytes;
        v.push_back(kernel_sample(l.model, "o_proj", bytes, flops,
                                  l.base + l.per_byte * bytes + l.per_flop * flops));
      }
    }
  }
  // Too few samples for a model fit (5 < 8), enough for the pooled name fit.
  for (const double bytes : {1e6, 2e6, 3e6, 4e6, 5e6}) {
    v.push_back(kernel_sample("llama-3-8b", "qkv_proj", bytes, bytes, 3000 + 3e-4 * bytes));
  }
  // Enough samples but one byte count: no model fit.
  for (int i = 0; i < 9; ++i) {
    v.push_back(kernel_sample("llama-3-8b", "down_proj", 4e6, 4e6 * (1 + i % 3), 4000 + i));
  }
  return v;
}

const ProfileHeader kHeader{"twinstep calibrate", "abc1234", "NVIDIA H200", "570",
                            "2026-11-29T12:00:00Z"};

const KernelFit* model_fit(const HardwareSpec& hw, const std::string& model,
                           const std::string& name) {
  const HardwareSpec::ModelKernelFits* m = kernel_model_fits_for(hw, model);
  if (m == nullptr) return nullptr;
  for (const auto& [n, f] : m->names) {
    if (n == name) return &f;
  }
  return nullptr;
}

const KernelFit* pooled_fit(const HardwareSpec& hw, const std::string& name) {
  for (const auto& [n, f] : hw.kernel_name_fits) {
    if (n == name) return &f;
  }
  return nullptr;
}

TEST(KernelModelFits, EachModelsLineIsRecoveredThePooledLineFitsNeither) {
  const CalibrationProfile p = fit_calibration(two_lines(), "t", "h200", kHeader);
  for (const Line& l : {kLlama, kQwen}) {
    const KernelFit* f = model_fit(p.hw, l.model, "o_proj");
    ASSERT_NE(f, nullptr) << l.model;
    EXPECT_EQ(f->samples, 12);
    EXPECT_NEAR(f->base_ns, l.base, 1e-6 * l.base) << l.model;
    EXPECT_NEAR(f->ns_per_byte, l.per_byte, 1e-6 * l.per_byte) << l.model;
    EXPECT_NEAR(f->ns_per_flop, l.per_flop, 1e-6 * l.per_flop) << l.model;
    EXPECT_EQ(f->split_intensity, 0);  // every sample below 16.5 flops per byte
    EXPECT_LT(f->max_rel_err, 1e-9);
    EXPECT_NEAR(f->r2, 1, 1e-12);
  }
  // Pooled: 24 samples on two lines. At 1 MB, 1 MFLOP they are 2251 and 5403 ns; any one line
  // misses at least one of them by more than (5403 - 2251) / 2 / 5403 = 29 %.
  const KernelFit* pooled = pooled_fit(p.hw, "o_proj");
  ASSERT_NE(pooled, nullptr);
  EXPECT_EQ(pooled->samples, 24);
  EXPECT_GT(pooled->max_rel_err, 0.29);
  EXPECT_LT(pooled->r2, 0.99);
  // Below the thresholds: pooled name fits only.
  EXPECT_NE(pooled_fit(p.hw, "qkv_proj"), nullptr);
  EXPECT_NE(pooled_fit(p.hw, "down_proj"), nullptr);
  EXPECT_EQ(model_fit(p.hw, "llama-3-8b", "qkv_proj"), nullptr);   // 5 samples < 8
  EXPECT_EQ(model_fit(p.hw, "llama-3-8b", "down_proj"), nullptr);  // one byte count
  // Models sorted by label, each listed once.
  ASSERT_EQ(p.hw.kernel_model_fits.size(), 2u);
  EXPECT_EQ(p.hw.kernel_model_fits[0].model, "llama-3-8b");
  EXPECT_EQ(p.hw.kernel_model_fits[1].model, "qwen3-30b-a3b");
  // The report has one line per model and name.
  const std::string report = calibration_report(p);
  EXPECT_NE(report.find("per model and kernel name:"), std::string::npos);
  EXPECT_NE(report.find("qwen3-30b-a3b        o_proj"), std::string::npos) << report;
}

// Layers of one shape measured at different times (an EP shard's routing moves experts between
// ranks from layer to layer): the model fit goes through their mean. Here every shape has one
// sample at 0.5 t and one at 1.5 t of the llama line; a relative-error fit of the raw pairs
// would give 0.6 t (f = (1/0.5 + 1/1.5) / (1/0.25 + 1/2.25) t).
TEST(KernelModelFits, SamplesOfOneShapeAreAveragedBeforeTheFit) {
  std::vector<CalibrationSample> v = two_lines();
  for (const double bytes : {1e6, 2e6, 4e6, 8e6}) {
    for (const double intensity : {1.0, 2.0, 4.0}) {
      const double flops = intensity * bytes;
      const double t = kLlama.base + kLlama.per_byte * bytes + kLlama.per_flop * flops;
      for (const double k : {0.5, 1.5})
        v.push_back(kernel_sample("llama-3-8b@tp2", "o_proj", bytes, flops, k * t));
    }
  }
  const CalibrationProfile p = fit_calibration(v, "t", "h200", kHeader);
  const KernelFit* f = model_fit(p.hw, "llama-3-8b@tp2", "o_proj");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->samples, 24);  // every sample, at its shape's mean
  EXPECT_NEAR(f->base_ns, kLlama.base, 1e-6 * kLlama.base);
  EXPECT_NEAR(f->ns_per_byte, kLlama.per_byte, 1e-6 * kLlama.per_byte);
  EXPECT_NEAR(f->ns_per_flop, kLlama.per_flop, 1e-6 * kLlama.per_flop);
}

TEST(KernelModelFits, CostModelPricesEachModelByItsOwnLineOthersByThePooledFit) {
  const CalibrationProfile p = fit_calibration(two_lines(), "t", "h200", kHeader);
  // 2 MB read, 1 MB written, 6 MFLOP: 2000 + 750 + 6 and 5000 + 1200 + 18.
  const KernelDesc k{"o_proj", KernelClass::kGemm, 2'000'000, 1'000'000, 6'000'000};
  EXPECT_EQ(CostModel(p.hw, "llama-3-8b").kernel_ns(k), 2756);
  EXPECT_EQ(CostModel(p.hw, "qwen3-30b-a3b").kernel_ns(k), 6218);
  // A model without its own fits, and no model: the pooled name fit, which is neither line.
  const KernelFit& pooled = *pooled_fit(p.hw, "o_proj");
  const int64_t pooled_ns =
      int64_t(pooled.base_ns + 3e6 * pooled.ns_per_byte + 6e6 * pooled.ns_per_flop + 0.5);
  EXPECT_EQ(CostModel(p.hw, "llama-3.2-3b").kernel_ns(k), pooled_ns);
  EXPECT_EQ(CostModel(p.hw).kernel_ns(k), pooled_ns);
  EXPECT_NE(pooled_ns, 2756);
  EXPECT_NE(pooled_ns, 6218);
  // A name the model has no fit for: the pooled name fit (qkv_proj: one line, 3000 + 3e-4 B).
  const KernelDesc q{"qkv_proj", KernelClass::kGemm, 2'000'000, 0, 2'000'000};
  EXPECT_NEAR(double(CostModel(p.hw, "llama-3-8b").kernel_ns(q)), 3600, 1);
}

TEST(KernelModelFits, ShardLabelWhereTheProfileFittedTheShardElseTheModel) {
  HardwareSpec hw = hardware_preset("h200");
  EXPECT_EQ(kernel_fit_model(hw, "llama-3-8b", 1), "llama-3-8b");
  EXPECT_EQ(kernel_fit_model(hw, "llama-3-8b", 2), "llama-3-8b");
  hw.kernel_model_fits.push_back({"llama-3-8b@tp2", {}});
  EXPECT_EQ(kernel_fit_model(hw, "llama-3-8b", 2), "llama-3-8b@tp2");
  EXPECT_EQ(kernel_fit_model(hw, "llama-3-8b", 4), "llama-3-8b");
  EXPECT_EQ(kernel_fit_model(hw, "llama-3-8b", 1), "llama-3-8b");
}

// A fit of a constant time (no byte or FLOP term).
KernelFit constant(int64_t ns) {
  KernelFit f;
  f.fitted = true;
  f.base_ns = double(ns);
  f.samples = 8;
  return f;
}

// An attention line: base + per byte + per request.
KernelFit attention_line(double base, double per_byte, double per_request) {
  KernelFit f = constant(int64_t(base));
  f.ns_per_byte = per_byte;
  f.ns_per_request = per_request;
  return f;
}

// Llama-3.2-3B (24 query / 8 KV heads of 128, never measured) launches the decode attention kernel
// as Llama-3-8B (32 / 8 of 128) does: 8 KV-head blocks per split and request, one 16-row tile of
// query rows, the same KV bytes. Qwen3-30B-A3B (32 / 4) does not; its TP2 shard of Llama-3-8B
// (4 KV heads per rank) is Qwen3's geometry.
TEST(KernelModelFits, AModelNeverMeasuredTakesTheAttentionLineOfTheSameLaunch) {
  HardwareSpec hw = hardware_preset("h200");
  hw.kernel_model_fits.push_back(
      {"qwen3-30b-a3b", {{"attention", attention_line(9000, 5e-4, 30)}}});
  hw.kernel_model_fits.push_back({"llama-3-8b", {{"attention", attention_line(8000, 3e-4, 200)}}});
  const ModelSpec& l3 = model_preset("llama-3.2-3b");
  EXPECT_EQ(attention_fit_model(hw, l3, LayoutSpec{}), "llama-3-8b");
  // A model with its own attention line keeps it.
  EXPECT_EQ(attention_fit_model(hw, model_preset("llama-3-8b"), LayoutSpec{}), "");
  // Two ranks: 4 KV heads per rank, as Qwen3 on one GPU (the first match in profile order).
  EXPECT_EQ(attention_fit_model(hw, l3, calibration_layout(l3, 2)), "qwen3-30b-a3b");
  // Another KV element size, head dim or KV head count: no donor, the pooled line.
  ModelSpec fp8 = l3;
  fp8.kv_bytes = 1;
  EXPECT_EQ(attention_fit_model(hw, fp8, LayoutSpec{}), "");
  ModelSpec six = l3;
  for (LayerSpec& l : six.layers) l.attn.num_kv_heads = 6;
  EXPECT_EQ(attention_fit_model(hw, six, LayoutSpec{}), "");
  // More than 16 query heads per KV head: two row tiles, another launch.
  ModelSpec wide = l3;
  for (LayerSpec& l : wide.layers) l.attn.num_q_heads = 8 * 20;
  EXPECT_EQ(attention_fit_model(hw, wide, LayoutSpec{}), "");
  // A donor without an attention fit is no donor.
  hw.kernel_model_fits[1].names[0].second.fitted = false;
  EXPECT_EQ(attention_fit_model(hw, l3, LayoutSpec{}), "");
  hw.kernel_model_fits[1].names[0].second.fitted = true;

  // Priced: 4 MB of KV for 2 requests: 8000 + 1200 + 400 by the donor's line; without the donor
  // the pooled name line (none here) gives way to the class fit or the roofline, not this.
  const KernelDesc k{"attention", KernelClass::kAttention, 4'000'000, 0,
                     0,           CollectiveKind::kNone,   0,         2};
  EXPECT_EQ(CostModel(hw, "llama-3.2-3b", "llama-3-8b").kernel_ns(k), 9600);
  EXPECT_NE(CostModel(hw, "llama-3.2-3b").kernel_ns(k), 9600);
  // The model's own line wins over a donor's.
  EXPECT_EQ(CostModel(hw, "qwen3-30b-a3b", "llama-3-8b").kernel_ns(k), 9000 + 2000 + 60);
}

// tiny-llama's decode step on the ideal machine (every kernel at the 10 us floor, no gaps or
// launch costs): 23 nodes, two of them o_proj (one per layer). `name` renames the model; with
// `fusion` (policies.fusion) fewer nodes (decode_nodes).
int64_t steady_step_ns(const std::string& name, const HardwareSpec& hw,
                       const KernelFusion& fusion = {}) {
  ModelSpec model = model_preset("tiny-llama");
  model.name = name;
  model.fusion = fusion;
  PolicySpec policy;
  policy.host_schedule = HostSchedule::kLockstep;
  policy.graph_mode = GraphMode::kCudaGraph;
  WorkloadSpec w;
  w.input_len = {64, 64};
  w.output_len = {40, 40};
  w.num_requests = 1;
  w.max_concurrency = 1;
  const std::vector<RequestSpec> requests = generate_requests(w);
  RunRecord record;
  DecodeLoop loop(policy, w, requests, &record);
  HostCostModel host(testing::fixed_host_costs(0, 0, 0), 1);
  SimBackend backend(model, hw, host, requests);
  HostProgram* ranks[] = {&loop};
  backend.run(ranks, record);
  EXPECT_GT(record.steps.size(), 20u);
  return record.steps[10].dur_ns;
}

TEST(KernelModelFits, ASimulatedStepOfEachModelIsPricedByItsOwnFit) {
  using testing::kUs;
  HardwareSpec hw = testing::ideal_machine();
  hw.kernel_name_fits = {{"o_proj", constant(30 * kUs)}};
  hw.kernel_model_fits = {{"tiny-llama", {{"o_proj", constant(25 * kUs)}}},
                          {"tiny-b", {{"o_proj", constant(40 * kUs)}}}};
  // 21 kernels at the floor + 2 o_proj at the model's fit.
  EXPECT_EQ(steady_step_ns("tiny-llama", hw), 21 * 10 * kUs + 2 * 25 * kUs);
  EXPECT_EQ(steady_step_ns("tiny-b", hw), 21 * 10 * kUs + 2 * 40 * kUs);
  // No fits of its own: the pooled name fit; without that, the floor.
  EXPECT_EQ(steady_step_ns("tiny-c", hw), 21 * 10 * kUs + 2 * 30 * kUs);
  hw.kernel_name_fits.clear();
  EXPECT_EQ(steady_step_ns("tiny-c", hw), 23 * 10 * kUs);
}

int64_t decode_nodes(const KernelFusion& fusion) {
  ModelSpec model = model_preset("tiny-llama");
  model.fusion = fusion;
  StepKernels sk;
  step_kernels(model, decode_shape(1, 1, 74), sk);
  return sk.node_count();
}

// A fused run (calibrate --fusion's label "<model>+norms") is priced by its label's fits where
// the profile has them, else by the model's.
TEST(KernelModelFits, ASimulatedFusedRunIsPricedByItsLabelsFitsElseTheModels) {
  using testing::kUs;
  HardwareSpec hw = testing::ideal_machine();
  hw.kernel_model_fits = {{"tiny-llama", {{"o_proj", constant(25 * kUs)}}},
                          {"tiny-llama+norms", {{"o_proj", constant(35 * kUs)}}}};
  const KernelFusion none, norms{.norms = true}, rope{.rope = true};
  ASSERT_EQ(decode_nodes(none), 23);
  ASSERT_LT(decode_nodes(norms), decode_nodes(none));
  // Two o_proj (one per layer) at the label's fit, every other node at the floor.
  EXPECT_EQ(steady_step_ns("tiny-llama", hw, norms),
            (decode_nodes(norms) - 2) * 10 * kUs + 2 * 35 * kUs);
  EXPECT_EQ(steady_step_ns("tiny-llama", hw), 21 * 10 * kUs + 2 * 25 * kUs);
  // A fusion the profile never measured: the model's own fits.
  EXPECT_EQ(steady_step_ns("tiny-llama", hw, rope),
            (decode_nodes(rope) - 2) * 10 * kUs + 2 * 25 * kUs);
}

TEST(KernelModelFits, ASimulatedModelNeverMeasuredTakesTheAttentionLineOfTheSameLaunch) {
  using testing::kUs;
  HardwareSpec hw = testing::ideal_machine();
  // tiny-llama measured, attention only; "tiny-c" is tiny-llama's shape under another name.
  hw.kernel_model_fits = {{"tiny-llama", {{"attention", constant(50 * kUs)}}}};
  // 21 kernels at the floor + 2 attention kernels (one per layer) at the donor's line.
  EXPECT_EQ(steady_step_ns("tiny-c", hw), 21 * 10 * kUs + 2 * 50 * kUs);
  // A measured model of another attention launch lends nothing: the floor.
  hw.kernel_model_fits = {{"llama-3-8b", {{"attention", constant(50 * kUs)}}}};
  EXPECT_EQ(steady_step_ns("tiny-c", hw), 23 * 10 * kUs);
}

TEST(KernelModelFits, ProfileRoundTrip) {
  CalibrationProfile p = fit_calibration(two_lines(), "h200-test", "h200", kHeader);
  KernelFit split = constant(1500);
  split.split_bytes = 3.5e7;
  split.wide_base_ns = 9000.25;
  split.wide_ns_per_byte = 2.4e-4;
  p.hw.kernel_model_fits.push_back({"llama-3-8b@tp2", {{"attention", split}}});
  const std::string text = write_calibration_profile(p);
  const CalibrationProfile q = parse_calibration_profile(text, "mem");
  ASSERT_EQ(q.hw.kernel_model_fits.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const HardwareSpec::ModelKernelFits& a = p.hw.kernel_model_fits[i];
    const HardwareSpec::ModelKernelFits& b = q.hw.kernel_model_fits[i];
    EXPECT_EQ(a.model, b.model);
    ASSERT_EQ(a.names.size(), b.names.size());
    for (size_t j = 0; j < a.names.size(); ++j) {
      EXPECT_EQ(a.names[j].first, b.names[j].first);
      const KernelFit &x = a.names[j].second, &y = b.names[j].second;
      EXPECT_TRUE(y.fitted);
      EXPECT_EQ(x.base_ns, y.base_ns);  // shortest round-trip doubles: exact
      EXPECT_EQ(x.ns_per_byte, y.ns_per_byte);
      EXPECT_EQ(x.ns_per_flop, y.ns_per_flop);
      EXPECT_EQ(x.split_intensity, y.split_intensity);
      EXPECT_EQ(x.split_bytes, y.split_bytes);
      EXPECT_EQ(x.wide_base_ns, y.wide_base_ns);
      EXPECT_EQ(x.wide_ns_per_byte, y.wide_ns_per_byte);
      EXPECT_EQ(x.wide_ns_per_flop, y.wide_ns_per_flop);
      EXPECT_EQ(x.r2, y.r2);
      EXPECT_EQ(x.max_rel_err, y.max_rel_err);
      EXPECT_EQ(x.samples, y.samples);
    }
  }
  EXPECT_EQ(write_calibration_profile(q), text);
  // The parsed profile prices like the fitted one.
  const KernelDesc k{"o_proj", KernelClass::kGemm, 2'000'000, 1'000'000, 6'000'000};
  EXPECT_EQ(CostModel(q.hw, "qwen3-30b-a3b").kernel_ns(k), 6218);
}

const char* kProfile = R"(format: 1
name: h200-test
base: h200
header: {command: c, commit: c, gpu: g, driver: d, date: d}
kernels:
  gemm: {base_ns: 2000, ns_per_byte: 0.00025, ns_per_flop: 0, r2: 0.99, max_rel_err: 0.1, samples: 9}
kernel_model_fits:
  "llama-3-8b":
    "o_proj": {base_ns: 2500, ns_per_byte: 0.0002, ns_per_flop: 0, r2: 0.9, max_rel_err: 0.1, samples: 9}
)";

TEST(KernelModelFits, ProfilesWithoutTheSectionLoadUnchangedAndBadSectionsSayWhere) {
  using test::profile_error_of;
  using test::replace_once;
  const CalibrationProfile p = parse_calibration_profile(kProfile, "p.yaml");
  ASSERT_EQ(p.hw.kernel_model_fits.size(), 1u);
  EXPECT_EQ(p.hw.kernel_model_fits[0].model, "llama-3-8b");
  ASSERT_EQ(p.hw.kernel_model_fits[0].names.size(), 1u);
  EXPECT_EQ(p.hw.kernel_model_fits[0].names[0].second.base_ns, 2500);
  const std::string without = kProfile;
  const CalibrationProfile old =
      parse_calibration_profile(without.substr(0, without.find("kernel_model_fits")), "p.yaml");
  EXPECT_TRUE(old.hw.kernel_model_fits.empty());
  EXPECT_EQ(old.hw.kernel_fits[size_t(KernelClass::kGemm)].base_ns, 2000);

  EXPECT_EQ(profile_error_of(
                replace_once(kProfile, "  \"llama-3-8b\":\n    \"o_proj\"", "  - \"o_proj\"")),
            "p.yaml:8:3: kernel_model_fits must be a mapping");
  EXPECT_EQ(
      profile_error_of(replace_once(kProfile, "\"llama-3-8b\":\n", "\"llama-3-8b\": [1]\n  m:\n")),
      "p.yaml:8:17: kernel_model_fits.llama-3-8b must be a mapping");
  EXPECT_EQ(profile_error_of(replace_once(kProfile, "base_ns: 2500", "bse_ns: 2500")),
            "p.yaml:9:16: unknown field 'bse_ns' in kernel_model_fits.llama-3-8b.o_proj; known: "
            "base_ns, ns_per_byte, ns_per_flop, ns_per_request, ns_per_split_row, r2, max_rel_err, "
            "samples, "
            "split_intensity, split_bytes, wide_base_ns, wide_ns_per_byte, wide_ns_per_flop, "
            "wide_ns_per_request");
  EXPECT_EQ(profile_error_of(replace_once(kProfile, "r2: 0.9, max_rel_err: 0.1, samples: 9}",
                                          "r2: 0.9, max_rel_err: 0.1}")),
            "p.yaml:9:15: kernel_model_fits.llama-3-8b.o_proj is missing required field "
            "'samples'");
  EXPECT_EQ(profile_error_of(
                replace_once(kProfile, "2500, ns_per_byte: 0.0002", "2500, ns_per_byte: -2")),
            "p.yaml:9:44: kernel_model_fits.llama-3-8b.o_proj.ns_per_byte = -2 is out of range "
            "[0, 1e+06]");
  const std::string o_proj =
      "    \"o_proj\": {base_ns: 2500, ns_per_byte: 0.0002, ns_per_flop: 0, r2: 0.9, "
      "max_rel_err: 0.1, samples: 9}\n";
  EXPECT_EQ(profile_error_of(std::string(kProfile) + o_proj),
            "p.yaml:10:5: duplicate field 'o_proj' in kernel_model_fits.llama-3-8b");
  EXPECT_EQ(profile_error_of(std::string(kProfile) + "  \"llama-3-8b\": {}\n"),
            "p.yaml:10:3: duplicate field 'llama-3-8b' in kernel_model_fits");
}

}  // namespace
}  // namespace twinstep
