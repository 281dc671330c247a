#include "results/acceptance.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_map>

#include "policies/error.h"

namespace twinstep {

std::vector<DraftRound> load_draft_rounds(ResultsDb& db, int64_t run_id) {
  if (db.query_params("SELECT 1 FROM run WHERE id = ?1", {run_id}).rows.empty()) {
    throw Error("no run with id " + std::to_string(run_id) + " in " + db.path());
  }
  // json_each expands the confidence array in order (key = position - 1).
  const QueryResult rows = db.query_params(R"sql(
SELECT r.request_id, r.idx, r.step, r.draft_len, r.accepted, j.key, j.value
FROM draft_round r, json_each(r.confidence) j
WHERE r.run_id = ?1 ORDER BY r.request_id, r.idx, j.key)sql",
                                           {run_id});
  std::vector<DraftRound> rounds;
  int64_t last_request = -1, last_idx = -1;
  for (const auto& row : rows.rows) {
    const int64_t request = cell_int(row[0], "draft_round.request_id");
    const int64_t idx = cell_int(row[1], "draft_round.idx");
    if (request != last_request || idx != last_idx) {
      DraftRound& d = rounds.emplace_back();
      d.request = int32_t(request);
      d.step = cell_int(row[2], "draft_round.step");
      d.draft_len = int32_t(cell_int(row[3], "draft_round.draft_len"));
      d.accepted = int32_t(cell_int(row[4], "draft_round.accepted"));
      last_request = request;
      last_idx = idx;
    }
    DraftRound& d = rounds.back();
    if (cell_int(row[5], "draft_round.confidence index") != int64_t(d.confidence.size())) {
      throw Error("results database: draft_round (run " + std::to_string(run_id) + ", request " +
                  std::to_string(request) + ", round " + std::to_string(idx) +
                  ") has a malformed confidence array");
    }
    d.confidence.push_back(float(cell_number(row[6], "draft_round.confidence")));
  }
  for (const DraftRound& d : rounds) {
    if (d.confidence.size() != size_t(d.draft_len)) {
      throw Error("results database: a draft_round of run " + std::to_string(run_id) +
                  " (request " + std::to_string(d.request) + ", step " + std::to_string(d.step) +
                  ") holds " + std::to_string(d.confidence.size()) + " confidences for " +
                  std::to_string(d.draft_len) + " draft tokens");
    }
  }
  return rounds;
}

int64_t resolve_acceptance_run(ResultsDb& db, const AcceptanceSource& source) {
  const std::string where = source.where.empty() ? "" : source.where + ": ";
  if (source.run_id > 0) {
    const QueryResult r =
        db.query_params("SELECT backend, status FROM run WHERE id = ?1", {source.run_id});
    if (r.rows.empty()) {
      throw Error(where + "calibrated acceptance: no run " + std::to_string(source.run_id) +
                  " in " + db.path());
    }
    if (cell_text(r.rows[0][0], "run.backend") != "real" ||
        cell_text(r.rows[0][1], "run.status") != "complete") {
      throw Error(where + "calibrated acceptance: run " + std::to_string(source.run_id) +
                  " is not a complete real run");
    }
    return source.run_id;
  }
  std::string sql = R"sql(
SELECT r.id FROM run r JOIN experiment e ON e.id = r.experiment_id
WHERE e.name = ?1 AND r.backend = 'real' AND r.status = 'complete')sql";
  std::vector<Cell> params = {source.experiment};
  if (!source.variant.empty()) {
    sql += " AND r.variant_label = ?2";
    params.emplace_back(source.variant);
  }
  sql += " ORDER BY r.id DESC LIMIT 1";
  const QueryResult r = db.query_params(sql, params);
  if (r.rows.empty()) {
    throw Error(where + "calibrated acceptance: no complete real run of experiment \"" +
                source.experiment + "\"" +
                (source.variant.empty() ? "" : " variant \"" + source.variant + "\"") + " in " +
                db.path() + " (run that experiment on the GPU first)");
  }
  return cell_int(r.rows[0][0], "run.id");
}

AcceptanceTable acceptance_table(const std::vector<DraftRound>& rounds, const std::string& source) {
  if (rounds.empty()) {
    throw Error("calibrated acceptance: " + source +
                " has no verify rounds (was it a speculative run?)");
  }
  AcceptanceTable t;
  t.source = source;
  t.draft_len = rounds.front().draft_len;
  std::unordered_map<int32_t, int32_t> committed_by_request;
  for (const DraftRound& d : rounds) {
    if (d.draft_len != t.draft_len) {
      throw Error("calibrated acceptance: " + source + " drafted " + std::to_string(t.draft_len) +
                  " tokens in one round and " + std::to_string(d.draft_len) +
                  " in another; calibrate from a chain run (every round the same length)");
    }
    // Each request's rounds in round order (load_draft_rounds; interleaved requests are fine):
    // a round starts where that request's earlier rounds' commits end.
    int32_t& committed = committed_by_request[d.request];
    t.start.push_back(committed);
    committed += d.accepted + 1;
    t.request.push_back(d.request);
    t.accepted.push_back(d.accepted);
    t.confidence.insert(t.confidence.end(), d.confidence.begin(), d.confidence.end());
  }
  return t;
}

void add_drafted_tokens(const std::vector<DraftRound>& rounds, const std::string& source,
                        AcceptanceTable& t) {
  std::unordered_map<int32_t, int32_t> committed_by_request;
  for (const DraftRound& d : rounds) {
    int32_t& start = committed_by_request[d.request];
    // Positions 1 .. accepted drafted the text; accepted + 1 is the miss (below the draft
    // length); past it the draft went on from its own wrong token, not the text.
    for (int32_t q = 1; q <= std::min(d.draft_len, d.accepted + 1); ++q) {
      t.drafted[AcceptanceTable::drafted_key(d.request, start + q - 1)] = {
          q <= d.accepted, d.confidence[size_t(q - 1)]};
    }
    start += d.accepted + 1;
  }
  t.drafted_source = source;
}

namespace {

std::string run_name(ResultsDb& db, int64_t run) {
  const QueryResult info = db.query_params(
      "SELECT e.name, r.variant_label FROM run r JOIN experiment e ON e.id = r.experiment_id "
      "WHERE r.id = ?1",
      {run});
  return "run " + std::to_string(run) + " (experiment " +
         cell_text(info.rows[0][0], "experiment.name") + ", variant " +
         cell_text(info.rows[0][1], "run.variant_label") + ") in " + db.path();
}

}  // namespace

AcceptanceTable load_acceptance_table(ResultsDb& db, const AcceptanceSource& source) {
  const int64_t run = resolve_acceptance_run(db, source);
  AcceptanceTable t = acceptance_table(load_draft_rounds(db, run), run_name(db, run));
  if (!source.bonus_experiment.empty()) {
    AcceptanceSource bonus;
    bonus.experiment = source.bonus_experiment;
    bonus.variant = source.bonus_variant;
    bonus.where = source.where.empty() ? "bonus_from" : source.where + " (bonus_from)";
    const int64_t b = resolve_acceptance_run(db, bonus);
    add_drafted_tokens(load_draft_rounds(db, b), run_name(db, b), t);
  }
  return t;
}

int64_t AcceptHistogram::rounds() const {
  int64_t n = 0;
  for (const int64_t c : count) n += c;
  return n;
}

double AcceptHistogram::mean() const {
  const int64_t n = rounds();
  if (n == 0) return 0;
  double sum = 0;
  for (size_t k = 0; k < count.size(); ++k) sum += double(k + 1) * double(count[k]);
  return sum / double(n);
}

double AcceptHistogram::fraction(size_t k) const {
  const int64_t n = rounds();
  return n == 0 || k >= count.size() ? 0.0 : double(count[k]) / double(n);
}

AcceptHistogram accept_histogram(const std::vector<DraftRound>& rounds) {
  AcceptHistogram h;
  for (const DraftRound& d : rounds) {
    const size_t k = size_t(d.accepted);
    if (h.count.size() <= k) h.count.resize(k + 1, 0);
    ++h.count[k];
  }
  return h;
}

double accept_len_standard_error(const std::vector<DraftRound>& rounds) {
  std::map<int32_t, std::pair<double, double>> per_request;  // request -> (rounds, tokens)
  double n = 0, t = 0;
  for (const DraftRound& d : rounds) {
    auto& [nr, tr] = per_request[d.request];
    nr += 1;
    tr += d.accepted + 1;
    n += 1;
    t += d.accepted + 1;
  }
  const double r = double(per_request.size());
  if (r < 2) return 0;
  const double m = t / n;
  double ss = 0;
  for (const auto& [request, nt] : per_request) {
    const double e = nt.second - m * nt.first;
    ss += e * e;
  }
  return std::sqrt(r / (r - 1) * ss) / n;
}

double total_variation(const AcceptHistogram& a, const AcceptHistogram& b) {
  double sum = 0;
  for (size_t k = 0; k < std::max(a.count.size(), b.count.size()); ++k) {
    sum += std::fabs(a.fraction(k) - b.fraction(k));
  }
  return 0.5 * sum;
}

}  // namespace twinstep
