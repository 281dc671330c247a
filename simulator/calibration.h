// Fitting calibration samples (policies/calibration_profile.h) into a calibrated profile:
// per kernel class t_ns = base_ns + ns_per_byte · bytes + ns_per_flop · flops by non-negative
// least squares, and the launch, gap, copy and wake figures from their samples
// (docs/calibration.md). CPU only.
#pragma once

#include <Eigen/Dense>
#include <span>
#include <string>
#include <vector>

#include "policies/calibration_profile.h"
#include "policies/hardware_spec.h"
#include "policies/step_kernels.h"

namespace twinstep {

// argmin ||a·x − b||₂ subject to x >= 0 (Lawson & Hanson, "Solving Least Squares Problems",
// 1974, ch. 23). Throws Error when the shapes disagree; a is m×n with any m, n >= 1.
Eigen::VectorXd nnls(const Eigen::MatrixXd& a, const Eigen::VectorXd& b);

struct KernelSample {
  KernelClass cls;
  double bytes;  // read + written
  double flops;
  double ns;  // measured, > 0
};

// The fit of one class's samples (those of other classes are ignored). Rows are weighted by
// 1 / measured time, so the fit minimises relative error (kernels of one class span 1 µs to
// 1 ms); columns are scaled to unit maximum before solving. Needs >= 3 samples, else the result
// is not `fitted`. With split_intensity > 0 and >= 3 samples on each side of flops / bytes =
// split_intensity, each side gets its own coefficients (KernelFit::wide_*). r2 is computed on
// unweighted times.
KernelFit fit_kernel_class(std::span<const KernelSample> samples, KernelClass cls,
                           double split_intensity = 0);

// Percentiles with linear interpolation (numpy's default) of `values` (any order).
Distribution distribution(std::vector<double> values);

// The profile from raw samples: `base` preset figures, replaced where samples of that kind
// exist; kernel classes fitted where >= 3 kernel samples exist. Samples of unknown kinds or
// kernel classes throw Error.
CalibrationProfile fit_calibration(const std::vector<CalibrationSample>& samples,
                                   const std::string& name, const std::string& base,
                                   const ProfileHeader& header);

// Human-readable fit summary: per class R², max relative error and sample count; the figures.
std::string calibration_report(const CalibrationProfile& profile);

}  // namespace twinstep
