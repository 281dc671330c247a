// runtime/nccl_calibrate.h, CPU half: the alpha-beta fit recovers known alpha and beta from
// synthetic points (exactly without noise, closely with it), and the profile update sets the
// collective figures and the measurements, replacing an earlier calibration's.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "policies/hardware_spec.h"
#include "runtime/json_lite.h"
#include "runtime/nccl_calibrate.h"
#include "simulator/cost_model.h"

namespace twinstep {
namespace {

// Points of time = alpha + bus_bytes / beta for 8 KB .. 256 MB, times (1 + noise · u), u
// uniform in [-1, 1).
std::vector<NcclPoint> synthetic(NcclCollective c, const std::string& mode, int ranks,
                                 double alpha_ns, double beta_gbps, double noise = 0,
                                 uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<NcclPoint> out;
  for (int64_t bytes = 8 << 10; bytes <= (int64_t(256) << 20); bytes *= 2) {
    NcclPoint p;
    p.coll = c;
    p.mode = mode;
    p.ranks = ranks;
    p.bytes = bytes;
    p.ops = 20;
    p.reps = 25;
    const double t = alpha_ns + p.bus_bytes() / beta_gbps;
    p.median_ns = t * (1 + noise * u(rng));
    p.p90_ns = p.median_ns * 1.02;
    p.min_ns = p.median_ns * 0.99;
    out.push_back(p);
  }
  return out;
}

TEST(NcclFit, BusFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(nccl_bus_factor(NcclCollective::kAllReduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(nccl_bus_factor(NcclCollective::kAllReduce, 8), 1.75);
  EXPECT_DOUBLE_EQ(nccl_bus_factor(NcclCollective::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(nccl_bus_factor(NcclCollective::kAllToAll, 2), 0.5);
  EXPECT_DOUBLE_EQ(nccl_bus_factor(NcclCollective::kSendRecv, 2), 1.0);
  EXPECT_DOUBLE_EQ(nccl_bus_factor(NcclCollective::kAllReduce, 1), 0.0);
  NcclPoint p;
  p.coll = NcclCollective::kAllReduce;
  p.ranks = 2;
  p.bytes = 1000;
  p.median_ns = 10;
  EXPECT_DOUBLE_EQ(p.algbw_gbps(), 100);
  EXPECT_DOUBLE_EQ(p.busbw_gbps(), 100);
}

TEST(NcclFit, RecoversAlphaAndBetaExactlyWithoutNoise) {
  for (NcclCollective c : kNcclCollectives) {
    for (int ranks : {2, 8}) {
      const auto pts = synthetic(c, "graph", ranks, 7300, 365);
      const CollectiveFit f = fit_collective(pts, c, "graph");
      ASSERT_TRUE(f.fitted);
      EXPECT_NEAR(f.alpha_ns, 7300, 7300 * 1e-7) << nccl_collective_name(c) << " " << ranks;
      EXPECT_NEAR(f.beta_gbps, 365, 365 * 1e-7) << nccl_collective_name(c) << " " << ranks;
      EXPECT_NEAR(f.r2, 1.0, 1e-12);
      EXPECT_LT(f.max_rel_err, 1e-7);
      EXPECT_EQ(f.samples, 16);
    }
  }
}

TEST(NcclFit, CloseWithNoise) {
  // 5% multiplicative noise on every point: the relative-error fit keeps alpha (which only the
  // small messages see) and beta (which only the large ones see) within a few percent.
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    const auto pts = synthetic(NcclCollective::kAllReduce, "eager", 2, 12000, 340, 0.05, seed);
    const CollectiveFit f = fit_collective(pts, NcclCollective::kAllReduce, "eager");
    ASSERT_TRUE(f.fitted);
    EXPECT_NEAR(f.alpha_ns, 12000, 12000 * 0.05) << "seed " << seed;
    EXPECT_NEAR(f.beta_gbps, 340, 340 * 0.05) << "seed " << seed;
    EXPECT_GT(f.r2, 0.99);
    EXPECT_LT(f.max_rel_err, 0.11);
  }
}

TEST(NcclFit, OtherCollectivesAndModesAreIgnored) {
  auto pts = synthetic(NcclCollective::kAllReduce, "graph", 2, 7000, 360);
  const auto eager = synthetic(NcclCollective::kAllReduce, "eager", 2, 20000, 100);
  const auto a2a = synthetic(NcclCollective::kAllToAll, "graph", 2, 15000, 200);
  pts.insert(pts.end(), eager.begin(), eager.end());
  pts.insert(pts.end(), a2a.begin(), a2a.end());
  const std::vector<CollectiveFit> fits = fit_collectives(pts);
  ASSERT_EQ(fits.size(), 3u);
  EXPECT_EQ(fits[0].mode, "eager");
  EXPECT_NEAR(fits[0].alpha_ns, 20000, 1e-3);
  EXPECT_NEAR(fits[1].beta_gbps, 360, 1e-5);
  EXPECT_EQ(fits[2].coll, NcclCollective::kAllToAll);
  EXPECT_NEAR(fits[2].alpha_ns, 15000, 1e-3);
  EXPECT_NEAR(fits[2].beta_gbps, 200, 1e-5);
  const std::string report = nccl_fit_report(fits);
  EXPECT_NE(report.find("all_to_all  graph"), std::string::npos) << report;
  EXPECT_NE(nccl_table(pts).find("busbw_GBps"), std::string::npos);
}

TEST(NcclFit, TooFewPointsOrOneRank) {
  const auto pts = synthetic(NcclCollective::kAllReduce, "graph", 2, 7000, 360);
  EXPECT_FALSE(fit_collective(std::span(pts).first(1), NcclCollective::kAllReduce, "graph").fitted);
  EXPECT_FALSE(fit_collective(pts, NcclCollective::kAllReduce, "eager").fitted);
  // One rank moves no bus bytes: a constant, no bandwidth term.
  std::vector<NcclPoint> one = synthetic(NcclCollective::kAllReduce, "graph", 1, 5000, 360);
  const CollectiveFit f = fit_collective(one, NcclCollective::kAllReduce, "graph");
  ASSERT_TRUE(f.fitted);
  EXPECT_NEAR(f.alpha_ns, 5000, 1e-6);
  EXPECT_EQ(f.beta_gbps, 0);
}

TEST(NcclFit, AlphaWithFixedBeta) {
  const auto pts = synthetic(NcclCollective::kSendRecv, "graph", 2, 4000, 300);
  const auto [alpha, err] = fit_alpha_with_beta(pts, NcclCollective::kSendRecv, "graph", 300);
  EXPECT_NEAR(alpha, 4000, 1e-6);
  EXPECT_LT(err, 1e-9);
  // A wrong beta: alpha absorbs what it can, the error says how far the model is off.
  const auto [alpha2, err2] = fit_alpha_with_beta(pts, NcclCollective::kSendRecv, "graph", 150);
  EXPECT_GE(alpha2, 0);
  EXPECT_GT(err2, 0.5);
}

CalibrationProfile base_profile() {
  CalibrationProfile p;
  p.name = "h200-test";
  p.base = "h200";
  p.hw = hardware_preset("h200");
  p.hw.name = p.name;
  p.header = {"twinstep calibrate-nccl --out h200-test.yaml", "abc", "NVIDIA H200", "CUDA 13.0",
              "2026-11-29T00:00:00Z"};
  p.measurements.emplace_back("inflation", 1.5);
  return p;
}

std::vector<NcclPoint> two_gpu_graph_points() {
  std::vector<NcclPoint> pts;
  for (const auto& more : {synthetic(NcclCollective::kAllReduce, "graph", 2, 7000, 350),
                           synthetic(NcclCollective::kAllReduce, "eager", 2, 15000, 330),
                           synthetic(NcclCollective::kAllGather, "graph", 2, 6500, 350),
                           synthetic(NcclCollective::kAllToAll, "graph", 2, 12000, 350),
                           synthetic(NcclCollective::kSendRecv, "graph", 2, 5000, 350)}) {
    pts.insert(pts.end(), more.begin(), more.end());
  }
  return pts;
}

double measurement(const CalibrationProfile& p, const std::string& key) {
  int found = 0;
  double v = 0;
  for (const auto& [k, x] : p.measurements) {
    if (k == key) {
      ++found;
      v = x;
    }
  }
  EXPECT_EQ(found, 1) << key;
  return v;
}

TEST(NcclFit, ProfileGetsGraphFitsAndMeasurements) {
  CalibrationProfile p = base_profile();
  const std::vector<NcclPoint> pts = two_gpu_graph_points();
  const std::vector<CollectiveFit> fits = fit_collectives(pts);
  const std::string changes = apply_nccl_calibration(p, pts, fits);
  EXPECT_NE(changes.find("interconnect_gbps"), std::string::npos) << changes;
  EXPECT_NEAR(p.hw.interconnect_gbps, 350, 1e-6);
  EXPECT_EQ(p.hw.allreduce_alpha_ns, 7000);
  EXPECT_EQ(p.hw.alltoall_alpha_ns, 12000);
  EXPECT_EQ(p.hw.p2p_alpha_ns, 5000);
  EXPECT_EQ(measurement(p, "inflation"), 1.5);  // other measurements kept
  EXPECT_EQ(measurement(p, "nccl.ranks"), 2);
  EXPECT_NEAR(measurement(p, "nccl.fit.all_reduce.eager.alpha_ns"), 15000, 1e-3);
  EXPECT_NEAR(measurement(p, "nccl.all_reduce.graph.8K.median_ns"), 7000 + 8192 / 350.0, 1e-6);
  EXPECT_NEAR(measurement(p, "nccl.all_to_all.graph.256M.busbw_gbps"),
              0.5 * 268435456 / (12000 + 0.5 * 268435456 / 350.0), 1e-9);
  EXPECT_LT(measurement(p, "nccl.profile.all_to_all.max_rel_err"), 1e-9);
  // All-gather is priced with the all-reduce alpha: its error there is recorded.
  EXPECT_GT(measurement(p, "nccl.profile.all_gather.max_rel_err"), 0);

  // A second calibration replaces the first's nccl.* entries.
  const size_t n = p.measurements.size();
  apply_nccl_calibration(p, pts, fits);
  EXPECT_EQ(p.measurements.size(), n);

  // Written through a temporary file and read back.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("nccl_fit_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "h200-test.yaml").string();
  write_profile_file(p, path);
  const CalibrationProfile back = load_calibration_profile(path);
  EXPECT_EQ(back.measurements, p.measurements);
  EXPECT_EQ(back.name, "h200-test");
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);  // no temporary left behind
  std::filesystem::remove_all(dir);
}

// The simulator, given the calibrated profile, prices each collective as the measurement did:
// nccl-tests' bytes and bus factors are the cost model's messages and algorithm bytes.
TEST(NcclFit, CostModelPricesTheCalibratedCollectivesAsMeasured) {
  CalibrationProfile p = base_profile();
  const std::vector<NcclPoint> pts = two_gpu_graph_points();
  apply_nccl_calibration(p, pts, fit_collectives(pts));
  const CostModel cost(p.hw);
  for (const NcclPoint& pt : pts) {
    if (pt.mode != "graph") continue;
    const int64_t s = pt.bytes;
    KernelDesc k{"collective", KernelClass::kCollective, s, s, 0, CollectiveKind::kNone, 2};
    switch (pt.coll) {
      case NcclCollective::kAllReduce:
        k.coll = CollectiveKind::kAllReduce;
        break;
      case NcclCollective::kAllGather:  // this rank's share in, everyone's out
        k.coll = CollectiveKind::kAllGather;
        k.bytes_read = s / 2;
        break;
      case NcclCollective::kAllToAll:
        k.coll = CollectiveKind::kAllToAll;
        break;
      case NcclCollective::kSendRecv:
        k.coll = CollectiveKind::kSendRecv;
        break;
    }
    const double sim = double(cost.collective_ns(k));
    if (pt.coll == NcclCollective::kAllGather) {
      // Priced with the all-reduce alpha (7000 ns here, measured 6500).
      EXPECT_NEAR(sim, pt.median_ns + 500, 1.0) << pt.bytes;
    } else {
      EXPECT_NEAR(sim, pt.median_ns, 1.0) << nccl_collective_name(pt.coll) << " " << pt.bytes;
    }
  }
}

// Calibrating on another number of GPUs keeps the earlier group size's tables as a group
// (nccl.r<N>.*), which the simulator prices that group size by: 2 GPUs, then 4 (the 2-GPU
// tables become r2), then 2 again (the 4-GPU ones become r4, r2 is this run's and goes).
TEST(NcclFit, AnotherGroupSizeKeepsTheEarlierTablesAsAGroup) {
  CalibrationProfile p = base_profile();
  const std::vector<NcclPoint> two = two_gpu_graph_points();
  apply_nccl_calibration(p, two, fit_collectives(two));
  const double two_8k = measurement(p, "nccl.all_reduce.graph.8K.median_ns");
  const auto four = synthetic(NcclCollective::kAllReduce, "graph", 4, 9000, 300);
  apply_nccl_calibration(p, four, fit_collectives(four));
  EXPECT_EQ(measurement(p, "nccl.ranks"), 4);
  EXPECT_EQ(measurement(p, "nccl.r2.all_reduce.graph.8K.median_ns"), two_8k);
  EXPECT_NEAR(measurement(p, "nccl.r2.fit.all_reduce.eager.alpha_ns"), 15000, 1e-3);
  EXPECT_NEAR(measurement(p, "nccl.all_reduce.graph.8K.median_ns"), 9000 + 1.5 * 8192 / 300.0,
              1e-6);
  EXPECT_EQ(measurement(p, "inflation"), 1.5);
  for (const auto& [key, value] : p.measurements) {
    EXPECT_NE(key, "nccl.r2.ranks");
    EXPECT_NE(key.rfind("nccl.r2.profile.", 0), 0u) << key;  // figures of the earlier fit go
    EXPECT_NE(key.rfind("nccl.all_to_all.", 0), 0u) << key;  // the 2-GPU primary is now r2
  }
  // Written and read back: both group sizes priced from their own tables.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("nccl_groups_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "h200-test.yaml").string();
  write_profile_file(p, path);
  const CalibrationProfile back = load_calibration_profile(path);
  std::filesystem::remove_all(dir);
  const CostModel cost(back.hw);
  KernelDesc k{
      "all_reduce", KernelClass::kCollective, 8192, 8192, 0, CollectiveKind::kAllReduce, 2};
  EXPECT_NEAR(double(cost.collective_ns(k)), two_8k, 1.0);
  k.group = 4;
  EXPECT_NEAR(double(cost.collective_ns(k)), 9000 + 1.5 * 8192 / 300.0, 1.0);

  apply_nccl_calibration(p, two, fit_collectives(two));
  EXPECT_EQ(measurement(p, "nccl.ranks"), 2);
  EXPECT_EQ(measurement(p, "nccl.all_reduce.graph.8K.median_ns"), two_8k);
  EXPECT_NEAR(measurement(p, "nccl.r4.all_reduce.graph.8K.median_ns"), 9000 + 1.5 * 8192 / 300.0,
              1e-6);
  for (const auto& [key, value] : p.measurements) EXPECT_NE(key.rfind("nccl.r2.", 0), 0u) << key;
}

TEST(NcclFit, OneRankLeavesTheFiguresAlone) {
  CalibrationProfile p = base_profile();
  const HardwareSpec before = p.hw;
  const auto pts = synthetic(NcclCollective::kAllReduce, "graph", 1, 5000, 360);
  const std::string changes = apply_nccl_calibration(p, pts, fit_collectives(pts));
  EXPECT_NE(changes.find("one rank"), std::string::npos) << changes;
  EXPECT_EQ(p.hw.interconnect_gbps, before.interconnect_gbps);
  EXPECT_EQ(p.hw.allreduce_alpha_ns, before.allreduce_alpha_ns);
  EXPECT_EQ(measurement(p, "nccl.ranks"), 1);
}

TEST(NcclFit, RecordJson) {
  const std::vector<NcclPoint> pts = two_gpu_graph_points();
  const std::vector<CollectiveFit> fits = fit_collectives(pts);
  const ProfileHeader h = {"mpirun -np 2 twinstep calibrate-nccl --out \"x\".yaml", "abc-dirty",
                           "NVIDIA H200", "CUDA driver API 13.0", "2026-11-29T00:00:00Z"};
  const JsonValue doc = parse_json(nccl_record_json(h, "2.27.3", pts, fits));
  EXPECT_EQ(doc.find("command")->as_string("command"), h.command);
  EXPECT_EQ(doc.find("gpu")->as_string("gpu"), "NVIDIA H200");
  EXPECT_EQ(doc.find("ranks")->as_i64("ranks"), 2);
  const JsonValue* rows = doc.find("rows");
  ASSERT_NE(rows, nullptr);
  ASSERT_EQ(rows->items.size(), pts.size());
  const JsonValue& r0 = rows->items[0];
  EXPECT_EQ(r0.find("collective")->as_string("c"), "all_reduce");
  EXPECT_EQ(r0.find("bytes")->as_i64("bytes"), 8192);
  EXPECT_NEAR(r0.find("median_us")->as_double("m"), (7000 + 8192 / 350.0) / 1e3, 1e-12);
  EXPECT_NEAR(r0.find("fit_rel_err")->as_double("e"), 0, 1e-9);
  EXPECT_EQ(doc.find("fits")->items.size(), fits.size());
}

// ---- skewed arrival (issue #11) ---------------------------------------------------------------

// A 2-rank sweep of the graph all-reduce at 4K, 8K and 64K, the late rank's spin 0, 1 and 4 us.
// Spin-only graph per repetition: 2000, 3010, 6050 ns (skew 0, 1010, 4050 ns). The late rank's
// all-reduce at delay 0: 6000, 6500, 9000 ns by size; its extra at 1 us: 800, 900, 1000 ns
// (median 900), at 4 us: 950, 1000, -200 ns (median 950; the 64K point is 1150 ns off it).
std::vector<NcclSkewPoint> skew_points() {
  const int64_t sizes[] = {4 << 10, 8 << 10, 64 << 10};
  const double delays[] = {0, 1000, 4000};
  const double spin[] = {2000, 3010, 6050};
  const double late0[] = {6000, 6500, 9000};
  const double extra[3][3] = {{0, 0, 0}, {800, 900, 1000}, {950, 1000, -200}};  // [delay][size]
  std::vector<NcclSkewPoint> out;
  for (size_t b = 0; b < 3; ++b) {
    for (size_t d = 0; d < 3; ++d) {
      NcclSkewPoint p;
      p.ranks = 2;
      p.bytes = sizes[b];
      p.delay_ns = delays[d];
      p.ops = 20;
      p.reps = 50;
      p.spin_ns = spin[d];
      p.total_ns = spin[d] + late0[b] + extra[d][b];
      p.spin0_ns = spin[0];
      p.total0_ns = spin[0] + late0[b];
      out.push_back(p);
    }
  }
  return out;
}

TEST(NcclSkew, PointsDeriveSkewLateAndExtra) {
  const std::vector<NcclSkewPoint> pts = skew_points();
  const NcclSkewPoint& p = pts[4];  // 8K at 1 us
  ASSERT_EQ(p.bytes, 8 << 10);
  ASSERT_EQ(p.delay_ns, 1000);
  EXPECT_EQ(p.skew_ns(), 1010);
  EXPECT_EQ(p.late_ns(), 7400);
  EXPECT_EQ(p.extra_ns(), 900);
  EXPECT_EQ(pts[3].extra_ns(), 0);  // delay 0 is the reference
  EXPECT_EQ(pts[3].skew_ns(), 0);
}

TEST(NcclSkew, FitTakesTheMedianOverSizesPerDelay) {
  const std::vector<SkewFit> fits = fit_skew(skew_points());
  ASSERT_EQ(fits.size(), 1u);
  const SkewFit& f = fits[0];
  EXPECT_EQ(f.coll, NcclCollective::kAllReduce);
  EXPECT_EQ(f.mode, "graph");
  EXPECT_EQ(f.sizes, 3);
  EXPECT_EQ(f.ranks, 2);
  EXPECT_EQ(f.max_size_dev_ns, 1150);
  ASSERT_EQ(f.points.size(), 3u);
  const double want[3][2] = {{0, 0}, {1010, 900}, {4050, 950}};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(f.points[i].skew_ns, want[i][0]) << i;
    EXPECT_EQ(f.points[i].extra_ns, want[i][1]) << i;
  }
}

TEST(NcclSkew, FitClampsNegativeExtrasAndDropsSkewsThatDoNotRise) {
  std::vector<NcclSkewPoint> pts = skew_points();
  for (NcclSkewPoint& p : pts) {
    if (p.delay_ns == 1000) p.total_ns -= 1000;  // extras -200, -100, 0: median -100
  }
  // An 8 us delay whose spin took no longer than the 4 us one (skew 4050 again): dropped.
  for (size_t b = 0; b < 3; ++b) {
    NcclSkewPoint p = pts[b * 3 + 2];
    p.delay_ns = 8000;
    pts.push_back(p);
  }
  const std::vector<SkewFit> fits = fit_skew(pts);
  ASSERT_EQ(fits.size(), 1u);
  ASSERT_EQ(fits[0].points.size(), 3u);
  EXPECT_EQ(fits[0].points[1].skew_ns, 1010);
  EXPECT_EQ(fits[0].points[1].extra_ns, 0);
  EXPECT_EQ(fits[0].points[2].skew_ns, 4050);
  // No points: no fits.
  EXPECT_TRUE(fit_skew({}).empty());
}

TEST(NcclSkew, ProfileGetsTheCurveAndTheMeasurements) {
  CalibrationProfile p = base_profile();
  const std::vector<NcclPoint> pts = two_gpu_graph_points();
  const std::vector<CollectiveFit> fits = fit_collectives(pts);
  const std::vector<NcclSkewPoint> skew = skew_points();
  const std::string changes = apply_nccl_calibration(p, pts, fits, skew);
  EXPECT_NE(changes.find("collective_skew.all_reduce.graph: 3 points, extra 0 .. 950 ns"),
            std::string::npos)
      << changes;
  EXPECT_EQ(p.hw.allreduce_alpha_ns, 7000);  // the size sweep's update as before
  EXPECT_EQ(p.hw.collective_skew_ranks, 2);
  ASSERT_EQ(p.hw.collective_skew.size(), 1u);
  const HardwareSpec::CollectiveSkewTable& t = p.hw.collective_skew[0];
  EXPECT_EQ(t.collective, "all_reduce");
  EXPECT_TRUE(t.graph);
  ASSERT_EQ(t.points.size(), 3u);
  EXPECT_EQ(t.points[2].skew_ns, 4050);
  EXPECT_EQ(t.points[2].extra_ns, 950);
  EXPECT_EQ(measurement(p, "nccl.skew.all_reduce.graph.8K.delay1000.total_ns"), 10410);
  EXPECT_EQ(measurement(p, "nccl.skew.all_reduce.graph.8K.delay1000.spin_ns"), 3010);
  EXPECT_EQ(measurement(p, "nccl.skew.all_reduce.graph.8K.delay1000.skew_ns"), 1010);
  EXPECT_EQ(measurement(p, "nccl.skew.all_reduce.graph.8K.delay1000.late_ns"), 7400);
  EXPECT_EQ(measurement(p, "nccl.skew.all_reduce.graph.64K.delay4000.extra_ns"), -200);
  EXPECT_EQ(measurement(p, "nccl.skew.fit.all_reduce.graph.max_size_dev_ns"), 1150);

  // The simulator's extra: 900 ns at 1010 ns of skew; halfway to 4050, 925.
  const CostModel cost(p.hw);
  const KernelDesc ar{"ar", KernelClass::kCollective, 8192, 8192, 0, CollectiveKind::kAllReduce, 2};
  EXPECT_EQ(cost.collective_skew_extra_ns(ar, true, 1010), 900);
  EXPECT_EQ(cost.collective_skew_extra_ns(ar, true, 2530), 925);

  // Written and read back.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("nccl_skew_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "h200-test.yaml").string();
  write_profile_file(p, path);
  const CalibrationProfile back = load_calibration_profile(path);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(back.measurements, p.measurements);
  ASSERT_EQ(back.hw.collective_skew.size(), 1u);
  EXPECT_EQ(back.hw.collective_skew_ranks, 2);
  EXPECT_EQ(back.hw.collective_skew[0].points[1].skew_ns, 1010);
  EXPECT_EQ(back.hw.collective_skew[0].points[1].extra_ns, 900);

  // A calibration without the sweep drops the curve with the earlier nccl.* measurements.
  const std::string again = apply_nccl_calibration(p, pts, fits);
  EXPECT_NE(again.find("collective_skew: dropped"), std::string::npos) << again;
  EXPECT_TRUE(p.hw.collective_skew.empty());
  EXPECT_EQ(p.hw.collective_skew_ranks, 0);
  for (const auto& [key, v] : p.measurements) EXPECT_NE(key.rfind("nccl.skew.", 0), 0u) << key;
}

TEST(NcclSkew, RecordJsonCarriesTheRowsAndTheCurve) {
  const std::vector<NcclPoint> pts = two_gpu_graph_points();
  const ProfileHeader h = {"c", "abc", "NVIDIA H200", "CUDA driver API 13.0", "d"};
  const std::vector<NcclSkewPoint> skew = skew_points();
  const JsonValue doc = parse_json(nccl_record_json(h, "2.27.3", pts, fit_collectives(pts), skew));
  const JsonValue* rows = doc.find("skew_rows");
  ASSERT_NE(rows, nullptr);
  ASSERT_EQ(rows->items.size(), 9u);
  const JsonValue& r = rows->items[4];  // 8K at 1 us
  EXPECT_EQ(r.find("collective")->as_string("c"), "all_reduce");
  EXPECT_EQ(r.find("bytes")->as_i64("b"), 8192);
  EXPECT_NEAR(r.find("delay_us")->as_double("d"), 1.0, 1e-12);
  EXPECT_NEAR(r.find("total_us")->as_double("t"), 10.41, 1e-12);
  EXPECT_NEAR(r.find("skew_us")->as_double("s"), 1.01, 1e-12);
  EXPECT_NEAR(r.find("extra_us")->as_double("e"), 0.9, 1e-12);
  const JsonValue* curves = doc.find("skew_fits");
  ASSERT_NE(curves, nullptr);
  ASSERT_EQ(curves->items.size(), 1u);
  const JsonValue& c = curves->items[0];
  EXPECT_EQ(c.find("sizes")->as_i64("n"), 3);
  EXPECT_NEAR(c.find("max_size_dev_us")->as_double("m"), 1.15, 1e-12);
  const JsonValue* points = c.find("points");
  ASSERT_EQ(points->items.size(), 3u);
  EXPECT_NEAR(points->items[2].items[0].as_double("s"), 4.05, 1e-12);
  EXPECT_NEAR(points->items[2].items[1].as_double("e"), 0.95, 1e-12);
  // Without skew points the record has neither key (records before the sweep keep their shape).
  const JsonValue plain = parse_json(nccl_record_json(h, "2.27.3", pts, fit_collectives(pts)));
  EXPECT_EQ(plain.find("skew_rows"), nullptr);
  EXPECT_EQ(plain.find("skew_fits"), nullptr);
}

TEST(NcclFit, PresetForGpu) {
  EXPECT_EQ(preset_for_gpu("NVIDIA H200"), "h200");
  EXPECT_EQ(preset_for_gpu("NVIDIA H100 80GB HBM3"), "h100");
  EXPECT_EQ(preset_for_gpu("NVIDIA H20"), "h20");
  EXPECT_EQ(preset_for_gpu("NVIDIA A100"), "");
}

}  // namespace
}  // namespace twinstep
