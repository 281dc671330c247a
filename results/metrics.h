// Run metrics computed from a RunRecord's raw samples. Names and definitions follow vLLM's
// benchmark_serving (TTFT, TPOT, ITL, E2E); DESIGN.md "Metrics" is the specification.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "policies/run_record.h"

namespace twinstep {

struct Metric {
  std::string key;
  double value;
  std::string unit;
};

struct MetricsContext {
  // Streaming-read bandwidth of one GPU of the run (TB/s, 1 TB = 1e12 B), measured or from the
  // hardware profile; <= 0 means unknown and floor_ms / pct_of_floor are omitted.
  double stream_read_tbps = 0;
};

// One row of the metric catalogue: every key compute_metrics can emit, in emission order.
struct MetricDef {
  std::string key;
  std::string unit;
  std::string description;
};
const std::vector<MetricDef>& metric_definitions();

// Computes every metric whose inputs are present, in metric_definitions() order. A metric is
// omitted (never NaN) when its sample set or denominator is empty: e.g. tpot_* when every request
// produced one token, step metrics when the backend recorded no decode step (batch > 0).
// Latency statistics use completed requests (first_token_ns >= 0 and end_ns >= 0).
std::vector<Metric> compute_metrics(const RunRecord& record, const MetricsContext& context);

// Per-request figures in milliseconds, as stored in request_sample. nullopt when undefined
// (request not completed; TPOT for output_len <= 1).
std::optional<double> request_ttft_ms(const RequestSample& r);
std::optional<double> request_tpot_ms(const RequestSample& r);
std::optional<double> request_e2e_ms(const RequestSample& r);

// Stable snake_case name of a host op in metric keys (host_<name>_ms_mean) and step_sample
// columns (host_<name>_ns). A schema contract, deliberately independent of host_op_name(): a
// display rename must not change the database schema.
const char* host_op_db_name(HostOp op);

}  // namespace twinstep
