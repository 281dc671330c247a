// Chrome trace export (chrome://tracing, ui.perfetto.dev) of a run's stored timeline.
#pragma once

#include <cstdint>
#include <ostream>

#include "results/db.h"

namespace twinstep {

// Writes {"traceEvents": [...], "displayTimeUnit": "ns"} for run `run_id`: one complete event
// ("ph":"X", ts/dur in microseconds with ns precision, args.step) per timeline_span row, with
// pid = rank and tid = lane (0 host, 1 compute stream, 2 copy stream) named by metadata events;
// a span with flow > 0 gets a flow arrow from the host span ("ph":"s") to the GPU span
// ("ph":"f", "bp":"e") with id = flow. Throws Error if the run has no timeline.
void write_chrome_trace(ResultsDb& db, int64_t run_id, std::ostream& out);

}  // namespace twinstep
