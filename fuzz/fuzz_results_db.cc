// Fuzz target: a results database a user has edited by hand (any SQLite client can write it) ->
// the readers every CLI command runs (incomplete_runs, compare_runs, latest_runs_of_experiment,
// write_chrome_trace, schema_version). The input is a list of edits applied to a database holding
// one complete traced run: set a cell of any table to a value of any storage class, delete rows,
// change user_version. The contract under test: readers return or throw twinstep::Error; they
// never crash, overflow or hang. A std::exception that is not an Error (e.g. the
// std::bad_variant_access of a cell with an unexpected type) is reported on stderr the first
// time and counted as a finding in docs/reliability.md, but does not stop the run.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <typeinfo>

#include "policies/error.h"
#include "results/compare.h"
#include "results/db.h"
#include "results/trace.h"

namespace {

using twinstep::Cell;

struct Column {
  const char* table;
  const char* name;
};

// The columns the readers look at.
constexpr Column kColumns[] = {
    {"run", "id"},
    {"run", "status"},
    {"run", "variant_label"},
    {"run", "backend"},
    {"run", "variant_index"},
    {"run", "experiment_id"},
    {"experiment", "name"},
    {"experiment", "id"},
    {"metric", "key"},
    {"metric", "value"},
    {"metric", "unit"},
    {"metric", "run_id"},
    {"timeline_span", "rank"},
    {"timeline_span", "lane"},
    {"timeline_span", "name"},
    {"timeline_span", "step"},
    {"timeline_span", "start_ns"},
    {"timeline_span", "dur_ns"},
    {"timeline_span", "flow"},
    {"timeline_span", "run_id"},
};

twinstep::RunRecord small_record() {
  twinstep::RunRecord rec;
  twinstep::RequestSample r;
  r.output_len = 2;
  r.first_token_ns = 100;
  r.end_ns = 300;
  r.chunk_count = 2;
  rec.requests.push_back(r);
  rec.chunks = {{0, 1, 100}, {0, 1, 300}};
  twinstep::StepSample s;
  s.step = 1;
  s.dur_ns = 200;
  s.batch = 1;
  s.tokens = 1;
  rec.steps.push_back(s);
  rec.timeline = {{0, twinstep::Lane::kHost, "launch_graph", 1, 0, 10, 1},
                  {0, twinstep::Lane::kCompute, "attention", 1, 10, 50, 1}};
  return rec;
}

Cell fuzz_cell(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 4)) {
    case 0:
      return std::monostate{};
    case 1:
      return in.ConsumeIntegral<int64_t>();
    case 2:
      return in.ConsumeFloatingPoint<double>();
    case 3:
      return in.ConsumeRandomLengthString(24);
    default:
      return Cell(std::string(in.ConsumeIntegralInRange<size_t>(0, 4), '\0'));
  }
}

void report_once(const std::exception& e) {
  static bool reported = false;
  if (!reported) {
    std::fprintf(stderr, "fuzz_results_db: finding (non-Error exception %s): %s\n",
                 typeid(e).name(), e.what());
    reported = true;
  }
}

template <typename F>
void reader(F f) {
  try {
    f();
  } catch (const twinstep::Error&) {
  } catch (const std::exception& e) {
    report_once(e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  twinstep::ResultsDb db = twinstep::ResultsDb::open(":memory:");
  twinstep::RunInfo info;
  info.experiment_name = "fuzz";
  info.yaml_text = "name: fuzz";
  info.backend = "sim";
  const int64_t run = db.begin_run(info);
  db.finish_run(run, small_record(), {{"tpot_ms_mean", 1.5, "ms"}, {"step_ms_mean", 2, "ms"}}, 0.1);
  db.begin_run(info);  // a second, incomplete run

  const int edits = in.ConsumeIntegralInRange(0, 6);
  for (int i = 0; i < edits && in.remaining_bytes() > 0; ++i) {
    try {
      switch (in.ConsumeIntegralInRange(0, 3)) {
        case 0:
        case 1: {
          const Column& c = kColumns[in.ConsumeIntegralInRange<size_t>(0, std::size(kColumns) - 1)];
          const int64_t rowid = in.ConsumeIntegralInRange<int64_t>(1, 3);
          db.query_params(std::string("UPDATE ") + c.table + " SET " + c.name +
                              " = ?1 WHERE rowid = ?2 OR ?2 = 3",
                          {fuzz_cell(in), Cell(rowid)}, /*allow_write=*/true);
          break;
        }
        case 2: {
          const Column& c = kColumns[in.ConsumeIntegralInRange<size_t>(0, std::size(kColumns) - 1)];
          db.query(std::string("PRAGMA foreign_keys = OFF; DELETE FROM ") + c.table +
                       " WHERE rowid = " + std::to_string(in.ConsumeIntegralInRange(1, 2)),
                   /*allow_write=*/true);
          break;
        }
        default:
          db.query("PRAGMA user_version = " + std::to_string(in.ConsumeIntegral<int32_t>()),
                   /*allow_write=*/true);
      }
    } catch (const twinstep::Error&) {
      // A constraint (NOT NULL, CHECK, UNIQUE) refused the edit: fine, the next edit follows.
    }
  }

  const int64_t probe = in.ConsumeIntegralInRange<int64_t>(0, 3);
  reader([&] { (void)db.incomplete_runs(); });
  reader([&] { (void)db.schema_version(); });
  reader([&] { (void)twinstep::compare_runs(db, {run, probe}); });
  reader([&] { (void)twinstep::latest_runs_of_experiment(db, "fuzz"); });
  reader([&] {
    std::ostringstream out;
    twinstep::write_chrome_trace(db, probe, out);
  });
  return 0;
}
