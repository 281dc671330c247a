// Fuzz target: a measured record (results/<gpu>/*.json) -> import_record (experiments/import.h)
// into a fresh in-memory database, as runs of a fixed experiment whose variants the repo's
// decode records match. Contract: import either stores one complete real run per matched
// variant, its metrics the row's numbers (count and values checked here), and reports every
// other variant as unmatched, or throws twinstep::Error and writes nothing; importing the same
// record again is refused and writes nothing.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "experiments/experiment.h"
#include "experiments/import.h"
#include "fuzz/fuzz_util.h"
#include "policies/error.h"
#include "results/db.h"
#include "runtime/json_lite.h"

namespace {

void require(bool ok, const std::string& what) { twinstep::fuzz::require(ok, "fuzz_import", what); }

// The variants of experiments/validation/h200_decode.yaml, which results/h200/decode.json's rows
// match, plus a concurrency sweep (rows with "batch" or "concurrency" > 1).
constexpr const char* kExperiment = R"(name: fuzz-import
seed: 1
backends: [sim, real]
model: llama-3-8b
hardware: h200
workload: {input_len: 128, output_len: 257, requests: 4, concurrency: 1}
sweep:
  workload.input_len: [128, 8192]
  workload.concurrency: [1, 4]
  cases:
    - {name: runahead_graph_pdl, policies.host_schedule: runahead, policies.graph_mode: cuda_graph_pdl}
    - {name: lockstep_eager, policies.host_schedule: lockstep, policies.graph_mode: eager}
)";

const twinstep::Experiment& experiment() {
  static const twinstep::Experiment e = twinstep::load_experiment_text(kExperiment, "fuzz.yaml");
  return e;
}

int64_t count(twinstep::ResultsDb& db, const std::string& sql) {
  return std::get<int64_t>(db.query(sql).rows.at(0).at(0));
}

twinstep::fuzz::ScratchDir& scratch() {
  static twinstep::fuzz::ScratchDir dir("fuzz_import");
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const twinstep::Experiment& e = experiment();
  const std::string path =
      scratch().write("record.json", {reinterpret_cast<const char*>(data), size});
  twinstep::ResultsDb db = twinstep::ResultsDb::open(":memory:");

  std::vector<std::string> unmatched;
  std::vector<twinstep::ImportedRun> runs;
  try {
    runs = twinstep::import_record(db, path, e, &unmatched);
  } catch (const twinstep::Error&) {
    require(count(db, "SELECT count(*) FROM run") == 0, "a refused record writes no run");
    require(count(db, "SELECT count(*) FROM metric") == 0, "a refused record writes no metric");
    return 0;
  }
  require(runs.size() + unmatched.size() == e.variants.size(),
          "every variant is stored or reported unmatched");
  require(count(db, "SELECT count(*) FROM run WHERE backend = 'real' AND status = 'complete'") ==
              int64_t(runs.size()),
          "one complete real run per match, nothing else");
  // An accepted record is a JSON object with a "rows" array of objects (import.h).
  const twinstep::JsonValue doc =
      twinstep::parse_json(std::string_view(reinterpret_cast<const char*>(data), size));
  const std::set<std::string> config_keys = {"prompt_tokens", "decode_tokens", "output_tokens",
                                             "concurrency", "batch"};
  std::set<int32_t> seen;
  for (const twinstep::ImportedRun& r : runs) {
    require(seen.insert(r.variant_index).second, "a variant is imported once");
    // One metric per number of the row that is not a configuration field.
    int64_t numbers = 0;
    for (const auto& [key, value] : doc.find("rows")->items.at(r.row).fields)
      numbers += value.kind == twinstep::JsonValue::Kind::kNumber && !config_keys.count(key);
    const twinstep::QueryResult m = db.query_params(
        "SELECT key, value FROM metric WHERE run_id = ?1", {twinstep::Cell(r.run_id)});
    require(int64_t(m.rows.size()) == numbers, "one metric per number of the row");
    for (const auto& row : m.rows) {
      require(std::isfinite(std::get<double>(row.at(1))), "metric values are finite");
    }
  }
  // The same record again: refused, nothing added (when it stored anything).
  if (!runs.empty()) {
    const int64_t before = count(db, "SELECT count(*) FROM run");
    try {
      twinstep::import_record(db, path, e, nullptr);
      require(false, "a second import of the same record is refused");
    } catch (const twinstep::Error&) {
    }
    require(count(db, "SELECT count(*) FROM run") == before, "a refused re-import writes nothing");
  }
  return 0;
}
