// The measuring half of runtime/nccl_calibrate.h: one process per GPU, NCCL collectives timed
// with CUDA events, eager and inside captured graphs; the skewed-arrival sweep delays one rank
// with the spin kernel of runtime/nccl_calibrate_spin.cu.
//
// All-reduce and all-to-all go through the runtime's Communicator (runtime/comm.h, its blocking
// data communicator), the calls the engine makes. Communicator has no all-gather and no grouped
// send/recv (a send and a recv that must be in flight together), so those two run on a second,
// plain (blocking) NCCL communicator of the same ranks made here (RawComm), which also reduces
// the timings (max over ranks). Every wait goes through Communicator::synchronize and its
// deadline.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "policies/error.h"
#include "results/build_info.h"
#include "runtime/comm.h"
#include "runtime/nccl_calibrate.h"
#include "runtime/nccl_calibrate_spin.h"
#include "simulator/calibration.h"

namespace twinstep {
namespace {

#define TS_CUDA(expr)                                                                          \
  do {                                                                                         \
    const cudaError_t ts_e_ = (expr);                                                          \
    if (ts_e_ != cudaSuccess)                                                                  \
      throw Error(std::string("calibrate-nccl: ") + #expr + ": " + cudaGetErrorString(ts_e_)); \
  } while (0)

#define TS_NCCL(expr)                                                                              \
  do {                                                                                             \
    const ncclResult_t ts_r_ = (expr);                                                             \
    if (ts_r_ != ncclSuccess)                                                                      \
      throw CommError(std::string("calibrate-nccl: ") + #expr + ": " + ncclGetErrorString(ts_r_)); \
  } while (0)

// The local rank the launcher gives this process (Open MPI, MPICH/Hydra, Slurm), else -1.
int launcher_local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    if (const char* s = std::getenv(v)) return std::atoi(s);
  }
  return -1;
}

// A blocking NCCL communicator over the same ranks, for the calls Communicator lacks. Aborted
// (not finalised) on destruction: it is only ever idle or failed by then.
class RawComm {
 public:
  RawComm(const std::string& id, int rank, int size) {
    ncclUniqueId uid;
    if (id.size() != sizeof uid) throw CommError("calibrate-nccl: bad NCCL unique id");
    std::memcpy(&uid, id.data(), sizeof uid);
    TS_NCCL(ncclCommInitRank(&comm_, size, uid, rank));
  }
  ~RawComm() {
    if (comm_ != nullptr) ncclCommAbort(comm_);
  }
  RawComm(const RawComm&) = delete;
  RawComm& operator=(const RawComm&) = delete;
  ncclComm_t get() const { return comm_; }

 private:
  ncclComm_t comm_ = nullptr;
};

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    TS_CUDA(cudaMalloc(&p_, std::max<size_t>(bytes, 256)));
    TS_CUDA(cudaMemset(p_, 0, std::max<size_t>(bytes, 256)));
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  char* get() const { return static_cast<char*>(p_); }

 private:
  void* p_ = nullptr;
};

class Stream {
 public:
  Stream() { TS_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s_); }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  Event() { TS_CUDA(cudaEventCreate(&e_)); }
  ~Event() { cudaEventDestroy(e_); }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

class Graph {
 public:
  ~Graph() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
  }
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const size_t lo = size_t(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - double(lo)) * (v[hi] - v[lo]);
}

class Bench {
 public:
  Bench(Communicator& comm, RawComm& raw, int64_t max_bytes)
      : comm_(comm), raw_(raw), send_(size_t(max_bytes)), recv_(size_t(max_bytes)), sync_(256) {}

  // The bytes nccl-tests would report for a request of `bytes` (element counts divide evenly).
  int64_t message_bytes(NcclCollective c, int64_t bytes) const {
    const int64_t g = comm_.size();
    switch (c) {
      case NcclCollective::kAllGather:
      case NcclCollective::kAllToAll:
        return bytes / (2 * g) * 2 * g;
      default:
        return bytes / 2 * 2;
    }
  }

  // Enqueues one collective of `bytes` (message_bytes) on the stream.
  void issue(NcclCollective c, int64_t bytes) {
    const int g = comm_.size(), r = comm_.rank();
    cudaStream_t s = stream_.get();
    switch (c) {
      case NcclCollective::kAllReduce:
        comm_.all_reduce_sum(send_.get(), recv_.get(), size_t(bytes / 2), CommType::kBF16, s);
        break;
      case NcclCollective::kAllToAll:
        comm_.all_to_all(send_.get(), recv_.get(), size_t(bytes / (2 * g)), CommType::kBF16, s);
        break;
      case NcclCollective::kAllGather:
        TS_NCCL(ncclAllGather(send_.get(), recv_.get(), size_t(bytes / (2 * g)), ncclBfloat16,
                              raw_.get(), s));
        break;
      case NcclCollective::kSendRecv:
        TS_NCCL(ncclGroupStart());
        TS_NCCL(ncclSend(send_.get(), size_t(bytes / 2), ncclBfloat16, (r + 1) % g, raw_.get(), s));
        TS_NCCL(
            ncclRecv(recv_.get(), size_t(bytes / 2), ncclBfloat16, (r + g - 1) % g, raw_.get(), s));
        TS_NCCL(ncclGroupEnd());
        break;
    }
  }

  // A tiny all-reduce: every rank's stream leaves it at about the same GPU time, so the timed
  // section after it starts aligned across ranks. On the communicator that `c` runs on: NCCL
  // warns that graphs of several communicators launched from one thread can deadlock, so no
  // repetition mixes two.
  void align(NcclCollective c) {
    if (c == NcclCollective::kAllReduce || c == NcclCollective::kAllToAll) {
      comm_.all_reduce_sum(sync_.get(), sync_.get(), 1, CommType::kF32, stream_.get());
    } else {
      TS_NCCL(ncclAllReduce(sync_.get(), sync_.get(), 1, ncclFloat32, ncclSum, raw_.get(),
                            stream_.get()));
    }
  }

  void wait(const std::string& what) { comm_.synchronize(stream_.get(), what); }

  // Captures what `enqueue` issues on the stream into g and instantiates it; a capture that
  // fails part way is ended and discarded before the error propagates.
  template <typename F>
  void capture(Graph& g, F&& enqueue) {
    cudaStream_t s = stream_.get();
    TS_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(s, &broken);
      if (broken != nullptr) cudaGraphDestroy(broken);
      throw;
    }
    TS_CUDA(cudaStreamEndCapture(s, &g.graph_));
    TS_CUDA(cudaGraphInstantiate(&g.exec_, g.graph_, 0));
  }

  // Per repetition, the mean time of one collective, max over ranks.
  std::vector<double> reduce_max(std::vector<double> per_rep) {
    DeviceBuffer d(per_rep.size() * sizeof(double));
    TS_CUDA(cudaMemcpy(d.get(), per_rep.data(), per_rep.size() * sizeof(double),
                       cudaMemcpyHostToDevice));
    TS_NCCL(ncclAllReduce(d.get(), d.get(), per_rep.size(), ncclFloat64, ncclMax, raw_.get(),
                          stream_.get()));
    wait("max of the timings over ranks");
    TS_CUDA(cudaMemcpy(per_rep.data(), d.get(), per_rep.size() * sizeof(double),
                       cudaMemcpyDeviceToHost));
    return per_rep;
  }

  NcclPoint measure(NcclCollective c, int64_t request, bool graph, int ops, int reps, int warmup) {
    const int64_t bytes = message_bytes(c, request);
    const std::string what = std::string(nccl_collective_name(c)) + " of " + std::to_string(bytes) +
                             " bytes (" + (graph ? "graph" : "eager") + ")";
    cudaStream_t s = stream_.get();
    Graph g;
    if (graph) {
      capture(g, [&] {
        for (int i = 0; i < ops; ++i) issue(c, bytes);
      });
      TS_CUDA(cudaGraphLaunch(g.exec_, s));  // warm-up (uploads the graph)
    } else {
      for (int i = 0; i < warmup; ++i) issue(c, bytes);
    }
    wait("warm-up of " + what);
    std::vector<double> per_rep;
    for (int rep = 0; rep < reps; ++rep) {
      align(c);
      TS_CUDA(cudaEventRecord(start_.get(), s));
      if (graph) {
        TS_CUDA(cudaGraphLaunch(g.exec_, s));
      } else {
        for (int i = 0; i < ops; ++i) issue(c, bytes);
      }
      TS_CUDA(cudaEventRecord(stop_.get(), s));
      wait(what);
      float ms = 0;
      TS_CUDA(cudaEventElapsedTime(&ms, start_.get(), stop_.get()));
      per_rep.push_back(double(ms) * 1e6 / ops);
    }
    per_rep = reduce_max(per_rep);
    NcclPoint p;
    p.coll = c;
    p.mode = graph ? "graph" : "eager";
    p.ranks = comm_.size();
    p.bytes = bytes;
    p.ops = ops;
    p.reps = reps;
    p.median_ns = percentile(per_rep, 0.5);
    p.p90_ns = percentile(per_rep, 0.9);
    p.min_ns = *std::min_element(per_rep.begin(), per_rep.end());
    return p;
  }

  // ---- skewed arrival (issue #11; NcclSkewPoint) ----

  // The graph all-reduce of every size in o.skew_bytes with the last rank late by each delay of
  // o.skew_delays_ns (the first 0), and the spin-only reference per delay. Two or more ranks.
  std::vector<NcclSkewPoint> measure_skew(const NcclCalibrateOptions& o) {
    const int ops = o.quick ? std::min(o.skew_ops, 10) : o.skew_ops;
    const int reps = o.quick ? std::min(o.skew_reps, 10) : o.skew_reps;
    const bool late = comm_.rank() == comm_.size() - 1;
    const std::vector<int64_t>& delays = o.skew_delays_ns;
    // S(D): `ops` spins alone, the late rank's time (the others contribute 0 to the max).
    Graph spins;
    capture(spins, [&] {
      for (int i = 0; i < ops; ++i) TS_CUDA(launch_skew_spin(delay_ns_ptr(), stream_.get()));
    });
    replay(spins, ops, 1, 0, "warm-up of the spin-only graph");  // uploads it: untimed
    std::vector<double> spin_ns;
    for (const int64_t d : delays) {
      std::vector<double> per_rep =
          replay(spins, ops, reps, late ? d : 0, "spin-only graph, delay " + std::to_string(d));
      if (!late) std::fill(per_rep.begin(), per_rep.end(), 0.0);
      spin_ns.push_back(percentile(reduce_max(per_rep), 0.5));
    }
    // T(D): `ops` of [spin, all-reduce], max over ranks.
    std::vector<NcclSkewPoint> out;
    for (const int64_t request : o.skew_bytes) {
      const int64_t bytes = message_bytes(NcclCollective::kAllReduce, request);
      Graph g;
      capture(g, [&] {
        for (int i = 0; i < ops; ++i) {
          TS_CUDA(launch_skew_spin(delay_ns_ptr(), stream_.get()));
          issue(NcclCollective::kAllReduce, bytes);
        }
      });
      const size_t first = out.size();
      for (size_t i = 0; i < delays.size(); ++i) {
        const std::string what = "skewed all_reduce of " + std::to_string(bytes) +
                                 " bytes (graph), delay " + std::to_string(delays[i]) + " ns";
        // The first replay of a graph uploads it and connects the buffers: untimed.
        if (i == 0) replay(g, ops, 1, 0, "warm-up of " + what);
        NcclSkewPoint p;
        p.coll = NcclCollective::kAllReduce;
        p.mode = "graph";
        p.ranks = comm_.size();
        p.bytes = bytes;
        p.delay_ns = double(delays[i]);
        p.ops = ops;
        p.reps = reps;
        p.total_ns = percentile(reduce_max(replay(g, ops, reps, late ? delays[i] : 0, what)), 0.5);
        p.spin_ns = spin_ns[i];
        p.total0_ns = i == 0 ? p.total_ns : out[first].total_ns;
        p.spin0_ns = spin_ns[0];
        out.push_back(p);
      }
    }
    return out;
  }

 private:
  // Sets this rank's spin to delay_ns, then `reps` times: align the ranks (a tiny all-reduce on
  // the data communicator, the one the all-reduce graphs use), launch g; per replay the mean
  // time of one of its `ops` repetitions on this rank.
  std::vector<double> replay(const Graph& g, int ops, int reps, int64_t delay_ns,
                             const std::string& what) {
    cudaStream_t s = stream_.get();
    delay_host_ = delay_ns;
    TS_CUDA(
        cudaMemcpyAsync(delay_.get(), &delay_host_, sizeof delay_host_, cudaMemcpyHostToDevice, s));
    wait("setting the delay for " + what);
    std::vector<double> per_rep;
    for (int rep = 0; rep < reps; ++rep) {
      align(NcclCollective::kAllReduce);
      TS_CUDA(cudaEventRecord(start_.get(), s));
      TS_CUDA(cudaGraphLaunch(g.exec_, s));
      TS_CUDA(cudaEventRecord(stop_.get(), s));
      wait(what);
      float ms = 0;
      TS_CUDA(cudaEventElapsedTime(&ms, start_.get(), stop_.get()));
      per_rep.push_back(double(ms) * 1e6 / ops);
    }
    return per_rep;
  }

  const int64_t* delay_ns_ptr() const { return reinterpret_cast<const int64_t*>(delay_.get()); }

  Communicator& comm_;
  RawComm& raw_;
  Stream stream_;
  DeviceBuffer send_, recv_, sync_;
  Event start_, stop_;
  DeviceBuffer delay_{sizeof(int64_t)};  // the spin kernel's delay (ns), set by replay()
  int64_t delay_host_ = 0;               // its source: outlives the copy (replay waits)
};

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return date;
}

// Every collective and size on this rank, then the skewed-arrival sweep (with two or more
// ranks): run.points and run.skew, the same on every rank.
void measure_rank(const NcclCalibrateOptions& o, Communicator& comm, RawComm& raw,
                  NcclCalibrationRun& run) {
  const int ops = o.ops > 0 ? o.ops : (o.quick ? 10 : 20);
  const int reps = o.reps > 0 ? o.reps : (o.quick ? 8 : 25);
  const int64_t step = o.quick ? 4 : 2;
  int64_t max_bytes = o.max_bytes;
  for (const int64_t b : o.skew_bytes) max_bytes = std::max(max_bytes, b);
  Bench bench(comm, raw, max_bytes);
  for (NcclCollective c : o.collectives) {
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= step) {
      run.points.push_back(bench.measure(c, bytes, false, ops, reps, o.warmup));
      if (o.graphs) run.points.push_back(bench.measure(c, bytes, true, ops, reps, o.warmup));
    }
  }
  if (o.skew && comm.size() >= 2) run.skew = bench.measure_skew(o);
}

// The CUDA devices this process sees; an Error saying calibrate-nccl needs them otherwise.
int cuda_devices_or_throw() {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(std::string("calibrate-nccl needs CUDA GPUs: no usable CUDA device (") +
                cudaGetErrorString(e) + ")");
  }
  if (devices < 1) throw Error("calibrate-nccl needs CUDA GPUs: no CUDA device");
  return devices;
}

}  // namespace

NcclCalibrationRun run_nccl_calibration(const NcclCalibrateOptions& o) {
  if (o.min_bytes < 8 || o.max_bytes < o.min_bytes)
    throw Error("calibrate-nccl: message sizes must satisfy 8 <= min <= max");
  if (o.skew) {
    const std::vector<int64_t>& d = o.skew_delays_ns;
    if (d.empty() || d[0] != 0 || !std::is_sorted(d.begin(), d.end()) ||
        std::adjacent_find(d.begin(), d.end()) != d.end()) {
      throw Error("calibrate-nccl: the skew delays must ascend from 0, distinct");
    }
    if (o.skew_bytes.empty() || o.skew_ops < 1 || o.skew_reps < 1 ||
        *std::min_element(o.skew_bytes.begin(), o.skew_bytes.end()) < 8) {
      throw Error("calibrate-nccl: the skew sweep needs sizes >= 8 bytes, ops and reps >= 1");
    }
  }
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast off unless asked for
  NcclCalibrationRun run;
  run.rank = world_rank();
  run.ranks = world_size();
  const int devices = cuda_devices_or_throw();
  const int local = launcher_local_rank();
  run.device = (local >= 0 ? local : run.rank) % devices;
  TS_CUDA(cudaSetDevice(run.device));
  cudaDeviceProp prop{};
  TS_CUDA(cudaGetDeviceProperties(&prop, run.device));
  run.gpu_name = prop.name;
  int driver = 0;
  TS_CUDA(cudaDriverGetVersion(&driver));
  run.driver =
      "CUDA driver API " + std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10);
  int nccl = 0;
  TS_NCCL(ncclGetVersion(&nccl));
  run.nccl_version = std::to_string(nccl / 10000) + "." + std::to_string(nccl / 100 % 100) + "." +
                     std::to_string(nccl % 100);

  CommOptions co;
  co.join_timeout_s = o.timeout_s;
  co.op_timeout_s = o.timeout_s;
  if (o.threads <= 0) {
    std::unique_ptr<Communicator> comm = Communicator::create_world(co);
    RawComm raw(bootstrap_world(&Communicator::new_unique_id, o.timeout_s), comm->rank(),
                comm->size());
    measure_rank(o, *comm, raw, run);
    return run;
  }

  // One process, one thread per rank on GPU rank % devices: the same communicators, made
  // from ids this process holds (Communicator::create), for machines without MPI.
  if (run.ranks > 1) throw Error("calibrate-nccl: --single-process is not for mpirun");
  run.ranks = o.threads;
  const std::string id = Communicator::new_unique_id();
  const std::string raw_id = Communicator::new_unique_id();
  std::vector<NcclCalibrationRun> parts(size_t(o.threads));
  std::vector<std::exception_ptr> errors(size_t(o.threads));
  std::vector<std::thread> threads;
  for (int r = 0; r < o.threads; ++r) {
    threads.emplace_back([&, r] {
      try {
        TS_CUDA(cudaSetDevice(r % devices));
        std::unique_ptr<Communicator> comm = Communicator::create(id, r, o.threads, co);
        RawComm raw(raw_id, r, o.threads);
        measure_rank(o, *comm, raw, parts[size_t(r)]);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  run.points = std::move(parts[0].points);
  run.skew = std::move(parts[0].skew);
  return run;
}

int calibrate_nccl_command(const std::string& out_path, const std::string& json_path,
                           const std::string& profile_name, const std::string& base_profile,
                           bool quick, bool single_process, const std::string& command, bool skew) {
  const std::string stem = std::filesystem::path(out_path).stem().string();
  if (std::filesystem::path(out_path).extension() != ".yaml" || stem.empty()) {
    throw ConfigError("", "--out must name a .yaml file, got '" + out_path + "'");
  }
  const std::string name = profile_name.empty() ? stem : profile_name;
  // The base profile is read before measuring, so a wrong name costs no GPU time.
  CalibrationProfile profile;
  const bool from_profile = !base_profile.empty();
  if (from_profile) {
    const std::string path = calibration_profile_dir() + "/" + base_profile + ".yaml";
    if (!std::filesystem::exists(path)) {
      std::string known;
      for (const std::string& n : calibration_profile_names()) known += " " + n;
      throw ConfigError("", "--profile " + base_profile + ": no " + path +
                                " (profiles:" + (known.empty() ? " none" : known) + ")");
    }
    profile = load_calibration_profile(path);
  }
  NcclCalibrateOptions o;
  o.quick = quick;
  o.skew = skew;
  const int devices = cuda_devices_or_throw();
  if (single_process) o.threads = devices;
  const NcclCalibrationRun run = run_nccl_calibration(o);
  if (run.rank != 0) return 0;

  std::printf("calibrate-nccl: %d rank(s), %s, NCCL %s, %s\n", run.ranks, run.gpu_name.c_str(),
              run.nccl_version.c_str(), run.driver.c_str());
  std::printf("%s\n", nccl_table(run.points).c_str());
  const std::vector<CollectiveFit> fits = fit_collectives(run.points);
  std::printf("%s\n", nccl_fit_report(fits).c_str());
  if (!run.skew.empty()) {
    std::printf("%s\n", nccl_skew_table(run.skew).c_str());
    std::printf("%s\n", nccl_skew_fit_report(fit_skew(run.skew)).c_str());
  }

  const std::string commit = build_info().git_sha + (build_info().git_dirty ? "-dirty" : "");
  // The record first: the raw measurements survive a profile that cannot be written.
  if (!json_path.empty()) {
    const ProfileHeader h = {command, commit, run.gpu_name, run.driver, utc_now()};
    std::ofstream j(json_path, std::ios::binary | std::ios::trunc);
    j << nccl_record_json(h, run.nccl_version, run.points, fits, run.skew);
    j.close();
    if (!j) throw Error("cannot write " + json_path);
    std::printf("wrote %s\n", json_path.c_str());
  }
  if (from_profile) {
    profile.header.command += "; collectives: " + command + " (commit " + commit + ", " +
                              run.nccl_version + ", " + utc_now() + ")";
  } else {
    const std::string base = preset_for_gpu(run.gpu_name);
    if (base.empty()) {
      throw ConfigError("", "no datasheet preset matches GPU '" + run.gpu_name +
                                "'; give --profile with a calibrated profile to extend");
    }
    profile.base = base;
    profile.hw = hardware_preset(base);
    profile.header = {command, commit, run.gpu_name, run.driver, utc_now()};
  }
  profile.name = name;
  profile.hw.name = name;
  const std::string changes = apply_nccl_calibration(profile, run.points, fits, run.skew);
  std::printf(
      "profile %s (over %s):\n%s", name.c_str(),
      from_profile ? ("profile " + base_profile).c_str() : ("preset " + profile.base).c_str(),
      changes.c_str());
  write_profile_file(profile, out_path);
  // The profile format may not carry every collective figure; say so rather than imply it.
  const CalibrationProfile back = load_calibration_profile(out_path);
  if (back.hw.interconnect_gbps != profile.hw.interconnect_gbps ||
      back.hw.allreduce_alpha_ns != profile.hw.allreduce_alpha_ns ||
      back.hw.alltoall_alpha_ns != profile.hw.alltoall_alpha_ns ||
      back.hw.p2p_alpha_ns != profile.hw.p2p_alpha_ns) {
    std::printf(
        "warning: this twinstep's profile format does not store the collective figures "
        "(interconnect_gbps, *_alpha_ns); loading %s gives the base preset's. The fitted values "
        "are in its measurements as nccl.profile.*\n",
        out_path.c_str());
  }
  std::printf("wrote %s (profile '%s'; hardware: %s once it is %s/%s.yaml)\n", out_path.c_str(),
              name.c_str(), name.c_str(), calibration_profile_dir().c_str(), name.c_str());
  return 0;
}

}  // namespace twinstep
