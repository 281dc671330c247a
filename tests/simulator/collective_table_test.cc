// Measured collective tables (HardwareSpec::collective_tables): read from a calibrated profile's
// nccl.*.median_ns measurements, priced by CostModel::collective_ns in log-log interpolation,
// and used by the simulator for TP collectives (graph table in decode, eager table in prefill).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>

#include "experiments/experiment.h"
#include "policies/calibration_profile.h"
#include "policies/decode_loop.h"
#include "policies/error.h"
#include "policies/layout.h"
#include "simulator/cost_model.h"
#include "simulator/sim_backend.h"
#include "tests/simulator/profile_text.h"
#include "tests/support/sim_fixtures.h"

namespace twinstep {
namespace {

// Two ranks. all_reduce graph: 16K 10 us, 64K 40 us, 256K 50 us, 1M 90 us (written out of
// order: the loader sorts); all_reduce eager: 16K 90 us, 1M 85 us (falling: above it the last
// point's bandwidth); all_gather graph: 16K 6 us, 64K 12 us; send_recv graph: 8K 7 us, 64K
// 14 us. No all_to_all table. The other nccl.* keys are reported only.
const char* kNcclProfile = R"(format: 1
name: h200-nccl
base: h200
header: {command: twinstep calibrate-nccl, commit: abc, gpu: NVIDIA H200, driver: "570", date: d}
figures:
  interconnect_gbps: 256
  allreduce_alpha_ns: 8000
  alltoall_alpha_ns: 9000
  p2p_alpha_ns: 7500
measurements:
  "nccl.ranks": 2
  "nccl.all_reduce.graph.64K.median_ns": 40000
  "nccl.all_reduce.graph.16K.median_ns": 10000
  "nccl.all_reduce.graph.16K.p90_ns": 11000
  "nccl.all_reduce.graph.256K.median_ns": 50000
  "nccl.all_reduce.graph.1M.median_ns": 90000
  "nccl.all_reduce.eager.16K.median_ns": 90000
  "nccl.all_reduce.eager.1M.median_ns": 85000
  "nccl.all_gather.graph.16384.median_ns": 6000
  "nccl.all_gather.graph.64K.median_ns": 12000
  "nccl.send_recv.graph.8K.median_ns": 7000
  "nccl.send_recv.graph.64K.median_ns": 14000
  "nccl.fit.all_reduce.graph.alpha_ns": 8000
  "nccl.profile.interconnect_gbps": 256
)";

constexpr int64_t kK = 1024;

HardwareSpec nccl_hw() { return parse_calibration_profile(kNcclProfile, "nccl.yaml").hw; }

KernelDesc all_reduce(int64_t bytes, int32_t group = 2) {
  return {"all_reduce", KernelClass::kCollective, bytes, bytes, 0, CollectiveKind::kAllReduce,
          group};
}

std::string error_of(const std::string& text) { return test::profile_error_of(text); }
std::string replace(const std::string& s, const std::string& from, const std::string& to) {
  return test::replace_once(s, from, to);
}

// ---- loading ----------------------------------------------------------------------------------

TEST(CollectiveTable, LoadedFromTheMeasurementsSortedByBytes) {
  const HardwareSpec hw = nccl_hw();
  ASSERT_EQ(hw.collective_tables.size(), 4u);  // in order of first appearance
  for (const HardwareSpec::CollectiveTable& t : hw.collective_tables) EXPECT_EQ(t.ranks, 2);
  const HardwareSpec::CollectiveTable& ar = hw.collective_tables[0];
  EXPECT_EQ(ar.collective, "all_reduce");
  EXPECT_TRUE(ar.graph);
  ASSERT_EQ(ar.points.size(), 4u);
  const int64_t bytes[] = {16 * kK, 64 * kK, 256 * kK, 1024 * kK};
  const double ns[] = {10000, 40000, 50000, 90000};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ar.points[i].bytes, bytes[i]);
    EXPECT_EQ(ar.points[i].median_ns, ns[i]);
  }
  EXPECT_EQ(hw.collective_tables[1].collective, "all_reduce");
  EXPECT_FALSE(hw.collective_tables[1].graph);
  EXPECT_EQ(hw.collective_tables[2].collective, "all_gather");
  EXPECT_EQ(hw.collective_tables[2].points[0].bytes, 16384);  // a plain byte count
  EXPECT_EQ(hw.collective_tables[3].collective, "send_recv");
}

TEST(CollectiveTable, ProfilesWithoutOneLoadAsBefore) {
  const std::string text = kNcclProfile;
  const std::string plain = text.substr(0, text.find("measurements:")) +
                            "measurements: {\"nccl.ranks\": 2, \"nccl.fit.x\": 1, other: 1}\n";
  const HardwareSpec hw = parse_calibration_profile(plain, "p.yaml").hw;
  EXPECT_TRUE(hw.collective_tables.empty());
  EXPECT_EQ(hw.allreduce_alpha_ns, 8000);
}

// The collective tables of two parsed profiles, table by table and point by point.
void expect_same_tables(const HardwareSpec& p, const HardwareSpec& q) {
  ASSERT_EQ(q.collective_tables.size(), p.collective_tables.size());
  for (size_t t = 0; t < p.collective_tables.size(); ++t) {
    const auto& a = p.collective_tables[t];
    const auto& b = q.collective_tables[t];
    EXPECT_EQ(a.collective, b.collective);
    EXPECT_EQ(a.graph, b.graph);
    EXPECT_EQ(a.ranks, b.ranks);
    ASSERT_EQ(a.points.size(), b.points.size());
    for (size_t i = 0; i < a.points.size(); ++i) {
      EXPECT_EQ(a.points[i].bytes, b.points[i].bytes);
      EXPECT_EQ(a.points[i].median_ns, b.points[i].median_ns);
    }
  }
}

TEST(CollectiveTable, SurvivesWriteAndParse) {
  const CalibrationProfile p = parse_calibration_profile(kNcclProfile, "p.yaml");
  const CalibrationProfile q = parse_calibration_profile(write_calibration_profile(p), "q.yaml");
  expect_same_tables(p.hw, q.hw);
}

TEST(CollectiveTable, MalformedEntriesSayWhereAndWhat) {
  // Line 12 is "nccl.all_reduce.graph.64K.median_ns": 40000; its value is at column 42.
  const std::string key = "\"nccl.all_reduce.graph.64K.median_ns\": 40000";
  EXPECT_EQ(error_of(replace(kNcclProfile, key, "\"nccl.all_reduse.graph.64K.median_ns\": 40000")),
            "p.yaml:12:42: measurements.nccl.all_reduse.graph.64K.median_ns: a collective time is "
            "nccl.COLLECTIVE.MODE.SIZE.median_ns or nccl.r<N>.COLLECTIVE.MODE.SIZE.median_ns, "
            "COLLECTIVE one of all_reduce, all_gather, all_to_all, send_recv, MODE eager or "
            "graph");
  EXPECT_EQ(error_of(replace(kNcclProfile, key, "\"nccl.all_reduce.pdl.64K.median_ns\": 40000")),
            "p.yaml:12:40: measurements.nccl.all_reduce.pdl.64K.median_ns: a collective time is "
            "nccl.COLLECTIVE.MODE.SIZE.median_ns or nccl.r<N>.COLLECTIVE.MODE.SIZE.median_ns, "
            "COLLECTIVE one of all_reduce, all_gather, all_to_all, send_recv, MODE eager or "
            "graph");
  EXPECT_EQ(error_of(replace(kNcclProfile, key, "\"nccl.all_reduce.graph.64Q.median_ns\": 40000")),
            "p.yaml:12:42: measurements.nccl.all_reduce.graph.64Q.median_ns: message size '64Q' "
            "must be a byte count in [1, 2^50]: digits, optionally followed by K, M or G (KiB, "
            "MiB, GiB), as in 8K or 256M");
  EXPECT_EQ(error_of(replace(kNcclProfile, key, "\"nccl.all_reduce.graph.64K.median_ns\": 0")),
            "p.yaml:12:42: measurements.nccl.all_reduce.graph.64K.median_ns = 0 is out of range "
            "(0, 1e+15]");
  EXPECT_EQ(error_of(replace(kNcclProfile, key, "\"nccl.all_reduce.graph.16384.median_ns\": 1")),
            "p.yaml:13:42: measurements.nccl.all_reduce.graph.16K.median_ns: a second time for "
            "all_reduce graph on 2 ranks at 16384 bytes");
  EXPECT_EQ(error_of(replace(kNcclProfile, "  \"nccl.ranks\": 2\n", "")),
            "p.yaml:11:42: measurements.nccl.all_reduce.graph.64K.median_ns needs "
            "measurements.nccl.ranks (the number of GPUs the collectives were measured on)");
  EXPECT_EQ(error_of(replace(kNcclProfile, "\"nccl.ranks\": 2", "\"nccl.ranks\": 2.5")),
            "p.yaml:11:17: measurements.nccl.ranks = 2.5 must be a whole number of GPUs");
  EXPECT_EQ(error_of(replace(kNcclProfile, "\"nccl.ranks\": 2", "\"nccl.ranks\": 0")),
            "p.yaml:11:17: measurements.nccl.ranks = 0 is out of range [1, 1048576]");
}

// ---- pricing ----------------------------------------------------------------------------------

TEST(CollectiveTable, MeasuredSizesReturnTheirMedians) {
  const CostModel cost(nccl_hw());
  EXPECT_EQ(cost.collective_ns(all_reduce(16 * kK)), 10000);
  EXPECT_EQ(cost.collective_ns(all_reduce(64 * kK)), 40000);
  EXPECT_EQ(cost.collective_ns(all_reduce(256 * kK)), 50000);
  EXPECT_EQ(cost.collective_ns(all_reduce(1024 * kK)), 90000);
  EXPECT_EQ(cost.collective_ns(all_reduce(16 * kK), /*in_graph=*/false), 90000);
}

TEST(CollectiveTable, LogLogInterpolationBetweenSizes) {
  const CostModel cost(nccl_hw());
  // 32K is the log-space midpoint of 16K and 64K: the geometric mean sqrt(10000 · 40000).
  EXPECT_EQ(cost.collective_ns(all_reduce(32 * kK)), 20000);
  // 48K: log(48K/16K) / log(64K/16K) = log 3 / log 4 of the way, 10000 · 4^(log 3 / log 4) =
  // 10000 · 3.
  EXPECT_EQ(cost.collective_ns(all_reduce(48 * kK)), 30000);
  // 128K, midpoint of 64K and 256K: sqrt(40000 · 50000) = 44721.36.
  EXPECT_EQ(cost.collective_ns(all_reduce(128 * kK)), 44721);
  // Eager, 128K between 16K and 1M: 3/6 of the way in log, sqrt(90000 · 85000) = 87464.27.
  EXPECT_EQ(cost.collective_ns(all_reduce(128 * kK), false), 87464);
}

TEST(CollectiveTable, BelowTheSmallestSizeItsTime) {
  const CostModel cost(nccl_hw());
  EXPECT_EQ(cost.collective_ns(all_reduce(8 * kK)), 10000);
  EXPECT_EQ(cost.collective_ns(all_reduce(512)), 10000);
  EXPECT_EQ(cost.collective_ns(all_reduce(0)), 10000);
  EXPECT_EQ(cost.collective_ns(all_reduce(1), false), 90000);
}

TEST(CollectiveTable, AboveTheLargestSizeTheLastSegmentsBandwidth) {
  const CostModel cost(nccl_hw());
  // Graph: 256K -> 1M adds 40000 ns over 768K; 1M more costs 40000 · 1024 / 768 = 53333.3.
  EXPECT_EQ(cost.collective_ns(all_reduce(2048 * kK)), 143333);
  // Eager: the last segment falls (90000 -> 85000), so the last point's time per byte:
  // 85000 ns per MiB, 170000 at 2M.
  EXPECT_EQ(cost.collective_ns(all_reduce(2048 * kK), false), 170000);
}

TEST(CollectiveTable, OtherGroupSizesAndMissingTablesUseAlphaBeta) {
  const CostModel cost(nccl_hw());
  // Four ranks, 32K: 8000 + 2·3/4 · 32768 / 256 = 8000 + 192.
  EXPECT_EQ(cost.collective_ns(all_reduce(32 * kK, 4)), 8192);
  // No all-to-all table: 9000 + 1/2 · max(read, written) / 256 = 9000 + 64.
  EXPECT_EQ(cost.collective_ns({"a2a", KernelClass::kCollective, 32 * kK, 16 * kK, 0,
                                CollectiveKind::kAllToAll, 2}),
            9064);
  // No eager all-gather table: 8000 (the all-reduce alpha) + 1/2 · 64K / 256.
  const KernelDesc gather{"gather", KernelClass::kCollective,   32 * kK, 64 * kK,
                          0,        CollectiveKind::kAllGather, 2};
  EXPECT_EQ(cost.collective_ns(gather, false), 8128);
  // A table with no ranks recorded is no table (a HardwareSpec built in code).
  HardwareSpec hw = nccl_hw();
  for (HardwareSpec::CollectiveTable& t : hw.collective_tables) t.ranks = 0;
  EXPECT_EQ(CostModel(hw).collective_ns(all_reduce(16 * kK)), 8000 + 64);
}

TEST(CollectiveTable, IndexedByTheMessageAsNcclTestsCountsIt) {
  const CostModel cost(nccl_hw());
  // All-gather: the output (64K: 12000), not this rank's 32K share (which would give
  // 6000 · sqrt(2) = 8485).
  const KernelDesc gather{"gather", KernelClass::kCollective,   32 * kK, 64 * kK,
                          0,        CollectiveKind::kAllGather, 2};
  EXPECT_EQ(cost.collective_ns(gather), 12000);
  // Send/recv: the buffer, whichever side this rank is; the group field names the peer stage,
  // so any pair uses the table. 16K: 1/3 of 8K..64K in log, 7000 · 2^(1/3) = 8819.4.
  const KernelDesc send{"pp_send", KernelClass::kCollective,  16 * kK, 0,
                        0,         CollectiveKind::kSendRecv, 5};
  const KernelDesc recv{"pp_recv", KernelClass::kCollective,  0, 16 * kK,
                        0,         CollectiveKind::kSendRecv, 0};
  EXPECT_EQ(cost.collective_ns(send), 8819);
  EXPECT_EQ(cost.collective_ns(recv), 8819);
  // No eager send/recv table: 7500 + 16K / 256.
  EXPECT_EQ(cost.collective_ns(send, false), 7500 + 64);
}

TEST(CollectiveTable, AlphaBetaUnchangedWithoutATable) {
  HardwareSpec hw = hardware_preset("h200");
  hw.interconnect_gbps = 256;
  hw.allreduce_alpha_ns = 8000;
  const CostModel cost(hw);
  EXPECT_EQ(cost.collective_ns(all_reduce(16 * kK)), 8000 + 64);
  EXPECT_EQ(cost.collective_ns(all_reduce(16 * kK), false), 8000 + 64);
}

// ---- several group sizes: nccl.r<N>.* -----------------------------------------------------

// kNcclProfile (two ranks) with tables measured on four: all_reduce graph 16K 15 us, 1M 120 us;
// all_reduce eager 16K 30 us; send_recv graph 8K 9 us. Its p90 and fit keys are reported only.
const std::string kR4Keys = R"(  "nccl.r4.all_reduce.graph.16K.median_ns": 15000
  "nccl.r4.all_reduce.graph.16K.p90_ns": 16000
  "nccl.r4.all_reduce.graph.1M.median_ns": 120000
  "nccl.r4.all_reduce.eager.16K.median_ns": 30000
  "nccl.r4.send_recv.graph.8K.median_ns": 9000
  "nccl.r4.fit.all_reduce.graph.alpha_ns": 12000
)";
const std::string kTwoGroupProfile = std::string(kNcclProfile) + kR4Keys;

HardwareSpec two_group_hw() { return parse_calibration_profile(kTwoGroupProfile, "p.yaml").hw; }

TEST(CollectiveTableGroups, OneTablePerCollectiveModeAndGroupSize) {
  const HardwareSpec hw = two_group_hw();
  ASSERT_EQ(hw.collective_tables.size(), 7u);  // in order of first appearance
  for (size_t t = 0; t < 4; ++t) EXPECT_EQ(hw.collective_tables[t].ranks, 2) << t;
  const HardwareSpec::CollectiveTable& ar = hw.collective_tables[4];
  EXPECT_EQ(ar.collective, "all_reduce");
  EXPECT_TRUE(ar.graph);
  EXPECT_EQ(ar.ranks, 4);
  ASSERT_EQ(ar.points.size(), 2u);
  EXPECT_EQ(ar.points[0].bytes, 16 * kK);
  EXPECT_EQ(ar.points[0].median_ns, 15000);
  EXPECT_EQ(ar.points[1].bytes, 1024 * kK);
  EXPECT_EQ(ar.points[1].median_ns, 120000);
  EXPECT_EQ(hw.collective_tables[5].collective, "all_reduce");
  EXPECT_FALSE(hw.collective_tables[5].graph);
  EXPECT_EQ(hw.collective_tables[5].ranks, 4);
  EXPECT_EQ(hw.collective_tables[6].collective, "send_recv");
  EXPECT_EQ(hw.collective_tables[6].ranks, 4);
  // The primary group's all-reduce is untouched by the r4 one of the same kind and mode.
  EXPECT_EQ(hw.collective_tables[0].points.size(), 4u);
}

TEST(CollectiveTableGroups, AGroupAloneNeedsNoNcclRanks) {
  const std::string text =
      std::string(kNcclProfile).substr(0, std::string(kNcclProfile).find("measurements:")) +
      "measurements:\n" + kR4Keys;
  const HardwareSpec hw = parse_calibration_profile(text, "p.yaml").hw;
  ASSERT_EQ(hw.collective_tables.size(), 3u);
  for (const HardwareSpec::CollectiveTable& t : hw.collective_tables) EXPECT_EQ(t.ranks, 4);
}

TEST(CollectiveTableGroups, SurviveWriteAndParse) {
  const CalibrationProfile p = parse_calibration_profile(kTwoGroupProfile, "p.yaml");
  const std::string text = write_calibration_profile(p);
  EXPECT_NE(text.find("\"nccl.r4.all_reduce.graph.1M.median_ns\": 120000\n"), std::string::npos);
  EXPECT_NE(text.find("\"nccl.r4.fit.all_reduce.graph.alpha_ns\": 12000\n"), std::string::npos);
  const CalibrationProfile q = parse_calibration_profile(text, "q.yaml");
  EXPECT_EQ(q.measurements, p.measurements);
  ASSERT_EQ(q.hw.collective_tables.size(), 7u);
  expect_same_tables(p.hw, q.hw);
}

TEST(CollectiveTableGroups, MalformedGroupsSayWhereAndWhat) {
  // Line 25 is "nccl.r4.all_reduce.graph.16K.median_ns": 15000, its value at column 45
  // (after 2 of indent, 40 of quoted key and ": ").
  const std::string key = "\"nccl.r4.all_reduce.graph.16K.median_ns\"";
  auto with_key = [&](const std::string& k) { return replace(kTwoGroupProfile, key, k); };
  const std::string group_rule =
      "' must be r<N>, N the GPUs measured: a whole number in [2, 1048576], no leading zeros, "
      "as in r4";
  EXPECT_EQ(
      error_of(with_key("\"nccl.rx.all_reduce.graph.16K.median_ns\"")),
      "p.yaml:25:45: measurements.nccl.rx.all_reduce.graph.16K.median_ns: group 'rx" + group_rule);
  EXPECT_EQ(
      error_of(with_key("\"nccl.r1.all_reduce.graph.16K.median_ns\"")),
      "p.yaml:25:45: measurements.nccl.r1.all_reduce.graph.16K.median_ns: group 'r1" + group_rule);
  EXPECT_EQ(error_of(with_key("\"nccl.r04.all_reduce.graph.16K.median_ns\"")),
            "p.yaml:25:46: measurements.nccl.r04.all_reduce.graph.16K.median_ns: group 'r04" +
                group_rule);
  EXPECT_EQ(error_of(with_key("\"nccl.r4.5.all_reduce.graph.16K.median_ns\"")),
            "p.yaml:25:47: measurements.nccl.r4.5.all_reduce.graph.16K.median_ns: a collective "
            "time is nccl.COLLECTIVE.MODE.SIZE.median_ns or "
            "nccl.r<N>.COLLECTIVE.MODE.SIZE.median_ns, COLLECTIVE one of all_reduce, "
            "all_gather, all_to_all, send_recv, MODE eager or graph");
  EXPECT_EQ(error_of(with_key("\"nccl.r4.all_reduse.graph.16K.median_ns\"")),
            "p.yaml:25:45: measurements.nccl.r4.all_reduse.graph.16K.median_ns: a collective "
            "time is nccl.COLLECTIVE.MODE.SIZE.median_ns or "
            "nccl.r<N>.COLLECTIVE.MODE.SIZE.median_ns, COLLECTIVE one of all_reduce, "
            "all_gather, all_to_all, send_recv, MODE eager or graph");
  EXPECT_EQ(error_of(with_key("\"nccl.r4.all_reduce.graph.16Q.median_ns\"")),
            "p.yaml:25:45: measurements.nccl.r4.all_reduce.graph.16Q.median_ns: message size "
            "'16Q' must be a byte count in [1, 2^50]: digits, optionally followed by K, M or G "
            "(KiB, MiB, GiB), as in 8K or 256M");
  // The primary group's size written as a group.
  EXPECT_EQ(error_of(with_key("\"nccl.r2.all_reduce.graph.16K.median_ns\"")),
            "p.yaml:25:45: measurements.nccl.r2.all_reduce.graph.16K.median_ns: r2 is the "
            "primary group (measurements.nccl.ranks = 2); its times are "
            "nccl.all_reduce.graph.16K.median_ns");
  // A repeated size within the r4 table (1M at line 27 is 1048576 bytes).
  EXPECT_EQ(error_of(with_key("\"nccl.r4.all_reduce.graph.1048576.median_ns\"")),
            "p.yaml:27:44: measurements.nccl.r4.all_reduce.graph.1M.median_ns: a second time for "
            "all_reduce graph on 4 ranks at 1048576 bytes");
  // An r4 time out of range, and nccl.ranks malformed with only a group to compare it with.
  EXPECT_EQ(error_of(replace(kTwoGroupProfile, key + ": 15000", key + ": -1")),
            "p.yaml:25:45: measurements.nccl.r4.all_reduce.graph.16K.median_ns = -1 is out of "
            "range (0, 1e+15]");
  const std::string text = kNcclProfile;
  const std::string only_r4 = text.substr(0, text.find("measurements:")) +
                              "measurements:\n  \"nccl.ranks\": 2.5\n" + kR4Keys;
  EXPECT_EQ(error_of(only_r4),
            "p.yaml:11:17: measurements.nccl.ranks = 2.5 must be a whole number of GPUs");
}

TEST(CollectiveTableGroups, EachGroupSizePricedFromItsOwnTable) {
  const CostModel cost(two_group_hw());
  // TP2: the two-rank table, as without the r4 keys (32K: sqrt(10000 · 40000)).
  EXPECT_EQ(cost.collective_ns(all_reduce(32 * kK, 2)), 20000);
  EXPECT_EQ(cost.collective_ns(all_reduce(16 * kK, 2), false), 90000);
  // TP4: the four-rank table. Measured sizes, below the smallest, and 128K: 3/6 of the way from
  // 16K to 1M in log, sqrt(15000 · 120000) = 42426.41.
  EXPECT_EQ(cost.collective_ns(all_reduce(16 * kK, 4)), 15000);
  EXPECT_EQ(cost.collective_ns(all_reduce(1024 * kK, 4)), 120000);
  EXPECT_EQ(cost.collective_ns(all_reduce(8 * kK, 4)), 15000);
  EXPECT_EQ(cost.collective_ns(all_reduce(128 * kK, 4)), 42426);
  // Above it the segment's marginal cost: 105000 ns per 1008K, 1M more = 105000 · 64/63.
  EXPECT_EQ(cost.collective_ns(all_reduce(2048 * kK, 4)), 120000 + 106667);
  EXPECT_EQ(cost.collective_ns(all_reduce(16 * kK, 4), false), 30000);
  // TP4 all-gather: no r4 table, alpha-beta: 8000 + 3/4 · 64K / 256.
  const KernelDesc gather{"gather", KernelClass::kCollective,   16 * kK, 64 * kK,
                          0,        CollectiveKind::kAllGather, 4};
  EXPECT_EQ(cost.collective_ns(gather), 8000 + 192);
  // Eight ranks: no table, alpha-beta: 8000 + 2·7/8 · 32768 / 256 = 8000 + 224.
  EXPECT_EQ(cost.collective_ns(all_reduce(32 * kK, 8)), 8224);
}

TEST(CollectiveTableGroups, SendRecvPrefersTheTwoRankTable) {
  const KernelDesc send{"pp_send", KernelClass::kCollective,  16 * kK, 0,
                        0,         CollectiveKind::kSendRecv, 3};
  // Both groups have a graph send/recv table: the pair's (8819 as in
  // IndexedByTheMessageAsNcclTestsCountsIt), not the four ranks' (18000 below).
  EXPECT_EQ(CostModel(two_group_hw()).collective_ns(send), 8819);
  // Without the two-rank one, the four-rank table: one point, 8K 9000 ns; above it the point's
  // time per byte, 9000 + 8K · 9000 / 8K.
  HardwareSpec hw = two_group_hw();
  std::erase_if(hw.collective_tables,
                [](const auto& t) { return t.collective == "send_recv" && t.ranks == 2; });
  EXPECT_EQ(CostModel(hw).collective_ns(send), 18000);
  // And the tables of the other sizes are found whatever the order they are given in.
  std::reverse(hw.collective_tables.begin(), hw.collective_tables.end());
  const CostModel reversed(hw);
  EXPECT_EQ(reversed.collective_ns(all_reduce(32 * kK, 2)), 20000);
  EXPECT_EQ(reversed.collective_ns(all_reduce(128 * kK, 4)), 42426);
}

// ---- calibrate --collectives-from F1 --collectives-from F2: merge_collectives ----------------

// A kernel refit (no collectives) the merge writes into.
CalibrationProfile refit() {
  const std::string text = kNcclProfile;
  CalibrationProfile p =
      parse_calibration_profile(text.substr(0, text.find("figures:")) +
                                    "figures: {interconnect_gbps: 100, allreduce_alpha_ns: 1}\n"
                                    "measurements: {\"kernel.x\": 3}\n",
                                "refit.yaml");
  p.header.command = "twinstep calibrate --fit-only";
  return p;
}

// A four-rank calibrate-nccl profile: its own figures, skew rows and curve, tables, fits.
const char* kFourRankProfile = R"(format: 1
name: h200-nccl4
base: h200
header: {command: calibrate-nccl four, commit: def, gpu: NVIDIA H200, driver: "570", date: d}
figures:
  interconnect_gbps: 300
  allreduce_alpha_ns: 11000
measurements:
  "nccl.ranks": 4
  "nccl.all_reduce.graph.16K.median_ns": 15000
  "nccl.all_reduce.graph.16K.p90_ns": 16000
  "nccl.all_reduce.graph.1M.median_ns": 120000
  "nccl.all_to_all.eager.8K.median_ns": 40000
  "nccl.fit.all_reduce.graph.alpha_ns": 12000
  "nccl.profile.interconnect_gbps": 300
  "nccl.skew.all_reduce.graph.8K.delay1000.total_ns": 9000
collective_skew:
  ranks: 4
  all_reduce: {graph: [[0, 0], [1000, 700]]}
)";

double measurement(const CalibrationProfile& p, const std::string& key) {
  for (const auto& [k, v] : p.measurements) {
    if (k == key) return v;
  }
  ADD_FAILURE() << "no measurement " << key;
  return -1;
}
bool has_measurement(const CalibrationProfile& p, const std::string& key) {
  return std::any_of(p.measurements.begin(), p.measurements.end(),
                     [&](const auto& kv) { return kv.first == key; });
}
std::string merge_error(const std::vector<std::string>& texts) {
  std::vector<CalibrationProfile> from;
  std::vector<std::string> sources;
  for (size_t i = 0; i < texts.size(); ++i) {
    sources.push_back("f" + std::to_string(i + 1) + ".yaml");
    from.push_back(parse_calibration_profile(texts[i], sources.back()));
  }
  CalibrationProfile into = refit();
  try {
    merge_collectives(into, from, sources);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(MergeCollectives, FirstProfileWholeFurtherOnesTheirTablesAsGroups) {
  const std::string two =
      std::string(kNcclProfile) + "collective_skew:\n  ranks: 2\n  all_reduce: {graph: [[0, 0]]}\n";
  CalibrationProfile into = refit();
  merge_collectives(into,
                    {parse_calibration_profile(two, "a.yaml"),
                     parse_calibration_profile(kFourRankProfile, "b.yaml")},
                    {"a.yaml", "b.yaml"});
  // The first's figures and skew curve; the second's are not carried.
  EXPECT_EQ(into.hw.interconnect_gbps, 256);
  EXPECT_EQ(into.hw.allreduce_alpha_ns, 8000);
  EXPECT_EQ(into.hw.p2p_alpha_ns, 7500);
  EXPECT_EQ(into.hw.collective_skew_ranks, 2);
  ASSERT_EQ(into.hw.collective_skew.size(), 1u);
  EXPECT_EQ(into.hw.collective_skew[0].points.size(), 1u);
  // The refit's own measurements stay; the first's nccl.* verbatim; the second's as r4.
  EXPECT_EQ(measurement(into, "kernel.x"), 3);
  EXPECT_EQ(measurement(into, "nccl.ranks"), 2);
  EXPECT_EQ(measurement(into, "nccl.all_reduce.graph.64K.median_ns"), 40000);
  EXPECT_EQ(measurement(into, "nccl.fit.all_reduce.graph.alpha_ns"), 8000);
  EXPECT_EQ(measurement(into, "nccl.r4.all_reduce.graph.16K.median_ns"), 15000);
  EXPECT_EQ(measurement(into, "nccl.r4.all_reduce.graph.16K.p90_ns"), 16000);
  EXPECT_EQ(measurement(into, "nccl.r4.all_to_all.eager.8K.median_ns"), 40000);
  EXPECT_EQ(measurement(into, "nccl.r4.fit.all_reduce.graph.alpha_ns"), 12000);
  EXPECT_EQ(measurement(into, "nccl.r4.profile.interconnect_gbps"), 300);
  EXPECT_FALSE(has_measurement(into, "nccl.r4.ranks"));
  EXPECT_FALSE(has_measurement(into, "nccl.r4.skew.all_reduce.graph.8K.delay1000.total_ns"));
  EXPECT_FALSE(has_measurement(into, "nccl.skew.all_reduce.graph.8K.delay1000.total_ns"));
  EXPECT_EQ(into.header.command,
            "twinstep calibrate --fit-only; collectives from a.yaml (twinstep calibrate-nccl); "
            "collectives from b.yaml (calibrate-nccl four)");
  // The tables: the first's four, then the second's two as four-rank ones.
  ASSERT_EQ(into.hw.collective_tables.size(), 6u);
  EXPECT_EQ(into.hw.collective_tables[4].ranks, 4);
  EXPECT_EQ(into.hw.collective_tables[5].collective, "all_to_all");

  // The written profile loads with both groups' tables, and prices each from its own.
  const CalibrationProfile q = parse_calibration_profile(write_calibration_profile(into), "m.yaml");
  ASSERT_EQ(q.hw.collective_tables.size(), 6u);
  for (size_t t = 0; t < 6; ++t) {
    EXPECT_EQ(q.hw.collective_tables[t].collective, into.hw.collective_tables[t].collective);
    EXPECT_EQ(q.hw.collective_tables[t].graph, into.hw.collective_tables[t].graph);
    EXPECT_EQ(q.hw.collective_tables[t].ranks, into.hw.collective_tables[t].ranks);
    EXPECT_EQ(q.hw.collective_tables[t].points.size(), into.hw.collective_tables[t].points.size());
  }
  const CostModel cost(q.hw);
  EXPECT_EQ(cost.collective_ns(all_reduce(32 * kK, 2)), 20000);
  EXPECT_EQ(cost.collective_ns(all_reduce(128 * kK, 4)), 42426);  // as in EachGroupSize...
  const KernelDesc a2a{"a2a", KernelClass::kCollective,  8 * kK, 8 * kK,
                       0,     CollectiveKind::kAllToAll, 4};
  EXPECT_EQ(cost.collective_ns(a2a, false), 40000);
  EXPECT_EQ(cost.collective_ns(a2a, true), 9000 + 24);  // no graph one: 9000 + 3/4 · 8K / 256
}

TEST(MergeCollectives, FurtherGroupsAlreadyInAProfileAreCarriedWhereTheirSizeIsFree) {
  // The four-rank profile already holds an r2 (the first's size: dropped) and an r8 table.
  const std::string four = std::string(kFourRankProfile)
                               .insert(std::string(kFourRankProfile).find("collective_skew:"),
                                       "  \"nccl.r2.all_reduce.graph.8K.median_ns\": 1\n"
                                       "  \"nccl.r8.all_reduce.graph.8K.median_ns\": 30000\n"
                                       "  \"nccl.r8.fit.all_reduce.graph.alpha_ns\": 29000\n"
                                       "  \"nccl.r8.skew.all_reduce.graph.8K.x_ns\": 5\n");
  CalibrationProfile into = refit();
  merge_collectives(
      into,
      {parse_calibration_profile(kNcclProfile, "a.yaml"), parse_calibration_profile(four, "b")},
      {"a.yaml", "b.yaml"});
  EXPECT_FALSE(has_measurement(into, "nccl.r2.all_reduce.graph.8K.median_ns"));
  EXPECT_EQ(measurement(into, "nccl.r8.all_reduce.graph.8K.median_ns"), 30000);
  EXPECT_EQ(measurement(into, "nccl.r8.fit.all_reduce.graph.alpha_ns"), 29000);
  EXPECT_FALSE(has_measurement(into, "nccl.r8.skew.all_reduce.graph.8K.x_ns"));
  const HardwareSpec hw = parse_calibration_profile(write_calibration_profile(into), "m.yaml").hw;
  ASSERT_EQ(hw.collective_tables.size(), 7u);  // 4 of two ranks, 2 of four, 1 of eight
  EXPECT_EQ(CostModel(hw).collective_ns(all_reduce(8 * kK, 2)), 10000);  // not the r2 point
  EXPECT_EQ(CostModel(hw).collective_ns(all_reduce(8 * kK, 8)), 30000);
  // A third profile measured on eight ranks: that size is the second's now.
  std::string eight = kFourRankProfile;
  eight = replace(eight, "\"nccl.ranks\": 4", "\"nccl.ranks\": 8");
  EXPECT_EQ(merge_error({kNcclProfile, four, eight}),
            "--collectives-from f3.yaml: its collectives were measured on 8 GPUs (nccl.ranks), "
            "as were those of f2.yaml: give one profile per group size");
}

TEST(MergeCollectives, RefusesRepeatedSizesAndProfilesWithoutTables) {
  std::string two_again = kFourRankProfile;
  two_again = replace(two_again, "\"nccl.ranks\": 4", "\"nccl.ranks\": 2");
  EXPECT_EQ(merge_error({kNcclProfile, two_again}),
            "--collectives-from f2.yaml: its collectives were measured on 2 GPUs (nccl.ranks), "
            "as were those of f1.yaml: give one profile per group size");
  EXPECT_EQ(merge_error({kNcclProfile, kFourRankProfile, kFourRankProfile}),
            "--collectives-from f3.yaml: its collectives were measured on 4 GPUs (nccl.ranks), "
            "as were those of f2.yaml: give one profile per group size");
  const std::string text = kNcclProfile;
  const std::string head = text.substr(0, text.find("measurements:"));
  const std::string no_nccl = head + "measurements: {\"kernel.y\": 1}\n";
  EXPECT_EQ(merge_error({no_nccl}),
            "--collectives-from f1.yaml: the profile holds no nccl.* measurements (run "
            "calibrate-nccl)");
  EXPECT_EQ(merge_error({kNcclProfile, no_nccl}),
            "--collectives-from f2.yaml: the profile holds no nccl.* measurements (run "
            "calibrate-nccl)");
  const std::string fits_only = head + "measurements: {\"nccl.ranks\": 4, \"nccl.fit.x\": 1}\n";
  EXPECT_EQ(merge_error({kNcclProfile, fits_only}),
            "--collectives-from f2.yaml: the profile holds no collective table of its own "
            "(nccl.ranks and nccl.COLLECTIVE.MODE.SIZE.median_ns); a further --collectives-from "
            "adds only its tables");
  // A group only reported in a further profile (fits, no table) takes its size too.
  const std::string r8_fits = std::string(kFourRankProfile)
                                  .insert(std::string(kFourRankProfile).find("collective_skew:"),
                                          "  \"nccl.r8.fit.all_reduce.graph.alpha_ns\": 1\n");
  std::string eight = kFourRankProfile;
  eight = replace(eight, "\"nccl.ranks\": 4", "\"nccl.ranks\": 8");
  EXPECT_EQ(merge_error({kNcclProfile, r8_fits, eight}),
            "--collectives-from f3.yaml: its collectives were measured on 8 GPUs (nccl.ranks), "
            "as were those of f2.yaml: give one profile per group size");
  // A key the group's prefix would make longer than a profile's keys may be (256).
  const std::string long_key = "nccl.fit." + std::string(246, 'x');
  EXPECT_EQ(merge_error({kNcclProfile, replace(kFourRankProfile,
                                               "nccl.fit.all_reduce.graph.alpha_ns", long_key)}),
            "--collectives-from f2.yaml: measurement " + long_key +
                " is too long to be written as nccl.r4.* (at most 256 characters)");
  // One profile: carried as before (the profile's collectives replaced, not added to).
  EXPECT_EQ(merge_error({kNcclProfile}), "(no error)");
}

// ---- end to end: profile file -> experiment -> simulated TP2 run ------------------------------

class NcclProfileDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("twinstep_nccl_profiles_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "h200-nccl.yaml") << kNcclProfile;
    ::setenv("TWINSTEP_PROFILES", dir_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("TWINSTEP_PROFILES");
    std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
};

const char* kTp2Experiment =
    "name: x\nmodel: tiny-llama\nhardware: h200-nccl\nlayout: {tp: 2}\n"
    "workload: {input_len: 16, output_len: 8, requests: 1}\n";

// Rank 0's steps of a TP2 tiny-llama run, one DecodeLoop per rank, zero host costs (the ranks
// stay in step, so a step's collective_ns is the sum of its collectives' prices).
std::vector<StepSample> simulate_tp2(const HardwareSpec& hw, const WorkloadSpec& w,
                                     const PolicySpec& policy = PolicySpec{}) {
  const LayoutSpec layout = parse_layout("TP2");
  const std::vector<RequestSpec> requests = generate_requests(w);
  RunRecord record, shadow;
  DecodeLoop rank0(policy, w, requests, &record);
  DecodeLoop rank1(policy, w, requests, &shadow);
  HostProgram* ranks[] = {&rank0, &rank1};
  HostCostModel host(testing::fixed_host_costs(0, 0, 0), 1);
  SimOptions options;
  options.layout = layout;
  SimBackend backend(model_preset("tiny-llama"), hw, host, requests, options);
  backend.run(ranks, record);
  std::vector<StepSample> out;
  for (const StepSample& s : record.steps) {
    if (s.rank == 0) out.push_back(s);
  }
  return out;
}

TEST_F(NcclProfileDir, Tp2DecodePricesAllReducesFromTheGraphTablePrefillFromTheEager) {
  const Experiment e = load_experiment_text(kTp2Experiment, "exp.yaml");
  ASSERT_EQ(e.variants.size(), 1u);
  const HardwareSpec& hw = e.variants[0].hardware;
  ASSERT_EQ(hw.collective_tables.size(), 4u);
  ASSERT_EQ(hw.collective_tables[0].ranks, 2);
  // Per step on a rank of TP2 tiny-llama (hidden 256): the embedding all-reduce, two per layer
  // (2 layers), and the argmax all-gather of 16 B. Decode, 1 token: 512 B all-reduces, below
  // the graph table: 10000 each; the all-gather below its graph table: 6000. Prefill, 16 tokens
  // (eager): 8K all-reduces, below the eager table: 90000 each; the all-gather has no eager
  // table: 8000 + 1/2 · 16 / 256 = 8000.
  const int64_t decode_ns = 5 * 10000 + 6000;
  const int64_t prefill_ns = 5 * 90000 + 8000;
  // The same without the tables: all-reduces 8000 + 512 / 256 (decode), 8000 + 8192 / 256.
  const int64_t decode_ab_ns = 5 * 8002 + 8000;
  const int64_t prefill_ab_ns = 5 * 8032 + 8000;
  HardwareSpec no_table = hw;
  no_table.collective_tables.clear();
  struct Case {
    const HardwareSpec* hw;
    int64_t want_decode, want_prefill;
  };
  for (const auto& [spec, want_decode, want_prefill] :
       {Case{&hw, decode_ns, prefill_ns}, Case{&no_table, decode_ab_ns, prefill_ab_ns}}) {
    int decode = 0, prefill = 0;
    for (const StepSample& s : simulate_tp2(*spec, e.variants[0].workload)) {
      if (s.prefills == 1 && s.batch == 0) {
        EXPECT_EQ(s.collective_ns, want_prefill) << "step " << s.step;
        ++prefill;
      } else if (s.prefills == 0 && s.batch == 1) {
        EXPECT_EQ(s.collective_ns, want_decode) << "step " << s.step;
        ++decode;
      }
    }
    EXPECT_EQ(prefill, 1);
    EXPECT_GE(decode, 5);
  }
}

// The first node after a collective (HardwareSpec::*_break_gap_by_rows): its mode's node gap
// plus the shard's break gap where the profile has one, else max(gap, graph_node_gap_ns). A TP2
// tiny-llama decode step resumes after 5 all-reduces (the embedding's and two per layer; the
// argmax all-gather ends the launch), so its GPU busy time moves by 5 x the change of that gap.
TEST_F(NcclProfileDir, TheNodeAfterACollectiveTakesTheBreakGap) {
  const Experiment e = load_experiment_text(kTp2Experiment, "exp.yaml");
  HardwareSpec hw = e.variants[0].hardware;
  hw.graph_node_gap_ns = 500;
  hw.pdl_node_gap_by_rows = {{"tiny-llama@tp2", 1, -300}};
  auto busy = [&](const HardwareSpec& h, GraphMode mode) {
    PolicySpec policy;
    policy.graph_mode = mode;
    std::vector<int64_t> out;
    for (const StepSample& s : simulate_tp2(h, e.variants[0].workload, policy)) {
      if (s.prefills == 0 && s.batch == 1) out.push_back(s.gpu_busy_ns);
    }
    return out;
  };
  struct Case {
    GraphMode mode;
    std::vector<HardwareSpec::NodeGap> HardwareSpec::*table;
    int64_t gap_ns;  // the mode's node gap: PDL -300 (by rows), graph 500 (the figure)
  };
  for (const Case& c : {Case{GraphMode::kCudaGraphPdl, &HardwareSpec::pdl_break_gap_by_rows, -300},
                        Case{GraphMode::kCudaGraph, &HardwareSpec::graph_break_gap_by_rows, 500}}) {
    SCOPED_TRACE(graph_mode_name(c.mode));
    HardwareSpec with = hw;
    (with.*c.table) = {{"tiny-llama@tp2", 1, 1700}};
    HardwareSpec other = hw;  // another shard's entry: this one keeps the old rule
    (other.*c.table) = {{"tiny-llama@tp4", 1, 1700}};
    const std::vector<int64_t> base = busy(hw, c.mode), broken = busy(with, c.mode),
                               unrelated = busy(other, c.mode);
    ASSERT_GE(base.size(), 5u);
    ASSERT_EQ(broken.size(), base.size());
    const int64_t before = std::max<int64_t>(c.gap_ns, 500), after = c.gap_ns + 1700;
    for (size_t i = 0; i < base.size(); ++i) {
      EXPECT_EQ(broken[i] - base[i], 5 * (after - before)) << "step " << i;
      EXPECT_EQ(unrelated[i], base[i]) << "step " << i;
    }
  }
  // Break gaps are keyed by the shard even where its node gaps are not measured (the PDL gap is
  // then the figure, 200): 5 x ((200 + 1700) - max(200, 500)).
  HardwareSpec figure = hw;
  figure.pdl_node_gap_by_rows.clear();
  figure.pdl_node_gap_ns = 200;
  HardwareSpec figure_broken = figure;
  figure_broken.pdl_break_gap_by_rows = {{"tiny-llama@tp2", 1, 1700}};
  const std::vector<int64_t> a = busy(figure, GraphMode::kCudaGraphPdl),
                             b = busy(figure_broken, GraphMode::kCudaGraphPdl);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b[i] - a[i], 5 * (1900 - 500)) << "step " << i;
}

TEST_F(NcclProfileDir, OverridingTheLinkDropsTheTables) {
  const Experiment kept =
      load_experiment_text(replace(kTp2Experiment, "hardware: h200-nccl",
                                   "hardware: {preset: h200-nccl, host_wake_ns: 7}"),
                           "exp.yaml");
  EXPECT_EQ(kept.variants[0].hardware.collective_tables.size(), 4u);
  const Experiment dropped =
      load_experiment_text(replace(kTp2Experiment, "hardware: h200-nccl",
                                   "hardware: {preset: h200-nccl, interconnect_gbps: 512}"),
                           "exp.yaml");
  const HardwareSpec& hw = dropped.variants[0].hardware;
  EXPECT_TRUE(hw.collective_tables.empty());
  EXPECT_EQ(CostModel(hw).collective_ns(all_reduce(16 * kK)), 8000 + 32);  // 16K / 512
}

}  // namespace
}  // namespace twinstep
