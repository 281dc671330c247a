#include "experiments/distributed.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include "experiments/tp_run.h"
#include "policies/error.h"

#ifdef TWINSTEP_HAVE_MPI
#include <mpi.h>
#endif

namespace twinstep {
namespace {

constexpr uint32_t kWireMagic = 0x32525754;  // "TWR2" (TWR1 lacked the MoE routing stats)

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (end && *end == '\0' && n >= 0 && n <= INT_MAX) ? static_cast<int>(n) : fallback;
}

class Writer {
 public:
  template <typename T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(std::string_view s) {
    pod(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  template <typename T>
  void vec(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    pod(static_cast<uint64_t>(v.size()));
    if (!v.empty()) out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  T pod() {
    T v;
    std::memcpy(&v, take(sizeof v), sizeof v);
    return v;
  }
  std::string str() {
    const uint32_t n = pod<uint32_t>();
    return std::string(take(n), n);
  }
  template <typename T>
  void vec(std::vector<T>& v) {
    const uint64_t n = pod<uint64_t>();
    if (n > in_.size() / sizeof(T)) malformed();
    v.resize(n);
    if (n > 0) std::memcpy(v.data(), take(n * sizeof(T)), n * sizeof(T));  // data() may be null
  }
  bool at_end() const { return pos_ == in_.size(); }

 private:
  const char* take(size_t n) {
    if (n > in_.size() - pos_) malformed();
    const char* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }
  [[noreturn]] static void malformed() {
    throw Error("distributed run: malformed result message (do all ranks run the same binary?)");
  }
  std::string_view in_;
  size_t pos_ = 0;
};

// A timeline span without its name pointer; the name travels as an index into a string table.
struct WireSpan {
  int32_t rank;
  Lane lane;
  uint32_t name;
  int64_t step;
  int64_t start_ns;
  int64_t dur_ns;
  int64_t flow;
};

}  // namespace

const char* intern_span_name(std::string_view name) {
  static std::mutex mu;
  static std::unordered_set<std::string>* pool = new std::unordered_set<std::string>();  // leaked
  std::lock_guard<std::mutex> lock(mu);
  return pool->emplace(name).first->c_str();  // node-based: element addresses are stable
}

// Every member of RunRecord must travel: a new one must be added to both functions below.
static_assert(sizeof(RunRecord) ==
                  5 * sizeof(std::vector<int>) + sizeof(int64_t) + sizeof(MoeRoutingStats),
              "RunRecord changed: update encode_finished_run / decode_finished_run");

std::string encode_finished_run(const FinishedRun& run) {
  Writer w;
  w.pod(kWireMagic);
  w.pod(run.variant_index);
  w.pod(run.backend);
  w.pod(run.wall_s);
  w.str(run.error);
  w.vec(run.record.requests);
  w.vec(run.record.chunks);
  w.vec(run.record.steps);
  w.pod(run.record.end_ns);
  std::vector<std::string_view> names;
  std::unordered_map<std::string_view, uint32_t> name_ids;
  std::vector<WireSpan> spans;
  spans.reserve(run.record.timeline.size());
  for (const TimelineSpan& t : run.record.timeline) {
    const std::string_view name = t.name ? t.name : "";
    auto [it, added] = name_ids.emplace(name, static_cast<uint32_t>(names.size()));
    if (added) names.push_back(name);
    spans.push_back({t.rank, t.lane, it->second, t.step, t.start_ns, t.dur_ns, t.flow});
  }
  w.pod(static_cast<uint32_t>(names.size()));
  for (std::string_view n : names) w.str(n);
  w.vec(spans);
  w.pod(static_cast<uint64_t>(run.record.rounds.size()));
  for (const DraftRound& d : run.record.rounds) {
    w.pod(d.request);
    w.pod(d.step);
    w.pod(d.draft_len);
    w.pod(d.accepted);
    w.vec(d.confidence);
  }
  const MoeRoutingStats& mr = run.record.moe_routing;
  w.pod(mr.num_experts);
  w.pod(mr.ep);
  w.pod(mr.passes);
  w.pod(mr.rank_experts);
  w.pod(mr.rank_experts_max);
  w.vec(mr.picks);
  w.pod(static_cast<uint32_t>(run.metrics.size()));
  for (const Metric& m : run.metrics) {
    w.str(m.key);
    w.pod(m.value);
    w.str(m.unit);
  }
  return w.take();
}

FinishedRun decode_finished_run(std::string_view bytes) {
  Reader r(bytes);
  if (r.pod<uint32_t>() != kWireMagic) {
    throw Error("distributed run: result message has a bad header (mixed twinstep versions?)");
  }
  FinishedRun run;
  run.variant_index = r.pod<int32_t>();
  run.backend = r.pod<BackendKind>();
  run.wall_s = r.pod<double>();
  run.error = r.str();
  r.vec(run.record.requests);
  r.vec(run.record.chunks);
  r.vec(run.record.steps);
  run.record.end_ns = r.pod<int64_t>();
  std::vector<const char*> names(r.pod<uint32_t>());
  for (const char*& n : names) n = intern_span_name(r.str());
  std::vector<WireSpan> spans;
  r.vec(spans);
  run.record.timeline.reserve(spans.size());
  for (const WireSpan& s : spans) {
    if (s.name >= names.size()) throw Error("distributed run: span name index out of range");
    run.record.timeline.push_back(
        {s.rank, s.lane, names[s.name], s.step, s.start_ns, s.dur_ns, s.flow});
  }
  const uint64_t rounds = r.pod<uint64_t>();
  if (rounds > bytes.size()) throw Error("distributed run: draft round count out of range");
  run.record.rounds.resize(rounds);
  for (DraftRound& d : run.record.rounds) {
    d.request = r.pod<int32_t>();
    d.step = r.pod<int64_t>();
    d.draft_len = r.pod<int32_t>();
    d.accepted = r.pod<int32_t>();
    r.vec(d.confidence);
  }
  MoeRoutingStats& mr = run.record.moe_routing;
  mr.num_experts = r.pod<int32_t>();
  mr.ep = r.pod<int32_t>();
  mr.passes = r.pod<int64_t>();
  mr.rank_experts = r.pod<int64_t>();
  mr.rank_experts_max = r.pod<int64_t>();
  r.vec(mr.picks);
  run.metrics.resize(r.pod<uint32_t>());
  for (Metric& m : run.metrics) {
    m.key = r.str();
    m.value = r.pod<double>();
    m.unit = r.str();
  }
  if (!r.at_end()) throw Error("distributed run: trailing bytes in a result message");
  return run;
}

int launcher_world_size() {
  return std::max({1, env_int("OMPI_COMM_WORLD_SIZE", 1), env_int("PMI_SIZE", 1),
                   env_int("MV2_COMM_WORLD_SIZE", 1)});
}

int launcher_rank() {
  return std::max({0, env_int("OMPI_COMM_WORLD_RANK", 0), env_int("PMI_RANK", 0),
                   env_int("MV2_COMM_WORLD_RANK", 0)});
}

#ifdef TWINSTEP_HAVE_MPI

bool mpi_built() { return true; }

DistributedSession::DistributedSession() {
  // Only under a launcher: a plain `twinstep run` never touches MPI (no singleton start-up).
  if (launcher_world_size() <= 1) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SINGLE, &provided);
  initialised_ = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

DistributedSession::~DistributedSession() {
  if (initialised_) MPI_Finalize();
}

void DistributedSession::abort(int exit_code) {
  if (initialised_) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::exit(exit_code);
}

namespace {

constexpr int kTagResult = 1;
constexpr int kTagDone = 2;

struct PendingSend {
  std::string bytes;
  MPI_Request request = MPI_REQUEST_NULL;
};

std::string run_name(const Experiment& e, int32_t variant_index, BackendKind b) {
  return "variant " + std::to_string(variant_index) + " '" +
         e.variants.at(static_cast<size_t>(variant_index)).label + "' [" + backend_kind_name(b) +
         "]";
}

}  // namespace

DistributedOutcome run_experiment_distributed(DistributedSession& session, const Experiment& e,
                                              ResultsDb* db, Progress& progress,
                                              const std::atomic<bool>& stop) {
  // Real multi-GPU variants: every rank runs each of them together (experiments/tp_run.h).
  if (needs_tensor_parallel(e)) return run_experiment_tp(session, e, db, progress, stop);
  const int rank = session.rank();
  const int size = session.size();
  const std::vector<BackendKind> backends = runnable_backends(e, progress);
  const int64_t nb = static_cast<int64_t>(backends.size());
  const int64_t total = static_cast<int64_t>(e.variants.size()) * nb;
  DistributedOutcome outcome;

  auto simulate = [&](int64_t u) {
    return execute_run(e.variants[static_cast<size_t>(u / nb)], backends[size_t(u % nb)]);
  };
  if (size < 2) throw Error("distributed run: needs at least 2 ranks");

  if (rank != 0) {
    std::deque<PendingSend> pending;
    int64_t sent = 0;
    for (int64_t u = 0; u < total; ++u) {
      if (rank_of_run(u, size) != rank) continue;
      if (stop.load()) {
        outcome.interrupted = true;
        break;
      }
      pending.push_back({encode_finished_run(simulate(u))});
      PendingSend& p = pending.back();
      if (p.bytes.size() > size_t(INT_MAX)) {
        throw Error("distributed run: a run record of " + std::to_string(p.bytes.size()) +
                    " bytes is too large to send (limit 2 GiB); trace fewer steps");
      }
      MPI_Isend(p.bytes.data(), static_cast<int>(p.bytes.size()), MPI_BYTE, 0, kTagResult,
                MPI_COMM_WORLD, &p.request);
      ++sent;
      // Free the buffers rank 0 has already taken, oldest first.
      while (!pending.empty()) {
        int done = 0;
        MPI_Test(&pending.front().request, &done, MPI_STATUS_IGNORE);
        if (!done) break;
        pending.pop_front();
      }
    }
    // Message order between two ranks is preserved: rank 0 sees "done" after every result.
    int64_t done_msg[2] = {sent, outcome.interrupted ? 1 : 0};
    pending.push_back({});
    MPI_Isend(done_msg, 2, MPI_INT64_T, 0, kTagDone, MPI_COMM_WORLD, &pending.back().request);
    // Poll politely: a blocking MPI wait spins a core that rank 0 may need for storing.
    while (!pending.empty()) {
      int done = 0;
      MPI_Test(&pending.front().request, &done, MPI_STATUS_IGNORE);
      if (done) {
        pending.pop_front();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    return outcome;
  }

  if (!db) throw Error("distributed run: rank 0 needs the results database");
  int64_t stored = 0;
  auto store = [&](const FinishedRun& run, int from_rank) {
    const int64_t id = store_run(e, run, *db);
    const std::string name = run_name(e, run.variant_index, run.backend);
    if (!run.error.empty()) {
      outcome.failures.push_back(name + " on rank " + std::to_string(from_rank) + ": " + run.error);
      progress.message("FAILED: " + outcome.failures.back() + " (stored as run " +
                       std::to_string(id) + ", status 'failed')");
    } else {
      outcome.stored.push_back({id, run.variant_index, run.backend});
    }
    ++stored;
    progress.update(stored, total, name + " from rank " + std::to_string(from_rank));
  };
  int workers_done = 0;
  std::string buffer;
  // Receives and handles one message if one is pending; false when none was.
  auto receive = [&]() {
    MPI_Status status;
    int ready = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &ready, &status);
    if (!ready) return false;
    if (status.MPI_TAG == kTagDone) {
      int64_t done_msg[2];
      MPI_Recv(done_msg, 2, MPI_INT64_T, status.MPI_SOURCE, kTagDone, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
      if (done_msg[1]) outcome.interrupted = true;
      ++workers_done;
      return true;
    }
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    buffer.resize(static_cast<size_t>(bytes));
    MPI_Recv(buffer.data(), bytes, MPI_BYTE, status.MPI_SOURCE, kTagResult, MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
    store(decode_finished_run(buffer), status.MPI_SOURCE);
    return true;
  };

  progress.update(0, total, "starting " + std::to_string(size - 1) + " simulating rank(s)");
  while (workers_done < size - 1) {
    if (stop.load()) outcome.interrupted = true;
    if (!receive()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (outcome.interrupted) {
    progress.message("interrupted: " + std::to_string(stored) + " of " + std::to_string(total) +
                     " runs stored, the rest not started");
  } else {
    progress.finish();
  }
  std::sort(outcome.stored.begin(), outcome.stored.end(),
            [](const RunOutcome& a, const RunOutcome& b) {
              return std::pair(a.variant_index, a.backend) < std::pair(b.variant_index, b.backend);
            });
  return outcome;
}

#else  // !TWINSTEP_HAVE_MPI

bool mpi_built() { return false; }

DistributedSession::DistributedSession() {
  const int n = launcher_world_size();
  if (n > 1) {
    throw Error("launched as one of " + std::to_string(n) +
                " ranks (mpirun), but this twinstep was built without MPI: every rank would run "
                "the whole sweep into the same database. Run it without mpirun, or install "
                "OpenMPI (apt-get install openmpi-bin libopenmpi-dev) and rebuild");
  }
}

DistributedSession::~DistributedSession() = default;

void DistributedSession::abort(int exit_code) { std::exit(exit_code); }

DistributedOutcome run_experiment_distributed(DistributedSession&, const Experiment&, ResultsDb*,
                                              Progress&, const std::atomic<bool>&) {
  throw Error("distributed run: this twinstep was built without MPI");
}

#endif  // TWINSTEP_HAVE_MPI

}  // namespace twinstep
