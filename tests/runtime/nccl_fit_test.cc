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

TEST(NcclFit, PresetForGpu) {
  EXPECT_EQ(preset_for_gpu("NVIDIA H200"), "h200");
  EXPECT_EQ(preset_for_gpu("NVIDIA H100 80GB HBM3"), "h100");
  EXPECT_EQ(preset_for_gpu("NVIDIA H20"), "h20");
  EXPECT_EQ(preset_for_gpu("NVIDIA A100"), "");
}

}  // namespace
}  // namespace twinstep
