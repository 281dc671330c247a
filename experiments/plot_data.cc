#include "experiments/plot_data.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <map>

#include "policies/error.h"

namespace twinstep {
namespace {

int64_t as_int(const Cell& c) {
  if (const auto* i = std::get_if<int64_t>(&c)) return *i;
  if (const auto* d = std::get_if<double>(&c)) return static_cast<int64_t>(*d);
  return 0;
}
double as_real(const Cell& c) {
  if (const auto* d = std::get_if<double>(&c)) return *d;
  if (const auto* i = std::get_if<int64_t>(&c)) return static_cast<double>(*i);
  return 0;
}
std::string as_text(const Cell& c) {
  if (const auto* s = std::get_if<std::string>(&c)) return *s;
  return "";
}

bool is_key_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
}

// Splits "a.b=1, c={x: 1, y: 2}" at ", " only where a "key=" follows.
std::vector<std::pair<std::string, std::string>> split_label(std::string_view label) {
  std::vector<std::pair<std::string, std::string>> out;
  if (label == "base") return out;
  size_t start = 0;
  auto key_follows = [&](size_t pos) {
    size_t i = pos;
    while (i < label.size() && is_key_char(label[i])) ++i;
    return i > pos && i < label.size() && label[i] == '=';
  };
  while (start < label.size()) {
    size_t end = start;
    for (;;) {
      end = label.find(", ", end);
      if (end == std::string_view::npos || key_follows(end + 2)) break;
      end += 2;
    }
    const std::string_view item =
        label.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      out.emplace_back(std::string(item), "");
    } else {
      out.emplace_back(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
    }
    if (end == std::string_view::npos) break;
    start = end + 2;
  }
  return out;
}

std::vector<double> sorted_column(ResultsDb& db, const std::string& sql, int64_t run_id) {
  const QueryResult r = db.query_params(sql, {run_id});
  std::vector<double> v;
  v.reserve(r.rows.size());
  for (const auto& row : r.rows) v.push_back(as_real(row[0]));
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

std::string short_variant_label(std::string_view label) {
  const auto params = split_label(label);
  if (params.empty()) return std::string(label);
  std::string out;
  for (const auto& [key, value] : params) {
    const size_t dot = key.rfind('.');
    out += (out.empty() ? "" : ", ") + key.substr(dot == std::string::npos ? 0 : dot + 1) + "=" +
           value;
  }
  return out;
}

std::vector<RunMeta> load_run_meta(ResultsDb& db, const std::vector<int64_t>& run_ids) {
  std::vector<RunMeta> out;
  for (int64_t id : run_ids) {
    const QueryResult r = db.query_params(
        "SELECT id, variant_index, variant_label, backend FROM run WHERE id = ?1", {id});
    if (r.rows.empty()) throw Error("no run with id " + std::to_string(id));
    RunMeta m;
    m.id = id;
    m.variant_index = static_cast<int32_t>(as_int(r.rows[0][1]));
    m.label = as_text(r.rows[0][2]);
    m.short_label = short_variant_label(m.label);
    m.backend = as_text(r.rows[0][3]);
    m.params = split_label(m.label);
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<double> request_tpot_ms(ResultsDb& db, int64_t run_id) {
  return sorted_column(
      db,
      "SELECT tpot_ms FROM request_sample WHERE run_id = ?1 AND tpot_ms IS NOT NULL "
      "AND first_token_ns >= 0 AND end_ns >= 0",
      run_id);
}

std::vector<double> itl_ms(ResultsDb& db, int64_t run_id) {
  const QueryResult r = db.query_params(
      "SELECT c.request_id, c.t_ns FROM chunk_sample c JOIN request_sample q "
      "ON q.run_id = c.run_id AND q.request_id = c.request_id "
      "WHERE c.run_id = ?1 AND q.first_token_ns >= 0 AND q.end_ns >= 0 "
      "ORDER BY c.request_id, c.idx",
      {run_id});
  std::vector<double> gaps;
  for (size_t i = 1; i < r.rows.size(); ++i) {
    if (as_int(r.rows[i][0]) != as_int(r.rows[i - 1][0])) continue;
    gaps.push_back(double(as_int(r.rows[i][1]) - as_int(r.rows[i - 1][1])) / 1e6);
  }
  std::sort(gaps.begin(), gaps.end());
  return gaps;
}

std::vector<std::pair<double, double>> ecdf_points(const std::vector<double>& sorted,
                                                   size_t max_points) {
  std::vector<std::pair<double, double>> out;
  const size_t n = sorted.size();
  if (n == 0 || max_points == 0) return out;
  const size_t k = std::min(n, std::max<size_t>(max_points, 2));
  for (size_t j = 0; j < k; ++j) {
    // Evenly spaced order statistics, first and last included.
    const size_t i = k == 1 ? 0 : (j * (n - 1) + (k - 1) / 2) / (k - 1);
    out.emplace_back(sorted[i], double(i + 1) / double(n));
  }
  return out;
}

std::vector<std::pair<double, double>> accept_length_histogram(ResultsDb& db, int64_t run_id,
                                                               double bin_width) {
  const QueryResult r = db.query_params(
      "SELECT tokens, batch FROM step_sample WHERE run_id = ?1 AND batch > 0", {run_id});
  std::map<int64_t, int64_t> bins;
  for (const auto& row : r.rows) {
    const double accept = as_real(row[0]) / as_real(row[1]);
    ++bins[static_cast<int64_t>(std::floor(accept / bin_width + 1e-9))];
  }
  std::vector<std::pair<double, double>> out;
  for (const auto& [bin, count] : bins) {
    out.emplace_back(double(bin) * bin_width, double(count) / double(r.rows.size()));
  }
  return out;
}

bool run_metric(ResultsDb& db, int64_t run_id, const std::string& key, double* value) {
  const QueryResult r =
      db.query_params("SELECT value FROM metric WHERE run_id = ?1 AND key = ?2", {run_id, key});
  if (r.rows.empty()) return false;
  *value = as_real(r.rows[0][0]);
  return true;
}

std::vector<std::pair<int32_t, double>> collective_wait_ms_by_rank(ResultsDb& db, int64_t run_id) {
  const QueryResult r = db.query_params(
      "SELECT rank, avg(collective_wait_ns) / 1e6 FROM step_sample WHERE run_id = ?1 AND "
      "batch > 0 "
      "GROUP BY rank ORDER BY rank",
      {run_id});
  std::vector<std::pair<int32_t, double>> out;
  if (r.rows.size() < 2) return out;
  for (const auto& row : r.rows) {
    out.emplace_back(static_cast<int32_t>(as_int(row[0])), as_real(row[1]));
  }
  return out;
}

std::vector<SpanRow> timeline_spans(ResultsDb& db, int64_t run_id) {
  const QueryResult r = db.query_params(
      "SELECT rank, lane, name, step, start_ns, dur_ns FROM timeline_span WHERE run_id = ?1 "
      "ORDER BY start_ns, rank",
      {run_id});
  std::vector<SpanRow> out;
  out.reserve(r.rows.size());
  for (const auto& row : r.rows) {
    out.push_back({static_cast<int32_t>(as_int(row[0])), as_text(row[1]), as_text(row[2]),
                   as_int(row[3]), as_int(row[4]), as_int(row[5])});
  }
  return out;
}

bool clip_to_gpu_steps(std::vector<SpanRow>& spans, int64_t step_count, int64_t* begin_ns,
                       int64_t* end_ns) {
  int64_t first_step = INT64_MAX;
  for (const SpanRow& s : spans) {
    if (s.lane == "compute") first_step = std::min(first_step, s.step);
  }
  if (first_step == INT64_MAX) return false;
  int64_t begin = INT64_MAX, end = INT64_MIN;
  for (const SpanRow& s : spans) {
    if (s.lane == "host" || s.step < first_step || s.step >= first_step + step_count) continue;
    if (s.lane == "compute") begin = std::min(begin, s.start_ns);
    end = std::max(end, s.start_ns + s.dur_ns);
  }
  std::vector<SpanRow> kept;
  for (SpanRow s : spans) {
    const int64_t a = std::max(s.start_ns, begin), b = std::min(s.start_ns + s.dur_ns, end);
    if (b <= a && !(s.dur_ns == 0 && s.start_ns >= begin && s.start_ns <= end)) continue;
    s.start_ns = a;
    s.dur_ns = std::max<int64_t>(0, b - a);
    kept.push_back(std::move(s));
  }
  spans = std::move(kept);
  *begin_ns = begin;
  *end_ns = end;
  return true;
}

}  // namespace twinstep
