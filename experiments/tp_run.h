// Tensor-parallel real runs under mpirun (docs/runtime.md "Tensor parallelism"): every rank is
// one GPU of one Engine shard (runtime/tensor_parallel.h) and all ranks run the same variant at
// the same time, unlike a distributed sweep (distributed.h), where ranks take disjoint variants.
//
// Agreement of host decisions: every rank runs the same DecodeLoop over the same requests; the
// loop's decisions depend only on the plan structure and on the outputs it observes, which are
// identical on every rank (after each all-reduce the ranks hold the same residual stream, so
// they sample the same tokens). Timing-dependent inputs are refused up front: open-loop
// (Poisson) arrivals are admitted by each rank's own clock, so real TP runs need a closed loop
// (arrival_rate_per_s 0). After each run the ranks compare a fingerprint of their step sequence
// (steps, batch rows, tokens per step); a difference fails the run ("ranks diverged"). Rank 0's
// record is the one stored, with every rank's timeline spans gathered into it.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "experiments/distributed.h"
#include "experiments/experiment.h"
#include "experiments/progress.h"
#include "policies/run_record.h"
#include "results/db.h"

namespace twinstep {

// True when `e` has a real backend this machine can run and a variant laid out over more than
// one GPU.
bool needs_tensor_parallel(const Experiment& e);

// Throws Error, before anything is run or written, when a real multi-GPU variant of `e` cannot
// run here: a layout other than pure TP (or TP with ep = tp for an MoE model: expert
// parallelism; ep > 1 on a dense model, or an MoE model at tp > 1 without ep = tp, is refused),
// experts not dividing into ep equal blocks, speculation, open-loop arrivals, a build without MPI
// or NCCL, a job whose rank count is not the variant's tp (one process per GPU: `mpirun -np TP`),
// or fewer GPUs than ranks on this node. No-op when the real backend is unavailable (skipped).
void check_real_layouts(const Experiment& e);
// The same checks for one variant (measure_variant's guard).
void check_real_tensor_parallel(const Variant& v);
// Throws Error when v's speculative policy drafts more tokens than the runtime verifies for its
// model (runtime::max_verify_width; checked by check_real_layouts for every real variant).
void check_real_spec_width(const Variant& v);

// What those checks read from the process: launcher ranks, ranks on this node, visible GPUs,
// MPI and NCCL in the build.
struct RealLayoutEnv {
  int world = 1, local_ranks = 1, devices = 0;
  bool mpi = false, nccl = false;
};
RealLayoutEnv real_layout_env();
// Why variant `v` cannot run on the real backend in `env` ("" when it can; always "" for one GPU).
std::string real_layout_problem(const Variant& v, const RealLayoutEnv& env);

// Every rank's timeline in rank 0's record, as the simulator stores a multi-rank run: rank r's
// spans travel to rank 0 (pack / unpack), are moved onto rank 0's clock (timeline_offset_ns) and
// appended with rank = r (append_rank_timeline).
//
// One rank's timeline as bytes: distributed.h's run wire format carrying the timeline alone
// (names once each in a string table, numbers as raw int32/int64 bytes: exact).
std::string pack_timeline(const std::vector<TimelineSpan>& spans);
// pack_timeline's spans with rank = `rank` and names interned (intern_span_name: static
// storage). Throws Error on a malformed buffer.
std::vector<TimelineSpan> unpack_timeline(std::string_view bytes, int32_t rank);
// What to add to `other`'s times to put them on `ref`'s clock (ns). Each rank's clock starts at
// its own run start (RealBackend's t0), which nothing outside the backend sees, so the offset
// comes from the spans: the GPU span of every launch ends after the launch's last all-reduce plus
// the same replicated work (final norm, lm_head, sampling) on every rank, so matching launches
// end together, while their starts carry each rank's own launch delay (the skew to be seen).
// Launches are compute-lane spans with flow > 0, matched by (step, name, k-th by start); the
// offset is the median of ref end - other end (the upper one of an even count). nullopt when no
// launch matches.
std::optional<int64_t> timeline_offset_ns(const std::vector<TimelineSpan>& ref,
                                          const std::vector<TimelineSpan>& other);
// Appends another rank's `spans` to `timeline`, start_ns + offset_ns, flow ids > 0 moved past
// every flow id already there (unique per run, as the simulator's, so a trace arrow never joins
// two ranks).
void append_rank_timeline(std::vector<TimelineSpan>& timeline,
                          const std::vector<TimelineSpan>& spans, int64_t offset_ns);

// Runs `e` under mpirun with tensor-parallel real variants: the simulated runs on rank 0, every
// real run on all ranks together; rank 0 stores each run (db non-null on rank 0 only) with every
// rank's timeline (above; a rank with no launch to align on keeps its own clock, with a progress
// message) and extra metrics: per-rank GPU busy/idle and TPOT (rank<R>_gpu_busy_frac,
// rank<R>_idle_host_frac, rank<R>_idle_launch_frac, rank<R>_tpot_ms_mean), and, under tensor
// parallelism, the NCCL all-reduce of the decode message (bucket rows x hidden bf16) timed inside
// a captured graph after the run (tp_all_reduce_us: one all-reduce; tp_all_reduce_layer_us: the
// two of one layer).
DistributedOutcome run_experiment_tp(DistributedSession& session, const Experiment& e,
                                     ResultsDb* db, Progress& progress,
                                     const std::atomic<bool>& stop);

}  // namespace twinstep
