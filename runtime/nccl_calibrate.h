// NCCL collective calibration (`twinstep calibrate-nccl`, docs/calibration.md "Collectives"):
// all-reduce (bf16 sum), all-gather, all-to-all and send/recv timed against message size, eager
// and inside a captured CUDA graph, one process per GPU under mpirun; then per collective and
// mode the fit time = alpha + bus bytes / beta, written into a calibration profile; then the
// skewed-arrival sweep (NcclSkewPoint: the graph all-reduce with one rank late) and its curve.
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

// ---- skewed arrival (issue #11) ---------------------------------------------------------
// A collective whose ranks arrive at different times lasts longer on the late rank than a
// synchronised one (2 H200s, graph all-reduce: 7.4-7.5 us against 6.67 us). The sweep: per
// message size, each rank captures a graph of `ops` repetitions of [spin kernel, collective];
// the last rank's spin waits delay_ns (read from device memory, so one graph serves every
// delay), the others' spin returns at once. total = that graph per repetition (max over ranks,
// median over reps); spin = the last rank's graph of the spins alone. The late rank's
// collective lasts total - spin; the skew (the late rank's lateness) is spin - spin at delay 0,
// and the extra is (total - spin) - (the same at delay 0).
struct NcclSkewPoint {
  NcclCollective coll = NcclCollective::kAllReduce;
  std::string mode = "graph";
  int ranks = 1;
  int64_t bytes = 0;     // nccl-tests' message bytes, as NcclPoint
  double delay_ns = 0;   // the late rank's requested spin
  int64_t ops = 0;       // [spin, collective] repetitions per graph
  int64_t reps = 0;      // graph replays; each gives a mean per repetition
  double total_ns = 0;   // T(D): spin + collective per repetition, max over ranks, median
  double spin_ns = 0;    // S(D): spin alone per repetition on the late rank, median
  double total0_ns = 0;  // T(0) and S(0) of the same size (the synchronised reference)
  double spin0_ns = 0;

  double skew_ns() const { return spin_ns - spin0_ns; }
  double late_ns() const { return total_ns - spin_ns; }  // the late rank's collective
  double extra_ns() const { return late_ns() - (total0_ns - spin0_ns); }
};

// The simulator's curve for (coll, mode) from the sweep: per delay, the median over sizes of
// skew_ns and extra_ns (extra clamped at >= 0, the skew at >= 0), ascending in skew (a delay
// whose skew does not exceed the previous one's is dropped). One curve for every size, not one
// per size: the decode messages swept (4-128 KiB) are latency-bound (the graph table on 2 H200s:
// 7.5 us at 16 KiB, 9.4 us at 256 KiB), so the extra is taken as a latency of the late rank, not
// a function of the bytes; max_size_dev_ns (the largest |extra of one size - the median| over
// delays) reports how far any size is from the curve, and a deviation near the extra itself
// would call for a bytes axis.
struct SkewFit {
  NcclCollective coll = NcclCollective::kAllReduce;
  std::string mode;
  std::vector<HardwareSpec::SkewPoint> points;
  double max_size_dev_ns = 0;
  int64_t sizes = 0;
  int ranks = 0;
};
// Every (collective, mode) present in `points`, in kNcclCollectives order, eager first.
std::vector<SkewFit> fit_skew(std::span<const NcclSkewPoint> points);
// Rank 0's table: per collective, mode and size, by delay: delay, total, spin, skew, the late
// rank's collective and the extra (us).
std::string nccl_skew_table(std::span<const NcclSkewPoint> points);
// One line per fit and its points (skew, extra in us).
std::string nccl_skew_fit_report(std::span<const SkewFit> fits);

// Writes the calibration into `profile`: from the graph-mode fits (the simulator prices
// collectives inside captured graphs) interconnect_gbps = the all-reduce beta, and
// allreduce_alpha_ns, alltoall_alpha_ns, p2p_alpha_ns refitted with that beta fixed (the cost
// model has one link bandwidth); a collective without graph points keeps its figure. With one
// rank (no link measured) no HardwareSpec field changes. Replaces the profile's "nccl.*"
// measurements with the raw table (median_ns, p90_ns, algbw_gbps, busbw_gbps per point), every
// fit (alpha_ns, beta_gbps, r2, max_rel_err, samples) and the profile model's max relative
// error per collective. An earlier calibration of another group size is kept as a group: its
// primary tables and fits (nccl.ranks = N) become nccl.r<N>.*, its r<M> groups stay unless M is
// this run's size. Returns a short account of what changed.
// With skew points (two or more ranks), the fitted curves replace hw.collective_skew (ranks: the
// points') and measurements gain nccl.skew.<collective>.<mode>.<size>.delay<ns>.{total_ns,
// spin_ns,skew_ns,late_ns,extra_ns} and nccl.skew.fit.<collective>.<mode>.max_size_dev_ns;
// without, an earlier calibration's skew curves are dropped with its nccl.* measurements.
std::string apply_nccl_calibration(CalibrationProfile& profile, std::span<const NcclPoint> points,
                                   std::span<const CollectiveFit> fits,
                                   std::span<const NcclSkewPoint> skew = {});

// A measurement record (DESIGN.md "Benchmark and calibration records", results/<gpu>/*.json):
// command, commit, gpu, date, ranks, nccl, rows (one per point: collective, mode, ranks, bytes,
// ops, reps, median_us, p90_us, min_us, algbw_gbps, busbw_gbps, and beside them fit_us and
// fit_rel_err, the point's own collective and mode fit) and fits (one per fit). With skew
// points also skew_rows (collective, mode, ranks, bytes, ops, reps, delay_us, total_us, spin_us,
// skew_us, late_us, extra_us) and skew_fits (collective, mode, sizes, max_size_dev_us, points:
// [[skew_us, extra_us], ...]).
std::string nccl_record_json(const ProfileHeader& header, const std::string& nccl_version,
                             std::span<const NcclPoint> points, std::span<const CollectiveFit> fits,
                             std::span<const NcclSkewPoint> skew = {});

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
  // The skewed-arrival sweep (NcclSkewPoint; needs two or more ranks): graph all-reduce of
  // skew_bytes, the last rank late by each of skew_delays_ns (the first must be 0),
  // skew_ops [spin, all-reduce] pairs per graph, skew_reps replays (quick: 10 and 10).
  bool skew = true;
  std::vector<int64_t> skew_bytes{4 << 10, 8 << 10, 64 << 10, 128 << 10};
  std::vector<int64_t> skew_delays_ns{0, 500, 1000, 2000, 4000, 8000, 16000, 32000};
  int skew_ops = 20;
  int skew_reps = 25;
};

struct NcclCalibrationRun {
  int rank = 0;
  int ranks = 1;
  int device = 0;
  std::string gpu_name;
  std::string driver;
  std::string nccl_version;
  std::vector<NcclPoint> points;    // the same on every rank (max over ranks per repetition)
  std::vector<NcclSkewPoint> skew;  // the same on every rank; empty with one rank
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
// skew: run the skewed-arrival sweep too (NcclCalibrateOptions::skew). Returns the exit status.
int calibrate_nccl_command(const std::string& out_path, const std::string& json_path,
                           const std::string& name, const std::string& base_profile, bool quick,
                           bool single_process, const std::string& command, bool skew = true);

}  // namespace twinstep
