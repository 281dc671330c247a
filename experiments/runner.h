// Runs an experiment: every variant on every backend, one database transaction per run.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "experiments/experiment.h"
#include "experiments/progress.h"
#include "policies/run_record.h"
#include "results/db.h"
#include "results/metrics.h"

namespace twinstep {

// Simulates one variant. A pure function of the variant (its seeds included): the same variant
// gives a byte-identical record.
RunRecord simulate_variant(const Variant& variant);

// True when this process can run the real backend (a CUDA device is visible); otherwise *why
// says what is missing. Defined by runtime/real_backend.cc, or by runner.cc in a build without
// the CUDA runtime (always false there).
bool real_backend_available(std::string* why);

// One finished unit of work (a variant on a backend), ready to store. `error` non-empty: the
// run failed and record/metrics are empty.
struct FinishedRun {
  int32_t variant_index = 0;
  BackendKind backend = BackendKind::kSim;
  RunRecord record;
  std::vector<Metric> metrics;
  double wall_s = 0;
  std::string error;
};

// Simulates `variant` on `backend` and computes its metrics; a simulation failure is returned
// in FinishedRun::error, never thrown. For tests, TWINSTEP_FAIL_VARIANT=<index> in the
// environment makes that variant fail.
FinishedRun execute_run(const Variant& variant, BackendKind backend);

// The database row describing `variant` of `experiment` on `backend`.
RunInfo make_run_info(const Experiment& experiment, const Variant& variant, BackendKind backend);

// Stores a finished run (begin_run + finish_run, or fail_run when it failed). Returns its id.
int64_t store_run(const Experiment& experiment, const FinishedRun& run, ResultsDb& db);

struct RunOutcome {
  int64_t run_id;
  int32_t variant_index;
  BackendKind backend;
};

// The backends of `experiment` this build and machine can run, in experiment order; the
// others are reported through `progress`. Throws Error if none can run.
std::vector<BackendKind> runnable_backends(const Experiment& experiment, Progress& progress);

// Runs each variant × backend and stores it. Checks `stop` between runs (set by SIGINT/SIGTERM):
// finished runs stay, the rest are not started. Backends this build or machine cannot run are
// reported through `progress` and skipped; an experiment naming only such backends throws
// Error before anything is written. A failing run is stored as 'failed' and throws Error.
// Runs each variant × backend, one transaction per run. With `resume`, the same experiment
// version (name + YAML hash) already in `db` is continued: its runs left 'running' by a killed
// process are marked 'interrupted', variant × backend pairs with a complete run are skipped
// (returned as outcomes all the same) and the rest are run — the database then holds what an
// uninterrupted run would have written.
std::vector<RunOutcome> run_experiment(const Experiment& experiment, ResultsDb& db,
                                       Progress& progress, const std::atomic<bool>& stop,
                                       bool resume = false);

// Loads the calibrated acceptance tables (acceptance.calibrated) of every variant the simulator
// will run, from the database each names (default `db_path`, the one being written). A run
// executes nothing before this; throws Error (with the YAML position) when a source is missing
// or unusable. No-op for experiments without calibrated acceptance or the sim backend.
void resolve_calibrated_acceptance(Experiment& experiment, const std::string& db_path);

// Throws Error if none of the experiment's backends can run here (checked before the database
// is opened).
void check_backends_available(const Experiment& experiment);

}  // namespace twinstep
