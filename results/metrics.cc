#include "results/metrics.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <map>
#include <unordered_map>

#include "results/stats.h"

namespace twinstep {
namespace {

constexpr double kNsPerMs = 1e6;
constexpr double kNsPerS = 1e9;
constexpr int64_t kPeakWindowNs = 1'000'000'000;

static_assert(kHostOpCount == 4, "a new HostOp needs a db name and a schema migration");
constexpr const char* kHostOpDbNames[kHostOpCount] = {"schedule", "prepare_prefill",
                                                      "prepare_decode", "process_outputs"};

bool completed(const RequestSample& r) { return r.first_token_ns >= 0 && r.end_ns >= 0; }

std::vector<MetricDef> build_definitions() {
  std::vector<MetricDef> defs;
  const char* latency[][2] = {
      {"ttft", "time to first token: first_token_ns - start_ns"},
      {"tpot", "time per output token: (e2e - ttft) / (output_len - 1); 1-token requests excluded"},
      {"itl", "inter-token latency: gaps between successive chunks of a request"},
      {"e2e", "end-to-end latency: end_ns - start_ns"}};
  const char* stats[][2] = {{"mean", "mean"},
                            {"median", "median"},
                            {"std", "population std (ddof=0)"},
                            {"p50", "50th percentile (numpy linear)"},
                            {"p90", "90th percentile (numpy linear)"},
                            {"p99", "99th percentile (numpy linear)"}};
  for (const auto& l : latency) {
    for (const auto& s : stats) {
      defs.push_back({std::string(l[0]) + "_ms_" + s[0], "ms", std::string(s[1]) + " of " + l[1]});
    }
  }
  auto add = [&](const char* key, const char* unit, const char* description) {
    defs.push_back({key, unit, description});
  };
  add("requests", "count", "completed requests");
  add("output_tokens", "tokens", "sum of output_len over completed requests");
  add("duration_s", "s", "benchmark duration: earliest request start to latest request end");
  add("output_throughput_tok_s", "tok/s", "output_tokens / duration_s");
  add("peak_output_throughput_tok_s", "tok/s",
      "most tokens delivered in one fixed 1 s window starting at the earliest request start "
      "(phase-sensitive: report, never optimise)");
  add("accept_len_mean", "tokens/step",
      "sum(step tokens) / sum(step batch) over decode steps: tokens committed per request per "
      "verify step");
  add("step_time_estimate_ms", "ms", "tpot_ms_mean * accept_len_mean: the A/B criterion");
  add("step_ms_mean", "ms", "mean step duration over decode steps");
  add("gpu_busy_frac", "fraction", "sum(gpu_busy_ns) / sum(dur_ns) over decode steps");
  add("idle_host_frac", "fraction",
      "sum(idle_host_ns) / sum(dur_ns): GPU idle because the host had not issued work");
  add("idle_launch_frac", "fraction",
      "sum(idle_launch_ns) / sum(dur_ns): work issued, GPU waiting on launch latency");
  add("idle_dep_frac", "fraction",
      "sum(idle_dep_ns) / sum(dur_ns): between launches, waiting on another stream");
  add("collective_wait_frac", "fraction",
      "sum(collective_wait_ns) / sum(dur_ns): in collectives waiting for the group's late rank "
      "(GPU busy); runs whose steps carry collective times (simulated multi-rank runs)");
  add("achieved_tbps", "TB/s",
      "sum(bytes_read) / sum(dur_ns) over decode steps, per GPU (1 TB = 1e12 B)");
  add("floor_ms", "ms",
      "mean over decode steps of bytes_read / stream_read_tbps (the streaming-read floor)");
  add("pct_of_floor", "%", "100 * sum(floor) / sum(dur_ns) over decode steps");
  for (int op = 0; op < kHostOpCount; ++op) {
    defs.push_back({std::string("host_") + kHostOpDbNames[op] + "_ms_mean", "ms",
                    std::string("mean host time per decode step in ") + kHostOpDbNames[op]});
  }
  add("host_wait_ms_mean", "ms", "mean host time per decode step blocked on events");
  add("host_launch_ms_mean", "ms", "mean host time per decode step in launch calls");
  // MoE routing over the traced decode steps (RunRecord::moe_routing, policies/moe_routing.h).
  add("moe_routing_passes", "count", "(launch, MoE layer) pairs whose routing was recorded");
  add("moe_rank_experts_mean", "experts",
      "mean over traced passes and EP ranks of the distinct experts of the rank's block that the "
      "pass's tokens picked");
  add("moe_rank_experts_max_mean", "experts",
      "mean over traced passes of the most distinct experts one EP rank got (sets the layer's "
      "time under EP)");
  add("moe_expert_share_max", "fraction",
      "mean over MoE layers of the largest share of the layer's top-k picks (traced steps) one "
      "expert received");
  return defs;
}

}  // namespace

const char* host_op_db_name(HostOp op) {
  const int i = static_cast<int>(op);
  assert(i >= 0 && i < kHostOpCount);
  return kHostOpDbNames[i];
}

const std::vector<MetricDef>& metric_definitions() {
  static const std::vector<MetricDef> defs = build_definitions();
  return defs;
}

std::optional<double> request_ttft_ms(const RequestSample& r) {
  if (!completed(r)) return std::nullopt;
  return static_cast<double>(r.first_token_ns - r.start_ns) / kNsPerMs;
}

std::optional<double> request_e2e_ms(const RequestSample& r) {
  if (!completed(r)) return std::nullopt;
  return static_cast<double>(r.end_ns - r.start_ns) / kNsPerMs;
}

std::optional<double> request_tpot_ms(const RequestSample& r) {
  if (!completed(r) || r.output_len <= 1) return std::nullopt;
  return static_cast<double>(r.end_ns - r.first_token_ns) / kNsPerMs /
         static_cast<double>(r.output_len - 1);
}

std::vector<Metric> compute_metrics(const RunRecord& record, const MetricsContext& context) {
  std::map<std::string, double> values;

  // Requests: latency samples, totals, throughput windows.
  std::vector<double> ttft, tpot, itl, e2e;
  int64_t requests = 0;
  int64_t output_tokens = 0;
  int64_t first_start_ns = std::numeric_limits<int64_t>::max();
  int64_t last_end_ns = std::numeric_limits<int64_t>::min();
  for (const RequestSample& r : record.requests) {
    if (!completed(r)) continue;
    ++requests;
    output_tokens += r.output_len;
    first_start_ns = std::min(first_start_ns, r.start_ns);
    last_end_ns = std::max(last_end_ns, r.end_ns);
    ttft.push_back(*request_ttft_ms(r));
    e2e.push_back(*request_e2e_ms(r));
    if (auto t = request_tpot_ms(r)) tpot.push_back(*t);
    assert(r.first_chunk >= 0 &&
           static_cast<size_t>(r.first_chunk) + r.chunk_count <= record.chunks.size());
    for (int32_t i = 1; i < r.chunk_count; ++i) {
      const ChunkSample& prev = record.chunks[r.first_chunk + i - 1];
      const ChunkSample& cur = record.chunks[r.first_chunk + i];
      itl.push_back(static_cast<double>(cur.t_ns - prev.t_ns) / kNsPerMs);
    }
  }
  auto add_summary = [&](const char* name, const std::vector<double>& x) {
    if (x.empty()) return;
    const Summary s = summarize(x);
    const std::string p = std::string(name) + "_ms_";
    values[p + "mean"] = s.mean;
    values[p + "median"] = s.median;
    values[p + "std"] = s.std;
    values[p + "p50"] = s.p50;
    values[p + "p90"] = s.p90;
    values[p + "p99"] = s.p99;
  };
  add_summary("ttft", ttft);
  add_summary("tpot", tpot);
  add_summary("itl", itl);
  add_summary("e2e", e2e);
  values["requests"] = static_cast<double>(requests);
  if (requests > 0) {
    values["output_tokens"] = static_cast<double>(output_tokens);
    const int64_t duration_ns = last_end_ns - first_start_ns;
    if (duration_ns > 0) {
      values["duration_s"] = static_cast<double>(duration_ns) / kNsPerS;
      values["output_throughput_tok_s"] =
          static_cast<double>(output_tokens) / (static_cast<double>(duration_ns) / kNsPerS);
    }
    // Window k covers [first_start + k s, first_start + (k+1) s).
    std::unordered_map<int64_t, int64_t> window_tokens;
    int64_t peak = 0;
    for (const RequestSample& r : record.requests) {
      if (!completed(r)) continue;
      for (int32_t i = 0; i < r.chunk_count; ++i) {
        const ChunkSample& c = record.chunks[r.first_chunk + i];
        const int64_t offset_ns = c.t_ns - first_start_ns;
        const int64_t window = offset_ns >= 0 ? offset_ns / kPeakWindowNs
                                              : -((-offset_ns + kPeakWindowNs - 1) / kPeakWindowNs);
        peak = std::max(peak, window_tokens[window] += c.tokens);
      }
    }
    values["peak_output_throughput_tok_s"] = static_cast<double>(peak);
  }

  // Decode steps (batch > 0): acceptance, step time, GPU busy/idle split, bandwidth, host time.
  int64_t steps = 0, tokens = 0, batch = 0;
  int64_t dur = 0, busy = 0, idle_host = 0, idle_launch = 0, idle_dep = 0, bytes = 0;
  int64_t collective = 0, collective_wait = 0;
  int64_t host_wait = 0, host_launch = 0;
  int64_t host_op[kHostOpCount] = {};
  for (const StepSample& s : record.steps) {
    if (s.batch <= 0) continue;
    ++steps;
    tokens += s.tokens;
    batch += s.batch;
    dur += s.dur_ns;
    busy += s.gpu_busy_ns;
    idle_host += s.idle_host_ns;
    idle_launch += s.idle_launch_ns;
    idle_dep += s.idle_dep_ns;
    collective += s.collective_ns;
    collective_wait += s.collective_wait_ns;
    bytes += s.bytes_read;
    host_wait += s.host_wait_ns;
    host_launch += s.host_launch_ns;
    for (int op = 0; op < kHostOpCount; ++op) host_op[op] += s.host_ns[op];
  }
  if (steps > 0) {
    const double n = static_cast<double>(steps);
    const double accept = static_cast<double>(tokens) / static_cast<double>(batch);
    values["accept_len_mean"] = accept;
    if (!tpot.empty()) values["step_time_estimate_ms"] = values["tpot_ms_mean"] * accept;
    values["step_ms_mean"] = static_cast<double>(dur) / n / kNsPerMs;
    if (dur > 0) {
      const double d = static_cast<double>(dur);
      values["gpu_busy_frac"] = static_cast<double>(busy) / d;
      values["idle_host_frac"] = static_cast<double>(idle_host) / d;
      values["idle_launch_frac"] = static_cast<double>(idle_launch) / d;
      values["idle_dep_frac"] = static_cast<double>(idle_dep) / d;
      if (collective > 0) values["collective_wait_frac"] = static_cast<double>(collective_wait) / d;
      // bytes/ns = 1e9 B/s = 1e-3 TB/s.
      values["achieved_tbps"] = static_cast<double>(bytes) / d / 1000.0;
    }
    if (context.stream_read_tbps > 0) {
      // floor_ns = bytes / (tbps * 1e12 B/s) * 1e9 ns/s = bytes / (tbps * 1000).
      const double floor_ns = static_cast<double>(bytes) / (context.stream_read_tbps * 1000.0);
      values["floor_ms"] = floor_ns / n / kNsPerMs;
      if (dur > 0) values["pct_of_floor"] = 100.0 * floor_ns / static_cast<double>(dur);
    }
    for (int op = 0; op < kHostOpCount; ++op) {
      values[std::string("host_") + kHostOpDbNames[op] + "_ms_mean"] =
          static_cast<double>(host_op[op]) / n / kNsPerMs;
    }
    values["host_wait_ms_mean"] = static_cast<double>(host_wait) / n / kNsPerMs;
    values["host_launch_ms_mean"] = static_cast<double>(host_launch) / n / kNsPerMs;
  }

  if (record.moe_routing.passes > 0) {
    const MoeRoutingFigures f = moe_routing_figures(record.moe_routing);
    values["moe_routing_passes"] = static_cast<double>(record.moe_routing.passes);
    values["moe_rank_experts_mean"] = f.rank_experts_mean;
    values["moe_rank_experts_max_mean"] = f.rank_experts_max_mean;
    values["moe_expert_share_max"] = f.expert_share_max;
  }

  std::vector<Metric> out;
  out.reserve(values.size());
  for (const MetricDef& def : metric_definitions()) {
    auto it = values.find(def.key);
    if (it == values.end()) continue;
    out.push_back({def.key, it->second, def.unit});
    values.erase(it);
  }
  assert(values.empty() && "every computed metric must be in metric_definitions()");
  return out;
}

}  // namespace twinstep
