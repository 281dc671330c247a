#include "simulator/calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "policies/error.h"

namespace twinstep {
namespace {

// Unconstrained least squares on the columns in `passive` (the others held at zero).
Eigen::VectorXd solve_passive(const Eigen::MatrixXd& a, const Eigen::VectorXd& b,
                              const std::vector<bool>& passive) {
  std::vector<Eigen::Index> cols;
  for (Eigen::Index j = 0; j < a.cols(); ++j) {
    if (passive[size_t(j)]) cols.push_back(j);
  }
  Eigen::MatrixXd ap(a.rows(), Eigen::Index(cols.size()));
  for (size_t k = 0; k < cols.size(); ++k) ap.col(Eigen::Index(k)) = a.col(cols[k]);
  const Eigen::VectorXd zp = ap.completeOrthogonalDecomposition().solve(b);
  Eigen::VectorXd z = Eigen::VectorXd::Zero(a.cols());
  for (size_t k = 0; k < cols.size(); ++k) z(cols[k]) = zp(Eigen::Index(k));
  return z;
}

double median(std::vector<double> v) { return distribution(std::move(v)).p50_ns; }

bool has_kind(const std::vector<CalibrationSample>& s, const char* kind) {
  return std::any_of(s.begin(), s.end(),
                     [&](const CalibrationSample& x) { return x.kind == kind; });
}

std::vector<double> values(const std::vector<CalibrationSample>& s, const char* kind,
                           const char* mode = nullptr) {
  std::vector<double> v;
  for (const CalibrationSample& x : s) {
    if (x.kind == kind && (mode == nullptr || x.mode == mode)) v.push_back(x.value_ns);
  }
  return v;
}

KernelClass class_by_name(const std::string& name) {
  for (int c = 0; c < int(KernelClass::kCount); ++c) {
    if (name == kernel_class_name(KernelClass(c))) return KernelClass(c);
  }
  throw Error("calibration sample has unknown kernel class '" + name + "'");
}

}  // namespace

Eigen::VectorXd nnls(const Eigen::MatrixXd& a, const Eigen::VectorXd& b) {
  if (a.rows() != b.size() || a.rows() < 1 || a.cols() < 1) {
    throw Error("nnls: matrix is " + std::to_string(a.rows()) + "x" + std::to_string(a.cols()) +
                " but the right-hand side has " + std::to_string(b.size()) + " rows");
  }
  const Eigen::Index n = a.cols();
  // Lawson–Hanson's tolerance on the dual: a few ulps of the problem's scale.
  const double tol = 10 * std::numeric_limits<double>::epsilon() *
                     a.cwiseAbs().colwise().sum().maxCoeff() * double(std::max(a.rows(), n));
  std::vector<bool> passive(size_t(n), false);
  Eigen::VectorXd x = Eigen::VectorXd::Zero(n);
  Eigen::VectorXd w = a.transpose() * (b - a * x);
  // Each outer step adds one column; the inner loop removes at least one per pass, so 3n outer
  // steps is Lawson–Hanson's practical bound.
  for (Eigen::Index outer = 0; outer < 3 * n; ++outer) {
    Eigen::Index best = -1;
    for (Eigen::Index j = 0; j < n; ++j) {
      if (!passive[size_t(j)] && w(j) > tol && (best < 0 || w(j) > w(best))) best = j;
    }
    if (best < 0) break;  // Kuhn–Tucker conditions hold
    passive[size_t(best)] = true;
    for (;;) {
      const Eigen::VectorXd z = solve_passive(a, b, passive);
      bool feasible = true;
      for (Eigen::Index j = 0; j < n; ++j) feasible &= !passive[size_t(j)] || z(j) > 0;
      if (feasible) {
        x = z;
        break;
      }
      // Step from x towards z as far as feasibility allows; the blocking variables leave.
      double alpha = 1;
      for (Eigen::Index j = 0; j < n; ++j) {
        if (passive[size_t(j)] && z(j) <= 0) alpha = std::min(alpha, x(j) / (x(j) - z(j)));
      }
      x += alpha * (z - x);
      for (Eigen::Index j = 0; j < n; ++j) {
        if (passive[size_t(j)] && x(j) <= tol) {
          passive[size_t(j)] = false;
          x(j) = 0;
        }
      }
    }
    w = a.transpose() * (b - a * x);
  }
  return x;
}

namespace {

// Weighted NNLS of t = c0 + c1·bytes + c2·flops over `s` (>= 1 sample): rows weighted by
// 1 / measured time, columns scaled to unit maximum.
Eigen::Vector3d fit_coefficients(const std::vector<const KernelSample*>& s) {
  const Eigen::Index m = Eigen::Index(s.size());
  Eigen::MatrixXd a(m, 3);
  for (Eigen::Index i = 0; i < m; ++i) a.row(i) << 1.0, s[size_t(i)]->bytes, s[size_t(i)]->flops;
  Eigen::Vector3d scale = a.cwiseAbs().colwise().maxCoeff().transpose();
  for (int j = 0; j < 3; ++j) scale(j) = scale(j) > 0 ? scale(j) : 1;
  Eigen::MatrixXd aw(m, 3);
  for (Eigen::Index i = 0; i < m; ++i) {
    for (int j = 0; j < 3; ++j) aw(i, j) = a(i, j) / scale(j) / s[size_t(i)]->ns;
  }
  return nnls(aw, Eigen::VectorXd::Ones(m)).cwiseQuotient(scale);  // measured ns · weight = 1
}

}  // namespace

KernelFit fit_kernel_class(std::span<const KernelSample> samples, KernelClass cls,
                           double split_intensity) {
  std::vector<const KernelSample*> all, narrow, wide;
  for (const KernelSample& k : samples) {
    if (k.cls != cls || k.ns <= 0) continue;
    all.push_back(&k);
    (split_intensity > 0 && k.flops > split_intensity * k.bytes ? wide : narrow).push_back(&k);
  }
  KernelFit fit;
  fit.samples = int64_t(all.size());
  if (all.size() < 3) return fit;
  fit.fitted = true;
  const bool split = narrow.size() >= 3 && wide.size() >= 3;
  const Eigen::Vector3d c = fit_coefficients(split ? narrow : all);
  fit.base_ns = c(0);
  fit.ns_per_byte = c(1);
  fit.ns_per_flop = c(2);
  Eigen::Vector3d cw = c;
  if (split) {
    cw = fit_coefficients(wide);
    fit.split_intensity = split_intensity;
    fit.wide_base_ns = cw(0);
    fit.wide_ns_per_byte = cw(1);
    fit.wide_ns_per_flop = cw(2);
  }
  double mean = 0;
  for (const KernelSample* k : all) mean += k->ns;
  mean /= double(all.size());
  double ss_res = 0, ss_tot = 0;
  for (const KernelSample* k : all) {
    const bool is_wide = split && k->flops > split_intensity * k->bytes;
    const Eigen::Vector3d& cc = is_wide ? cw : c;
    const double f = cc(0) + cc(1) * k->bytes + cc(2) * k->flops;
    ss_res += (k->ns - f) * (k->ns - f);
    ss_tot += (k->ns - mean) * (k->ns - mean);
    fit.max_rel_err = std::max(fit.max_rel_err, std::abs(f - k->ns) / k->ns);
  }
  // All samples equal: R² is undefined; 1 when the fit reproduces them.
  fit.r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : (ss_res <= 1e-12 * mean * mean ? 1.0 : 0.0);
  return fit;
}

Distribution distribution(std::vector<double> v) {
  Distribution d;
  d.n = int64_t(v.size());
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) {
    const double pos = p / 100 * double(v.size() - 1);
    const size_t lo = size_t(pos);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
  };
  double sum = 0;
  for (double x : v) sum += x;
  d.mean_ns = sum / double(v.size());
  d.p50_ns = pct(50);
  d.p90_ns = pct(90);
  d.p99_ns = pct(99);
  d.max_ns = v.back();
  return d;
}

CalibrationProfile fit_calibration(const std::vector<CalibrationSample>& samples,
                                   const std::string& name, const std::string& base,
                                   const ProfileHeader& header) {
  static const char* const kKinds[] = {"kernel",     "node_gap",     "eager_launch", "graph_launch",
                                       "event_sync", "d2h",          "stream_read",  "host_op",
                                       "step",       "step_profiled"};
  CalibrationProfile p;
  p.name = name;
  p.base = base;
  p.header = header;
  p.hw = hardware_preset(base);
  p.hw.name = name;
  p.hw.source = "calibrated profile '" + name + "' (" + header.gpu + ", " + header.date +
                ", commit " + header.commit + ") over preset " + base;

  std::vector<KernelSample> kernels;
  for (const CalibrationSample& s : samples) {
    if (std::find_if(std::begin(kKinds), std::end(kKinds),
                     [&](const char* k) { return s.kind == k; }) == std::end(kKinds)) {
      throw Error("calibration sample has unknown kind '" + s.kind + "'");
    }
    if (s.kind == "kernel") {
      kernels.push_back({class_by_name(s.cls), double(s.bytes), double(s.flops), s.value_ns});
    }
  }
  for (int c = 0; c < int(KernelClass::kCount); ++c) {
    if (KernelClass(c) == KernelClass::kCollective) continue;
    // Projections change implementation above kGemvMaxRows = 16 rows (kernels/gemv.h; cuBLAS
    // in the runtime's proj()); flops / bytes of a projection is just under its row count
    // (16 rows: ~15.9, 17: ~16.9 at hidden >= 2048), so 16.5 separates the two.
    const double split = KernelClass(c) == KernelClass::kGemm ? 16.5 : 0;
    const KernelFit f = fit_kernel_class(kernels, KernelClass(c), split);
    if (f.fitted) p.hw.kernel_fits[size_t(c)] = f;
  }

  auto set_median = [&](const char* kind, const char* mode, int64_t* field) {
    const std::vector<double> v = values(samples, kind, mode);
    if (!v.empty()) *field = std::llround(median(v));
  };
  set_median("node_gap", "graph", &p.hw.graph_node_gap_ns);
  set_median("node_gap", "pdl", &p.hw.pdl_node_gap_ns);
  set_median("eager_launch", nullptr, &p.hw.eager_launch_ns);
  set_median("event_sync", nullptr, &p.hw.host_wake_ns);
  if (const std::vector<double> v = values(samples, "node_gap", "pdl_empty"); !v.empty()) {
    p.measurements.emplace_back("node_gap_ns_pdl_empty_kernels", median(v));
  }

  if (has_kind(samples, "graph_launch")) {
    // The simulator charges one figure per decode launch: the median host time of the runtime's
    // decode launches (name "decode") when measured, else of the largest graph measured. The
    // host cost's slope in the node count is reported.
    const bool decode = std::any_of(samples.begin(), samples.end(), [](const CalibrationSample& s) {
      return s.kind == "graph_launch" && s.name == "decode";
    });
    int64_t most = 0;
    for (const CalibrationSample& s : samples) {
      if (s.kind == "graph_launch") most = std::max(most, s.nodes);
    }
    std::vector<double> charged;
    std::vector<std::pair<double, double>> xy;
    for (const CalibrationSample& s : samples) {
      if (s.kind != "graph_launch") continue;
      if (decode ? s.name == "decode" : s.nodes == most) charged.push_back(s.value_ns);
      xy.emplace_back(double(s.nodes), s.value_ns);
    }
    p.hw.graph_launch_ns = std::llround(median(charged));
    Eigen::MatrixXd a(Eigen::Index(xy.size()), 2);
    Eigen::VectorXd b(Eigen::Index(xy.size()));
    for (size_t i = 0; i < xy.size(); ++i) {
      a.row(Eigen::Index(i)) << 1.0, xy[i].first;
      b(Eigen::Index(i)) = xy[i].second;
    }
    const Eigen::VectorXd c = nnls(a, b);
    p.measurements.emplace_back("graph_launch_base_ns", c(0));
    p.measurements.emplace_back("graph_launch_ns_per_node", c(1));
  }

  if (has_kind(samples, "d2h")) {
    std::vector<const CalibrationSample*> d;
    for (const CalibrationSample& s : samples) {
      if (s.kind == "d2h") d.push_back(&s);
    }
    Eigen::MatrixXd a(Eigen::Index(d.size()), 2);
    Eigen::VectorXd b(Eigen::Index(d.size()));
    for (size_t i = 0; i < d.size(); ++i) {
      a.row(Eigen::Index(i)) << 1.0, double(d[i]->bytes);
      b(Eigen::Index(i)) = d[i]->value_ns;
    }
    const Eigen::VectorXd c = nnls(a, b);
    p.hw.d2h_latency_ns = std::llround(c(0));
    if (c(1) > 0) p.hw.d2h_gbps = 1.0 / c(1);  // bytes per ns = GB/s
  }

  double best_tbps = 0;
  for (const CalibrationSample& s : samples) {
    if (s.kind == "stream_read" && s.value_ns > 0) {
      best_tbps = std::max(best_tbps, double(s.bytes) / s.value_ns / 1000.0);
    }
  }
  if (best_tbps > 0) p.hw.stream_read_tbps = best_tbps;

  std::map<std::string, std::vector<double>> ops;
  for (const CalibrationSample& s : samples) {
    if (s.kind == "host_op") ops[s.name].push_back(s.value_ns);
  }
  for (auto& [op, v] : ops) p.host_ops.emplace_back(op, distribution(std::move(v)));

  // Profiled vs unprofiled: per mode, Σ profiled / Σ unprofiled − 1 over the grid points
  // measured both ways.
  using Key = std::tuple<std::string, std::string, int64_t, int64_t>;
  std::map<Key, std::pair<std::vector<double>, std::vector<double>>> steps;
  for (const CalibrationSample& s : samples) {
    if (s.kind != "step" && s.kind != "step_profiled") continue;
    auto& slot = steps[{s.mode, s.model, s.batch, s.ctx_tokens}];
    (s.kind == "step" ? slot.first : slot.second).push_back(s.value_ns);
  }
  std::map<std::string, std::pair<double, double>> inflation;
  for (const auto& [key, v] : steps) {
    if (v.first.empty() || v.second.empty()) continue;
    auto& acc = inflation[std::get<0>(key)];
    acc.first += median(v.first);
    acc.second += median(v.second);
  }
  for (const auto& [mode, acc] : inflation) {
    p.measurements.emplace_back("profiled_inflation_pct_" + mode,
                                100.0 * (acc.second / acc.first - 1));
  }
  return p;
}

std::string calibration_report(const CalibrationProfile& p) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-14s %8s %10s %12s %14s %16s\n", "kernel_class", "samples",
                "r2", "max_rel_err", "base_ns", "ns_per_byte");
  out += line;
  for (int c = 0; c < int(KernelClass::kCount); ++c) {
    const KernelFit& f = p.hw.kernel_fits[size_t(c)];
    if (!f.fitted) continue;
    std::snprintf(line, sizeof line, "%-14s %8lld %10.5f %12.4f %14.1f %16.6g  ns/flop %.4g\n",
                  kernel_class_name(KernelClass(c)), static_cast<long long>(f.samples), f.r2,
                  f.max_rel_err, f.base_ns, f.ns_per_byte, f.ns_per_flop);
    out += line;
    if (f.split_intensity > 0) {
      std::snprintf(line, sizeof line,
                    "%-14s above %.1f flops/byte: base %.1f ns, %.6g ns/byte, %.4g ns/flop\n", "",
                    f.split_intensity, f.wide_base_ns, f.wide_ns_per_byte, f.wide_ns_per_flop);
      out += line;
    }
  }
  std::snprintf(
      line, sizeof line,
      "figures: eager_launch %lld ns, graph_launch %lld ns, node gap %lld ns (graph) "
      "%lld ns (pdl), d2h %lld ns + %.2f GB/s, host wake %lld ns, stream read %.3f "
      "TB/s, kernel floor %lld ns\n",
      static_cast<long long>(p.hw.eager_launch_ns), static_cast<long long>(p.hw.graph_launch_ns),
      static_cast<long long>(p.hw.graph_node_gap_ns), static_cast<long long>(p.hw.pdl_node_gap_ns),
      static_cast<long long>(p.hw.d2h_latency_ns), p.hw.d2h_gbps,
      static_cast<long long>(p.hw.host_wake_ns), p.hw.stream_read_tbps,
      static_cast<long long>(p.hw.kernel_floor_ns));
  out += line;
  for (const auto& [op, d] : p.host_ops) {
    std::snprintf(line, sizeof line, "host op %-16s n=%lld p50 %.0f p90 %.0f p99 %.0f ns\n",
                  op.c_str(), static_cast<long long>(d.n), d.p50_ns, d.p90_ns, d.p99_ns);
    out += line;
  }
  for (const auto& [k, v] : p.measurements) {
    std::snprintf(line, sizeof line, "%s = %.4g\n", k.c_str(), v);
    out += line;
  }
  return out;
}

}  // namespace twinstep
