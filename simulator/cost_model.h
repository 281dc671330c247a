// CostModel: kernel durations from a HardwareSpec. A kernel with a calibrated fit (from
// `twinstep calibrate`) for the priced model and its name (HardwareSpec::kernel_model_fits),
// else for its name pooled over the models measured (kernel_name_fits), else for its class
// (kernel_fits) costs base + per-byte + per-flop (+ per-request) terms, never less than the
// hardware allows: max(bytes / stream_read_tbps, flops / bf16_tflops). Beyond the rows the fits
// were measured at (KernelDesc::rows > HardwareSpec::kernel_fit_max_rows) it costs the fit's base
// (of the regime the fit would use) + the roofline R = max(bytes / stream_read_tbps, flops / C)
// instead, C the compute rate: prefill_gemm_tflops (prefill_moe_tflops for kMoeExperts) where
// measured, else bf16_tflops · flop_efficiency; kAttention's bytes at prefill_attention_tbps
// where measured. Any other class the datasheet roofline: the larger of bytes /
// (stream_read_tbps · mem_efficiency) and flops / (bf16_tflops · flop_efficiency), at least
// kernel_floor_ns (a fit's base_ns is its own measured floor). Rounded half up.
// kernel_ns depends on the KernelDesc alone, so callers may cache sums of it (sim_backend.cc).
// Collectives: from the measured tables (HardwareSpec::collective_tables) where the profile has
// one for the collective, the mode and the group size (a table per group size measured), else
// alpha + algorithm bytes / link bandwidth.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "policies/hardware_spec.h"
#include "policies/step_kernels.h"

namespace twinstep {

struct GraphCost {
  int64_t busy_ns = 0;     // Σ kernel durations
  int64_t nodes = 0;       // kernel count
  int64_t bytes_read = 0;  // Σ bytes read
};

class CostModel {
 public:
  // `model`: the calibration model label whose own kernel fits apply (kernel_fit_model() in
  // policies/calibration_model.h picks it for a run's layout); empty or without an entry in
  // hw.kernel_model_fits: the pooled name fits. Resolved here, once, into one fit per name.
  // `attention_model`: a kernel_model_fits key whose "attention" fit prices the attention
  // kernel where `model`'s own fits have none (attention_fit_model() picks it); empty: none.
  explicit CostModel(const HardwareSpec& hw, const std::string& model = {},
                     const std::string& attention_model = {});
  int64_t kernel_ns(const KernelDesc& k) const;
  GraphCost graph_cost(const StepKernels& step) const;
  // For a fitted kernel beyond the fits' rows (priced base + roofline): its fit's base, of the
  // regime the fit would use; nullopt for any other kernel. The prefill fit separates the
  // roofline's rates from the rest with it (simulator/prefill_fit.h).
  std::optional<double> beyond_fit_base_ns(const KernelDesc& k) const;
  // Device-to-host copy of `bytes`, issue to completion.
  int64_t copy_d2h_ns(int64_t bytes) const;
  // A collective kernel (KernelClass::kCollective) once every rank has arrived; `in_graph`:
  // issued inside a captured graph (decode), else eagerly (prefill, eager mode). With a
  // measured table for its kind, its mode and its group size (send/recv: a pair, the table of
  // the fewest ranks >= 2): piecewise linear in log bytes - log time between measured
  // sizes, the smallest size's time below them, the last segment's marginal bandwidth above
  // (the last point's bandwidth where that segment does not rise). Bytes as nccl-tests counts
  // them: the all-reduce buffer (bytes_read), the all-gather output (bytes_written), the larger
  // side of an all-to-all or send/recv. Otherwise alpha + algorithm bytes / interconnect_gbps.
  // Allocates nothing.
  int64_t collective_ns(const KernelDesc& k, bool in_graph = true) const;

  // ---- collective arrival skew (issue #11) ----
  // How much later than (latest arrival + collective_ns) a collective ends when its members
  // arrived skew_ns apart (latest minus earliest): HardwareSpec::collective_skew's curve for its
  // kind and mode, linear in skew_ns between points, the first / last point's extra outside
  // them; 0 without a curve, for a group of another size than collective_skew_ranks, and for
  // send/recv (a receive is pre-posted: no rendezvous). Rounded half up; allocates nothing.
  int64_t collective_skew_extra_ns(const KernelDesc& k, bool in_graph, int64_t skew_ns) const;

 private:
  struct LinearFit {
    bool on = false;
    double base_ns = 0;
    double ns_per_byte = 0;
    double ns_per_flop = 0;
    double ns_per_request = 0;
    double split_intensity = 0;  // > 0: flops > split · bytes uses the wide coefficients
    double split_bytes = 0;      // > 0: bytes > split_bytes uses the wide coefficients
    double wide_base_ns = 0;
    double wide_ns_per_byte = 0;
    double wide_ns_per_flop = 0;
    double wide_ns_per_request = 0;
    double ns_per_split_row = 0;  // below the split: per gemv_split_rows()
  };
  // A measured collective table prepared for lookup (built once, by the constructor).
  struct CollectiveCurve {
    std::vector<double> bytes;      // ascending; empty: no table
    std::vector<double> ns;         // median time at bytes[i]
    std::vector<double> log_bytes;  // log(bytes[i])
    std::vector<double> slope;      // segment [i, i + 1]: d log(ns) / d log(bytes)
    double tail_ns_per_byte = 0;    // above bytes.back()
  };
  // Which regime of `f` prices `k`: the wide coefficients (above the split) or the narrow ones.
  static bool wide(const LinearFit& f, const KernelDesc& k);
  double price(const LinearFit& f, const KernelDesc& k) const;
  // The fit that prices `k` (its name's, else its class's), or nullptr.
  const LinearFit* fit_for(const KernelDesc& k) const;
  // A fitted kernel's time: price() held at >= physical_floor_ns(), or beyond the fit's rows its
  // regime's base + roofline_ns().
  double fitted_ns(const LinearFit& f, const KernelDesc& k) const;
  // max(bytes / stream (attention: the measured prefill rate), flops / compute rate C).
  double roofline_ns(const KernelDesc& k) const;
  // max(bytes / stream, flops / datasheet peak).
  double physical_floor_ns(const KernelDesc& k) const;
  static double interpolate(const CollectiveCurve& c, double bytes);
  std::array<LinearFit, size_t(KernelClass::kCount)> fits_{};
  // Per-kernel-name fits, looked up by name (few entries): the model's own fit where
  // hw.kernel_model_fits has one for the name, else the pooled kernel_name_fits entry.
  std::vector<std::pair<std::string, LinearFit>> name_fits_;
  double ns_per_byte_;  // datasheet roofline: stream_read_tbps · mem_efficiency
  double ns_per_flop_;  // datasheet roofline: bf16_tflops · flop_efficiency
  // Beyond the fits' rows: prefill_gemm_tflops / prefill_moe_tflops / prefill_attention_tbps
  // where measured, else ns_per_flop_ / ns_per_flop_ / stream_ns_per_byte_.
  double gemm_ns_per_flop_;
  double moe_ns_per_flop_;
  double stream_ns_per_byte_;  // stream_read_tbps
  double peak_ns_per_flop_;    // bf16_tflops
  double attention_ns_per_byte_;
  int32_t fit_max_rows_ = 0;  // HardwareSpec::kernel_fit_max_rows
  int32_t sm_count_ = 0;      // the GEMV split rule's SMs (gemv_split_rows)
  int64_t floor_ns_;
  int64_t d2h_latency_ns_;
  double d2h_ns_per_byte_;
  double link_ns_per_byte_;
  int64_t allreduce_alpha_ns_;
  int64_t alltoall_alpha_ns_;
  int64_t p2p_alpha_ns_;
  struct RankedCurve {
    int32_t ranks = 0;  // the communicator size it was measured on
    CollectiveCurve curve;
  };
  // Indexed [CollectiveKind][in_graph]: a curve per group size measured (few), ranks ascending.
  std::array<std::array<std::vector<RankedCurve>, 2>, 5> curves_{};

  // Collective arrival skew: indexed [CollectiveKind][in_graph]; empty: no curve.
  std::array<std::array<std::vector<HardwareSpec::SkewPoint>, 2>, 5> skew_curves_{};
  int32_t skew_ranks_ = 0;  // the skew curves' communicator size
};

// The cost model a simulated one-rank run of calibration label `label` (policies/
// calibration_model.h: a preset, or rank 0 of its TP shard) prices it with: the label's kernel
// fits where the profile has them (kernel_fit_model), a donor's attention line where it has none
// (attention_fit_model on calibration_layout). Throws ConfigError for an unknown label.
std::unique_ptr<CostModel> calibration_cost_model(const HardwareSpec& hw, const std::string& label);

}  // namespace twinstep
