#include "experiments/report.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "experiments/plot_data.h"
#include "policies/error.h"
#include "results/compare.h"
#include "results/format.h"

namespace twinstep {
namespace {

std::string read_binary(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read figure " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string cell_text(const Cell& c) {
  if (std::holds_alternative<std::monostate>(c)) return "";
  if (const auto* i = std::get_if<int64_t>(&c)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&c)) return format_table_number(*d);
  return std::get<std::string>(c);
}

void write_html_table(const QueryResult& t, std::ostream& out) {
  out << "<div class=\"scroll\"><table>\n<thead><tr>";
  for (const std::string& c : t.columns) out << "<th>" << html_escape(c) << "</th>";
  out << "</tr></thead>\n<tbody>\n";
  for (const auto& row : t.rows) {
    out << "<tr>";
    for (const Cell& c : row) {
      const bool number = std::holds_alternative<int64_t>(c) || std::holds_alternative<double>(c);
      out << (number ? "<td class=\"n\">" : "<td>") << html_escape(cell_text(c)) << "</td>";
    }
    out << "</tr>\n";
  }
  out << "</tbody></table></div>\n";
}

// Runs as rows, compare metrics as columns: the form that stays readable for large sweeps.
constexpr const char* kStyle = R"css(
body { font-family: "DejaVu Sans", Arial, sans-serif; margin: 2em auto; max-width: 1600px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f3f3f3; }
.scroll { overflow-x: auto; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #444; max-width: 70em; }
.skipped { color: #8a6d3b; background: #fcf8e3; padding: 0.4em 0.8em; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
)css";

}  // namespace

std::string base64_encode(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8 |
                       uint32_t(uint8_t(bytes[i + 2]));
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

void write_report(ResultsDb& db, const std::string& experiment_name,
                  const std::vector<int64_t>& run_ids, const std::vector<Figure>& figures,
                  std::ostream& out) {
  std::string yaml_text;
  if (!run_ids.empty()) {
    const QueryResult r = db.query_params(
        "SELECT e.yaml_text FROM run r JOIN experiment e ON e.id = r.experiment_id "
        "WHERE r.id = ?1",
        {run_ids.front()});
    if (!r.rows.empty()) yaml_text = cell_text(r.rows[0][0]);
  }
  out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>twinstep "
         "report: "
      << html_escape(experiment_name) << "</title>\n<style>" << kStyle
      << "</style></head>\n<body>\n";
  out << "<h1>twinstep report: " << html_escape(experiment_name) << "</h1>\n";
  out << "<p>" << run_ids.size() << " run(s) from <code>" << html_escape(db.path())
      << "</code>. Simulated numbers hold for the hardware profile named in the experiment; "
         "see the YAML below.</p>\n";

  out << "<h2>Metrics</h2>\n";
  constexpr size_t kMaxColumns = 12, kMaxRows = 2000;
  if (run_ids.size() <= kMaxColumns) {
    write_html_table(compare_runs(db, run_ids), out);
  } else {
    if (run_ids.size() > kMaxRows) {
      out << "<p>Showing the first " << kMaxRows << " of " << run_ids.size()
          << " runs; query the database for the rest.</p>\n";
    }
    write_html_table(
        compare_runs_by_run(
            db, std::vector<int64_t>(run_ids.begin(),
                                     run_ids.begin() + std::min(run_ids.size(), kMaxRows))),
        out);
  }

  out << "<h2>Figures</h2>\n";
  for (const Figure& f : figures) {
    out << "<figure id=\"" << html_escape(f.name) << "\">\n<h3>" << html_escape(f.title)
        << "</h3>\n";
    if (f.path.empty()) {
      out << "<p class=\"skipped\">Not drawn: " << html_escape(f.skipped) << ".</p>\n";
    } else {
      out << "<img alt=\"" << html_escape(f.title) << "\" src=\"data:image/png;base64,"
          << base64_encode(read_binary(f.path)) << "\">\n";
    }
    out << "<figcaption>" << html_escape(f.caption) << "</figcaption>\n</figure>\n";
  }

  if (!yaml_text.empty()) {
    out << "<h2>Experiment</h2>\n<pre>" << html_escape(yaml_text) << "</pre>\n";
  }
  out << "<p id=\"image-check\" data-loaded=\"-1\" data-total=\"-1\"></p>\n";
  out << R"js(<script>
window.addEventListener("load", function () {
  var imgs = document.images, loaded = 0;
  for (var i = 0; i < imgs.length; i++) if (imgs[i].complete && imgs[i].naturalWidth > 0) loaded++;
  var p = document.getElementById("image-check");
  p.dataset.loaded = loaded; p.dataset.total = imgs.length;
  p.textContent = "images loaded: " + loaded + " of " + imgs.length;
});
</script>
)js";
  out << "</body></html>\n";
}

}  // namespace twinstep
