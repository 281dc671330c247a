#include "experiments/plot.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "experiments/plot_data.h"
#include "experiments/plot_gnuplot.h"
#include "policies/error.h"

namespace twinstep {
namespace {

namespace fs = std::filesystem;

// Okabe-Ito colours: distinguishable with the common colour-vision deficiencies.
constexpr const char* kPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                    "#E69F00", "#56B4E9", "#000000", "#F0E442"};
// Filled and open markers alternating, so coinciding points of two series stay visible.
constexpr const char* kPointTypes[] = {"7", "6", "5", "4", "9", "8", "11", "10"};
const char* color(size_t i) { return kPalette[i % std::size(kPalette)]; }

// A private scratch directory for scripts and data files, removed when done.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "twinstep-plot-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw Error("cannot create a temporary directory for plots");
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out.flush()) throw Error("cannot write " + path);
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

class Plotter {
 public:
  Plotter(ResultsDb& db, const std::vector<int64_t>& run_ids, const PlotOptions& options)
      : db_(db), options_(options), runs_(load_run_meta(db, run_ids)), gnuplot_(find_gnuplot()) {
    std::error_code ec;
    fs::create_directories(options.out_dir, ec);
    if (!fs::is_directory(options.out_dir)) {
      throw Error("cannot create output directory " + options.out_dir);
    }
  }

  std::vector<Figure> all() {
    std::vector<Figure> out;
    out.push_back(tpot_itl());
    out.push_back(throughput_vs_tpot());
    out.push_back(sim_vs_measured());
    out.push_back(accept_length());
    out.push_back(timeline());
    out.push_back(collective_waits());
    return out;
  }

 private:
  // The runs drawn one series each: the first max_series, with a note when some were left out.
  std::vector<const RunMeta*> series_runs(std::string* note) const {
    std::vector<const RunMeta*> out;
    for (const RunMeta& r : runs_) {
      if (out.size() < static_cast<size_t>(options_.max_series)) out.push_back(&r);
    }
    if (runs_.size() > out.size()) {
      *note = " Showing the first " + std::to_string(out.size()) + " of " +
              std::to_string(runs_.size()) + " runs.";
    }
    return out;
  }

  std::string legend(const RunMeta& r) const {
    std::string s = r.short_label;
    if (backends_mixed()) s += " [" + r.backend + "]";
    return s;
  }
  bool backends_mixed() const {
    std::set<std::string> b;
    for (const RunMeta& r : runs_) b.insert(r.backend);
    return b.size() > 1;
  }

  // Writes `script` (after the terminal and output lines) and renders it to <name>.png.
  std::string render(const std::string& name, int width_px, int height_px,
                     const std::string& script) {
    const std::string png = (fs::path(options_.out_dir) / (name + ".png")).string();
    const std::string tmp_png = scratch_.file(name + ".png");
    std::string text = png_terminal(gnuplot_, width_px, height_px) + "\n";
    text += "set output " + gp_quote(tmp_png) + "\n";
    text += "set termoption noenhanced\nset encoding utf8\n";
    text += script;
    text += "\nunset output\n";
    const std::string gp = scratch_.file(name + ".gp");
    write_file(gp, text);
    run_gnuplot(gnuplot_, gp);
    // Copy, then rename into place: a failed plot never leaves a half-written PNG.
    const std::string staged = png + ".tmp";
    fs::copy_file(tmp_png, staged, fs::copy_options::overwrite_existing);
    fs::rename(staged, png);
    return png;
  }

  std::string data_file(const std::string& name, const std::string& rows) {
    const std::string path = scratch_.file(name);
    write_file(path, rows);
    return path;
  }

  Figure tpot_itl() {
    Figure f{"tpot_itl", "TPOT and ITL distributions per variant",
             "Empirical CDFs. Left: time per output token of each request, (E2E - TTFT) / "
             "(output_len - 1). Right: inter-token latency, the gaps between successive "
             "output chunks of a request.",
             "", ""};
    std::string note;
    const auto runs = series_runs(&note);
    f.caption += note;
    std::string tpot_plot, itl_plot;
    for (size_t i = 0; i < runs.size(); ++i) {
      auto series = [&](const std::vector<double>& v, const char* kind, std::string& plot) {
        const auto points = ecdf_points(v, 400);
        if (points.empty()) return;
        std::string rows;
        for (const auto& [x, y] : points) rows += num(x) + " " + num(y) + "\n";
        const std::string file = data_file(std::string(kind) + std::to_string(i) + ".dat", rows);
        plot += std::string(plot.empty() ? "plot " : ", ") + gp_quote(file) +
                " using 1:2 with steps lw 2.5 dt " + std::to_string(1 + i % 4) + " lc rgb '" +
                color(i) + "' title " + gp_quote(legend(*runs[i]));
      };
      series(request_tpot_ms(db_, runs[i]->id), "tpot", tpot_plot);
      series(itl_ms(db_, runs[i]->id), "itl", itl_plot);
    }
    if (tpot_plot.empty() && itl_plot.empty()) {
      f.skipped = "no completed requests with more than one output token";
      return f;
    }
    const std::string common =
        "set grid\nset key below left Left reverse height 1\nset ylabel 'fraction of samples <= "
        "x'\n"
        "set yrange [0:1.02]\n";
    std::string script = "set multiplot layout 1,2 title 'TPOT and ITL per variant'\n" + common;
    script += "set title 'TPOT per request'\nset xlabel 'TPOT (ms)'\n";
    script += (tpot_plot.empty() ? "plot NaN notitle" : tpot_plot) + "\n";
    script += "set title 'Inter-token latency'\nset xlabel 'ITL (ms)'\n";
    script += (itl_plot.empty() ? "plot NaN notitle" : itl_plot) + "\n";
    script += "unset multiplot\n";
    f.path = render(f.name, 1500, 700 + 28 * static_cast<int>(runs.size()), script);
    return f;
  }

  Figure throughput_vs_tpot() {
    Figure f{"throughput_vs_tpot", "Output throughput against time per output token",
             "Each point is a run: mean TPOT against output throughput (output tokens / "
             "benchmark duration). Runs that differ only in workload.concurrency form one line, "
             "points labelled with the concurrency.",
             "", ""};
    struct Point {
      double tpot, tput, concurrency;
    };
    std::map<std::string, std::vector<Point>> series;
    std::vector<std::string> order;
    bool swept = false;
    for (const RunMeta& r : runs_) {
      double tpot = 0, tput = 0;
      if (!run_metric(db_, r.id, "tpot_ms_mean", &tpot) ||
          !run_metric(db_, r.id, "output_throughput_tok_s", &tput)) {
        continue;
      }
      std::string key;
      double concurrency = -1;
      for (const auto& [k, v] : r.params) {
        if (k == "workload.concurrency") {
          concurrency = std::atof(v.c_str());
          swept = true;
          continue;
        }
        const size_t dot = k.rfind('.');
        key +=
            (key.empty() ? "" : ", ") + k.substr(dot == std::string::npos ? 0 : dot + 1) + "=" + v;
      }
      if (key.empty()) key = swept ? "all" : r.short_label;
      if (backends_mixed()) key += " [" + r.backend + "]";
      if (!series.count(key)) order.push_back(key);
      series[key].push_back({tpot, tput, concurrency});
    }
    if (series.empty()) {
      f.skipped = "no run has both tpot_ms_mean and output_throughput_tok_s";
      return f;
    }
    if (!swept) {
      f.caption += " This experiment does not sweep workload.concurrency: one point per run.";
    }
    const size_t max_series = 12;
    if (order.size() > max_series) {
      f.caption += " Showing " + std::to_string(max_series) + " of " +
                   std::to_string(order.size()) + " series.";
      order.resize(max_series);
    }
    std::string plot;
    for (size_t i = 0; i < order.size(); ++i) {
      auto& pts = series[order[i]];
      std::sort(pts.begin(), pts.end(),
                [](const Point& a, const Point& b) { return a.concurrency < b.concurrency; });
      std::string rows;
      for (const Point& p : pts) {
        rows += num(p.tpot) + " " + num(p.tput) + " " +
                (p.concurrency >= 0 ? "c=" + num(p.concurrency) : std::string("-")) + "\n";
      }
      const std::string file = data_file("tput" + std::to_string(i) + ".dat", rows);
      plot += std::string(plot.empty() ? "plot " : ", ") + gp_quote(file) +
              " using 1:2 with linespoints lw 2 pt " + kPointTypes[i % std::size(kPointTypes)] +
              " ps " + num(2.4 - 0.25 * double(i % 5)) + " lc rgb '" + color(i) + "' title " +
              gp_quote(order[i]);
      if (swept) {
        plot += ", " + gp_quote(file) +
                " using 1:2:3 with labels offset char 1.2,0.6 left font ',11' notitle";
      }
    }
    std::string script =
        "set grid\nset key below left Left reverse height 1\nset title 'Output throughput against "
        "TPOT'\n"
        "set xlabel 'mean TPOT (ms)'\nset ylabel 'output throughput (tokens/s)'\n"
        "set offsets graph 0.08, graph 0.12, graph 0.08, graph 0.08\n" +
        plot + "\n";
    f.path = render(f.name, 1200, 760 + 28 * static_cast<int>(order.size()), script);
    return f;
  }

  Figure sim_vs_measured() {
    Figure f{"sim_vs_measured", "Simulated against measured, per metric",
             "One point per variant run on both backends: simulated (x) against measured (y). "
             "The line is y = x; the shaded band is ±10 % of it.",
             "", ""};
    std::map<int32_t, int64_t> sim, real;
    for (const RunMeta& r : runs_) (r.backend == "sim" ? sim : real)[r.variant_index] = r.id;
    std::vector<std::pair<int64_t, int64_t>> pairs;
    for (const auto& [variant, real_id] : real) {
      if (auto it = sim.find(variant); it != sim.end()) pairs.emplace_back(it->second, real_id);
    }
    if (pairs.empty()) {
      f.skipped = real.empty() ? "the database holds no measured (real backend) runs of these "
                                 "variants; run the experiment with backends: [sim, real] on a GPU"
                               : "no variant has both a simulated and a measured run";
      return f;
    }
    const std::pair<const char*, const char*> metrics[] = {
        {"tpot_ms_mean", "mean TPOT (ms)"},      {"tpot_ms_p99", "p99 TPOT (ms)"},
        {"itl_ms_p99", "p99 ITL (ms)"},          {"ttft_ms_mean", "mean TTFT (ms)"},
        {"step_ms_mean", "mean step time (ms)"}, {"output_throughput_tok_s", "throughput (tok/s)"}};
    std::string panels;
    int drawn = 0;
    for (const auto& [key, axis] : metrics) {
      std::string rows;
      double hi = 0;
      for (const auto& [sim_id, real_id] : pairs) {
        double s = 0, m = 0;
        if (!run_metric(db_, sim_id, key, &s) || !run_metric(db_, real_id, key, &m)) continue;
        rows += num(s) + " " + num(m) + "\n";
        hi = std::max({hi, s, m});
      }
      if (rows.empty()) continue;
      ++drawn;
      const std::string file = data_file(std::string("svm_") + key + ".dat", rows);
      const std::string range = "[0:" + num(hi * 1.15) + "]";
      panels += "set title " + gp_quote(key) + "\nset xlabel " +
                gp_quote(std::string("simulated ") + axis) + "\nset ylabel " +
                gp_quote(std::string("measured ") + axis) + "\nset xrange " + range +
                "\nset yrange " + range +
                "\nplot '+' using 1:(0.9*$1):(1.1*$1) with "
                "filledcurves fc rgb '#dddddd' title '±10%', x with lines lc rgb '#555555' "
                "dt 2 title 'y = x', " +
                gp_quote(file) + " using 1:2 with points pt 7 ps 1.5 lc rgb '" + color(0) +
                "' title 'variant'\n";
    }
    if (drawn == 0) {
      f.skipped = "paired runs share none of the compared metrics";
      return f;
    }
    const int cols = std::min(drawn, 3);
    const int rows = (drawn + cols - 1) / cols;
    std::string script = "set multiplot layout " + std::to_string(rows) + "," +
                         std::to_string(cols) + " title 'Simulated vs measured'\n" +
                         "set grid\nset key top left\nset size ratio -1\nset samples 200\n" +
                         panels + "unset multiplot\n";
    f.path = render(f.name, 520 * cols, 500 * rows + 60, script);
    return f;
  }

  Figure accept_length() {
    constexpr double kBin = 0.25;
    Figure f{"accept_length", "Accept length per decode step",
             "Histogram over decode steps of the tokens committed per request in the step "
             "(step tokens / batch), in bins [x, x + 0.25). Plain decoding commits 1 token per "
             "step, so every step falls in the bin at 1.",
             "", ""};
    std::string note;
    const auto runs = series_runs(&note);
    f.caption += note;
    std::string plot;
    double lo = 1e9, hi = -1e9;
    const double slot = kBin * 0.8 / double(runs.size());
    for (size_t i = 0; i < runs.size(); ++i) {
      const auto hist = accept_length_histogram(db_, runs[i]->id, kBin);
      if (hist.empty()) continue;
      std::string rows;
      for (const auto& [edge, frac] : hist) {
        rows += num(edge + slot * (double(i) + 0.5)) + " " + num(frac) + "\n";
        lo = std::min(lo, edge);
        hi = std::max(hi, edge + kBin);
      }
      const std::string file = data_file("accept" + std::to_string(i) + ".dat", rows);
      plot += std::string(plot.empty() ? "plot " : ", ") + gp_quote(file) +
              " using 1:2 with boxes lc rgb '" + color(i) + "' title " + gp_quote(legend(*runs[i]));
    }
    if (plot.empty()) {
      f.skipped = "no decode steps recorded";
      return f;
    }
    std::string script =
        "set grid ytics\nset key below left Left reverse height 1\n"
        "set style fill solid 0.85 border -1\nset boxwidth " +
        num(slot * 0.95) +
        " absolute\nset title 'Accept length per decode step'\n"
        "set xlabel 'accept length (tokens committed per request per step)'\n"
        "set ylabel 'fraction of decode steps'\nset yrange [0:1.05]\n"
        "set xrange [" +
        num(std::max(0.0, lo - 0.5)) + ":" + num(hi + 0.5) + "]\n" + plot + "\n";
    f.path = render(f.name, 1200, 700 + 28 * static_cast<int>(runs.size()), script);
    return f;
  }

  static const char* span_color(const SpanRow& s, bool even_step) {
    if (s.lane == "compute") {
      static const std::set<std::string> collectives = {"all_reduce", "all_gather", "all_to_all",
                                                        "send_recv"};
      if (collectives.count(s.name)) return "#d62728";  // in a collective, waiting included
      return even_step ? "#1f5fa8" : "#6fa8dc";
    }
    if (s.lane == "copy") return "#b8860b";
    static const std::map<std::string, const char*> host = {
        {"schedule", "#009E73"},        {"prepare_decode", "#CC79A7"},
        {"prepare_prefill", "#8c564b"}, {"process_outputs", "#E69F00"},
        {"launch_graph", "#D55E00"},    {"launch_kernel", "#D55E00"},
        {"copy_issue", "#F0E442"},      {"wait", "#d9d9d9"}};
    auto it = host.find(s.name);
    return it != host.end() ? it->second : "#7f7f7f";
  }

  Figure timeline() {
    Figure f{"timeline", "Step timeline: host lane and GPU stream lanes",
             "Each panel shows a few GPU steps of one run: the host lane (what the host "
             "thread does: schedule, prepare, launch, blocked waiting in light grey, process "
             "outputs), the compute stream (kernels; shades alternate per step) and the copy "
             "stream (device-to-host copies of step outputs). White space on the compute lane is "
             "a GPU bubble. Panels share the time axis.",
             "", ""};
    struct Panel {
      const RunMeta* run;
      std::vector<SpanRow> spans;
      int64_t t0;
      int32_t ranks;
      double idle_host_ms;
    };
    std::vector<Panel> panels;
    int64_t span_ns = 0;
    for (const RunMeta& r : runs_) {
      if (panels.size() >= static_cast<size_t>(std::min(options_.max_series, 6))) break;
      std::vector<SpanRow> spans = timeline_spans(db_, r.id);
      int64_t begin = 0, end = 0;
      if (!clip_to_gpu_steps(spans, options_.timeline_steps, &begin, &end)) continue;
      Panel p{&r, std::move(spans), begin, 1, 0};
      int64_t first_step = INT64_MAX, last_step = INT64_MIN;
      for (const SpanRow& s : p.spans) {
        p.ranks = std::max(p.ranks, s.rank + 1);
        if (s.lane != "compute") continue;
        first_step = std::min(first_step, s.step);
        last_step = std::max(last_step, s.step);
      }
      span_ns = std::max(span_ns, end - begin);
      const QueryResult idle = db_.query_params(
          "SELECT avg(idle_host_ns) / 1e6 FROM step_sample WHERE run_id = ?1 AND step BETWEEN "
          "?2 AND ?3",
          {r.id, first_step, last_step});
      if (!idle.rows.empty()) {
        if (const auto* d = std::get_if<double>(&idle.rows[0][0])) p.idle_host_ms = *d;
      }
      panels.push_back(std::move(p));
    }
    if (panels.empty()) {
      f.skipped =
          "no run has a timeline; add `trace: {first_step: 100, steps: 4}` to the "
          "experiment and run it again";
      return f;
    }
    const double x_max_ms = double(span_ns) / 1e6;
    std::string script = "set multiplot layout " + std::to_string(panels.size()) + ",1 title " +
                         gp_quote("Step timeline: " + std::to_string(options_.timeline_steps) +
                                  " GPU steps per run, time from the first one's first kernel") +
                         "\n"
                         "set lmargin at screen 0.135\nset rmargin at screen 0.715\n"
                         "set style fill solid 1.0 border\nset grid xtics\n"
                         "set xrange [0:" +
                         num(x_max_ms) + "]\nset xlabel 'time (ms)'\n";
    for (size_t p = 0; p < panels.size(); ++p) {
      const Panel& panel = panels[p];
      const int lanes = 3 * panel.ranks;
      std::string rows, ytics;
      for (const SpanRow& s : panel.spans) {
        const int lane = s.lane == "host" ? 0 : s.lane == "compute" ? 1 : 2;
        const double y = double(lanes - 1 - (3 * s.rank + lane));
        const double x0 = double(s.start_ns - panel.t0) / 1e6;
        const double half = double(s.dur_ns) / 2e6;
        std::string hex = span_color(s, s.step % 2 == 0) + 1;
        rows += num(x0 + half) + " " + num(y) + " " + num(half) + " 0.36 " +
                std::to_string(std::strtol(hex.c_str(), nullptr, 16)) + "\n";
      }
      for (int r = 0; r < panel.ranks; ++r) {
        const std::string prefix = panel.ranks > 1 ? "rank " + std::to_string(r) + " " : "";
        const char* names[] = {"host", "compute stream", "copy stream"};
        for (int l = 0; l < 3; ++l) {
          ytics += std::string(ytics.empty() ? "" : ", ") + gp_quote(prefix + names[l]) + " " +
                   std::to_string(lanes - 1 - (3 * r + l));
        }
      }
      const std::string file = data_file("timeline" + std::to_string(p) + ".dat", rows);
      char idle[96];
      std::snprintf(idle, sizeof idle, " (GPU idle waiting for the host: %.2f ms/step)",
                    panel.idle_host_ms);
      script += "set title " + gp_quote(panel.run->short_label + idle) + "\n";
      script += "set ytics (" + ytics + ")\nset yrange [-0.6:" + num(lanes - 0.4) + "]\n";
      if (p == 0) {
        script +=
            "set key at screen 0.725, graph 1.0 left top vertical Left reverse samplen 1 maxrows 6 "
            "font ',9'\n";
      } else {
        script += "set key off\n";
      }
      if (p + 1 < panels.size()) script += "set xlabel ''\n";
      if (p + 1 == panels.size()) script += "set xlabel 'time (ms)'\n";
      script += "plot " + gp_quote(file) +
                " using 1:2:3:4:5 with boxxyerror fc rgb variable lc rgb variable notitle";
      if (p == 0) {
        const std::pair<const char*, const char*> keys[] = {{"schedule", "#009E73"},
                                                            {"prepare_decode", "#CC79A7"},
                                                            {"prepare_prefill", "#8c564b"},
                                                            {"launch", "#D55E00"},
                                                            {"copy_issue", "#F0E442"},
                                                            {"host blocked (wait)", "#d9d9d9"},
                                                            {"process_outputs", "#E69F00"},
                                                            {"GPU kernels (even step)", "#1f5fa8"},
                                                            {"GPU kernels (odd step)", "#6fa8dc"},
                                                            {"collective (incl. wait)", "#d62728"},
                                                            {"D2H copy", "#b8860b"}};
        for (const auto& [name, c] : keys) {
          script += std::string(", NaN with boxes fc rgb '") + c + "' title " + gp_quote(name);
        }
      }
      script += "\n";
    }
    script += "unset multiplot\n";
    int height_px = 80;
    for (const Panel& panel : panels) height_px += std::max(300, 120 + 66 * panel.ranks);
    f.path = render(f.name, 1600, height_px, script);
    return f;
  }

  Figure collective_waits() {
    Figure f{"collective_waits", "Collective waits per rank",
             "Mean time per decode step each rank spent in collectives waiting for its group's "
             "late rank or a pipeline receive's data (collective_wait_ns; simulated runs), per "
             "rank of each multi-rank run.",
             "", ""};
    std::vector<std::pair<const RunMeta*, std::vector<std::pair<int32_t, double>>>> runs;
    int32_t max_rank = 0;
    for (const RunMeta& r : runs_) {
      if (r.backend != "sim") continue;  // the real backend does not measure the waits
      auto waits = collective_wait_ms_by_rank(db_, r.id);
      if (waits.empty()) continue;
      max_rank = std::max(max_rank, waits.back().first);
      runs.emplace_back(&r, std::move(waits));
      if (runs.size() >= static_cast<size_t>(options_.max_series)) break;
    }
    if (runs.empty()) {
      f.skipped = "no simulated multi-rank runs among these runs";
      return f;
    }
    const double slot = 0.8 / double(runs.size());
    std::string plot;
    for (size_t i = 0; i < runs.size(); ++i) {
      std::string rows;
      for (const auto& [rank, ms] : runs[i].second) {
        rows += num(rank - 0.4 + slot * (double(i) + 0.5)) + " " + num(ms) + "\n";
      }
      const std::string file = data_file("coll" + std::to_string(i) + ".dat", rows);
      plot += std::string(plot.empty() ? "plot " : ", ") + gp_quote(file) +
              " using 1:2 with boxes lc rgb '" + color(i) + "' title " +
              gp_quote(legend(*runs[i].first));
    }
    std::string script =
        "set grid ytics\nset key below left Left reverse height 1\n"
        "set style fill solid 0.85 border -1\nset boxwidth " +
        num(slot * 0.9) +
        " absolute\nset title 'Collective waits per rank'\nset xlabel 'rank'\n"
        "set ylabel 'mean collective wait per decode step (ms)'\n"
        "set xrange [-0.6:" +
        num(max_rank + 0.6) +
        "]\nset xtics 1\n"
        "set yrange [0:*]\nset offsets 0, 0, graph 0.1, 0\n" +
        plot + "\n";
    f.path = render(f.name, 1200, 700 + 28 * static_cast<int>(runs.size()), script);
    return f;
  }

  ResultsDb& db_;
  const PlotOptions& options_;
  std::vector<RunMeta> runs_;
  std::string gnuplot_;
  ScratchDir scratch_;
};

}  // namespace

std::vector<Figure> plot_runs(ResultsDb& db, const std::vector<int64_t>& run_ids,
                              const PlotOptions& options) {
  if (run_ids.empty()) throw Error("no runs to plot");
  Plotter plotter(db, run_ids, options);
  return plotter.all();
}

}  // namespace twinstep
