#include "experiments/import.h"

#include <fstream>
#include <set>
#include <sstream>

#include "policies/error.h"
#include "runtime/json_lite.h"

namespace twinstep {
namespace {

// The build row of an imported run: the record's commit, built by an unrecorded compiler.
constexpr const char* kImportedCompiler = "unknown (imported record)";

// Configuration fields a record row may carry, and whether a variant has that value.
bool row_matches(const JsonValue& row, const Variant& v) {
  const WorkloadSpec& w = v.workload;
  for (const auto& [key, value] : row.fields) {
    if (key == "prompt_tokens") {
      if (w.input_len.lo != w.input_len.hi || value.as_i64(key) != w.input_len.lo) return false;
    } else if (key == "decode_tokens") {
      // The first token comes from prefill: n decode steps deliver n + 1 tokens.
      if (w.output_len.lo != w.output_len.hi || value.as_i64(key) + 1 != w.output_len.lo) {
        return false;
      }
    } else if (key == "output_tokens") {
      if (w.output_len.lo != w.output_len.hi || value.as_i64(key) != w.output_len.lo) return false;
    } else if (key == "concurrency" || key == "batch") {
      if (value.as_i64(key) != w.max_concurrency) return false;
    } else if (key == "host_schedule") {
      if (value.as_string(key) != host_schedule_name(v.policy.host_schedule)) return false;
    } else if (key == "graph_mode") {
      if (value.as_string(key) != graph_mode_name(v.policy.graph_mode)) return false;
    }
  }
  return true;
}

std::string unit_of(const std::string& key) {
  const auto ends = [&](const char* suffix) {
    const std::string s(suffix);
    return key.size() >= s.size() && key.compare(key.size() - s.size(), s.size(), s) == 0;
  };
  if (ends("_ms") || ends("_ms_mean") || key.find("_ms_") != std::string::npos) return "ms";
  if (ends("_us") || key.find("_us_") != std::string::npos) return "us";
  if (ends("_tbps")) return "TB/s";
  if (ends("_tok_s")) return "tok/s";
  if (ends("_pct") || key == "pct_of_floor") return "%";
  if (key.find("bytes") != std::string::npos) return "bytes";
  if (ends("_frac")) return "fraction";
  return "";
}

std::vector<Metric> row_metrics(const JsonValue& row) {
  std::vector<Metric> m;
  for (const auto& [key, value] : row.fields) {
    if (value.kind != JsonValue::Kind::kNumber) continue;
    if (key == "prompt_tokens" || key == "decode_tokens" || key == "output_tokens" ||
        key == "concurrency" || key == "batch") {
      continue;
    }
    const double x = value.as_double(key);
    if (key == "tpot_ms") {
      m.push_back({"tpot_ms_mean", x, "ms"});
    } else if (key == "ttft_ms") {
      m.push_back({"ttft_ms_mean", x, "ms"});
    } else if (key == "step_ms") {
      m.push_back({"step_ms_mean", x, "ms"});
    } else if (key == "gpu_busy_pct") {
      m.push_back({"gpu_busy_frac", x / 100.0, "fraction"});
    } else {
      m.push_back({key, x, unit_of(key)});
    }
  }
  return m;
}

}  // namespace

RecordImport read_record(const std::string& path, const Experiment& e,
                         std::vector<std::string>* unmatched) {
  RecordImport plan;
  plan.path = path;
  std::ifstream in(path);
  if (!in) throw Error("cannot read record " + path);
  std::stringstream text;
  text << in.rdbuf();
  JsonValue doc;
  try {
    doc = parse_json(text.str());
  } catch (const JsonError& err) {
    throw Error("record " + path + ": " + err.what());
  }
  std::string& commit = plan.commit;
  std::string& gpu = plan.gpu;
  const JsonValue* rows = nullptr;
  try {
    if (doc.kind != JsonValue::Kind::kObject) throw JsonError("the record is not a JSON object");
    for (const char* key : {"command", "commit", "gpu", "date", "rows"}) {
      if (doc.find(key) == nullptr) throw JsonError(std::string("missing field '") + key + "'");
    }
    commit = doc.find("commit")->as_string("commit");
    gpu = doc.find("gpu")->as_string("gpu");
    rows = doc.find("rows");
    if (rows->kind != JsonValue::Kind::kArray) throw JsonError("'rows' is not a list");
    for (const JsonValue& r : rows->items) {
      if (r.kind != JsonValue::Kind::kObject) throw JsonError("a row is not an object");
    }
  } catch (const JsonError& err) {
    throw Error("record " + path + ": " + err.what());
  }

  // Match every variant first, so a malformed row fails before anything is written.
  auto& matches = plan.matches;
  for (const Variant& v : e.variants) {
    size_t found = rows->items.size();
    for (size_t i = 0; i < rows->items.size(); ++i) {
      try {
        if (row_matches(rows->items[i], v)) {
          found = i;
          break;
        }
      } catch (const JsonError& err) {
        throw Error("record " + path + ", row " + std::to_string(i) + ": " + err.what());
      }
    }
    if (found == rows->items.size()) {
      if (unmatched) unmatched->push_back(v.label);
      continue;
    }
    matches.emplace_back(&v, found);
  }
  // Metrics of every match, also before anything is written: a number out of double range or
  // two fields that give one metric (tpot_ms and tpot_ms_mean) refuse the whole record.
  std::vector<std::vector<Metric>>& metrics = plan.metrics;
  for (const auto& [v, row] : matches) {
    const std::string where = "record " + path + ", row " + std::to_string(row) + ": ";
    try {
      metrics.push_back(row_metrics(rows->items[row]));
    } catch (const JsonError& err) {
      throw Error(where + err.what());
    }
    std::set<std::string> keys;
    for (const Metric& m : metrics.back()) {
      if (!keys.insert(m.key).second) throw Error(where + "two fields give metric '" + m.key + "'");
    }
  }
  return plan;
}

std::vector<ImportedRun> store_record(ResultsDb& db, const RecordImport& plan,
                                      const Experiment& e) {
  const std::string& path = plan.path;
  const std::string& commit = plan.commit;
  const std::string& gpu = plan.gpu;
  const auto& matches = plan.matches;
  const auto& metrics = plan.metrics;
  const bool dirty = commit.size() > 6 && commit.substr(commit.size() - 6) == "-dirty";
  const std::string sha = dirty ? commit.substr(0, commit.size() - 6) : commit;
  const QueryResult already = db.query_params(
      "SELECT count(*) FROM run r JOIN experiment x ON x.id = r.experiment_id "
      "JOIN build b ON b.id = r.build_id JOIN host h ON h.id = r.host_id "
      "WHERE x.name = ?1 AND r.backend = 'real' AND r.status = 'complete' AND b.git_sha = ?2 "
      "AND b.compiler = ?3 AND h.gpu_name IS ?4",
      {Cell(e.name), Cell(sha), Cell(std::string(kImportedCompiler)), Cell(gpu)});
  if (!already.rows.empty() && std::get<int64_t>(already.rows[0][0]) > 0) {
    throw Error("record " + path + " (commit " + commit + ") is already imported into experiment " +
                e.name);
  }

  const BuildInfo build{sha, dirty, kImportedCompiler, "unknown", "unknown", "unknown"};
  std::vector<ImportedRun> out;
  for (size_t i = 0; i < matches.size(); ++i) {
    const auto& [v, row] = matches[i];
    RunInfo info;
    info.experiment_name = e.name;
    info.yaml_text = e.yaml_text;
    info.source_path = e.source_path;
    info.variant_index = v->index;
    info.variant_label = v->label;
    info.variant_params = v->params;
    info.backend = "real";
    info.seed = v->seed;
    info.gpu_name = gpu;
    info.build = &build;
    const int64_t id = db.begin_run(info);
    db.finish_run(id, RunRecord{}, metrics[i], 0.0);
    out.push_back({id, v->index, row});
  }
  return out;
}

std::vector<ImportedRun> import_record(ResultsDb& db, const std::string& path, const Experiment& e,
                                       std::vector<std::string>* unmatched) {
  return store_record(db, read_record(path, e, unmatched), e);
}

}  // namespace twinstep
