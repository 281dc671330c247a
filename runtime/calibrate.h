// `twinstep calibrate`'s measurements on one CUDA GPU (docs/calibration.md): the runtime's own
// decode graphs profiled node by node over a batch × context grid, with and without PDL;
// profiled vs unprofiled step time; eager launch, graph launch and node-gap costs on empty
// kernels; event round trips; device-to-host copies; streaming reads; the real backend's host
// operations; the speculative graphs (draft, draft with early exit, verify, extend) of models
// with a draft module; the prefill of one prompt at several lengths. Returns raw samples
// (policies/calibration_profile.h); simulator/calibration.h fits them.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "policies/calibration_profile.h"
#include "policies/model_spec.h"

namespace twinstep::runtime {

struct CalibrateOptions {
  bool quick = false;  // a small grid: a profile to test the pipeline, not to trust
  // Model presets whose decode graphs are measured (synthetic weights; dense or MoE). The
  // default leaves llama-3.2-3b out: it is the validation suite's never-fitted shape.
  std::vector<std::string> models = {"llama-3-8b"};
  // The in-situ grid: prompt contexts (tokens) and decode batches measured for every model.
  // Empty: the default grid (contexts 128, 512, 2048, 8192; batches 1..64 in powers of two,
  // at most 32 above 4096 tokens; --quick: 128, 2048 and 1, 4, 16, 64). A narrower grid makes
  // a slow-prefill model (the runtime's MoE prefill) affordable.
  std::vector<int> contexts;
  std::vector<int> batches;
  // > 1: measure rank 0's shard of tp-way tensor parallelism of every model (MoE: expert
  // parallel, ep = tp) on one GPU, without its collectives; samples labelled "<model>@tp<N>"
  // (policies/calibration_model.h).
  int tp = 1;
  // Speculative graphs (docs/calibration.md "Speculative graphs"): every model the runtime runs
  // speculative decoding for (dense or MoE) gets its draft(L), draft(L) with early exit (tp 1: TP
  // runs drafts without it), verify(W) and extend(W) graphs timed in situ (spec_graph samples;
  // tp > 1: rank 0's shard alone, labelled "<model>@tp<N>") at the smallest and largest
  // context of the grid (the largest at spec_partitions attention split sizes), batches 1 and 4
  // (quick: 1; with `batches`, those <= 4, else the smallest), W in 2..16 (L = W − 1); ~11 s for
  // Llama-3-8B on an H200. spec_only: only these (no microbenchmarks, decode grid or host
  // operations), to be fitted with stored sessions (calibrate --fit-only --sessions).
  bool spec = true;
  bool spec_only = false;
  // The speculative graphs' batches, increasing, 1..64; empty: the rule above. Verify(W) of B
  // requests runs B x W rows in row-exact GEMV chunks of 16 (spec_graph_extra_chunks), so a
  // batch far above 4 has no measured residual of its own without this (~1 min for 8, 16, 32 on
  // Llama-3-8B, H200).
  std::vector<int> spec_batches;
  // The KV capacity of the speculative graphs' engine, tokens (0: each context's plus one round
  // and a verify's width, rounded to 64). The attention's partition follows the capacity
  // (kernels/attention.cu split_tokens_for): a run's engine holds its prompt plus its whole
  // output (runtime/real_factory.cc), so this measures the graphs as such a run launches them.
  // At least the largest context plus one round (checked).
  int spec_capacity_tokens = 0;
  // Without spec_capacity_tokens: the partitions (attention split sizes) the speculative graphs
  // are measured at, at the largest context: one round's capacity, then the first capacities of
  // the next split sizes (runtime/calibrate.cc spec_graphs); 1..8.
  int spec_partitions = 3;
  // Prefill passes (docs/calibration.md "Prefill"): every model's prefill of one prompt
  // (Engine::enqueue_prefill, eager: cuBLAS projections over every row, chunked decode attention)
  // at each of prefill_tokens (empty: 1024, 2048, 4096, 8192; quick: 1024, 4096), bracketed by an
  // event pair on the compute stream, 2 untimed then 5 timed passes (quick: 3); prefill samples,
  // fitted into the profile's prefill rates (simulator/prefill_fit.h). About 4 s of GPU time for
  // Llama-3-8B on an H200 (~0.33 s per 8192-token pass, not yet measured), plus the engine's
  // synthetic weights. prefill_only: only these, to be fitted with stored sessions (calibrate
  // --fit-only --sessions).
  // tp > 1: the shard's decode steps with and without an empty non-PDL kernel at each collective
  // position (collective_break samples, "plain" and "stubbed"; EngineOptions::collective_stubs),
  // over the grid, after the grid's own passes; ~2 engines per context. breaks_only: only these,
  // to be fitted with stored sessions (calibrate --fit-only --sessions).
  bool breaks_only = false;
  // With breaks_only, in a job of exactly tp ranks (mpirun -np tp, one GPU each): instead of the
  // stubbed engine, the shard's engine with its real collectives over the world communicator
  // ("in_situ" samples beside the "plain" ones; every rank issues the same launches, rank 0's
  // times are the samples). The fit subtracts the profile's price of the collectives
  // (simulator/calibration.h fit_in_situ_break_gaps).
  bool in_situ = false;
  // partition_only: only the decode attention of every model at several KV capacities
  // (docs/calibration.md "Attention partition": the split size follows the capacity;
  // runtime/calibrate.cc attention_partition), a few seconds per model; with spec_only /
  // prefill_only, those too. Stored for reading: no fit uses them (the speculative graphs are
  // measured at several partitions in situ instead, spec_partitions).
  bool partition_only = false;
  bool prefill = true;
  bool prefill_only = false;
  std::vector<int> prefill_tokens;
  // The runtime's kernel fusions (EngineOptions::fused_norms, fused_rope; an experiment's
  // policies.fusion): any set, the decode grid and (with spec) the speculative graphs run fused
  // engines and their samples are labelled "<model>[@tp<N>]+norms+rope" (the fusions set;
  // policies/calibration_model.h), fitted with the profile's unfused sessions (calibrate
  // --fit-only --sessions) into that label's own kernel fits, node gaps and residuals. Nothing
  // else is measured (no microbenchmark, prefill or host-operation samples: the figures pooled
  // over models stay those of the unfused sessions). Refused with prefill_only or breaks_only,
  // and where the runtime does not run the fusion (kernel_fusion_error).
  KernelFusion fusion;
  std::FILE* log = stderr;  // progress lines
};

struct CalibrationRun {
  std::vector<CalibrationSample> samples;
  std::string gpu_name;  // as the driver reports it
  std::string driver;    // driver version, e.g. "570.86.15" (CUDA's numeric form if NVML absent)
};

// Runs every measurement on device 0. Throws Error when no CUDA device is visible, a model is not
// one the runtime can run (Llama-family dense or MoE), a grid value or prompt length is out of
// range, spec_only asks for nothing (spec off), or prefill_only does (prefill off), or a fusion
// is asked with prefill_only or breaks_only, or that fused_calibration_error refuses;
// CUDA failures throw through the runtime's checks.
CalibrationRun run_calibration(const CalibrateOptions& options);

}  // namespace twinstep::runtime
