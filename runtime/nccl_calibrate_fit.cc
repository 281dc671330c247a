// The CPU half of runtime/nccl_calibrate.h: alpha-beta fits of collective times, the table,
// and the calibration profile update.
#include <unistd.h>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "policies/error.h"
#include "results/json.h"
#include "runtime/nccl_calibrate.h"
#include "simulator/calibration.h"

namespace twinstep {
namespace {

std::string format(const char* fmt, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, a);
  return buf;
}

std::vector<const NcclPoint*> select(std::span<const NcclPoint> points, NcclCollective coll,
                                     const std::string& mode) {
  std::vector<const NcclPoint*> out;
  for (const NcclPoint& p : points) {
    if (p.coll == coll && p.mode == mode && p.median_ns > 0) out.push_back(&p);
  }
  return out;
}

// A message size as the table and the measurement keys write it: 8K, 64M.
std::string size_text(int64_t bytes) {
  if (bytes >= (int64_t(1) << 20) && bytes % (int64_t(1) << 20) == 0)
    return std::to_string(bytes >> 20) + "M";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + "K";
  return std::to_string(bytes);
}

// Max relative error of alpha + x / beta over the points (beta 0: no bandwidth term).
double max_rel_err(const std::vector<const NcclPoint*>& pts, double alpha_ns, double beta_gbps) {
  double worst = 0;
  for (const NcclPoint* p : pts) {
    const double fit = alpha_ns + (beta_gbps > 0 ? p->bus_bytes() / beta_gbps : 0);
    worst = std::max(worst, std::abs(fit - p->median_ns) / p->median_ns);
  }
  return worst;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The skew measurements and curves of apply_nccl_calibration (issue #11); a short account.
std::string apply_skew(CalibrationProfile& profile, std::span<const NcclSkewPoint> skew) {
  std::vector<std::pair<std::string, double>>& m = profile.measurements;
  for (const NcclSkewPoint& p : skew) {
    const std::string key = std::string("nccl.skew.") + nccl_collective_name(p.coll) + "." +
                            p.mode + "." + size_text(p.bytes) + ".delay" +
                            std::to_string(std::llround(p.delay_ns)) + ".";
    m.emplace_back(key + "total_ns", p.total_ns);
    m.emplace_back(key + "spin_ns", p.spin_ns);
    m.emplace_back(key + "skew_ns", p.skew_ns());
    m.emplace_back(key + "late_ns", p.late_ns());
    m.emplace_back(key + "extra_ns", p.extra_ns());
  }
  HardwareSpec& hw = profile.hw;
  const bool had = !hw.collective_skew.empty();
  hw.collective_skew.clear();
  hw.collective_skew_ranks = 0;
  std::string out;
  for (const SkewFit& f : fit_skew(skew)) {
    if (f.ranks < 2 || f.points.empty()) continue;
    m.emplace_back(std::string("nccl.skew.fit.") + nccl_collective_name(f.coll) + "." + f.mode +
                       ".max_size_dev_ns",
                   f.max_size_dev_ns);
    hw.collective_skew_ranks = f.ranks;
    hw.collective_skew.push_back({nccl_collective_name(f.coll), f.mode == "graph", f.points});
    out += std::string("collective_skew.") + nccl_collective_name(f.coll) + "." + f.mode + ": " +
           std::to_string(f.points.size()) + " points, extra " +
           format("%.0f", f.points.front().extra_ns) + " .. " +
           format("%.0f", f.points.back().extra_ns) + " ns\n";
  }
  if (had && hw.collective_skew.empty()) {
    out += "collective_skew: dropped (no skewed-arrival sweep in this calibration)\n";
  }
  return out;
}

}  // namespace

const char* nccl_collective_name(NcclCollective c) {
  switch (c) {
    case NcclCollective::kAllReduce:
      return "all_reduce";
    case NcclCollective::kAllGather:
      return "all_gather";
    case NcclCollective::kAllToAll:
      return "all_to_all";
    case NcclCollective::kSendRecv:
      return "send_recv";
  }
  return "?";
}

double nccl_bus_factor(NcclCollective c, int ranks) {
  const double g = std::max(1, ranks);
  switch (c) {
    case NcclCollective::kAllReduce:
      return 2.0 * (g - 1) / g;
    case NcclCollective::kAllGather:
    case NcclCollective::kAllToAll:
      return (g - 1) / g;
    case NcclCollective::kSendRecv:
      return 1.0;
  }
  return 1.0;
}

CollectiveFit fit_collective(std::span<const NcclPoint> points, NcclCollective coll,
                             const std::string& mode) {
  CollectiveFit f;
  f.coll = coll;
  f.mode = mode;
  const std::vector<const NcclPoint*> pts = select(points, coll, mode);
  f.samples = int64_t(pts.size());
  if (pts.size() < 2) return f;
  const Eigen::Index m = Eigen::Index(pts.size());
  double max_x = 0;
  for (const NcclPoint* p : pts) max_x = std::max(max_x, p->bus_bytes());
  // Rows weighted by 1 / t: the residual of row i is the relative error of point i. The bytes
  // column is scaled to unit maximum before solving (then unscaled).
  const bool bandwidth = max_x > 0;
  Eigen::MatrixXd a(m, bandwidth ? 2 : 1);
  Eigen::VectorXd b = Eigen::VectorXd::Ones(m);
  for (Eigen::Index i = 0; i < m; ++i) {
    const NcclPoint& p = *pts[size_t(i)];
    a(i, 0) = 1.0 / p.median_ns;
    if (bandwidth) a(i, 1) = (p.bus_bytes() / max_x) / p.median_ns;
  }
  const Eigen::VectorXd x = nnls(a, b);
  f.fitted = true;
  f.alpha_ns = x(0);
  const double ns_per_byte = bandwidth ? x(1) / max_x : 0;
  f.beta_gbps = ns_per_byte > 0 ? 1.0 / ns_per_byte : 0;
  double mean = 0;
  for (const NcclPoint* p : pts) mean += p->median_ns;
  mean /= double(pts.size());
  double ss_res = 0, ss_tot = 0;
  for (const NcclPoint* p : pts) {
    const double fit = f.alpha_ns + p->bus_bytes() * ns_per_byte;
    ss_res += (fit - p->median_ns) * (fit - p->median_ns);
    ss_tot += (p->median_ns - mean) * (p->median_ns - mean);
  }
  f.r2 = ss_tot > 0 ? 1.0 - ss_res / ss_tot : (ss_res == 0 ? 1.0 : 0.0);
  f.max_rel_err = max_rel_err(pts, f.alpha_ns, f.beta_gbps);
  return f;
}

std::vector<CollectiveFit> fit_collectives(std::span<const NcclPoint> points) {
  std::vector<CollectiveFit> out;
  for (NcclCollective c : kNcclCollectives) {
    for (const char* mode : {"eager", "graph"}) {
      if (select(points, c, mode).empty()) continue;
      out.push_back(fit_collective(points, c, mode));
    }
  }
  return out;
}

std::pair<double, double> fit_alpha_with_beta(std::span<const NcclPoint> points,
                                              NcclCollective coll, const std::string& mode,
                                              double beta_gbps) {
  const std::vector<const NcclPoint*> pts = select(points, coll, mode);
  if (pts.empty()) return {0, 0};
  // min over alpha of sum ((alpha + x_i / beta - t_i) / t_i)^2, alpha >= 0.
  double num = 0, den = 0;
  for (const NcclPoint* p : pts) {
    const double rest = p->median_ns - (beta_gbps > 0 ? p->bus_bytes() / beta_gbps : 0);
    num += rest / (p->median_ns * p->median_ns);
    den += 1.0 / (p->median_ns * p->median_ns);
  }
  const double alpha = std::max(0.0, num / den);
  return {alpha, max_rel_err(pts, alpha, beta_gbps)};
}

std::string nccl_table(std::span<const NcclPoint> points) {
  std::string out =
      "collective  mode         bytes   ops x reps   median_us      p90_us  algbw_GBps  "
      "busbw_GBps\n";
  // By collective, then mode, then size (the measurement interleaves the modes per size).
  std::vector<const NcclPoint*> sorted;
  for (const NcclPoint& p : points) sorted.push_back(&p);
  std::stable_sort(sorted.begin(), sorted.end(), [](const NcclPoint* a, const NcclPoint* b) {
    return std::tie(a->coll, a->mode, a->bytes) < std::tie(b->coll, b->mode, b->bytes);
  });
  for (const NcclPoint* q : sorted) {
    const NcclPoint& p = *q;
    char line[200];
    std::snprintf(line, sizeof line,
                  "%-10s  %-5s  %12lld  %4lld x %-4lld  %10.2f  %10.2f  %10.2f  %10.2f\n",
                  nccl_collective_name(p.coll), p.mode.c_str(), static_cast<long long>(p.bytes),
                  static_cast<long long>(p.ops), static_cast<long long>(p.reps), p.median_ns / 1e3,
                  p.p90_ns / 1e3, p.algbw_gbps(), p.busbw_gbps());
    out += line;
  }
  return out;
}

std::string nccl_fit_report(std::span<const CollectiveFit> fits) {
  std::string out =
      "fit: time = alpha + bus_bytes / beta (NNLS on relative error)\n"
      "collective  mode    alpha_us   beta_GBps        R2  max_rel_err  points\n";
  for (const CollectiveFit& f : fits) {
    char line[200];
    if (!f.fitted) {
      std::snprintf(line, sizeof line, "%-10s  %-5s  not fitted (%lld points; needs 2)\n",
                    nccl_collective_name(f.coll), f.mode.c_str(),
                    static_cast<long long>(f.samples));
    } else {
      std::snprintf(line, sizeof line, "%-10s  %-5s  %9.2f  %10.1f  %8.5f  %11.3f  %6lld\n",
                    nccl_collective_name(f.coll), f.mode.c_str(), f.alpha_ns / 1e3, f.beta_gbps,
                    f.r2, f.max_rel_err, static_cast<long long>(f.samples));
    }
    out += line;
  }
  return out;
}

std::string apply_nccl_calibration(CalibrationProfile& profile, std::span<const NcclPoint> points,
                                   std::span<const CollectiveFit> fits,
                                   std::span<const NcclSkewPoint> skew) {
  std::vector<std::pair<std::string, double>>& m = profile.measurements;
  int ranks = 0;
  for (const NcclPoint& p : points) ranks = std::max(ranks, p.ranks);
  // An earlier calibration on another number of GPUs stays as a group of its own: its primary
  // tables and fits become nccl.r<N>.* (N its nccl.ranks; its skew rows and the profile figures
  // derived from it go), and its r<N> groups stay, but for the one this run measures.
  int earlier = 0;
  for (const auto& [key, value] : m)
    if (key == "nccl.ranks") earlier = int(value);
  std::vector<std::pair<std::string, double>> kept;
  for (const auto& [key, value] : m) {
    if (key.rfind("nccl.", 0) != 0) {
      kept.emplace_back(key, value);
    } else if (const int g = nccl_key_group(key); g != 0) {
      if (g != ranks) kept.emplace_back(key, value);
    } else if (earlier >= 2 && earlier != ranks && ranks >= 2 && key != "nccl.ranks" &&
               key.rfind("nccl.skew.", 0) != 0 && key.rfind("nccl.profile.", 0) != 0) {
      kept.emplace_back("nccl.r" + std::to_string(earlier) + "." + key.substr(5), value);
    }
  }
  m = std::move(kept);
  m.emplace_back("nccl.ranks", ranks);
  for (const NcclPoint& p : points) {
    const std::string key = std::string("nccl.") + nccl_collective_name(p.coll) + "." + p.mode +
                            "." + size_text(p.bytes) + ".";
    m.emplace_back(key + "median_ns", p.median_ns);
    m.emplace_back(key + "p90_ns", p.p90_ns);
    m.emplace_back(key + "algbw_gbps", p.algbw_gbps());
    m.emplace_back(key + "busbw_gbps", p.busbw_gbps());
  }
  for (const CollectiveFit& f : fits) {
    if (!f.fitted) continue;
    const std::string key =
        std::string("nccl.fit.") + nccl_collective_name(f.coll) + "." + f.mode + ".";
    m.emplace_back(key + "alpha_ns", f.alpha_ns);
    m.emplace_back(key + "beta_gbps", f.beta_gbps);
    m.emplace_back(key + "r2", f.r2);
    m.emplace_back(key + "max_rel_err", f.max_rel_err);
    m.emplace_back(key + "samples", double(f.samples));
  }

  const std::string skew_changes = apply_skew(profile, skew);

  const CollectiveFit* ar = nullptr;
  for (const CollectiveFit& f : fits) {
    if (f.coll == NcclCollective::kAllReduce && f.mode == "graph" && f.fitted) ar = &f;
  }
  if (ranks < 2) {
    return skew_changes +
           "one rank: no link measured; the profile's collective figures are unchanged "
           "(measurements added)\n";
  }
  if (ar == nullptr || !(ar->beta_gbps > 0)) {
    return skew_changes +
           "no graph-mode all-reduce fit with a bandwidth term; the profile's collective "
           "figures are unchanged (measurements added)\n";
  }
  HardwareSpec& hw = profile.hw;
  std::string out = skew_changes;
  auto set = [&](const char* field, double before, double after) {
    out += std::string(field) + ": " + format("%g", before) + " -> " + format("%g", after) + "\n";
  };
  set("interconnect_gbps", hw.interconnect_gbps, ar->beta_gbps);
  hw.interconnect_gbps = ar->beta_gbps;
  m.emplace_back("nccl.profile.interconnect_gbps", ar->beta_gbps);
  struct Target {
    NcclCollective coll;
    int64_t HardwareSpec::*field;
    const char* name;
  };
  const Target targets[] = {
      {NcclCollective::kAllReduce, &HardwareSpec::allreduce_alpha_ns, "allreduce_alpha_ns"},
      {NcclCollective::kAllToAll, &HardwareSpec::alltoall_alpha_ns, "alltoall_alpha_ns"},
      {NcclCollective::kSendRecv, &HardwareSpec::p2p_alpha_ns, "p2p_alpha_ns"},
  };
  for (const Target& t : targets) {
    if (select(points, t.coll, "graph").empty()) continue;
    const auto [alpha, err] = fit_alpha_with_beta(points, t.coll, "graph", ar->beta_gbps);
    const int64_t v = std::llround(alpha);
    set(t.name, double(hw.*t.field), double(v));
    hw.*t.field = v;
    m.emplace_back(std::string("nccl.profile.") + t.name, double(v));
    m.emplace_back(std::string("nccl.profile.") + nccl_collective_name(t.coll) + ".max_rel_err",
                   err);
  }
  // All-gather is priced with the all-reduce alpha (CostModel::collective_ns): its error there.
  if (!select(points, NcclCollective::kAllGather, "graph").empty()) {
    const std::vector<const NcclPoint*> pts = select(points, NcclCollective::kAllGather, "graph");
    m.emplace_back("nccl.profile.all_gather.max_rel_err",
                   max_rel_err(pts, double(hw.allreduce_alpha_ns), ar->beta_gbps));
  }
  return out;
}

// ---- skewed arrival (issue #11) -----------------------------------------------------------

std::vector<SkewFit> fit_skew(std::span<const NcclSkewPoint> points) {
  std::vector<SkewFit> out;
  for (NcclCollective c : kNcclCollectives) {
    for (const char* mode : {"eager", "graph"}) {
      std::vector<const NcclSkewPoint*> pts;
      std::vector<double> delays;
      std::vector<int64_t> sizes;
      for (const NcclSkewPoint& p : points) {
        if (p.coll != c || p.mode != mode) continue;
        pts.push_back(&p);
        delays.push_back(p.delay_ns);
        sizes.push_back(p.bytes);
      }
      if (pts.empty()) continue;
      std::sort(delays.begin(), delays.end());
      delays.erase(std::unique(delays.begin(), delays.end()), delays.end());
      std::sort(sizes.begin(), sizes.end());
      SkewFit f;
      f.coll = c;
      f.mode = mode;
      f.sizes = int64_t(std::unique(sizes.begin(), sizes.end()) - sizes.begin());
      for (const NcclSkewPoint* p : pts) f.ranks = std::max(f.ranks, p->ranks);
      for (const double d : delays) {
        std::vector<double> skews, extras;
        for (const NcclSkewPoint* p : pts) {
          if (p->delay_ns != d) continue;
          skews.push_back(p->skew_ns());
          extras.push_back(p->extra_ns());
        }
        const double extra = median(extras);
        for (const double e : extras) {
          f.max_size_dev_ns = std::max(f.max_size_dev_ns, std::abs(e - extra));
        }
        const HardwareSpec::SkewPoint q{std::max(0.0, median(skews)), std::max(0.0, extra)};
        if (!f.points.empty() && q.skew_ns <= f.points.back().skew_ns) continue;
        f.points.push_back(q);
      }
      out.push_back(std::move(f));
    }
  }
  return out;
}

std::string nccl_skew_table(std::span<const NcclSkewPoint> points) {
  std::string out =
      "skewed arrival: per repetition [spin, collective], the last rank's spin delayed\n"
      "collective  mode         bytes   ops x reps  delay_us  total_us   spin_us   skew_us  "
      "late_us  extra_us\n";
  std::vector<const NcclSkewPoint*> sorted;
  for (const NcclSkewPoint& p : points) sorted.push_back(&p);
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) {
    return std::tie(a->coll, a->mode, a->bytes, a->delay_ns) <
           std::tie(b->coll, b->mode, b->bytes, b->delay_ns);
  });
  for (const NcclSkewPoint* q : sorted) {
    const NcclSkewPoint& p = *q;
    char line[220];
    std::snprintf(line, sizeof line,
                  "%-10s  %-5s  %12lld  %4lld x %-4lld  %8.2f  %8.2f  %8.2f  %8.2f  %7.2f  %8.2f\n",
                  nccl_collective_name(p.coll), p.mode.c_str(), static_cast<long long>(p.bytes),
                  static_cast<long long>(p.ops), static_cast<long long>(p.reps), p.delay_ns / 1e3,
                  p.total_ns / 1e3, p.spin_ns / 1e3, p.skew_ns() / 1e3, p.late_ns() / 1e3,
                  p.extra_ns() / 1e3);
    out += line;
  }
  return out;
}

std::string nccl_skew_fit_report(std::span<const SkewFit> fits) {
  std::string out =
      "skew fit: the late rank's extra by skew, median over sizes (collective_skew)\n"
      "collective  mode   sizes  max_size_dev_us  points [skew_us extra_us]\n";
  for (const SkewFit& f : fits) {
    char line[120];
    std::snprintf(line, sizeof line, "%-10s  %-5s  %5lld  %15.2f ", nccl_collective_name(f.coll),
                  f.mode.c_str(), static_cast<long long>(f.sizes), f.max_size_dev_ns / 1e3);
    out += line;
    for (const HardwareSpec::SkewPoint& p : f.points) {
      std::snprintf(line, sizeof line, " [%.2f %.2f]", p.skew_ns / 1e3, p.extra_ns / 1e3);
      out += line;
    }
    out += "\n";
  }
  return out;
}

std::string nccl_record_json(const ProfileHeader& header, const std::string& nccl_version,
                             std::span<const NcclPoint> points, std::span<const CollectiveFit> fits,
                             std::span<const NcclSkewPoint> skew) {
  auto num = [](double v) { return std::isfinite(v) ? format_double_exact(v) : "null"; };
  int ranks = 0;
  for (const NcclPoint& p : points) ranks = std::max(ranks, p.ranks);
  std::string o = "{\n";
  o += " \"command\": " + json_quote(header.command) + ",\n";
  o += " \"commit\": " + json_quote(header.commit) + ",\n";
  o += " \"gpu\": " + json_quote(header.gpu) + ",\n";
  o += " \"date\": " + json_quote(header.date) + ",\n";
  o += " \"driver\": " + json_quote(header.driver) + ",\n";
  o += " \"nccl\": " + json_quote(nccl_version) + ",\n";
  o += " \"ranks\": " + std::to_string(ranks) + ",\n";
  o += " \"rows\": [";
  bool first = true;
  for (const NcclPoint& p : points) {
    const CollectiveFit* fit = nullptr;
    for (const CollectiveFit& f : fits) {
      if (f.coll == p.coll && f.mode == p.mode && f.fitted) fit = &f;
    }
    const double fit_ns =
        fit ? fit->alpha_ns + (fit->beta_gbps > 0 ? p.bus_bytes() / fit->beta_gbps : 0) : 0;
    o += first ? "\n" : ",\n";
    first = false;
    o += "  {\"collective\": " + json_quote(nccl_collective_name(p.coll)) +
         ", \"mode\": " + json_quote(p.mode) + ", \"ranks\": " + std::to_string(p.ranks) +
         ", \"bytes\": " + std::to_string(p.bytes) + ", \"ops\": " + std::to_string(p.ops) +
         ", \"reps\": " + std::to_string(p.reps) + ", \"median_us\": " + num(p.median_ns / 1e3) +
         ", \"p90_us\": " + num(p.p90_ns / 1e3) + ", \"min_us\": " + num(p.min_ns / 1e3) +
         ", \"algbw_gbps\": " + num(p.algbw_gbps()) + ", \"busbw_gbps\": " + num(p.busbw_gbps());
    if (fit != nullptr) {
      o += ", \"fit_us\": " + num(fit_ns / 1e3) +
           ", \"fit_rel_err\": " + num((fit_ns - p.median_ns) / p.median_ns);
    }
    o += "}";
  }
  o += "\n ],\n \"fits\": [";
  first = true;
  for (const CollectiveFit& f : fits) {
    if (!f.fitted) continue;
    o += first ? "\n" : ",\n";
    first = false;
    o += "  {\"collective\": " + json_quote(nccl_collective_name(f.coll)) +
         ", \"mode\": " + json_quote(f.mode) + ", \"alpha_us\": " + num(f.alpha_ns / 1e3) +
         ", \"beta_gbps\": " + num(f.beta_gbps) + ", \"r2\": " + num(f.r2) +
         ", \"max_rel_err\": " + num(f.max_rel_err) + ", \"points\": " + std::to_string(f.samples) +
         "}";
  }
  o += "\n ]";
  if (!skew.empty()) {
    o += ",\n \"skew_rows\": [";
    first = true;
    for (const NcclSkewPoint& p : skew) {
      o += first ? "\n" : ",\n";
      first = false;
      o += "  {\"collective\": " + json_quote(nccl_collective_name(p.coll)) +
           ", \"mode\": " + json_quote(p.mode) + ", \"ranks\": " + std::to_string(p.ranks) +
           ", \"bytes\": " + std::to_string(p.bytes) + ", \"ops\": " + std::to_string(p.ops) +
           ", \"reps\": " + std::to_string(p.reps) + ", \"delay_us\": " + num(p.delay_ns / 1e3) +
           ", \"total_us\": " + num(p.total_ns / 1e3) + ", \"spin_us\": " + num(p.spin_ns / 1e3) +
           ", \"skew_us\": " + num(p.skew_ns() / 1e3) + ", \"late_us\": " + num(p.late_ns() / 1e3) +
           ", \"extra_us\": " + num(p.extra_ns() / 1e3) + "}";
    }
    o += "\n ],\n \"skew_fits\": [";
    first = true;
    for (const SkewFit& f : fit_skew(skew)) {
      o += first ? "\n" : ",\n";
      first = false;
      o += "  {\"collective\": " + json_quote(nccl_collective_name(f.coll)) +
           ", \"mode\": " + json_quote(f.mode) + ", \"sizes\": " + std::to_string(f.sizes) +
           ", \"max_size_dev_us\": " + num(f.max_size_dev_ns / 1e3) + ", \"points\": [";
      for (size_t i = 0; i < f.points.size(); ++i) {
        o += (i > 0 ? ", [" : "[") + num(f.points[i].skew_ns / 1e3) + ", " +
             num(f.points[i].extra_ns / 1e3) + "]";
      }
      o += "]}";
    }
    o += "\n ]";
  }
  o += "\n}\n";
  return o;
}

std::string preset_for_gpu(const std::string& gpu_name) {
  std::string gpu = gpu_name;
  for (char& c : gpu) c = char(std::tolower(static_cast<unsigned char>(c)));
  for (const char* p : {"h200", "h100", "h20", "b200", "b300"}) {  // h200 before h20
    if (gpu.find(p) != std::string::npos) return p;
  }
  return "";
}

void write_profile_file(const CalibrationProfile& profile, const std::string& path) {
  const std::string text = write_calibration_profile(profile);
  const std::filesystem::path target(path);
  std::string tmp_name = ".";  // appended piecewise: GCC 12 misreports "." + string (-Wrestrict)
  tmp_name += target.filename().string();
  tmp_name += ".tmp.";
  tmp_name += std::to_string(long(::getpid()));
  const std::filesystem::path tmp = target.parent_path() / tmp_name;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw Error("cannot write " + tmp.string());
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, target, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw Error("cannot rename " + tmp.string() + " to " + path + ": " + ec.message());
  }
}

}  // namespace twinstep
