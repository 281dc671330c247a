// Speculative graphs, priced and calibrated (docs/calibration.md, "Speculative graphs"): what the
// simulator charges for one draft, verify or extend launch on one GPU, and the residual model
// `twinstep calibrate` fits per graph kind from the runtime's own graphs measured in situ
// (HardwareSpec::spec_graph_residuals: measured GPU time of the launch less that price). CPU only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "policies/calibration_profile.h"
#include "policies/hardware_spec.h"
#include "policies/model_spec.h"
#include "simulator/cost_model.h"

namespace twinstep {

// The runtime's speculative graphs (runtime/engine_spec.cc). kDraftEarlyExit: a draft whose
// lengths the device decides (confidence device, host_blocking) with early exit, each step past
// the first behind a conditional IF node; kDraft every other draft.
enum class SpecGraph : uint8_t { kDraft, kDraftEarlyExit, kVerify, kExtend, kCount };
// "draft", "draft_early_exit", "verify", "extend" (sample names and profile `graph` values).
const char* spec_graph_name(SpecGraph g);
// kCount for a name that is none of them.
SpecGraph spec_graph_by_name(std::string_view name);

// The step shape of a verify or extend launch of `requests` requests, `positions` rows each, over
// `ctx_sum` cached tokens: decode_shape with StepShape::row_exact (both) and kv_pass (extend), as
// the runtime runs them. Drafts: plain decode_shape(requests, 1, ctx_sum) per forward.
StepShape spec_launch_shape(SpecGraph graph, int32_t requests, int32_t positions, int64_t ctx_sum);

// The simulator's price of one launch of `graph` on one GPU without a residual, exactly what
// sim_backend.cc's launch_single charges for its span: the kernels of `requests` requests with
// `ctx_sum` cached tokens in all, priced by `cost`, plus nodes × gap_ns, at least 0.
//   draft (both kinds): P = `positions` draft tokens per request take max(P − 1, 0) forwards of
//     `draft` (nextn_draft(model)) over decode_shape(requests, 1, ctx_sum): NEXTN, the first
//     draft token comes from the previous round's extend (the runtime runs P forwards);
//   verify: `model` over spec_launch_shape(kVerify, requests, positions, ctx_sum), positions =
//     the width W (row-exact projections and LM head);
//   extend: `draft` over spec_launch_shape(kExtend, ...): its KV pass, row-exact.
// tp > 1: rank 0's shard of both, measured alone (shard_step_kernels: no collectives), as
// calibrate --tp times it.
int64_t spec_graph_price_ns(const CostModel& cost, int64_t gap_ns, const ModelSpec& model,
                            const ModelSpec& draft, SpecGraph graph, int32_t requests,
                            int32_t positions, int64_t ctx_sum, int32_t tp = 1);

// The residual of a `graph` launch of `model` (a calibration model label) in `mode` (graph |
// pdl | eager) with `requests` requests: the entry of the smallest measured batch >= requests,
// else the largest; nullptr when the profile has none for (model, graph, mode). Points into hw.
const HardwareSpec::SpecGraphResidual* spec_graph_residual_for(const HardwareSpec& hw,
                                                               const std::string& model,
                                                               SpecGraph graph,
                                                               std::string_view mode,
                                                               int64_t requests);
// The 16-row GEMV chunks past the first of a `graph` launch (HardwareSpec::SpecGraphResidual):
// verify and extend run bucket(requests) × positions rows in row-exact chunks of 16
// (kGemvMaxRows, kernels/gemv.h; the bucket is the next power of two, Engine::bucket_for), so
// ceil(rows / 16) − 1; 0 for drafts (their rows are the batch, fixed per fit).
int64_t spec_graph_extra_chunks(SpecGraph graph, int64_t requests, int64_t positions);
// The residual of a `graph` launch (r's graph kind) of `requests` requests: base +
// per_position · positions + per_position_ctx · positions · ctx_per_request + per_extra_chunk ·
// spec_graph_extra_chunks + spec_graph_correction_ns (at the launch's attention split size
// split_tokens; 0: not known) + ns_per_skipped_step · skipped_steps (an early-exit draft graph's
// conditional steps past its length), rounded half away from zero; signed.
int64_t spec_graph_residual_ns(const HardwareSpec::SpecGraphResidual& r, SpecGraph graph,
                               int64_t requests, int32_t positions, double ctx_per_request,
                               int32_t skipped_steps = 0, int64_t split_tokens = 0);
// r.corrections at (positions, ctx_per_request, split_tokens): among the points of each of the
// two measured widths nearest `positions` (below and above; one where it is measured or outside
// them), per measured context the point whose split size is nearest split_tokens (ties, and
// split_tokens <= 0: the smaller; a point without one counts as 0), then linear in ctx between
// the two contexts around it and the nearest context's value outside them; then linear in
// positions between the two widths. 0 without corrections.
double spec_graph_correction_ns(const std::vector<HardwareSpec::SpecGraphResidual::Correction>& c,
                                double positions, double ctx_per_request, int64_t split_tokens = 0);
// The attention split size (kernels/attention_split.h) of `model`'s launches of `requests`
// requests (the bucket the runtime launches) in an engine of KV capacity `capacity` on `sms` SMs:
// the first GQA layer's KV heads, of its TP shard for tp > 1 (num_kv_heads / tp). 0 for a model
// without GQA layers, capacity <= 0 or sms <= 0.
int64_t spec_graph_split_tokens(const ModelSpec& model, int32_t tp, int32_t requests,
                                int32_t capacity, int32_t sms);

// One measured point of a speculative graph (the median of its spec_graph samples) against the
// price, for the fit and the held-out evaluation.
struct SpecGraphPoint {
  std::string model;
  std::string graph;
  std::string mode;
  int64_t batch = 0;
  int64_t positions = 0;
  int64_t ctx_tokens = 0;  // per request
  // The engine's KV capacity (the samples' `bytes`; 0: not recorded, sessions before
  // 2026-12-02, taken as spec_calibration_capacity_tokens of the context) and the attention split
  // size it gives the launch (spec_graph_split_tokens).
  int64_t capacity_tokens = 0;
  int64_t split_tokens = 0;
  int64_t samples = 0;
  double measured_ns = 0;  // median
  double priced_ns = 0;    // spec_graph_price_ns with hw's fits and node gap
};
// The points of every spec_graph sample of a model label the simulator can price (a preset, or
// a TP shard "<preset>@tp<N>"; an unknown label's samples are skipped) in mode graph (the only
// one priced with graph_node_gap_ns; others skipped), priced with `hw` as the label's one-GPU run
// (calibration_cost_model; a shard's kernels without collectives). One point per (model, graph,
// mode, batch, positions, ctx, capacity), in that order.
std::vector<SpecGraphPoint> spec_graph_points(const std::vector<CalibrationSample>& samples,
                                              const HardwareSpec& hw);

// Per (model, graph, mode, batch) of spec_graph_points(samples, hw): the residual measured −
// priced fitted by least squares weighted by 1 / measured (the price's relative error), columns
// scaled to unit maximum: base, + per position where >= 2 distinct positions were measured, +
// per position and context token where >= 2 distinct contexts were, + per extra chunk where >= 2
// distinct chunk counts were (a column is dropped, ctx first, then chunks, while the points are
// fewer than the columns). Coefficients signed. Then the corrections: what the form leaves at
// each point (priced between points by spec_graph_correction_ns), with max_rel_err_loo; and for
// draft_early_exit, ns_per_skipped_step from the label's draft_early_exit_skip samples of that
// mode and batch: per context the least-squares slope of the median launch over the steps
// skipped (steps − 1), the median of those slopes (contexts with >= 2 step counts). `hw` must
// carry the kernel fits the residual is to correct (fit_calibration passes the profile being
// fitted).
std::vector<HardwareSpec::SpecGraphResidual> fit_spec_graph_residuals(
    const std::vector<CalibrationSample>& samples, const HardwareSpec& hw);

}  // namespace twinstep
