// Calibration fitting (NNLS, per-class kernel fits, launch figures), the profile file format,
// profile resolution by name, and the cost model with fitted classes.
#include "simulator/calibration.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "experiments/experiment.h"
#include "kernels/gemv_split.h"
#include "policies/calibration_model.h"
#include "policies/calibration_profile.h"
#include "policies/decode_loop.h"
#include "policies/error.h"
#include "policies/rng.h"
#include "results/db.h"
#include "simulator/cost_model.h"
#include "simulator/sim_backend.h"
#include "tests/simulator/profile_text.h"

namespace twinstep {
namespace {

// ---- NNLS -------------------------------------------------------------------------------------

TEST(Nnls, UnconstrainedOptimumInsideTheOrthantIsTheLeastSquaresSolution) {
  // b = A·(1, 2) exactly: the least-squares solution is feasible, so NNLS returns it.
  Eigen::MatrixXd a(3, 2);
  a << 1, 0, 0, 1, 1, 1;
  Eigen::VectorXd b(3);
  b << 1, 2, 3;
  const Eigen::VectorXd x = nnls(a, b);
  EXPECT_NEAR(x(0), 1.0, 1e-12);
  EXPECT_NEAR(x(1), 2.0, 1e-12);
}

TEST(Nnls, ActiveConstraintHandWorked) {
  // Fitting b = (3, 2, 1) at t = 1, 2, 3 with x0 + x1·t: least squares gives x = (4, −1).
  // With x1 >= 0 the optimum is x1 = 0, x0 = mean(b) = 2; KKT: the gradient on x1,
  // Σ t_i (b_i − 2) = 1·1 + 2·0 + 3·(−1) = −2 < 0, so x1 stays at its bound.
  Eigen::MatrixXd a(3, 2);
  a << 1, 1, 1, 2, 1, 3;
  Eigen::VectorXd b(3);
  b << 3, 2, 1;
  const Eigen::VectorXd x = nnls(a, b);
  EXPECT_NEAR(x(0), 2.0, 1e-12);
  EXPECT_EQ(x(1), 0.0);
}

TEST(Nnls, IdentityClipsNegativeComponents) {
  // min ||x − b|| over x >= 0 is max(b, 0) componentwise.
  Eigen::VectorXd b(4);
  b << 1.5, -1, 0.25, -3;
  const Eigen::VectorXd x = nnls(Eigen::MatrixXd::Identity(4, 4), b);
  EXPECT_DOUBLE_EQ(x(0), 1.5);
  EXPECT_EQ(x(1), 0.0);
  EXPECT_DOUBLE_EQ(x(2), 0.25);
  EXPECT_EQ(x(3), 0.0);
}

TEST(Nnls, AllNegativeCorrelationGivesZero) {
  Eigen::MatrixXd a(2, 2);
  a << 1, 2, 3, 4;
  Eigen::VectorXd b(2);
  b << -1, -2;
  const Eigen::VectorXd x = nnls(a, b);
  EXPECT_EQ(x(0), 0.0);
  EXPECT_EQ(x(1), 0.0);
}

TEST(Nnls, RecoversPositiveCoefficientsOfAConsistentSystem) {
  Eigen::MatrixXd a(20, 4);
  for (int i = 0; i < 20; ++i) {
    for (int j = 0; j < 4; ++j) a(i, j) = rng_uniform(7, uint64_t(j), uint64_t(i));
  }
  Eigen::VectorXd truth(4);
  truth << 0.5, 3, 0.01, 7;
  const Eigen::VectorXd x = nnls(a, a * truth);
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(x(j), truth(j), 1e-9) << j;
}

TEST(Nnls, ShapeMismatchThrows) {
  EXPECT_THROW(nnls(Eigen::MatrixXd::Ones(3, 2), Eigen::VectorXd::Ones(2)), Error);
}

// ---- kernel fits ------------------------------------------------------------------------------

std::vector<KernelSample> synthetic_gemm(double base, double per_byte, double per_flop,
                                         double noise, uint64_t seed) {
  uint64_t counter = 0;
  std::vector<KernelSample> s;
  for (int batch : {1, 2, 4, 8, 16, 32, 64}) {
    for (double mb : {8.0, 16.0, 32.0, 58.0, 117.0}) {
      const double bytes = mb * 1e6;
      const double flops = bytes * batch;  // GEMV: 2·m·n·k flops over 2·n·k bytes
      const double ns = base + per_byte * bytes + per_flop * flops;
      s.push_back({KernelClass::kGemm, bytes, flops,
                   ns * (1 + noise * (2 * rng_uniform(seed, 0, counter++) - 1))});
    }
  }
  s.push_back({KernelClass::kNorm, 1e4, 1e4, 3000});  // another class: ignored
  return s;
}

TEST(KernelFit, RecoversKnownCoefficientsExactlyWithoutNoise) {
  const auto s = synthetic_gemm(2500, 2.4e-4, 3e-6, 0, 1);
  const KernelFit f = fit_kernel_class(s, KernelClass::kGemm);
  ASSERT_TRUE(f.fitted);
  EXPECT_EQ(f.samples, 35);
  EXPECT_NEAR(f.base_ns, 2500, 1e-6 * 2500);
  EXPECT_NEAR(f.ns_per_byte, 2.4e-4, 1e-9 * 2.4e-4);
  EXPECT_NEAR(f.ns_per_flop, 3e-6, 1e-9 * 3e-6);
  EXPECT_NEAR(f.r2, 1.0, 1e-12);
  EXPECT_LT(f.max_rel_err, 1e-9);
}

TEST(KernelFit, RecoversKnownCoefficientsUnderOnePercentNoise) {
  const auto s = synthetic_gemm(2500, 2.4e-4, 3e-6, 0.01, 2);
  const KernelFit f = fit_kernel_class(s, KernelClass::kGemm);
  ASSERT_TRUE(f.fitted);
  EXPECT_NEAR(f.ns_per_byte, 2.4e-4, 0.03 * 2.4e-4);
  EXPECT_NEAR(f.ns_per_flop, 3e-6, 0.10 * 3e-6);
  EXPECT_NEAR(f.base_ns, 2500, 0.25 * 2500);
  EXPECT_GT(f.r2, 0.999);
  EXPECT_LT(f.max_rel_err, 0.03);  // 1% noise plus the fit's own error
}

// ---- GEMV split-K (kernels/gemv_split.h, gemv_split_rows, ns_per_split_row) -----------------

TEST(GemvSplit, RuntimeRuleOnTheH200HandComputed) {
  // S = 2 only where 4 · tiles <= 3 · 132 = 396 (at most 99 tiles) and K keeps 4 chunks of 32
  // per warp at S = 2 (k / 32 / 16 >= 4, k >= 2048). Llama-3-8B TP4 qkv, 1536 x 4096: 96 tiles,
  // 4096 / 32 / 16 = 8: S = 2.
  EXPECT_EQ(kernels::gemv_default_split(1536, 4096, 132), 2);
  // 1536 x 1024: 96 tiles but 1024 / 32 / 16 = 2 chunks: S = 1.
  EXPECT_EQ(kernels::gemv_default_split(1536, 1024, 132), 1);
  // 1600 x 4096: 100 tiles, 400 > 396: S = 1.
  EXPECT_EQ(kernels::gemv_default_split(1600, 4096, 132), 1);
  // Llama-3.2-3B down_proj 3072 x 8192 (192 tiles, S = 4 under the earlier rule) and qkv 5120 x
  // 3072 (320 tiles, S = 2 before); Llama-3-8B down_proj 4096 x 14336: S = 1.
  EXPECT_EQ(kernels::gemv_default_split(3072, 8192, 132), 1);
  EXPECT_EQ(kernels::gemv_default_split(5120, 3072, 132), 1);
  EXPECT_EQ(kernels::gemv_default_split(4096, 14336, 132), 1);
  EXPECT_EQ(kernels::gemv_default_split(4100, 14336, 132), 0);  // not a GEMV shape
  // The ring: 96 tiles fit one block per SM (6); 384 tiles fill 264 two-block slots in 1.45
  // rounds (73 %) and 132 one-block slots in 2.9 (97 %): 6; 192 tiles: 73 % either way: 3.
  EXPECT_EQ(kernels::gemv_auto_stages(96, 132), 6);
  EXPECT_EQ(kernels::gemv_auto_stages(384, 132), 6);
  EXPECT_EQ(kernels::gemv_auto_stages(192, 132), 3);
}

TEST(GemvSplit, SplitRowsOfAStepKernelAndItsPrice) {
  // The TP4 qkv shard (S = 2) at 8 rows: (rows − 1) · (S − 1) = 7 · 1 = 7; one row: 0.
  KernelDesc k{"qkv_proj", KernelClass::kGemm, 0, 0, 2LL * 8 * 1536 * 4096};
  k.gemv_n = 1536;
  k.gemv_k = 4096;
  EXPECT_DOUBLE_EQ(gemv_split_rows(k, 132), 7.0);
  KernelDesc one = k;
  one.flops = 2LL * 1536 * 4096;
  EXPECT_DOUBLE_EQ(gemv_split_rows(one, 132), 0.0);
  EXPECT_DOUBLE_EQ(gemv_split_rows(k, 0), 0.0);
  KernelDesc wide = k;  // 32 rows: cuBLAS, no split term
  wide.flops = 2LL * 32 * 1536 * 4096;
  EXPECT_DOUBLE_EQ(gemv_split_rows(wide, 132), 0.0);
  KernelDesc unset = k;
  unset.gemv_n = 0;
  EXPECT_DOUBLE_EQ(gemv_split_rows(unset, 132), 0.0);
  KernelDesc unsplit = k;  // Llama-3.2-3B down_proj: S = 1, no split rows at any row count
  unsplit.gemv_n = 3072;
  unsplit.gemv_k = 8192;
  unsplit.flops = 2LL * 8 * 3072 * 8192;
  EXPECT_DOUBLE_EQ(gemv_split_rows(unsplit, 132), 0.0);
  // Priced: base 1000 + 100 ns per split row · 7 = 1700 ns (bytes 0, flops term 0).
  HardwareSpec hw = hardware_preset("h200");
  KernelFit f;
  f.fitted = true;
  f.base_ns = 1000;
  f.ns_per_split_row = 100;
  hw.kernel_fits[size_t(KernelClass::kGemm)] = f;
  EXPECT_EQ(CostModel(hw).kernel_ns(k), 1700);
  EXPECT_EQ(CostModel(hw).kernel_ns(unset), 1000);
}

TEST(GemvSplit, FitRecoversThePerSplitRowCostAndHoldsIt) {
  // Two shapes, 50 MB of weights at S = 1 and 30 MB at S = 4, rows 1 … 16: t = 2000 + 2.5e-4 ·
  // bytes + 150 · (rows − 1) · (S − 1). The two intercepts give base and byte cost, the two slopes
  // the FLOP and split-row costs.
  std::vector<KernelSample> s;
  for (const auto& [split, weights] : {std::pair{1.0, 5e7}, std::pair{4.0, 3e7}}) {
    for (const int rows : {1, 2, 4, 8, 16}) {
      const double bytes = weights + rows * 2e4, flops = rows * weights;
      const double sr = (rows - 1) * (split - 1);
      s.push_back({KernelClass::kGemm, bytes, flops, 2000 + 2.5e-4 * bytes + 150 * sr, 0, sr});
    }
  }
  const KernelFit f = fit_kernel_class(s, KernelClass::kGemm);
  ASSERT_TRUE(f.fitted);
  EXPECT_NEAR(f.ns_per_split_row, 150, 1e-6 * 150);
  EXPECT_NEAR(f.base_ns, 2000, 1e-6 * 2000);
  // Held at 150: the rest is fitted to t − 150 · split rows, the same line.
  const KernelFit h = fit_kernel_class_with_base(s, KernelClass::kGemm, 0, -1, -1, 150);
  EXPECT_DOUBLE_EQ(h.ns_per_split_row, 150);
  EXPECT_NEAR(h.ns_per_byte, 2.5e-4, 1e-6 * 2.5e-4);
}

TEST(KernelFit, TwoRegimesSplitByIntensityEachRecovered) {
  // Rows <= 16 (flops / bytes = rows here) follow one line, wider ones another.
  const auto narrow = synthetic_gemm(2500, 2.4e-4, 3e-6, 0, 4);
  const auto wide = synthetic_gemm(9000, 3.5e-4, 1e-5, 0, 5);
  std::vector<KernelSample> s;
  for (const KernelSample& k : narrow) {
    if (k.cls == KernelClass::kGemm && k.flops <= 16 * k.bytes) s.push_back(k);
  }
  for (const KernelSample& k : wide) {
    if (k.cls == KernelClass::kGemm && k.flops > 16 * k.bytes) s.push_back(k);
  }
  const KernelFit f = fit_kernel_class(s, KernelClass::kGemm, 16.5);
  ASSERT_TRUE(f.fitted);
  EXPECT_EQ(f.samples, 35);
  EXPECT_EQ(f.split_intensity, 16.5);
  EXPECT_NEAR(f.base_ns, 2500, 1e-6 * 2500);
  EXPECT_NEAR(f.ns_per_byte, 2.4e-4, 1e-9 * 2.4e-4);
  EXPECT_NEAR(f.ns_per_flop, 3e-6, 1e-9 * 3e-6);
  EXPECT_NEAR(f.wide_base_ns, 9000, 1e-6 * 9000);
  EXPECT_NEAR(f.wide_ns_per_byte, 3.5e-4, 1e-9 * 3.5e-4);
  EXPECT_NEAR(f.wide_ns_per_flop, 1e-5, 1e-9 * 1e-5);
  EXPECT_LT(f.max_rel_err, 1e-9);
  // One line cannot follow both: the same samples fitted as one regime are visibly worse.
  EXPECT_GT(fit_kernel_class(s, KernelClass::kGemm).max_rel_err, 0.05);
  // Fewer than three samples on a side: one regime.
  EXPECT_EQ(fit_kernel_class(s, KernelClass::kGemm, 100).split_intensity, 0);
}

TEST(KernelFit, CoefficientThatWouldBeNegativeIsHeldAtZero) {
  // Time falls with FLOPs at fixed bytes in these samples; unconstrained least squares would
  // return a negative per-flop cost.
  std::vector<KernelSample> s;
  for (int i = 1; i <= 6; ++i) {
    s.push_back({KernelClass::kAttention, 1e6 * i, 1e6 * (7 - i), 1000.0 + 100.0 * i});
  }
  const KernelFit f = fit_kernel_class(s, KernelClass::kAttention);
  ASSERT_TRUE(f.fitted);
  EXPECT_EQ(f.ns_per_flop, 0.0);
  EXPECT_GE(f.base_ns, 0.0);
  EXPECT_GT(f.ns_per_byte, 0.0);
}

TEST(KernelFit, FewerThanThreeSamplesIsNotFitted) {
  const std::vector<KernelSample> s = {{KernelClass::kRope, 1, 1, 10},
                                       {KernelClass::kRope, 2, 2, 20}};
  EXPECT_FALSE(fit_kernel_class(s, KernelClass::kRope).fitted);
}

TEST(Distribution, LinearInterpolatedPercentiles) {
  // numpy.percentile([5, 1, 4, 2, 3], [50, 90, 99]) = 3, 4.6, 4.96.
  const Distribution d = distribution({5, 1, 4, 2, 3});
  EXPECT_EQ(d.n, 5);
  EXPECT_DOUBLE_EQ(d.mean_ns, 3);
  EXPECT_DOUBLE_EQ(d.p50_ns, 3);
  EXPECT_NEAR(d.p90_ns, 4.6, 1e-12);
  EXPECT_NEAR(d.p99_ns, 4.96, 1e-12);
  EXPECT_DOUBLE_EQ(d.max_ns, 5);
}

// ---- whole calibration ------------------------------------------------------------------------

CalibrationSample sample(const char* kind, double ns) {
  CalibrationSample s;
  s.kind = kind;
  s.value_ns = ns;
  return s;
}

std::vector<CalibrationSample> synthetic_session() {
  std::vector<CalibrationSample> v;
  for (const KernelSample& k : synthetic_gemm(2500, 2.4e-4, 3e-6, 0, 3)) {
    CalibrationSample s = sample("kernel", k.ns);
    s.cls = kernel_class_name(k.cls);
    s.bytes = int64_t(k.bytes);
    s.flops = int64_t(k.flops);
    v.push_back(s);
  }
  for (double g : {700.0, 600.0, 650.0}) {
    CalibrationSample s = sample("node_gap", g);
    s.mode = "graph";
    v.push_back(s);
  }
  for (double g : {150.0, 250.0, 200.0}) {
    CalibrationSample s = sample("node_gap", g);
    s.mode = "pdl";
    v.push_back(s);
  }
  for (double g : {1500.0, 1700.0, 1600.0, 2500.0}) {
    CalibrationSample s = sample("node_gap", g);
    s.mode = "eager";
    v.push_back(s);
  }
  for (double e : {4100.0, 3900.0, 4000.0}) v.push_back(sample("eager_launch", e));
  for (double e : {1800.0, 2200.0, 2000.0}) v.push_back(sample("event_sync", e));
  // Graph launch host cost 3000 + 10 ns per node.
  for (int64_t nodes : {1, 100, 300}) {
    CalibrationSample s = sample("graph_launch", 3000.0 + 10.0 * double(nodes));
    s.nodes = nodes;
    v.push_back(s);
  }
  // D2H: 6 µs latency, 20 GB/s (0.05 ns/B).
  for (int64_t bytes : {8, 4096, 1 << 20, 16 << 20}) {
    CalibrationSample s = sample("d2h", 6000.0 + 0.05 * double(bytes));
    s.bytes = bytes;
    v.push_back(s);
  }
  for (double ns : {1e6, 0.9e6}) {  // 4.5e9 B at 1e6 ns = 4.5 TB/s; 5 TB/s at 0.9e6 ns
    CalibrationSample s = sample("stream_read", ns);
    s.bytes = 4'500'000'000;
    v.push_back(s);
  }
  for (double ns : {5.0, 1.0, 4.0, 2.0, 3.0}) {
    CalibrationSample s = sample("host_op", ns * 1000);
    s.name = "schedule";
    v.push_back(s);
  }
  for (const char* kind : {"step", "step_profiled"}) {
    CalibrationSample s = sample(kind, std::string(kind) == "step" ? 4.0e6 : 4.4e6);
    s.mode = "graph";
    s.model = "llama-3-8b";
    s.batch = 1;
    s.ctx_tokens = 128;
    v.push_back(s);
  }
  return v;
}

const ProfileHeader kHeader{"twinstep calibrate --out x.yaml", "abc1234", "NVIDIA H200",
                            "570.86.15", "2026-11-29T12:00:00Z"};

double measurement(const CalibrationProfile& p, const std::string& key) {
  for (const auto& [k, v] : p.measurements) {
    if (k == key) return v;
  }
  ADD_FAILURE() << "no measurement " << key;
  return 0;
}

TEST(FitCalibration, FiguresFromTheirSamples) {
  const CalibrationProfile p = fit_calibration(synthetic_session(), "h200-test", "h200", kHeader);
  EXPECT_EQ(p.hw.name, "h200-test");
  EXPECT_EQ(p.hw.hbm_bytes, hardware_preset("h200").hbm_bytes);  // unmeasured: the base's
  EXPECT_EQ(p.hw.graph_node_gap_ns, 650);                        // medians
  EXPECT_EQ(p.hw.pdl_node_gap_ns, 200);
  EXPECT_EQ(p.hw.eager_node_gap_ns, 1650);  // median of 1500, 1600, 1700, 2500
  EXPECT_EQ(p.hw.eager_launch_ns, 4000);
  EXPECT_EQ(p.hw.host_wake_ns, 2000);
  EXPECT_EQ(p.hw.graph_launch_ns, 3000 + 10 * 300);  // at the largest graph
  EXPECT_NEAR(measurement(p, "graph_launch_ns_per_node"), 10, 1e-6);
  EXPECT_EQ(p.hw.d2h_latency_ns, 6000);
  EXPECT_NEAR(p.hw.d2h_gbps, 20, 1e-6);
  EXPECT_NEAR(p.hw.stream_read_tbps, 5.0, 1e-12);
  ASSERT_EQ(p.host_ops.size(), 1u);
  EXPECT_EQ(p.host_ops[0].first, "schedule");
  EXPECT_NEAR(p.host_ops[0].second.p90_ns, 4600, 1e-9);
  EXPECT_NEAR(measurement(p, "profiled_inflation_pct_graph"), 10.0, 1e-9);
  const KernelFit& gemm = p.hw.kernel_fits[size_t(KernelClass::kGemm)];
  ASSERT_TRUE(gemm.fitted);
  EXPECT_NEAR(gemm.ns_per_byte, 2.4e-4, 1e-9 * 2.4e-4);
  EXPECT_FALSE(p.hw.kernel_fits[size_t(KernelClass::kNorm)].fitted);  // one sample
  // The floor stays the base preset's (it prices classes never fitted).
  EXPECT_EQ(p.hw.kernel_floor_ns, hardware_preset("h200").kernel_floor_ns);
}

TEST(FitCalibration, UnknownKindThrows) {
  std::vector<CalibrationSample> v = {sample("kernal", 1)};
  EXPECT_THROW(fit_calibration(v, "x", "h200", kHeader), Error);
}

TEST(CalibrationStore, SamplesRoundTripThroughTheDatabaseAndRefitIdentically) {
  ResultsDb db = ResultsDb::open(":memory:");
  EXPECT_THROW(db.calibration_samples(), Error);  // no session yet
  const std::vector<CalibrationSample> v = synthetic_session();
  ProfileHeader older = kHeader;
  older.command = "older";
  db.store_calibration(older, true, {sample("eager_launch", 1)});
  const int64_t id = db.store_calibration(kHeader, false, v);
  ProfileHeader h;
  const std::vector<CalibrationSample> back = db.calibration_samples(0, &h);  // the latest
  EXPECT_EQ(h.command, kHeader.command);
  EXPECT_EQ(h.commit, kHeader.commit);
  EXPECT_EQ(h.gpu, kHeader.gpu);
  EXPECT_EQ(h.driver, kHeader.driver);
  EXPECT_EQ(h.date, kHeader.date);
  ASSERT_EQ(back.size(), v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(back[i].kind, v[i].kind);
    EXPECT_EQ(back[i].name, v[i].name);
    EXPECT_EQ(back[i].cls, v[i].cls);
    EXPECT_EQ(back[i].mode, v[i].mode);
    EXPECT_EQ(back[i].model, v[i].model);
    EXPECT_EQ(back[i].batch, v[i].batch);
    EXPECT_EQ(back[i].ctx_tokens, v[i].ctx_tokens);
    EXPECT_EQ(back[i].nodes, v[i].nodes);
    EXPECT_EQ(back[i].bytes, v[i].bytes);
    EXPECT_EQ(back[i].flops, v[i].flops);
    EXPECT_EQ(back[i].value_ns, v[i].value_ns);
  }
  EXPECT_EQ(db.calibration_samples(id - 1).size(), 1u);
  EXPECT_THROW(db.calibration_samples(id + 1), Error);
  const std::string a = write_calibration_profile(fit_calibration(v, "x", "h200", kHeader));
  const std::string b = write_calibration_profile(fit_calibration(back, "x", "h200", h));
  EXPECT_EQ(a, b);
}

// ---- profile file -----------------------------------------------------------------------------

void expect_same(const KernelFit& a, const KernelFit& b) {
  EXPECT_EQ(a.fitted, b.fitted);
  EXPECT_EQ(a.base_ns, b.base_ns);
  EXPECT_EQ(a.ns_per_byte, b.ns_per_byte);
  EXPECT_EQ(a.ns_per_flop, b.ns_per_flop);
  EXPECT_EQ(a.ns_per_request, b.ns_per_request);
  EXPECT_EQ(a.r2, b.r2);
  EXPECT_EQ(a.max_rel_err, b.max_rel_err);
  EXPECT_EQ(a.samples, b.samples);
  EXPECT_EQ(a.split_intensity, b.split_intensity);
  EXPECT_EQ(a.split_bytes, b.split_bytes);
  EXPECT_EQ(a.wide_base_ns, b.wide_base_ns);
  EXPECT_EQ(a.wide_ns_per_byte, b.wide_ns_per_byte);
  EXPECT_EQ(a.wide_ns_per_flop, b.wide_ns_per_flop);
  EXPECT_EQ(a.wide_ns_per_request, b.wide_ns_per_request);
}

TEST(CalibrationProfile, WriteThenParseRoundTrips) {
  CalibrationProfile p = fit_calibration(synthetic_session(), "h200-test", "h200", kHeader);
  p.header.command = "twinstep calibrate --out \"a b\\c\".yaml";  // quoting survives
  p.hw.interconnect_gbps = 361.25;  // collective figures, as calibrate-nccl sets them
  p.hw.allreduce_alpha_ns = 7123;
  p.hw.alltoall_alpha_ns = 9876;
  p.hw.p2p_alpha_ns = 5432;
  const CalibrationProfile q = parse_calibration_profile(write_calibration_profile(p), "mem");
  EXPECT_EQ(q.name, p.name);
  EXPECT_EQ(q.base, p.base);
  EXPECT_EQ(q.header.command, p.header.command);
  EXPECT_EQ(q.header.commit, p.header.commit);
  EXPECT_EQ(q.header.gpu, p.header.gpu);
  EXPECT_EQ(q.header.driver, p.header.driver);
  EXPECT_EQ(q.header.date, p.header.date);
  EXPECT_EQ(q.hw.source, p.hw.source);
  EXPECT_EQ(q.hw.stream_read_tbps, p.hw.stream_read_tbps);
  EXPECT_EQ(q.hw.kernel_floor_ns, p.hw.kernel_floor_ns);
  EXPECT_EQ(q.hw.eager_launch_ns, p.hw.eager_launch_ns);
  EXPECT_EQ(q.hw.graph_launch_ns, p.hw.graph_launch_ns);
  EXPECT_EQ(q.hw.graph_node_gap_ns, p.hw.graph_node_gap_ns);
  EXPECT_EQ(q.hw.pdl_node_gap_ns, p.hw.pdl_node_gap_ns);
  EXPECT_EQ(q.hw.eager_node_gap_ns, 1650);
  EXPECT_EQ(q.hw.d2h_latency_ns, p.hw.d2h_latency_ns);
  EXPECT_EQ(q.hw.d2h_gbps, p.hw.d2h_gbps);
  EXPECT_EQ(q.hw.host_wake_ns, p.hw.host_wake_ns);
  EXPECT_EQ(q.hw.interconnect_gbps, 361.25);
  EXPECT_EQ(q.hw.allreduce_alpha_ns, 7123);
  EXPECT_EQ(q.hw.alltoall_alpha_ns, 9876);
  EXPECT_EQ(q.hw.p2p_alpha_ns, 5432);
  EXPECT_GT(p.hw.kernel_fits[size_t(KernelClass::kGemm)].split_intensity, 0);  // covered
  for (size_t c = 0; c < kKernelFitSlots; ++c)
    expect_same(q.hw.kernel_fits[c], p.hw.kernel_fits[c]);
  ASSERT_EQ(q.host_ops.size(), p.host_ops.size());
  EXPECT_EQ(q.host_ops[0].first, p.host_ops[0].first);
  EXPECT_EQ(q.host_ops[0].second.p99_ns, p.host_ops[0].second.p99_ns);
  ASSERT_EQ(q.measurements.size(), p.measurements.size());
  for (size_t i = 0; i < p.measurements.size(); ++i) {
    EXPECT_EQ(q.measurements[i], p.measurements[i]);
  }
}

const char* kGoodProfile = R"(format: 1
name: h200-test
base: h200
header:
  command: twinstep calibrate
  commit: abc
  gpu: NVIDIA H200
  driver: "570"
  date: 2026-11-29
figures:
  graph_node_gap_ns: 640
kernels:
  gemm: {base_ns: 2000, ns_per_byte: 0.00025, ns_per_flop: 0, r2: 0.99, max_rel_err: 0.1, samples: 9}
)";

std::string error_of(const std::string& text) { return test::profile_error_of(text); }
std::string replace(const std::string& s, const std::string& from, const std::string& to) {
  return test::replace_once(s, from, to);
}

TEST(CalibrationProfile, GoodProfileParses) {
  const CalibrationProfile p = parse_calibration_profile(kGoodProfile, "p.yaml");
  EXPECT_EQ(p.hw.graph_node_gap_ns, 640);
  EXPECT_EQ(p.hw.pdl_node_gap_ns, hardware_preset("h200").pdl_node_gap_ns);
  EXPECT_TRUE(p.hw.kernel_fits[size_t(KernelClass::kGemm)].fitted);
  EXPECT_EQ(p.hw.kernel_fits[size_t(KernelClass::kGemm)].base_ns, 2000);
}

TEST(CalibrationProfile, BadProfilesSayWhereAndWhat) {
  EXPECT_EQ(error_of(replace(kGoodProfile, "base: h200", "base: a100")),
            "p.yaml:3:7: unknown base hardware preset 'a100'; known: b200, b300, h100, h20, h200");
  EXPECT_EQ(error_of(replace(kGoodProfile, "  gemm:", "  gemv:")),
            "p.yaml:13:3: unknown field 'gemv' in kernels; known: embedding, norm, gemm, rope, "
            "kv_append, attention, linear_attention, activation, moe_router, moe_experts, "
            "lm_head, sample");
  EXPECT_EQ(error_of(replace(kGoodProfile, "ns_per_byte: 0.00025", "ns_per_byte: -1")),
            "p.yaml:13:38: kernels.gemm.ns_per_byte = -1 is out of range [0, 1e+06]");
  EXPECT_EQ(error_of(replace(kGoodProfile, "ns_per_flop: 0,", "ns_per_flop: fast,")),
            "p.yaml:13:60: kernels.gemm.ns_per_flop must be a finite number, got 'fast'");
  EXPECT_EQ(error_of(replace(kGoodProfile, "  date: 2026-11-29\n", "")),
            "p.yaml:5:3: header is missing required field 'date'");
  EXPECT_EQ(error_of(replace(kGoodProfile, "graph_node_gap_ns", "node_gap_ns")),
            "p.yaml:11:3: unknown field 'node_gap_ns' in figures; known: stream_read_tbps, "
            "kernel_floor_ns, eager_launch_ns, graph_launch_ns, graph_node_gap_ns, "
            "pdl_node_gap_ns, eager_node_gap_ns, d2h_latency_ns, d2h_gbps, host_wake_ns, "
            "interconnect_gbps, allreduce_alpha_ns, alltoall_alpha_ns, p2p_alpha_ns, "
            "kernel_fit_max_rows, prefill_gemm_tflops, prefill_moe_tflops, "
            "prefill_attention_tbps");
  EXPECT_EQ(error_of(replace(kGoodProfile, "format: 1", "format: 2")),
            "p.yaml:1:9: format 2 is not supported (this twinstep reads 1)");
  EXPECT_EQ(error_of("format: 1\nname: [x\n"), error_of("format: 1\nname: [x\n"));
  EXPECT_EQ(error_of("format: 1\nname: [x\n").rfind("p.yaml:", 0), 0u);
  EXPECT_NE(error_of("format: 1\nname: [x\n").find("malformed YAML"), std::string::npos);
  EXPECT_EQ(error_of(replace(kGoodProfile, "samples: 9}", "samples: 9, wide_base_ns: 1}")),
            "p.yaml:13:117: kernels.gemm.wide_base_ns needs kernels.gemm.split_intensity or "
            "kernels.gemm.split_bytes");
  EXPECT_EQ(error_of(""), "p.yaml:1:1: empty profile");
  EXPECT_EQ(error_of("- 1\n"), "p.yaml:1:1: the profile must be a mapping");
}

TEST(CalibrationProfile, MissingFileSaysSo) {
  EXPECT_THROW(
      {
        try {
          load_calibration_profile("/nonexistent/dir/p.yaml");
        } catch (const ConfigError& e) {
          EXPECT_STREQ(e.what(), "/nonexistent/dir/p.yaml: cannot read the calibration profile");
          throw;
        }
      },
      ConfigError);
}

// A private profile directory through TWINSTEP_PROFILES, removed with the fixture.
class ProfileDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("twinstep_profiles_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    ::setenv("TWINSTEP_PROFILES", dir_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("TWINSTEP_PROFILES");
    std::filesystem::remove_all(dir_);
  }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / (name + ".yaml")) << text;
  }
  std::string error_of_name(const std::string& name) {
    try {
      hardware_by_name(name);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(no error)";
  }
  std::filesystem::path dir_;
};

TEST_F(ProfileDir, ResolvesPresetsAndProfilesByName) {
  write("h200-test", kGoodProfile);
  EXPECT_EQ(calibration_profile_names(), std::vector<std::string>{"h200-test"});
  EXPECT_EQ(hardware_by_name("h200").name, "h200");
  const HardwareSpec hw = hardware_by_name("h200-test");
  EXPECT_EQ(hw.name, "h200-test");
  EXPECT_EQ(hw.graph_node_gap_ns, 640);
  EXPECT_EQ(hardware_names().back(), "h200-test");
}

TEST_F(ProfileDir, UnknownNameListsPresetsAndProfiles) {
  write("h200-test", kGoodProfile);
  EXPECT_EQ(error_of_name("h300"),
            "unknown hardware 'h300'; presets: b200, b300, h100, h20, h200; "
            "calibrated profiles in " +
                dir_.string() + ": h200-test");
}

TEST_F(ProfileDir, BrokenProfileGivesItsPositionAndTheAvailableProfiles) {
  write("h200-test", kGoodProfile);
  write("broken", replace(kGoodProfile, "name: h200-test", "name: broken\nextra: 1"));
  const std::string path = (dir_ / "broken.yaml").string();
  EXPECT_EQ(
      error_of_name("broken"),
      path +
          ":3:1: unknown field 'extra' in the profile; known: format, name, base, "
          "header, figures, kernels, kernel_names, kernel_model_fits, pdl_node_gap_by_rows, "
          "graph_node_gap_by_rows, eager_node_gap_by_rows, pdl_break_gap_by_rows, "
          "graph_break_gap_by_rows, "
          "host_ops, measurements, collective_skew, spec_graph_residuals (presets: b200, b300, "
          "h100, h20, h200; calibrated profiles in " +
          dir_.string() + ": broken, h200-test)");
  write("renamed", kGoodProfile);
  EXPECT_NE(error_of_name("renamed").find("profile name 'h200-test' does not match its file name "
                                          "'renamed.yaml'"),
            std::string::npos);
}

TEST_F(ProfileDir, ExperimentsNameProfilesLikePresets) {
  write("h200-test", kGoodProfile);
  const std::string yaml =
      "name: x\nmodel: llama-3-8b\nhardware: h200-test\n"
      "workload: {input_len: 128, output_len: 16, requests: 1}\n";
  const Experiment e = load_experiment_text(yaml, "exp.yaml");
  ASSERT_EQ(e.variants.size(), 1u);
  EXPECT_EQ(e.variants[0].hardware.name, "h200-test");
  EXPECT_EQ(e.variants[0].hardware.graph_node_gap_ns, 640);
  EXPECT_TRUE(e.variants[0].hardware.kernel_fits[size_t(KernelClass::kGemm)].fitted);
  // Overrides over a profile, as over a preset.
  const Experiment o = load_experiment_text(
      replace(yaml, "hardware: h200-test", "hardware: {preset: h200-test, host_wake_ns: 7}"),
      "exp.yaml");
  EXPECT_EQ(o.variants[0].hardware.host_wake_ns, 7);
  EXPECT_EQ(o.variants[0].hardware.graph_node_gap_ns, 640);

  write("broken", replace(kGoodProfile, "name: h200-test", "name: broken\nextra: 1"));
  try {
    load_experiment_text(replace(yaml, "hardware: h200-test", "hardware: broken"), "exp.yaml");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& err) {
    const std::string want =
        "exp.yaml:3:11: hardware 'broken': " + (dir_ / "broken.yaml").string() +
        ":3:1: unknown field 'extra' in the profile";
    EXPECT_EQ(std::string(err.what()).substr(0, want.size()), want);
  }
  try {
    load_experiment_text(replace(yaml, "hardware: h200-test", "hardware: h900"), "exp.yaml");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& err) {
    EXPECT_EQ(std::string(err.what()),
              "exp.yaml:3:11: unknown hardware preset 'h900'; known: b200, b300, h100, h20, "
              "h200, broken, h200-test (calibrated profiles are read from " +
                  dir_.string() + "); did you mean 'h100'?");
  }
}

// ---- the cost model with fits -----------------------------------------------------------------

KernelFit linear_fit(double base_ns, double ns_per_byte, double ns_per_flop) {
  KernelFit f;
  f.fitted = true;
  f.base_ns = base_ns;
  f.ns_per_byte = ns_per_byte;
  f.ns_per_flop = ns_per_flop;
  f.r2 = 1;
  f.samples = 3;
  return f;
}

RunRecord simulate(const HardwareSpec& hw, int32_t concurrency) {
  PolicySpec policy;
  policy.host_schedule = HostSchedule::kRunahead;
  WorkloadSpec w;
  w.input_len = {1000, 1000};
  w.output_len = {40, 40};
  w.num_requests = concurrency;
  w.max_concurrency = concurrency;
  const std::vector<RequestSpec> requests = generate_requests(w);
  RunRecord record;
  DecodeLoop loop(policy, w, requests, &record);
  HostCostModel host(HostCostSpec{}, 1);
  SimBackend backend(model_preset("llama-3-8b"), hw, host, requests);
  HostProgram* ranks[] = {&loop};
  backend.run(ranks, record);
  return record;
}

TEST(CostModelFits, FitsEqualToTheRooflineReproduceItExactly) {
  // Fitted classes are not floored (base_ns is their floor): compare without the floor.
  HardwareSpec roof = hardware_preset("h200");
  roof.kernel_floor_ns = 0;
  HardwareSpec fitted = roof;
  const double ns_per_byte = 1e9 / (roof.stream_read_tbps * 1e12 * roof.mem_efficiency);
  for (int c = 0; c < int(KernelClass::kCount); ++c) {
    fitted.kernel_fits[size_t(c)] = linear_fit(0, ns_per_byte, 0);
  }
  // The equivalence holds where every kernel is memory-bound: check that for the shapes run.
  const double ns_per_flop = 1e9 / (roof.bf16_tflops * 1e12 * roof.flop_efficiency);
  for (int32_t batch : {1, 8}) {
    StepKernels k;
    step_kernels(model_preset("llama-3-8b"), decode_shape(batch, 1, batch * 1040), k);
    for (const KernelDesc& d : k.kernels) {
      ASSERT_GE(double(d.bytes_read + d.bytes_written) * ns_per_byte, double(d.flops) * ns_per_flop)
          << d.name;
    }
  }
  // And the fits are used: a fit twice as slow is not the roofline.
  HardwareSpec slower = fitted;
  for (KernelFit& f : slower.kernel_fits) f.ns_per_byte *= 2;
  for (int32_t concurrency : {1, 8}) {
    // Prefill is compute-bound (the roofline's max picks FLOPs, the memory-only fit does not):
    // compare the decode steps, whose durations make TPOT.
    const RunRecord a = simulate(roof, concurrency);
    const RunRecord b = simulate(fitted, concurrency);
    ASSERT_EQ(a.steps.size(), b.steps.size());
    int64_t decode_steps = 0;
    for (size_t i = 0; i < a.steps.size(); ++i) {
      if (a.steps[i].prefills > 0 || a.steps[i].batch == 0) continue;
      ++decode_steps;
      EXPECT_EQ(a.steps[i].dur_ns, b.steps[i].dur_ns) << i;
      EXPECT_EQ(a.steps[i].gpu_busy_ns, b.steps[i].gpu_busy_ns) << i;
    }
    EXPECT_GE(decode_steps, 39);  // 40 output tokens: the prefill's, then >= 39 decode steps
    const RunRecord c = simulate(slower, concurrency);
    ASSERT_EQ(c.steps[10].batch, concurrency);
    EXPECT_GT(c.steps[10].dur_ns, a.steps[10].dur_ns);
  }
}

TEST(CostModelFits, FittedClassUsesTheLinearModelNotTheFloor) {
  HardwareSpec hw = hardware_preset("h200");
  hw.kernel_floor_ns = 1500;
  hw.kernel_fits[size_t(KernelClass::kNorm)] = linear_fit(1000, 0.5, 0.25);
  const CostModel cost(hw);
  // 1000 + 0.5·(600 + 400) + 0.25·2000 = 2000 ns.
  EXPECT_EQ(cost.kernel_ns({"n", KernelClass::kNorm, 600, 400, 2000}), 2000);
  // 1000 + 0.5·10 = 1005, below the floor, which prices only unfitted classes.
  EXPECT_EQ(cost.kernel_ns({"n", KernelClass::kNorm, 10, 0, 0}), 1005);
  EXPECT_EQ(cost.kernel_ns({"r", KernelClass::kRope, 10, 0, 0}), 1500);
}

TEST(CostModelFits, TwoRegimeFitPicksTheRegimeByIntensity) {
  HardwareSpec hw = hardware_preset("h200");
  hw.kernel_floor_ns = 0;
  KernelFit f = linear_fit(1000, 0.5, 0);
  f.split_intensity = 16.5;
  f.wide_base_ns = 2000;
  f.wide_ns_per_byte = 1;
  f.wide_ns_per_flop = 0.125;
  hw.kernel_fits[size_t(KernelClass::kGemm)] = f;
  const CostModel cost(hw);
  // 1600 flops over 100 bytes: 16 per byte, narrow: 1000 + 0.5·100 = 1050.
  EXPECT_EQ(cost.kernel_ns({"g", KernelClass::kGemm, 80, 20, 1600}), 1050);
  // 1700 over 100: wide: 2000 + 100 + 0.125·1700 = 2312.5 → 2313 (half up).
  EXPECT_EQ(cost.kernel_ns({"g", KernelClass::kGemm, 80, 20, 1700}), 2313);
}

// ---- per-name fits, residual kernels, PDL gaps by rows (docs/calibration.md) -------------------

TEST(KernelFit, HeldBaseRecoversTheByteAndFlopTerms) {
  // t = 3000 + 0.00025·bytes + 1.5e-6·flops; with the base held at 3000 the other two are exact.
  std::vector<KernelSample> s;
  for (int i = 1; i <= 8; ++i) {
    const double bytes = 1e8 + 1e6 * i, flops = 2e8 * i;
    s.push_back({KernelClass::kGemm, bytes, flops, 3000 + 0.00025 * bytes + 1.5e-6 * flops});
  }
  const KernelFit f = fit_kernel_class_with_base(s, KernelClass::kGemm, 0, 3000, 3000);
  ASSERT_TRUE(f.fitted);
  EXPECT_EQ(f.base_ns, 3000);
  EXPECT_NEAR(f.ns_per_byte, 0.00025, 1e-10);
  EXPECT_NEAR(f.ns_per_flop, 1.5e-6, 1e-12);
  EXPECT_NEAR(f.max_rel_err, 0, 1e-9);
  // A negative base means "fit it": the same as fit_kernel_class.
  const KernelFit g = fit_kernel_class_with_base(s, KernelClass::kGemm, 0, -1, -1);
  const KernelFit h = fit_kernel_class(s, KernelClass::kGemm);
  EXPECT_EQ(g.base_ns, h.base_ns);
  EXPECT_EQ(g.ns_per_byte, h.ns_per_byte);
}

TEST(FitCalibration, AWideRegimeOfOneWeightSizeKeepsTheClassWideBase) {
  // Narrow (<= 16 rows): t = 3000 + 2.5e-4·bytes + 1e-6·flops; wide: t = 4000 + 2.4e-4·bytes.
  // o_proj is measured wide at three weight sizes, gate_up_proj at one (40 MB: a single model's
  // projection above 16 rows), narrow at two sizes 4x apart. Its wide base cannot be told from its
  // byte term, so it is held at the class's wide base (4000, recovered from o_proj's sizes and
  // gate_up_proj's) and its byte term comes out exact: a 20 MB projection costs
  // 4000 + 2.4e-4 · 20e6 = 8800 ns, where a base fitted to 40 MB alone would price it like 40 MB.
  std::vector<CalibrationSample> v;
  auto add = [&](const char* name, double bytes, double rows) {
    const double flops = rows * bytes;
    const double ns = rows > 16 ? 4000 + 2.4e-4 * bytes : 3000 + 2.5e-4 * bytes + 1e-6 * flops;
    CalibrationSample s = sample("kernel", ns);
    s.name = name;
    s.cls = kernel_class_name(KernelClass::kGemm);
    s.model = "llama-3-8b";
    s.bytes = int64_t(bytes);
    s.flops = int64_t(flops);
    v.push_back(s);
  };
  for (const double bytes : {1e6, 2e6, 4e6}) {
    for (const double rows : {1.0, 4.0, 32.0, 64.0}) add("o_proj", bytes, rows);
  }
  for (const double bytes : {10e6, 40e6}) {
    for (const double rows : {1.0, 2.0, 4.0}) add("gate_up_proj", bytes, rows);
  }
  for (const double rows : {32.0, 48.0, 64.0}) add("gate_up_proj", 40e6, rows);
  const CalibrationProfile p = fit_calibration(v, "t", "h200", kHeader);
  const KernelFit& cls = p.hw.kernel_fits[size_t(KernelClass::kGemm)];
  ASSERT_GT(cls.split_intensity, 0);
  EXPECT_NEAR(cls.wide_base_ns, 4000, 1e-6);
  const KernelFit* gate_up = nullptr;
  for (const auto& [name, f] : p.hw.kernel_name_fits) {
    if (name == "gate_up_proj") gate_up = &f;
  }
  ASSERT_NE(gate_up, nullptr);
  EXPECT_EQ(gate_up->wide_base_ns, cls.wide_base_ns);
  EXPECT_NEAR(gate_up->wide_ns_per_byte, 2.4e-4, 1e-12);
  EXPECT_NEAR(gate_up->base_ns, 3000, 1e-6);  // narrow: two sizes 4x apart, all three fitted
  const CostModel cost(p.hw);
  EXPECT_NEAR(double(cost.kernel_ns(
                  {"gate_up_proj", KernelClass::kGemm, 20'000'000, 0, int64_t(32 * 20e6)})),
              8800, 1);
}

TEST(KernelFit, TwoLinesSplitByBytesRecoveredWithTheSplitBetweenThem) {
  // Below 1e7 bytes: 9000 + 3e-4·bytes; above: 15000 + 2.4e-4·bytes (eight shapes each side).
  std::vector<KernelSample> s;
  for (int i = 0; i < 8; ++i) {
    const double small = 1e5 * std::pow(1.8, i), large = 2e7 * std::pow(1.8, i);
    s.push_back({KernelClass::kAttention, small, small, 9000 + 3e-4 * small});
    s.push_back({KernelClass::kAttention, large, large, 15000 + 2.4e-4 * large});
  }
  const KernelFit f = fit_kernel_class_split_bytes(s, KernelClass::kAttention, 4);
  ASSERT_TRUE(f.fitted);
  EXPECT_GT(f.split_bytes, 1e5 * std::pow(1.8, 7));
  EXPECT_LT(f.split_bytes, 2e7);
  EXPECT_EQ(f.split_intensity, 0);
  EXPECT_NEAR(f.base_ns, 9000, 1e-3);
  EXPECT_NEAR(f.ns_per_byte, 3e-4, 1e-12);
  EXPECT_NEAR(f.wide_base_ns, 15000, 1e-2);
  EXPECT_NEAR(f.wide_ns_per_byte, 2.4e-4, 1e-12);
  EXPECT_NEAR(f.max_rel_err, 0, 1e-9);
  // The cost model picks the line by bytes.
  HardwareSpec hw = hardware_preset("h200");
  hw.kernel_fits[size_t(KernelClass::kAttention)] = f;
  const CostModel m(hw);
  EXPECT_EQ(m.kernel_ns({"attention", KernelClass::kAttention, 1000000, 0, 0}), 9300);
  EXPECT_EQ(m.kernel_ns({"attention", KernelClass::kAttention, 100000000, 0, 0}), 39000);
  // One line fits better than any split: no split.
  std::vector<KernelSample> one;
  for (int i = 0; i < 16; ++i) {
    const double b = 1e5 * std::pow(1.8, i);
    one.push_back({KernelClass::kAttention, b, b, 9000 + 3e-4 * b});
  }
  EXPECT_EQ(fit_kernel_class_split_bytes(one, KernelClass::kAttention, 4).split_bytes, 0);
}

// An in-situ kernel sample of step kernel `k` of `label` at a grid point, ns long.
CalibrationSample kernel_sample(const KernelDesc& k, const std::string& label, int32_t batch,
                                int64_t ctx, double ns) {
  CalibrationSample x;
  x.kind = "kernel";
  x.name = k.name;
  x.cls = kernel_class_name(k.cls);
  x.model = label;
  x.mode = "graph";
  x.batch = batch;
  x.ctx_tokens = ctx;
  x.bytes = k.bytes_read + k.bytes_written;
  x.flops = k.flops;
  x.value_ns = ns;
  return x;
}

// In-situ samples of one model at one grid point: every step kernel but `lost` with a known
// time, and the graph step that Σ kernels + nodes · gap gives with `lost` costing lost_ns.
std::vector<CalibrationSample> grid_point(const std::string& lost, double lost_ns, double gap,
                                          int32_t batch, int64_t ctx) {
  StepKernels sk;
  step_kernels(model_preset("llama-3-8b"), decode_shape(batch, 1, ctx * batch), sk);
  std::vector<CalibrationSample> out;
  double sum = 0;
  for (const LayerRun& run : sk.runs) {
    for (int32_t r = 0; r < run.repeat; ++r) {
      for (int32_t i = run.first; i < run.first + run.count; ++i) {
        const KernelDesc& k = sk.kernels[size_t(i)];
        const double ns = 1000 + double(k.bytes_read + k.bytes_written) * 2.5e-4;
        if (k.name == lost) {
          sum += lost_ns;
          continue;
        }
        sum += ns;
        out.push_back(kernel_sample(k, "llama-3-8b", batch, ctx, ns));
      }
    }
  }
  CalibrationSample step;
  step.kind = "step";
  step.model = "llama-3-8b";
  step.mode = "graph";
  step.batch = batch;
  step.ctx_tokens = ctx;
  step.value_ns = sum + double(sk.node_count()) * gap;
  out.push_back(step);
  return out;
}

TEST(ResidualKernels, TheOneLostEpilogueKernelIsTheStepLessTheRest) {
  const std::vector<CalibrationSample> s = grid_point("lm_head", 290000, 500, 4, 1000);
  const std::vector<ResidualSample> r = residual_kernel_samples(s, 500);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].name, "lm_head");
  EXPECT_EQ(r[0].model, "llama-3-8b");
  EXPECT_EQ(r[0].sample.cls, KernelClass::kLmHead);
  EXPECT_NEAR(r[0].sample.ns, 290000, 1e-3);
  EXPECT_GT(r[0].sample.bytes, 1e9);  // the vocabulary projection's weights
  // Nothing lost: no residual. A per-layer kernel lost: none either (no single instance).
  EXPECT_TRUE(residual_kernel_samples(grid_point("none", 0, 500, 4, 1000), 500).empty());
  EXPECT_TRUE(residual_kernel_samples(grid_point("o_proj", 9000, 500, 4, 1000), 500).empty());
}

// An MoE grid point as calibrate stores it with the routing recorded: one sample per MoE kernel,
// layer and profiled launch (nodes = 4 launches), their times spread around the layer's mean,
// every other kernel one sample (nodes 0). The residual of the lost lm_head counts each
// per-launch sample 1/4: the same as one sample at their mean.
TEST(ResidualKernels, PerLaunchMoeSamplesCountAsTheirMean) {
  const std::string label = "qwen3-30b-a3b@tp2";
  const int32_t batch = 2;
  const int64_t ctx = 500;
  const double gap = 400, lost_ns = 150000;
  StepKernels sk;
  calibration_step_kernels(label, decode_shape(batch, 1, ctx * batch), sk);
  std::vector<CalibrationSample> per_launch, medians;
  double sum = 0;
  const double spread[] = {0.8, 1.3, 0.9, 1.0};  // mean 1
  for (const LayerRun& run : sk.runs) {
    for (int32_t r = 0; r < run.repeat; ++r) {
      for (int32_t i = run.first; i < run.first + run.count; ++i) {
        const KernelDesc& k = sk.kernels[size_t(i)];
        const double ns = 1000 + double(k.bytes_read + k.bytes_written) * 2.5e-4;
        if (std::string(k.name) == "lm_head") {
          sum += lost_ns;
          continue;
        }
        sum += ns;
        CalibrationSample x = kernel_sample(k, label, batch, ctx, ns);
        medians.push_back(x);
        if (k.cls != KernelClass::kMoeExperts && k.cls != KernelClass::kMoeRouter &&
            std::string(k.name) != "moe_combine") {
          per_launch.push_back(x);
          continue;
        }
        for (const double f : spread) {
          x.value_ns = ns * f;
          x.nodes = 4;
          per_launch.push_back(x);
        }
      }
    }
  }
  CalibrationSample step;
  step.kind = "step";
  step.model = label;
  step.mode = "graph";
  step.batch = batch;
  step.ctx_tokens = ctx;
  step.value_ns = sum + double(sk.node_count()) * gap;
  per_launch.push_back(step);
  medians.push_back(step);
  for (const auto* samples : {&per_launch, &medians}) {
    SCOPED_TRACE(samples == &medians ? "medians" : "per launch");
    const std::vector<ResidualSample> r = residual_kernel_samples(*samples, gap);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].name, "lm_head");
    EXPECT_NEAR(r[0].sample.ns, lost_ns, 0.01);
  }
  // Router, gate/up, down and combine: 4 samples for 1 in each of the 48 layers.
  EXPECT_EQ(per_launch.size(), medians.size() + 48 * 4 * 3);
}

TEST(ResidualKernels, FitCalibrationFitsTheLostClassFromThem) {
  std::vector<CalibrationSample> s;
  for (const int32_t b : {1, 2, 4, 8}) {
    for (const CalibrationSample& x : grid_point("lm_head", 280000 + 1000 * b, 500, b, 1000)) {
      s.push_back(x);
    }
  }
  const CalibrationProfile p = fit_calibration(s, "t", "h200", ProfileHeader{});
  const KernelFit& lm = p.hw.kernel_fits[size_t(KernelClass::kLmHead)];
  ASSERT_TRUE(lm.fitted);
  EXPECT_EQ(lm.samples, 4);
  EXPECT_LT(lm.max_rel_err, 0.01);
  // Its weights' bytes barely vary: the base is the gemm fit's, the byte term carries the rest.
  EXPECT_EQ(lm.base_ns, p.hw.kernel_fits[size_t(KernelClass::kGemm)].base_ns);
  EXPECT_GT(lm.ns_per_byte, 0);
  // Per-name fits exist for every name measured, lm_head included.
  bool has_lm = false, has_qkv = false;
  for (const auto& [name, f] : p.hw.kernel_name_fits) {
    has_lm |= name == "lm_head" && f.fitted;
    has_qkv |= name == "qkv_proj" && f.fitted;
  }
  EXPECT_TRUE(has_lm);
  EXPECT_TRUE(has_qkv);
}

// A residual below the time its bytes take at the streaming-read rate (Llama-3-8B's LM head,
// 1.05 GB, in 100 us: 10 TB/s) is not the kernel's alone: it stays in its model's own fit and
// out of the pooled class and name fits. Four grid points at 1000 tokens give plausible LM-head
// residuals (280 us), four at 2000 sub-floor ones.
TEST(ResidualKernels, BelowTheStreamingFloorTheyPriceOnlyTheirModel) {
  std::vector<CalibrationSample> s;
  for (const int32_t b : {1, 2, 4, 8}) {
    for (const auto& [ctx, lm_ns] : {std::pair{1000, 280000.0}, std::pair{2000, 100000.0}}) {
      for (const CalibrationSample& x : grid_point("lm_head", lm_ns + 1000 * b, 500, b, ctx)) {
        s.push_back(x);
      }
    }
  }
  const CalibrationProfile p = fit_calibration(s, "t", "h200", ProfileHeader{});
  const KernelFit& lm = p.hw.kernel_fits[size_t(KernelClass::kLmHead)];
  ASSERT_TRUE(lm.fitted);
  EXPECT_EQ(lm.samples, 4);
  EXPECT_LT(lm.max_rel_err, 0.01);  // the plausible four alone
  for (const auto& [name, f] : p.hw.kernel_name_fits) {
    if (name == "lm_head") {
      EXPECT_EQ(f.samples, 4);
    }
  }
  const HardwareSpec::ModelKernelFits* own = kernel_model_fits_for(p.hw, "llama-3-8b");
  ASSERT_NE(own, nullptr);
  int64_t own_samples = 0;
  for (const auto& [name, f] : own->names) {
    if (name == "lm_head") own_samples = f.samples;
  }
  EXPECT_EQ(own_samples, 8);
}

TEST(NodeGap, ByRowsReproducesTheMeasuredPdlSteps) {
  // Against the preset's own prices (no kernel fits): a PDL step measured at the priced busy time
  // plus a known gap per node gives that gap back; the median over contexts takes the middle one.
  const HardwareSpec preset = hardware_preset("h200");
  const CostModel cost(preset);
  std::vector<CalibrationSample> s;
  auto step = [&](const char* mode, int64_t batch, int64_t ctx, double gap_ns) {
    StepKernels sk;
    step_kernels(model_preset("llama-3-8b"), decode_shape(int32_t(batch), 1, ctx * batch), sk);
    const GraphCost c = cost.graph_cost(sk);
    CalibrationSample x;
    x.kind = "step";
    x.model = "llama-3-8b";
    x.mode = mode;
    x.batch = batch;
    x.ctx_tokens = ctx;
    x.value_ns = double(c.busy_ns) + gap_ns * double(c.nodes);
    s.push_back(x);
  };
  step("pdl", 1, 146, -100);  // an overlap: the prologue under the predecessor's tail
  step("pdl", 1, 2066, -140);
  step("pdl", 1, 8210, -90);
  step("graph", 1, 146, 5000);  // graph steps play no part
  step("pdl", 32, 146, 200);
  step("pdl", 32, 2066, 200);
  step("eager", 1, 146, 1500);  // eager steps by their own table
  step("eager", 1, 2066, 1700);
  step("eager", 32, 146, 1800);  // host-bound at one of its two contexts: no entry
  step("eager", 32, 2066, 1900);
  auto not_host_bound = [&](int64_t batch, int64_t grid_ctx) {  // calibrate's marker
    CalibrationSample x;
    x.kind = "node_gap";
    x.model = "llama-3-8b";
    x.mode = "eager";
    x.batch = batch;
    x.ctx_tokens = grid_ctx;
    s.push_back(x);
  };
  not_host_bound(1, 128);
  not_host_bound(1, 2048);
  not_host_bound(32, 128);
  const std::vector<HardwareSpec::NodeGap> g = node_gap_by_rows(s, preset, "pdl");
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].model, "llama-3-8b");
  EXPECT_EQ(g[0].rows, 1);
  EXPECT_EQ(g[0].gap_ns, -100);  // median of -140, -100, -90
  EXPECT_EQ(g[1].rows, 32);
  EXPECT_EQ(g[1].gap_ns, 200);
  const std::vector<HardwareSpec::NodeGap> graph = node_gap_by_rows(s, preset, "graph");
  ASSERT_EQ(graph.size(), 1u);  // the one graph step
  EXPECT_EQ(graph[0].rows, 1);
  EXPECT_EQ(graph[0].gap_ns, 5000);
  const std::vector<HardwareSpec::NodeGap> eager = node_gap_by_rows(s, preset, "eager");
  ASSERT_EQ(eager.size(), 1u);
  EXPECT_EQ(eager[0].rows, 1);
  EXPECT_EQ(eager[0].gap_ns, 1600);  // the median of two contexts: their mean

  HardwareSpec hw = hardware_preset("h200");
  hw.pdl_node_gap_ns = 50;
  hw.pdl_node_gap_by_rows = g;
  EXPECT_EQ(pdl_node_gap_for(hw, "llama-3-8b", 1), -100);
  EXPECT_EQ(pdl_node_gap_for(hw, "llama-3-8b", 3), 200);    // the next measured bucket
  EXPECT_EQ(pdl_node_gap_for(hw, "llama-3-8b", 100), 200);  // above the last: the last
  // A model never measured: the median of the measured models' entries (here one model).
  EXPECT_EQ(pdl_node_gap_for(hw, "llama-3.2-3b", 1), -100);
  EXPECT_EQ(pdl_node_gap_for(hw, "llama-3.2-3b", 3), 200);
  hw.pdl_node_gap_by_rows.clear();
  EXPECT_EQ(pdl_node_gap_for(hw, "llama-3.2-3b", 1), 50);  // no table: the scalar
  hw.eager_node_gap_ns = 1234;
  hw.eager_node_gap_by_rows = eager;
  EXPECT_EQ(eager_node_gap_for(hw, "llama-3-8b", 16), 1600);
  EXPECT_EQ(eager_node_gap_for(hw, "llama-3.2-3b", 1), 1234);
}

TEST(NodeGap, AModelNeverMeasuredTakesTheMedianOfTheMeasuredModels) {
  // Three models, hand-picked entries (rows ascending within a model): at 1 row -800, -500,
  // -600 -> median -600; at 8 rows only a and b measured 8 or more: -700, -400 -> the lower
  // middle, -700; at 2 rows (each model's first entry with rows >= 2: -700 at 8, -500 at 2,
  // -300 at 4) -> -500; at 16 rows none measured so many: every model's last, -700, -400, -300
  // -> -400. A model with an entry keeps its own.
  HardwareSpec hw = hardware_preset("h200");
  hw.pdl_node_gap_ns = 0;
  hw.pdl_node_gap_by_rows = {{"a", 1, -800}, {"a", 8, -700}, {"b", 1, -500}, {"b", 2, -500},
                             {"b", 8, -400}, {"c", 1, -600}, {"c", 4, -300}};
  EXPECT_EQ(pdl_node_gap_for(hw, "unseen", 1), -600);
  EXPECT_EQ(pdl_node_gap_for(hw, "unseen", 8), -700);
  EXPECT_EQ(pdl_node_gap_for(hw, "unseen", 2), -500);
  EXPECT_EQ(pdl_node_gap_for(hw, "unseen", 16), -400);
  EXPECT_EQ(pdl_node_gap_for(hw, "c", 8), -300);
  hw.pdl_node_gap_by_rows.resize(5);  // a and b only: {-800, -500} -> -800
  EXPECT_EQ(pdl_node_gap_for(hw, "unseen", 1), -800);
  // The graph and eager gaps keep their scalars for a model never measured.
  hw.graph_node_gap_ns = 600;
  hw.graph_node_gap_by_rows = {{"a", 1, 300}};
  EXPECT_EQ(graph_node_gap_for(hw, "unseen", 1), 600);
}

TEST(NodeGap, InSituBreakGapIsTheStepDifferenceLessTheCollectivesPrices) {
  // Llama-3-8B at TP2, batch 1: 64 all-reduces per decode step (2 per layer, 32 layers; the
  // embedding and LM head whole on the rank), each of 1 x 4096 bf16 = 8192 bytes, priced here
  // without measured tables by alpha + bus bytes / link: 6000 ns + 8192 B / 8.192 B/ns = 7000 ns.
  HardwareSpec hw = hardware_preset("h200");
  hw.collective_tables.clear();
  hw.allreduce_alpha_ns = 6000;
  hw.interconnect_gbps = 8.192;
  hw.pdl_break_gap_by_rows = {{"qwen3-30b-a3b@tp2", 1, 2000}, {"llama-3-8b@tp2", 1, -1200}};
  const HardwareSpec::NodeGap qwen = hw.pdl_break_gap_by_rows[0];
  std::vector<CalibrationSample> s;
  auto add = [&](const char* name, int64_t batch, int64_t ctx, double ns, int64_t nodes) {
    CalibrationSample x;
    x.kind = "collective_break";
    x.name = name;
    x.model = "llama-3-8b@tp2";
    x.mode = "pdl";
    x.batch = batch;
    x.ctx_tokens = ctx;
    x.nodes = nodes;
    x.value_ns = ns;
    s.push_back(x);
  };
  add("plain", 1, 1000, 3.0e6, 0);
  add("in_situ", 1, 1000, 3.0e6 + 64 * (7000 + 1500), 64);
  add("plain", 1, 2000, 3.1e6, 0);
  add("in_situ", 1, 2000, 3.1e6 + 64 * (7000 + 1700), 64);
  add("in_situ", 1, 4000, 9.9e6, 64);  // no plain step at this context: skipped
  add("plain", 2, 1000, 3.2e6, 0);     // a count the step does not have: no entry
  add("in_situ", 2, 1000, 3.9e6, 10);
  EXPECT_EQ(fit_in_situ_break_gaps(hw, s), 1);
  ASSERT_EQ(hw.pdl_break_gap_by_rows.size(), 2u);
  EXPECT_EQ(hw.pdl_break_gap_by_rows[0].model, qwen.model);  // untouched, first as before
  EXPECT_EQ(hw.pdl_break_gap_by_rows[0].gap_ns, qwen.gap_ns);
  EXPECT_EQ(break_gap_for(hw, true, "llama-3-8b@tp2", 1), 1600);           // over the stubs' -1200
  EXPECT_EQ(break_gap_for(hw, false, "llama-3-8b@tp2", 1), std::nullopt);  // no graph samples
}

TEST(NodeGap, BreakGapFromTheStubbedStepsAgainstThePlainOnes) {
  // A shard's PDL steps, plain and with an empty non-PDL kernel at each of its 10 collective
  // positions. Per context: (stubbed − plain) / 10 − 500 (one empty node in a graph): at ctx 100
  // (1020000 − 1000000) / 10 − 500 = 1500; at ctx 1000 (1122000 − 1100000) / 10 − 500 = 1700;
  // the entry is their median, 1600. Contexts measured one way only (plain 5000, stubbed 1002)
  // pair with nothing.
  std::vector<CalibrationSample> s;
  auto add = [&](const char* name, const char* mode, int64_t batch, int64_t ctx, double ns) {
    CalibrationSample x = sample("collective_break", ns);
    x.name = name;
    x.model = "qwen3-30b-a3b@tp2";
    x.mode = mode;
    x.batch = batch;
    x.ctx_tokens = ctx;
    x.nodes = std::string(name) == "stubbed" ? 10 : 0;
    s.push_back(x);
  };
  for (const double ns : {999900.0, 1000000.0, 1000100.0}) add("plain", "pdl", 1, 100, ns);
  add("plain", "pdl", 1, 1000, 1100000);
  add("plain", "pdl", 1, 5000, 900000);  // no stubbed step at 5000: unused
  for (int i = 0; i < 3; ++i) add("stubbed", "pdl", 1, 100, 1020000);
  add("stubbed", "pdl", 1, 1000, 1122000);
  add("stubbed", "pdl", 1, 1002, 5000000);            // no plain step at 1002: unused
  add("stubbed", "pdl", 2, 100, 2000000);             // no plain steps at batch 2: no entry
  add("plain", "graph", 1, 100, 990000);              // graph steps pair only with graph breaks
  CalibrationSample decode = sample("step", 500000);  // decode-grid steps play no part
  decode.model = "qwen3-30b-a3b@tp2";
  decode.mode = "pdl";
  decode.batch = 1;
  decode.ctx_tokens = 100;
  s.push_back(decode);
  const std::vector<HardwareSpec::NodeGap> g = break_gap_by_rows(s, "pdl", 500);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].model, "qwen3-30b-a3b@tp2");
  EXPECT_EQ(g[0].rows, 1);
  EXPECT_EQ(g[0].gap_ns, 1600);
  EXPECT_TRUE(break_gap_by_rows(s, "graph", 500).empty());
}

TEST(CalibrationProfile, NameFitsAndNodeGapsRoundTrip) {
  CalibrationProfile p = fit_calibration(synthetic_session(), "h200-test", "h200", kHeader);
  KernelFit f;
  f.fitted = true;
  f.base_ns = 2500.5;
  f.ns_per_byte = 2.5e-4;
  f.ns_per_flop = 1e-6;
  f.r2 = 0.99;
  f.max_rel_err = 0.05;
  f.samples = 12;
  p.hw.kernel_name_fits = {{"qkv_proj", f}, {"lm_head", f}, {"attention", f}};
  p.hw.kernel_name_fits[2].second.split_bytes = 3.5e7;
  p.hw.kernel_name_fits[2].second.wide_ns_per_byte = 2.4e-4;
  p.hw.kernel_name_fits[2].second.ns_per_request = 187.25;  // written only where set
  p.hw.kernel_name_fits[2].second.wide_ns_per_request = 12.5;
  p.hw.kernel_name_fits[1].second.split_intensity = 16.5;
  p.hw.kernel_name_fits[1].second.wide_base_ns = 4000;
  p.hw.pdl_node_gap_by_rows = {{"llama-3-8b", 1, -966}, {"llama-3-8b", 16, 9516}, {"other", 4, 0}};
  p.hw.graph_node_gap_by_rows = {{"llama-3-8b", 1, 781}, {"llama-3-8b", 2, 640}};
  p.hw.eager_node_gap_by_rows = {{"llama-3-8b", 1, 1724}, {"qwen3-30b-a3b", 4, 2298}};
  p.hw.pdl_break_gap_by_rows = {{"qwen3-30b-a3b@tp2", 1, 1650}, {"qwen3-30b-a3b@tp2", 16, -120}};
  p.hw.graph_break_gap_by_rows = {{"qwen3-30b-a3b@tp2", 1, 240}};
  const CalibrationProfile q = parse_calibration_profile(write_calibration_profile(p), "mem");
  // The break gaps: read back, looked up by rows (first entry >= rows, the last above), and
  // absent for a model without entries.
  EXPECT_EQ(break_gap_for(q.hw, true, "qwen3-30b-a3b@tp2", 1), 1650);
  EXPECT_EQ(break_gap_for(q.hw, true, "qwen3-30b-a3b@tp2", 2), -120);
  EXPECT_EQ(break_gap_for(q.hw, true, "qwen3-30b-a3b@tp2", 64), -120);
  EXPECT_EQ(break_gap_for(q.hw, false, "qwen3-30b-a3b@tp2", 8), 240);
  EXPECT_EQ(break_gap_for(q.hw, true, "llama-3-8b@tp2", 1), std::nullopt);
  ASSERT_EQ(q.hw.kernel_name_fits.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(q.hw.kernel_name_fits[i].first, p.hw.kernel_name_fits[i].first);
    expect_same(q.hw.kernel_name_fits[i].second, p.hw.kernel_name_fits[i].second);
  }
  ASSERT_EQ(q.hw.pdl_node_gap_by_rows.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(q.hw.pdl_node_gap_by_rows[i].model, p.hw.pdl_node_gap_by_rows[i].model);
    EXPECT_EQ(q.hw.pdl_node_gap_by_rows[i].rows, p.hw.pdl_node_gap_by_rows[i].rows);
    EXPECT_EQ(q.hw.pdl_node_gap_by_rows[i].gap_ns, p.hw.pdl_node_gap_by_rows[i].gap_ns);
  }
  ASSERT_EQ(q.hw.graph_node_gap_by_rows.size(), 2u);
  EXPECT_EQ(q.hw.graph_node_gap_by_rows[1].rows, 2);
  EXPECT_EQ(q.hw.graph_node_gap_by_rows[1].gap_ns, 640);
  EXPECT_EQ(graph_node_gap_for(q.hw, "llama-3-8b", 1), 781);
  EXPECT_EQ(graph_node_gap_for(q.hw, "llama-3.2-3b", 1), q.hw.graph_node_gap_ns);
  ASSERT_EQ(q.hw.eager_node_gap_by_rows.size(), 2u);
  EXPECT_EQ(q.hw.eager_node_gap_by_rows[1].model, "qwen3-30b-a3b");
  EXPECT_EQ(eager_node_gap_for(q.hw, "llama-3-8b", 1), 1724);
  EXPECT_EQ(eager_node_gap_for(q.hw, "qwen3-30b-a3b", 2), 2298);
  EXPECT_THROW(parse_calibration_profile(
                   "format: 1\nname: x\nbase: h200\nheader: {command: c, commit: c, gpu: g, "
                   "driver: d, date: d}\npdl_node_gap_by_rows: {m: {4: 1, 2: 1}}\n",
                   "mem"),
               ConfigError);  // rows not ascending
}

TEST(AttentionFit, PerRequestTermBelowTheSplitNoFlopTermAndPricedPerRequest) {
  // Llama-3-8B decode attention samples on two lines split by bytes: below 2e7 bytes
  // t = 8000 + 3e-4·bytes + 200·requests, above t = 20000 + 2.2e-4·bytes (no request term: there
  // waves of blocks decide). FLOPs are 4x the bytes with noise the fit must ignore (no FLOP term).
  std::vector<CalibrationSample> v;
  int i = 0;
  for (const int64_t batch : {1, 2, 4, 8, 16, 32, 64}) {
    for (const double bytes : {1e5, 1e6, 4e6, 1.5e7, 5e7, 2e8, 8e8, 3.2e9}) {
      const double ns =
          bytes < 2e7 ? 8000 + 3e-4 * bytes + 200.0 * double(batch) : 20000 + 2.2e-4 * bytes;
      CalibrationSample s = sample("kernel", ns);
      s.name = "attention";
      s.cls = kernel_class_name(KernelClass::kAttention);
      s.model = "llama-3-8b";
      s.batch = batch;
      s.bytes = int64_t(bytes);
      s.flops = int64_t(bytes * (4 + 0.5 * (i++ % 3)));
      v.push_back(s);
    }
  }
  const CalibrationProfile p = fit_calibration(v, "t", "h200", kHeader);
  const KernelFit& f = p.hw.kernel_fits[size_t(KernelClass::kAttention)];
  ASSERT_TRUE(f.fitted);
  EXPECT_GT(f.split_bytes, 1.5e7);
  EXPECT_LT(f.split_bytes, 5e7);
  EXPECT_NEAR(f.base_ns, 8000, 1e-3);
  EXPECT_NEAR(f.ns_per_byte, 3e-4, 1e-12);
  EXPECT_NEAR(f.ns_per_request, 200, 1e-6);
  EXPECT_EQ(f.ns_per_flop, 0);
  EXPECT_NEAR(f.wide_base_ns, 20000, 1e-3);
  EXPECT_NEAR(f.wide_ns_per_byte, 2.2e-4, 1e-12);
  EXPECT_EQ(f.wide_ns_per_request, 0);
  EXPECT_EQ(f.wide_ns_per_flop, 0);
  // The cost model charges the term per KernelDesc::requests, which step_kernels sets from the
  // shape: 8 requests of 100 cached tokens each.
  StepKernels sk;
  step_kernels(model_preset("llama-3-8b"), decode_shape(8, 1, 800), sk);
  const KernelDesc* attention = nullptr;
  for (const KernelDesc& k : sk.kernels) {
    if (std::string(k.name) == "attention") attention = &k;
  }
  ASSERT_NE(attention, nullptr);
  EXPECT_EQ(attention->requests, 8);
  const CostModel cost(p.hw);
  const double bytes = double(attention->bytes_read + attention->bytes_written);
  ASSERT_LT(bytes, f.split_bytes);
  EXPECT_NEAR(double(cost.kernel_ns(*attention)), 8000 + 3e-4 * bytes + 200 * 8, 1.0);
}

TEST(CostModelFits, NameFitWinsOverTheClassFitAndOthersFallBack) {
  HardwareSpec hw = hardware_preset("h200");
  KernelFit cls;
  cls.fitted = true;
  cls.base_ns = 1000;
  hw.kernel_fits[size_t(KernelClass::kGemm)] = cls;
  KernelFit named = cls;
  named.base_ns = 7000;
  hw.kernel_name_fits = {{"o_proj", named}};
  const CostModel m(hw);
  EXPECT_EQ(m.kernel_ns({"o_proj", KernelClass::kGemm, 100, 0, 0}), 7000);
  EXPECT_EQ(m.kernel_ns({"qkv_proj", KernelClass::kGemm, 100, 0, 0}), 1000);
}

}  // namespace
}  // namespace twinstep
