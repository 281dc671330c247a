// Speculative graphs (issue #6, simulator/spec_graphs.h): the residual fit on synthetic samples
// with hand-computed residuals, the profile section's round trip and its errors, and the
// residual in a simulated speculative round (exactly that much more; nothing without it).
#include "simulator/spec_graphs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/attention_split.h"
#include "policies/calibration_model.h"
#include "policies/calibration_profile.h"
#include "policies/decode_loop.h"
#include "policies/error.h"
#include "policies/kv_capacity.h"
#include "policies/step_kernels.h"
#include "results/db.h"
#include "simulator/calibration.h"
#include "simulator/calibration_eval.h"
#include "simulator/cost_model.h"
#include "simulator/sim_backend.h"
#include "tests/simulator/profile_text.h"
#include "tests/support/sim_fixtures.h"

namespace twinstep {
namespace {

using testing::kFloorNs;
using Residual = HardwareSpec::SpecGraphResidual;

// On the ideal machine (every kernel at the 10 us floor, no gaps) a pass costs its node count ×
// the floor: the simulator's price of a speculative launch by hand.
int64_t nodes_of(const ModelSpec& m, const StepShape& shape) {
  StepKernels k;
  step_kernels(m, shape, k);
  return k.node_count();
}
// Counted by hand for tiny-llama (2 layers, GQA attention and a dense MLP): a forward is 1
// (embedding) + 2 x 10 (attn_norm, qkv_proj, rope, kv_append, attention, o_proj, mlp_norm,
// gate_up_proj, swiglu, down_proj) + 2 (final_norm, lm_head) = 23 nodes; the NEXTN draft's 4
// (embedding, enorm, hnorm, eh_proj) + 10 + 2 = 16. Verify and extend run row-exact (the runtime's
// 16-row GEMV launches): R = batch x positions rows take ceil(R / 16) launches of each projection
// and of the LM head, so 2 x 4 + 1 = 9 more verify nodes per extra 16 rows. The extend is the
// draft's KV pass: 4 + 4 (attn_norm, qkv_proj, rope, kv_append) = 8 nodes, 2 more (eh_proj,
// qkv_proj) per extra 16 rows.
int64_t hand_price_ns(const std::string& graph, int64_t batch, int64_t positions) {
  const int64_t extra = (batch * positions + 15) / 16 - 1;
  if (graph == "verify") return (23 + 9 * extra) * kFloorNs;
  if (graph == "extend") return (8 + 2 * extra) * kFloorNs;
  return (positions - 1) * 16 * kFloorNs;  // drafts: one row per request, 16 nodes a forward
}
// The test's model is always tiny-llama; ctx does not change a node count.
int64_t hand_price_ns(const std::string& preset, const std::string& graph, int64_t batch,
                      int64_t positions, int64_t /*ctx*/) {
  EXPECT_EQ(preset, "tiny-llama");
  return hand_price_ns(graph, batch, positions);
}

CalibrationSample spec_sample(const std::string& graph, int64_t batch, int64_t positions,
                              int64_t ctx, double ns, const std::string& model = "tiny-llama") {
  CalibrationSample s;
  s.kind = "spec_graph";
  s.name = graph;
  s.model = model;
  s.mode = "graph";
  s.batch = batch;
  s.ctx_tokens = ctx;
  s.nodes = positions;
  s.value_ns = ns;
  return s;
}

// Three launches per point around the hand-computed time T = price + residual: T − 7, T, T + 9
// (median T).
void add_point(std::vector<CalibrationSample>& out, const std::string& graph, int64_t batch,
               int64_t positions, int64_t ctx, double residual_ns) {
  const double t = double(hand_price_ns("tiny-llama", graph, batch, positions, ctx)) + residual_ns;
  for (const double d : {-7.0, 0.0, 9.0}) {
    out.push_back(spec_sample(graph, batch, positions, ctx, t + d));
  }
}

TEST(SpecGraphs, NamesRoundTrip) {
  for (int g = 0; g < int(SpecGraph::kCount); ++g) {
    EXPECT_EQ(spec_graph_by_name(spec_graph_name(SpecGraph(g))), SpecGraph(g));
  }
  EXPECT_EQ(spec_graph_by_name("drafts"), SpecGraph::kCount);
}

TEST(SpecGraphs, PriceIsNodesTimesTheFloorOnTheIdealMachine) {
  const HardwareSpec hw = testing::ideal_machine();
  const CostModel cost(hw, "tiny-llama");
  const ModelSpec& m = model_preset("tiny-llama");
  const ModelSpec d = nextn_draft(m);
  EXPECT_EQ(spec_graph_price_ns(cost, 0, m, d, SpecGraph::kDraft, 1, 5, 300),
            hand_price_ns("tiny-llama", "draft", 1, 5, 300));
  EXPECT_EQ(spec_graph_price_ns(cost, 0, m, d, SpecGraph::kDraft, 1, 1, 300), 0);  // NEXTN: 0
  EXPECT_EQ(spec_graph_price_ns(cost, 0, m, d, SpecGraph::kVerify, 2, 6, 600),
            hand_price_ns("tiny-llama", "verify", 2, 6, 300));
  EXPECT_EQ(spec_graph_price_ns(cost, 0, m, d, SpecGraph::kExtend, 1, 16, 300),
            hand_price_ns("tiny-llama", "extend", 1, 16, 300));
  EXPECT_EQ(spec_graph_price_ns(cost, 0, m, d, SpecGraph::kExtend, 1, 16, 300), 8 * kFloorNs);
  // Row-exact: 2 x 16 = 32 rows launch every projection and the LM head twice (23 + 9 nodes);
  // 4 x 12 = 48 rows three times (23 + 18); the extend's eh_proj and qkv_proj likewise.
  EXPECT_EQ(spec_graph_price_ns(cost, 0, m, d, SpecGraph::kVerify, 2, 16, 600), 32 * kFloorNs);
  EXPECT_EQ(spec_graph_price_ns(cost, 0, m, d, SpecGraph::kVerify, 4, 12, 600), 41 * kFloorNs);
  EXPECT_EQ(spec_graph_price_ns(cost, 0, m, d, SpecGraph::kExtend, 4, 12, 600), 12 * kFloorNs);
  // A node gap of 100 ns adds nodes × 100 per pass.
  EXPECT_EQ(spec_graph_price_ns(cost, 100, m, d, SpecGraph::kDraft, 1, 3, 300),
            hand_price_ns("tiny-llama", "draft", 1, 3, 300) +
                2 * nodes_of(d, decode_shape(1, 1, 300)) * 100);
}

TEST(SpecGraphFit, RecoversHandComputedResidualsPerGraphAndBatch) {
  // Residuals by hand: draft 150 us + 20 us per draft token + 2 ns per token and cached token;
  // verify 40 us + 3 us per position; extend -60 us (the simulator prices a whole draft forward
  // in extend where the runtime writes K/V only); at batch 4 the draft's base is 90 us, and a
  // verify of 4 x W rows pays 4.5 ms per 16-row chunk past the first (W 2, 6, 16: 0, 1, 3).
  std::vector<CalibrationSample> s;
  for (const int64_t ctx : {128, 2048}) {
    for (const int64_t w : {2, 6, 16}) {
      add_point(s, "draft", 1, w - 1, ctx, 150000 + 20000.0 * (w - 1) + 2.0 * (w - 1) * ctx);
      add_point(s, "draft", 4, w - 1, ctx, 90000 + 20000.0 * (w - 1) + 2.0 * (w - 1) * ctx);
      add_point(s, "verify", 1, w, ctx, 40000 + 3000.0 * w);
      add_point(s, "verify", 4, w, ctx, 40000 + 3000.0 * w + 4.5e6 * double((4 * w + 15) / 16 - 1));
      add_point(s, "extend", 1, w, ctx, -60000);
    }
  }
  const std::vector<Residual> fits =
      fit_spec_graph_residuals(s, testing::ideal_machine());  // the prices above, no gaps
  ASSERT_EQ(fits.size(), 5u);  // ordered by (model, graph, mode, batch)
  const Residual& d1 = fits[0];
  const Residual& d4 = fits[1];
  const Residual& ex = fits[2];
  const Residual& ve = fits[3];
  const Residual& ve4 = fits[4];
  EXPECT_EQ(ve4.batch, 4);
  EXPECT_NEAR(ve4.base_ns, 40000, 1e-2);
  EXPECT_NEAR(ve4.ns_per_position, 3000, 1e-3);
  EXPECT_NEAR(ve4.ns_per_position_ctx, 0, 1e-8);
  EXPECT_NEAR(ve4.ns_per_extra_chunk, 4.5e6, 1e-1);
  EXPECT_EQ(ve.ns_per_extra_chunk, 0);  // one row chunk at batch 1: no such column
  EXPECT_EQ(d1.graph, "draft");
  EXPECT_EQ(d1.batch, 1);
  EXPECT_EQ(d4.batch, 4);
  EXPECT_EQ(ex.graph, "extend");
  EXPECT_EQ(ve.graph, "verify");
  EXPECT_EQ(d1.model, "tiny-llama");
  EXPECT_EQ(d1.mode, "graph");
  EXPECT_NEAR(d1.base_ns, 150000, 1e-3);
  EXPECT_NEAR(d1.ns_per_position, 20000, 1e-4);
  EXPECT_NEAR(d1.ns_per_position_ctx, 2.0, 1e-8);
  EXPECT_NEAR(d4.base_ns, 90000, 1e-3);
  EXPECT_NEAR(ve.base_ns, 40000, 1e-3);
  EXPECT_NEAR(ve.ns_per_position, 3000, 1e-4);
  EXPECT_NEAR(ve.ns_per_position_ctx, 0, 1e-9);
  EXPECT_NEAR(ex.base_ns, -60000, 1e-3);
  EXPECT_NEAR(ex.ns_per_position, 0, 1e-4);
  for (const Residual* f : {&d1, &d4, &ex, &ve, &ve4}) {
    EXPECT_EQ(f->points, 6) << f->graph;
    EXPECT_EQ(f->samples, 18) << f->graph;
    EXPECT_NEAR(f->r2, 1.0, 1e-9) << f->graph;
    EXPECT_LT(f->max_rel_err, 1e-6) << f->graph;
  }
  // Without the residual, verify at W = 2, ctx 128 is the worst: 46 us short of its time.
  double worst = 0, mean = 0;
  for (const int64_t ctx : {128, 2048}) {
    for (const int64_t w : {2, 6, 16}) {
      const double p = double(hand_price_ns("tiny-llama", "verify", 1, w, ctx));
      const double t = p + 40000 + 3000.0 * w;
      worst = std::max(worst, (t - p) / t);
      mean += (p - t) / t / 6;
    }
  }
  EXPECT_NEAR(ve.max_rel_err_unfitted, worst, 1e-12);
  EXPECT_NEAR(ve.mean_err_unfitted, mean, 1e-12);
}

TEST(SpecGraphFit, ColumnsFollowWhatWasMeasured) {
  // One context: no per-context term (it cannot be told from the per-position one).
  std::vector<CalibrationSample> s;
  for (const int64_t w : {2, 6, 16}) add_point(s, "verify", 1, w, 512, 10000 + 500.0 * w);
  std::vector<Residual> f = fit_spec_graph_residuals(s, testing::ideal_machine());
  ASSERT_EQ(f.size(), 1u);
  EXPECT_NEAR(f[0].base_ns, 10000, 1e-4);
  EXPECT_NEAR(f[0].ns_per_position, 500, 1e-6);
  EXPECT_EQ(f[0].ns_per_position_ctx, 0);
  // One point: a base alone, R² 1.
  s.clear();
  add_point(s, "extend", 1, 6, 512, -1234);
  f = fit_spec_graph_residuals(s, testing::ideal_machine());
  ASSERT_EQ(f.size(), 1u);
  EXPECT_NEAR(f[0].base_ns, -1234, 1e-6);
  EXPECT_EQ(f[0].ns_per_position, 0);
  EXPECT_EQ(f[0].r2, 1.0);
  EXPECT_EQ(f[0].points, 1);
  // Another mode or an unknown model is not priced, hence not fitted; an unknown graph name is
  // an error.
  s = {spec_sample("verify", 1, 6, 512, 1e6, "no-such-model")};
  s.push_back(spec_sample("verify", 1, 6, 512, 1e6));
  s.back().mode = "pdl";
  EXPECT_TRUE(fit_spec_graph_residuals(s, testing::ideal_machine()).empty());
  // A TP shard (calibrate --tp 2) is priced as its rank-0 kernels without collectives.
  const std::vector<CalibrationSample> tp = {
      spec_sample("verify", 1, 6, 512, 1e6, "llama-3-8b@tp2")};
  f = fit_spec_graph_residuals(tp, testing::ideal_machine());
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].model, "llama-3-8b@tp2");
  const ModelSpec& llama = model_preset("llama-3-8b");
  const auto shard_cost = calibration_cost_model(testing::ideal_machine(), "llama-3-8b@tp2");
  const int64_t shard_price =
      spec_graph_price_ns(*shard_cost, testing::ideal_machine().graph_node_gap_ns, llama,
                          nextn_draft(llama), SpecGraph::kVerify, 1, 6, 512, 2);
  EXPECT_NEAR(f[0].base_ns, 1e6 - double(shard_price), 1e-3);
  // The shard's kernels carry no collective and read fewer bytes than the whole model's (the
  // ideal machine prices nodes, not bytes, so the prices above cannot tell them apart).
  StepKernels whole, half;
  shard_step_kernels(llama, 1, decode_shape(1, 6, 512), whole);
  shard_step_kernels(llama, 2, decode_shape(1, 6, 512), half);
  auto bytes = [](const StepKernels& k) {
    int64_t n = 0;
    for (const LayerRun& run : k.runs)
      for (int32_t i = run.first; i < run.first + run.count; ++i)
        n += run.repeat * k.kernels[size_t(i)].bytes_read;
    return n;
  };
  for (const KernelDesc& k : half.kernels) EXPECT_NE(k.cls, KernelClass::kCollective) << k.name;
  EXPECT_LT(bytes(half), bytes(whole) * 6 / 10);  // layers halved; embedding and lm_head whole
  s.push_back(spec_sample("drafts", 1, 6, 512, 1e6));
  EXPECT_THROW(fit_spec_graph_residuals(s, testing::ideal_machine()), Error);
}

TEST(SpecGraphFit, FitCalibrationFitsThemAgainstItsOwnProfile) {
  // A session of spec_graph samples alone: the profile is the base preset's roofline, and the
  // residuals are against its prices; fit_calibration takes the new kind.
  HardwareSpec hw = hardware_preset("h200");
  const CostModel cost(hw, "tiny-llama");
  const ModelSpec& m = model_preset("tiny-llama");
  std::vector<CalibrationSample> s;
  for (const int64_t w : {2, 6, 16}) {
    const int64_t p = spec_graph_price_ns(cost, hw.graph_node_gap_ns, m, nextn_draft(m),
                                          SpecGraph::kVerify, 1, int32_t(w), 700);
    s.push_back(spec_sample("verify", 1, w, 700, double(p) + 5000 + 100.0 * w));
  }
  const CalibrationProfile prof =
      fit_calibration(s, "t", "h200", {"calibrate", "abc", "NVIDIA H200", "570", "now"});
  ASSERT_EQ(prof.hw.spec_graph_residuals.size(), 1u);
  EXPECT_NEAR(prof.hw.spec_graph_residuals[0].base_ns, 5000, 1e-3);
  EXPECT_NEAR(prof.hw.spec_graph_residuals[0].ns_per_position, 100, 1e-4);
  const std::string report = calibration_report(prof);
  EXPECT_NE(report.find("speculative graphs, measured - simulated"), std::string::npos) << report;
  EXPECT_NE(report.find("tiny-llama     verify"), std::string::npos) << report;
  // calibrate-eval: per point, the price without and with the residual.
  const CalibrationEvaluation e = evaluate_calibration(prof.hw, s);
  ASSERT_EQ(e.spec_graphs.size(), 3u);
  for (const SpecGraphEvalRow& r : e.spec_graphs) {
    EXPECT_LT(r.err_sim_pct, 0) << r.positions;
    EXPECT_NEAR(r.err_pct, 0, 1e-3) << r.positions;
    EXPECT_NEAR(r.residual_us, (5000 + 100.0 * double(r.positions)) / 1e3, 1e-3);
  }
  const std::string table = evaluation_report(e);
  EXPECT_NE(table.find("spec graphs tiny-llama verify graph: 3 points"), std::string::npos)
      << table;
}

TEST(SpecGraphFit, StoredSessionsRefitToTheSameResiduals) {
  // calibrate --spec-only stores a session of spec_graph samples; --fit-only --sessions refits
  // it with the sessions that carry the kernel fits, from the database.
  std::vector<CalibrationSample> s;
  for (const int64_t w : {2, 6, 16}) {
    add_point(s, "draft", 1, w - 1, 128, 150000 + 20000.0 * (w - 1));
    add_point(s, "verify", 1, w, 128, 40000 + 3000.0 * w);
  }
  CalibrationSample gap;
  gap.kind = "node_gap";
  gap.mode = "graph";
  gap.value_ns = 0;  // the ideal machine's gap, from the other session
  const ProfileHeader h{"calibrate --spec-only", "abc", "NVIDIA H200", "570", "now"};
  ResultsDb db = ResultsDb::open(":memory:");
  db.store_calibration(h, false, {gap});
  db.store_calibration(h, false, s);
  std::vector<CalibrationSample> back = db.calibration_samples(1);
  for (CalibrationSample& x : db.calibration_samples(2)) back.push_back(x);
  std::vector<CalibrationSample> both = {gap};
  both.insert(both.end(), s.begin(), s.end());
  const std::string a = write_calibration_profile(fit_calibration(both, "x", "h200", h));
  const std::string b = write_calibration_profile(fit_calibration(back, "x", "h200", h));
  EXPECT_EQ(a, b);
  EXPECT_NE(a.find("spec_graph_residuals:\n  - {model: \"tiny-llama\", graph: \"draft\""),
            std::string::npos)
      << a;
}

TEST(SpecGraphFit, ResidualLookupByBatch) {
  HardwareSpec hw = testing::ideal_machine();
  Residual r;
  r.model = "m";
  r.graph = "verify";
  r.mode = "graph";
  r.batch = 1;
  r.base_ns = 1;
  hw.spec_graph_residuals.push_back(r);
  r.batch = 4;
  r.base_ns = 4;
  hw.spec_graph_residuals.push_back(r);
  auto base = [&](int64_t requests, SpecGraph g = SpecGraph::kVerify, const char* mode = "graph",
                  const char* model = "m") {
    const Residual* f = spec_graph_residual_for(hw, model, g, mode, requests);
    return f == nullptr ? -1.0 : f->base_ns;
  };
  EXPECT_EQ(base(1), 1);
  EXPECT_EQ(base(2), 4);  // the smallest measured batch >= 2
  EXPECT_EQ(base(4), 4);
  EXPECT_EQ(base(64), 4);  // the largest above
  EXPECT_EQ(base(1, SpecGraph::kExtend), -1);
  EXPECT_EQ(base(1, SpecGraph::kVerify, "pdl"), -1);
  EXPECT_EQ(base(1, SpecGraph::kVerify, "graph", "other"), -1);
  r.base_ns = 1000;
  r.ns_per_position = 10;
  r.ns_per_position_ctx = 0.25;
  const SpecGraph v = SpecGraph::kVerify;
  EXPECT_EQ(spec_graph_residual_ns(r, v, 1, 6, 100), 1000 + 60 + 150);
  EXPECT_EQ(spec_graph_residual_ns(r, v, 1, 6, 101), 1212);  // 1211.5 rounds away from zero
  r.base_ns = -1000;
  EXPECT_EQ(spec_graph_residual_ns(r, v, 1, 2, 1), -980);  // -1000 + 20 + 0.5 = -979.5
  // 16-row chunks past the first: verify and extend of the padded batch (3 requests run as 4)
  // × width rows; none for drafts.
  EXPECT_EQ(spec_graph_extra_chunks(v, 1, 16), 0);
  EXPECT_EQ(spec_graph_extra_chunks(v, 2, 8), 0);
  EXPECT_EQ(spec_graph_extra_chunks(v, 3, 6), 1);                    // 24 rows
  EXPECT_EQ(spec_graph_extra_chunks(SpecGraph::kExtend, 4, 16), 3);  // 64 rows
  EXPECT_EQ(spec_graph_extra_chunks(SpecGraph::kDraft, 32, 15), 0);
  r.ns_per_position_ctx = 0;
  r.ns_per_extra_chunk = 4000;
  EXPECT_EQ(spec_graph_residual_ns(r, v, 3, 6, 0), -1000 + 60 + 4000);
  EXPECT_EQ(spec_graph_residual_ns(r, SpecGraph::kDraft, 3, 6, 0), -1000 + 60);
  // Skipped early-exit steps add ns_per_skipped_step each (negative counts none).
  r.ns_per_skipped_step = 250;
  EXPECT_EQ(spec_graph_residual_ns(r, SpecGraph::kDraftEarlyExit, 1, 6, 0, 9), -1000 + 60 + 2250);
  EXPECT_EQ(spec_graph_residual_ns(r, SpecGraph::kDraftEarlyExit, 1, 6, 0, -3), -1000 + 60);
}

// Corrections by hand: width 2 measured at ctx 100 (+1000) and 1100 (-1000), width 6 at ctx 600
// (+4000) alone.
TEST(SpecGraphFit, CorrectionsInterpolateInContextThenWidth) {
  const std::vector<Residual::Correction> c = {{2, 100, 1000}, {2, 1100, -1000}, {6, 600, 4000}};
  EXPECT_EQ(spec_graph_correction_ns({}, 4, 500), 0);
  EXPECT_DOUBLE_EQ(spec_graph_correction_ns(c, 2, 100), 1000);    // at a point
  EXPECT_DOUBLE_EQ(spec_graph_correction_ns(c, 2, 350), 500);     // a quarter of the way
  EXPECT_DOUBLE_EQ(spec_graph_correction_ns(c, 2, 50), 1000);     // held below the first
  EXPECT_DOUBLE_EQ(spec_graph_correction_ns(c, 2, 9000), -1000);  // and above the last
  EXPECT_DOUBLE_EQ(spec_graph_correction_ns(c, 6, 100), 4000);    // one point: everywhere
  EXPECT_DOUBLE_EQ(spec_graph_correction_ns(c, 1, 600), 0);       // below the widths: width 2's
  EXPECT_DOUBLE_EQ(spec_graph_correction_ns(c, 16, 600), 4000);   // above: width 6's
  // Width 3 at ctx 600: width 2 gives 0, width 6 gives 4000, a quarter of the way: 1000.
  EXPECT_DOUBLE_EQ(spec_graph_correction_ns(c, 3, 600), 1000);
  Residual r;
  r.corrections = c;
  EXPECT_EQ(spec_graph_residual_ns(r, SpecGraph::kVerify, 1, 3, 600), 1000);
}

// Corrections per attention split size (docs/calibration.md "Attention partition"): width 2 at
// ctx 100 (split 64: +1000) and at ctx 1100 measured at splits 128 (-1000) and 192 (-3000). Per
// context the split nearest the launch's, then linear in ctx.
TEST(SpecGraphFit, CorrectionsTakeTheNearestSplitPerContext) {
  const std::vector<Residual::Correction> c = {
      {2, 100, 1000, 64}, {2, 1100, -1000, 128}, {2, 1100, -3000, 192}};
  EXPECT_DOUBLE_EQ(spec_graph_correction_ns(c, 2, 1100, 128), -1000);
  EXPECT_DOUBLE_EQ(spec_graph_correction_ns(c, 2, 1100, 192), -3000);
  EXPECT_DOUBLE_EQ(spec_graph_correction_ns(c, 2, 1100, 256), -3000);  // nearest: 192
  EXPECT_DOUBLE_EQ(spec_graph_correction_ns(c, 2, 1100, 160), -1000);  // a tie: the smaller
  EXPECT_DOUBLE_EQ(spec_graph_correction_ns(c, 2, 1100, 0), -1000);    // unknown: the smallest
  EXPECT_DOUBLE_EQ(spec_graph_correction_ns(c, 2, 100, 192), 1000);    // ctx 100 has one split
  // Halfway from ctx 100 to 1100 at split 192: (1000 + -3000) / 2.
  EXPECT_DOUBLE_EQ(spec_graph_correction_ns(c, 2, 600, 192), -1000);
  EXPECT_DOUBLE_EQ(spec_graph_correction_ns(c, 2, 5000, 192), -3000);  // held above
  Residual r;
  r.corrections = c;
  EXPECT_EQ(spec_graph_residual_ns(r, SpecGraph::kVerify, 1, 2, 1100, 0, 192), -3000);
  EXPECT_EQ(spec_graph_residual_ns(r, SpecGraph::kVerify, 1, 2, 1100), -1000);
}

// The split size a launch gets (kernels/attention_split.h on 132 SMs, two blocks per SM):
// Qwen3-30B-A3B's 4 KV heads, one request: 264 / 4 = 66 target splits, so capacity 8256 gives
// ceil(8256 / 66) = 126 -> 128 tokens and 9280 gives 141 -> 192; four requests: 16 target splits,
// 8256 / 16 = 516 -> 576. Its TP2 shard (2 KV heads): 132 splits, 9280 / 132 = 71 -> 128.
// Llama-3-8B's 8 KV heads: 33 splits, 8256 -> 251 -> 256.
TEST(SpecGraphFit, SplitTokensFollowTheCapacity) {
  const ModelSpec qwen = model_preset("qwen3-30b-a3b");
  EXPECT_EQ(spec_graph_split_tokens(qwen, 1, 1, 8256, 132), 128);
  EXPECT_EQ(spec_graph_split_tokens(qwen, 1, 1, 9280, 132), 192);
  EXPECT_EQ(spec_graph_split_tokens(qwen, 1, 4, 8256, 132), 576);
  EXPECT_EQ(spec_graph_split_tokens(qwen, 2, 1, 9280, 132), 128);
  EXPECT_EQ(spec_graph_split_tokens(model_preset("llama-3-8b"), 1, 1, 8256, 132), 256);
  EXPECT_EQ(spec_graph_split_tokens(qwen, 1, 1, 0, 132), 0);
  EXPECT_EQ(spec_graph_split_tokens(qwen, 1, 1, 8256, 0), 0);
  const kernels::AttentionPartition p = kernels::attention_partition(8256, 1, 4, 132);
  EXPECT_EQ(p.splits, 65);  // ceil(8256 / 128)
  EXPECT_EQ(kernels::attention_active_splits(p, 8192), 64);
  EXPECT_EQ(kernels::attention_active_splits(p, 8193), 65);
  EXPECT_EQ(kernels::attention_active_splits(p, 100000), 65);  // at most the grid's
}

// The engine's KV capacity, as the real backend sizes it: the h200_moe_spec.yaml cases (prompt
// 8192, 1024 output tokens): none 8192 + 1024 = 9216 -> 9216; confidence with up to 7 drafts
// 3 * 8 = 24 more, 9240 -> 9280; chain(5) (draft_tokens 6: 5 drafts) 18 more, 9234 -> 9280. A
// prompt of 100 pads to 112; the largest request decides; at least 16 -> 64.
TEST(SpecGraphFit, EngineCapacityAsTheRealBackendSizesIt) {
  const std::vector<RequestSpec> requests = {{0, 0, 8192, 1024}, {1, 0, 100, 10}};
  SpecSpec none;
  EXPECT_EQ(engine_kv_capacity_tokens(requests, none), 9216);
  SpecSpec device;
  device.method = SpecMethod::kConfidence;
  device.max_steps = 7;
  EXPECT_EQ(spec_kv_margin(device), 24);
  EXPECT_EQ(engine_kv_capacity_tokens(requests, device), 9280);
  SpecSpec chain;
  chain.method = SpecMethod::kChain;
  chain.draft_tokens = 6;
  EXPECT_EQ(spec_kv_margin(chain), 18);
  EXPECT_EQ(engine_kv_capacity_tokens(requests, chain), 9280);
  EXPECT_EQ(request_kv_tokens(requests[1], none), 112 + 10);
  EXPECT_EQ(engine_kv_capacity_tokens({}, none), 64);
  EXPECT_EQ(spec_calibration_capacity_tokens(8192, 8), 8256);
  EXPECT_EQ(spec_calibration_capacity_tokens(8192, 16), 8256);
  EXPECT_EQ(spec_calibration_max_width(32, 4), 8);   // Qwen3-30B-A3B: 8 q heads per KV head
  EXPECT_EQ(spec_calibration_max_width(32, 8), 16);  // Llama-3-8B
}

// The form cannot follow a residual that bends in ctx (verify at 16 positions: 0 at ctx 100,
// +30 us at 1000, +40 us at 8000; 0 at 2 positions); the corrections make every point exact,
// and max_rel_err_loo prices each point from the others' corrections.
TEST(SpecGraphFit, CorrectionsMakeThePointsExactAndReportLeaveOneOut) {
  std::vector<CalibrationSample> s;
  const std::vector<std::pair<int64_t, double>> bend = {{100, 0}, {1000, 30000}, {8000, 40000}};
  for (const int64_t w : {2, 16}) {
    for (const auto& [ctx, r] : bend) add_point(s, "verify", 1, w, ctx, w == 16 ? r : 0.0);
  }
  const std::vector<Residual> f = fit_spec_graph_residuals(s, testing::ideal_machine());
  ASSERT_EQ(f.size(), 1u);
  ASSERT_EQ(f[0].corrections.size(), 6u);
  EXPECT_GT(f[0].max_rel_err, 1e-3);  // the form alone misses
  double worst = 0;
  for (size_t i = 0; i < 6; ++i) {
    const int64_t w = i < 3 ? 2 : 16;
    const auto& [ctx, r] = bend[i % 3];
    EXPECT_NEAR(
        double(spec_graph_residual_ns(f[0], SpecGraph::kVerify, 1, int32_t(w), double(ctx))),
        w == 16 ? r : 0.0, 1.0)
        << w << " " << ctx;
    Residual others = f[0];
    others.corrections.erase(others.corrections.begin() + std::ptrdiff_t(i));
    const double left_out =
        double(spec_graph_residual_ns(others, SpecGraph::kVerify, 1, int32_t(w), double(ctx)));
    const double t = double(hand_price_ns("verify", 1, w)) + (w == 16 ? r : 0.0);
    worst = std::max(worst, std::abs(left_out - (w == 16 ? r : 0.0)) / t);
    // By hand at 16 positions, ctx 1000: the form is linear in ctx there, so form + the
    // correction interpolated from ctx 100 and 8000 is the line from (100, 0) to (8000, 40000)
    // at 1000: 40000 x 900 / 7900 = 4557 ns.
    if (w == 16 && ctx == 1000) {
      EXPECT_NEAR(left_out, 40000.0 * 900 / 7900, 1.0);
    }
  }
  EXPECT_NEAR(f[0].max_rel_err_loo, worst, 1e-6);
}

// Two sessions of the same grid context a few tokens apart make one correction (their mean).
TEST(SpecGraphFit, CorrectionsPoolNearlyEqualContexts) {
  std::vector<CalibrationSample> s;
  add_point(s, "verify", 1, 6, 8210, 1000);
  add_point(s, "verify", 1, 6, 8215, 3000);
  add_point(s, "verify", 1, 6, 128, 0);
  const std::vector<Residual> f = fit_spec_graph_residuals(s, testing::ideal_machine());
  ASSERT_EQ(f.size(), 1u);
  ASSERT_EQ(f[0].corrections.size(), 2u);
  EXPECT_EQ(f[0].corrections[1].ctx, 8213);  // 8212.5 rounds away from zero
}

// draft_early_exit_skip by hand: a graph of S steps stopping after 1 costs 400 us + 6 us per
// skipped step at ctx 128 and 410 us + 7 us at ctx 8192 (the median of the two slopes: 6.5 us);
// another batch's samples leave batch 1 alone, and a draft_early_exit fit needs its own samples.
TEST(SpecGraphFit, SkippedEarlyExitStepsFromTheirSamples) {
  std::vector<CalibrationSample> s;
  for (const int64_t ctx : {128, 8192}) {
    for (const int64_t w : {2, 6, 16}) add_point(s, "draft_early_exit", 1, w - 1, ctx, 1000);
    for (const int64_t steps : {3, 7, 15}) {
      const double per = ctx == 128 ? 6000 : 7000, base = ctx == 128 ? 400000 : 410000;
      for (const double d : {-5.0, 0.0, 5.0}) {
        s.push_back(
            spec_sample(kEarlyExitSkipSample, 1, steps, ctx, base + per * double(steps - 1) + d));
      }
    }
  }
  s.push_back(spec_sample(kEarlyExitSkipSample, 4, 3, 128, 1e6));
  s.push_back(spec_sample(kEarlyExitSkipSample, 4, 15, 128, 9e6));
  const std::vector<Residual> f = fit_spec_graph_residuals(s, testing::ideal_machine());
  ASSERT_EQ(f.size(), 1u);  // the skip samples make no fit of their own
  EXPECT_EQ(f[0].graph, "draft_early_exit");
  EXPECT_NEAR(f[0].ns_per_skipped_step, 6500, 1e-6);
}

// ---- the profile section ----------------------------------------------------------------------

const char* kProfile = R"(format: 1
name: h200-test
base: h200
header:
  command: twinstep calibrate
  commit: abc
  gpu: NVIDIA H200
  driver: "570"
  date: 2026-11-29
kernels:
  gemm: {base_ns: 2000, ns_per_byte: 0.00025, ns_per_flop: 0, r2: 0.99, max_rel_err: 0.1, samples: 9}
spec_graph_residuals:
  - {model: "llama-3-8b", graph: "draft", mode: "graph", batch: 1, base_ns: 51234.5, ns_per_position: 48000.25, ns_per_position_ctx: -0.125, r2: 0.998, max_rel_err: 0.004, max_rel_err_unfitted: 0.09, mean_err_unfitted: -0.07, samples: 120, points: 12}
)";

TEST(SpecGraphProfile, WriteThenParseRoundTrips) {
  CalibrationProfile p = parse_calibration_profile(kProfile, "p.yaml");
  ASSERT_EQ(p.hw.spec_graph_residuals.size(), 1u);
  Residual r = p.hw.spec_graph_residuals[0];
  EXPECT_EQ(r.model, "llama-3-8b");
  EXPECT_EQ(r.graph, "draft");
  EXPECT_EQ(r.batch, 1);
  EXPECT_EQ(r.base_ns, 51234.5);
  EXPECT_EQ(r.ns_per_position_ctx, -0.125);
  EXPECT_EQ(r.mean_err_unfitted, -0.07);
  EXPECT_EQ(r.points, 12);
  r.graph = "extend";
  r.batch = 4;
  r.base_ns = -1.0 / 3;          // shortest round-trip doubles survive
  r.ns_per_extra_chunk = 4.5e6;  // optional: written where set
  r.ns_per_skipped_step = 5945.25;
  r.corrections = {{2, 145, -0.1}, {2, 8211, 27561.5}, {16, 363, -98571}};
  r.max_rel_err_loo = 0.0438;
  p.hw.spec_graph_residuals.push_back(r);
  const std::string text = write_calibration_profile(p);
  EXPECT_EQ(text.find(", ns_per_extra_chunk: "), text.rfind(", ns_per_extra_chunk: "));  // once
  const CalibrationProfile q = parse_calibration_profile(text, "mem");
  ASSERT_EQ(q.hw.spec_graph_residuals.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const Residual& a = p.hw.spec_graph_residuals[i];
    const Residual& b = q.hw.spec_graph_residuals[i];
    EXPECT_EQ(a.model, b.model);
    EXPECT_EQ(a.graph, b.graph);
    EXPECT_EQ(a.mode, b.mode);
    EXPECT_EQ(a.batch, b.batch);
    EXPECT_EQ(a.base_ns, b.base_ns);
    EXPECT_EQ(a.ns_per_position, b.ns_per_position);
    EXPECT_EQ(a.ns_per_position_ctx, b.ns_per_position_ctx);
    EXPECT_EQ(a.ns_per_extra_chunk, b.ns_per_extra_chunk);
    EXPECT_EQ(a.r2, b.r2);
    EXPECT_EQ(a.max_rel_err, b.max_rel_err);
    EXPECT_EQ(a.max_rel_err_unfitted, b.max_rel_err_unfitted);
    EXPECT_EQ(a.mean_err_unfitted, b.mean_err_unfitted);
    EXPECT_EQ(a.samples, b.samples);
    EXPECT_EQ(a.points, b.points);
    EXPECT_EQ(a.ns_per_skipped_step, b.ns_per_skipped_step);
    EXPECT_EQ(a.max_rel_err_loo, b.max_rel_err_loo);
    ASSERT_EQ(a.corrections.size(), b.corrections.size());
    for (size_t k = 0; k < a.corrections.size(); ++k) {
      EXPECT_EQ(a.corrections[k].positions, b.corrections[k].positions);
      EXPECT_EQ(a.corrections[k].ctx, b.corrections[k].ctx);
      EXPECT_EQ(a.corrections[k].ns, b.corrections[k].ns);
    }
  }
  EXPECT_EQ(q.hw.spec_graph_residuals[1].corrections.size(), 3u);
  EXPECT_EQ(write_calibration_profile(q), text);
}

TEST(SpecGraphProfile, OldProfilesLoadWithNoneAndWriteNoSection) {
  const std::string old = test::replace_once(
      kProfile, std::string(kProfile).substr(std::string(kProfile).find("spec_graph_residuals:")),
      "");
  const CalibrationProfile p = parse_calibration_profile(old, "old.yaml");
  EXPECT_TRUE(p.hw.spec_graph_residuals.empty());
  EXPECT_EQ(write_calibration_profile(p).find("spec_graph"), std::string::npos);
}

TEST(SpecGraphProfile, BadEntriesSayWhereAndWhat) {
  auto error_of = [](const std::string& from, const std::string& to) {
    return test::profile_error_of(test::replace_once(kProfile, from, to));
  };
  EXPECT_EQ(error_of("graph: \"draft\"", "graph: \"drafts\""),
            "p.yaml:13:34: spec_graph_residuals[0].graph 'drafts' is not one of draft, "
            "draft_early_exit, verify, extend");
  EXPECT_EQ(error_of("mode: \"graph\"", "mode: \"cuda_graph\""),
            "p.yaml:13:49: spec_graph_residuals[0].mode 'cuda_graph' is not one of graph, pdl, "
            "eager");
  EXPECT_EQ(error_of("batch: 1,", "batch: 0,"),
            "p.yaml:13:65: spec_graph_residuals[0].batch = 0 is out of range [1, 1048576]");
  EXPECT_EQ(error_of("base_ns: 51234.5, ", ""),
            "p.yaml:13:5: spec_graph_residuals[0] is missing required field 'base_ns'");
  EXPECT_EQ(error_of("ns_per_position: 48000.25", "ns_per_position: fast"),
            "p.yaml:13:103: spec_graph_residuals[0].ns_per_position must be a finite number, got "
            "'fast'");
  EXPECT_EQ(error_of("points: 12}", "points: 12, extra: 1}"),
            "p.yaml:13:253: unknown field 'extra' in spec_graph_residuals[0]; known: model, graph, "
            "mode, batch, base_ns, ns_per_position, ns_per_position_ctx, ns_per_extra_chunk, "
            "ns_per_skipped_step, r2, max_rel_err, max_rel_err_unfitted, mean_err_unfitted, "
            "samples, points, max_rel_err_loo, corrections");
  EXPECT_EQ(error_of("points: 12}", "points: 12, corrections: [[2, 100, 5]]}"),
            "p.yaml:13:5: spec_graph_residuals[0]: max_rel_err_loo and corrections come together");
  EXPECT_EQ(error_of("points: 12}",
                     "points: 12, max_rel_err_loo: 0.1, corrections: [[2, 100, 5], [2, 100, 6]]}"),
            "p.yaml:13:302: spec_graph_residuals[0].corrections[1] must follow [2, 100, ...] "
            "(points sorted by positions, ctx, then split, distinct)");
  EXPECT_EQ(
      error_of("points: 12}", "points: 12, max_rel_err_loo: 0.1, corrections: [[0, 100, 5]]}"),
      "p.yaml:13:290: spec_graph_residuals[0].corrections[0].positions = 0 is out of range "
      "[1, 1048576]");
  EXPECT_EQ(error_of("points: 12}", "points: 12, max_rel_err_loo: 0.1, corrections: [[2, 100]]}"),
            "p.yaml:13:289: spec_graph_residuals[0].corrections[0] must be a point [positions, "
            "ctx, ns] or [positions, ctx, ns, split_tokens]");
  EXPECT_EQ(error_of("spec_graph_residuals:\n  - ", "spec_graph_residuals:\n  x: "),
            "p.yaml:13:3: spec_graph_residuals must be a list of fits");
  const std::string entry = "  - {model: \"llama-3-8b\", graph: \"draft\"";
  const std::string twice = test::replace_once(
      kProfile, "spec_graph_residuals:\n",
      "spec_graph_residuals:\n" + std::string(kProfile).substr(std::string(kProfile).find(entry)));
  EXPECT_EQ(test::profile_error_of(twice),
            "p.yaml:14:5: spec_graph_residuals[1]: a second fit of llama-3-8b draft in mode graph "
            "at batch 1");
}

// ---- the residual in a simulated round -------------------------------------------------------

RunRecord simulate(const SpecSpec& spec, const HardwareSpec& hw,
                   GraphMode mode = GraphMode::kCudaGraph, double accept_rate = 0.0,
                   int32_t tp = 1) {
  PolicySpec policy;
  policy.host_schedule = HostSchedule::kLockstep;
  policy.graph_mode = mode;
  policy.spec = spec;
  WorkloadSpec w;
  w.input_len = {64, 64};
  w.output_len = {24, 24};
  w.num_requests = 1;
  const std::vector<RequestSpec> reqs = generate_requests(w);
  RunRecord r;
  DecodeLoop loop(policy, w, reqs, &r);
  HostCostModel host(testing::fixed_host_costs(3000, 2000, 1000), 1);
  SimOptions options;
  options.spec = spec;
  options.acceptance = {.accept_rate = accept_rate, .confidence_signal = 0.5};
  options.acceptance_seed = 7;
  options.layout.tp = tp;
  options.layout.vocab_parallel = false;
  SimBackend backend(model_preset("tiny-llama"), hw, host, reqs, options);
  std::vector<RunRecord> shadow(static_cast<size_t>(tp));  // a host program per rank; 0 records
  std::vector<std::unique_ptr<DecodeLoop>> loops;
  std::vector<HostProgram*> ranks = {&loop};
  for (int32_t i = 1; i < tp; ++i) {
    loops.push_back(std::make_unique<DecodeLoop>(policy, w, reqs, &shadow[size_t(i)]));
    ranks.push_back(loops.back().get());
  }
  backend.run(ranks, r);
  // Rank 0's samples only (a multi-rank record holds every rank's).
  std::erase_if(r.steps, [](const StepSample& x) { return x.rank != 0; });
  return r;
}

SpecSpec chain5() {
  SpecSpec s;
  s.method = SpecMethod::kChain;
  s.steps = 5;
  s.draft_tokens = 6;
  return s;
}

Residual residual(const char* graph, double base, double per_pos, double per_pos_ctx,
                  const char* model = "tiny-llama") {
  Residual r;
  r.model = model;
  r.graph = graph;
  r.mode = "graph";
  r.batch = 1;
  r.base_ns = base;
  r.ns_per_position = per_pos;
  r.ns_per_position_ctx = per_pos_ctx;
  r.samples = r.points = 1;
  return r;
}

TEST(SpecGraphSim, TheSimulatorChargesWhatSpecGraphPriceSays) {
  // Lockstep, nothing accepted: step k >= 1 is one round at ctx 63 + k (prompt 64, one token
  // committed per round); its GPU busy is the three launches' spans.
  const HardwareSpec hw = hardware_preset("h200");
  const RunRecord r = simulate(chain5(), hw);
  const CostModel cost(hw, "tiny-llama");
  const ModelSpec& m = model_preset("tiny-llama");
  const ModelSpec d = nextn_draft(m);
  ASSERT_GT(r.steps.size(), 10u);
  for (size_t k = 1; k < 10; ++k) {
    const int64_t ctx = 63 + int64_t(k);
    const int64_t g = hw.graph_node_gap_ns;
    const int64_t want = spec_graph_price_ns(cost, g, m, d, SpecGraph::kDraft, 1, 5, ctx) +
                         spec_graph_price_ns(cost, g, m, d, SpecGraph::kVerify, 1, 6, ctx) +
                         spec_graph_price_ns(cost, g, m, d, SpecGraph::kExtend, 1, 6, ctx);
    EXPECT_EQ(r.steps[k].gpu_busy_ns, want) << k;
  }
}

TEST(SpecGraphSim, ARoundCostsExactlyTheResidualMore) {
  // By hand, chain(5) (5 draft tokens, width 6) at ctx c: draft 1000 + 100 * 5 + 0.5 * 5 * c,
  // verify 2000 + 50 * 6, extend -700: 3100 + 2.5 c, rounded per launch (c = 65: 1662.5 -> 1663).
  const HardwareSpec plain = testing::ideal_machine();
  HardwareSpec fitted = plain;
  fitted.spec_graph_residuals = {residual("draft", 1000, 100, 0.5), residual("verify", 2000, 50, 0),
                                 residual("extend", -700, 0, 0)};
  const RunRecord a = simulate(chain5(), plain);
  const RunRecord b = simulate(chain5(), fitted);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  ASSERT_GT(a.steps.size(), 10u);
  EXPECT_EQ(b.steps[0].gpu_busy_ns, a.steps[0].gpu_busy_ns);  // prefill
  for (size_t k = 1; k < a.steps.size(); ++k) {
    const int64_t ctx = 63 + int64_t(k);
    const int64_t extra = std::llround(1500 + 2.5 * double(ctx)) + 2300 - 700;
    EXPECT_EQ(b.steps[k].gpu_busy_ns - a.steps[k].gpu_busy_ns, extra) << k;
    EXPECT_EQ(b.steps[k].dur_ns - a.steps[k].dur_ns, extra) << k;  // lockstep
  }
  EXPECT_EQ(b.steps[2].gpu_busy_ns - a.steps[2].gpu_busy_ns, 3263);
}

TEST(SpecGraphSim, WithoutAMatchingResidualNothingChanges) {
  // Another model's residuals, or PDL / eager launches (calibrate measures plain graphs only):
  // the same record as without any.
  HardwareSpec other = testing::ideal_machine();
  other.spec_graph_residuals = {residual("draft", 1e6, 0, 0, "llama-3-8b"),
                                residual("verify", 1e6, 0, 0, "llama-3-8b")};
  HardwareSpec mine = testing::ideal_machine();
  mine.spec_graph_residuals = {residual("draft", 1e6, 0, 0), residual("verify", 1e6, 0, 0),
                               residual("extend", 1e6, 0, 0)};
  const RunRecord base = simulate(chain5(), testing::ideal_machine());
  const RunRecord a = simulate(chain5(), other);
  ASSERT_EQ(a.steps.size(), base.steps.size());
  for (size_t k = 0; k < base.steps.size(); ++k) {
    EXPECT_EQ(a.steps[k].gpu_busy_ns, base.steps[k].gpu_busy_ns) << k;
    EXPECT_EQ(a.steps[k].dur_ns, base.steps[k].dur_ns) << k;
  }
  for (const GraphMode mode : {GraphMode::kCudaGraphPdl, GraphMode::kEager}) {
    const RunRecord x = simulate(chain5(), testing::ideal_machine(), mode);
    const RunRecord y = simulate(chain5(), mine, mode);
    ASSERT_EQ(x.steps.size(), y.steps.size());
    for (size_t k = 0; k < x.steps.size(); ++k) {
      EXPECT_EQ(y.steps[k].gpu_busy_ns, x.steps[k].gpu_busy_ns) << k;
    }
  }
}

// Tensor parallelism: a TP2 run's speculative launches take the residuals of the shard label
// ("tiny-llama@tp2", what calibrate --tp 2 measures), spread over each rank's compute: every
// round costs exactly their sum more (1000 + 2000 - 700 = 2300 ns, no context or position
// terms), on both ranks alike; the one-GPU model's residuals do not apply to it, nor the shard's
// to a one-GPU run.
TEST(SpecGraphSim, TensorParallelRunsUseTheirShardsResidual) {
  HardwareSpec shard = testing::ideal_machine();
  shard.spec_graph_residuals = {residual("draft", 1000, 0, 0, "tiny-llama@tp2"),
                                residual("verify", 2000, 0, 0, "tiny-llama@tp2"),
                                residual("extend", -700, 0, 0, "tiny-llama@tp2")};
  HardwareSpec one_gpu = testing::ideal_machine();
  one_gpu.spec_graph_residuals = {residual("draft", 1e6, 0, 0), residual("verify", 1e6, 0, 0)};
  const RunRecord base = simulate(chain5(), testing::ideal_machine(), GraphMode::kCudaGraph, 0, 2);
  const RunRecord with = simulate(chain5(), shard, GraphMode::kCudaGraph, 0, 2);
  const RunRecord other = simulate(chain5(), one_gpu, GraphMode::kCudaGraph, 0, 2);
  ASSERT_EQ(with.steps.size(), base.steps.size());
  ASSERT_GT(base.steps.size(), 10u);
  EXPECT_EQ(with.steps[0].gpu_busy_ns, base.steps[0].gpu_busy_ns);  // prefill
  for (size_t k = 1; k < base.steps.size(); ++k) {
    EXPECT_EQ(with.steps[k].dur_ns - base.steps[k].dur_ns, 2300) << k;
    EXPECT_EQ(with.steps[k].gpu_busy_ns - base.steps[k].gpu_busy_ns, 2300) << k;
    EXPECT_EQ(other.steps[k].dur_ns, base.steps[k].dur_ns) << k;
  }
  const RunRecord single = simulate(chain5(), testing::ideal_machine());
  const RunRecord single_shard = simulate(chain5(), shard);
  ASSERT_EQ(single.steps.size(), single_shard.steps.size());
  for (size_t k = 0; k < single.steps.size(); ++k)
    EXPECT_EQ(single_shard.steps[k].dur_ns, single.steps[k].dur_ns) << k;
}

TEST(SpecGraphSim, DeviceDecidedDraftsWithEarlyExitUseTheirOwnResidual) {
  SpecSpec dev;
  dev.method = SpecMethod::kConfidence;
  dev.mode = DraftMode::kDevice;
  dev.max_steps = 8;
  dev.threshold = 0.3;
  HardwareSpec fitted = testing::ideal_machine();
  fitted.spec_graph_residuals = {residual("draft", 1000, 0, 0),
                                 residual("draft_early_exit", 5000, 0, 0)};
  const RunRecord a = simulate(dev, testing::ideal_machine(), GraphMode::kCudaGraph, 0.7);
  const RunRecord b = simulate(dev, fitted, GraphMode::kCudaGraph, 0.7);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t k = 1; k < a.steps.size(); ++k) {
    EXPECT_EQ(b.steps[k].gpu_busy_ns - a.steps[k].gpu_busy_ns, 5000) << k;
  }
  // 300 ns per conditional step skipped: the graph holds max_steps (8) steps, so a round that
  // drafted L tokens pays 300 x (8 - L) more.
  fitted.spec_graph_residuals[1].ns_per_skipped_step = 300;
  const RunRecord s = simulate(dev, fitted, GraphMode::kCudaGraph, 0.7);
  ASSERT_EQ(s.steps.size(), a.steps.size());
  bool short_draft = false;
  for (size_t k = 1; k < a.steps.size(); ++k) {
    ASSERT_GE(s.steps[k].draft_len, 1) << k;
    short_draft |= s.steps[k].draft_len < 8;
    EXPECT_EQ(s.steps[k].gpu_busy_ns - a.steps[k].gpu_busy_ns,
              5000 + 300 * (8 - s.steps[k].draft_len))
        << k;
  }
  EXPECT_TRUE(short_draft);  // the case is exercised
  dev.early_exit = false;    // every step runs: the plain draft graph
  const RunRecord c = simulate(dev, testing::ideal_machine(), GraphMode::kCudaGraph, 0.7);
  const RunRecord e = simulate(dev, fitted, GraphMode::kCudaGraph, 0.7);
  ASSERT_EQ(c.steps.size(), e.steps.size());
  for (size_t k = 1; k < c.steps.size(); ++k) {
    EXPECT_EQ(e.steps[k].gpu_busy_ns - c.steps[k].gpu_busy_ns, 1000) << k;
  }
}

}  // namespace
}  // namespace twinstep
