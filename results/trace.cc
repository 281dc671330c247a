#include "results/trace.h"

#include <cstdio>
#include <set>
#include <string>

#include "policies/error.h"
#include "results/json.h"

namespace twinstep {
namespace {

// Nanoseconds as microseconds with exactly three decimals: 1234567 -> "1234.567".
std::string us(int64_t ns) {
  const bool negative = ns < 0;
  const uint64_t a = negative ? 0 - static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%llu.%03llu", negative ? "-" : "",
                static_cast<unsigned long long>(a / 1000),
                static_cast<unsigned long long>(a % 1000));
  return buf;
}

int lane_tid(const std::string& lane) {
  if (lane == "host") return 0;
  if (lane == "compute") return 1;
  return 2;
}

constexpr const char* kThreadNames[] = {"host", "compute stream", "copy stream"};

int64_t as_int(const Cell& c) { return cell_int(c, "a timeline_span number"); }

}  // namespace

void write_chrome_trace(ResultsDb& db, int64_t run_id, std::ostream& out) {
  const QueryResult exists = db.query_params("SELECT 1 FROM run WHERE id = ?1", {run_id});
  if (exists.rows.empty()) throw Error("no run with id " + std::to_string(run_id));
  const QueryResult spans = db.query_params(
      "SELECT rank, lane, name, step, start_ns, dur_ns, flow FROM timeline_span "
      "WHERE run_id = ?1 ORDER BY rank, CASE lane WHEN 'host' THEN 0 WHEN 'compute' THEN 1 "
      "ELSE 2 END, start_ns, rowid",
      {run_id});
  if (spans.rows.empty()) {
    throw Error("run " + std::to_string(run_id) +
                " has no timeline; set trace: {first_step, steps} in the experiment or pass "
                "--trace-steps");
  }

  out << "{\"traceEvents\":[\n";
  bool first = true;
  auto event = [&](const std::string& body) {
    out << (first ? "" : ",\n") << '{' << body << '}';
    first = false;
  };
  std::set<int64_t> ranks;
  std::set<std::pair<int64_t, int>> threads;
  for (const auto& row : spans.rows) {
    const int64_t rank = as_int(row[0]);
    const int tid = lane_tid(cell_text(row[1], "timeline_span.lane"));
    const std::string pid_tid =
        "\"pid\":" + std::to_string(rank) + ",\"tid\":" + std::to_string(tid);
    if (ranks.insert(rank).second) {
      event("\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(rank) +
            ",\"args\":{\"name\":\"rank " + std::to_string(rank) + "\"}");
    }
    if (threads.insert({rank, tid}).second) {
      event("\"name\":\"thread_name\",\"ph\":\"M\"," + pid_tid + ",\"args\":{\"name\":\"" +
            kThreadNames[tid] + "\"}");
    }
    const std::string ts = us(as_int(row[4]));
    const int64_t flow = as_int(row[6]);
    event("\"name\":" + json_quote(cell_text(row[2], "timeline_span.name")) + ",\"cat\":\"" +
          cell_text(row[1], "timeline_span.lane") + "\",\"ph\":\"X\",\"ts\":" + ts +
          ",\"dur\":" + us(as_int(row[5])) + "," + pid_tid +
          ",\"args\":{\"step\":" + std::to_string(as_int(row[3])) + "}");
    if (flow > 0) {
      // Host side starts the arrow; the GPU side binds it to the enclosing slice ("bp":"e").
      const std::string common =
          "\"name\":\"launch\",\"cat\":\"flow\",\"id\":" + std::to_string(flow) + ",\"ts\":" + ts +
          "," + pid_tid;
      event(common + (tid == 0 ? ",\"ph\":\"s\"" : ",\"ph\":\"f\",\"bp\":\"e\""));
    }
  }
  out << "\n],\"displayTimeUnit\":\"ns\"}\n";
}

}  // namespace twinstep
