// NCCL collective calibration (`twinstep calibrate-nccl`, docs/calibration.md "Collectives"):
// all-reduce (bf16 sum), all-gather, all-to-all and send/recv timed against message size, eager
// and inside a captured CUDA graph, one process per GPU under mpirun; then per collective and
// mode the fit time = alpha + bus bytes / beta, written into a calibration profile.
//
// The fit, the table and the profile update are CPU code (twinstep_nccl_fit, tested on
// synthetic points); run_nccl_calibration needs CUDA and NCCL (twinstep_nccl_calibrate; more
// than one rank needs MPI to launch).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "policies/calibration_profile.h"

namespace twinstep {

enum class NcclCollective { kAllReduce, kAllGather, kAllToAll, kSendRecv };
inline constexpr NcclCollective kNcclCollectives[] = {
    NcclCollective::kAllReduce, NcclCollective::kAllGather, NcclCollective::kAllToAll,
    NcclCollective::kSendRecv};

// all_reduce | all_gather | all_to_all | send_recv
const char* nccl_collective_name(NcclCollective c);

// nccl-tests' bus-bandwidth factor over `ranks` ranks: all-reduce 2(g-1)/g; all-gather and
// all-to-all (g-1)/g; send/recv 1. bus bytes = message bytes × factor is what the simulator's
// CostModel::collective_ns divides by the link bandwidth (its "algorithm bytes").
double nccl_bus_factor(NcclCollective c, int ranks);

// One measured point. `bytes` is the message size as nccl-tests counts it: all-reduce the
// buffer, all-gather the gathered output, all-to-all what one rank sends in all, send/recv the
// buffer (every rank sends it to the next rank and receives one from the previous).
struct NcclPoint {
  NcclCollective coll = NcclCollective::kAllReduce;
  std::string mode;  // eager | graph
  int ranks = 1;
  int64_t bytes = 0;
  int64_t ops = 0;   // collectives per repetition (back to back on one stream, or one graph)
  int64_t reps = 0;  // repetitions; each gives the mean time of its ops, max over ranks
  double median_ns = 0;
  double p90_ns = 0;
  double min_ns = 0;

  double bus_bytes() const { return double(bytes) * nccl_bus_factor(coll, ranks); }
  double algbw_gbps() const { return median_ns > 0 ? double(bytes) / median_ns : 0; }  // GB/s
  double busbw_gbps() const { return median_ns > 0 ? bus_bytes() / median_ns : 0; }
};

// time_ns = alpha_ns + bus_bytes / beta_gbps (bytes per ns = GB/s).
struct CollectiveFit {
  NcclCollective coll = NcclCollective::kAllReduce;
  std::string mode;
  bool fitted = false;     // >= 2 points
  double alpha_ns = 0;     // >= 0
  double beta_gbps = 0;    // 0: no bandwidth term (one rank moves no bus bytes)
  double r2 = 0;           // on the medians, unweighted
  double max_rel_err = 0;  // max |fit - median| / median
  int64_t samples = 0;
};

// Fits the points of (coll, mode) by non-negative least squares (simulator/calibration.h's
// nnls) on relative error: each row weighted by 1 / median, so 8 KB and 256 MB count alike.
CollectiveFit fit_collective(std::span<const NcclPoint> points, NcclCollective coll,
                             const std::string& mode);
// Every (collective, mode) present in `points`, in kNcclCollectives order, eager first.
std::vector<CollectiveFit> fit_collectives(std::span<const NcclPoint> points);

// The best alpha (weighted as above, >= 0) of (coll, mode) with beta fixed, and the max
// relative error of that model: how well the profile's one link bandwidth prices this
// collective. Returns {alpha_ns, max_rel_err}; {0, 0} without points.
std::pair<double, double> fit_alpha_with_beta(std::span<const NcclPoint> points,
                                              NcclCollective coll, const std::string& mode,
                                              double beta_gbps);

// Rank 0's table, sorted by collective, mode and size: collective, mode, bytes, ops x reps, median
// and p90 (us), algbw and busbw (GB/s, nccl-tests' definitions, from the median).
std::string nccl_table(std::span<const NcclPoint> points);
// One line per fit: alpha (us), beta (GB/s), R², max relative error, points.
std::string nccl_fit_report(std::span<const CollectiveFit> fits);

// Writes the calibration into `profile`: from the graph-mode fits (the simulator prices
// collectives inside captured graphs) interconnect_gbps = the all-reduce beta, and
// allreduce_alpha_ns, alltoall_alpha_ns, p2p_alpha_ns refitted with that beta fixed (the cost
// model has one link bandwidth); a collective without graph points keeps its figure. With one
// rank (no link measured) no HardwareSpec field changes. Replaces the profile's "nccl.*"
// measurements with the raw table (median_ns, p90_ns, algbw_gbps, busbw_gbps per point), every
// fit (alpha_ns, beta_gbps, r2, max_rel_err, samples) and the profile model's max relative
// error per collective. Returns a short account of what changed.
std::string apply_nccl_calibration(CalibrationProfile& profile, std::span<const NcclPoint> points,
                                   std::span<const CollectiveFit> fits);

// A measurement record (DESIGN.md "Benchmark and calibration records", results/<gpu>/*.json):
// command, commit, gpu, date, ranks, nccl, rows (one per point: collective, mode, ranks, bytes,
// ops, reps, median_us, p90_us, min_us, algbw_gbps, busbw_gbps, and beside them fit_us and
// fit_rel_err, the point's own collective and mode fit) and fits (one per fit).
std::string nccl_record_json(const ProfileHeader& header, const std::string& nccl_version,
                             std::span<const NcclPoint> points,
                             std::span<const CollectiveFit> fits);

// The datasheet preset for a GPU name ("NVIDIA H200" -> h200); empty when none matches.
std::string preset_for_gpu(const std::string& gpu_name);

// Writes the profile to `path` through a temporary file in the same directory and a rename,
// so a reader never sees a half-written profile. Throws Error when it cannot.
void write_profile_file(const CalibrationProfile& profile, const std::string& path);

// ---- measurement (CUDA + NCCL) ----------------------------------------------------------

struct NcclCalibrateOptions {
  bool quick = false;  // x4 size steps, fewer repetitions
  int64_t min_bytes = 8 << 10;
  int64_t max_bytes = int64_t(256) << 20;
  int ops = 0;     // per repetition; 0: 20 (quick 10)
  int reps = 0;    // 0: 25 (quick 8)
  int warmup = 5;  // eager collectives before each size's measurement
  bool graphs = true;
  std::vector<NcclCollective> collectives{std::begin(kNcclCollectives), std::end(kNcclCollectives)};
  double timeout_s = 120;  // every wait on the other ranks (runtime/comm.h deadlines)
  // > 0: not under mpirun: this one process runs `threads` ranks, one thread each, on GPUs
  // rank % device count (for machines without MPI; same communicators, same loop).
  int threads = 0;
};

struct NcclCalibrationRun {
  int rank = 0;
  int ranks = 1;
  int device = 0;
  std::string gpu_name;
  std::string driver;
  std::string nccl_version;
  std::vector<NcclPoint> points;  // the same on every rank (max over ranks per repetition)
};

// Collective over the MPI world (initialised by the caller, experiments/distributed.h; a
// world of one without mpirun), or over options.threads threads of this process: each rank takes
// GPU local rank % device count, joins an NCCL communicator (runtime/comm.h) and times every
// collective and size. NCCL_NVLS_ENABLE defaults to 0 (NVLink multicast stays off unless the
// environment says otherwise). Throws Error/ CommError on CUDA or NCCL failures and on a rank that
// does not join or hangs (deadlines).
NcclCalibrationRun run_nccl_calibration(const NcclCalibrateOptions& options);

// `twinstep calibrate-nccl` after MPI is up: measures, and on rank 0 prints the table and the
// fits, builds the profile (the calibrated profile `base_profile` from
// calibration_profile_dir() when not empty, else the detected GPU's datasheet preset), applies
// the calibration and writes `out_path` (a .yaml file). single_process: one thread per visible
// GPU instead of mpirun's processes. json_path (when not empty): nccl_record_json's record. The
// profile is named `name`, or the file's stem when empty; install it as <profile dir>/NAME.yaml.
// Returns the exit status.
int calibrate_nccl_command(const std::string& out_path, const std::string& json_path,
                           const std::string& name, const std::string& base_profile, bool quick,
                           bool single_process, const std::string& command);

}  // namespace twinstep
