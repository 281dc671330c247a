// Fuzz target: bytes -> a RunInfo and RunRecord -> begin_run + finish_run on an in-memory
// database -> read back. The contract under test (results/db.h): finish_run either stores every
// sample exactly (counts, sums and metric values read back equal) and marks the run complete, or
// throws Error and keeps nothing (the run stays 'running' with no sample rows). The stored
// variant_json is valid JSON whatever the parameter strings are.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <variant>

#include "policies/error.h"
#include "results/compare.h"
#include "results/db.h"
#include "results/metrics.h"

namespace {

using twinstep::Cell;

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_run_record: invariant violated: %s\n", what);
    std::abort();
  }
}

int64_t scalar(twinstep::ResultsDb& db, const std::string& sql, int64_t run_id) {
  const twinstep::QueryResult r = db.query_params(sql, {Cell(run_id)});
  const Cell& c = r.rows.at(0).at(0);
  if (std::holds_alternative<std::monostate>(c)) return 0;  // SUM over no rows
  return std::get<int64_t>(c);
}

constexpr const char* kSpanNames[] = {"launch_graph", "attention", "copy_d2h", ""};
constexpr const char* kMetricKeys[] = {"tpot_ms_mean", "ttft_ms_mean", "step_ms_mean", "x"};

// A clock value as a backend records it: -1 (not reached) or a time in [0, 2^62] ns. The loader
// bounds a run's simulated time by 2^62 ns (docs/reliability.md), so request_*_ms's
// differences of two clock values cannot overflow.
int64_t time_ns(FuzzedDataProvider& in) {
  return in.ConsumeIntegralInRange<int64_t>(-1, int64_t{1} << 62);
}

twinstep::RunRecord make_record(FuzzedDataProvider& in) {
  twinstep::RunRecord rec;
  const int n_requests = in.ConsumeIntegralInRange(0, 16);
  for (int i = 0; i < n_requests; ++i) {
    twinstep::RequestSample r;
    r.id = in.ConsumeIntegralInRange<int32_t>(-2, 20);
    r.input_len = in.ConsumeIntegral<int32_t>();
    r.output_len = in.ConsumeIntegral<int32_t>();
    r.arrival_ns = time_ns(in);
    r.start_ns = time_ns(in);
    r.first_token_ns = time_ns(in);
    r.end_ns = time_ns(in);
    r.chunk_count = in.ConsumeIntegral<int32_t>();
    rec.requests.push_back(r);
  }
  const int n_chunks = in.ConsumeIntegralInRange(0, 32);
  for (int i = 0; i < n_chunks; ++i) {
    rec.chunks.push_back(
        {in.ConsumeIntegralInRange<int32_t>(-2, 20), in.ConsumeIntegral<int32_t>(), time_ns(in)});
  }
  const int n_steps = in.ConsumeIntegralInRange(0, 32);
  for (int i = 0; i < n_steps; ++i) {
    twinstep::StepSample s;
    s.rank = in.ConsumeIntegralInRange<int32_t>(0, 3);
    s.step = in.ConsumeIntegralInRange<int64_t>(-1, 40);
    s.dur_ns = in.ConsumeIntegral<int64_t>();
    s.tokens = in.ConsumeIntegral<int32_t>();
    s.bytes_read = in.ConsumeIntegral<int64_t>();
    for (int64_t& h : s.host_ns) h = in.ConsumeIntegral<int64_t>();
    rec.steps.push_back(s);
  }
  const int n_spans = in.ConsumeIntegralInRange(0, 8);
  for (int i = 0; i < n_spans; ++i) {
    rec.timeline.push_back({in.ConsumeIntegralInRange<int32_t>(0, 3),
                            static_cast<twinstep::Lane>(in.ConsumeIntegralInRange(0, 2)),
                            kSpanNames[in.ConsumeIntegralInRange(0, 3)],
                            in.ConsumeIntegral<int64_t>(), in.ConsumeIntegral<int64_t>(),
                            in.ConsumeIntegral<int64_t>(), in.ConsumeIntegral<int64_t>()});
  }
  return rec;
}

double consume_double(FuzzedDataProvider& in) {
  // Raw bit patterns reach NaN, infinities and subnormals.
  const uint64_t bits = in.ConsumeIntegral<uint64_t>();
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  twinstep::RunInfo info;
  info.experiment_name = in.ConsumeRandomLengthString(64);
  info.yaml_text = in.ConsumeRandomLengthString(256);
  info.source_path = in.ConsumeRandomLengthString(64);
  info.variant_index = in.ConsumeIntegral<int32_t>();
  info.variant_label = in.ConsumeRandomLengthString(64);
  const int n_params = in.ConsumeIntegralInRange(0, 4);
  for (int i = 0; i < n_params; ++i) {
    std::string key = in.ConsumeRandomLengthString(16);
    info.variant_params.emplace_back(std::move(key), in.ConsumeRandomLengthString(16));
  }
  info.backend = in.ConsumeBool() ? "sim" : "real";
  info.seed = in.ConsumeIntegral<uint64_t>();
  info.gpu_name = in.ConsumeRandomLengthString(16);
  const twinstep::RunRecord rec = make_record(in);
  std::vector<twinstep::Metric> metrics;
  const int n_metrics = in.ConsumeIntegralInRange(0, 4);
  for (int i = 0; i < n_metrics; ++i) {
    metrics.push_back({kMetricKeys[in.ConsumeIntegralInRange(0, 3)], consume_double(in), "ms"});
  }

  twinstep::ResultsDb db = twinstep::ResultsDb::open(":memory:");
  const int64_t run = db.begin_run(info);
  require(scalar(db, "SELECT json_valid(variant_json) FROM run WHERE id = ?1", run) == 1,
          "variant_json is valid JSON");
  bool stored = true;
  try {
    db.finish_run(run, rec, metrics, 0.5);
  } catch (const twinstep::Error&) {
    stored = false;
  }
  const twinstep::QueryResult status =
      db.query_params("SELECT status FROM run WHERE id = ?1", {Cell(run)});
  const std::string st = std::get<std::string>(status.rows.at(0).at(0));
  const int64_t n_req = scalar(db, "SELECT count(*) FROM request_sample WHERE run_id=?1", run);
  const int64_t n_chunk = scalar(db, "SELECT count(*) FROM chunk_sample WHERE run_id=?1", run);
  const int64_t n_step = scalar(db, "SELECT count(*) FROM step_sample WHERE run_id=?1", run);
  const int64_t n_span = scalar(db, "SELECT count(*) FROM timeline_span WHERE run_id=?1", run);
  const int64_t n_metric = scalar(db, "SELECT count(*) FROM metric WHERE run_id=?1", run);
  if (!stored) {
    require(st == "running", "a failed finish_run leaves the run 'running'");
    require(n_req + n_chunk + n_step + n_span + n_metric == 0, "a failed finish_run keeps nothing");
    db.fail_run(run, "failed", "fuzz");
    return 0;
  }
  require(st == "complete", "a stored run is complete");
  require(n_req == int64_t(rec.requests.size()), "every request sample stored");
  require(n_chunk == int64_t(rec.chunks.size()), "every chunk stored");
  require(n_step == int64_t(rec.steps.size()), "every step stored");
  require(n_span == int64_t(rec.timeline.size()), "every span stored");
  require(n_metric == int64_t(metrics.size()), "every metric stored");
  uint64_t tokens = 0;  // unsigned: wraps like SQLite's sum would overflow, so compare mod 2^64
  for (const twinstep::ChunkSample& c : rec.chunks) tokens += uint64_t(int64_t{c.tokens});
  if (!rec.chunks.empty()) {
    require(
        uint64_t(scalar(db, "SELECT sum(tokens) FROM chunk_sample WHERE run_id=?1", run)) == tokens,
        "chunk tokens read back");
  }
  for (const twinstep::Metric& m : metrics) {
    const twinstep::QueryResult r = db.query_params(
        "SELECT value FROM metric WHERE run_id=?1 AND key=?2", {Cell(run), Cell(m.key)});
    require(std::get<double>(r.rows.at(0).at(0)) == m.value, "metric value read back exactly");
  }
  (void)twinstep::compare_runs(db, {run});
  return 0;
}
