// Side-by-side comparison of runs (`twinstep compare`): sim against real, variant against
// variant. The result is a QueryResult so format.h renders it as a table, CSV or JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "results/db.h"

namespace twinstep {

// The default rows, in order: tpot_ms_mean, tpot_ms_p99, itl_ms_p99, ttft_ms_mean,
// output_throughput_tok_s, accept_len_mean, step_time_estimate_ms, step_ms_mean, gpu_busy_frac,
// idle_host_frac, idle_launch_frac, achieved_tbps, pct_of_floor.
const std::vector<std::string>& compare_metric_keys();

// Columns: "metric", "unit", then one per run headed "<variant_label> [<backend>]" (" #<id>"
// appended when two headers would coincide). One row per key of `keys` that at least one run
// has; a run lacking the metric gets NULL. Throws Error for an unknown run id.
QueryResult compare_runs(ResultsDb& db, const std::vector<int64_t>& run_ids,
                         const std::vector<std::string>& keys = compare_metric_keys());

// The same figures transposed, for many runs: columns "run", one per swept parameter (the keys
// of run.variant_json in first-seen order, NULL for a run without it), "backend", then one per key
// of `keys` that at least one run has; one row per run in `run_ids` order, NULL where a run lacks
// the metric. Throws Error for an unknown run id.
QueryResult compare_runs_by_run(ResultsDb& db, const std::vector<int64_t>& run_ids,
                                const std::vector<std::string>& keys = compare_metric_keys());

// Simulated against measured: for each variant with a sim and a real run among `run_ids`, one
// row per key both runs have: variant, metric, sim, real, error_pct = 100·(sim − real)/real.
// *worst_abs_error_pct (if given) receives the largest |error_pct| (0 with no pair). *uncompared
// (if given) receives, per paired variant, each key it could not compare: "<variant>: <key>
// (absent from the simulated run N | the measured run N | measured 0)", and, when the runs hold
// more than one variant, each variant with one backend only ("<variant>: no simulated run ...").
QueryResult sim_vs_real(ResultsDb& db, const std::vector<int64_t>& run_ids,
                        const std::vector<std::string>& keys, double* worst_abs_error_pct,
                        std::vector<std::string>* uncompared = nullptr);

// Operation by operation, for each variant with a sim and a real run among `run_ids` that both
// stored a timeline (YAML `trace:`). Spans are matched by (rank, step, lane, name, k): the k-th
// span of that name on that lane in that step, over the steps both timelines cover — the twin
// principle makes the two operation sequences the same, so what does not match is itself a
// finding. One row per (variant, lane, name):
//   variant, lane, op, matched, sim_us, real_us   (mean duration of the matched spans, µs)
//   error_pct          100·(sim_us − real_us)/real_us (NULL when real_us is 0)
//   mean_abs_err_us    mean |sim − real| duration over the matched spans
//   start_err_us       mean |Δ start| with each start taken relative to its step's first
//                      matched span on that rank (how far the op drifts inside the step)
//   sim_only, real_only  spans of that name found in one run only (within the common steps).
//   sim_slot_us, real_slot_us, slot_error_pct
//                      the same for slots: on the compute lane a span's start to the next span's
//                      start in its step (the last span, and one that outlasts every later span
//                      (a whole-graph span), keep their duration), elsewhere the duration. The
//                      runtime times its nodes that way (the gap after a node is in its span), the
//                      simulator gives durations and gaps; slots compare like with like, and the
//                      slot errors add up to the step's.
// Rows: by variant index, then by the real run's total matched time, largest first.
QueryResult sim_vs_real_ops(ResultsDb& db, const std::vector<int64_t>& run_ids);

// Collective waits per rank, measured and simulated alike from the traced steps: for each variant
// with a sim and a real run among `run_ids` that both stored a timeline of two or more ranks, over
// the steps both cover, each instance of a group collective (group_collective_name; the k-th span
// of that name on the compute lane in a step, present on every rank of the run) gives rank r the
// wait dur_r − min over the ranks of dur: the last rank to arrive waits for nobody, so the
// shortest span is the collective itself. The same estimate on both sides (the simulator's spans
// hold the wait it modelled, the runtime's node spans the measured one). One row per (variant,
// rank, collective), then one per (variant, rank) named "all":
//   variant, rank, op, instances, sim_wait_us, real_wait_us   (mean wait per traced step)
//   sim_span_us, real_span_us                                 (mean span per instance)
// Rows by variant index, rank, then the real wait, largest first ("all" last).
QueryResult sim_vs_real_collective_waits(ResultsDb& db, const std::vector<int64_t>& run_ids);

// Accept lengths (speculative decoding): for each variant with a sim and a real run among
// `run_ids` that both stored verify rounds, one row per tokens-per-verify value k (1 .. the
// largest seen) with the fraction of rounds committing k tokens in each run, then a row "mean"
// (mean tokens per verify), a row "mean_se" (each mean's standard error with requests as the
// units, accept_len_standard_error; diff: the two combined) and a row "tv_distance" (total
// variation between the two distributions, in sim). Columns: variant, tokens, sim, real, diff
// (sim − real).
// *worst_mean_diff (if given) receives the largest |sim mean − real mean| (0 with no pair).
QueryResult sim_vs_real_accept(ResultsDb& db, const std::vector<int64_t>& run_ids,
                               double* worst_mean_diff);

// The complete runs of the most recent invocation of experiment `name`: the experiment version
// (name + YAML hash) of the latest complete run with that name, and within it the latest complete
// run per (variant_index, backend). Ordered by variant_index, then sim before real.
// Throws Error if the experiment has no complete run.
std::vector<int64_t> latest_runs_of_experiment(ResultsDb& db, const std::string& name);

}  // namespace twinstep
