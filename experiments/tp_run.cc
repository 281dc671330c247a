#include "experiments/tp_run.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "experiments/runner.h"
#include "policies/error.h"
#include "policies/layout.h"
#include "policies/model_spec.h"
#ifdef TWINSTEP_HAVE_RUNTIME
#include <cuda_runtime.h>

#include "runtime/comm.h"
#include "runtime/engine.h"
#include "runtime/real_backend.h"
#include "runtime/tensor_parallel.h"
#endif

namespace twinstep {
namespace {

bool has_real(const Experiment& e) {
  for (BackendKind b : e.backends)
    if (b == BackendKind::kReal) return true;
  return false;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

// Ranks of this job on this node (the launcher's, else all of them: one node).
int local_ranks() {
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (int n = env_int(name, 0); n > 0) return n;
  return launcher_world_size();
}

}  // namespace

bool needs_tensor_parallel(const Experiment& e) {
  std::string why;
  if (!has_real(e) || !real_backend_available(&why)) return false;  // real skipped: a sweep
  for (const Variant& v : e.variants)
    if (v.layout.world() > 1) return true;
  return false;
}

std::string real_layout_problem(const Variant& v, const RealLayoutEnv& env) {
  const LayoutSpec& l = v.layout;
  if (l.world() == 1) return "";
  const std::string name = "variant " + std::to_string(v.index) + " '" + v.label + "': layout " +
                           layout_name(l) + " on the real backend";
  if (l.pp > 1) {
    // A two-stage pipeline (runtime/pipeline_parallel.h), one microbatch, whole prefills.
    if (l.pp != 2 || l.tp != 1 || l.dp != 1 || l.cp != 1 || l.ep != 1)
      return name +
             ": the multi-GPU runtime runs a pipeline only as two stages alone (pp 2, every other "
             "degree 1: layout {pp: 2, microbatches: 1}); other PP layouts run in the simulator";
    if (l.microbatches != 1)
      return name + ": the runtime's pipeline runs each launch as one microbatch, and " +
             (l.microbatches == 0
                  ? std::string("the default splits it into pp = 2")
                  : "microbatches " + std::to_string(l.microbatches) + " splits it") +
             "; set `layout: {pp: 2, microbatches: 1}` so the simulated twin prices the same "
             "pipeline";
    if (l.prefill_chunk_tokens != 0)
      return name +
             ": the runtime's pipeline passes each prefill through the stages whole; leave "
             "layout.prefill_chunk_tokens unset";
  } else if (l.dp != 1 || l.cp != 1 || l.tp != l.world() || (l.ep != 1 && l.ep != l.tp)) {
    return name +
           ": the multi-GPU runtime does tensor parallelism only (tp > 1, ep 1 or ep = tp for an "
           "MoE model, every other degree 1) or a two-stage pipeline (pp 2 alone); DP, CP and "
           "other EP layouts run in the simulator";
  }
  // MoE layers run expert parallel inside the TP group (runtime/tensor_parallel.h), the
  // simulator's TP-EP layout with ep = tp.
  const bool moe = !v.model.layers.empty() && v.model.layers[0].mlp.kind == MlpKind::kMoe;
  if (l.ep > 1 && !moe)
    return name + ": ep " + std::to_string(l.ep) + " on the dense model '" + v.model.name +
           "': expert parallelism needs routed experts; use layout {tp: " + std::to_string(l.tp) +
           "} alone";
  if (moe && l.ep != l.tp)
    return name +
           ": the runtime shards MoE layers by expert parallelism only (ep = tp: rank i "
           "holds experts [E i/tp, E (i+1)/tp)); splitting every expert's intermediate (ep 1) "
           "is not implemented: use layout {tp: " +
           std::to_string(l.tp) + ", ep: " + std::to_string(l.tp) + "}";
  if (moe && v.model.layers[0].mlp.num_experts % l.ep != 0)
    return name + ": " + std::to_string(v.model.layers[0].mlp.num_experts) +
           " routed experts do not divide into " + std::to_string(l.ep) +
           " equal blocks (unequal expert blocks are not implemented in the runtime)";
  if (v.policy.spec.method != SpecMethod::kNone) {
    if (l.pp > 1)
      return name + ": speculative decoding with pipeline parallelism is not implemented";
    if (v.policy.spec.early_exit && v.policy.spec.method == SpecMethod::kConfidence &&
        (v.policy.spec.mode == DraftMode::kDevice ||
         v.policy.spec.mode == DraftMode::kHostBlocking))
      return name +
             ": speculative decoding under tensor parallelism runs without early exit (the draft "
             "steps' all-reduces would sit in conditional graph nodes): set "
             "policies.spec.early_exit: false";
  }
  if (l.vocab_parallel && l.width() > 1)  // a stage of one GPU holds the whole vocabulary anyway
    return name +
           ": the runtime holds the whole embedding and LM head on every rank (no vocabulary "
           "split); give layout.vocab_parallel: false so the simulated twin prices the same";
  if (v.workload.arrival_rate_per_s > 0)
    return name +
           ": open-loop arrivals are admitted by each rank's own clock, so the ranks' plans "
           "could differ; real TP and PP runs need a closed loop (arrival_rate 0)";
  if (!env.mpi)
    return name +
           " needs one process per GPU under mpirun, and this twinstep was built without MPI";
  if (!env.nccl) return name + " needs NCCL, and this twinstep was built without it";
  if (env.world != l.world())
    return name + " needs one process per GPU: run it under `mpirun -np " +
           std::to_string(l.world()) + "` (this is " +
           (env.world == 1 ? std::string("a single process")
                           : "one of " + std::to_string(env.world) + " ranks") +
           ")";
  if (env.devices < env.local_ranks)
    return name + ": " + std::to_string(env.local_ranks) + " ranks on this node but " +
           std::to_string(env.devices) + " visible GPU(s); one GPU per rank is needed";
  return "";
}

RealLayoutEnv real_layout_env() {
  RealLayoutEnv env;
  env.world = launcher_world_size();
  env.local_ranks = local_ranks();
  env.mpi = mpi_built();
#ifdef TWINSTEP_HAVE_NCCL
  env.nccl = true;
#endif
#ifdef TWINSTEP_HAVE_RUNTIME
  if (cudaGetDeviceCount(&env.devices) != cudaSuccess) {
    (void)cudaGetLastError();
    env.devices = 0;
  }
#endif
  return env;
}

void check_real_spec_width(const Variant& v) {
#ifdef TWINSTEP_HAVE_RUNTIME
  if (v.policy.spec.method == SpecMethod::kNone) return;
  const LlamaConfig c = llama_config_from_spec(v.model);
  const int32_t width = v.policy.spec.max_draft() + 1, max = runtime::max_verify_width(c);
  if (width > max)
    throw Error("variant " + std::to_string(v.index) + " '" + v.label +
                "': speculative decoding of up to " + std::to_string(width - 1) +
                " draft tokens verifies " + std::to_string(width) +
                " positions per request, more than the runtime's " + std::to_string(max) +
                " for model " + v.model.name + " (" + std::to_string(c.q_heads / c.kv_heads) +
                " query heads per KV head: decode_attention's 64 query rows); draft at most " +
                std::to_string(max - 1));
#else
  (void)v;
#endif
}

void check_real_tensor_parallel(const Variant& v) {
  if (v.layout.world() == 1) return;
  if (const std::string why = real_layout_problem(v, real_layout_env()); !why.empty())
    throw Error(why);
}

void check_real_layouts(const Experiment& e) {
  if (!has_real(e)) return;
  std::string why;
  if (!real_backend_available(&why)) return;  // the real backend is skipped with a warning
  bool any_tp = false;
  for (const Variant& v : e.variants) {
    check_real_spec_width(v);
    check_real_tensor_parallel(v);
    any_tp = any_tp || v.layout.world() > 1;
  }
  if (!any_tp) return;
  // Under mpirun every real run is collective, so every real variant needs all ranks.
  for (const Variant& v : e.variants)
    if (v.layout.world() != launcher_world_size())
      throw Error("variant " + std::to_string(v.index) + " '" + v.label + "': layout " +
                  layout_name(v.layout) + " on the real backend in a job of " +
                  std::to_string(launcher_world_size()) +
                  " ranks: under mpirun every real variant of an experiment must use all ranks "
                  "(split tp1 and tp" +
                  std::to_string(launcher_world_size()) + " variants into separate experiments)");
}

std::string pack_timeline(const std::vector<TimelineSpan>& spans) {
  FinishedRun run;  // the run wire format, timeline alone: one encoder for both transports
  run.record.timeline = spans;
  return encode_finished_run(run);
}

std::vector<TimelineSpan> unpack_timeline(std::string_view bytes, int32_t rank) {
  std::vector<TimelineSpan> spans = decode_finished_run(bytes).record.timeline;
  for (TimelineSpan& t : spans) t.rank = rank;
  return spans;
}

std::optional<int64_t> timeline_offset_ns(const std::vector<TimelineSpan>& ref,
                                          const std::vector<TimelineSpan>& other) {
  // (step, name) -> launch spans' (start, end); names compare by text (another rank's are
  // interned copies).
  using Launches =
      std::map<std::pair<int64_t, std::string_view>, std::vector<std::pair<int64_t, int64_t>>>;
  auto launches = [](const std::vector<TimelineSpan>& spans) {
    Launches out;
    for (const TimelineSpan& t : spans)
      if (t.lane == Lane::kCompute && t.flow > 0)
        out[{t.step, t.name ? t.name : ""}].push_back({t.start_ns, t.start_ns + t.dur_ns});
    for (auto& [key, v] : out) std::sort(v.begin(), v.end());
    return out;
  };
  const Launches a = launches(ref), b = launches(other);
  std::vector<int64_t> d;
  for (const auto& [key, va] : a) {
    const auto it = b.find(key);
    if (it == b.end()) continue;
    for (size_t k = 0; k < std::min(va.size(), it->second.size()); ++k)
      d.push_back(va[k].second - it->second[k].second);
  }
  if (d.empty()) return std::nullopt;
  std::nth_element(d.begin(), d.begin() + std::ptrdiff_t(d.size() / 2), d.end());
  return d[d.size() / 2];
}

void append_rank_timeline(std::vector<TimelineSpan>& timeline,
                          const std::vector<TimelineSpan>& spans, int64_t offset_ns) {
  int64_t flow_base = 0;
  for (const TimelineSpan& t : timeline) flow_base = std::max(flow_base, t.flow);
  timeline.reserve(timeline.size() + spans.size());
  for (TimelineSpan t : spans) {
    t.start_ns += offset_ns;
    if (t.flow > 0) t.flow += flow_base;
    timeline.push_back(t);
  }
}

#ifdef TWINSTEP_HAVE_RUNTIME
namespace {

// FNV-1a over the step sequence: what every rank's DecodeLoop decided.
uint64_t plan_fingerprint(const RunRecord& r) {
  uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&](int64_t x) {
    for (int i = 0; i < 8; ++i) {
      h ^= uint64_t(x >> (8 * i)) & 0xff;
      h *= 0x100000001b3ULL;
    }
  };
  mix(int64_t(r.steps.size()));
  for (const StepSample& s : r.steps) {
    mix(s.step);
    mix(s.batch);
    mix(s.prefills);
    mix(s.tokens);
  }
  return h;
}

// Every rank's values through an NCCL sum over rank-owned slots: rank r writes `mine` at
// [offsets[r], offsets[r + 1]) of a zeroed buffer, so each sum is x + 0 + ... (exact). Returns the
// whole buffer (offsets.back() elements) on every rank. Collective: same offsets on every rank.
template <typename T>
std::vector<T> gather_slots(Communicator& comm, const std::vector<T>& mine,
                            const std::vector<size_t>& offsets, CommType type,
                            cudaStream_t stream) {
  static_assert(sizeof(T) == 4, "kF32 / kI32 elements");
  const size_t n = offsets.back(), at = offsets[size_t(comm.rank())];
  assert(offsets[size_t(comm.rank()) + 1] - at == mine.size());
  std::vector<T> all(n, T(0));
  std::copy(mine.begin(), mine.end(), all.begin() + std::ptrdiff_t(at));
  if (n == 0) return all;
  void* d = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&d, n * 4));
  TS_CUDA_CHECK(cudaMemcpyAsync(d, all.data(), n * 4, cudaMemcpyHostToDevice, stream));
  comm.all_reduce_sum(d, d, n, type, stream);
  comm.synchronize(stream, "gathering per-rank results");
  TS_CUDA_CHECK(cudaMemcpy(all.data(), d, n * 4, cudaMemcpyDeviceToHost));
  cudaFree(d);
  return all;
}

// Every rank's `values` (same length), rank r's at [r * size, (r + 1) * size).
std::vector<float> gather_floats(Communicator& comm, const std::vector<float>& values,
                                 cudaStream_t stream) {
  std::vector<size_t> offsets(size_t(comm.size()) + 1);
  for (size_t r = 0; r < offsets.size(); ++r) offsets[r] = r * values.size();
  return gather_slots(comm, values, offsets, CommType::kF32, stream);
}

// Every rank's bytes (any length), rank r's at index r: the lengths first, then the bytes as
// int32 words (the last one zero-padded).
std::vector<std::string> gather_bytes(Communicator& comm, const std::string& mine,
                                      cudaStream_t stream) {
  if (mine.size() > size_t(INT32_MAX))
    throw Error("tensor-parallel run: a rank's timeline exceeds 2 GiB; trace fewer steps");
  const size_t ranks = size_t(comm.size());
  std::vector<size_t> offsets(ranks + 1);
  for (size_t r = 0; r < offsets.size(); ++r) offsets[r] = r;
  const std::vector<int32_t> sizes =
      gather_slots<int32_t>(comm, {int32_t(mine.size())}, offsets, CommType::kI32, stream);
  for (size_t r = 0; r < ranks; ++r) offsets[r + 1] = offsets[r] + (size_t(sizes[r]) + 3) / 4;
  std::vector<int32_t> words((mine.size() + 3) / 4, 0);
  if (!mine.empty()) std::memcpy(words.data(), mine.data(), mine.size());
  const std::vector<int32_t> all = gather_slots(comm, words, offsets, CommType::kI32, stream);
  std::vector<std::string> out(ranks);
  for (size_t r = 0; r < ranks; ++r)
    out[r].assign(reinterpret_cast<const char*>(all.data() + offsets[r]), size_t(sizes[r]));
  return out;
}

double metric_value(const std::vector<Metric>& m, const std::string& key) {
  for (const Metric& x : m)
    if (x.key == key) return x.value;
  return -1;
}

}  // namespace
#endif

DistributedOutcome run_experiment_tp(DistributedSession& session, const Experiment& e,
                                     ResultsDb* db, Progress& progress,
                                     const std::atomic<bool>& stop) {
#ifndef TWINSTEP_HAVE_RUNTIME
  (void)session, (void)e, (void)db, (void)progress, (void)stop;
  throw Error("tensor-parallel real runs need the CUDA runtime, which this build lacks");
#else
  check_real_layouts(e);
  const bool root = session.rank() == 0;
  const std::vector<BackendKind> backends = runnable_backends(e, progress);
  // Selects this rank's GPU and joins the NCCL communicator (collective).
  Communicator& comm = runtime::tp_world_communicator();
  cudaStream_t stream = nullptr;
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DistributedOutcome out;
  const int64_t total = int64_t(e.variants.size() * backends.size());
  int64_t done = 0;
  for (const Variant& v : e.variants) {
    for (BackendKind b : backends) {
      if (b == BackendKind::kSim) {  // rank 0 alone
        if (root && !stop.load()) {
          progress.update(done, total, v.label + " [sim]");
          const int64_t id = db->begin_run(make_run_info(e, v, b));
          const FinishedRun run = execute_run(v, b);
          if (!run.error.empty()) {
            db->fail_run(id, "failed", run.error);
            out.failures.push_back("variant " + std::to_string(v.index) + " '" + v.label +
                                   "' [sim]: " + run.error);
          } else {
            db->finish_run(id, run.record, run.metrics, run.wall_s);
            out.stored.push_back({id, v.index, b});
          }
        }
        ++done;
        continue;
      }
      // Real: all ranks together. A stop on any rank stops every rank (else the others would
      // wait in the collectives forever).
      const std::vector<float> stops = gather_floats(comm, {stop.load() ? 1.0f : 0.0f}, stream);
      bool any_stop = false;
      for (float s : stops) any_stop = any_stop || s != 0;
      if (any_stop) {
        out.interrupted = true;
        if (root)
          progress.message("interrupted: " + std::to_string(done) + " of " + std::to_string(total) +
                           " runs done, the rest not started");
        TS_CUDA_CHECK(cudaStreamDestroy(stream));
        runtime::tp_release_world_communicator();
        return out;
      }
      progress.update(done, total, v.label + " [real, " + layout_name(v.layout) + "]");
      int64_t id = 0;
      if (root) id = db->begin_run(make_run_info(e, v, b));
      FinishedRun run = execute_run(v, b);
      if (!run.error.empty()) {
        // The other ranks may be waiting in a collective of this run: end the job.
        if (root) db->fail_run(id, "failed", run.error);
        throw Error("variant " + std::to_string(v.index) + " '" + v.label +
                    "' [real] failed on rank " + std::to_string(session.rank()) + ": " + run.error);
      }
      // Ranks agree on the step sequence; per-rank figures; the all-reduce of the decode message.
      const uint64_t fp = plan_fingerprint(run.record);
      const double tpot = metric_value(run.metrics, "tpot_ms_mean");
      const std::vector<std::string> keys = {"gpu_busy_frac", "idle_host_frac", "idle_launch_frac",
                                             "tpot_ms_mean"};
      std::vector<float> mine = {float(fp & 0xffffff), float((fp >> 24) & 0xffffff)};
      for (const std::string& k : keys) mine.push_back(float(metric_value(run.metrics, k)));
      const std::vector<float> all = gather_floats(comm, mine, stream);
      const size_t K = mine.size();
      for (int r = 1; r < comm.size(); ++r)
        if (all[size_t(r) * K] != all[0] || all[size_t(r) * K + 1] != all[1]) {
          const std::string why = "ranks diverged: rank " + std::to_string(r) +
                                  "'s step sequence differs from rank 0's";
          if (root) db->fail_run(id, "failed", why);
          throw Error("variant " + std::to_string(v.index) + " '" + v.label + "' [real]: " + why);
        }
      // Every rank's timeline to rank 0 (rank 0's own stays in place: it sends nothing; no
      // trace: nothing but the lengths travels).
      const bool send_timeline = !root && !run.record.timeline.empty();
      const std::vector<std::string> timelines = gather_bytes(
          comm, send_timeline ? pack_timeline(run.record.timeline) : std::string(), stream);
      const int64_t rows = runtime::Engine::bucket_for(std::max(1, v.workload.max_concurrency));
      // The decode all-reduce exists under tensor parallelism only (a pipeline sends instead).
      const bool tp = v.layout.tp > 1;
      const double ar_ns =
          tp ? runtime::time_graph_all_reduce_ns(comm, rows * v.model.hidden, 2 * 8, 20, stream)
             : 0.0;
      if (root) {
        for (int r = 0; r < comm.size(); ++r)
          for (size_t i = 0; i < keys.size(); ++i)
            run.metrics.push_back({"rank" + std::to_string(r) + "_" + keys[i],
                                   double(all[size_t(r) * K + 2 + i]),
                                   keys[i] == "tpot_ms_mean" ? "ms" : "fraction"});
        const std::vector<TimelineSpan> rank0 = run.record.timeline;
        for (int r = 1; r < comm.size(); ++r) {
          if (timelines[size_t(r)].empty()) continue;  // nothing traced on rank r
          std::vector<TimelineSpan> spans;
          try {
            spans = unpack_timeline(timelines[size_t(r)], r);
          } catch (const Error& err) {
            db->fail_run(id, "failed", err.what());
            throw;
          }
          const std::optional<int64_t> offset = timeline_offset_ns(rank0, spans);
          if (!offset)
            progress.message("real " + layout_name(v.layout) + " " + v.label + ": rank " +
                             std::to_string(r) +
                             "'s timeline has no launch in common with rank 0's; stored on its "
                             "own clock (time from its run start)");
          append_rank_timeline(run.record.timeline, spans, offset.value_or(0));
        }
        if (tp) {
          run.metrics.push_back({"tp_all_reduce_us", ar_ns / 1e3, "us"});
          run.metrics.push_back({"tp_all_reduce_layer_us", 2 * ar_ns / 1e3, "us"});
        }
        db->finish_run(id, run.record, run.metrics, run.wall_s);
        out.stored.push_back({id, v.index, b});
        progress.message("real " + layout_name(v.layout) + " " + v.label + ": TPOT " +
                         std::to_string(tpot) + " ms" +
                         (tp ? ", all-reduce of " + std::to_string(rows) + " x " +
                                   std::to_string(v.model.hidden) + " bf16 " +
                                   std::to_string(ar_ns / 1e3) + " us (in a graph)"
                             : std::string()) +
                         ", ranks agree");
      }
      ++done;
    }
  }
  progress.update(done, total, "done");
  progress.finish();
  TS_CUDA_CHECK(cudaStreamDestroy(stream));
  runtime::tp_release_world_communicator();  // before MPI_Finalize
  return out;
#endif
}

}  // namespace twinstep
