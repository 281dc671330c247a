#include "results/compare.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>

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
  const int64_t sim = db.begin_run(info("e", "y", 0, "sim"));
  db.finish_run(sim, sim_rec, {}, 1);
  const int64_t real = db.begin_run(info("e", "y", 0, "real"));
  db.finish_run(real, real_rec, {}, 1);

  const QueryResult t = sim_vs_real_ops(db, {sim, real});
  ASSERT_EQ(t.rows.size(), 4u);
  auto num = [](const Cell& c) { return std::get<double>(c); };
  auto count = [](const Cell& c) { return std::get<int64_t>(c); };
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
  // launch_graph: 10 vs 30 ns -> -66.67 %, both at their step's anchor.
  EXPECT_EQ(std::get<std::string>(t.rows[1][2]), "launch_graph");
  EXPECT_NEAR(num(t.rows[1][6]), -200.0 / 3, 1e-9);
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
  // A variant without a real run, or runs without timelines, give no rows.
  EXPECT_TRUE(sim_vs_real_ops(db, {sim}).rows.empty());
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
  const int64_t sim = db.begin_run(info("e", "y", 0, "sim"));
  db.finish_run(sim, sim_rec, {}, 1);
  const int64_t real = db.begin_run(info("e", "y", 0, "real"));
  db.finish_run(real, real_rec, {}, 1);

  const QueryResult t = sim_vs_real_ops(db, {sim, real});
  ASSERT_EQ(t.rows.size(), 4u);
  std::map<std::string, std::vector<Cell>> by_op;
  for (const auto& row : t.rows) by_op[std::get<std::string>(row[2])] = row;
  auto num = [](const Cell& c) { return std::get<double>(c); };
  auto count = [](const Cell& c) { return std::get<int64_t>(c); };
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

}  // namespace
}  // namespace twinstep
