#include "results/compare.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace twinstep
