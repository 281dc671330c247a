// Calibration data and calibrated hardware profiles (docs/calibration.md).
//
// A CalibrationSample is one raw measurement taken by `twinstep calibrate` (runtime/
// calibrate.h) and stored in the results database; simulator/calibration.h fits them. A
// CalibrationProfile is the fitted result: a datasheet preset (`base`) with measured figures
// and per-kernel-class fits, written as YAML text under a profile directory and loaded by name
// wherever a hardware preset name is accepted (`hardware: h200-calibrated`).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "policies/hardware_spec.h"

namespace twinstep {

// One measurement. `kind` says what was measured and which fields mean something:
//   kernel          cls, model, mode, batch, ctx_tokens, bytes, flops, nodes; value_ns = the
//                   kernel's time with the node gap and the profiling overhead removed, the
//                   median over the grid point's profiled launches (nodes 0), or one launch's of
//                   `nodes` launches (MoE kernels, bytes and FLOPs under that launch's routing)
//   node_gap        mode (graph | pdl | eager), nodes; value_ns = GPU time per node (eager:
//                   between eagerly launched kernels already queued)
//   eager_launch    value_ns = host time of one eager kernel launch
//   graph_launch    nodes; value_ns = host time of one cudaGraphLaunch
//   event_sync      value_ns = an event's completion to cudaEventSynchronize returning
//   d2h             bytes; value_ns = pinned device-to-host copy, issue to completion
//   stream_read     bytes; value_ns = one streaming read of `bytes` (cold)
//   host_op         name; value_ns = one real-backend host operation
//   step            model, mode, batch, ctx_tokens, nodes; value_ns = unprofiled decode launch
//   step_profiled   the same with a timestamp node before every kernel
//   spec_graph      name (draft | draft_early_exit | verify | extend), model, mode, batch,
//                   ctx_tokens (before the launch), nodes = positions per request (draft: the
//                   draft tokens L, all L forwards run; verify, extend: the width W); value_ns =
//                   GPU time of one speculative graph launch (events)
//   prefill         model, mode (eager), batch (1), ctx_tokens = the prompt's length; value_ns =
//                   GPU time of the runtime's prefill of one prompt (events)
//   collective_break  name (plain | stubbed), model (a shard, "<preset>@tp<N>"), mode (graph |
//                   pdl), batch, ctx_tokens, nodes (stubbed: the collective positions per step;
//                   plain: 0); value_ns = unprofiled decode launch of the shard alone, stubbed:
//                   with an empty non-PDL kernel at each position (EngineOptions::collective_stubs)
struct CalibrationSample {
  std::string kind;
  std::string name;  // node, kernel or host-op name
  std::string cls;   // kernel_class_name() for kernel samples
  std::string model;
  std::string mode;  // eager | graph | pdl
  int64_t batch = 0;
  int64_t ctx_tokens = 0;  // per request
  int64_t nodes = 0;       // spec_graph: positions per request; kernel: launches (above)
  int64_t bytes = 0;
  int64_t flops = 0;
  double value_ns = 0;
};

struct ProfileHeader {
  std::string command;  // the command that produced the profile
  std::string commit;
  std::string gpu;  // the driver's name for the GPU
  std::string driver;
  std::string date;  // ISO 8601 UTC
};

// Percentiles (linear interpolation) of a measured distribution, ns.
struct Distribution {
  int64_t n = 0;
  double mean_ns = 0;
  double p50_ns = 0;
  double p90_ns = 0;
  double p99_ns = 0;
  double max_ns = 0;
};

struct CalibrationProfile {
  std::string name;  // the name experiments use: the file is <name>.yaml
  std::string base;  // the datasheet preset the measured figures replace fields of
  ProfileHeader header;
  HardwareSpec hw;  // base preset + measured figures + kernel fits; hw.name == name
  // Reported with the profile: host-op distributions and scalar figures such as
  // profiled-vs-unprofiled inflation. One exception feeds the simulator: the collective times
  // nccl.<collective>.<mode>.<size>.median_ns (measured on nccl.ranks GPUs) and
  // nccl.r<N>.<collective>.<mode>.<size>.median_ns (on N GPUs) are read into
  // hw.collective_tables when the profile is parsed (the writer writes the measurements only).
  std::vector<std::pair<std::string, Distribution>> host_ops;
  std::vector<std::pair<std::string, double>> measurements;
};

// N of a collective measurement key nccl.r<N>.* (a table measured on N GPUs beside the primary
// group, "Pricing from the table" in docs/calibration.md); 0 for any other key.
int32_t nccl_key_group(const std::string& key);

// The profile as YAML text; parse_calibration_profile(write_calibration_profile(p)) == p
// (doubles are written in shortest round-trip form; hw.collective_tables is rebuilt from the
// measurements, so a table set in hw alone is not written).
std::string write_calibration_profile(const CalibrationProfile& profile);

// Parses profile YAML. Throws ConfigError "source:line:column: message" for malformed YAML, a
// missing, unknown or out-of-range field, an unknown base preset or kernel class, a malformed
// collective time (nccl.*.median_ns: a malformed key or r<N> group, an r<N> group of nccl.ranks
// GPUs, a repeated size in a table, a time outside r<N> groups without nccl.ranks), a malformed
// collective_skew table (HardwareSpec::collective_skew: a point not [skew_ns, extra_ns], a value
// negative or not finite, skew_ns not strictly ascending; a profile without the section has
// none). Never throws anything else for any input bytes (a fuzz target may call it).
// The figures kernel_fit_max_rows and prefill_{gemm,moe}_tflops, prefill_attention_tbps are
// optional and written only where they differ from HardwareSpec's defaults (64, 0).
// spec_graph_residuals (HardwareSpec::spec_graph_residuals) is optional and written only when
// non-empty; an entry with an unknown graph or mode, a missing or out-of-range field, or a
// repeated (model, graph, mode, batch) is a ConfigError at its position.
CalibrationProfile parse_calibration_profile(const std::string& text, const std::string& source);
// Reads and parses the file at `path` (ConfigError naming the path when it cannot be read).
CalibrationProfile load_calibration_profile(const std::string& path);

// Carries collective calibrations (`twinstep calibrate-nccl`) into `into`, a kernel refit
// (`calibrate --fit-only --collectives-from F1 --collectives-from F2 ...`); sources[i] names
// from[i] in messages and in into.header.command (which gains "; collectives from SOURCE (its
// command)" per profile). The first profile replaces into's collectives as a whole: the figures
// interconnect_gbps and *_alpha_ns, the arrival-skew curves, the tables and the nccl.*
// measurements, verbatim. Each further profile adds only its tables: its nccl.* measurements
// written as nccl.r<N>.* (N its nccl.ranks; its nccl.ranks and nccl.skew.* dropped), and its
// own nccl.r<M>.* groups where no earlier profile has M GPUs. Throws ConfigError for a profile
// without nccl.* measurements, and a further one without tables of its own or whose nccl.ranks
// an earlier profile already has.
void merge_collectives(CalibrationProfile& into, const std::vector<CalibrationProfile>& from,
                       const std::vector<std::string>& sources);

// The profile directory: $TWINSTEP_PROFILES when set, else results/profiles of the source tree
// this binary was built from.
std::string calibration_profile_dir();
// Profile names in the directory (files NAME.yaml), sorted; empty when it does not exist.
std::vector<std::string> calibration_profile_names();

// A hardware spec by name: a datasheet preset (hardware_preset_names()) or a calibrated
// profile in calibration_profile_dir(). Throws ConfigError for an unknown name listing both,
// and for a profile that fails to load (its file:line:column, then the available profiles).
HardwareSpec hardware_by_name(const std::string& name);
// Every name hardware_by_name accepts: presets, then profiles.
std::vector<std::string> hardware_names();

}  // namespace twinstep
