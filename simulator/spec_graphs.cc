#include "simulator/spec_graphs.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "kernels/attention_split.h"
#include "policies/calibration_model.h"
#include "policies/error.h"
#include "policies/kv_capacity.h"
#include "policies/step_kernels.h"

namespace twinstep {
namespace {

constexpr const char* kSpecGraphNames[] = {"draft", "draft_early_exit", "verify", "extend"};
static_assert(std::size(kSpecGraphNames) == size_t(SpecGraph::kCount));

// Contexts per request that count as one grid context in the corrections: 16 tokens or 1/64 of
// it (calibrate's sessions land a nominal context a few tokens apart).
int64_t same_context(int64_t ctx) { return std::max<int64_t>(16, ctx / 64); }

// The first GQA layer's attention of `model` (the heads the attention partition and calibrate's
// widest verify follow), or nullptr.
const AttentionSpec* first_gqa(const ModelSpec& model) {
  for (const LayerSpec& l : model.layers) {
    if (l.attn.kind == AttentionKind::kGqa && l.attn.num_kv_heads > 0) return &l.attn;
  }
  return nullptr;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

StepShape spec_launch_shape(SpecGraph graph, int32_t requests, int32_t positions, int64_t ctx_sum) {
  if (graph == SpecGraph::kVerify) return verify_shape(requests, positions, ctx_sum);
  if (graph == SpecGraph::kExtend) return extend_shape(requests, positions, ctx_sum);
  return decode_shape(requests, positions, ctx_sum);
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

double spec_graph_correction_ns(const std::vector<HardwareSpec::SpecGraphResidual::Correction>& c,
                                double positions, double ctx_per_request, int64_t split_tokens) {
  if (c.empty()) return 0;
  // The correction along ctx among the points of width w: [first, last) of c, sorted by ctx then
  // split; per context the point of the split nearest split_tokens.
  auto along_ctx = [&](size_t first, size_t last) {
    double prev_ctx = 0, prev_ns = 0;
    bool have_prev = false;
    for (size_t i = first; i < last;) {
      size_t best = i, j = i;
      for (; j < last && c[j].ctx == c[i].ctx; ++j) {
        if (std::abs(c[j].split_tokens - split_tokens) <
            std::abs(c[best].split_tokens - split_tokens))
          best = j;
      }
      const double x = double(c[i].ctx), ns = c[best].ns;
      if (ctx_per_request <= x) {
        if (!have_prev) return ns;
        return prev_ns + (ctx_per_request - prev_ctx) / (x - prev_ctx) * (ns - prev_ns);
      }
      prev_ctx = x, prev_ns = ns, have_prev = true;
      i = j;
    }
    return prev_ns;
  };
  // The widths' ranges: [begin, end) of each distinct positions value, in order.
  size_t lo_first = 0, lo_last = 0, hi_first = 0, hi_last = 0;
  bool have_lo = false, have_hi = false;
  for (size_t first = 0; first < c.size();) {
    size_t last = first;
    while (last < c.size() && c[last].positions == c[first].positions) ++last;
    const double w = double(c[first].positions);
    if (w <= positions) {
      lo_first = first, lo_last = last, have_lo = true;
    }
    if (w >= positions && !have_hi) {
      hi_first = first, hi_last = last, have_hi = true;
    }
    first = last;
  }
  if (!have_lo) return along_ctx(hi_first, hi_last);
  if (!have_hi) return along_ctx(lo_first, lo_last);
  const double lo = along_ctx(lo_first, lo_last);
  if (lo_first == hi_first) return lo;
  const double w0 = double(c[lo_first].positions), w1 = double(c[hi_first].positions);
  return lo + (positions - w0) / (w1 - w0) * (along_ctx(hi_first, hi_last) - lo);
}

int64_t spec_graph_split_tokens(const ModelSpec& model, int32_t tp, int32_t requests,
                                int32_t capacity, int32_t sms) {
  const AttentionSpec* a = first_gqa(model);
  if (a == nullptr || capacity <= 0 || sms <= 0) return 0;
  const int heads = std::max(1, a->num_kv_heads / std::max(1, tp));
  return kernels::attention_partition(capacity, std::max(1, requests), heads, sms).split_tokens;
}

int64_t spec_graph_residual_ns(const HardwareSpec::SpecGraphResidual& r, SpecGraph graph,
                               int64_t requests, int32_t positions, double ctx_per_request,
                               int32_t skipped_steps, int64_t split_tokens) {
  const double p = double(positions);
  return std::llround(
      r.base_ns + r.ns_per_position * p + r.ns_per_position_ctx * p * ctx_per_request +
      r.ns_per_extra_chunk * double(spec_graph_extra_chunks(graph, requests, positions)) +
      spec_graph_correction_ns(r.corrections, p, ctx_per_request, split_tokens) +
      r.ns_per_skipped_step * double(std::max(0, skipped_steps)));
}

std::vector<SpecGraphPoint> spec_graph_points(const std::vector<CalibrationSample>& samples,
                                              const HardwareSpec& hw) {
  using Key = std::tuple<std::string, std::string, std::string, int64_t, int64_t, int64_t, int64_t>;
  std::map<Key, std::vector<double>> groups;
  for (const CalibrationSample& s : samples) {
    if (s.kind != "spec_graph" || s.name == kEarlyExitSkipSample) continue;
    if (spec_graph_by_name(s.name) == SpecGraph::kCount) {
      throw Error("calibration sample has unknown speculative graph '" + s.name +
                  "' (draft, draft_early_exit, verify or extend)");
    }
    if (s.mode != "graph" || s.batch < 1 || s.nodes < 1 || s.ctx_tokens < 0) continue;
    groups[{s.model, s.name, s.mode, s.batch, s.nodes, s.ctx_tokens, std::max<int64_t>(0, s.bytes)}]
        .push_back(s.value_ns);
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
      p->model = calibration_model_spec(cm);
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
    const auto& [model, graph, mode, batch, positions, ctx, capacity] = key;
    const Pricing* p = pricing_of(model);
    if (p == nullptr || positions > (int64_t(1) << 20) || batch > (int64_t(1) << 20)) continue;
    SpecGraphPoint pt;
    pt.model = model;
    pt.graph = graph;
    pt.mode = mode;
    pt.batch = batch;
    pt.positions = positions;
    pt.ctx_tokens = ctx;
    pt.capacity_tokens = capacity;
    // The split of the engine measured: its recorded capacity, else calibrate's rule.
    if (const AttentionSpec* a = first_gqa(p->model)) {
      const int64_t cap =
          capacity > 0 ? capacity
                       : spec_calibration_capacity_tokens(
                             ctx, spec_calibration_max_width(a->num_q_heads, a->num_kv_heads));
      pt.split_tokens =
          spec_graph_split_tokens(p->model, p->tp, batch_bucket(int32_t(batch)),
                                  int32_t(std::min<int64_t>(cap, 1 << 30)), hw.sm_count);
    }
    pt.samples = int64_t(v.size());
    pt.measured_ns = median(v);
    pt.priced_ns = double(spec_graph_price_ns(*p->cost, hw.graph_node_gap_ns, p->model, p->draft,
                                              spec_graph_by_name(graph), int32_t(batch),
                                              int32_t(positions), ctx * batch, p->tp));
    out.push_back(std::move(pt));
  }
  return out;
}

namespace {

// ns_per_skipped_step of the draft_early_exit fits in `fits` (fit_spec_graph_residuals).
void fit_early_exit_skips(const std::vector<CalibrationSample>& samples,
                          std::vector<HardwareSpec::SpecGraphResidual>& fits) {
  // (model, mode, batch) -> ctx -> steps -> launch times
  using Key = std::tuple<std::string, std::string, int64_t>;
  std::map<Key, std::map<int64_t, std::map<int64_t, std::vector<double>>>> groups;
  for (const CalibrationSample& s : samples) {
    if (s.kind != "spec_graph" || s.name != kEarlyExitSkipSample || s.nodes < 1) continue;
    groups[{s.model, s.mode, s.batch}][s.ctx_tokens][s.nodes].push_back(s.value_ns);
  }
  for (HardwareSpec::SpecGraphResidual& f : fits) {
    if (f.graph != spec_graph_name(SpecGraph::kDraftEarlyExit)) continue;
    const auto it = groups.find({f.model, f.mode, f.batch});
    if (it == groups.end()) continue;
    std::vector<double> slopes;
    for (const auto& [ctx, by_steps] : it->second) {
      if (by_steps.size() < 2) continue;
      double sx = 0, sy = 0, sxx = 0, sxy = 0;
      const double n = double(by_steps.size());
      for (const auto& [steps, values] : by_steps) {
        const double x = double(steps - 1), y = median(values);
        sx += x, sy += y, sxx += x * x, sxy += x * y;
      }
      slopes.push_back((n * sxy - sx * sy) / (n * sxx - sx * sx));
    }
    if (!slopes.empty()) f.ns_per_skipped_step = median(slopes);
  }
}

}  // namespace

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
    // The corrections: points of one width and one attention split size whose contexts are
    // within same_context() of the first of them (one grid context measured by several sessions)
    // make one, their mean weighted by samples at their mean context; sorted by (positions, ctx,
    // split). Then each point priced without its own (max_rel_err_loo).
    std::vector<size_t> order(pts.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::tuple(pts[a].positions, pts[a].split_tokens, pts[a].ctx_tokens) <
             std::tuple(pts[b].positions, pts[b].split_tokens, pts[b].ctx_tokens);
    });
    std::vector<HardwareSpec::SpecGraphResidual::Correction> corrections;
    std::vector<size_t> correction_of(pts.size());
    for (size_t i = 0; i < order.size();) {
      const SpecGraphPoint& head = pts[order[i]];
      size_t j = i;
      double ns = 0, ctx = 0, weight = 0;
      for (; j < order.size() && pts[order[j]].positions == head.positions &&
             pts[order[j]].split_tokens == head.split_tokens &&
             pts[order[j]].ctx_tokens - head.ctx_tokens <= same_context(head.ctx_tokens);
           ++j) {
        const SpecGraphPoint& pt = pts[order[j]];
        const double form_ns = double(spec_graph_residual_ns(
            f, kind, pt.batch, int32_t(pt.positions), double(pt.ctx_tokens)));
        const double w = double(std::max<int64_t>(1, pt.samples));
        ns += w * (pt.measured_ns - pt.priced_ns - form_ns);
        ctx += w * double(pt.ctx_tokens);
        weight += w;
        correction_of[order[j]] = corrections.size();
      }
      corrections.push_back(
          {head.positions, std::llround(ctx / weight), ns / weight, head.split_tokens});
      i = j;
    }
    // Sorted by (positions, ctx, split); correction_of follows.
    std::vector<size_t> by_key(corrections.size());
    for (size_t i = 0; i < by_key.size(); ++i) by_key[i] = i;
    std::sort(by_key.begin(), by_key.end(), [&](size_t a, size_t b) {
      return std::tuple(corrections[a].positions, corrections[a].ctx, corrections[a].split_tokens) <
             std::tuple(corrections[b].positions, corrections[b].ctx, corrections[b].split_tokens);
    });
    std::vector<size_t> rank(by_key.size());
    for (size_t i = 0; i < by_key.size(); ++i) {
      rank[by_key[i]] = i;
      f.corrections.push_back(corrections[by_key[i]]);
    }
    for (size_t& c : correction_of) c = rank[c];
    if (f.corrections.size() >= 2) {
      for (size_t i = 0; i < pts.size(); ++i) {
        HardwareSpec::SpecGraphResidual others = f;
        others.corrections.erase(others.corrections.begin() + std::ptrdiff_t(correction_of[i]));
        const SpecGraphPoint& pt = pts[i];
        const double corrected = std::max(
            0.0, pt.priced_ns +
                     double(spec_graph_residual_ns(others, kind, pt.batch, int32_t(pt.positions),
                                                   double(pt.ctx_tokens), 0, pt.split_tokens)));
        f.max_rel_err_loo =
            std::max(f.max_rel_err_loo, std::abs(corrected - pt.measured_ns) / pt.measured_ns);
      }
    }
    out.push_back(std::move(f));
  }
  fit_early_exit_skips(samples, out);
  return out;
}

}  // namespace twinstep
