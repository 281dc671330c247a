#include "policies/host_costs.h"

#include <algorithm>
#include <cmath>

#include "policies/rng.h"

namespace twinstep {
namespace {

constexpr uint64_t kStreamSpike = 0x5350494bULL;  // separates spike draws from op draws

int64_t draw(const DurationDist& d, uint64_t seed, uint64_t stream, uint64_t step) {
  switch (d.kind) {
    case DistKind::kFixed:
      return d.mean_ns;
    case DistKind::kNormal: {
      const double x = double(d.mean_ns) + double(d.std_ns) * rng_normal(seed, stream, step);
      return std::max<int64_t>(0, std::llround(x));
    }
    case DistKind::kLognormal: {
      if (d.mean_ns <= 0) return 0;
      // Parameters of the underlying normal from the requested mean m and std s:
      // sigma² = ln(1 + s²/m²), mu = ln m − sigma²/2.
      const double m = double(d.mean_ns);
      const double s = double(d.std_ns);
      const double sigma2 = std::log1p((s * s) / (m * m));
      const double mu = std::log(m) - 0.5 * sigma2;
      return std::llround(std::exp(mu + std::sqrt(sigma2) * rng_normal(seed, stream, step)));
    }
    case DistKind::kUniform: {
      const double u = rng_uniform(seed, stream, step);
      return d.lo_ns + std::llround(u * double(d.hi_ns - d.lo_ns));
    }
  }
  return 0;
}

}  // namespace

const char* host_op_name(HostOp op) {
  switch (op) {
    case HostOp::kSchedule:
      return "schedule";
    case HostOp::kPreparePrefill:
      return "prepare_prefill";
    case HostOp::kPrepareDecode:
      return "prepare_decode";
    case HostOp::kProcessOutputs:
      return "process_outputs";
    case HostOp::kCount:
      break;
  }
  return "?";
}

HostCostModel HostCostModel::for_rank(int32_t rank) const {
  HostCostModel m(spec_, rank == 0 ? seed_ : splitmix64(seed_ + uint64_t(rank)));
  m.rank_ = rank;
  return m;
}

int64_t HostCostModel::sample_ns(HostOp op, int64_t step) const {
  const auto i = static_cast<size_t>(op);
  int64_t ns = draw(spec_.ops[i], seed_, i, static_cast<uint64_t>(step));
  for (size_t k = 0; k < spec_.spikes.size(); ++k) {
    const HostSpike& s = spec_.spikes[k];
    if (s.op != op || (s.rank >= 0 && s.rank != rank_)) continue;
    const bool hit =
        s.every_steps > 0
            ? (step - s.phase_step) >= 0 && (step - s.phase_step) % s.every_steps == 0
            : rng_uniform(seed_, kStreamSpike + k, static_cast<uint64_t>(step)) < s.probability;
    if (hit) ns += s.extra_ns;
  }
  return ns;
}

}  // namespace twinstep
