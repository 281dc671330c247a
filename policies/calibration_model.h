// Which model a calibration sample measured: a preset name, or "<preset>@tp<N>" for rank 0's
// shard of N-way tensor parallelism (MoE layers expert parallel, ep = N; embedding and LM head
// whole on the rank, as the runtime holds them), measured on one GPU without its collectives
// (`twinstep calibrate --tp N`; calibrate-nccl measures those). The fits use a shard's kernels
// at their own shapes, and the simulator prices a TP-N step with the shard's PDL node gap.
// Either may end in "+norms", "+rope" or "+norms+rope": the runtime's kernel fusions
// (KernelFusion; `twinstep calibrate --fusion`), whose kernels, fits and gaps are that label's
// own and stay out of everything pooled over models (is_fused_calibration_label).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "policies/hardware_spec.h"
#include "policies/layout.h"
#include "policies/model_spec.h"
#include "policies/step_kernels.h"

namespace twinstep {

struct CalibrationModel {
  std::string preset;
  int32_t tp = 1;
  KernelFusion fusion;
};

// The spec_graph sample name of an early-exit draft graph of `nodes` steps that stops after its
// first token (calibrate's speculative graphs): nodes − 1 conditional steps skipped.
inline constexpr const char* kEarlyExitSkipSample = "draft_early_exit_skip";

// Throws ConfigError for a label that is not "<preset>[@tp<N>][+norms][+rope]" (2 <= N <= 64,
// the fusions in that order), or whose fusion the runtime does not run for that model and
// layout (kernel_fusion_error).
CalibrationModel parse_calibration_model(const std::string& label);
std::string calibration_model_label(const std::string& preset, int32_t tp,
                                    const KernelFusion& fusion = {});
// Whether `label` names a fused measurement ("+..."): what the fits pool over models (class and
// name fits, the figures, the PDL gap of a model never measured) leaves such samples out, so a
// fused session changes no unfused price.
bool is_fused_calibration_label(std::string_view label);
// The preset of `m` with its fusion.
ModelSpec calibration_model_spec(const CalibrationModel& m);
// Empty where `fusion` (none, or what the runtime runs: kernel_fusion_error) can be calibrated on
// every model of `presets` at `tp` (calibrate --fusion), else why not.
std::string fused_calibration_error(const KernelFusion& fusion,
                                    const std::vector<std::string>& presets, int32_t tp);

// The layout a shard label stands for: {tp: N, ep: N for MoE models, vocab_parallel: false}.
LayoutSpec calibration_layout(const ModelSpec& model, int32_t tp);

// The step kernels of the calibration grid point of `label` as the in-situ calibration ran them
// on one GPU: rank 0's kernels with the collectives left out (the whole step when tp is 1).
void calibration_step_kernels(const std::string& label, const StepShape& shape, StepKernels& out);

// Rank 0's kernels of `model` (a target or a draft module) sharded tp ways as a calibration label
// lays it out (calibration_layout), its collectives left out: what a shard measured alone on one
// GPU runs; tp 1: step_kernels(model, shape).
void shard_step_kernels(const ModelSpec& model, int32_t tp, const StepShape& shape,
                        StepKernels& out);

// One launch's routing of MoE layer `layer` on the rank `label` measured: the routed work of
// rank 0 of its calibration layout (the whole layer at tp 1; under ep = N the block [0, E/N),
// which tp_shard_config gives rank 0) from `ids`, the layer's rows' top_k expert ids over all
// experts (Engine::decode_routing). Throws ConfigError for a bad label or a dense layer.
ExpertShare calibration_expert_share(const std::string& label, int32_t layer,
                                     std::span<const int32_t> ids);

// The kernels of layer `layer` of the grid point of `label` as calibration_step_kernels lists
// them (collectives left out), with rank 0's MoE routing `routing` (layer_kernels).
void calibration_layer_kernels(const std::string& label, const StepShape& shape, int32_t layer,
                               const ExpertShare& routing, std::vector<KernelDesc>& out);

// The GEMV weight shapes (KernelDesc::gemv_n, gemv_k) of `label`'s projections by kernel name,
// from its calibration step kernels: what a stored kernel sample (name, bytes, FLOPs) lacks for
// gemv_split_rows(). Empty for a label that parse_calibration_model refuses.
std::map<std::string, std::pair<int32_t, int32_t>> calibration_gemv_shapes(
    const std::string& label);

// The key of HardwareSpec::pdl_node_gap_by_rows a rank of a `tp`-wide stage prices `model` run
// with `fusion` with: the most specific label the profile measured of the fused shard, the
// shard (fusion none) and the model's name, in that order (a fusion never measured is priced
// with the unfused measurements).
std::string pdl_gap_model(const HardwareSpec& hw, const std::string& model, int32_t tp,
                          const KernelFusion& fusion = {});

// The key of HardwareSpec::kernel_model_fits a rank of a `tp`-wide stage prices `model`'s
// kernels with, chosen like pdl_gap_model among the labels with kernel fits (the model's name
// last, whose entry may be missing: the pooled fits then).
std::string kernel_fit_model(const HardwareSpec& hw, const std::string& model, int32_t tp,
                             const KernelFusion& fusion = {});

// The key of HardwareSpec::kernel_model_fits whose "attention" fit prices `model`'s attention on
// rank 0 of `layout` when the fits kernel_fit_model picks (for layout.width()) have none (a model
// never calibrated): a measured label (on its calibration_layout) whose decode attention kernel
// launches alike — every layer GQA, the same KV heads and query heads per KV head on the rank
// (layer_shard), head dim and KV element bytes, one query position's rows in the same number of
// 16-row tiles. The runtime's kernel (kernels/attention.h) runs
// (splits, KV heads, requests) blocks of 128 threads per row tile over the same KV bytes, so such
// a model's measured line is its own, while the pooled line mixes other geometries. The first
// match in the profile's order with the model's KernelFusion::rope (the attention kernel then
// ropes and appends), else the first of the other; empty when the model has its own attention
// fit or none matches.
std::string attention_fit_model(const HardwareSpec& hw, const ModelSpec& model,
                                const LayoutSpec& layout);

}  // namespace twinstep
