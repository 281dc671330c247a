#include "simulator/prefill_fit.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <utility>

#include "policies/calibration_model.h"
#include "policies/error.h"
#include "policies/step_kernels.h"
#include "simulator/calibration.h"
#include "simulator/cost_model.h"

namespace twinstep {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Prompts longer than this are not priced (a sample's ctx_tokens is read from a database).
constexpr int64_t kMaxPromptTokens = int64_t(1) << 22;

}  // namespace

PrefillParts prefill_parts(const HardwareSpec& hw, const std::string& label, int64_t tokens) {
  const std::unique_ptr<CostModel> priced = calibration_cost_model(hw, label);
  const CostModel& cost = *priced;
  StepKernels sk;
  calibration_step_kernels(label, prefill_shape(1, tokens, tokens * tokens), sk);
  PrefillParts p;
  int64_t nodes = 0;
  for (const LayerRun& run : sk.runs) {
    for (int32_t i = run.first; i < run.first + run.count; ++i) {
      const KernelDesc& k = sk.kernels[size_t(i)];
      const double ns = double(cost.kernel_ns(k));
      const std::optional<double> base = cost.beyond_fit_base_ns(k);
      double fixed = ns;
      if (base.has_value()) {
        switch (k.cls) {
          case KernelClass::kGemm:
          case KernelClass::kLmHead:
            p.gemm_flops += double(run.repeat) * double(k.flops);
            fixed = *base;
            break;
          case KernelClass::kMoeExperts:
            p.moe_flops += double(run.repeat) * double(k.flops);
            fixed = *base;
            break;
          case KernelClass::kAttention:
            p.attention_bytes += double(run.repeat) * double(k.bytes_read + k.bytes_written);
            fixed = *base;
            break;
          default:
            break;  // norms, rope, activations: priced by bytes at the stream rate
        }
      }
      p.priced_ns += double(run.repeat) * ns;
      p.fixed_ns += double(run.repeat) * fixed;
    }
    nodes += int64_t{run.repeat} * run.count;
  }
  const double gaps = double(std::max<int64_t>(0, nodes - 1) * hw.eager_node_gap_ns);
  p.priced_ns += gaps;
  p.fixed_ns += gaps;
  return p;
}

std::vector<PrefillPoint> prefill_points(const std::vector<CalibrationSample>& samples,
                                         const HardwareSpec& hw) {
  std::map<std::pair<std::string, int64_t>, std::vector<double>> groups;
  for (const CalibrationSample& s : samples) {
    if (s.kind != "prefill" || s.batch != 1 || s.value_ns <= 0) continue;
    if (s.ctx_tokens < 1 || s.ctx_tokens > kMaxPromptTokens) continue;
    groups[{s.model, s.ctx_tokens}].push_back(s.value_ns);
  }
  std::vector<PrefillPoint> out;
  for (const auto& [key, v] : groups) {
    PrefillPoint pt;
    pt.model = key.first;
    pt.tokens = key.second;
    pt.samples = int64_t(v.size());
    pt.measured_ns = median(v);
    try {
      pt.parts = prefill_parts(hw, pt.model, pt.tokens);
    } catch (const ConfigError&) {
      continue;  // not a label the simulator can price
    }
    out.push_back(std::move(pt));
  }
  return out;
}

PrefillFit fit_prefill_rates(const std::vector<CalibrationSample>& samples,
                             const HardwareSpec& hw) {
  PrefillFit fit;
  const std::vector<PrefillPoint> pts = prefill_points(samples, hw);
  fit.points = int64_t(pts.size());
  if (pts.empty()) return fit;
  for (const PrefillPoint& pt : pts) {
    const double err = (pt.parts.priced_ns - pt.measured_ns) / pt.measured_ns;
    fit.mean_err_unfitted += err / double(pts.size());
    fit.max_rel_err_unfitted = std::max(fit.max_rel_err_unfitted, std::abs(err));
  }
  // Columns: GEMM FLOPs, expert FLOPs, attention bytes; those zero in every point are dropped.
  auto column = [](const PrefillParts& p, int c) {
    return c == 0 ? p.gemm_flops : c == 1 ? p.moe_flops : p.attention_bytes;
  };
  std::vector<int> cols;
  for (int c = 0; c < 3; ++c) {
    for (const PrefillPoint& pt : pts) {
      if (column(pt.parts, c) > 0) {
        cols.push_back(c);
        break;
      }
    }
  }
  if (cols.empty()) return fit;
  const Eigen::Index m = Eigen::Index(pts.size()), n = Eigen::Index(cols.size());
  Eigen::MatrixXd a(m, n);
  Eigen::VectorXd b(m);
  for (Eigen::Index i = 0; i < m; ++i) {
    const PrefillPoint& pt = pts[size_t(i)];
    const double w = 1.0 / pt.measured_ns;
    for (Eigen::Index j = 0; j < n; ++j) a(i, j) = w * column(pt.parts, cols[size_t(j)]);
    b(i) = w * (pt.measured_ns - pt.parts.fixed_ns);
  }
  Eigen::VectorXd scale(n);
  for (Eigen::Index j = 0; j < n; ++j) {
    scale(j) = a.col(j).cwiseAbs().maxCoeff();
    a.col(j) /= scale(j);
  }
  const Eigen::VectorXd x = nnls(a, b);
  HardwareSpec fitted = hw;
  for (Eigen::Index j = 0; j < n; ++j) {
    const double ns_per_unit = x(j) / scale(j);
    if (!(ns_per_unit > 0) || !std::isfinite(ns_per_unit)) continue;
    const double rate = 1e-3 / ns_per_unit;  // TFLOP/s or TB/s
    switch (cols[size_t(j)]) {
      case 0:
        fit.gemm_tflops = fitted.prefill_gemm_tflops = rate;
        break;
      case 1:
        fit.moe_tflops = fitted.prefill_moe_tflops = rate;
        break;
      default:
        fit.attention_tbps = fitted.prefill_attention_tbps = rate;
        break;
    }
  }
  for (const PrefillPoint& pt : pts) {
    const double priced = prefill_parts(fitted, pt.model, pt.tokens).priced_ns;
    fit.max_rel_err = std::max(fit.max_rel_err, std::abs(priced - pt.measured_ns) / pt.measured_ns);
  }
  return fit;
}

}  // namespace twinstep
