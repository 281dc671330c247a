#include "simulator/calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "policies/calibration_model.h"
#include "policies/error.h"
#include "policies/model_spec.h"
#include "simulator/cost_model.h"
#include "simulator/prefill_fit.h"
#include "simulator/spec_graphs.h"

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

// Weighted NNLS of t = c0 + c1·bytes + c2·flops + c3·requests over `s` (>= 1 sample): rows
// weighted by 1 / measured time, columns scaled to unit maximum (a column of zeros, requests
// outside attention, stays at 0; `requests` false holds c3 at 0).
// With `fixed_base` >= 0 the base is held at that value and only the other terms are fitted
// (to t − base, still weighted by 1 / t).
// A fifth coefficient, c4 · split_rows (the GEMV's per-split-row cost), is fitted likewise, or
// held at `split_row_ns` when that is >= 0 (subtracted from t like a held base).
using Coefficients = Eigen::Matrix<double, 5, 1>;
Coefficients fit_coefficients(const std::vector<const KernelSample*>& s, double fixed_base = -1,
                              bool requests = true, double split_row_ns = -1) {
  const Eigen::Index m = Eigen::Index(s.size());
  const bool fixed = fixed_base >= 0;
  const bool held = split_row_ns >= 0;
  const int first = fixed ? 1 : 0;
  const int last = held ? 4 : 5;  // columns [first, last) are fitted
  const int n = last - first;
  Eigen::MatrixXd a(m, 5);
  for (Eigen::Index i = 0; i < m; ++i) {
    const KernelSample& k = *s[size_t(i)];
    a.row(i) << 1.0, k.bytes, k.flops, requests ? k.requests : 0.0, k.split_rows;
  }
  Coefficients scale = a.cwiseAbs().colwise().maxCoeff().transpose();
  for (int j = 0; j < 5; ++j) scale(j) = scale(j) > 0 ? scale(j) : 1;
  Eigen::MatrixXd aw(m, n);
  Eigen::VectorXd bw(m);
  for (Eigen::Index i = 0; i < m; ++i) {
    const KernelSample& k = *s[size_t(i)];
    for (int j = first; j < last; ++j) aw(i, j - first) = a(i, j) / scale(j) / k.ns;
    const double offset = (fixed ? fixed_base : 0.0) + (held ? split_row_ns * k.split_rows : 0.0);
    bw(i) = 1.0 - offset / k.ns;  // measured ns · weight = 1
  }
  const Eigen::VectorXd x = nnls(aw, bw);
  Coefficients c;
  c(0) = fixed ? fixed_base : x(0) / scale(0);
  for (int j = 1; j < 4; ++j) c(j) = x(j - first) / scale(j);
  c(4) = held ? split_row_ns : x(4 - first) / scale(4);
  return c;
}

}  // namespace

KernelFit fit_kernel_class(std::span<const KernelSample> samples, KernelClass cls,
                           double split_intensity) {
  return fit_kernel_class_with_base(samples, cls, split_intensity, -1, -1);
}

namespace {

// The fit with the regimes split by intensity (split_intensity > 0) or by bytes (split_bytes
// > 0), each regime with >= 3 samples; else one regime. Also returns the mean squared relative
// error over the class's samples in *msre when given.
KernelFit fit_regimes(std::span<const KernelSample> samples, KernelClass cls,
                      double split_intensity, double split_bytes, double base_ns,
                      double wide_base_ns, double* msre = nullptr, double split_row_ns = -1) {
  auto is_wide = [&](const KernelSample& k) {
    return (split_intensity > 0 && k.flops > split_intensity * k.bytes) ||
           (split_bytes > 0 && k.bytes > split_bytes);
  };
  std::vector<const KernelSample*> all, narrow, wide;
  for (const KernelSample& k : samples) {
    if (k.cls != cls || k.ns <= 0) continue;
    all.push_back(&k);
    (is_wide(k) ? wide : narrow).push_back(&k);
  }
  KernelFit fit;
  fit.samples = int64_t(all.size());
  if (all.size() < 3) return fit;
  fit.fitted = true;
  const bool split = narrow.size() >= 3 && wide.size() >= 3;
  const Coefficients c = fit_coefficients(split ? narrow : all, base_ns, true, split_row_ns);
  fit.base_ns = c(0);
  fit.ns_per_byte = c(1);
  fit.ns_per_flop = c(2);
  fit.ns_per_request = c(3);
  fit.ns_per_split_row = c(4);
  Coefficients cw = c;
  if (split) {
    // No per-request term above the split: long attention is bound by its waves of blocks
    // (Llama-3-8B: 8 requests x 8233 tokens, 270 MB, 85.2 us; 32 x 2092 tokens, 275 MB, 79.1 us),
    // where more requests can cost less.
    cw = fit_coefficients(wide, wide_base_ns, /*requests=*/false, /*split_row_ns=*/0);
    fit.split_intensity = split_intensity;
    fit.split_bytes = split_intensity > 0 ? 0 : split_bytes;
    fit.wide_base_ns = cw(0);
    fit.wide_ns_per_byte = cw(1);
    fit.wide_ns_per_flop = cw(2);
    fit.wide_ns_per_request = cw(3);
  }
  double mean = 0;
  for (const KernelSample* k : all) mean += k->ns;
  mean /= double(all.size());
  double ss_res = 0, ss_tot = 0, ss_rel = 0;
  for (const KernelSample* k : all) {
    const Coefficients& cc = split && is_wide(*k) ? cw : c;
    const double f =
        cc(0) + cc(1) * k->bytes + cc(2) * k->flops + cc(3) * k->requests + cc(4) * k->split_rows;
    ss_res += (k->ns - f) * (k->ns - f);
    ss_tot += (k->ns - mean) * (k->ns - mean);
    ss_rel += (f - k->ns) * (f - k->ns) / (k->ns * k->ns);
    fit.max_rel_err = std::max(fit.max_rel_err, std::abs(f - k->ns) / k->ns);
  }
  // All samples equal: R² is undefined; 1 when the fit reproduces them.
  fit.r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : (ss_res <= 1e-12 * mean * mean ? 1.0 : 0.0);
  if (msre != nullptr) *msre = ss_rel / double(all.size());
  return fit;
}

}  // namespace

KernelFit fit_kernel_class_with_base(std::span<const KernelSample> samples, KernelClass cls,
                                     double split_intensity, double base_ns, double wide_base_ns,
                                     double split_row_ns) {
  return fit_regimes(samples, cls, split_intensity, 0, base_ns, wide_base_ns, nullptr,
                     split_row_ns);
}

KernelFit fit_kernel_class_split_bytes(std::span<const KernelSample> samples, KernelClass cls,
                                       int min_distinct) {
  double one_err = 0;
  KernelFit best = fit_regimes(samples, cls, 0, 0, -1, -1, &one_err);
  // A split must earn its three extra coefficients: at least 10% less error than one line.
  double best_err = 0.9 * one_err;
  if (one_err <= 1e-12) return best;  // one line reproduces the samples (to 1e-6 relative)
  std::vector<double> bytes;
  for (const KernelSample& k : samples) {
    if (k.cls == cls && k.ns > 0) bytes.push_back(k.bytes);
  }
  std::sort(bytes.begin(), bytes.end());
  bytes.erase(std::unique(bytes.begin(), bytes.end()), bytes.end());
  // Candidate splits: geometric midpoints between consecutive distinct byte counts, leaving
  // min_distinct distinct byte counts on each side (so neither line rests on a single shape).
  for (size_t i = size_t(std::max(1, min_distinct)); i + size_t(min_distinct) <= bytes.size();
       ++i) {
    const double split = std::sqrt(bytes[i - 1] * bytes[i]);
    double err = 0;
    const KernelFit f = fit_regimes(samples, cls, 0, split, -1, -1, &err);
    if (f.split_bytes > 0 && err < best_err) {
      best_err = err;
      best = f;
    }
  }
  return best;
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

namespace {

// The median of the values grouped under each key.
template <typename Key>
std::map<Key, double> medians(const std::map<Key, std::vector<double>>& m) {
  std::map<Key, double> out;
  for (const auto& [k, v] : m) out[k] = median(v);
  return out;
}

// A sample's model label the fits can rebuild the step of (a preset or a preset's TP shard).
bool is_calibration_model(const std::string& label) {
  try {
    parse_calibration_model(label);
    return true;
  } catch (const ConfigError&) {
    return false;
  }
}

}  // namespace

std::vector<ResidualSample> residual_kernel_samples(const std::vector<CalibrationSample>& samples,
                                                    double graph_gap_ns) {
  // Per in-situ grid point (model, batch, ctx per request): the unprofiled graph-mode step
  // median, the kernel samples' sum and the names measured.
  using Point = std::tuple<std::string, int64_t, int64_t>;
  std::map<Point, std::vector<double>> steps;
  std::map<Point, double> kernel_sum;
  std::map<Point, std::set<std::string>> names;
  for (const CalibrationSample& s : samples) {
    const Point key{s.model, s.batch, s.ctx_tokens};
    if (s.kind == "step" && s.mode == "graph") steps[key].push_back(s.value_ns);
    if (s.kind == "kernel" && s.mode == "graph") {
      // One launch's sample of `nodes` (an MoE layer's kernels under that launch's routing)
      // counts 1 / nodes: their mean over the launches stands for the layer, as the median over
      // the launches does for the other kernels (nodes 0).
      kernel_sum[key] += s.nodes > 0 ? s.value_ns / double(s.nodes) : s.value_ns;
      names[key].insert(s.name);
    }
  }
  std::vector<ResidualSample> out;
  for (const auto& [key, step_ns] : medians(steps)) {
    auto it = kernel_sum.find(key);
    if (it == kernel_sum.end()) continue;
    const auto& [model, batch, ctx] = key;
    if (batch < 1 || !is_calibration_model(model)) continue;
    StepKernels sk;
    calibration_step_kernels(model, decode_shape(int32_t(batch), 1, ctx * batch), sk);
    // Step kernels without a sample at this point (one instance each, e.g. lm_head).
    std::vector<const KernelDesc*> missing;
    bool layer_kernel_lost = false;  // a per-layer kernel without samples: no residual
    for (const LayerRun& run : sk.runs) {
      for (int32_t i = run.first; i < run.first + run.count; ++i) {
        const KernelDesc& k = sk.kernels[size_t(i)];
        if (names[key].count(k.name) == 0 && k.cls != KernelClass::kCollective) {
          layer_kernel_lost |= run.repeat != 1;
          missing.push_back(&k);
        }
      }
    }
    if (missing.size() == 1 && !layer_kernel_lost) {
      const double ns = step_ns - it->second - double(sk.node_count()) * graph_gap_ns;
      if (ns > 0) {
        const KernelDesc& k = *missing.front();
        out.push_back({k.name,
                       model,
                       batch,
                       {k.cls, double(k.bytes_read + k.bytes_written), double(k.flops), ns}});
      }
    }
  }
  return out;
}

std::vector<HardwareSpec::NodeGap> node_gap_by_rows(const std::vector<CalibrationSample>& samples,
                                                    const HardwareSpec& hw, std::string_view mode) {
  // Unprofiled step medians of the mode per (model, batch), by context per request.
  using Key = std::pair<std::string, int64_t>;
  std::map<Key, std::map<int64_t, std::vector<double>>> steps;
  for (const CalibrationSample& s : samples) {
    if (s.kind == "step" && s.mode == mode && s.batch >= 1) {
      steps[{s.model, s.batch}][s.ctx_tokens].push_back(s.value_ns);
    }
  }
  // Eager: calibrate writes a node_gap sample of a grid point only where its host launch loop
  // was shorter than the GPU step (eager_gap_sample); where a point was host-bound its step holds
  // host time that the simulator prices apart (eager_launch_ns per kernel), so a (model, batch)
  // gets an entry only when every context has its node_gap sample.
  if (mode == "eager") {
    std::map<Key, std::set<int64_t>> unbound;
    for (const CalibrationSample& s : samples) {
      if (s.kind == "node_gap" && s.mode == mode) unbound[{s.model, s.batch}].insert(s.ctx_tokens);
    }
    std::erase_if(steps, [&](const auto& entry) {
      const auto it = unbound.find(entry.first);
      return it == unbound.end() || it->second.size() < entry.second.size();
    });
  }
  // Each label priced as a simulated one-rank run of it prices it (calibration_cost_model).
  std::map<std::string, std::unique_ptr<CostModel>> cost;
  std::map<Key, std::vector<double>> gaps;
  StepKernels sk;
  for (const auto& [key, by_ctx] : steps) {
    const auto& [label, batch] = key;
    if (!is_calibration_model(label)) continue;
    auto it = cost.find(label);
    if (it == cost.end()) it = cost.emplace(label, calibration_cost_model(hw, label)).first;
    for (const auto& [ctx, v] : by_ctx) {
      calibration_step_kernels(label, decode_shape(int32_t(batch), 1, ctx * batch), sk);
      const GraphCost c = it->second->graph_cost(sk);
      gaps[key].push_back((median(v) - double(c.busy_ns)) / double(c.nodes));
    }
  }
  std::vector<HardwareSpec::NodeGap> out;
  for (const auto& [key, v] : gaps) out.push_back({key.first, key.second, std::llround(median(v))});
  return out;
}

std::vector<HardwareSpec::NodeGap> break_gap_by_rows(const std::vector<CalibrationSample>& samples,
                                                     std::string_view mode, double empty_node_ns) {
  // Medians by (model, batch) and context: the stubbed steps and the plain ones.
  using Key = std::pair<std::string, int64_t>;
  std::map<Key, std::map<int64_t, std::vector<double>>> plain, stubbed;
  std::map<Key, int64_t> stubs;
  for (const CalibrationSample& s : samples) {
    if (s.mode != mode || s.batch < 1) continue;
    if (s.kind != "collective_break") continue;
    if (s.name == "plain") plain[{s.model, s.batch}][s.ctx_tokens].push_back(s.value_ns);
    if (s.name == "stubbed" && s.nodes >= 1) {
      stubbed[{s.model, s.batch}][s.ctx_tokens].push_back(s.value_ns);
      stubs[{s.model, s.batch}] = s.nodes;
    }
  }
  std::vector<HardwareSpec::NodeGap> out;
  for (const auto& [key, by_ctx] : stubbed) {
    const auto it = plain.find(key);
    if (it == plain.end()) continue;
    std::vector<double> gaps;
    for (const auto& [ctx, v] : by_ctx) {
      // The plain step of the same context (calibrate runs both engines through the same launch
      // sequence, so the contexts are equal); a context measured one way only is skipped.
      const auto plain_at = it->second.find(ctx);
      if (plain_at == it->second.end()) continue;
      gaps.push_back((median(v) - median(plain_at->second)) / double(stubs[key]) - empty_node_ns);
    }
    if (!gaps.empty()) out.push_back({key.first, key.second, std::llround(median(gaps))});
  }
  return out;
}

int fit_in_situ_break_gaps(HardwareSpec& hw, const std::vector<CalibrationSample>& samples) {
  using Key = std::pair<std::string, int64_t>;  // shard label, batch
  const CostModel cost(hw);
  int written = 0;
  for (const bool pdl : {true, false}) {
    const std::string_view mode = pdl ? "pdl" : "graph";
    std::map<Key, std::map<int64_t, std::vector<double>>> plain, in_situ;
    std::map<Key, int64_t> positions;
    for (const CalibrationSample& s : samples) {
      if (s.kind != "collective_break" || s.mode != mode || s.batch < 1) continue;
      if (s.name == "plain") plain[{s.model, s.batch}][s.ctx_tokens].push_back(s.value_ns);
      if (s.name == "in_situ" && s.nodes >= 1) {
        in_situ[{s.model, s.batch}][s.ctx_tokens].push_back(s.value_ns);
        positions[{s.model, s.batch}] = s.nodes;
      }
    }
    std::vector<HardwareSpec::NodeGap>& table =
        pdl ? hw.pdl_break_gap_by_rows : hw.graph_break_gap_by_rows;
    for (const auto& [key, by_ctx] : in_situ) {
      const auto& [label, batch] = key;
      const auto it = plain.find(key);
      if (it == plain.end() || !is_calibration_model(label)) continue;
      const CalibrationModel cm = parse_calibration_model(label);
      if (cm.tp < 2) continue;
      const ModelSpec model = calibration_model_spec(cm);
      const LayoutSpec layout = calibration_layout(model, cm.tp);
      std::vector<double> gaps;
      StepKernels sk;
      for (const auto& [ctx, v] : by_ctx) {
        const auto plain_at = it->second.find(ctx);
        if (plain_at == it->second.end()) continue;
        step_kernels(model, decode_shape(int32_t(batch), 1, ctx * batch), layout, 0, sk);
        double collectives_ns = 0;
        int64_t count = 0;
        for (const LayerRun& run : sk.runs) {
          for (int32_t i = run.first; i < run.first + run.count; ++i) {
            const KernelDesc& k = sk.kernels[size_t(i)];
            if (k.cls != KernelClass::kCollective) continue;
            collectives_ns += double(run.repeat) * double(cost.collective_ns(k, true));
            count += run.repeat;
          }
        }
        if (count != positions[key]) continue;
        gaps.push_back((median(v) - median(plain_at->second) - collectives_ns) / double(count));
      }
      if (gaps.empty()) continue;
      const int64_t gap_ns = std::llround(median(gaps));
      auto same = std::find_if(table.begin(), table.end(), [&](const HardwareSpec::NodeGap& g) {
        return g.model == label && g.rows == batch;
      });
      if (same != table.end()) {
        same->gap_ns = gap_ns;
      } else {
        table.push_back({label, batch, gap_ns});
      }
      ++written;
    }
    // Grouped by model, rows ascending within a model (node_gap_in's order), the models in the
    // order they first appear.
    std::map<std::string, size_t> first;
    for (const HardwareSpec::NodeGap& g : table) first.emplace(g.model, first.size());
    std::stable_sort(table.begin(), table.end(),
                     [&](const HardwareSpec::NodeGap& a, const HardwareSpec::NodeGap& b) {
                       return std::tie(first[a.model], a.rows) < std::tie(first[b.model], b.rows);
                     });
  }
  return written;
}

CalibrationProfile fit_calibration(const std::vector<CalibrationSample>& samples,
                                   const std::string& name, const std::string& base,
                                   const ProfileHeader& header) {
  static const char* const kKinds[] = {
      "kernel", "node_gap", "eager_launch", "graph_launch", "event_sync", "d2h", "stream_read",
      "host_op", "step", "step_profiled", "spec_graph", "prefill", "collective_break",
      // calibrate --partition-only: the decode attention at several KV capacities, stored for
      // reading (docs/calibration.md "Attention partition"); no fit reads them.
      "attention_partition"};
  CalibrationProfile p;
  p.name = name;
  p.base = base;
  p.header = header;
  p.hw = hardware_preset(base);
  p.hw.name = name;
  p.hw.source = "calibrated profile '" + name + "' (" + header.gpu + ", " + header.date +
                ", commit " + header.commit + ") over preset " + base;
  // A fused label's samples (calibrate --fusion) price that label alone: its own kernel fits,
  // node gaps and speculative residuals. Everything pooled over models below (class and name
  // fits, the figures, host operations, inflation, prefill rates) reads `shared`, without them.
  std::vector<CalibrationSample> unfused;
  const bool any_fused = std::any_of(samples.begin(), samples.end(), [](const auto& s) {
    return is_fused_calibration_label(s.model);
  });
  if (any_fused) {
    std::copy_if(samples.begin(), samples.end(), std::back_inserter(unfused),
                 [](const auto& s) { return !is_fused_calibration_label(s.model); });
  }
  const std::vector<CalibrationSample>& shared = any_fused ? unfused : samples;

  // The GEMV weight shapes (gemv_n, gemv_k) of each model's step kernels by name, for the
  // split-K regressor (gemv_split_rows on the base preset's SMs); none for an unknown label.
  std::map<std::string, std::map<std::string, std::pair<int32_t, int32_t>>> gemv_shapes;
  auto split_rows_of = [&](const CalibrationSample& s) {
    auto it = gemv_shapes.find(s.model);
    if (it == gemv_shapes.end())
      it = gemv_shapes.emplace(s.model, calibration_gemv_shapes(s.model)).first;
    const auto shape = it->second.find(s.name);
    if (shape == it->second.end()) return 0.0;
    KernelDesc k{};
    k.cls = KernelClass::kGemm;
    k.flops = s.flops;
    k.gemv_n = shape->second.first;
    k.gemv_k = shape->second.second;
    return gemv_split_rows(k, p.hw.sm_count);
  };
  std::vector<KernelSample> kernels;
  std::vector<std::string> kernel_names;   // parallel to `kernels`
  std::vector<std::string> kernel_models;  // parallel to `kernels`
  std::vector<bool> own_fit_only;          // parallel to `kernels`: out of the pooled fits
  int64_t fit_max_rows = 0;                // HardwareSpec::kernel_fit_max_rows
  for (const CalibrationSample& s : samples) {
    if (std::find_if(std::begin(kKinds), std::end(kKinds),
                     [&](const char* k) { return s.kind == k; }) == std::end(kKinds)) {
      throw Error("calibration sample has unknown kind '" + s.kind + "'");
    }
    if (s.kind == "kernel") {
      // Decode attention (kernels/attention.h) streams the KV cache in blocks per (split, KV
      // head, request), a request's query heads of one KV head padded into one 16-row MMA tile:
      // its work per cached token does not grow with the query heads, so it gets no FLOP term
      // (a FLOP term fitted on one GQA ratio priced Llama-3.2-3B's 24 heads a quarter below
      // Llama-3-8B's 32 at equal bytes). It gets a term per request instead: at equal bytes more
      // requests mean more blocks and more splits to combine (Llama-3-8B in situ, H200: 32
      // requests x 172 tokens, 23 MB, 22.4 us; 4 x 2085 tokens, 34 MB, 18.6 us), which bytes and
      // FLOPs (both proportional to the summed context) cannot tell apart.
      const KernelClass cls = class_by_name(s.cls);
      const bool attn = cls == KernelClass::kAttention;
      kernels.push_back({cls, double(s.bytes), attn ? 0.0 : double(s.flops), s.value_ns,
                         attn ? double(s.batch) : 0.0,
                         cls == KernelClass::kGemm ? split_rows_of(s) : 0.0});
      kernel_names.push_back(s.name);
      kernel_models.push_back(s.model);
      own_fit_only.push_back(is_fused_calibration_label(s.model));
      // Decode kernels serve one row per request: the fits hold up to the largest batch.
      if (!own_fit_only.back()) fit_max_rows = std::max(fit_max_rows, s.batch);
    }
  }
  if (fit_max_rows > 0) p.hw.kernel_fit_max_rows = int32_t(fit_max_rows);
  const double graph_gap = [&] {
    const std::vector<double> v = values(shared, "node_gap", "graph");
    return v.empty() ? double(p.hw.graph_node_gap_ns) : median(v);
  }();
  // A residual is the step less every other kernel's sample: it carries their errors too. One
  // below the time its bytes take at the streaming-read rate is not the kernel's alone (the
  // Qwen3-30B-A3B TP2-EP2 shard's replicated LM head: 78-106 us for 622 MB, 6-8 TB/s on an
  // H200): it stays in its model's own fit, where it balances that model's other kernels, and is
  // left out of the pooled class and name fits that price models never measured.
  const double floor_ns_per_byte = p.hw.stream_read_tbps > 0 ? 1e-3 / p.hw.stream_read_tbps : 0;
  for (const ResidualSample& r : residual_kernel_samples(samples, graph_gap)) {
    own_fit_only.push_back(r.sample.ns < r.sample.bytes * floor_ns_per_byte ||
                           is_fused_calibration_label(r.model));
    kernels.push_back(r.sample);
    kernel_names.push_back(r.name);
    kernel_models.push_back(r.model);
  }
  // Projections change implementation above kGemvMaxRows = 16 rows (kernels/gemv.h; cuBLAS
  // in the runtime's proj()); flops / bytes of a projection is just under its row count
  // (16 rows: ~15.9, 17: ~16.9 at hidden >= 2048), so 16.5 separates the two.
  // Classes fitted as two lines split by bytes, the split chosen by the least mean squared
  // relative error, each line resting on at least this many distinct byte counts (0: one line
  // or the intensity split). Attention moves from latency-bound (small contexts and batches) to
  // streaming (large). The activation runs fused into the gate/up projection's node up to 16
  // rows (its in-situ samples there are a byte share of that node, near zero) and as its own
  // node above: its rows, hence bytes, tell the two apart (two batch sizes above 16 measured).
  auto min_distinct_of = [](KernelClass c) {
    return c == KernelClass::kAttention ? 4 : c == KernelClass::kActivation ? 2 : 0;
  };
  auto split_of = [](KernelClass c) {
    return c == KernelClass::kGemm || c == KernelClass::kLmHead ? 16.5 : 0.0;
  };
  // Per class over the samples of every name of the class; where all of a class's samples
  // read the same bytes (one model, one kernel: lm_head), the base and the byte term cannot be
  // told apart, and the base is held at the gemm fit's (the same GEMV / GEMM kernels).
  std::map<std::string, std::vector<KernelSample>> by_name;
  std::vector<KernelSample> pooled;
  for (size_t i = 0; i < kernels.size(); ++i) {
    if (own_fit_only[i]) continue;
    by_name[kernel_names[i]].push_back(kernels[i]);
    pooled.push_back(kernels[i]);
  }
  // Bytes spanning less than 2x (the weights dominate, only the activations change) do not
  // separate a base from the byte term.
  auto bytes_vary = [](std::span<const KernelSample> v) {
    double lo = v.front().bytes, hi = lo;
    for (const KernelSample& k : v) lo = std::min(lo, k.bytes), hi = std::max(hi, k.bytes);
    return hi > 2 * lo;
  };
  for (int c = 0; c < int(KernelClass::kCount); ++c) {
    if (KernelClass(c) == KernelClass::kCollective) continue;
    const KernelClass cls = KernelClass(c);
    KernelFit f = min_distinct_of(cls) > 0
                      ? fit_kernel_class_split_bytes(pooled, cls, min_distinct_of(cls))
                      : fit_kernel_class(pooled, cls, split_of(cls));
    const KernelFit& gemm = p.hw.kernel_fits[size_t(KernelClass::kGemm)];
    if (f.fitted && cls == KernelClass::kLmHead && gemm.fitted) {
      std::vector<KernelSample> own;
      for (const KernelSample& k : pooled) {
        if (k.cls == cls) own.push_back(k);
      }
      if (!bytes_vary(own)) {
        f = fit_kernel_class_with_base(own, cls, split_of(cls), gemm.base_ns,
                                       gemm.split_intensity > 0 ? gemm.wide_base_ns : gemm.base_ns);
      }
    }
    if (f.fitted) p.hw.kernel_fits[size_t(c)] = f;
  }
  // Per kernel name: that name's samples alone. Where a regime's bytes span less than 2x (a
  // projection of one model: the weights dominate) its base is held at the class fit's for that
  // regime, so that another shape scales by bytes and FLOPs; otherwise all three are fitted.
  // Regime by regime: rows above 16 were measured on one model only (the narrow grids of the
  // other sessions stop at 16), and a wide base fitted to one weight size absorbs the weights
  // (gate_up_proj: base 59 us, 0 ns/byte), pricing every other shape like that one.
  // Not fitted where the class has no fit.
  auto fit_name = [&](std::span<const KernelSample> v, bool hold_split_row) {
    const KernelClass cls = v.front().cls;
    const KernelFit& cf = p.hw.kernel_fits[size_t(cls)];
    if (!cf.fitted) return KernelFit{};
    if (min_distinct_of(cls) > 0) return fit_kernel_class_split_bytes(v, cls, min_distinct_of(cls));
    const double split = split_of(cls);
    std::vector<KernelSample> narrow, wide;
    for (const KernelSample& k : v) {
      (split > 0 && k.flops > split * k.bytes ? wide : narrow).push_back(k);
    }
    // One regime (no split, or fewer than 3 samples on a side): the whole set decides.
    // Pooled names: the per-split-row cost is held at the class's (only shapes of several splits
    // tell it apart, and a name pooled over few shapes would absorb it into its bytes and FLOPs).
    // One model's name (one split) fits it freely with the others: the column is its rows again,
    // and holding the class's value there cost Llama-3-8B TP2's qkv_proj (S = 4) R² 0.998 → 0.75.
    const double split_row = hold_split_row ? cf.ns_per_split_row : -1;
    if (narrow.size() < 3 || wide.size() < 3) {
      const bool hold = !bytes_vary(v);
      return fit_kernel_class_with_base(
          v, cls, split, hold ? cf.base_ns : -1,
          hold ? (cf.split_intensity > 0 ? cf.wide_base_ns : cf.base_ns) : -1, split_row);
    }
    const double wide_base = cf.split_intensity > 0 ? cf.wide_base_ns : cf.base_ns;
    return fit_kernel_class_with_base(v, cls, split, bytes_vary(narrow) ? -1 : cf.base_ns,
                                      bytes_vary(wide) ? -1 : wide_base, split_row);
  };
  for (const auto& [name, v] : by_name) {
    if (const KernelFit f = fit_name(v, true); f.fitted)
      p.hw.kernel_name_fits.emplace_back(name, f);
  }
  // Per (model label, kernel name), where the model measured the name over enough samples and
  // shapes: the pooled line of several models' samples fits none of them (qkv_proj over
  // Llama-3-8B, Qwen3-30B-A3B and their TP2 shards, H200 2026-11-29: R² 0.61, mean error 8.5 %
  // on Llama-3-8B and 32 % on its shard; 1.6 % on each with its own fit). A model's base is held
  // by the same rule (its projections' bytes barely vary), so the fit still scales by bytes and
  // FLOPs where another layout falls back to it (kernel_fit_model). Fitting it free changed the
  // mean in-sample error there by 0.1 points at most, except on Qwen3-30B-A3B's moe_router (9.3 %
  // held, 7.1 % free: ~0.5 us whatever its bytes).
  // A model's samples of one shape (the same bytes and FLOPs: its layers at one grid point) are
  // averaged before the relative-error fit: where the layers' times differ at one shape (an
  // expert-parallel shard's MoE kernels, 27-53 us at batch 1 as the routing puts 0-8 of a token's
  // experts on the rank), a relative-error fit of the raw samples lands below their mean.
  // Each sample keeps its place (the regime split counts samples) with its shape's mean time.
  auto mean_by_shape = [](std::span<const KernelSample> v) {
    std::map<std::tuple<double, double, double>, std::pair<double, int>> sum;
    for (const KernelSample& k : v) {
      auto& [ns, n] = sum[{k.bytes, k.flops, k.requests}];
      ns += k.ns;
      ++n;
    }
    std::vector<KernelSample> out(v.begin(), v.end());
    for (KernelSample& k : out) {
      const auto& [ns, n] = sum[{k.bytes, k.flops, k.requests}];
      k.ns = ns / n;
    }
    return out;
  };
  std::map<std::string, std::map<std::string, std::vector<KernelSample>>> by_model;
  for (size_t i = 0; i < kernels.size(); ++i) {
    by_model[kernel_models[i]][kernel_names[i]].push_back(kernels[i]);
  }
  for (const auto& [model, names] : by_model) {
    HardwareSpec::ModelKernelFits fits{model, {}};
    for (const auto& [name, v] : names) {
      std::set<double> distinct;
      for (const KernelSample& k : v) distinct.insert(k.bytes);
      if (v.size() < kModelFitMinSamples || distinct.size() < kModelFitMinBytes) continue;
      if (const KernelFit f = fit_name(mean_by_shape(v), false); f.fitted)
        fits.names.emplace_back(name, f);
    }
    if (!fits.names.empty()) p.hw.kernel_model_fits.push_back(std::move(fits));
  }

  auto set_median = [&](const char* kind, const char* mode, int64_t* field) {
    const std::vector<double> v = values(shared, kind, mode);
    if (!v.empty()) *field = std::llround(median(v));
  };
  set_median("node_gap", "graph", &p.hw.graph_node_gap_ns);
  set_median("node_gap", "pdl", &p.hw.pdl_node_gap_ns);
  set_median("node_gap", "eager", &p.hw.eager_node_gap_ns);
  set_median("eager_launch", nullptr, &p.hw.eager_launch_ns);
  set_median("event_sync", nullptr, &p.hw.host_wake_ns);
  if (const std::vector<double> v = values(shared, "node_gap", "pdl_empty"); !v.empty()) {
    p.measurements.emplace_back("node_gap_ns_pdl_empty_kernels", median(v));
  }

  if (has_kind(shared, "graph_launch")) {
    // The simulator charges one figure per decode launch: the median host time of the runtime's
    // decode launches (name "decode") when measured, else of the largest graph measured. The
    // host cost's slope in the node count is reported.
    const bool decode = std::any_of(shared.begin(), shared.end(), [](const CalibrationSample& s) {
      return s.kind == "graph_launch" && s.name == "decode";
    });
    int64_t most = 0;
    for (const CalibrationSample& s : shared) {
      if (s.kind == "graph_launch") most = std::max(most, s.nodes);
    }
    std::vector<double> charged;
    std::vector<std::pair<double, double>> xy;
    for (const CalibrationSample& s : shared) {
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

  if (has_kind(shared, "d2h")) {
    std::vector<const CalibrationSample*> d;
    for (const CalibrationSample& s : shared) {
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
  for (const CalibrationSample& s : shared) {
    if (s.kind == "stream_read" && s.value_ns > 0) {
      best_tbps = std::max(best_tbps, double(s.bytes) / s.value_ns / 1000.0);
    }
  }
  if (best_tbps > 0) p.hw.stream_read_tbps = best_tbps;

  std::map<std::string, std::vector<double>> ops;
  for (const CalibrationSample& s : shared) {
    if (s.kind == "host_op") ops[s.name].push_back(s.value_ns);
  }
  for (auto& [op, v] : ops) p.host_ops.emplace_back(op, distribution(std::move(v)));

  // Profiled vs unprofiled: per mode, Σ profiled / Σ unprofiled − 1 over the grid points
  // measured both ways.
  using Key = std::tuple<std::string, std::string, int64_t, int64_t>;
  std::map<Key, std::pair<std::vector<double>, std::vector<double>>> steps;
  for (const CalibrationSample& s : shared) {
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
  // Prefill rates (simulator/prefill_fit.h): against the kernel fits, the rows they hold for and
  // the eager gap above. A profile without prefill samples is unchanged.
  const PrefillFit prefill = fit_prefill_rates(shared, p.hw);
  if (prefill.points > 0) {
    p.hw.prefill_gemm_tflops = prefill.gemm_tflops;
    p.hw.prefill_moe_tflops = prefill.moe_tflops;
    p.hw.prefill_attention_tbps = prefill.attention_tbps;
    for (const PrefillPoint& pt : prefill_points(shared, p.hw)) {
      const std::string key = "prefill." + pt.model + "." + std::to_string(pt.tokens);
      p.measurements.emplace_back(key + ".median_ns", pt.measured_ns);
      p.measurements.emplace_back(key + ".priced_ns", pt.parts.priced_ns);
    }
    p.measurements.emplace_back("prefill.fit.points", double(prefill.points));
    p.measurements.emplace_back("prefill.fit.max_rel_err", prefill.max_rel_err);
    p.measurements.emplace_back("prefill.fit.mean_err_unfitted", prefill.mean_err_unfitted);
    p.measurements.emplace_back("prefill.fit.max_rel_err_unfitted", prefill.max_rel_err_unfitted);
  }
  // Graph and PDL gaps against the kernel fits and figures above: what makes each measured
  // step's priced kernels plus one gap per node reproduce it.
  p.hw.pdl_node_gap_by_rows = node_gap_by_rows(samples, p.hw, "pdl");
  p.hw.graph_node_gap_by_rows = node_gap_by_rows(samples, p.hw, "graph");
  p.hw.eager_node_gap_by_rows = node_gap_by_rows(samples, p.hw, "eager");
  // What a collective costs its neighbours in a TP graph (calibrate --tp's stubbed steps), over
  // one empty kernel's node time in a graph.
  p.hw.pdl_break_gap_by_rows = break_gap_by_rows(samples, "pdl", double(p.hw.graph_node_gap_ns));
  p.hw.graph_break_gap_by_rows =
      break_gap_by_rows(samples, "graph", double(p.hw.graph_node_gap_ns));
  // Speculative graphs (simulator/spec_graphs.h): last, against the kernel fits and node gap
  // fitted above, which the residuals correct.
  p.hw.spec_graph_residuals = fit_spec_graph_residuals(samples, p.hw);
  return p;
}

std::string calibration_report(const CalibrationProfile& p) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-14s %8s %10s %12s %14s %16s\n", "kernel_class", "samples",
                "r2", "max_rel_err", "base_ns", "ns_per_byte");
  out += line;
  // " ns/request R" where a fit has a per-request term.
  auto per_request = [&](double ns) {
    if (ns <= 0) return std::string("\n");
    std::snprintf(line, sizeof line, ", %.4g ns/request\n", ns);
    return std::string(line);
  };
  auto fit_lines = [&](const std::string& key, const KernelFit& f) {
    std::snprintf(line, sizeof line, "%-14s %8lld %10.5f %12.4f %14.1f %16.6g  ns/flop %.4g",
                  key.c_str(), static_cast<long long>(f.samples), f.r2, f.max_rel_err, f.base_ns,
                  f.ns_per_byte, f.ns_per_flop);
    out += line;
    out += per_request(f.ns_per_request);
    if (f.split_intensity > 0) {
      std::snprintf(line, sizeof line,
                    "%-14s above %.1f flops/byte: base %.1f ns, %.6g ns/byte, %.4g ns/flop", "",
                    f.split_intensity, f.wide_base_ns, f.wide_ns_per_byte, f.wide_ns_per_flop);
      out += line;
      out += per_request(f.wide_ns_per_request);
    } else if (f.split_bytes > 0) {
      std::snprintf(line, sizeof line,
                    "%-14s above %.4g bytes: base %.1f ns, %.6g ns/byte, %.4g ns/flop", "",
                    f.split_bytes, f.wide_base_ns, f.wide_ns_per_byte, f.wide_ns_per_flop);
      out += line;
      out += per_request(f.wide_ns_per_request);
    }
  };
  for (int c = 0; c < int(KernelClass::kCount); ++c) {
    const KernelFit& f = p.hw.kernel_fits[size_t(c)];
    if (f.fitted) fit_lines(kernel_class_name(KernelClass(c)), f);
  }
  if (!p.hw.kernel_name_fits.empty()) out += "per kernel name:\n";
  for (const auto& [name, f] : p.hw.kernel_name_fits) fit_lines(name, f);
  // One line per model and name; a second regime after '|'.
  if (!p.hw.kernel_model_fits.empty()) {
    std::snprintf(line, sizeof line,
                  "per model and kernel name:\n%-20s %-14s %7s %8s %8s %10s %12s %10s\n", "model",
                  "kernel", "samples", "r2", "max_err", "base_ns", "ns_per_byte", "ns_per_flop");
    out += line;
  }
  for (const HardwareSpec::ModelKernelFits& m : p.hw.kernel_model_fits) {
    for (const auto& [name, f] : m.names) {
      std::snprintf(line, sizeof line, "%-20s %-14s %7lld %8.4f %8.4f %10.1f %12.5g %10.4g",
                    m.model.c_str(), name.c_str(), static_cast<long long>(f.samples), f.r2,
                    f.max_rel_err, f.base_ns, f.ns_per_byte, f.ns_per_flop);
      out += line;
      if (f.ns_per_request > 0) {
        std::snprintf(line, sizeof line, " %.4g/req", f.ns_per_request);
        out += line;
      }
      if (f.split_intensity > 0 || f.split_bytes > 0) {
        std::snprintf(line, sizeof line, " | above %.4g %s: %.1f %.5g %.4g",
                      f.split_intensity > 0 ? f.split_intensity : f.split_bytes,
                      f.split_intensity > 0 ? "flops/byte" : "bytes", f.wide_base_ns,
                      f.wide_ns_per_byte, f.wide_ns_per_flop);
        out += line;
        if (f.wide_ns_per_request > 0) {
          std::snprintf(line, sizeof line, " %.4g/req", f.wide_ns_per_request);
          out += line;
        }
      }
      out += "\n";
    }
  }
  for (const auto& [mode, table] : {std::pair{"pdl node", &p.hw.pdl_node_gap_by_rows},
                                    std::pair{"graph node", &p.hw.graph_node_gap_by_rows},
                                    std::pair{"eager node", &p.hw.eager_node_gap_by_rows},
                                    std::pair{"pdl break", &p.hw.pdl_break_gap_by_rows},
                                    std::pair{"graph break", &p.hw.graph_break_gap_by_rows}}) {
    for (const HardwareSpec::NodeGap& g : *table) {
      std::snprintf(line, sizeof line, "%s gap %s rows %lld: %lld ns\n", mode, g.model.c_str(),
                    static_cast<long long>(g.rows), static_cast<long long>(g.gap_ns));
      out += line;
    }
  }
  if (!p.hw.spec_graph_residuals.empty()) {
    out +=
        "speculative graphs, measured - simulated: ns = base + per_pos * P + per_pos_ctx * P * "
        "ctx + per_chunk * chunks\n(+ per_skip * skipped early-exit steps, + the corrections at "
        "the measured points; max|loo|: each point priced without its own)\n";
    std::snprintf(line, sizeof line,
                  "%-14s %-16s %-5s %5s %6s %8s %10s %9s %11s %10s %9s %9s "
                  "%9s %9s %9s\n",
                  "model", "graph", "mode", "batch", "points", "r2", "base_ns", "per_pos",
                  "per_pos_ctx", "per_chunk", "per_skip", "err_sim", "max|sim|", "max|fit|",
                  "max|loo|");
    out += line;
  }
  for (const HardwareSpec::SpecGraphResidual& f : p.hw.spec_graph_residuals) {
    std::snprintf(line, sizeof line,
                  "%-14s %-16s %-5s %5lld %6lld %8.4f %10.0f %9.1f %11.5f %10.0f %9.0f %+8.2f%% "
                  "%8.2f%% %8.2f%% %8.2f%%\n",
                  f.model.c_str(), f.graph.c_str(), f.mode.c_str(), static_cast<long long>(f.batch),
                  static_cast<long long>(f.points), f.r2, f.base_ns, f.ns_per_position,
                  f.ns_per_position_ctx, f.ns_per_extra_chunk, f.ns_per_skipped_step,
                  100 * f.mean_err_unfitted, 100 * f.max_rel_err_unfitted, 100 * f.max_rel_err,
                  100 * f.max_rel_err_loo);
    out += line;
  }
  std::snprintf(
      line, sizeof line,
      "figures: eager_launch %lld ns, graph_launch %lld ns, node gap %lld ns (graph) "
      "%lld ns (pdl) %lld ns (eager), d2h %lld ns + %.2f GB/s, host wake %lld ns, stream read "
      "%.3f TB/s, kernel floor %lld ns\n",
      static_cast<long long>(p.hw.eager_launch_ns), static_cast<long long>(p.hw.graph_launch_ns),
      static_cast<long long>(p.hw.graph_node_gap_ns), static_cast<long long>(p.hw.pdl_node_gap_ns),
      static_cast<long long>(p.hw.eager_node_gap_ns), static_cast<long long>(p.hw.d2h_latency_ns),
      p.hw.d2h_gbps, static_cast<long long>(p.hw.host_wake_ns), p.hw.stream_read_tbps,
      static_cast<long long>(p.hw.kernel_floor_ns));
  out += line;
  std::snprintf(line, sizeof line,
                "beyond %d rows (roofline + base; 0 = datasheet peak x efficiency / stream): "
                "prefill gemm %.1f TFLOP/s, moe %.1f TFLOP/s, attention %.3f TB/s\n",
                p.hw.kernel_fit_max_rows, p.hw.prefill_gemm_tflops, p.hw.prefill_moe_tflops,
                p.hw.prefill_attention_tbps);
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
