#include "simulator/spec_graphs.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "policies/calibration_model.h"
#include "policies/error.h"
#include "policies/step_kernels.h"

namespace twinstep {
namespace {

constexpr const char* kSpecGraphNames[] = {"draft", "draft_early_exit", "verify", "extend"};
static_assert(std::size(kSpecGraphNames) == size_t(SpecGraph::kCount));

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

StepShape spec_launch_shape(SpecGraph graph, int32_t requests, int32_t positions, int64_t ctx_sum) {
  StepShape s = decode_shape(requests, positions, ctx_sum);
  s.row_exact = graph == SpecGraph::kVerify || graph == SpecGraph::kExtend;
  s.kv_pass = graph == SpecGraph::kExtend;
  return s;
}

const char* spec_graph_name(SpecGraph g) {
  return g < SpecGraph::kCount ? kSpecGraphNames[size_t(g)] : "?";
}

SpecGraph spec_graph_by_name(std::string_view name) {
  for (size_t i = 0; i < size_t(SpecGraph::kCount); ++i) {
    if (name == kSpecGraphNames[i]) return SpecGraph(i);
  }
  return SpecGraph::kCount;
}

int64_t spec_graph_price_ns(const CostModel& cost, int64_t gap_ns, const ModelSpec& model,
                            const ModelSpec& draft, SpecGraph graph, int32_t requests,
                            int32_t positions, int64_t ctx_sum, int32_t tp) {
  StepKernels k;
  int64_t passes = 1;
  switch (graph) {
    case SpecGraph::kDraft:
    case SpecGraph::kDraftEarlyExit:
      shard_step_kernels(draft, tp, decode_shape(requests, 1, ctx_sum), k);
      passes = std::max(0, positions - 1);
      break;
    case SpecGraph::kVerify:
      shard_step_kernels(model, tp, spec_launch_shape(graph, requests, positions, ctx_sum), k);
      break;
    case SpecGraph::kExtend:
      shard_step_kernels(draft, tp, spec_launch_shape(graph, requests, positions, ctx_sum), k);
      break;
    case SpecGraph::kCount:
      throw Error("spec_graph_price_ns: no such speculative graph");
  }
  const GraphCost g = cost.graph_cost(k);
  return std::max<int64_t>(0, passes * g.busy_ns + passes * g.nodes * gap_ns);
}

const HardwareSpec::SpecGraphResidual* spec_graph_residual_for(const HardwareSpec& hw,
                                                               const std::string& model,
                                                               SpecGraph graph,
                                                               std::string_view mode,
                                                               int64_t requests) {
  const HardwareSpec::SpecGraphResidual* fit = nullptr;      // smallest batch >= requests
  const HardwareSpec::SpecGraphResidual* largest = nullptr;  // largest batch
  const std::string_view name = spec_graph_name(graph);
  for (const HardwareSpec::SpecGraphResidual& r : hw.spec_graph_residuals) {
    if (r.model != model || r.graph != name || r.mode != mode) continue;
    if (r.batch >= requests && (fit == nullptr || r.batch < fit->batch)) fit = &r;
    if (largest == nullptr || r.batch > largest->batch) largest = &r;
  }
  return fit != nullptr ? fit : largest;
}

int64_t spec_graph_extra_chunks(SpecGraph graph, int64_t requests, int64_t positions) {
  if (graph != SpecGraph::kVerify && graph != SpecGraph::kExtend) return 0;
  const int64_t bucket = batch_bucket(int32_t(std::min<int64_t>(requests, 1 << 30)));
  return std::max<int64_t>(0,
                           (bucket * positions + kGemvRowsPerLaunch - 1) / kGemvRowsPerLaunch - 1);
}

int64_t spec_graph_residual_ns(const HardwareSpec::SpecGraphResidual& r, SpecGraph graph,
                               int64_t requests, int32_t positions, double ctx_per_request) {
  const double p = double(positions);
  return std::llround(
      r.base_ns + r.ns_per_position * p + r.ns_per_position_ctx * p * ctx_per_request +
      r.ns_per_extra_chunk * double(spec_graph_extra_chunks(graph, requests, positions)));
}

std::vector<SpecGraphPoint> spec_graph_points(const std::vector<CalibrationSample>& samples,
                                              const HardwareSpec& hw) {
  using Key = std::tuple<std::string, std::string, std::string, int64_t, int64_t, int64_t>;
  std::map<Key, std::vector<double>> groups;
  for (const CalibrationSample& s : samples) {
    if (s.kind != "spec_graph" || s.name == kEarlyExitSkipSample) continue;
    if (spec_graph_by_name(s.name) == SpecGraph::kCount) {
      throw Error("calibration sample has unknown speculative graph '" + s.name +
                  "' (draft, draft_early_exit, verify or extend)");
    }
    if (s.mode != "graph" || s.batch < 1 || s.nodes < 1 || s.ctx_tokens < 0) continue;
    groups[{s.model, s.name, s.mode, s.batch, s.nodes, s.ctx_tokens}].push_back(s.value_ns);
  }
  // One-GPU pricing per model label, as a simulated run of the preset builds it.
  struct Pricing {
    ModelSpec model;
    ModelSpec draft;
    int32_t tp = 1;
    std::unique_ptr<CostModel> cost;
  };
  std::map<std::string, std::unique_ptr<Pricing>> pricing;
  auto pricing_of = [&](const std::string& label) -> const Pricing* {
    auto it = pricing.find(label);
    if (it != pricing.end()) return it->second.get();
    std::unique_ptr<Pricing> p;
    try {
      const CalibrationModel cm = parse_calibration_model(label);
      p = std::make_unique<Pricing>();
      p->model = model_preset(cm.preset);
      p->draft = nextn_draft(p->model);
      p->tp = cm.tp;
      p->cost = calibration_cost_model(hw, label);
    } catch (const ConfigError&) {
      p.reset();  // not a preset: nothing to price it with
    }
    return pricing.emplace(label, std::move(p)).first->second.get();
  };
  std::vector<SpecGraphPoint> out;
  for (const auto& [key, v] : groups) {
    const auto& [model, graph, mode, batch, positions, ctx] = key;
    const Pricing* p = pricing_of(model);
    if (p == nullptr || positions > (int64_t(1) << 20) || batch > (int64_t(1) << 20)) continue;
    SpecGraphPoint pt;
    pt.model = model;
    pt.graph = graph;
    pt.mode = mode;
    pt.batch = batch;
    pt.positions = positions;
    pt.ctx_tokens = ctx;
    pt.samples = int64_t(v.size());
    pt.measured_ns = median(v);
    pt.priced_ns = double(spec_graph_price_ns(*p->cost, hw.graph_node_gap_ns, p->model, p->draft,
                                              spec_graph_by_name(graph), int32_t(batch),
                                              int32_t(positions), ctx * batch, p->tp));
    out.push_back(std::move(pt));
  }
  return out;
}

std::vector<HardwareSpec::SpecGraphResidual> fit_spec_graph_residuals(
    const std::vector<CalibrationSample>& samples, const HardwareSpec& hw) {
  using Key = std::tuple<std::string, std::string, std::string, int64_t>;
  std::map<Key, std::vector<SpecGraphPoint>> groups;
  for (SpecGraphPoint& pt : spec_graph_points(samples, hw)) {
    if (pt.measured_ns <= 0) continue;
    groups[{pt.model, pt.graph, pt.mode, pt.batch}].push_back(std::move(pt));
  }
  std::vector<HardwareSpec::SpecGraphResidual> out;
  for (const auto& [key, pts] : groups) {
    const auto& [model, graph, mode, batch] = key;
    const SpecGraph kind = spec_graph_by_name(graph);
    auto chunks_of = [&](const SpecGraphPoint& pt) {
      return double(spec_graph_extra_chunks(kind, pt.batch, pt.positions));
    };
    std::set<int64_t> positions, contexts;
    std::set<double> chunks;
    for (const SpecGraphPoint& pt : pts) {
      positions.insert(pt.positions);
      contexts.insert(pt.ctx_tokens);
      chunks.insert(chunks_of(pt));
    }
    bool use_pos = positions.size() >= 2;
    bool use_ctx = contexts.size() >= 2;
    bool use_chunks = chunks.size() >= 2;
    auto columns = [&] { return 1 + int(use_pos) + int(use_ctx) + int(use_chunks); };
    if (size_t(columns()) > pts.size()) use_ctx = false;
    if (size_t(columns()) > pts.size()) use_chunks = false;
    if (size_t(columns()) > pts.size()) use_pos = false;
    // Rows weighted by 1 / measured: the fit minimises the corrected price's relative error.
    const Eigen::Index m = Eigen::Index(pts.size());
    const Eigen::Index n = columns();
    Eigen::MatrixXd a(m, n);
    Eigen::VectorXd b(m);
    for (Eigen::Index i = 0; i < m; ++i) {
      const SpecGraphPoint& pt = pts[size_t(i)];
      const double w = 1.0 / pt.measured_ns;
      const double p = double(pt.positions);
      Eigen::Index c = 0;
      a(i, c++) = w;
      if (use_pos) a(i, c++) = w * p;
      if (use_ctx) a(i, c++) = w * p * double(pt.ctx_tokens);
      if (use_chunks) a(i, c++) = w * chunks_of(pt);
      b(i) = w * (pt.measured_ns - pt.priced_ns);
    }
    Eigen::VectorXd scale(n);
    for (Eigen::Index j = 0; j < n; ++j) {
      const double mx = a.col(j).cwiseAbs().maxCoeff();
      scale(j) = mx > 0 ? 1.0 / mx : 1.0;
      a.col(j) *= scale(j);
    }
    const Eigen::VectorXd x = a.completeOrthogonalDecomposition().solve(b).cwiseProduct(scale);
    HardwareSpec::SpecGraphResidual f;
    f.model = model;
    f.graph = graph;
    f.mode = mode;
    f.batch = batch;
    Eigen::Index c = 0;
    f.base_ns = x(c++);
    if (use_pos) f.ns_per_position = x(c++);
    if (use_ctx) f.ns_per_position_ctx = x(c++);
    if (use_chunks) f.ns_per_extra_chunk = x(c++);
    double mean_r = 0;
    for (const SpecGraphPoint& pt : pts) mean_r += (pt.measured_ns - pt.priced_ns) / double(m);
    double ss_res = 0, ss_tot = 0;
    for (const SpecGraphPoint& pt : pts) {
      const double r = pt.measured_ns - pt.priced_ns;
      const int64_t fit_ns =
          spec_graph_residual_ns(f, kind, pt.batch, int32_t(pt.positions), double(pt.ctx_tokens));
      const double corrected = std::max(0.0, pt.priced_ns + double(fit_ns));
      ss_res += (r - double(fit_ns)) * (r - double(fit_ns));
      ss_tot += (r - mean_r) * (r - mean_r);
      f.max_rel_err =
          std::max(f.max_rel_err, std::abs(corrected - pt.measured_ns) / pt.measured_ns);
      const double before = (pt.priced_ns - pt.measured_ns) / pt.measured_ns;
      f.max_rel_err_unfitted = std::max(f.max_rel_err_unfitted, std::abs(before));
      f.mean_err_unfitted += before / double(m);
      f.samples += pt.samples;
    }
    // One point, or residuals all equal: R² is 1 where the fit reproduces them (to rounding).
    f.r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : (ss_res <= double(m) ? 1.0 : 0.0);
    f.points = m;
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace twinstep
