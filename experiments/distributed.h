// Distributed sweeps: under `mpirun -n N`, ranks 1..N-1 split an experiment's runs (variant ×
// backend) and rank 0 stores every one, so the database matches a single process's, run for
// run (run ids and row order may differ). MPI is optional; without it the build runs one
// process and refuses to run under a multi-rank launcher.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "experiments/experiment.h"
#include "experiments/progress.h"
#include "experiments/runner.h"
#include "results/db.h"

namespace twinstep {

// True when this binary was built with MPI (TWINSTEP_HAVE_MPI).
bool mpi_built();

// Size of / this process's rank in the job that launched it, from the launcher's environment
// (Open MPI's OMPI_COMM_WORLD_*, MPICH/Hydra's PMI_*); 1 / 0 when not launched by one.
int launcher_world_size();
int launcher_rank();

// Run `index` (variant-major: variant * backends + backend) is simulated by rank
// 1 + index % (world_size - 1): deterministic, and neighbouring variants (which differ in the
// fastest-varying sweep key) spread over the ranks. Rank 0 simulates nothing: it stores every
// run, and storing (~1 ms per small run in SQLite) costs about as much as simulating, so a
// rank 0 that also simulated would delay every other rank's writes.
inline int rank_of_run(int64_t index, int world_size) {
  return 1 + static_cast<int>(index % (world_size - 1));
}

// An MPI job, initialised when the launcher started more than one rank. Without MPI in the
// build, construction throws Error when launcher_world_size() > 1 (N copies would otherwise
// each run the whole sweep into one database). One per process; finalises MPI on destruction.
class DistributedSession {
 public:
  DistributedSession();
  ~DistributedSession();
  DistributedSession(const DistributedSession&) = delete;
  DistributedSession& operator=(const DistributedSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool distributed() const { return size_ > 1; }
  // Ends every rank after an error on this one (MPI_Abort); a no-op when not distributed.
  [[noreturn]] void abort(int exit_code);

 private:
  int rank_ = 0;
  int size_ = 1;
  bool initialised_ = false;
};

struct DistributedOutcome {
  std::vector<RunOutcome> stored;     // rank 0: ordered by variant index, then backend
  std::vector<std::string> failures;  // rank 0: "variant 17 'label' [sim] on rank 1: what"
  bool interrupted = false;           // some rank stopped early (SIGINT/SIGTERM)
};

// Runs `experiment` over the session's ranks (at least 2). Every rank calls it; `db` is used
// on rank 0 only (nullptr elsewhere). Ranks 1.. simulate their runs (rank_of_run) and send each
// finished one to rank 0, which stores it as it arrives (one transaction per run). A failed
// run is stored as 'failed' and listed in `failures`; the others continue. Progress on rank 0
// counts every rank's runs.
// Throws Error on infrastructure failures (database, malformed message): the caller must then
// abort the job. Ranks must run the same binary (samples travel as raw structs).
DistributedOutcome run_experiment_distributed(DistributedSession& session,
                                              const Experiment& experiment, ResultsDb* db,
                                              Progress& progress, const std::atomic<bool>& stop);

// Wire format of one finished run (exposed for tests): raw POD sample vectors, timeline span
// names as strings, metrics as (key, value, unit).
std::string encode_finished_run(const FinishedRun& run);
// Decodes encode_finished_run's output; span names are interned into a process-wide pool (so
// they have static storage, as TimelineSpan requires). Throws Error on a malformed buffer.
FinishedRun decode_finished_run(std::string_view bytes);

// A pointer with static storage to a string equal to `name` (one per distinct name).
const char* intern_span_name(std::string_view name);

}  // namespace twinstep
