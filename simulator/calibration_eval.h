// Held-out evaluation of a calibrated profile (docs/calibration.md, "Held-out evaluation"): the
// kernel and step samples of calibration sessions that the profile was not fitted on, priced
// by the simulator's own CostModel, so a model without its own fits exercises the pooled name
// and class fits exactly as a simulated run of it would. CPU only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policies/calibration_profile.h"
#include "policies/hardware_spec.h"

namespace twinstep {

// The errors of one group of kernel samples, (priced − measured) / measured in percent.
struct KernelEvalRow {
  std::string model;  // the samples' calibration model label
  std::string name;   // kernel name
  int64_t batch = 0;  // 0: every batch of the model
  int64_t samples = 0;
  double measured_us = 0;  // mean measured time
  double priced_us = 0;    // mean priced time
  double mean_err_pct = 0;
  double mean_abs_err_pct = 0;
  double max_abs_err_pct = 0;
};

// One grid point's step: the step kernels of calibration_step_kernels() priced by CostModel
// plus one node gap per node (the mode's gap as the simulator takes it: graph_node_gap_for(),
// pdl_node_gap_for(), eager_node_gap_ns), against the median of the measured unprofiled steps.
struct StepEvalRow {
  std::string model;
  std::string mode;  // graph | pdl | eager
  int64_t batch = 0;
  int64_t ctx_tokens = 0;  // per request, as the step samples record it
  int64_t nodes = 0;       // step_kernels' node count
  double measured_us = 0;  // median
  double kernels_us = 0;   // Σ priced kernels
  double gap_ns = 0;       // per node
  double priced_us = 0;    // kernels + nodes · gap (at least 0)
  double err_pct = 0;
};

// One measured point of a speculative graph (simulator/spec_graphs.h spec_graph_points): the
// median launch against the simulator's price without and with the profile's residual.
struct SpecGraphEvalRow {
  std::string model;
  std::string graph;  // draft | draft_early_exit | verify | extend
  std::string mode;
  int64_t batch = 0;
  int64_t positions = 0;        // draft tokens, or verify / extend width
  int64_t ctx_tokens = 0;       // per request
  int64_t capacity_tokens = 0;  // the engine's KV capacity (0: not recorded)
  int64_t split_tokens = 0;     // the attention split size it gave (spec_graph_split_tokens)
  int64_t samples = 0;
  double measured_us = 0;  // median
  double sim_us = 0;       // the price without a residual
  double residual_us = 0;  // the profile's residual (0: none for this graph, mode and model)
  double err_sim_pct = 0;  // (sim − measured) / measured
  double err_pct = 0;      // (max(0, sim + residual) − measured) / measured
};

struct CalibrationEvaluation {
  // Per model, the kernel_model_fits key its kernels were priced with (kernel_fit_model), or
  // "(pooled)" where the profile has no fits of its own for it.
  std::vector<std::pair<std::string, std::string>> priced_as;
  // Per model priced with another model's attention fit (attention_fit_model): that model.
  std::vector<std::pair<std::string, std::string>> attention_from;
  std::vector<KernelEvalRow> kernels;           // per (model, name), ordered
  std::vector<KernelEvalRow> kernels_by_batch;  // per (model, name, batch), ordered
  std::vector<StepEvalRow> steps;               // per (model, mode, batch, ctx), ordered
  std::vector<SpecGraphEvalRow> spec_graphs;    // per (model, graph, mode, batch, positions, ctx)
};

// Prices every `kernel` sample and every grid point with `step` samples of `samples` with
// CostModel(hw, kernel_fit_model(hw, model, tp)), and every point of `spec_graph` samples as
// spec_graph_points does, plus the profile's residual. Other kinds are ignored. Throws ConfigError
// for a model label that is not a preset or a preset's TP shard.
CalibrationEvaluation evaluate_calibration(const HardwareSpec& hw,
                                           const std::vector<CalibrationSample>& samples);

// The tables: per model and kernel name (and per batch with `by_batch`), then the step sums
// and a summary per model and mode (mean and max |error|), then (where there are any) the
// speculative graphs and a summary per model, graph and mode.
std::string evaluation_report(const CalibrationEvaluation& e, bool by_batch = false);

}  // namespace twinstep
