#include "results/compare.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "policies/error.h"
#include "results/format.h"

namespace twinstep {
namespace {

RunInfo info(const std::string& name, const std::string& yaml, int32_t variant,
             const std::string& backend) {
  RunInfo i;
  i.experiment_name = name;
  i.yaml_text = yaml;
  i.variant_index = variant;
  i.variant_label = variant == 0 ? "lockstep" : "run_ahead";
  i.backend = backend;
  return i;
}

int64_t complete(ResultsDb& db, const RunInfo& i, std::vector<Metric> metrics) {
  const int64_t id = db.begin_run(i);
  db.finish_run(id, {}, metrics, 1);
  return id;
}

// Stores a simulated and a measured run of variant 0 of experiment "e" with these timelines; the
// operation-by-operation comparison of the pair.
QueryResult ops_of(ResultsDb& db, const RunRecord& sim_rec, const RunRecord& real_rec) {
  const int64_t sim = db.begin_run(info("e", "y", 0, "sim"));
  db.finish_run(sim, sim_rec, {}, 1);
  const int64_t real = db.begin_run(info("e", "y", 0, "real"));
  db.finish_run(real, real_rec, {}, 1);
  return sim_vs_real_ops(db, {sim, real});
}

// The rows of an ops table by operation name (column 2), and its numeric cells.
std::map<std::string, std::vector<Cell>> rows_by_op(const QueryResult& t) {
  std::map<std::string, std::vector<Cell>> by_op;
  for (const auto& row : t.rows) by_op[std::get<std::string>(row[2])] = row;
  return by_op;
}
double num(const Cell& c) { return std::get<double>(c); }
int64_t count(const Cell& c) { return std::get<int64_t>(c); }

TEST(Compare, OneColumnPerRunInTheFixedOrder) {
  auto db = ResultsDb::open(":memory:");
  const int64_t sim = complete(db, info("e", "y", 0, "sim"),
                               {{"tpot_ms_mean", 10.5, "ms"},
                                {"accept_len_mean", 2, "tokens/step"},
                                {"ttft_ms_mean", 100, "ms"}});
  const int64_t real = complete(db, info("e", "y", 0, "real"),
                                {{"ttft_ms_mean", 120, "ms"}, {"tpot_ms_mean", 11, "ms"}});
  const QueryResult t = compare_runs(db, {sim, real});
  EXPECT_EQ(t.columns,
            (std::vector<std::string>{"metric", "unit", "lockstep [sim]", "lockstep [real]"}));
  // Rows follow compare_metric_keys() (tpot before ttft before accept), keys no run has are
  // dropped, a metric only one run has is NULL for the other.
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_EQ(std::get<std::string>(t.rows[0][0]), "tpot_ms_mean");
  EXPECT_EQ(std::get<std::string>(t.rows[0][1]), "ms");
  EXPECT_EQ(std::get<double>(t.rows[0][2]), 10.5);
  EXPECT_EQ(std::get<double>(t.rows[0][3]), 11);
  EXPECT_EQ(std::get<std::string>(t.rows[1][0]), "ttft_ms_mean");
  EXPECT_EQ(std::get<std::string>(t.rows[2][0]), "accept_len_mean");
  EXPECT_EQ(std::get<std::string>(t.rows[2][1]), "tokens/step");
  EXPECT_TRUE(std::holds_alternative<std::monostate>(t.rows[2][3]));

  std::ostringstream out;
  write_table(t, out);
  EXPECT_EQ(out.str(),
            "metric           unit         lockstep [sim]  lockstep [real]\n"
            "---------------  -----------  --------------  ---------------\n"
            "tpot_ms_mean     ms                     10.5               11\n"
            "ttft_ms_mean     ms                      100              120\n"
            "accept_len_mean  tokens/step               2             NULL\n");
}

// sim_vs_real, hand-worked: the error of each key both runs of a variant have; each key it could
// not compare named with the run that lacks it (or a measured 0), never silently dropped.
TEST(Compare, SimVsRealNamesWhatItCouldNotCompare) {
  auto db = ResultsDb::open(":memory:");
  const int64_t sim = complete(db, info("e", "y", 0, "sim"),
                               {{"tpot_ms_mean", 10.5, "ms"}, {"gpu_busy_frac", 0.9, ""}});
  const int64_t real = complete(
      db, info("e", "y", 0, "real"),
      {{"tpot_ms_mean", 10.0, "ms"}, {"ttft_ms_mean", 120, "ms"}, {"gpu_busy_frac", 0.0, ""}});
  double worst = -1;
  std::vector<std::string> uncompared;
  const QueryResult t = sim_vs_real(
      db, {sim, real}, {"tpot_ms_mean", "ttft_ms_mean", "gpu_busy_frac", "step_ms_mean"}, &worst,
      &uncompared);
  ASSERT_EQ(t.rows.size(), 1u);
  EXPECT_EQ(std::get<std::string>(t.rows[0][1]), "tpot_ms_mean");
  EXPECT_DOUBLE_EQ(std::get<double>(t.rows[0][4]), 5.0);  // 100 (10.5 - 10) / 10
  EXPECT_DOUBLE_EQ(worst, 5.0);
  const std::string s = std::to_string(sim);
  EXPECT_EQ(uncompared, (std::vector<std::string>{
                            "lockstep: ttft_ms_mean (absent from the simulated run " + s + ")",
                            "lockstep: gpu_busy_frac (measured 0)",
                            "lockstep: step_ms_mean (absent from the simulated run " + s + ")"}));
  // A lone run pairs with nothing: nothing compared, nothing listed (the caller's error).
  uncompared.clear();
  EXPECT_TRUE(sim_vs_real(db, {sim}, {"tpot_ms_mean"}, nullptr, &uncompared).rows.empty());
  EXPECT_TRUE(uncompared.empty());
  // Beside a paired variant, a variant with one backend only is named.
  const int64_t other = complete(db, info("e", "y", 1, "real"), {{"tpot_ms_mean", 9.0, "ms"}});
  uncompared.clear();
  EXPECT_EQ(sim_vs_real(db, {sim, real, other}, {"tpot_ms_mean"}, nullptr, &uncompared).rows.size(),
            1u);
  EXPECT_EQ(uncompared, (std::vector<std::string>{"run_ahead: no simulated run among these runs"}));
}

// Transposed for many runs: a row per run, a column per swept parameter (JSON booleans as
// true / false, a run without the parameter NULL), then the backend and the metrics.
TEST(Compare, ByRunOneRowPerRunAndAColumnPerSweptParameter) {
  auto db = ResultsDb::open(":memory:");
  RunInfo a = info("e", "y", 0, "sim");
  a.variant_params = {{"policies.host_schedule", "lockstep"}, {"policies.seq_lens_sync", "true"}};
  RunInfo b = info("e", "y", 1, "real");
  b.variant_params = {{"policies.host_schedule", "runahead"}, {"workload.concurrency", "8"}};
  const int64_t ia = complete(db, a, {{"tpot_ms_mean", 10.5, "ms"}, {"gpu_busy_frac", 0.8, ""}});
  const int64_t ib = complete(db, b, {{"tpot_ms_mean", 9.0, "ms"}});
  const QueryResult t = compare_runs_by_run(db, {ib, ia});
  EXPECT_EQ(t.columns, (std::vector<std::string>{"run", "policies.host_schedule",
                                                 "workload.concurrency", "policies.seq_lens_sync",
                                                 "backend", "tpot_ms_mean", "gpu_busy_frac"}));
  ASSERT_EQ(t.rows.size(), 2u);
  const std::vector<Cell> want_b = {
      Cell(ib), Cell("runahead"), Cell(int64_t{8}), Cell(), Cell("real"), Cell(9.0), Cell()};
  const std::vector<Cell> want_a = {Cell(ia),    Cell("lockstep"), Cell(),   Cell("true"),
                                    Cell("sim"), Cell(10.5),       Cell(0.8)};
  EXPECT_EQ(t.rows[0], want_b);
  EXPECT_EQ(t.rows[1], want_a);
  EXPECT_THROW(compare_runs_by_run(db, {ia, 999}), Error);
}

TEST(Compare, DuplicateHeadersGetRunIdsAndUnknownRunsFail) {
  auto db = ResultsDb::open(":memory:");
  const int64_t a = complete(db, info("e", "y", 0, "sim"), {{"tpot_ms_mean", 1, "ms"}});
  const int64_t b = complete(db, info("e", "y", 0, "sim"), {{"tpot_ms_mean", 2, "ms"}});
  const QueryResult t = compare_runs(db, {a, b});
  EXPECT_EQ(t.columns[3], "lockstep [sim] #" + std::to_string(b));
  EXPECT_THROW(compare_runs(db, {a, 999}), Error);
}

TEST(Compare, LatestRunsOfExperiment) {
  auto db = ResultsDb::open(":memory:");
  // First invocation with YAML v1: variants 0 and 1 on sim.
  complete(db, info("e", "v1", 0, "sim"), {});
  complete(db, info("e", "v1", 1, "sim"), {});
  // Second invocation with edited YAML v2: variant 0 sim twice (the later wins), variant 0
  // real, variant 1 real fails, plus another experiment's run afterwards.
  complete(db, info("e", "v2", 0, "sim"), {});
  const int64_t v0_sim = complete(db, info("e", "v2", 0, "sim"), {});
  const int64_t v0_real = complete(db, info("e", "v2", 0, "real"), {});
  const int64_t v1_sim = complete(db, info("e", "v2", 1, "sim"), {});
  const int64_t failed = db.begin_run(info("e", "v2", 1, "real"));
  db.fail_run(failed, "failed", "boom");
  complete(db, info("other", "v2", 0, "sim"), {});
  EXPECT_EQ(latest_runs_of_experiment(db, "e"), (std::vector<int64_t>{v0_sim, v0_real, v1_sim}));
  EXPECT_THROW(latest_runs_of_experiment(db, "nope"), Error);
}

// Hand-worked: step 5 is in both timelines, step 6 only in the simulated one (ignored).
TEST(Compare, OperationsMatchByStepLaneNameAndOccurrence) {
  auto db = ResultsDb::open(":memory:");
  RunRecord sim_rec;
  sim_rec.timeline = {{0, Lane::kHost, "launch_graph", 5, 0, 10, 1},
                      {0, Lane::kCompute, "qkv", 5, 20, 100, 1},
                      {0, Lane::kCompute, "qkv", 5, 130, 50, 0},
                      {0, Lane::kCompute, "attn", 5, 200, 40, 0},
                      {0, Lane::kCompute, "qkv", 6, 1000, 9, 0}};
  RunRecord real_rec;
  real_rec.timeline = {{0, Lane::kCompute, "qkv", 5, 1140, 40, 0},  // stored out of start order
                       {0, Lane::kHost, "launch_graph", 5, 1000, 30, 1},
                       {0, Lane::kCompute, "qkv", 5, 1010, 110, 1},
                       {0, Lane::kCompute, "o_proj", 5, 1200, 20, 0}};
  const QueryResult t = ops_of(db, sim_rec, real_rec);
  ASSERT_EQ(t.rows.size(), 4u);
  // qkv: durations 100/110 and 50/40 -> means 75 = 75, |err| 10 ns each; starts relative to the
  // step anchors (sim 0, real 1000): 20 vs 10 and 130 vs 140 -> 10 ns each.
  EXPECT_EQ(std::get<std::string>(t.rows[0][2]), "qkv");
  EXPECT_EQ(std::get<std::string>(t.rows[0][1]), "compute");
  EXPECT_EQ(count(t.rows[0][3]), 2);
  EXPECT_DOUBLE_EQ(num(t.rows[0][4]), 0.075);
  EXPECT_DOUBLE_EQ(num(t.rows[0][5]), 0.075);
  EXPECT_DOUBLE_EQ(num(t.rows[0][6]), 0.0);
  EXPECT_DOUBLE_EQ(num(t.rows[0][7]), 0.010);
  EXPECT_DOUBLE_EQ(num(t.rows[0][8]), 0.010);
  EXPECT_EQ(count(t.rows[0][9]), 0);
  EXPECT_EQ(count(t.rows[0][10]), 0);
  // qkv's slots (start to the next compute span's start): sim 130 - 20 = 110 and 200 - 130 = 70,
  // real 1140 - 1010 = 130 and 1200 - 1140 = 60 -> means 90 vs 95, -5.26 %.
  EXPECT_DOUBLE_EQ(num(t.rows[0][11]), 0.090);
  EXPECT_DOUBLE_EQ(num(t.rows[0][12]), 0.095);
  EXPECT_NEAR(num(t.rows[0][13]), -100.0 / 19, 1e-9);
  // launch_graph: 10 vs 30 ns -> -66.67 %, both at their step's anchor; a host span's slot is its
  // duration.
  EXPECT_EQ(std::get<std::string>(t.rows[1][2]), "launch_graph");
  EXPECT_NEAR(num(t.rows[1][6]), -200.0 / 3, 1e-9);
  EXPECT_DOUBLE_EQ(num(t.rows[1][11]), 0.010);
  EXPECT_DOUBLE_EQ(num(t.rows[1][12]), 0.030);
  EXPECT_DOUBLE_EQ(num(t.rows[1][7]), 0.020);
  EXPECT_DOUBLE_EQ(num(t.rows[1][8]), 0.0);
  // attn only simulated, o_proj only measured: no durations, one unmatched span each.
  EXPECT_EQ(std::get<std::string>(t.rows[2][2]), "attn");
  EXPECT_EQ(count(t.rows[2][3]), 0);
  EXPECT_TRUE(std::holds_alternative<std::monostate>(t.rows[2][4]));
  EXPECT_TRUE(std::holds_alternative<std::monostate>(t.rows[2][6]));
  EXPECT_EQ(count(t.rows[2][9]), 1);
  EXPECT_EQ(count(t.rows[2][10]), 0);
  EXPECT_EQ(std::get<std::string>(t.rows[3][2]), "o_proj");
  EXPECT_EQ(count(t.rows[3][9]), 0);
  EXPECT_EQ(count(t.rows[3][10]), 1);
  // A variant without a real run gives no rows.
  auto lone_db = ResultsDb::open(":memory:");
  const int64_t lone = lone_db.begin_run(info("e", "y", 0, "sim"));
  lone_db.finish_run(lone, sim_rec, {}, 1);
  EXPECT_TRUE(sim_vs_real_ops(lone_db, {lone}).rows.empty());
}

// Collective waits, by hand. Two ranks, traced step 5 on both runs (step 6 only simulated).
// Simulated: attn_all_reduce 10 (rank 0) / 4 (rank 1) ns, then moe_all_reduce 3 / 9 and 5 / 5;
// measured: attn 6 / 7, moe 20 / 8 and 4 / 12. The shortest span of an instance is its cost, the
// rest of each rank's span its wait: sim rank 0 waits 6 + 0 + 0, rank 1 0 + 6 + 0; real rank 0
// 0 + 12 + 0, rank 1 1 + 0 + 8. A qkv span (compute) and an embedding_ids_gather on rank 0 only
// (no instance on every rank) give nothing. One traced step in common: waits per step in µs.
TEST(Compare, CollectiveWaitsAreSpansLessTheGroupsShortest) {
  auto db = ResultsDb::open(":memory:");
  RunRecord sim_rec;
  sim_rec.timeline = {{0, Lane::kCompute, "qkv", 5, 0, 50, 0},
                      {0, Lane::kCompute, "attn_all_reduce", 5, 100, 10, 0},
                      {1, Lane::kCompute, "attn_all_reduce", 5, 106, 4, 0},
                      {0, Lane::kCompute, "moe_all_reduce", 5, 200, 3, 0},
                      {1, Lane::kCompute, "moe_all_reduce", 5, 194, 9, 0},
                      {0, Lane::kCompute, "moe_all_reduce", 5, 300, 5, 0},
                      {1, Lane::kCompute, "moe_all_reduce", 5, 300, 5, 0},
                      {0, Lane::kCompute, "embedding_ids_gather", 5, 400, 7, 0},
                      {0, Lane::kCompute, "attn_all_reduce", 6, 1000, 99, 0},
                      {1, Lane::kCompute, "attn_all_reduce", 6, 1000, 1, 0}};
  RunRecord real_rec;
  real_rec.timeline = {{0, Lane::kCompute, "attn_all_reduce", 5, 100, 6, 0},
                       {1, Lane::kCompute, "attn_all_reduce", 5, 100, 7, 0},
                       {0, Lane::kCompute, "moe_all_reduce", 5, 200, 20, 0},
                       {1, Lane::kCompute, "moe_all_reduce", 5, 212, 8, 0},
                       {0, Lane::kCompute, "moe_all_reduce", 5, 300, 4, 0},
                       {1, Lane::kCompute, "moe_all_reduce", 5, 292, 12, 0}};
  const int64_t sim = db.begin_run(info("e", "y", 0, "sim"));
  db.finish_run(sim, sim_rec, {}, 1);
  const int64_t real = db.begin_run(info("e", "y", 0, "real"));
  db.finish_run(real, real_rec, {}, 1);
  const QueryResult t = sim_vs_real_collective_waits(db, {sim, real});
  ASSERT_EQ(t.rows.size(), 6u);  // per rank: moe, attn (by real wait), all
  auto row = [&](size_t i, int64_t rank, const char* op, int64_t instances, double sim_wait,
                 double real_wait, double sim_span, double real_span) {
    EXPECT_EQ(count(t.rows[i][1]), rank) << i;
    EXPECT_EQ(std::get<std::string>(t.rows[i][2]), op) << i;
    EXPECT_EQ(count(t.rows[i][3]), instances) << i;
    EXPECT_DOUBLE_EQ(num(t.rows[i][4]), sim_wait) << i;
    EXPECT_DOUBLE_EQ(num(t.rows[i][5]), real_wait) << i;
    EXPECT_DOUBLE_EQ(num(t.rows[i][6]), sim_span) << i;
    EXPECT_DOUBLE_EQ(num(t.rows[i][7]), real_span) << i;
  };
  row(0, 0, "moe_all_reduce", 2, 0.0, 0.012, 0.004, 0.012);
  row(1, 0, "attn_all_reduce", 1, 0.006, 0.0, 0.010, 0.006);
  row(2, 0, "all", 3, 0.006, 0.012, 0.018 / 3, 0.030 / 3);
  row(3, 1, "moe_all_reduce", 2, 0.006, 0.008, 0.007, 0.010);
  row(4, 1, "attn_all_reduce", 1, 0.0, 0.001, 0.004, 0.007);
  row(5, 1, "all", 3, 0.006, 0.009, 0.018 / 3, 0.027 / 3);
  // One rank: no rows.
  RunRecord one_rank;
  one_rank.timeline = {{0, Lane::kCompute, "attn_all_reduce", 5, 100, 6, 0}};
  auto lone_db = ResultsDb::open(":memory:");
  const int64_t a = lone_db.begin_run(info("e", "y", 0, "sim"));
  lone_db.finish_run(a, one_rank, {}, 1);
  const int64_t b = lone_db.begin_run(info("e", "y", 0, "real"));
  lone_db.finish_run(b, one_rank, {}, 1);
  EXPECT_TRUE(sim_vs_real_collective_waits(lone_db, {a, b}).rows.empty());
}

// Hand-worked: the simulator lists rope, kv_append, gate_up_proj, swiglu and four MoE kernels
// where the runtime runs rope_kv_append, gate_up_swiglu and moe; consecutive kernels of one node
// fold into one span (first start to latest end) and match the runtime's node.
TEST(Compare, FusedRuntimeNodesMatchTheSimulatorsKernelRuns) {
  auto db = ResultsDb::open(":memory:");
  RunRecord sim_rec;
  sim_rec.timeline = {{0, Lane::kCompute, "rope", 1, 0, 10, 0},
                      {0, Lane::kCompute, "kv_append", 1, 10, 5, 0},
                      {0, Lane::kCompute, "attention", 1, 15, 20, 0},
                      {0, Lane::kCompute, "gate_up_proj", 1, 35, 100, 0},
                      {0, Lane::kCompute, "swiglu", 1, 130, 10, 0},  // overlaps: ends at 140
                      {0, Lane::kCompute, "moe_router", 1, 200, 5, 0},
                      {0, Lane::kCompute, "moe_gate_up", 1, 205, 60, 0},
                      {0, Lane::kCompute, "moe_down", 1, 265, 30, 0},
                      {0, Lane::kCompute, "moe_combine", 1, 295, 5, 0},
                      {0, Lane::kCompute, "rope", 1, 400, 10, 0},  // the next layer's rope alone
                      {0, Lane::kCompute, "kv_append", 1, 410, 6, 0}};
  RunRecord real_rec;
  real_rec.timeline = {{0, Lane::kCompute, "rope_kv_append", 1, 1000, 12, 0},
                       {0, Lane::kCompute, "attention", 1, 1012, 22, 0},
                       {0, Lane::kCompute, "gate_up_swiglu", 1, 1034, 95, 0},
                       {0, Lane::kCompute, "moe", 1, 1200, 110, 0},
                       {0, Lane::kCompute, "rope_kv_append", 1, 1400, 18, 0}};
  const QueryResult t = ops_of(db, sim_rec, real_rec);
  ASSERT_EQ(t.rows.size(), 4u);
  auto by_op = rows_by_op(t);
  // rope_kv_append: sim 15 and 16 ns, real 12 and 18 -> means 15.5 vs 15.
  ASSERT_TRUE(by_op.count("rope_kv_append"));
  EXPECT_EQ(count(by_op["rope_kv_append"][3]), 2);
  EXPECT_DOUBLE_EQ(num(by_op["rope_kv_append"][4]), 0.0155);
  EXPECT_DOUBLE_EQ(num(by_op["rope_kv_append"][5]), 0.015);
  // gate_up_swiglu: 35 .. 140 = 105 ns vs 95; moe: 200 .. 300 = 100 ns vs 110.
  EXPECT_DOUBLE_EQ(num(by_op["gate_up_swiglu"][4]), 0.105);
  EXPECT_DOUBLE_EQ(num(by_op["gate_up_swiglu"][5]), 0.095);
  EXPECT_DOUBLE_EQ(num(by_op["moe"][4]), 0.100);
  EXPECT_DOUBLE_EQ(num(by_op["moe"][5]), 0.110);
  for (const auto& [op, row] : by_op) {
    EXPECT_EQ(count(row[9]), 0) << op;  // nothing left unmatched on either side
    EXPECT_EQ(count(row[10]), 0) << op;
  }
}

// Hand-worked slots: the simulator's PDL overlap (a node starting before its predecessor ends)
// and gap, against the runtime's node spans inside a whole-graph span, which keeps its duration.
TEST(Compare, SlotsRunFromOneNodesStartToTheNext) {
  auto db = ResultsDb::open(":memory:");
  RunRecord sim_rec;  // norm 0..10, qkv 8..30 (overlap 2), attn 35..50 (gap 5), o 50..60
  sim_rec.timeline = {{0, Lane::kCompute, "decode_graph", 1, 0, 60, 0},
                      {0, Lane::kCompute, "attn_norm", 1, 0, 10, 0},
                      {0, Lane::kCompute, "qkv_proj", 1, 8, 22, 0},
                      {0, Lane::kCompute, "attention", 1, 35, 15, 0},
                      {0, Lane::kCompute, "o_proj", 1, 50, 10, 0}};
  RunRecord real_rec;  // decode_graph spans the step; its nodes back to back
  real_rec.timeline = {{0, Lane::kCompute, "decode_graph", 1, 1000, 70, 0},
                       {0, Lane::kCompute, "attn_norm", 1, 1000, 9, 0},
                       {0, Lane::kCompute, "qkv_proj", 1, 1009, 30, 0},
                       {0, Lane::kCompute, "attention", 1, 1039, 16, 0},
                       {0, Lane::kCompute, "o_proj", 1, 1055, 11, 0}};
  const QueryResult t = ops_of(db, sim_rec, real_rec);
  auto by_op = rows_by_op(t);
  // sim slots: norm 8, qkv 27, attn 15, o 10 (the last: its duration) = 60, the step's span.
  // real slots: norm 9, qkv 30, attn 16, o 11; decode_graph outlasts every later span on both
  // sides: its duration, 60 and 70.
  EXPECT_DOUBLE_EQ(num(by_op["attn_norm"][11]), 0.008);
  EXPECT_DOUBLE_EQ(num(by_op["attn_norm"][12]), 0.009);
  EXPECT_DOUBLE_EQ(num(by_op["qkv_proj"][11]), 0.027);
  EXPECT_DOUBLE_EQ(num(by_op["qkv_proj"][12]), 0.030);
  EXPECT_DOUBLE_EQ(num(by_op["qkv_proj"][4]), 0.022);  // the duration column is unchanged
  EXPECT_DOUBLE_EQ(num(by_op["attention"][11]), 0.015);
  EXPECT_DOUBLE_EQ(num(by_op["o_proj"][11]), 0.010);
  EXPECT_DOUBLE_EQ(num(by_op["o_proj"][12]), 0.011);
  EXPECT_DOUBLE_EQ(num(by_op["decode_graph"][11]), 0.060);
  EXPECT_DOUBLE_EQ(num(by_op["decode_graph"][12]), 0.070);
  double sim_sum = 0, real_sum = 0;
  for (const char* op : {"attn_norm", "qkv_proj", "attention", "o_proj"}) {
    sim_sum += num(by_op[op][11]);
    real_sum += num(by_op[op][12]);
  }
  EXPECT_DOUBLE_EQ(sim_sum, 0.060);   // sim step: 0 .. 60
  EXPECT_DOUBLE_EQ(real_sum, 0.066);  // real nodes: 1000 .. 1066
}

// A PDL overlap longer than a tiny kernel can start a node before its predecessor (the
// simulator's attention before its 1 ns rope): slots still run start to next start, each covered
// instant counted once, and add up to the step.
TEST(Compare, SlotsAddUpWhenANodeStartsBeforeItsPredecessor) {
  auto db = ResultsDb::open(":memory:");
  RunRecord sim_rec;  // qkv 0..10, attention 8..30, rope 9..10, o_proj 30..40
  sim_rec.timeline = {{0, Lane::kCompute, "qkv_proj", 1, 0, 10, 0},
                      {0, Lane::kCompute, "attention", 1, 8, 22, 0},
                      {0, Lane::kCompute, "rope_kv_append", 1, 9, 1, 0},
                      {0, Lane::kCompute, "o_proj", 1, 30, 10, 0}};
  RunRecord real_rec;
  real_rec.timeline = {{0, Lane::kCompute, "qkv_proj", 1, 100, 10, 0},
                       {0, Lane::kCompute, "rope_kv_append", 1, 110, 2, 0},
                       {0, Lane::kCompute, "attention", 1, 112, 20, 0},
                       {0, Lane::kCompute, "o_proj", 1, 132, 10, 0}};
  const QueryResult t = ops_of(db, sim_rec, real_rec);
  std::map<std::string, double> sim_slot;
  for (const auto& row : t.rows)
    sim_slot[std::get<std::string>(row[2])] = std::get<double>(row[11]);
  EXPECT_DOUBLE_EQ(sim_slot["qkv_proj"], 0.008);
  EXPECT_DOUBLE_EQ(sim_slot["attention"], 0.001);       // 8 .. 9: the rope starts next
  EXPECT_DOUBLE_EQ(sim_slot["rope_kv_append"], 0.021);  // 9 .. 30
  EXPECT_DOUBLE_EQ(sim_slot["o_proj"], 0.010);
  EXPECT_DOUBLE_EQ(sim_slot["qkv_proj"] + sim_slot["attention"] + sim_slot["rope_kv_append"] +
                       sim_slot["o_proj"],
                   0.040);
}

}  // namespace
}  // namespace twinstep
