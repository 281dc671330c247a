// The data behind the figures, read from the results database: pure functions of the stored
// rows, so tests can check them against independently computed values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "results/db.h"

namespace twinstep {

struct RunMeta {
  int64_t id = 0;
  int32_t variant_index = 0;
  std::string label;  // as stored
  std::string short_label;
  std::string backend;                                      // "sim" or "real"
  std::vector<std::pair<std::string, std::string>> params;  // swept key -> value text
};

// The runs `run_ids`, in the given order. Throws Error for an unknown id.
std::vector<RunMeta> load_run_meta(ResultsDb& db, const std::vector<int64_t>& run_ids);

// "policies.host_schedule=lockstep, workload.concurrency=4" -> "host_schedule=lockstep,
// concurrency=4": each key reduced to its last dotted component.
std::string short_variant_label(std::string_view label);

// Per-request TPOT of completed requests with output_len > 1, in ms, ascending.
std::vector<double> request_tpot_ms(ResultsDb& db, int64_t run_id);

// Gaps between successive chunks of each request, in ms (the samples behind itl_ms_*),
// ascending.
std::vector<double> itl_ms(ResultsDb& db, int64_t run_id);

// The empirical CDF of ascending `sorted` as (value, fraction <= value) points; when there are
// more than max_points values, max_points evenly spaced order statistics (first and last kept).
std::vector<std::pair<double, double>> ecdf_points(const std::vector<double>& sorted,
                                                   size_t max_points);

// Accept length per decode step (tokens / batch, steps with batch > 0), counted in bins of
// `bin_width` tokens: (bin lower edge, fraction of decode steps).
std::vector<std::pair<double, double>> accept_length_histogram(ResultsDb& db, int64_t run_id,
                                                               double bin_width);

// A metric of a run; false when absent.
bool run_metric(ResultsDb& db, int64_t run_id, const std::string& key, double* value);

// Mean collective (dependency) wait per decode step of each rank, in ms: (rank, mean).
// Empty for single-rank runs.
std::vector<std::pair<int32_t, double>> collective_wait_ms_by_rank(ResultsDb& db, int64_t run_id);

struct SpanRow {
  int32_t rank;
  std::string lane;  // "host", "compute", "copy"
  std::string name;
  int64_t step;
  int64_t start_ns;
  int64_t dur_ns;
};

// Every timeline span of a run, ordered by start.
std::vector<SpanRow> timeline_spans(ResultsDb& db, int64_t run_id);

// The time window of `step_count` GPU steps: from the first compute span of the first traced
// step to the end of the GPU work of step first + step_count - 1 (fewer if fewer were
// traced). The host lane of a run-ahead schedule prepares step k+1 during step k, so a window
// cut by host steps would show GPU idle time that is only untraced work. Spans are clipped to
// the window (extended to the last step's output copy); those outside it are dropped. Returns false
// when no compute span exists.
bool clip_to_gpu_steps(std::vector<SpanRow>& spans, int64_t step_count, int64_t* begin_ns,
                       int64_t* end_ns);

}  // namespace twinstep
