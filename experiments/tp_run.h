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
// record is the one stored.
#pragma once

#include <atomic>
#include <string>

#include "experiments/distributed.h"
#include "experiments/experiment.h"
#include "experiments/progress.h"
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

// What those checks read from the process: launcher ranks, ranks on this node, visible GPUs,
// MPI and NCCL in the build.
struct RealLayoutEnv {
  int world = 1, local_ranks = 1, devices = 0;
  bool mpi = false, nccl = false;
};
RealLayoutEnv real_layout_env();
// Why variant `v` cannot run on the real backend in `env` ("" when it can; always "" for one GPU).
std::string real_layout_problem(const Variant& v, const RealLayoutEnv& env);

// Runs `e` under mpirun with tensor-parallel real variants: the simulated runs on rank 0, every
// real run on all ranks together; rank 0 stores each run (db non-null on rank 0 only) with extra
// metrics: per-rank GPU busy/idle and TPOT (rank<R>_gpu_busy_frac, rank<R>_idle_host_frac,
// rank<R>_idle_launch_frac, rank<R>_tpot_ms_mean), and the NCCL all-reduce of the decode
// message (bucket rows x hidden bf16) timed inside a captured graph after the run
// (tp_all_reduce_us: one all-reduce; tp_all_reduce_layer_us: the two of one layer).
DistributedOutcome run_experiment_tp(DistributedSession& session, const Experiment& e,
                                     ResultsDb* db, Progress& progress,
                                     const std::atomic<bool>& stop);

}  // namespace twinstep
