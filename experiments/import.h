// Imports a measured record (results/<gpu>/*.json: command, commit, gpu, date, rows) into the
// results database as real-backend runs of an experiment, so measured reference runs line up
// with simulated runs of the same variants (`compare`, `plot`, `report`) on a machine with no GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "experiments/experiment.h"
#include "results/db.h"

namespace twinstep {

struct ImportedRun {
  int64_t run_id;
  int32_t variant_index;
  size_t row;
};

// Each variant of `experiment` takes the record row whose configuration fields all agree with it
// (prompt_tokens = input_len, decode_tokens + 1 or output_tokens = output_len, concurrency,
// host_schedule, graph_mode); the row's figures become the run's metrics (tpot_ms →
// tpot_ms_mean, ttft_ms → ttft_ms_mean, step_ms → step_ms_mean, gpu_busy_pct → gpu_busy_frac,
// every other number under its own name). Variants no row matches are reported, not stored.
// The run's build is the record's commit and its host GPU the record's gpu. Throws Error for a
// malformed record (naming the file and field) before anything is written; importing the same
// record into the same experiment twice is refused.
std::vector<ImportedRun> import_record(ResultsDb& db, const std::string& record_path,
                                       const Experiment& experiment,
                                       std::vector<std::string>* unmatched);

// import_record in two steps, so that every record of a command is read and checked before the
// database is opened (a refused command creates no file): read_record needs no database and
// throws what import_record throws for a malformed record; store_record writes its runs (and
// refuses a record imported before). `experiment` must outlive the plan.
struct RecordImport {
  std::string path, commit, gpu;
  std::vector<std::pair<const Variant*, size_t>> matches;  // variant, record row
  std::vector<std::vector<Metric>> metrics;                // per match
};
RecordImport read_record(const std::string& record_path, const Experiment& experiment,
                         std::vector<std::string>* unmatched);
std::vector<ImportedRun> store_record(ResultsDb& db, const RecordImport& record,
                                      const Experiment& experiment);

}  // namespace twinstep
