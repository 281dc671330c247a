#include "results/compare.h"

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
    std::string header =
        std::get<std::string>(run.rows[0][0]) + " [" + std::get<std::string>(run.rows[0][1]) + "]";
    if (!headers.insert(header).second) {
      header += " #" + std::to_string(id);
      headers.insert(header);
    }
    out.columns.push_back(header);
    auto& m = values.emplace_back();
    const QueryResult rows =
        db.query_params("SELECT key, value FROM metric WHERE run_id = ?1", {id});
    for (const auto& row : rows.rows) {
      m[std::get<std::string>(row[0])] = std::get<double>(row[1]);
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
  for (const auto& row : result.rows) ids.push_back(std::get<int64_t>(row[0]));
  return ids;
}

}  // namespace twinstep
