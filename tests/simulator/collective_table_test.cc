// Measured collective tables (HardwareSpec::collective_tables): read from a calibrated profile's
// nccl.*.median_ns measurements, priced by CostModel::collective_ns in log-log interpolation,
// and used by the simulator for TP collectives (graph table in decode, eager table in prefill).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

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
  EXPECT_EQ(hw.collective_table_ranks, 2);
  ASSERT_EQ(hw.collective_tables.size(), 4u);  // in order of first appearance
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
  EXPECT_EQ(hw.collective_table_ranks, 0);
  EXPECT_TRUE(hw.collective_tables.empty());
  EXPECT_EQ(hw.allreduce_alpha_ns, 8000);
}

TEST(CollectiveTable, SurvivesWriteAndParse) {
  const CalibrationProfile p = parse_calibration_profile(kNcclProfile, "p.yaml");
  const CalibrationProfile q = parse_calibration_profile(write_calibration_profile(p), "q.yaml");
  EXPECT_EQ(q.hw.collective_table_ranks, 2);
  ASSERT_EQ(q.hw.collective_tables.size(), p.hw.collective_tables.size());
  for (size_t t = 0; t < p.hw.collective_tables.size(); ++t) {
    const auto& a = p.hw.collective_tables[t];
    const auto& b = q.hw.collective_tables[t];
    EXPECT_EQ(a.collective, b.collective);
    EXPECT_EQ(a.graph, b.graph);
    ASSERT_EQ(a.points.size(), b.points.size());
    for (size_t i = 0; i < a.points.size(); ++i) {
      EXPECT_EQ(a.points[i].bytes, b.points[i].bytes);
      EXPECT_EQ(a.points[i].median_ns, b.points[i].median_ns);
    }
  }
}

TEST(CollectiveTable, MalformedEntriesSayWhereAndWhat) {
  // Line 12 is "nccl.all_reduce.graph.64K.median_ns": 40000; its value is at column 42.
  const std::string key = "\"nccl.all_reduce.graph.64K.median_ns\": 40000";
  EXPECT_EQ(error_of(replace(kNcclProfile, key, "\"nccl.all_reduse.graph.64K.median_ns\": 40000")),
            "p.yaml:12:42: measurements.nccl.all_reduse.graph.64K.median_ns: a collective time is "
            "nccl.COLLECTIVE.MODE.SIZE.median_ns, COLLECTIVE one of all_reduce, all_gather, "
            "all_to_all, send_recv, MODE eager or graph");
  EXPECT_EQ(error_of(replace(kNcclProfile, key, "\"nccl.all_reduce.pdl.64K.median_ns\": 40000")),
            "p.yaml:12:40: measurements.nccl.all_reduce.pdl.64K.median_ns: a collective time is "
            "nccl.COLLECTIVE.MODE.SIZE.median_ns, COLLECTIVE one of all_reduce, all_gather, "
            "all_to_all, send_recv, MODE eager or graph");
  EXPECT_EQ(error_of(replace(kNcclProfile, key, "\"nccl.all_reduce.graph.64Q.median_ns\": 40000")),
            "p.yaml:12:42: measurements.nccl.all_reduce.graph.64Q.median_ns: message size '64Q' "
            "must be a byte count in [1, 2^50]: digits, optionally followed by K, M or G (KiB, "
            "MiB, GiB), as in 8K or 256M");
  EXPECT_EQ(error_of(replace(kNcclProfile, key, "\"nccl.all_reduce.graph.64K.median_ns\": 0")),
            "p.yaml:12:42: measurements.nccl.all_reduce.graph.64K.median_ns = 0 is out of range "
            "(0, 1e+15]");
  EXPECT_EQ(error_of(replace(kNcclProfile, key, "\"nccl.all_reduce.graph.16384.median_ns\": 1")),
            "p.yaml:13:42: measurements.nccl.all_reduce.graph.16K.median_ns: a second time for "
            "all_reduce graph at 16384 bytes");
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
  hw.collective_table_ranks = 0;
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
std::vector<StepSample> simulate_tp2(const HardwareSpec& hw, const WorkloadSpec& w) {
  const LayoutSpec layout = parse_layout("TP2");
  const std::vector<RequestSpec> requests = generate_requests(w);
  RunRecord record, shadow;
  DecodeLoop rank0(PolicySpec{}, w, requests, &record);
  DecodeLoop rank1(PolicySpec{}, w, requests, &shadow);
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
  ASSERT_EQ(hw.collective_table_ranks, 2);
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

TEST_F(NcclProfileDir, OverridingTheLinkDropsTheTables) {
  const Experiment kept =
      load_experiment_text(replace(kTp2Experiment, "hardware: h200-nccl",
                                   "hardware: {preset: h200-nccl, host_wake_ns: 7}"),
                           "exp.yaml");
  EXPECT_EQ(kept.variants[0].hardware.collective_table_ranks, 2);
  EXPECT_EQ(kept.variants[0].hardware.collective_tables.size(), 4u);
  const Experiment dropped =
      load_experiment_text(replace(kTp2Experiment, "hardware: h200-nccl",
                                   "hardware: {preset: h200-nccl, interconnect_gbps: 512}"),
                           "exp.yaml");
  const HardwareSpec& hw = dropped.variants[0].hardware;
  EXPECT_EQ(hw.collective_table_ranks, 0);
  EXPECT_TRUE(hw.collective_tables.empty());
  EXPECT_EQ(CostModel(hw).collective_ns(all_reduce(16 * kK)), 8000 + 32);  // 16K / 512
}

}  // namespace
}  // namespace twinstep
