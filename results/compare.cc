#include "results/compare.h"

#include <cmath>
#include <map>
#include <set>

#include "policies/error.h"

namespace twinstep {

const std::vector<std::string>& compare_metric_keys() {
  static const std::vector<std::string> keys = {"tpot_ms_mean",
                                                "tpot_ms_p99",
                                                "itl_ms_p99",
                                                "ttft_ms_mean",
                                                "output_throughput_tok_s",
                                                "accept_len_mean",
                                                "step_time_estimate_ms",
                                                "step_ms_mean",
                                                "gpu_busy_frac",
                                                "idle_host_frac",
                                                "idle_launch_frac",
                                                "achieved_tbps",
                                                "pct_of_floor"};
  return keys;
}

QueryResult compare_runs(ResultsDb& db, const std::vector<int64_t>& run_ids,
                         const std::vector<std::string>& keys) {
  QueryResult out;
  out.columns = {"metric", "unit"};
  std::vector<std::map<std::string, double>> values;
  std::set<std::string> headers;
  for (int64_t id : run_ids) {
    const QueryResult run =
        db.query_params("SELECT variant_label, backend FROM run WHERE id = ?1", {id});
    if (run.rows.empty()) throw Error("no run with id " + std::to_string(id));
    std::string header = cell_text(run.rows[0][0], "run.variant_label") + " [" +
                         cell_text(run.rows[0][1], "run.backend") + "]";
    if (!headers.insert(header).second) {
      header += " #" + std::to_string(id);
      headers.insert(header);
    }
    out.columns.push_back(header);
    auto& m = values.emplace_back();
    const QueryResult rows =
        db.query_params("SELECT key, value FROM metric WHERE run_id = ?1", {id});
    for (const auto& row : rows.rows) {
      m[cell_text(row[0], "metric.key")] = cell_number(row[1], "metric.value");
    }
  }
  std::map<std::string, std::string> units;
  for (const MetricDef& def : metric_definitions()) units[def.key] = def.unit;
  for (const std::string& key : keys) {
    std::vector<Cell> row = {key, units.count(key) ? Cell(units[key]) : Cell()};
    bool any = false;
    for (const auto& m : values) {
      auto it = m.find(key);
      if (it == m.end()) {
        row.emplace_back();
      } else {
        row.emplace_back(it->second);
        any = true;
      }
    }
    if (any) out.rows.push_back(std::move(row));
  }
  return out;
}

std::vector<int64_t> latest_runs_of_experiment(ResultsDb& db, const std::string& name) {
  const QueryResult result = db.query_params(R"sql(
SELECT max(r.id) FROM run r
WHERE r.status = 'complete' AND r.experiment_id = (
  SELECT r2.experiment_id FROM run r2 JOIN experiment e ON e.id = r2.experiment_id
  WHERE e.name = ?1 AND r2.status = 'complete' ORDER BY r2.id DESC LIMIT 1)
GROUP BY r.variant_index, r.backend
ORDER BY r.variant_index, r.backend = 'real')sql",
                                             {name});
  if (result.rows.empty()) {
    throw Error("experiment \"" + name + "\" has no complete run in " + db.path());
  }
  std::vector<int64_t> ids;
  for (const auto& row : result.rows) ids.push_back(cell_int(row[0], "run.id"));
  return ids;
}

QueryResult sim_vs_real(ResultsDb& db, const std::vector<int64_t>& run_ids,
                        const std::vector<std::string>& keys, double* worst_abs_error_pct) {
  struct Pair {
    std::string label;
    int64_t sim = -1;
    int64_t real = -1;
  };
  std::map<int64_t, Pair> pairs;  // by variant index
  for (int64_t id : run_ids) {
    const QueryResult run = db.query_params(
        "SELECT variant_index, variant_label, backend FROM run WHERE id = ?1", {id});
    if (run.rows.empty()) throw Error("no run with id " + std::to_string(id));
    Pair& p = pairs[cell_int(run.rows[0][0], "run.variant_index")];
    p.label = cell_text(run.rows[0][1], "run.variant_label");
    (cell_text(run.rows[0][2], "run.backend") == "sim" ? p.sim : p.real) = id;
  }
  QueryResult out;
  out.columns = {"variant", "metric", "sim", "real", "error_pct"};
  double worst = 0;
  auto value = [&](int64_t run, const std::string& key, double* v) {
    const QueryResult r =
        db.query_params("SELECT value FROM metric WHERE run_id = ?1 AND key = ?2", {run, key});
    if (r.rows.empty()) return false;
    *v = cell_number(r.rows[0][0], "metric.value");
    return true;
  };
  for (const auto& [index, p] : pairs) {
    if (p.sim < 0 || p.real < 0) continue;
    for (const std::string& key : keys) {
      double s = 0, r = 0;
      if (!value(p.sim, key, &s) || !value(p.real, key, &r) || r == 0) continue;
      const double err = 100.0 * (s - r) / r;
      worst = std::max(worst, std::fabs(err));
      out.rows.push_back({p.label, key, s, r, err});
    }
  }
  if (worst_abs_error_pct) *worst_abs_error_pct = worst;
  return out;
}

}  // namespace twinstep
