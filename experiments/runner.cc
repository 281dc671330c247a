#include "experiments/runner.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <tuple>

#include "experiments/tp_run.h"
#include "policies/decode_loop.h"
#include "policies/error.h"
#include "policies/rng.h"
#include "results/acceptance.h"
#include "simulator/sim_backend.h"
#ifdef TWINSTEP_HAVE_RUNTIME
#include <cuda_runtime_api.h>

#include "runtime/real_factory.h"
#endif

namespace twinstep {

#ifndef TWINSTEP_HAVE_RUNTIME
bool real_backend_available(std::string* why) {
  *why = "this build has no real CUDA runtime (configure with a CUDA compiler to build runtime/)";
  return false;
}
#endif

namespace {

// Runs one variant on this machine's GPU with the same policy objects the simulator runs.
RunRecord measure_variant(const Variant& v) {
#ifdef TWINSTEP_HAVE_RUNTIME
  // Tensor parallelism (experiments/tp_run.h): every rank runs this with its own shard.
  check_real_tensor_parallel(v);
  // Speculation runs on the real backend with a synthetic draft of fidelity
  // v.acceptance.draft_fidelity (runtime/real_factory.h); the rest of v.acceptance is the
  // simulator's model only.
  const std::vector<RequestSpec> requests = generate_requests(v.workload);
  RunRecord record;
  reserve_steps(record, step_capacity_hint(v.workload, requests));
  DecodeLoop loop(v.policy, v.workload, requests, &record);
  const std::unique_ptr<Backend> backend = make_real_backend(v, requests);
  HostProgram* ranks[] = {&loop};
  backend->run(ranks, record);
  return record;
#else
  (void)v;
  std::string why;
  real_backend_available(&why);
  throw Error(why);
#endif
}

std::string gpu_name() {
#ifdef TWINSTEP_HAVE_RUNTIME
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) return prop.name;
#endif
  return "";
}

}  // namespace

RunRecord simulate_variant(const Variant& v) {
  const std::vector<RequestSpec> requests = generate_requests(v.workload);
  RunRecord record;
  // One host program per rank (SPMD). Rank 0's requests are the ones the client sees; the
  // other ranks' request samples are discarded.
  const int32_t world = v.layout.world();
  reserve_steps(record, world * step_capacity_hint(v.workload, requests));
  std::vector<RunRecord> shadow(size_t(world - 1));
  std::vector<std::unique_ptr<DecodeLoop>> loops;
  std::vector<HostProgram*> ranks;
  for (int32_t r = 0; r < world; ++r) {
    loops.push_back(std::make_unique<DecodeLoop>(v.policy, v.workload, requests,
                                                 r == 0 ? &record : &shadow[size_t(r - 1)]));
    ranks.push_back(loops.back().get());
  }
  const HostCostModel host(v.host_costs, v.seed);
  SimOptions options;
  options.trace_first_step = v.trace.first_step;
  options.trace_steps = v.trace.step_count;
  options.spec = v.policy.spec;
  options.acceptance = v.acceptance;
  options.acceptance_seed = splitmix64(v.seed ^ 0x61636365707421ULL);  // "accept!"
  options.layout = v.layout;
  SimBackend backend(v.model, v.hardware, host, requests, options);
  backend.run(ranks, record);
  return record;
}

FinishedRun execute_run(const Variant& v, BackendKind backend) {
  FinishedRun run;
  run.variant_index = v.index;
  run.backend = backend;
  try {
    // Test hook: the failure path of sweeps (tests/report/distributed_test.sh).
    if (const char* fail = std::getenv("TWINSTEP_FAIL_VARIANT");
        fail && std::to_string(v.index) == fail) {
      throw Error("failure injected by TWINSTEP_FAIL_VARIANT=" + std::string(fail));
    }
    const auto t0 = std::chrono::steady_clock::now();
    run.record = backend == BackendKind::kReal ? measure_variant(v) : simulate_variant(v);
    run.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    run.metrics = compute_metrics(run.record, MetricsContext{v.hardware.stream_read_tbps});
  } catch (const std::exception& ex) {
    run.record = RunRecord{};
    run.metrics.clear();
    run.error = ex.what();
  }
  return run;
}

RunInfo make_run_info(const Experiment& e, const Variant& v, BackendKind b) {
  RunInfo info;
  info.experiment_name = e.name;
  info.yaml_text = e.yaml_text;
  info.source_path = e.source_path;
  info.variant_index = v.index;
  info.variant_label = v.label;
  info.variant_params = v.params;
  info.backend = backend_kind_name(b);
  info.seed = v.seed;
  if (b == BackendKind::kReal) info.gpu_name = gpu_name();
  return info;
}

int64_t store_run(const Experiment& e, const FinishedRun& run, ResultsDb& db) {
  const Variant& v = e.variants.at(static_cast<size_t>(run.variant_index));
  const int64_t run_id = db.begin_run(make_run_info(e, v, run.backend));
  if (!run.error.empty()) {
    db.fail_run(run_id, "failed", run.error);
  } else {
    db.finish_run(run_id, run.record, run.metrics, run.wall_s);
  }
  return run_id;
}

void check_backends_available(const Experiment& e) {
  check_real_layouts(e);  // multi-GPU real variants: mpirun, GPUs (experiments/tp_run.h)
  std::string why;
  for (BackendKind b : e.backends) {
    if (b == BackendKind::kSim || real_backend_available(&why)) return;
  }
  throw Error("experiment '" + e.name + "' asks only for the real backend, but " + why +
              "; nothing was run or written");
}

void resolve_calibrated_acceptance(Experiment& e, const std::string& db_path) {
  if (std::find(e.backends.begin(), e.backends.end(), BackendKind::kSim) == e.backends.end()) {
    return;
  }
  // One load per distinct source.
  std::map<std::tuple<std::string, std::string, std::string, int64_t, std::string, std::string>,
           std::shared_ptr<const AcceptanceTable>>
      loaded;
  for (Variant& v : e.variants) {
    const AcceptanceSource* s = v.acceptance.calibrated_from.get();
    if (s == nullptr || v.acceptance.calibrated) continue;
    const std::string path = s->db.empty() ? db_path : s->db;
    auto& table =
        loaded[{path, s->experiment, s->variant, s->run_id, s->bonus_experiment, s->bonus_variant}];
    if (!table) {
      if (path != ":memory:" && !std::filesystem::exists(path)) {
        throw Error(s->where + ": calibrated acceptance: results database " + path +
                    " does not exist");
      }
      ResultsDb db = ResultsDb::open(path);
      table = std::make_shared<const AcceptanceTable>(load_acceptance_table(db, *s));
    }
    const int32_t needs = v.policy.spec.method == SpecMethod::kNone ? 0 : v.policy.spec.max_draft();
    if (needs > table->draft_len) {
      throw Error(s->where + ": calibrated acceptance from " + table->source + " measured " +
                  std::to_string(table->draft_len) + "-token drafts, but variant '" + v.label +
                  "' drafts up to " + std::to_string(needs) +
                  " (calibrate with a chain at least that long)");
    }
    v.acceptance.calibrated = table;
  }
}

std::vector<BackendKind> runnable_backends(const Experiment& e, Progress& progress) {
  check_backends_available(e);
  std::vector<BackendKind> backends;
  for (BackendKind b : e.backends) {
    std::string why;
    if (b == BackendKind::kReal && !real_backend_available(&why)) {
      progress.warn("real backend skipped: " + why);
      continue;
    }
    backends.push_back(b);
  }
  return backends;
}

namespace {

// --resume: the runs not to start, by (variant index, backend): this experiment version's
// complete runs (their ids), and runs another live process is running now (id -1, named on
// stderr); runs a process that has ended left 'running' become 'interrupted'.
std::map<std::pair<int32_t, std::string>, int64_t> resume_state(const Experiment& e, ResultsDb& db,
                                                                Progress& progress) {
  const std::string hash = fnv1a64_hex(e.yaml_text);
  const QueryResult stale = db.query_params(
      "SELECT r.id, r.variant_index, r.backend, r.variant_label FROM run r "
      "JOIN experiment x ON x.id = r.experiment_id "
      "WHERE x.name = ?1 AND x.yaml_hash = ?2 AND r.status = 'running'",
      {Cell(e.name), Cell(hash)});
  std::map<std::pair<int32_t, std::string>, int64_t> complete;
  int64_t marked = 0;
  for (const auto& row : stale.rows) {
    const int64_t id = cell_int(row[0], "run.id");
    if (db.run_in_progress(id)) {
      const std::string backend = cell_text(row[2], "run.backend");
      complete[{int32_t(cell_int(row[1], "run.variant_index")), backend}] = -1;
      progress.warn("run " + std::to_string(id) + " (" + cell_text(row[3], "run.variant_label") +
                    " [" + backend + "]) is in progress in another process; not started here");
      continue;
    }
    db.fail_run(id, "interrupted", "process ended before the run finished (found by --resume)");
    ++marked;
  }
  if (marked > 0) {
    progress.warn("marked " + std::to_string(marked) +
                  " run(s) left running by an earlier process as interrupted");
  }
  const QueryResult done = db.query_params(
      "SELECT r.variant_index, r.backend, max(r.id) FROM run r "
      "JOIN experiment x ON x.id = r.experiment_id "
      "WHERE x.name = ?1 AND x.yaml_hash = ?2 AND r.status = 'complete' "
      "GROUP BY r.variant_index, r.backend",
      {Cell(e.name), Cell(hash)});
  for (const auto& row : done.rows) {
    complete[{int32_t(std::get<int64_t>(row[0])), std::get<std::string>(row[1])}] =
        std::get<int64_t>(row[2]);
  }
  return complete;
}

}  // namespace

std::vector<RunOutcome> run_experiment(const Experiment& e, ResultsDb& db, Progress& progress,
                                       const std::atomic<bool>& stop, bool resume) {
  const std::vector<BackendKind> backends = runnable_backends(e, progress);
  std::map<std::pair<int32_t, std::string>, int64_t> complete;
  if (resume) complete = resume_state(e, db, progress);
  std::vector<RunOutcome> out;
  const int64_t total = int64_t(e.variants.size() * backends.size());
  int64_t done = 0;
  int64_t skipped = 0;
  for (const Variant& v : e.variants) {
    for (BackendKind b : backends) {
      if (auto it = complete.find({v.index, backend_kind_name(b)}); it != complete.end()) {
        if (it->second >= 0) {
          out.push_back({it->second, v.index, b});
          ++skipped;
        }
        ++done;
        continue;
      }
      if (stop.load()) {
        progress.message("interrupted: " + std::to_string(done) + " of " + std::to_string(total) +
                         " runs stored, the rest not started");
        return out;
      }
      progress.update(done, total, v.label + " [" + backend_kind_name(b) + "]");
      // The run row exists while it simulates, so a killed process leaves it 'running'.
      const int64_t run_id = db.begin_run(make_run_info(e, v, b));
      const FinishedRun run = execute_run(v, b);
      if (!run.error.empty()) {
        db.fail_run(run_id, "failed", run.error);
        throw Error("variant " + std::to_string(v.index) + " '" + v.label +
                    "' failed: " + run.error);
      }
      db.finish_run(run_id, run.record, run.metrics, run.wall_s);
      out.push_back({run_id, v.index, b});
      ++done;
    }
  }
  progress.update(done, total, "done");
  progress.finish();
  if (skipped > 0) {
    progress.warn("resumed: " + std::to_string(skipped) + " of " + std::to_string(total) +
                  " runs were already complete and were not run again");
  }
  return out;
}

}  // namespace twinstep
