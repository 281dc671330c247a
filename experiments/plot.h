// `twinstep plot`: an experiment's figures as PNGs, drawn by gnuplot from the results database.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "results/db.h"

namespace twinstep {

struct Figure {
  std::string name;     // file stem, e.g. "tpot_itl"
  std::string title;    // one line, for a report heading
  std::string caption;  // what it shows and how to read it
  std::string path;     // the PNG written; empty when skipped
  std::string skipped;  // why it was not drawn (no real runs, no multi-rank runs, ...)
};

struct PlotOptions {
  std::string out_dir;         // created if absent; PNGs are written as <name>.png
  int64_t timeline_steps = 3;  // traced steps per timeline panel
  int32_t max_series = 8;      // runs drawn in per-run figures (the first ones, in order)
};

// Draws every figure for `run_ids` (runs of one experiment, e.g. latest_runs_of_experiment):
//   tpot_itl           TPOT and ITL distributions (CDF) per run
//   throughput_vs_tpot output throughput against mean TPOT, a line per series of a
//                      workload.concurrency sweep
//   sim_vs_measured    simulated against measured per metric, y = x and a ±10% band (needs
//                      sim and real runs of the same variant; skipped otherwise)
//   accept_length      accept length per decode step, histogram per run
//   timeline           host lane and GPU stream lanes over a few traced steps, one panel per
//                      run with a timeline (skipped when none was traced)
//   collective_waits   mean collective wait per step of each rank (multi-rank runs; skipped
//                      otherwise)
// Throws Error when gnuplot is missing or fails, or out_dir cannot be created.
std::vector<Figure> plot_runs(ResultsDb& db, const std::vector<int64_t>& run_ids,
                              const PlotOptions& options);

}  // namespace twinstep
