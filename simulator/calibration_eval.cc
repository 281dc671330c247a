#include "simulator/calibration_eval.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <tuple>

#include "policies/calibration_model.h"
#include "policies/step_kernels.h"
#include "simulator/calibration.h"
#include "simulator/cost_model.h"
#include "simulator/spec_graphs.h"

namespace twinstep {
namespace {

// Accumulates relative errors of one group of kernel samples.
struct ErrorSum {
  int64_t n = 0;
  double measured = 0, priced = 0, err = 0, abs_err = 0, max_abs = 0;
  void add(double measured_ns, double priced_ns) {
    const double e = 100.0 * (priced_ns - measured_ns) / measured_ns;
    ++n;
    measured += measured_ns;
    priced += priced_ns;
    err += e;
    abs_err += std::abs(e);
    max_abs = std::max(max_abs, std::abs(e));
  }
  KernelEvalRow row(const std::string& model, const std::string& name, int64_t batch) const {
    const double k = 1.0 / double(n);
    return {model,   name,        batch,  n, measured * k / 1e3, priced * k / 1e3,
            err * k, abs_err * k, max_abs};
  }
};

// A model's cost model as a simulated run of it on one GPU (its shard for a TP label) builds
// it, and the gap figures the simulator takes for it.
struct Pricing {
  std::unique_ptr<CostModel> cost;
  std::string fit_model;        // kernel_model_fits key, or "(pooled)"
  std::string gap_model;        // pdl_node_gap_by_rows / graph_node_gap_by_rows key
  std::string attention_model;  // attention_fit_model: whose attention fit, empty: its own
};

}  // namespace

CalibrationEvaluation evaluate_calibration(const HardwareSpec& hw,
                                           const std::vector<CalibrationSample>& samples) {
  std::map<std::string, Pricing> pricing;
  auto pricing_of = [&](const std::string& label) -> const Pricing& {
    auto it = pricing.find(label);
    if (it != pricing.end()) return it->second;
    const CalibrationModel cm = parse_calibration_model(label);  // ConfigError when unknown
    Pricing p;
    const std::string fit = kernel_fit_model(hw, cm.preset, cm.tp, cm.fusion);
    const ModelSpec model = calibration_model_spec(cm);
    p.attention_model = attention_fit_model(hw, model, calibration_layout(model, cm.tp));
    p.cost = calibration_cost_model(hw, label);
    p.fit_model = kernel_model_fits_for(hw, fit) != nullptr ? fit : "(pooled)";
    p.gap_model = pdl_gap_model(hw, cm.preset, cm.tp, cm.fusion);
    return pricing.emplace(label, std::move(p)).first->second;
  };

  std::map<std::pair<std::string, std::string>, ErrorSum> by_name;
  std::map<std::string, std::map<std::string, std::pair<int32_t, int32_t>>> gemv_shapes;
  std::map<std::tuple<std::string, std::string, int64_t>, ErrorSum> by_batch;
  using StepKey = std::tuple<std::string, std::string, int64_t, int64_t>;
  std::map<StepKey, std::vector<double>> steps;
  for (const CalibrationSample& s : samples) {
    if (s.kind == "step" && s.batch >= 1) {
      steps[{s.model, s.mode, s.batch, s.ctx_tokens}].push_back(s.value_ns);
    }
    if (s.kind != "kernel" || s.value_ns <= 0) continue;
    KernelClass cls = KernelClass::kCount;
    for (int c = 0; c < int(KernelClass::kCount); ++c) {
      if (s.cls == kernel_class_name(KernelClass(c))) cls = KernelClass(c);
    }
    if (cls == KernelClass::kCount) continue;  // fit_calibration refuses these; nothing to price
    // The price depends on bytes read + written only, so the sample's total stands for both;
    // a decode grid point serves `batch` requests.
    KernelDesc k{s.name.c_str(),        cls, s.bytes,         0, s.flops,
                 CollectiveKind::kNone, 0,   int32_t(s.batch)};
    // A projection's weight shape, for its GEMV split (gemv_split_rows).
    auto shapes = gemv_shapes.find(s.model);
    if (shapes == gemv_shapes.end())
      shapes = gemv_shapes.emplace(s.model, calibration_gemv_shapes(s.model)).first;
    if (const auto shape = shapes->second.find(s.name); shape != shapes->second.end()) {
      k.gemv_n = shape->second.first;
      k.gemv_k = shape->second.second;
    }
    const double priced = double(pricing_of(s.model).cost->kernel_ns(k));
    by_name[{s.model, s.name}].add(s.value_ns, priced);
    by_batch[{s.model, s.name, s.batch}].add(s.value_ns, priced);
  }
  // The kernel the profiled launches lose (lm_head, the step's last node): its step residual,
  // as fit_calibration recovers it, with the evaluated sessions' own graph node gap.
  std::vector<double> gaps;
  for (const CalibrationSample& s : samples) {
    if (s.kind == "node_gap" && s.mode == "graph") gaps.push_back(s.value_ns);
  }
  const double gap = gaps.empty() ? double(hw.graph_node_gap_ns) : distribution(gaps).p50_ns;
  for (const ResidualSample& r : residual_kernel_samples(samples, gap)) {
    const KernelDesc k{r.name.c_str(),
                       r.sample.cls,
                       int64_t(r.sample.bytes),
                       0,
                       int64_t(r.sample.flops),
                       CollectiveKind::kNone,
                       0,
                       int32_t(r.batch)};
    const double priced = double(pricing_of(r.model).cost->kernel_ns(k));
    const std::string name = r.name + " (residual)";
    by_name[{r.model, name}].add(r.sample.ns, priced);
    by_batch[{r.model, name, r.batch}].add(r.sample.ns, priced);
  }

  CalibrationEvaluation e;
  for (const auto& [key, sum] : by_name) e.kernels.push_back(sum.row(key.first, key.second, 0));
  for (const auto& [key, sum] : by_batch) {
    e.kernels_by_batch.push_back(sum.row(std::get<0>(key), std::get<1>(key), std::get<2>(key)));
  }
  StepKernels sk;
  for (const auto& [key, v] : steps) {
    const auto& [model, mode, batch, ctx] = key;
    const Pricing& p = pricing_of(model);
    calibration_step_kernels(model, decode_shape(int32_t(batch), 1, ctx * batch), sk);
    const GraphCost c = p.cost->graph_cost(sk);
    StepEvalRow r;
    r.model = model;
    r.mode = mode;
    r.batch = batch;
    r.ctx_tokens = ctx;
    r.nodes = c.nodes;
    r.measured_us = distribution(v).p50_ns / 1e3;
    r.kernels_us = double(c.busy_ns) / 1e3;
    // The gap per node as the simulator's single-rank launch takes it (sim_backend.cc
    // node_gap_ns); a negative PDL gap shortens the span, never below zero.
    r.gap_ns = mode == "pdl"     ? double(pdl_node_gap_for(hw, p.gap_model, batch))
               : mode == "eager" ? double(eager_node_gap_for(hw, p.gap_model, batch))
                                 : double(graph_node_gap_for(hw, p.gap_model, batch));
    r.priced_us = std::max(0.0, r.kernels_us + double(r.nodes) * r.gap_ns / 1e3);
    r.err_pct = 100.0 * (r.priced_us - r.measured_us) / r.measured_us;
    e.steps.push_back(r);
  }
  for (const auto& [label, p] : pricing) {
    e.priced_as.emplace_back(label, p.fit_model);
    if (!p.attention_model.empty()) e.attention_from.emplace_back(label, p.attention_model);
  }
  for (const SpecGraphPoint& pt : spec_graph_points(samples, hw)) {
    SpecGraphEvalRow r;
    r.model = pt.model;
    r.graph = pt.graph;
    r.mode = pt.mode;
    r.batch = pt.batch;
    r.positions = pt.positions;
    r.ctx_tokens = pt.ctx_tokens;
    r.capacity_tokens = pt.capacity_tokens;
    r.split_tokens = pt.split_tokens;
    r.samples = pt.samples;
    r.measured_us = pt.measured_ns / 1e3;
    r.sim_us = pt.priced_ns / 1e3;
    const SpecGraph graph = spec_graph_by_name(pt.graph);
    if (const HardwareSpec::SpecGraphResidual* f =
            spec_graph_residual_for(hw, pt.model, graph, pt.mode, pt.batch)) {
      r.residual_us = double(spec_graph_residual_ns(*f, graph, pt.batch, int32_t(pt.positions),
                                                    double(pt.ctx_tokens), 0, pt.split_tokens)) /
                      1e3;
    }
    r.err_sim_pct = 100.0 * (r.sim_us - r.measured_us) / r.measured_us;
    r.err_pct = 100.0 * (std::max(0.0, r.sim_us + r.residual_us) - r.measured_us) / r.measured_us;
    e.spec_graphs.push_back(r);
  }
  return e;
}

std::string evaluation_report(const CalibrationEvaluation& e, bool by_batch) {
  std::string out;
  char line[320];
  for (const auto& [model, fit] : e.priced_as) {
    std::snprintf(line, sizeof line, "model %s priced with the kernel fits of %s\n", model.c_str(),
                  fit == "(pooled)" ? "no model of its own (pooled name and class fits)"
                                    : ("'" + fit + "'").c_str());
    out += line;
  }
  for (const auto& [model, from] : e.attention_from) {
    std::snprintf(line, sizeof line,
                  "model %s priced its attention with the fit of '%s' (the same attention "
                  "launch)\n",
                  model.c_str(), from.c_str());
    out += line;
  }
  auto kernel_table = [&](const std::vector<KernelEvalRow>& rows, bool batches) {
    std::snprintf(line, sizeof line, "%-18s %-20s %6s %8s %10s %10s %9s %9s %9s\n", "model",
                  "kernel", batches ? "batch" : "", "samples", "meas_us", "sim_us", "err_pct",
                  "|err|_pct", "max|err|");
    out += line;
    for (const KernelEvalRow& r : rows) {
      const std::string b = batches ? std::to_string(r.batch) : "";
      std::snprintf(line, sizeof line, "%-18s %-20s %6s %8lld %10.2f %10.2f %+9.2f %9.2f %9.2f\n",
                    r.model.c_str(), r.name.c_str(), b.c_str(), static_cast<long long>(r.samples),
                    r.measured_us, r.priced_us, r.mean_err_pct, r.mean_abs_err_pct,
                    r.max_abs_err_pct);
      out += line;
    }
  };
  out += "kernel samples, (sim - measured) / measured:\n";
  kernel_table(e.kernels, false);
  if (by_batch) {
    out += "by batch:\n";
    kernel_table(e.kernels_by_batch, true);
  }
  out += "steps, sum of kernels + nodes x gap vs the measured median step:\n";
  std::snprintf(line, sizeof line, "%-18s %-6s %6s %7s %6s %10s %10s %8s %10s %8s\n", "model",
                "mode", "batch", "ctx", "nodes", "meas_us", "kernels_us", "gap_ns", "sim_us",
                "err_pct");
  out += line;
  std::map<std::pair<std::string, std::string>, ErrorSum> summary;
  for (const StepEvalRow& r : e.steps) {
    std::snprintf(line, sizeof line,
                  "%-18s %-6s %6lld %7lld %6lld %10.1f %10.1f %8.0f %10.1f %+8.2f\n",
                  r.model.c_str(), r.mode.c_str(), static_cast<long long>(r.batch),
                  static_cast<long long>(r.ctx_tokens), static_cast<long long>(r.nodes),
                  r.measured_us, r.kernels_us, r.gap_ns, r.priced_us, r.err_pct);
    out += line;
    summary[{r.model, r.mode}].add(r.measured_us, r.priced_us);
  }
  for (const auto& [key, s] : summary) {
    const KernelEvalRow r = s.row(key.first, key.second, 0);
    std::snprintf(line, sizeof line,
                  "steps %s %s: %lld points, mean error %+.2f %%, mean |error| %.2f %%, max "
                  "|error| %.2f %%\n",
                  key.first.c_str(), key.second.c_str(), static_cast<long long>(r.samples),
                  r.mean_err_pct, r.mean_abs_err_pct, r.max_abs_err_pct);
    out += line;
  }
  if (e.spec_graphs.empty()) return out;
  out +=
      "speculative graphs, the simulator's price (sim) and with the profile's residual (fit) vs "
      "the measured median launch:\n";
  std::snprintf(line, sizeof line,
                "%-14s %-16s %-5s %5s %4s %6s %7s %10s %10s %10s %8s %8s %8s %5s\n", "model",
                "graph", "mode", "batch", "pos", "ctx", "samples", "meas_us", "sim_us", "fit_us",
                "err_sim", "err_fit", "capacity", "split");
  out += line;
  using GraphKey = std::tuple<std::string, std::string, std::string>;
  std::map<GraphKey, std::pair<ErrorSum, ErrorSum>> graphs;  // without, with the residual
  for (const SpecGraphEvalRow& r : e.spec_graphs) {
    const double fit_us = std::max(0.0, r.sim_us + r.residual_us);
    std::snprintf(line, sizeof line,
                  "%-14s %-16s %-5s %5lld %4lld %6lld %7lld %10.1f %10.1f %10.1f %+8.2f %+8.2f "
                  "%8lld %5lld\n",
                  r.model.c_str(), r.graph.c_str(), r.mode.c_str(), static_cast<long long>(r.batch),
                  static_cast<long long>(r.positions), static_cast<long long>(r.ctx_tokens),
                  static_cast<long long>(r.samples), r.measured_us, r.sim_us, fit_us, r.err_sim_pct,
                  r.err_pct, static_cast<long long>(r.capacity_tokens),
                  static_cast<long long>(r.split_tokens));
    out += line;
    auto& sums = graphs[{r.model, r.graph, r.mode}];
    sums.first.add(r.measured_us, r.sim_us);
    sums.second.add(r.measured_us, fit_us);
  }
  for (const auto& [key, sums] : graphs) {
    const KernelEvalRow a = sums.first.row("", "", 0);
    const KernelEvalRow b = sums.second.row("", "", 0);
    std::snprintf(line, sizeof line,
                  "spec graphs %s %s %s: %lld points, sim mean error %+.2f %% (max |error| %.2f "
                  "%%), with the residual %+.2f %% (max |error| %.2f %%)\n",
                  std::get<0>(key).c_str(), std::get<1>(key).c_str(), std::get<2>(key).c_str(),
                  static_cast<long long>(a.samples), a.mean_err_pct, a.max_abs_err_pct,
                  b.mean_err_pct, b.max_abs_err_pct);
    out += line;
  }
  return out;
}

}  // namespace twinstep
