// Prefill, priced and calibrated (docs/calibration.md, "Prefill"): the simulator's price of the
// runtime's prefill of one prompt on one GPU, and the fit of the rates a prefill's kernels run at
// beyond the decode rows the kernel fits were measured on (HardwareSpec::prefill_gemm_tflops,
// prefill_moe_tflops, prefill_attention_tbps) from `twinstep calibrate`'s prefill samples.
// CPU only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policies/calibration_profile.h"
#include "policies/hardware_spec.h"

namespace twinstep {

// One prefill priced and split for the fit. A fitted kernel beyond the fits' rows costs its base
// + max(bytes / memory rate, flops / compute rate) (CostModel); the fit takes projections, the LM
// head and the experts as compute-bound and attention as bound by its reads (at >= 1024 rows of
// Llama-3-8B a projection needs ~10x longer for its FLOPs than for its bytes), so that
//   priced_ns = fixed_ns + gemm_flops / gemm rate + moe_flops / MoE rate
//               + attention_bytes / attention rate
// wherever those sides hold; fixed_ns is every other kernel's price, the bases, and the gaps.
struct PrefillParts {
  double priced_ns = 0;        // Σ kernel_ns + (nodes − 1) · eager_node_gap_ns
  double fixed_ns = 0;         // the part none of the three rates changes
  double gemm_flops = 0;       // kGemm and kLmHead kernels beyond the fits' rows
  double moe_flops = 0;        // kMoeExperts kernels beyond them
  double attention_bytes = 0;  // kAttention kernels beyond them (read + written)
};

// The prefill of one prompt of `tokens` tokens of calibration model `label` (a preset, or
// "<preset>@tp<N>": rank 0's shard without collectives, policies/calibration_model.h) alone on one
// GPU: calibration_step_kernels(label, prefill_shape(1, tokens, tokens²)) priced by the cost model
// a one-GPU run of the label uses (kernel_fit_model), launched eagerly with the GPU the bottleneck:
// Σ kernel_ns + (nodes − 1) · eager_node_gap_ns, what sim_backend.cc charges for the launch's
// span then. Throws ConfigError for an unknown label.
PrefillParts prefill_parts(const HardwareSpec& hw, const std::string& label, int64_t tokens);

// A measured prompt length of a model: the median of its prefill samples.
struct PrefillPoint {
  std::string model;   // calibration label
  int64_t tokens = 0;  // prompt length (one prompt)
  int64_t samples = 0;
  double measured_ns = 0;  // median
  PrefillParts parts;      // priced with the hw given to prefill_points
};
// The points of every prefill sample (batch 1) of a label the simulator can price, ordered by
// (model, tokens); other labels are skipped.
std::vector<PrefillPoint> prefill_points(const std::vector<CalibrationSample>& samples,
                                         const HardwareSpec& hw);

struct PrefillFit {
  // The fitted rates; 0 where not determined (no kernel of the kind beyond the fits' rows in any
  // point, or a coefficient of 0: the rate is unbounded by these samples).
  double gemm_tflops = 0;
  double moe_tflops = 0;
  double attention_tbps = 0;
  int64_t points = 0;
  double max_rel_err = 0;        // max |price with the fitted rates − measured| / measured
  double mean_err_unfitted = 0;  // mean (price − measured) / measured with hw's rates, signed
  double max_rel_err_unfitted = 0;
};
// Least squares with non-negative coefficients (nnls) over the points of prefill_points(samples,
// hw), rows weighted by 1 / measured (relative error), columns scaled to unit maximum:
//   measured − fixed_ns = gemm_flops · a + moe_flops · b + attention_bytes · c,
// a rate = 1e-3 / its coefficient (TFLOP/s, TB/s). Columns that are zero in every point are left
// out. points == 0 when there are no prefill samples. The error figures re-price every point.
PrefillFit fit_prefill_rates(const std::vector<CalibrationSample>& samples, const HardwareSpec& hw);

}  // namespace twinstep
