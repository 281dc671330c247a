#include "results/format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <vector>

#include "policies/error.h"
#include "results/json.h"

namespace twinstep {
namespace {

bool is_number(const Cell& c) {
  return std::holds_alternative<int64_t>(c) || std::holds_alternative<double>(c);
}

std::string table_text(const Cell& c) {
  if (std::holds_alternative<std::monostate>(c)) return "NULL";
  if (const auto* i = std::get_if<int64_t>(&c)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&c)) return format_table_number(*d);
  // One cell, one line: control characters shown escaped.
  std::string out;
  for (char ch : std::get<std::string>(c)) {
    if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else {
      out += ch;
    }
  }
  return out;
}

// Display width in terminal columns: counts UTF-8 code points, not bytes.
size_t display_width(const std::string& s) {
  size_t n = 0;
  for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
  return n;
}

std::string csv_field(const std::string& s) {
  const bool quote = s.find_first_of(",\"\r\n") != std::string::npos ||
                     (!s.empty() && (s.front() == ' ' || s.back() == ' '));
  if (!quote) return s;
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"') out += '"';
    out += ch;
  }
  out += '"';
  return out;
}

std::string trim_zeros(std::string s) {
  if (s.find('.') == std::string::npos) return s;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

OutputFormat parse_output_format(const std::string& name) {
  if (name == "table") return OutputFormat::kTable;
  if (name == "csv") return OutputFormat::kCsv;
  if (name == "json") return OutputFormat::kJson;
  throw Error("unknown output format \"" + name + "\" (expected table, csv or json)");
}

std::string format_table_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return "0";
  char buf[64];
  const double a = std::fabs(v);
  if (a >= 1e15) {
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return buf;
  }
  if (a >= 1) {
    std::snprintf(buf, sizeof buf, "%.4f", v);
    std::string s = trim_zeros(buf);
    return s == "-0" ? "0" : s;
  }
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

namespace {

// A header wider than its column's cells, split after each ", " and packed greedily into lines
// no wider than the cells or the longest piece (a compare column's variant label
// "policies.host_schedule=lockstep, policies.seq_lens_sync=false [sim]" over numbers).
std::vector<std::string> wrap_header(const std::string& header, size_t cells_width) {
  std::vector<std::string> pieces;
  for (size_t begin = 0; begin < header.size();) {
    const size_t comma = header.find(", ", begin);
    const size_t end = comma == std::string::npos ? header.size() : comma + 1;
    pieces.push_back(header.substr(begin, end - begin));
    begin = comma == std::string::npos ? header.size() : comma + 2;
  }
  size_t limit = cells_width;
  for (const std::string& p : pieces) limit = std::max(limit, display_width(p));
  std::vector<std::string> lines;
  for (const std::string& p : pieces) {
    if (!lines.empty() && display_width(lines.back()) + 1 + display_width(p) <= limit) {
      lines.back() += " " + p;
    } else {
      lines.push_back(p);
    }
  }
  return lines;
}

}  // namespace

void write_table(const QueryResult& result, std::ostream& out) {
  const size_t ncol = result.columns.size();
  std::vector<std::vector<std::string>> text(result.rows.size());
  std::vector<size_t> width(ncol, 0);
  std::vector<bool> numeric(ncol, true);  // right-align a column whose non-NULL cells are numbers
  for (size_t r = 0; r < result.rows.size(); ++r) {
    for (size_t c = 0; c < ncol; ++c) {
      const Cell& cell = result.rows[r][c];
      text[r].push_back(table_text(cell));
      width[c] = std::max(width[c], display_width(text[r].back()));
      if (!is_number(cell) && !std::holds_alternative<std::monostate>(cell)) numeric[c] = false;
    }
  }
  // Headers, bottom-aligned over the rule when some wrap.
  std::vector<std::vector<std::string>> header(ncol);
  size_t header_lines = 1;
  for (size_t c = 0; c < ncol; ++c) {
    header[c] = wrap_header(table_text(Cell(result.columns[c])), width[c]);
    for (const std::string& line : header[c]) width[c] = std::max(width[c], display_width(line));
    header_lines = std::max(header_lines, header[c].size());
  }
  auto emit_row = [&](const std::vector<std::string>& cells, bool header_row) {
    std::string line;
    for (size_t c = 0; c < ncol; ++c) {
      const std::string pad(width[c] - display_width(cells[c]), ' ');
      if (c) line += "  ";
      line += (numeric[c] && !header_row) ? pad + cells[c] : cells[c] + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << '\n';
  };
  for (size_t l = 0; l < header_lines; ++l) {
    std::vector<std::string> cells(ncol);
    for (size_t c = 0; c < ncol; ++c) {
      const size_t skip = header_lines - header[c].size();
      if (l >= skip) cells[c] = header[c][l - skip];
    }
    emit_row(cells, true);
  }
  std::string rule;
  for (size_t c = 0; c < ncol; ++c) rule += (c ? "  " : "") + std::string(width[c], '-');
  out << rule << '\n';
  for (const auto& row : text) emit_row(row, false);
}

void write_csv(const QueryResult& result, std::ostream& out) {
  auto emit = [&](size_t n, auto field) {
    for (size_t c = 0; c < n; ++c) out << (c ? "," : "") << field(c);
    out << '\n';
  };
  emit(result.columns.size(), [&](size_t c) { return csv_field(result.columns[c]); });
  for (const auto& row : result.rows) {
    emit(row.size(), [&](size_t c) -> std::string {
      const Cell& cell = row[c];
      if (std::holds_alternative<std::monostate>(cell)) return "";
      if (const auto* i = std::get_if<int64_t>(&cell)) return std::to_string(*i);
      if (const auto* d = std::get_if<double>(&cell)) return format_double_exact(*d);
      return csv_field(std::get<std::string>(cell));
    });
  }
}

void write_json(const QueryResult& result, std::ostream& out) {
  std::vector<std::string> keys;
  std::set<std::string> used;
  for (const std::string& name : result.columns) {
    std::string key = name;
    for (int n = 2; used.count(key); ++n) key = name + "_" + std::to_string(n);
    used.insert(key);
    keys.push_back(json_quote(key));
  }
  out << '[';
  for (size_t r = 0; r < result.rows.size(); ++r) {
    out << (r ? ",\n " : "\n ") << '{';
    for (size_t c = 0; c < keys.size(); ++c) {
      out << (c ? ", " : "") << keys[c] << ": ";
      const Cell& cell = result.rows[r][c];
      if (const auto* i = std::get_if<int64_t>(&cell)) {
        out << *i;
      } else if (const auto* d = std::get_if<double>(&cell)) {
        out << (std::isfinite(*d) ? format_double_exact(*d) : "null");
      } else if (const auto* s = std::get_if<std::string>(&cell)) {
        write_json_string(out, *s);
      } else {
        out << "null";
      }
    }
    out << '}';
  }
  out << (result.rows.empty() ? "]\n" : "\n]\n");
}

void write_result(const QueryResult& result, OutputFormat format, std::ostream& out) {
  switch (format) {
    case OutputFormat::kTable:
      return write_table(result, out);
    case OutputFormat::kCsv:
      return write_csv(result, out);
    case OutputFormat::kJson:
      return write_json(result, out);
  }
}

}  // namespace twinstep
