#include "results/compare.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "policies/error.h"
#include "policies/step_kernels.h"
#include "results/acceptance.h"

namespace twinstep {

const std::vector<std::string>& compare_metric_keys() {
  static const std::vector<std::string> keys = {"tpot_ms_mean",
                                                "tpot_ms_p99",
                                                "itl_ms_p99",
                                                "ttft_ms_mean",
                                                "output_throughput_tok_s",
                                                "accept_len_mean",
                                                "step_time_estimate_ms",
                                                "step_ms_mean",
                                                "gpu_busy_frac",
                                                "idle_host_frac",
                                                "idle_launch_frac",
                                                "achieved_tbps",
                                                "pct_of_floor"};
  return keys;
}

QueryResult compare_runs(ResultsDb& db, const std::vector<int64_t>& run_ids,
                         const std::vector<std::string>& keys) {
  QueryResult out;
  out.columns = {"metric", "unit"};
  std::vector<std::map<std::string, double>> values;
  std::set<std::string> headers;
  for (int64_t id : run_ids) {
    const QueryResult run =
        db.query_params("SELECT variant_label, backend FROM run WHERE id = ?1", {id});
    if (run.rows.empty()) throw Error("no run with id " + std::to_string(id));
    std::string header = cell_text(run.rows[0][0], "run.variant_label") + " [" +
                         cell_text(run.rows[0][1], "run.backend") + "]";
    if (!headers.insert(header).second) {
      header += " #" + std::to_string(id);
      headers.insert(header);
    }
    out.columns.push_back(header);
    auto& m = values.emplace_back();
    const QueryResult rows =
        db.query_params("SELECT key, value FROM metric WHERE run_id = ?1", {id});
    for (const auto& row : rows.rows) {
      m[cell_text(row[0], "metric.key")] = cell_number(row[1], "metric.value");
    }
  }
  std::map<std::string, std::string> units;
  for (const MetricDef& def : metric_definitions()) units[def.key] = def.unit;
  for (const std::string& key : keys) {
    std::vector<Cell> row = {key, units.count(key) ? Cell(units[key]) : Cell()};
    bool any = false;
    for (const auto& m : values) {
      auto it = m.find(key);
      if (it == m.end()) {
        row.emplace_back();
      } else {
        row.emplace_back(it->second);
        any = true;
      }
    }
    if (any) out.rows.push_back(std::move(row));
  }
  return out;
}

QueryResult compare_runs_by_run(ResultsDb& db, const std::vector<int64_t>& run_ids,
                                const std::vector<std::string>& keys) {
  const QueryResult by_metric = compare_runs(db, run_ids, keys);
  // The swept parameters, a column each in first-seen order (a run without one: NULL).
  std::vector<std::string> params;
  std::vector<std::map<std::string, Cell>> values(run_ids.size());
  std::vector<std::string> backends(run_ids.size());
  for (size_t r = 0; r < run_ids.size(); ++r) {
    // One row per swept parameter (one with NULL key for a run without any).
    const QueryResult kv = db.query_params(
        "SELECT r.backend, j.key, CASE j.type WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' "
        "ELSE j.value END FROM run r LEFT JOIN json_each(r.variant_json) j WHERE r.id = ?1 "
        "ORDER BY j.id",
        {Cell(run_ids[r])});
    backends[r] = cell_text(kv.rows.at(0)[0], "run.backend");
    for (const auto& row : kv.rows) {
      if (std::holds_alternative<std::monostate>(row[1])) continue;
      const std::string& key = cell_text(row[1], "run.variant_json key");
      if (std::find(params.begin(), params.end(), key) == params.end()) params.push_back(key);
      values[r][key] = row[2];
    }
  }
  QueryResult out;
  out.columns = {"run"};
  out.columns.insert(out.columns.end(), params.begin(), params.end());
  out.columns.push_back("backend");
  for (const auto& row : by_metric.rows) out.columns.push_back(cell_text(row[0], "metric.key"));
  for (size_t r = 0; r < run_ids.size(); ++r) {
    std::vector<Cell> row = {Cell(run_ids[r])};
    for (const std::string& key : params) {
      auto it = values[r].find(key);
      row.push_back(it == values[r].end() ? Cell() : it->second);
    }
    row.emplace_back(backends[r]);
    for (const auto& metric_row : by_metric.rows) row.push_back(metric_row[2 + r]);
    out.rows.push_back(std::move(row));
  }
  return out;
}

std::vector<int64_t> latest_runs_of_experiment(ResultsDb& db, const std::string& name) {
  const QueryResult result = db.query_params(R"sql(
SELECT max(r.id) FROM run r
WHERE r.status = 'complete' AND r.experiment_id = (
  SELECT r2.experiment_id FROM run r2 JOIN experiment e ON e.id = r2.experiment_id
  WHERE e.name = ?1 AND r2.status = 'complete' ORDER BY r2.id DESC LIMIT 1)
GROUP BY r.variant_index, r.backend
ORDER BY r.variant_index, r.backend = 'real')sql",
                                             {name});
  if (result.rows.empty()) {
    throw Error("experiment \"" + name + "\" has no complete run in " + db.path());
  }
  std::vector<int64_t> ids;
  for (const auto& row : result.rows) ids.push_back(cell_int(row[0], "run.id"));
  return ids;
}

namespace {

// A variant's simulated and measured run among a list of run ids (-1: none).
struct SimRealPair {
  std::string label;
  int64_t sim = -1;
  int64_t real = -1;
};

// By variant index; the last id of each backend wins.
std::map<int64_t, SimRealPair> sim_real_pairs(ResultsDb& db, const std::vector<int64_t>& run_ids) {
  std::map<int64_t, SimRealPair> pairs;
  for (int64_t id : run_ids) {
    const QueryResult run = db.query_params(
        "SELECT variant_index, variant_label, backend FROM run WHERE id = ?1", {id});
    if (run.rows.empty()) throw Error("no run with id " + std::to_string(id));
    SimRealPair& p = pairs[cell_int(run.rows[0][0], "run.variant_index")];
    p.label = cell_text(run.rows[0][1], "run.variant_label");
    (cell_text(run.rows[0][2], "run.backend") == "sim" ? p.sim : p.real) = id;
  }
  return pairs;
}

}  // namespace

QueryResult sim_vs_real(ResultsDb& db, const std::vector<int64_t>& run_ids,
                        const std::vector<std::string>& keys, double* worst_abs_error_pct,
                        std::vector<std::string>* uncompared) {
  const std::map<int64_t, SimRealPair> pairs = sim_real_pairs(db, run_ids);
  QueryResult out;
  out.columns = {"variant", "metric", "sim", "real", "error_pct"};
  double worst = 0;
  auto value = [&](int64_t run, const std::string& key, double* v) {
    const QueryResult r =
        db.query_params("SELECT value FROM metric WHERE run_id = ?1 AND key = ?2", {run, key});
    if (r.rows.empty()) return false;
    *v = cell_number(r.rows[0][0], "metric.value");
    return true;
  };
  for (const auto& [index, p] : pairs) {
    if (p.sim < 0 || p.real < 0) {
      // A lone variant is no comparison at all: the caller's error, not a line of it.
      if (uncompared && pairs.size() > 1)
        uncompared->push_back(p.label + ": no " + (p.sim < 0 ? "simulated" : "measured") +
                              " run among these runs");
      continue;
    }
    for (const std::string& key : keys) {
      double s = 0, r = 0;
      const bool has_sim = value(p.sim, key, &s), has_real = value(p.real, key, &r);
      if (!has_sim || !has_real || r == 0) {
        if (uncompared)
          uncompared->push_back(p.label + ": " + key + " (" +
                                (!has_sim ? "absent from the simulated run " + std::to_string(p.sim)
                                 : !has_real
                                     ? "absent from the measured run " + std::to_string(p.real)
                                     : std::string("measured 0")) +
                                ")");
        continue;
      }
      const double err = 100.0 * (s - r) / r;
      worst = std::max(worst, std::fabs(err));
      out.rows.push_back({p.label, key, s, r, err});
    }
  }
  if (worst_abs_error_pct) *worst_abs_error_pct = worst;
  return out;
}

namespace {

struct Span {
  int64_t start_ns;
  int64_t dur_ns;
  int64_t slot_ns = 0;  // compute lane: start to the next node's start (see load_spans)
};
// (rank, step, lane, name) -> spans in start order (ties in insertion order).
using SpanKey = std::tuple<int64_t, int64_t, std::string, std::string>;

// Spans are named by the runtime's nodes (runtime_node_name): consecutive spans of one lane that
// the runtime runs as one node (the simulator's rope then kv_append, say) become one span from the
// first start to the latest end, so both timelines list the same operations.
// Each span's slot: on the compute lane, from its start to the next span's start in that step
// (the last span's, and that of a span which outlasts every later one (a whole-graph span), is
// its duration); elsewhere the duration. The runtime's node spans are such slots already (it times
// a node from its start to the next one's: the gap is inside), the simulator's are kernel
// durations with gaps (under PDL overlaps) between them; slots compare like with like and add up
// to the step on both sides.
std::map<SpanKey, std::vector<Span>> load_spans(ResultsDb& db, int64_t run) {
  const QueryResult r = db.query_params(
      "SELECT rank, step, lane, name, start_ns, dur_ns FROM timeline_span WHERE run_id = ?1 "
      "ORDER BY rank, step, start_ns, rowid",
      {run});
  std::map<SpanKey, std::vector<Span>> spans;
  std::map<std::tuple<int64_t, int64_t, std::string>, SpanKey> last;  // per (rank, step, lane)
  // Per (rank, step, lane): the spans in start order, as (key, index in spans[key]).
  std::map<std::tuple<int64_t, int64_t, std::string>, std::vector<std::pair<SpanKey, size_t>>>
      order;
  for (const auto& row : r.rows) {
    const int64_t rank = cell_int(row[0], "timeline_span.rank");
    const int64_t step = cell_int(row[1], "timeline_span.step");
    const std::string lane = cell_text(row[2], "timeline_span.lane");
    const std::string name = cell_text(row[3], "timeline_span.name");
    const Span span{cell_int(row[4], "timeline_span.start_ns"),
                    cell_int(row[5], "timeline_span.dur_ns")};
    const std::string node(runtime_node_name(name));
    const SpanKey key{rank, step, lane, node};
    auto [prev, fresh] = last.try_emplace({rank, step, lane}, key);
    if (!fresh && prev->second == key && node != name) {
      // Fold a fused kernel into the node's span begun just before it in this lane. (A runtime
      // span already carries the node's name, so two of them never merge.)
      Span& open = spans[key].back();
      open.dur_ns =
          std::max(open.start_ns + open.dur_ns, span.start_ns + span.dur_ns) - open.start_ns;
      continue;
    }
    prev->second = key;
    order[{rank, step, lane}].emplace_back(key, spans[key].size());
    spans[key].push_back(span);
  }
  for (const auto& [lane_step, seq] : order) {
    const bool compute = std::get<2>(lane_step) == "compute";
    // later_end[i]: the latest end among the spans after i.
    std::vector<int64_t> later_end(seq.size(), std::numeric_limits<int64_t>::min());
    for (size_t i = seq.size(); i-- > 1;) {
      const Span& s = spans[seq[i].first][seq[i].second];
      later_end[i - 1] = std::max(later_end[i], s.start_ns + s.dur_ns);
    }
    for (size_t i = 0; i < seq.size(); ++i) {
      Span& s = spans[seq[i].first][seq[i].second];
      s.slot_ns = s.dur_ns;
      if (!compute || i + 1 == seq.size()) continue;
      if (s.start_ns + s.dur_ns >= later_end[i]) continue;  // a whole-graph span: its duration
      const Span& next = spans[seq[i + 1].first][seq[i + 1].second];
      s.slot_ns = std::max<int64_t>(0, next.start_ns - s.start_ns);
    }
  }
  return spans;
}

struct OpStats {
  int64_t matched = 0;
  double sim_ns = 0, real_ns = 0;            // Σ durations of the matched spans
  double sim_slot_ns = 0, real_slot_ns = 0;  // Σ slots of the matched spans
  double abs_err_ns = 0;                     // Σ |sim − real|
  double start_err_ns = 0;                   // Σ |Δ start within the step|
  int64_t sim_only = 0, real_only = 0;
};

}  // namespace

QueryResult sim_vs_real_ops(ResultsDb& db, const std::vector<int64_t>& run_ids) {
  QueryResult out;
  out.columns = {"variant",      "lane",          "op",        "matched",
                 "sim_us",       "real_us",       "error_pct", "mean_abs_err_us",
                 "start_err_us", "sim_only",      "real_only", "sim_slot_us",
                 "real_slot_us", "slot_error_pct"};
  for (const auto& [index, p] : sim_real_pairs(db, run_ids)) {
    if (p.sim < 0 || p.real < 0) continue;
    const auto sim = load_spans(db, p.sim);
    const auto real = load_spans(db, p.real);
    // Steps (per rank) both timelines cover.
    std::set<std::pair<int64_t, int64_t>> sim_steps, common;
    for (const auto& [key, spans] : sim) sim_steps.insert({std::get<0>(key), std::get<1>(key)});
    for (const auto& [key, spans] : real) {
      if (sim_steps.count({std::get<0>(key), std::get<1>(key)}))
        common.insert({std::get<0>(key), std::get<1>(key)});
    }
    // Each step's anchor: the earliest start among its matched spans, per run.
    std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> anchor;
    for (const auto& [key, s_spans] : sim) {
      auto it = real.find(key);
      if (it == real.end()) continue;
      const size_t n = std::min(s_spans.size(), it->second.size());
      if (n == 0) continue;
      const std::pair<int64_t, int64_t> step{std::get<0>(key), std::get<1>(key)};
      auto [a, fresh] = anchor.try_emplace(step, s_spans[0].start_ns, it->second[0].start_ns);
      if (!fresh) {
        a->second.first = std::min(a->second.first, s_spans[0].start_ns);
        a->second.second = std::min(a->second.second, it->second[0].start_ns);
      }
    }
    std::map<std::pair<std::string, std::string>, OpStats> ops;  // (lane, name)
    auto visit = [&](const std::map<SpanKey, std::vector<Span>>& mine,
                     const std::map<SpanKey, std::vector<Span>>& other, bool mine_is_sim) {
      for (const auto& [key, spans] : mine) {
        const std::pair<int64_t, int64_t> step{std::get<0>(key), std::get<1>(key)};
        if (!common.count(step)) continue;
        OpStats& op = ops[{std::get<2>(key), std::get<3>(key)}];
        auto it = other.find(key);
        const size_t theirs = it == other.end() ? 0 : it->second.size();
        if (spans.size() > theirs)
          (mine_is_sim ? op.sim_only : op.real_only) += int64_t(spans.size() - theirs);
        if (!mine_is_sim || theirs == 0) continue;  // matched pairs are counted once, from sim
        const auto [sim_anchor, real_anchor] = anchor.at(step);
        for (size_t k = 0; k < std::min(spans.size(), theirs); ++k) {
          const Span& s = spans[k];
          const Span& r = it->second[k];
          ++op.matched;
          op.sim_ns += double(s.dur_ns);
          op.real_ns += double(r.dur_ns);
          op.sim_slot_ns += double(s.slot_ns);
          op.real_slot_ns += double(r.slot_ns);
          op.abs_err_ns += std::fabs(double(s.dur_ns - r.dur_ns));
          op.start_err_ns +=
              std::fabs(double((s.start_ns - sim_anchor) - (r.start_ns - real_anchor)));
        }
      }
    };
    visit(sim, real, true);
    visit(real, sim, false);
    std::vector<std::pair<std::pair<std::string, std::string>, OpStats>> rows(ops.begin(),
                                                                              ops.end());
    std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
      return a.second.real_ns > b.second.real_ns;
    });
    for (const auto& [name, op] : rows) {
      const double n = double(std::max<int64_t>(op.matched, 1));
      const double sim_us = op.sim_ns / n / 1e3, real_us = op.real_ns / n / 1e3;
      Cell err, slot_err;
      if (op.matched > 0 && op.real_ns > 0) err = 100.0 * (op.sim_ns - op.real_ns) / op.real_ns;
      if (op.matched > 0 && op.real_slot_ns > 0)
        slot_err = 100.0 * (op.sim_slot_ns - op.real_slot_ns) / op.real_slot_ns;
      const bool any = op.matched > 0;
      out.rows.push_back({p.label, name.first, name.second, op.matched, any ? Cell(sim_us) : Cell(),
                          any ? Cell(real_us) : Cell(), err,
                          any ? Cell(op.abs_err_ns / n / 1e3) : Cell(),
                          any ? Cell(op.start_err_ns / n / 1e3) : Cell(), op.sim_only, op.real_only,
                          any ? Cell(op.sim_slot_ns / n / 1e3) : Cell(),
                          any ? Cell(op.real_slot_ns / n / 1e3) : Cell(), slot_err});
    }
  }
  return out;
}

namespace {

// Per (rank, collective name): the summed wait and span over the instances of `spans` in
// `steps`, by the estimate of sim_vs_real_collective_waits.
struct WaitSums {
  int64_t instances = 0;
  double wait_ns = 0, span_ns = 0;
};
std::map<std::pair<int64_t, std::string>, WaitSums> collective_waits(
    const std::map<SpanKey, std::vector<Span>>& spans, const std::set<int64_t>& steps) {
  std::set<int64_t> ranks;
  for (const auto& [key, v] : spans) ranks.insert(std::get<0>(key));
  std::map<std::pair<int64_t, std::string>, WaitSums> out;
  for (const auto& [key, v] : spans) {
    const auto& [rank, step, lane, name] = key;
    if (rank != *ranks.begin() || lane != "compute" || !steps.count(step) ||
        !group_collective_name(name))
      continue;
    // The instance's span on every rank, k-th occurrence in the step.
    for (size_t k = 0; k < v.size(); ++k) {
      std::vector<std::pair<int64_t, int64_t>> durs;  // (rank, dur)
      for (const int64_t r : ranks) {
        auto it = spans.find(SpanKey{r, step, lane, name});
        if (it == spans.end() || it->second.size() <= k) break;
        durs.emplace_back(r, it->second[k].dur_ns);
      }
      if (durs.size() != ranks.size()) continue;  // not on every rank: no estimate
      int64_t shortest = durs[0].second;
      for (const auto& [r, d] : durs) shortest = std::min(shortest, d);
      for (const auto& [r, d] : durs) {
        WaitSums& w = out[{r, name}];
        ++w.instances;
        w.wait_ns += double(d - shortest);
        w.span_ns += double(d);
      }
    }
  }
  return out;
}

}  // namespace

QueryResult sim_vs_real_collective_waits(ResultsDb& db, const std::vector<int64_t>& run_ids) {
  QueryResult out;
  out.columns = {"variant",     "rank",         "op",          "instances",
                 "sim_wait_us", "real_wait_us", "sim_span_us", "real_span_us"};
  for (const auto& [index, p] : sim_real_pairs(db, run_ids)) {
    if (p.sim < 0 || p.real < 0) continue;
    const auto sim = load_spans(db, p.sim);
    const auto real = load_spans(db, p.real);
    std::set<int64_t> sim_ranks, real_ranks, sim_steps, steps;
    for (const auto& [key, v] : sim) {
      sim_ranks.insert(std::get<0>(key));
      sim_steps.insert(std::get<1>(key));
    }
    for (const auto& [key, v] : real) {
      real_ranks.insert(std::get<0>(key));
      if (sim_steps.count(std::get<1>(key))) steps.insert(std::get<1>(key));
    }
    if (sim_ranks.size() < 2 || sim_ranks != real_ranks || steps.empty()) continue;
    const auto s = collective_waits(sim, steps), r = collective_waits(real, steps);
    const double n_steps = double(steps.size());
    // (rank, collective) -> (simulated, measured), then ordered for the table.
    std::map<std::pair<int64_t, std::string>, std::pair<WaitSums, WaitSums>> merged;
    for (const auto& [key, w] : s) merged[key].first = w;
    for (const auto& [key, w] : r) merged[key].second = w;
    std::vector<std::pair<std::pair<int64_t, std::string>, std::pair<WaitSums, WaitSums>>> rows(
        merged.begin(), merged.end());
    std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
      if (a.first.first != b.first.first) return a.first.first < b.first.first;
      return a.second.second.wait_ns > b.second.second.wait_ns;
    });
    auto span_us = [](const WaitSums& w) {
      return w.instances > 0 ? Cell(w.span_ns / double(w.instances) / 1e3) : Cell();
    };
    std::pair<WaitSums, WaitSums> total;  // of the current rank
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& [key, w] = rows[i];
      out.rows.push_back({p.label, key.first, key.second,
                          std::max(w.first.instances, w.second.instances),
                          w.first.wait_ns / n_steps / 1e3, w.second.wait_ns / n_steps / 1e3,
                          span_us(w.first), span_us(w.second)});
      for (auto [from, to] :
           {std::pair{&w.first, &total.first}, std::pair{&w.second, &total.second}}) {
        to->instances += from->instances;
        to->wait_ns += from->wait_ns;
        to->span_ns += from->span_ns;
      }
      if (i + 1 < rows.size() && rows[i + 1].first.first == key.first) continue;
      out.rows.push_back({p.label, key.first, std::string("all"),
                          std::max(total.first.instances, total.second.instances),
                          total.first.wait_ns / n_steps / 1e3, total.second.wait_ns / n_steps / 1e3,
                          span_us(total.first), span_us(total.second)});
      total = {};
    }
  }
  return out;
}

QueryResult sim_vs_real_accept(ResultsDb& db, const std::vector<int64_t>& run_ids,
                               double* worst_mean_diff) {
  QueryResult out;
  out.columns = {"variant", "tokens", "sim", "real", "diff"};
  double worst = 0;
  for (const auto& [index, p] : sim_real_pairs(db, run_ids)) {
    if (p.sim < 0 || p.real < 0) continue;
    const std::vector<DraftRound> sim_rounds = load_draft_rounds(db, p.sim);
    const std::vector<DraftRound> real_rounds = load_draft_rounds(db, p.real);
    const AcceptHistogram sim = accept_histogram(sim_rounds);
    const AcceptHistogram real = accept_histogram(real_rounds);
    if (sim.rounds() == 0 || real.rounds() == 0) continue;
    for (size_t k = 0; k < std::max(sim.count.size(), real.count.size()); ++k) {
      out.rows.push_back({p.label, std::to_string(k + 1), sim.fraction(k), real.fraction(k),
                          sim.fraction(k) - real.fraction(k)});
    }
    const double diff = sim.mean() - real.mean();
    worst = std::max(worst, std::fabs(diff));
    out.rows.push_back({p.label, std::string("mean"), sim.mean(), real.mean(), diff});
    const double sim_se = accept_len_standard_error(sim_rounds);
    const double real_se = accept_len_standard_error(real_rounds);
    out.rows.push_back({p.label, std::string("mean_se"), sim_se, real_se,
                        std::sqrt(sim_se * sim_se + real_se * real_se)});
    out.rows.push_back(
        {p.label, std::string("tv_distance"), total_variation(sim, real), Cell(), Cell()});
  }
  if (worst_mean_diff) *worst_mean_diff = worst;
  return out;
}

}  // namespace twinstep
