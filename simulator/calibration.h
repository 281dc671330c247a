// Fitting calibration samples (policies/calibration_profile.h) into a calibrated profile:
// per kernel class t_ns = base_ns + ns_per_byte · bytes + ns_per_flop · flops (+ ns_per_request
// · requests where samples carry requests) by non-negative least squares, and the launch, gap, copy
// and wake figures from their samples (docs/calibration.md). CPU only.
#pragma once

#include <Eigen/Dense>
#include <span>
#include <string>
#include <string_view>
#include <utility>
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
  double ns;              // measured, > 0
  double requests = 0;    // requests served (attention; 0 elsewhere: no per-request term)
  double split_rows = 0;  // gemv_split_rows() (GEMV (rows − 1) · (split − 1); 0 elsewhere)
};

// The fit of one class's samples (those of other classes are ignored). Rows are weighted by
// 1 / measured time, so the fit minimises relative error (kernels of one class span 1 µs to
// 1 ms); columns are scaled to unit maximum before solving. Needs >= 3 samples, else the result
// is not `fitted`. With split_intensity > 0 and >= 3 samples on each side of flops / bytes =
// split_intensity, each side gets its own coefficients (KernelFit::wide_*). Samples with
// requests > 0 (attention) get a per-request term below the split only. r2 is computed on
// unweighted times.
KernelFit fit_kernel_class(std::span<const KernelSample> samples, KernelClass cls,
                           double split_intensity = 0);

// The same with the base held: base_ns for the narrow regime (or the only one), wide_base_ns for
// the wide one; only ns_per_byte and ns_per_flop are fitted (to t − base, weighted by 1 / t). A
// negative base means "fit it" (fit_kernel_class).
// split_row_ns >= 0 likewise holds the per-split-row term (KernelFit::ns_per_split_row; < 0:
// fitted with the others).
KernelFit fit_kernel_class_with_base(std::span<const KernelSample> samples, KernelClass cls,
                                     double split_intensity, double base_ns, double wide_base_ns,
                                     double split_row_ns = -1);

// Two regimes split by bytes (KernelFit::split_bytes): every geometric midpoint between
// consecutive distinct byte counts that leaves >= min_distinct distinct counts on each side is
// tried, and the fit with the least mean squared relative error over the samples wins; a split
// only where it has at least 10% less error than one line.
KernelFit fit_kernel_class_split_bytes(std::span<const KernelSample> samples, KernelClass cls,
                                       int min_distinct);

// Percentiles with linear interpolation (numpy's default) of `values` (any order).
Distribution distribution(std::vector<double> values);

// The profile from raw samples: `base` preset figures, replaced where samples of that kind
// exist; kernel classes fitted where >= 3 kernel samples exist, kernel names (every model's
// samples pooled) likewise, and each (model label, kernel name) with at least
// kModelFitMinSamples samples over kModelFitMinBytes distinct byte counts on its samples alone
// (HardwareSpec::kernel_model_fits), and the speculative graphs' residuals against those fits
// (fit_spec_graph_residuals, simulator/spec_graphs.h). Samples of unknown kinds, kernel classes
// or speculative graphs throw Error.
inline constexpr size_t kModelFitMinSamples = 8;
inline constexpr size_t kModelFitMinBytes = 2;
CalibrationProfile fit_calibration(const std::vector<CalibrationSample>& samples,
                                   const std::string& name, const std::string& base,
                                   const ProfileHeader& header);

// Kernel samples of step kernels the in-situ measurement lost (a kernel whose every sample was
// dropped, e.g. the last node of a step), recovered per grid point where exactly one
// single-instance kernel (prologue or epilogue) has no sample: its time is the unprofiled
// graph-mode step median less the point's kernel samples (a sample of one of N launches,
// CalibrationSample::nodes = N, counted 1/N) and one node gap per step kernel
// (Σ kernels + nodes · gap = step, docs/calibration.md). Bytes and FLOPs from step_kernels() of
// the model preset. Points of unknown models are skipped.
struct ResidualSample {
  std::string name;
  std::string model;  // the grid point's calibration model label
  int64_t batch = 0;  // the grid point's decode batch
  KernelSample sample;
};
std::vector<ResidualSample> residual_kernel_samples(const std::vector<CalibrationSample>& samples,
                                                    double graph_gap_ns);

// The node gap of graph mode `mode` ("pdl", "graph" or "eager") per model and decode batch (rows),
// signed: per grid point's unprofiled step median T of that mode, (T − busy) / nodes, where busy
// and nodes are `hw`'s price of the point's step kernels (CostModel::graph_cost, as a simulated
// one-rank run of the label prices them), the median over the contexts of a batch: the gap with
// which the simulator reproduces the measured steps. Eager: only a (model, batch) none of whose
// grid points was host-bound (each has calibrate's eager node_gap sample). By model, rows ascending
// (HardwareSpec::pdl_node_gap_by_rows, graph_node_gap_by_rows, eager_node_gap_by_rows).
std::vector<HardwareSpec::NodeGap> node_gap_by_rows(const std::vector<CalibrationSample>& samples,
                                                    const HardwareSpec& hw, std::string_view mode);

// The break gap of graph mode `mode` per shard and decode batch (HardwareSpec::
// pdl_break_gap_by_rows, graph_break_gap_by_rows), from collective_break samples: per context of
// a (model, batch), (median "stubbed" step − median "plain" step of the same context) / stubs −
// empty_node_ns (one empty kernel's node time in a graph, graph_node_gap_ns), the median over
// the contexts measured both ways, rounded. Signed. A (model, batch) without any such context
// gets no entry.
std::vector<HardwareSpec::NodeGap> break_gap_by_rows(const std::vector<CalibrationSample>& samples,
                                                     std::string_view mode, double empty_node_ns);

// The break gaps measured in situ (`calibrate --breaks-only --in-situ --tp N` under mpirun:
// collective_break samples "in_situ", the shard's steps with its real collectives, beside the
// "plain" ones), written into hw's pdl / graph_break_gap_by_rows over the entries of the same
// shard and rows (the stub-measured ones): per context of a (shard, batch), (median "in_situ"
// step − median "plain" step − Σ hw's price of the step's collectives) / collectives, the
// median over the contexts measured both ways, rounded; the collectives are those of rank 0 of
// the shard's calibration layout (step_kernels), priced in a graph by CostModel::collective_ns,
// as the simulator's step prices them. A context whose sample counts another number of
// collectives than that step is skipped. Call it with hw's collective tables in place (after
// merge_collectives). Returns the number of entries written.
int fit_in_situ_break_gaps(HardwareSpec& hw, const std::vector<CalibrationSample>& samples);

// Human-readable fit summary: per class R², max relative error and sample count; the figures.
std::string calibration_report(const CalibrationProfile& profile);

}  // namespace twinstep
