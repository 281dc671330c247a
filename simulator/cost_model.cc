#include "simulator/cost_model.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <string_view>

#include "policies/calibration_model.h"

namespace twinstep {

namespace {

// ns per FLOP at a measured rate (TFLOP/s) where there is one, else the datasheet peak times the
// assumed efficiency.
double ns_per_flop_at(double measured_tflops, const HardwareSpec& hw) {
  return measured_tflops > 0 ? 1e-3 / measured_tflops
                             : 1e9 / (hw.bf16_tflops * 1e12 * hw.flop_efficiency);
}

}  // namespace

CostModel::CostModel(const HardwareSpec& hw, const std::string& model,
                     const std::string& attention_model)
    : ns_per_byte_(1e9 / (hw.stream_read_tbps * 1e12 * hw.mem_efficiency)),
      ns_per_flop_(1e9 / (hw.bf16_tflops * 1e12 * hw.flop_efficiency)),
      gemm_ns_per_flop_(ns_per_flop_at(hw.prefill_gemm_tflops, hw)),
      moe_ns_per_flop_(ns_per_flop_at(hw.prefill_moe_tflops, hw)),
      stream_ns_per_byte_(1e-3 / hw.stream_read_tbps),
      peak_ns_per_flop_(1e-3 / hw.bf16_tflops),
      attention_ns_per_byte_(
          1e-3 / (hw.prefill_attention_tbps > 0 ? hw.prefill_attention_tbps : hw.stream_read_tbps)),
      fit_max_rows_(hw.kernel_fit_max_rows),
      sm_count_(hw.sm_count),
      floor_ns_(hw.kernel_floor_ns),
      d2h_latency_ns_(hw.d2h_latency_ns),
      d2h_ns_per_byte_(1e9 / (hw.d2h_gbps * 1e9)),
      link_ns_per_byte_(hw.interconnect_gbps > 0 ? 1.0 / hw.interconnect_gbps : 0),
      allreduce_alpha_ns_(hw.allreduce_alpha_ns),
      alltoall_alpha_ns_(hw.alltoall_alpha_ns),
      p2p_alpha_ns_(hw.p2p_alpha_ns) {
  static_assert(size_t(KernelClass::kCount) <= kKernelFitSlots);
  auto linear = [](const KernelFit& f) {
    return LinearFit{true,
                     f.base_ns,
                     f.ns_per_byte,
                     f.ns_per_flop,
                     f.ns_per_request,
                     f.split_intensity,
                     f.split_bytes,
                     f.wide_base_ns,
                     f.wide_ns_per_byte,
                     f.wide_ns_per_flop,
                     f.wide_ns_per_request,
                     f.ns_per_split_row};
  };
  for (size_t c = 0; c < fits_.size(); ++c) {
    const KernelFit& f = hw.kernel_fits[c];
    if (f.fitted && KernelClass(c) != KernelClass::kCollective) fits_[c] = linear(f);
  }
  for (const auto& [name, f] : hw.kernel_name_fits) {
    if (f.fitted) name_fits_.emplace_back(name, linear(f));
  }
  // The model's own fits replace the pooled ones name by name (or add names the pooled fits
  // lack), so that kernel_ns still scans one table per call.
  auto set_name_fit = [&](const std::string& name, const KernelFit& f) {
    auto it = std::find_if(name_fits_.begin(), name_fits_.end(),
                           [&](const auto& e) { return e.first == name; });
    if (it != name_fits_.end()) {
      it->second = linear(f);
    } else {
      name_fits_.emplace_back(name, linear(f));
    }
  };
  const HardwareSpec::ModelKernelFits* own =
      model.empty() ? nullptr : kernel_model_fits_for(hw, model);
  bool own_attention = false;
  if (own != nullptr) {
    for (const auto& [name, f] : own->names) {
      if (!f.fitted) continue;
      set_name_fit(name, f);
      own_attention = own_attention || name == "attention";
    }
  }
  // A model never calibrated borrows the attention line of a measured model whose attention
  // kernel launches alike (attention_fit_model), in place of the pooled one.
  const HardwareSpec::ModelKernelFits* donor =
      attention_model.empty() ? nullptr : kernel_model_fits_for(hw, attention_model);
  if (donor != nullptr && !own_attention) {
    for (const auto& [name, f] : donor->names) {
      if (name == "attention" && f.fitted) set_name_fit(name, f);
    }
  }
  static_assert(size_t(CollectiveKind::kSendRecv) < std::tuple_size_v<decltype(curves_)>);
  for (const HardwareSpec::CollectiveTable& t : hw.collective_tables) {
    if (t.ranks <= 0 || t.points.empty()) continue;
    for (const CollectiveKind kind : {CollectiveKind::kAllReduce, CollectiveKind::kAllGather,
                                      CollectiveKind::kAllToAll, CollectiveKind::kSendRecv}) {
      if (t.collective != std::string_view(collective_kind_name(kind))) continue;
      std::vector<RankedCurve>& curves = curves_[size_t(kind)][t.graph ? 1 : 0];
      auto at = std::find_if(curves.begin(), curves.end(),
                             [&](const RankedCurve& rc) { return rc.ranks >= t.ranks; });
      if (at == curves.end() || at->ranks != t.ranks) at = curves.insert(at, {t.ranks, {}});
      CollectiveCurve& c = at->curve;
      c = {};
      for (const HardwareSpec::CollectivePoint& p : t.points) {
        assert(p.bytes > 0 && p.median_ns > 0);
        assert(c.bytes.empty() || double(p.bytes) > c.bytes.back());
        c.bytes.push_back(double(p.bytes));
        c.ns.push_back(p.median_ns);
        c.log_bytes.push_back(std::log(double(p.bytes)));
      }
      const size_t n = c.bytes.size();
      for (size_t i = 0; i + 1 < n; ++i) {
        c.slope.push_back(std::log(c.ns[i + 1] / c.ns[i]) / (c.log_bytes[i + 1] - c.log_bytes[i]));
      }
      // Above the table: the last segment's marginal cost per byte (NCCL's bandwidth-bound
      // protocol); where it does not rise (noise), the last point's time per byte.
      c.tail_ns_per_byte = n >= 2 && c.ns[n - 1] > c.ns[n - 2]
                               ? (c.ns[n - 1] - c.ns[n - 2]) / (c.bytes[n - 1] - c.bytes[n - 2])
                               : c.ns[n - 1] / c.bytes[n - 1];
    }
  }
  // Collective arrival skew (issue #11): send/recv never gets a curve (collective_skew_extra_ns).
  skew_ranks_ = hw.collective_skew_ranks;
  for (const HardwareSpec::CollectiveSkewTable& t : hw.collective_skew) {
    if (skew_ranks_ <= 0 || t.points.empty()) continue;
    for (const CollectiveKind kind :
         {CollectiveKind::kAllReduce, CollectiveKind::kAllGather, CollectiveKind::kAllToAll}) {
      if (t.collective != std::string_view(collective_kind_name(kind))) continue;
      for (size_t i = 1; i < t.points.size(); ++i) {
        assert(t.points[i].skew_ns > t.points[i - 1].skew_ns);
      }
      skew_curves_[size_t(kind)][t.graph ? 1 : 0] = t.points;
    }
  }
}

int64_t CostModel::collective_skew_extra_ns(const KernelDesc& k, bool in_graph,
                                            int64_t skew_ns) const {
  if (k.coll == CollectiveKind::kNone || k.coll == CollectiveKind::kSendRecv ||
      std::max(1, k.group) != skew_ranks_) {
    return 0;
  }
  const std::vector<HardwareSpec::SkewPoint>& c = skew_curves_[size_t(k.coll)][in_graph ? 1 : 0];
  if (c.empty()) return 0;
  const double s = double(skew_ns);
  double extra = 0;
  if (s <= c.front().skew_ns) {
    extra = c.front().extra_ns;
  } else if (s >= c.back().skew_ns) {
    extra = c.back().extra_ns;
  } else {
    // c[i].skew_ns <= s < c[i + 1].skew_ns.
    const auto hi = std::upper_bound(c.begin(), c.end(), s,
                                     [](double v, const auto& p) { return v < p.skew_ns; });
    const HardwareSpec::SkewPoint& a = *(hi - 1);
    const HardwareSpec::SkewPoint& b = *hi;
    extra = a.extra_ns + (b.extra_ns - a.extra_ns) * (s - a.skew_ns) / (b.skew_ns - a.skew_ns);
  }
  return static_cast<int64_t>(extra + 0.5);
}

double CostModel::interpolate(const CollectiveCurve& c, double bytes) {
  if (bytes <= c.bytes.front()) return c.ns.front();
  if (bytes >= c.bytes.back()) return c.ns.back() + (bytes - c.bytes.back()) * c.tail_ns_per_byte;
  // bytes[i] <= bytes < bytes[i + 1]; exactly ns[i] on a measured size (exp(0) == 1).
  const size_t i =
      size_t(std::upper_bound(c.bytes.begin(), c.bytes.end(), bytes) - c.bytes.begin()) - 1;
  return c.ns[i] * std::exp(c.slope[i] * (std::log(bytes) - c.log_bytes[i]));
}

bool CostModel::wide(const LinearFit& f, const KernelDesc& k) {
  const double bytes = double(k.bytes_read + k.bytes_written);
  return (f.split_intensity > 0 && double(k.flops) > f.split_intensity * bytes) ||
         (f.split_bytes > 0 && bytes > f.split_bytes);
}

double CostModel::price(const LinearFit& f, const KernelDesc& k) const {
  const double bytes = double(k.bytes_read + k.bytes_written);
  const double flops = double(k.flops);
  const double requests = double(k.requests);
  return wide(f, k)
             ? f.wide_base_ns + bytes * f.wide_ns_per_byte + flops * f.wide_ns_per_flop +
                   requests * f.wide_ns_per_request
             : f.base_ns + bytes * f.ns_per_byte + flops * f.ns_per_flop +
                   requests * f.ns_per_request +
                   (f.ns_per_split_row > 0 ? f.ns_per_split_row * gemv_split_rows(k, sm_count_)
                                           : 0.0);
}

double CostModel::roofline_ns(const KernelDesc& k) const {
  const double bytes = double(k.bytes_read + k.bytes_written);
  const double mem_ns =
      bytes * (k.cls == KernelClass::kAttention ? attention_ns_per_byte_ : stream_ns_per_byte_);
  const double flop_ns =
      double(k.flops) * (k.cls == KernelClass::kMoeExperts ? moe_ns_per_flop_ : gemm_ns_per_flop_);
  return std::max(mem_ns, flop_ns);
}

double CostModel::physical_floor_ns(const KernelDesc& k) const {
  return std::max(double(k.bytes_read + k.bytes_written) * stream_ns_per_byte_,
                  double(k.flops) * peak_ns_per_flop_);
}

double CostModel::fitted_ns(const LinearFit& f, const KernelDesc& k) const {
  // Beyond the measured rows a fit's per-FLOP term extrapolates to rates no GPU reaches (a
  // projection's wide FLOP term, fitted at <= 64 rows, priced 8192 rows at ~2 PFLOP/s): the
  // roofline instead, with the fit's latency floor.
  if (k.rows > fit_max_rows_) return (wide(f, k) ? f.wide_base_ns : f.base_ns) + roofline_ns(k);
  return std::max(price(f, k), physical_floor_ns(k));
}

const CostModel::LinearFit* CostModel::fit_for(const KernelDesc& k) const {
  if (k.cls != KernelClass::kCollective && k.name != nullptr) {
    const std::string_view kn(k.name);  // one strlen; each entry then compares lengths first
    for (const auto& [name, f] : name_fits_) {
      if (name == kn) return &f;
    }
  }
  const LinearFit& f = fits_[size_t(k.cls)];
  return f.on ? &f : nullptr;
}

std::optional<double> CostModel::beyond_fit_base_ns(const KernelDesc& k) const {
  const LinearFit* f = fit_for(k);
  if (f == nullptr || k.rows <= fit_max_rows_) return std::nullopt;
  return wide(*f, k) ? f->wide_base_ns : f->base_ns;
}

int64_t CostModel::kernel_ns(const KernelDesc& k) const {
  if (const LinearFit* f = fit_for(k)) {
    return static_cast<int64_t>(fitted_ns(*f, k) + 0.5);  // base_ns: the fit's measured floor
  }
  const double mem_ns = double(k.bytes_read + k.bytes_written) * ns_per_byte_;
  const double flop_ns = double(k.flops) * ns_per_flop_;
  // Round half up; durations are non-negative, so this equals llround without the libm call.
  return std::max<int64_t>(floor_ns_, static_cast<int64_t>(std::max(mem_ns, flop_ns) + 0.5));
}

GraphCost CostModel::graph_cost(const StepKernels& step) const {
  GraphCost c;
  for (const LayerRun& run : step.runs) {
    int64_t busy = 0;
    int64_t bytes = 0;
    for (int32_t i = run.first; i < run.first + run.count; ++i) {
      const KernelDesc& k = step.kernels[static_cast<size_t>(i)];
      busy += kernel_ns(k);
      bytes += k.bytes_read;
    }
    c.busy_ns += busy * run.repeat;
    c.bytes_read += bytes * run.repeat;
    c.nodes += int64_t{run.count} * run.repeat;
  }
  return c;
}

int64_t CostModel::collective_ns(const KernelDesc& k, bool in_graph) const {
  const double g = std::max(1, k.group);
  // The message as nccl-tests (and the measured tables) count it.
  double bytes = 0;
  double bus_factor = 1;  // algorithm bytes per message byte
  int64_t alpha = 0;
  switch (k.coll) {
    case CollectiveKind::kNone:
      return 0;
    case CollectiveKind::kAllReduce:
      alpha = allreduce_alpha_ns_;
      bytes = double(k.bytes_read);
      bus_factor = 2.0 * (g - 1) / g;
      break;
    case CollectiveKind::kAllGather:
      alpha = allreduce_alpha_ns_;
      bytes = double(k.bytes_written);
      bus_factor = (g - 1) / g;
      break;
    case CollectiveKind::kAllToAll:
      alpha = alltoall_alpha_ns_;
      bytes = double(std::max(k.bytes_read, k.bytes_written));
      bus_factor = (g - 1) / g;
      break;
    case CollectiveKind::kSendRecv:
      alpha = p2p_alpha_ns_;
      bytes = double(std::max(k.bytes_read, k.bytes_written));
      break;
  }
  // The curve of the group's size. A send/recv's group field names the peer: it is a pair,
  // measured as one (each rank sends to one and receives from one) whatever the communicator's
  // size, so the curve of the fewest ranks >= 2 (two where measured) prices it.
  for (const RankedCurve& rc : curves_[size_t(k.coll)][in_graph ? 1 : 0]) {
    if (k.coll == CollectiveKind::kSendRecv ? rc.ranks >= 2 : rc.ranks == int32_t(g)) {
      return static_cast<int64_t>(interpolate(rc.curve, bytes) + 0.5);
    }
  }
  return alpha + static_cast<int64_t>(bus_factor * bytes * link_ns_per_byte_ + 0.5);
}

int64_t CostModel::copy_d2h_ns(int64_t bytes) const {
  return d2h_latency_ns_ + std::llround(double(bytes) * d2h_ns_per_byte_);
}

std::unique_ptr<CostModel> calibration_cost_model(const HardwareSpec& hw,
                                                  const std::string& label) {
  const CalibrationModel cm = parse_calibration_model(label);
  const ModelSpec model = calibration_model_spec(cm);
  return std::make_unique<CostModel>(
      hw, kernel_fit_model(hw, cm.preset, cm.tp, cm.fusion),
      attention_fit_model(hw, model, calibration_layout(model, cm.tp)));
}

}  // namespace twinstep
