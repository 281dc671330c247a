// twinstep: the command line. Results go to stdout, progress and errors to stderr; a failure
// the user can act on prints "twinstep: <what>" and exits 1 (2 for usage errors).
#include <stdlib.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "experiments/distributed.h"
#include "experiments/experiment.h"
#include "experiments/import.h"
#include "experiments/plot.h"
#include "experiments/progress.h"
#include "experiments/report.h"
#include "experiments/runner.h"
#include "policies/calibration_model.h"
#include "policies/calibration_profile.h"
#include "policies/decode_loop.h"
#include "policies/error.h"
#include "policies/layout.h"
#include "results/build_info.h"
#include "results/compare.h"
#include "results/db.h"
#include "results/format.h"
#include "results/metrics.h"
#include "results/trace.h"
#include "runtime/checkpoint.h"
#include "simulator/calibration.h"
#include "simulator/calibration_eval.h"
#include "simulator/sim_backend.h"
#ifdef TWINSTEP_HAVE_RUNTIME
#include "runtime/calibrate.h"
#include "runtime/tensor_parallel.h"
#endif
#ifdef TWINSTEP_HAVE_NCCL_CALIBRATE
#include "runtime/nccl_calibrate.h"
#endif

namespace twinstep {
namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_signal(int) { g_stop.store(true); }

constexpr const char* kDefaultDb = "results/twinstep.db";

// Opens (creating it if needed, for commands that write runs) the results database at `path`
// and notes on stderr the runs in it that never completed.
ResultsDb open_db(const std::string& path) {
  if (path == kDefaultDb) std::filesystem::create_directories("results");
  ResultsDb db = ResultsDb::open(path);
  const std::vector<int64_t> bad = db.incomplete_runs();
  if (!bad.empty()) {
    std::string ids;
    for (size_t i = 0; i < bad.size() && i < 10; ++i)
      ids += (i ? ", " : "") + std::to_string(bad[i]);
    if (bad.size() > 10) ids += ", ...";
    std::fprintf(stderr,
                 "twinstep: note: %zu run(s) in %s never completed (interrupted or failed): %s; "
                 "see: twinstep query \"SELECT id, status, error FROM run WHERE status != "
                 "'complete'\"; finish them with twinstep run --resume FILE\n",
                 bad.size(), path.c_str(), ids.c_str());
  }
  return db;
}

// open_db for commands that only read (query, compare, trace, plot, report): a database that
// does not exist is an error, not a new empty file.
ResultsDb open_existing_db(const std::string& path) {
  const bool special = path == ":memory:" || path.rfind("file:", 0) == 0;
  std::error_code ec;
  if (!special && !std::filesystem::exists(path, ec)) {
    if (path == kDefaultDb) {
      throw Error("no results database at " + path +
                  ": run an experiment first (twinstep run FILE.yaml), or name one with --db");
    }
    throw Error("results database " + path + " does not exist (--db names the file " +
                "`twinstep run` wrote)");
  }
  return open_db(path);
}

void print_table(const QueryResult& r, OutputFormat f) { write_result(r, f, std::cout); }

QueryResult table(std::vector<std::string> columns) { return QueryResult{std::move(columns), {}}; }

int cmd_models(OutputFormat f) {
  QueryResult t = table({"model", "layers", "hidden", "params_b", "active_params_b", "weights_gb",
                         "kv_bytes_per_token", "state_bytes_per_request"});
  for (const std::string& name : model_preset_names()) {
    const ModelSpec& m = model_preset(name);
    t.rows.push_back({name, int64_t(m.layers.size()), m.hidden, double(m.param_count()) / 1e9,
                      double(m.active_param_count()) / 1e9, double(m.weight_bytes_total()) / 1e9,
                      m.kv_bytes_per_token(), m.state_bytes_per_request()});
  }
  print_table(t, f);
  return 0;
}

int cmd_hardware(OutputFormat f, bool sources) {
  QueryResult t = table({"hardware", "hbm_gb", "hbm_tbps", "stream_read_tbps", "bf16_tflops", "sms",
                         "eager_launch_us", "graph_node_gap_us"});
  if (sources) t.columns.push_back("source");
  for (const std::string& name : hardware_names()) {  // presets, then calibrated profiles
    const HardwareSpec h = hardware_by_name(name);
    std::vector<Cell> row = {name,
                             double(h.hbm_bytes) / 1e9,
                             h.hbm_tbps,
                             h.stream_read_tbps,
                             h.bf16_tflops,
                             int64_t(h.sm_count),
                             double(h.eager_launch_ns) / 1e3,
                             double(h.graph_node_gap_ns) / 1e3};
    if (sources) row.push_back(h.source);
    t.rows.push_back(std::move(row));
  }
  print_table(t, f);
  return 0;
}

int cmd_validate(const std::string& file) {
  const Experiment e = load_experiment_file(file);
  std::printf("ok: %s: experiment '%s', %zu variant(s), backends:", file.c_str(), e.name.c_str(),
              e.variants.size());
  for (BackendKind b : e.backends) std::printf(" %s", backend_kind_name(b));
  std::printf("\n");
  for (const Variant& v : e.variants) std::printf("  %d  %s\n", v.index, v.label.c_str());
  return 0;
}

// The comparison printed after a run, and compare's side by side: for people (table format), a
// run per column up to kMaxColumns runs, then a run per row; CSV and JSON keep a run per column.
// `run` prints up to kMaxRunRows runs; for a larger sweep a pointer to `compare` instead.
constexpr size_t kMaxColumns = 12;
constexpr size_t kMaxRunRows = 64;

void print_run_summary(const Experiment& e, ResultsDb& db, const std::string& db_path,
                       const std::vector<int64_t>& ids, OutputFormat f) {
  if (ids.empty()) return;
  const auto [lo, hi] = std::minmax_element(ids.begin(), ids.end());
  std::printf("experiment %s: %zu run(s) stored in %s (run ids %lld..%lld)\n", e.name.c_str(),
              ids.size(), db_path.c_str(), (long long)*lo, (long long)*hi);
  if (ids.size() <= kMaxColumns) {
    print_table(compare_runs(db, ids), f);
  } else if (ids.size() <= kMaxRunRows) {
    print_table(f == OutputFormat::kTable ? compare_runs_by_run(db, ids) : compare_runs(db, ids),
                f);
  } else {
    std::printf(
        "compare runs side by side with: twinstep --db %s compare <run ids>, or see them "
        "all with: twinstep --db %s report --experiment %s\n",
        db_path.c_str(), db_path.c_str(), e.name.c_str());
  }
}

int cmd_run(const std::string& file, const std::string& db_path, bool quiet, bool resume,
            OutputFormat f) {
  // Validate everything before the database is touched.
  Experiment e = load_experiment_file(file);
  check_backends_available(e);
  resolve_calibrated_acceptance(e, db_path);
  DistributedSession session;  // refuses a multi-rank launch in a build without MPI
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  if (!session.distributed()) {
    ResultsDb db = open_db(db_path);
    Progress progress(quiet);
    const std::vector<RunOutcome> runs = run_experiment(e, db, progress, g_stop, resume);
    std::vector<int64_t> ids;
    for (const RunOutcome& r : runs) ids.push_back(r.run_id);
    print_run_summary(e, db, db_path, ids, f);
    return g_stop.load() ? 130 : 0;
  }

  // Under mpirun: rank 0 owns the database; any infrastructure error ends every rank.
  try {
    std::optional<ResultsDb> db;
    if (resume) throw Error("--resume is for single-process runs (not under mpirun)");
    if (session.rank() == 0) db.emplace(open_db(db_path));
    Progress progress(quiet || session.rank() != 0);
    if (session.rank() == 0) {
      progress.message("distributed run: " + std::to_string(e.variants.size()) +
                       " variant(s) over " + std::to_string(session.size()) + " ranks");
    }
    const DistributedOutcome outcome =
        run_experiment_distributed(session, e, db ? &*db : nullptr, progress, g_stop);
    if (session.rank() != 0) return outcome.interrupted ? 130 : 0;
    std::vector<int64_t> ids;
    for (const RunOutcome& r : outcome.stored) ids.push_back(r.run_id);
    print_run_summary(e, *db, db_path, ids, f);
    if (!outcome.failures.empty()) {
      std::fflush(stdout);
      std::fprintf(stderr, "twinstep: %zu run(s) failed (stored with status 'failed'):\n",
                   outcome.failures.size());
      for (const std::string& what : outcome.failures) {
        std::fprintf(stderr, "twinstep:   %s\n", what.c_str());
      }
      return 1;
    }
    return outcome.interrupted ? 130 : 0;
  } catch (const std::exception& ex) {
    std::fflush(stdout);
    std::fprintf(stderr, "twinstep: rank %d of %d: %s\n", session.rank(), session.size(),
                 ex.what());
    session.abort(1);
  }
}

int cmd_query(const std::string& sql, const std::string& db_path, OutputFormat f) {
  ResultsDb db = open_existing_db(db_path);
  print_table(db.query(sql), f);
  return 0;
}

// The runs a command reads: `run_ids` if given, else the latest runs of `experiment` (default:
// the experiment of the latest complete run). Sets *experiment to the experiment's name.
std::vector<int64_t> resolve_runs(ResultsDb& db, const std::vector<int64_t>& run_ids,
                                  std::string* experiment) {
  if (!run_ids.empty()) {
    if (experiment->empty()) {
      const QueryResult r = db.query_params(
          "SELECT e.name FROM run r JOIN experiment e ON e.id = r.experiment_id WHERE r.id = ?1",
          {run_ids.front()});
      if (r.rows.empty()) throw Error("no run with id " + std::to_string(run_ids.front()));
      *experiment = std::get<std::string>(r.rows[0][0]);
    }
    return run_ids;
  }
  if (experiment->empty()) {
    const QueryResult r = db.query(
        "SELECT e.name FROM run r JOIN experiment e ON e.id = r.experiment_id "
        "WHERE r.status = 'complete' ORDER BY r.id DESC LIMIT 1");
    if (r.rows.empty())
      throw Error("no complete runs in " + db.path() + "; run an experiment first");
    *experiment = std::get<std::string>(r.rows[0][0]);
  }
  return latest_runs_of_experiment(db, *experiment);
}

// Exit status when --tolerance is exceeded: distinct from errors (1) and usage (2).
constexpr int kToleranceExceeded = 3;

int cmd_compare(const std::vector<int64_t>& run_ids, std::string experiment,
                const std::string& db_path, OutputFormat f, bool sim_real, bool ops,
                bool collectives, double tolerance_pct, const std::vector<std::string>& metrics,
                bool metrics_given, bool accept, double accept_tolerance) {
  ResultsDb db = open_existing_db(db_path);
  const std::vector<int64_t> ids = resolve_runs(db, run_ids, &experiment);
  if (accept || accept_tolerance >= 0) {
    double worst = 0;
    const QueryResult table = sim_vs_real_accept(db, ids, &worst);
    if (table.rows.empty()) {
      throw Error(
          "no variant has a simulated and a measured run that both stored verify rounds among "
          "these runs (a speculative policy, run on both backends)");
    }
    print_table(table, f);
    if (accept_tolerance >= 0 && worst > accept_tolerance) {
      std::fprintf(stderr,
                   "twinstep: simulated vs measured mean accept length differ by up to %.3f "
                   "tokens, over the tolerance of %.3f\n",
                   worst, accept_tolerance);
      return kToleranceExceeded;
    }
    if (!sim_real && tolerance_pct < 0 && !ops && !collectives) return 0;
  }
  if (collectives) {
    const QueryResult table = sim_vs_real_collective_waits(db, ids);
    if (table.rows.empty()) {
      throw Error(
          "no variant has a simulated and a measured run of two or more ranks that both stored a "
          "timeline among these runs (a multi-rank layout with `trace:`, run on both backends)");
    }
    print_table(table, f);
    if (!sim_real && tolerance_pct < 0 && !ops) return 0;
  }
  if (ops) {
    const QueryResult table = sim_vs_real_ops(db, ids);
    if (table.rows.empty()) {
      throw Error(
          "no variant has a simulated and a measured run that both stored a timeline among these "
          "runs (add `trace: {first_step: N, steps: K}` to the experiment and run both backends)");
    }
    print_table(table, f);
    if (!sim_real && tolerance_pct < 0) return 0;
  }
  if (!sim_real && tolerance_pct < 0) {
    const bool by_run = f == OutputFormat::kTable && ids.size() > kMaxColumns;
    print_table(by_run ? compare_runs_by_run(db, ids) : compare_runs(db, ids), f);
    return 0;
  }
  double worst = 0;
  std::vector<std::string> uncompared;
  const QueryResult table = sim_vs_real(db, ids, metrics, &worst, &uncompared);
  for (const std::string& u : uncompared)
    std::fprintf(stderr, "twinstep: not compared: %s\n", u.c_str());
  if (table.rows.empty()) {
    throw Error(uncompared.empty()
                    ? "no variant has both a simulated and a measured (real) run among these runs"
                    : "nothing compared (the lines above say why)");
  }
  // A gate must not pass on a metric it was asked for and never compared (one these runs do not
  // store); the default list names each one it could not compare above and gates on the rest.
  if (tolerance_pct >= 0 && metrics_given)
    for (const std::string& key : metrics) {
      const bool compared = std::any_of(table.rows.begin(), table.rows.end(), [&](const auto& row) {
        return std::get<std::string>(row[1]) == key;
      });
      if (!compared)
        throw Error("compare --tolerance: no variant has " + key +
                    " in both its simulated and measured run, so the gate cannot check it "
                    "(leave it out of --metrics)");
    }
  print_table(table, f);
  if (tolerance_pct >= 0 && worst > tolerance_pct) {
    std::fprintf(stderr,
                 "twinstep: simulated vs measured error up to %.2f%%, over the tolerance "
                 "of %.2f%%\n",
                 worst, tolerance_pct);
    return kToleranceExceeded;
  }
  return 0;
}

void report_skipped(const std::vector<Figure>& figures) {
  for (const Figure& fig : figures) {
    if (fig.path.empty()) {
      std::fprintf(stderr, "twinstep: figure %s skipped: %s\n", fig.name.c_str(),
                   fig.skipped.c_str());
    }
  }
}

int cmd_plot(const std::vector<int64_t>& run_ids, std::string experiment,
             const std::string& out_dir, const std::string& db_path) {
  ResultsDb db = open_existing_db(db_path);
  const std::vector<int64_t> ids = resolve_runs(db, run_ids, &experiment);
  PlotOptions options;
  options.out_dir = out_dir;
  const std::vector<Figure> figures = plot_runs(db, ids, options);
  for (const Figure& fig : figures) {
    if (!fig.path.empty()) std::printf("wrote %s\n", fig.path.c_str());
  }
  report_skipped(figures);
  return 0;
}

int cmd_report(const std::vector<int64_t>& run_ids, std::string experiment, std::string out_path,
               const std::string& db_path) {
  ResultsDb db = open_existing_db(db_path);
  const std::vector<int64_t> ids = resolve_runs(db, run_ids, &experiment);
  if (out_path.empty()) {
    std::filesystem::create_directories("results");
    out_path = "results/" + experiment + ".html";
  }
  std::string scratch =
      (std::filesystem::temp_directory_path() / "twinstep-report-XXXXXX").string();
  if (!mkdtemp(scratch.data())) throw Error("cannot create a temporary directory");
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{scratch};
  PlotOptions options;
  options.out_dir = scratch;
  const std::vector<Figure> figures = plot_runs(db, ids, options);
  report_skipped(figures);
  const std::string tmp = out_path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) throw Error("cannot write " + tmp);
    write_report(db, experiment, ids, figures, out);
    if (!out.flush()) throw Error("error writing " + tmp);
  }
  std::filesystem::rename(tmp, out_path);
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}

int cmd_trace(int64_t run_id, const std::string& out_path, const std::string& db_path) {
  ResultsDb db = open_existing_db(db_path);
  if (out_path.empty() || out_path == "-") {
    write_chrome_trace(db, run_id, std::cout);
    return 0;
  }
  // Write to a temporary file and rename, so a failure leaves no half-written trace.
  const std::string tmp = out_path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) throw Error("cannot write " + tmp);
    write_chrome_trace(db, run_id, out);
    if (!out.flush()) throw Error("error writing " + tmp);
  }
  std::filesystem::rename(tmp, out_path);
  std::fprintf(stderr, "twinstep: wrote %s (open in ui.perfetto.dev or chrome://tracing)\n",
               out_path.c_str());
  return 0;
}

// Per-rank memory and full-token KV capacity of a model on a GPU across layouts (seed 004's
// "full-token capacity": the full-attention KV tokens a rank holds after weights and buffers).
int cmd_capacity(const std::string& model, const std::string& hardware,
                 const std::vector<std::string>& layouts, bool seed004, OutputFormat f) {
  const std::vector<LayoutSpec> specs = seed004 ? seed004_capacity_layouts(layouts) : [&] {
    std::vector<LayoutSpec> v;
    for (const std::string& name : layouts) v.push_back(parse_layout(name));
    return v;
  }();
  const CapacityTable table = capacity_table(model_preset(model), hardware_preset(hardware), specs);
  QueryResult out{table.columns, {}};
  for (size_t i = 0; i < table.rows.size(); ++i) {
    std::vector<Cell> row;
    for (const CapacityCell& c : table.cells(i)) {
      std::visit([&](const auto& x) { row.push_back(Cell(x)); }, c);
    }
    out.rows.push_back(std::move(row));
  }
  print_table(out, f);
  return 0;
}

int cmd_import(const std::vector<std::string>& records, const std::string& experiment_file,
               const std::string& db_path) {
  const Experiment e = load_experiment_file(experiment_file);
  // Every record read and matched before the database is opened: a malformed one refuses the
  // command with nothing written and no new file.
  std::vector<RecordImport> plans;
  std::vector<std::vector<std::string>> unmatched_of(records.size());
  for (size_t i = 0; i < records.size(); ++i)
    plans.push_back(read_record(records[i], e, &unmatched_of[i]));
  ResultsDb db = open_db(db_path);
  for (size_t i = 0; i < records.size(); ++i) {
    const std::string& record = records[i];
    const std::vector<std::string>& unmatched = unmatched_of[i];
    const std::vector<ImportedRun> runs = store_record(db, plans[i], e);
    std::printf("%s: %zu measured run(s) stored as experiment %s", record.c_str(), runs.size(),
                e.name.c_str());
    if (!runs.empty()) {
      std::printf(" (run ids %lld..%lld)", (long long)runs.front().run_id,
                  (long long)runs.back().run_id);
    }
    std::printf("\n");
    for (const std::string& label : unmatched) {
      std::printf("  no row of %s matches variant %s\n", record.c_str(), label.c_str());
    }
  }
  return 0;
}

int cmd_make_checkpoint(const std::string& preset, const std::string& dir, uint64_t seed,
                        uint64_t shard_mb, double draft_fidelity) {
  const ModelSpec& model = model_preset(preset);
  write_synthetic_checkpoint(model, dir, seed, int64_t(shard_mb) << 20, draft_fidelity);
  const double bytes = double(model.weight_bytes_total());
  char size[32];
  if (bytes >= 1e9) {
    std::snprintf(size, sizeof size, "%.2f GB", bytes / 1e9);
  } else {
    std::snprintf(size, sizeof size, "%.1f MB", bytes / 1e6);
  }
  char draft[64] = "";
  if (draft_fidelity >= 0)
    std::snprintf(draft, sizeof draft, ", a draft module (mtp.*) at fidelity %g", draft_fidelity);
  std::printf("wrote %s: synthetic %s checkpoint (%s of bf16 weights, seed %llu%s)\n", dir.c_str(),
              preset.c_str(), size, (unsigned long long)seed, draft);
  return 0;
}

// Stores `record` as one run in a new database file under a fresh temporary directory (removed
// afterwards) and prints how long that took: metrics, then finish_run's one transaction.
void bench_store(const RunRecord& record) {
  namespace fs = std::filesystem;
  std::string templ = (fs::temp_directory_path() / "twinstep_bench_store_XXXXXX").string();
  if (mkdtemp(templ.data()) == nullptr) {
    throw Error("bench-sim --store: cannot create a directory under " +
                fs::temp_directory_path().string() + ": " + std::strerror(errno));
  }
  const fs::path dir = templ;
  struct RemoveDir {
    fs::path dir;
    ~RemoveDir() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove{dir};
  const std::string path = (dir / "bench.db").string();
  std::vector<Metric> metrics;
  std::chrono::steady_clock::time_point t0, t1, t2;
  {
    ResultsDb db = ResultsDb::open(path);
    RunInfo info;
    info.experiment_name = "bench_sim";
    info.yaml_text = "name: bench_sim\n";
    info.variant_label = "bench";
    info.backend = "sim";
    info.seed = 1;
    const int64_t run_id = db.begin_run(info);
    t0 = std::chrono::steady_clock::now();
    metrics = compute_metrics(record, MetricsContext{hardware_preset("h200").stream_read_tbps});
    t1 = std::chrono::steady_clock::now();
    db.finish_run(run_id, record, metrics, 0.0);
    t2 = std::chrono::steady_clock::now();
  }  // closed: the write-ahead log is merged into the database file
  const double metrics_s = std::chrono::duration<double>(t1 - t0).count();
  const double write_s = std::chrono::duration<double>(t2 - t1).count();
  const size_t rows = record.steps.size() + record.chunks.size() + record.requests.size() +
                      record.timeline.size() + record.rounds.size() + metrics.size();
  std::error_code ec;
  const uintmax_t bytes = fs::file_size(path, ec);
  std::printf("  store: metrics             %.3f s\n", metrics_s);
  std::printf(
      "  store: one transaction     %.3f s   (%zu rows: %zu steps, %zu chunks, %zu other)\n",
      write_s, rows, record.steps.size(), record.chunks.size(),
      rows - record.steps.size() - record.chunks.size());
  std::printf("  store: rows / s            %.0f\n", double(rows) / write_s);
  std::printf("  store: database file       %.1f MB  (in %s)\n", double(bytes) / 1e6,
              fs::temp_directory_path().c_str());
}

// The simulator speed benchmark of the foundation issue: 1000 requests of 8192 in / 1024 out at
// concurrency 1, llama-3-8b on the h200 profile, run-ahead with graphs, no tracing, one thread.
// With `store`, then the time to store that run in a new database (what `run` does next).
int cmd_bench_sim(int32_t requests, bool store) {
  WorkloadSpec w;
  w.input_len = {8192, 8192};
  w.output_len = {1024, 1024};
  w.num_requests = requests;
  w.max_concurrency = 1;
  w.seed = 1;
  PolicySpec policy;  // run-ahead, depth 1, CUDA graphs
  HostCostSpec costs;
  costs.ops[size_t(HostOp::kSchedule)] = {DistKind::kNormal, 150'000, 15'000};
  costs.ops[size_t(HostOp::kPreparePrefill)] = {DistKind::kNormal, 2'000'000, 100'000};
  costs.ops[size_t(HostOp::kPrepareDecode)] = {DistKind::kNormal, 485'000, 40'000};
  costs.ops[size_t(HostOp::kProcessOutputs)] = {DistKind::kLognormal, 250'000, 60'000};

  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<RequestSpec> reqs = generate_requests(w);
  RunRecord record;
  reserve_steps(record, step_capacity_hint(w, reqs));  // as simulate_variant does
  DecodeLoop loop(policy, w, reqs, &record);
  const HostCostModel host(costs, 1);
  SimBackend backend(model_preset("llama-3-8b"), hardware_preset("h200"), host, reqs);
  HostProgram* ranks[] = {&loop};
  backend.run(ranks, record);
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int64_t tokens = 0;
  for (const ChunkSample& c : record.chunks) tokens += c.tokens;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double peak_mb = double(usage.ru_maxrss) / 1024.0;
  std::printf(
      "bench sim: llama-3-8b, h200, run-ahead + CUDA graphs, %d requests x 8192 in / "
      "1024 out, concurrency 1, no trace\n",
      requests);
  std::printf("  decode steps simulated     %zu\n", record.steps.size());
  std::printf("  simulated time             %.1f s\n", double(record.end_ns) / 1e9);
  std::printf("  wall time                  %.3f s   (target < 1.000 s for 1000 requests)\n",
              wall_s);
  std::printf("  simulated tokens / wall s  %.0f\n", double(tokens) / wall_s);
  std::printf("  wall time per step         %.0f ns\n", wall_s * 1e9 / double(record.steps.size()));
  std::printf("  peak memory (max RSS)      %.1f MB  (target < 200 MB)\n", peak_mb);
  std::printf(
      "  reference: Vidur, 1000 requests of 512/256 on a 2-core machine: 49.6 s, "
      "~5,200 simulated tokens / s, 1.1 GB (ANCHORS.md)\n");
  if (store) bench_store(record);
  return 0;
}

// `twinstep calibrate` (docs/calibration.md): measure this GPU (or, with fit_only, take the
// latest calibration session stored in the database), fit, write the profile, print the fit.
struct CalibrateGrid {
  std::vector<int> contexts, batches;  // empty: the default grid
  std::vector<int64_t> sessions;       // --fit-only: the sessions fitted together (empty: latest)
  // --fit-only: the sessions of `sessions` whose spec_graph samples are fitted (empty: all), for
  // speculative graphs measured again in a later session of the same database.
  std::vector<int64_t> spec_sessions;
  int tp = 1;  // > 1: rank 0's shard of tp-way tensor parallelism
  // Speculative graphs (runtime/calibrate.h CalibrateOptions::spec, spec_only, spec_batches).
  bool no_spec = false;
  bool spec_only = false;
  std::vector<int> spec_batches;
  int spec_capacity_tokens = 0;  // CalibrateOptions::spec_capacity_tokens
  int spec_partitions = 3;       // CalibrateOptions::spec_partitions
  bool partition_only = false;   // CalibrateOptions::partition_only
  // Prefill passes (CalibrateOptions::prefill, prefill_only, prefill_tokens).
  bool no_prefill = false;
  bool prefill_only = false;
  std::vector<int> prefill_tokens;
  bool breaks_only = false;         // CalibrateOptions::breaks_only (with --tp N)
  bool in_situ = false;             // CalibrateOptions::in_situ (with --breaks-only, under mpirun)
  std::vector<std::string> fusion;  // CalibrateOptions::fusion: "norms", "rope"
  // Profiles whose collective calibration (calibrate-nccl) is kept: the first as a whole, the
  // others' tables (merge_collectives).
  std::vector<std::string> collectives_from;
  // Held-out evaluation of the fitted profile (calibrate-eval): sessions of this database.
  std::string evaluate_db;
  std::vector<int64_t> evaluate_sessions;  // empty: the latest
  bool evaluate_by_batch = false;
};

// The samples of calibration sessions `ids` (empty: the latest) of the existing database `path`.
std::vector<CalibrationSample> stored_calibration_samples(const std::string& path,
                                                          const std::vector<int64_t>& ids) {
  if (!std::filesystem::exists(path)) {
    throw ConfigError("", "results database " + path + " does not exist");
  }
  ResultsDb db = ResultsDb::open(path);
  std::vector<CalibrationSample> out;
  for (const int64_t id : ids.empty() ? std::vector<int64_t>{0} : ids) {
    if (id < 1 && !ids.empty())
      throw ConfigError("", "session ids are >= 1, got " + std::to_string(id));
    std::vector<CalibrationSample> part = db.calibration_samples(id);
    out.insert(out.end(), std::make_move_iterator(part.begin()),
               std::make_move_iterator(part.end()));
  }
  return out;
}

// Prints the held-out evaluation (simulator/calibration_eval.h) of `hw` on stored sessions.
void print_evaluation(const HardwareSpec& hw, const std::string& path,
                      const std::vector<int64_t>& ids, bool by_batch) {
  std::string which;
  for (const int64_t id : ids) which += (which.empty() ? "" : ",") + std::to_string(id);
  std::printf("evaluation of profile '%s' on %s, calibration session(s) %s\n", hw.name.c_str(),
              path.c_str(), which.empty() ? "latest" : which.c_str());
  const CalibrationEvaluation e = evaluate_calibration(hw, stored_calibration_samples(path, ids));
  std::printf("%s", evaluation_report(e, by_batch).c_str());
}

// `twinstep calibrate-eval`: a profile (file, or a name hardware: accepts) against stored
// calibration sessions it was not fitted on.
int cmd_calibrate_eval(const std::string& profile, const std::string& db_path,
                       const std::vector<int64_t>& sessions, bool by_batch) {
  const HardwareSpec hw = std::filesystem::exists(profile) ? load_calibration_profile(profile).hw
                                                           : hardware_by_name(profile);
  print_evaluation(hw, db_path, sessions, by_batch);
  return 0;
}

// --fusion's names as a KernelFusion; ConfigError for another name.
KernelFusion calibrate_fusion(const std::vector<std::string>& names) {
  KernelFusion f;
  for (const std::string& n : names) {
    if (n == "norms") {
      f.norms = true;
    } else if (n == "rope") {
      f.rope = true;
    } else {
      throw ConfigError(
          "", "--fusion takes norms and rope (policies.fusion's fields), got '" + n + "'");
    }
  }
  return f;
}

#ifdef TWINSTEP_HAVE_RUNTIME
// What `twinstep calibrate` measures, from its flags.
runtime::CalibrateOptions calibrate_options(bool quick, const std::vector<std::string>& models,
                                            const CalibrateGrid& grid) {
  runtime::CalibrateOptions o;
  o.quick = quick;
  if (!models.empty()) o.models = models;
  o.contexts = grid.contexts;
  o.tp = grid.tp;
  o.batches = grid.batches;
  o.spec = !grid.no_spec;
  o.spec_only = grid.spec_only;
  o.spec_batches = grid.spec_batches;
  o.spec_capacity_tokens = grid.spec_capacity_tokens;
  o.spec_partitions = grid.spec_partitions;
  o.partition_only = grid.partition_only;
  o.prefill = !grid.no_prefill;
  o.prefill_only = grid.prefill_only;
  o.prefill_tokens = grid.prefill_tokens;
  o.breaks_only = grid.breaks_only;
  o.in_situ = grid.in_situ;
  o.fusion = calibrate_fusion(grid.fusion);
  return o;
}
#endif

int cmd_calibrate(const std::string& out_path, const std::string& db_path, bool quick,
                  bool fit_only, std::string base, const std::vector<std::string>& models,
                  const CalibrateGrid& grid, const std::string& command) {
  const std::string name = std::filesystem::path(out_path).stem().string();
  if (std::filesystem::path(out_path).extension() != ".yaml" || name.empty()) {
    throw ConfigError(
        "", "--out must name a .yaml file (its stem is the profile name), got '" + out_path + "'");
  }
  // --in-situ: one process per GPU under mpirun; every rank measures (the same launches, so the
  // collectives meet), rank 0 alone stores and fits; an error on any rank ends every rank.
  std::optional<DistributedSession> session;
  if (grid.in_situ) {
    if (fit_only || !grid.breaks_only || grid.tp < 2)
      throw ConfigError("",
                        "--in-situ measures a TP shard's steps with its real collectives: "
                        "give it with --breaks-only --tp N, under mpirun -np N");
    session.emplace();
  }
#ifdef TWINSTEP_HAVE_RUNTIME
  auto abort_ranks = [&](const std::exception& ex) {
    std::fflush(stdout);
    std::fprintf(stderr, "twinstep: rank %d of %d: %s\n", session->rank(), session->size(),
                 ex.what());
    session->abort(1);
  };
  if (session && session->rank() != 0) {
    try {
      (void)runtime::run_calibration(calibrate_options(quick, models, grid));
      runtime::tp_release_world_communicator();  // before MPI_Finalize
    } catch (const std::exception& ex) {
      abort_ranks(ex);
    }
    return 0;
  }
#endif
  std::vector<CalibrationSample> samples;
  ProfileHeader header;
  if (!fit_only && !grid.sessions.empty())
    throw ConfigError("", "--sessions selects stored sessions to refit: give it with --fit-only");
  for (const int64_t id : grid.spec_sessions) {
    if (std::find(grid.sessions.begin(), grid.sessions.end(), id) == grid.sessions.end())
      throw ConfigError("", "--spec-sessions chooses among the refitted sessions: " +
                                std::to_string(id) + " is not one of --sessions (with --fit-only)");
  }
  if (fit_only &&
      (grid.spec_only || grid.no_spec || !grid.spec_batches.empty() ||
       grid.spec_capacity_tokens != 0 || grid.spec_partitions != CalibrateGrid{}.spec_partitions ||
       grid.partition_only || grid.prefill_only || grid.no_prefill ||
       !grid.prefill_tokens.empty() || grid.breaks_only))
    throw ConfigError(
        "",
        "--spec-only, --no-spec, --spec-batches, --spec-capacity-tokens, --spec-partitions, "
        "--partition-only, --prefill-only, --no-prefill, "
        "--prefill-tokens and --breaks-only choose what calibrate measures; "
        "--fit-only measures nothing (it refits every stored sample, spec_graph, "
        "prefill and collective_break ones too)");
  if (grid.no_spec && !grid.spec_batches.empty())
    throw ConfigError("", "--spec-batches sets the speculative graphs' batches; drop --no-spec");
  if (fit_only && !grid.fusion.empty())
    throw ConfigError("",
                      "--fusion chooses what calibrate measures; --fit-only refits stored "
                      "sessions (a fused session's samples carry their label)");
  if (const KernelFusion fusion = calibrate_fusion(grid.fusion); fusion.any()) {
    if (grid.prefill_only || grid.breaks_only)
      throw ConfigError("",
                        "--fusion measures the decode grid and the speculative graphs with the "
                        "fused kernels (prefill and collective breaks run unfused); drop "
                        "--prefill-only and --breaks-only");
#ifdef TWINSTEP_HAVE_RUNTIME
    const std::vector<std::string> measured =
        models.empty() ? runtime::CalibrateOptions{}.models : models;  // the default models
#else
    const std::vector<std::string>& measured = models;
#endif
    const std::string why = fused_calibration_error(fusion, measured, grid.tp);
    if (!why.empty()) throw ConfigError("", why);
  }
  if (grid.breaks_only && (grid.tp < 2 || grid.spec_only || grid.prefill_only))
    throw ConfigError("",
                      "--breaks-only measures a TP shard's decode steps with and without "
                      "collective stubs: give --tp N (N >= 2), without --spec-only or "
                      "--prefill-only");
  // The database is opened once the arguments hold and, to measure, a GPU is there: a refused
  // command leaves no new file behind (--fit-only reads a database that must exist).
  if (!fit_only) {
    std::string why;
    if (!real_backend_available(&why))
      throw Error("calibrate needs a CUDA GPU: " + why +
                  "; --fit-only refits samples already in a database");
  }
  ResultsDb db = fit_only ? open_existing_db(db_path) : open_db(db_path);
  if (fit_only) {
    // One session (the latest by default), or several fitted as one sample set (e.g. a dense
    // model's full grid and a MoE model's narrow grid, measured by two commands): same GPU only.
    const std::vector<int64_t> ids =
        grid.sessions.empty() ? std::vector<int64_t>{0} : grid.sessions;
    for (const int64_t id : ids) {
      if (id < 1 && !grid.sessions.empty())
        throw ConfigError("", "--sessions takes session ids >= 1, got " + std::to_string(id));
      ProfileHeader h;
      std::vector<CalibrationSample> part = db.calibration_samples(id, &h);
      if (!grid.spec_sessions.empty() &&
          std::find(grid.spec_sessions.begin(), grid.spec_sessions.end(), id) ==
              grid.spec_sessions.end())
        std::erase_if(part, [](const CalibrationSample& x) { return x.kind == "spec_graph"; });
      if (!header.gpu.empty() && h.gpu != header.gpu) {
        throw ConfigError("", "calibration session " + std::to_string(id) + " measured '" + h.gpu +
                                  "', the sessions before it '" + header.gpu +
                                  "': a profile fits one GPU");
      }
      if (header.gpu.empty()) {
        header = h;
      } else {
        header.command += "; " + h.command;
        if (h.commit != header.commit) header.commit += "+" + h.commit;
        header.date = h.date;
      }
      samples.insert(samples.end(), std::make_move_iterator(part.begin()),
                     std::make_move_iterator(part.end()));
    }
    header.command += "; refit: " + command;
  } else {
#ifdef TWINSTEP_HAVE_RUNTIME
    runtime::CalibrationRun run;
    try {
      run = runtime::run_calibration(calibrate_options(quick, models, grid));
      if (session) runtime::tp_release_world_communicator();  // before MPI_Finalize
    } catch (const std::exception& ex) {
      if (!session || !session->distributed()) throw;
      abort_ranks(ex);
    }
    samples = std::move(run.samples);
    const std::time_t t = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    header = {command, build_info().git_sha + (build_info().git_dirty ? "-dirty" : ""),
              run.gpu_name, run.driver, date};
    const int64_t session = db.store_calibration(header, quick, samples);
    std::fprintf(stderr, "twinstep: %zu calibration samples stored in %s (session %lld)\n",
                 samples.size(), db_path.c_str(), static_cast<long long>(session));
#else
    (void)quick;
    (void)models;
    (void)grid;
    throw Error("unreachable: real_backend_available() is false without the CUDA runtime");
#endif
  }
  if (base.empty()) {
    // The datasheet preset of the measured GPU: "NVIDIA H200" -> h200.
    std::string gpu = header.gpu;
    for (char& c : gpu) c = char(std::tolower(static_cast<unsigned char>(c)));
    for (const char* p : {"h200", "h100", "h20", "b200", "b300"}) {
      if (gpu.find(p) != std::string::npos) {
        base = p;
        break;
      }
    }
    if (base.empty()) {
      throw ConfigError(
          "", "no datasheet preset matches GPU '" + header.gpu +
                  "'; give --base with a hardware preset name (twinstep hardware lists them)");
    }
  }
  CalibrationProfile profile = fit_calibration(samples, name, base, header);
  if (!grid.collectives_from.empty()) {
    // Refitting the kernels keeps the collectives calibrate-nccl measured into other profiles:
    // the first's figures, skew curves and nccl.* measurements, each further one's tables as
    // nccl.r<N>.* (the tables the simulator prices collectives by, one per group size).
    std::vector<CalibrationProfile> from;
    for (const std::string& path : grid.collectives_from) {
      from.push_back(load_calibration_profile(path));
    }
    merge_collectives(profile, from, grid.collectives_from);
  }
  // In-situ break gaps last: they subtract the collectives' prices, merged just above.
  fit_in_situ_break_gaps(profile.hw, samples);
  std::ofstream out(out_path);
  out << write_calibration_profile(profile);
  out.close();
  if (!out) throw Error("cannot write " + out_path);
  std::printf("%s", calibration_report(profile).c_str());
  std::printf(
      "wrote %s (profile '%s' over preset %s; load it with hardware: %s once it is in %s)\n",
      out_path.c_str(), name.c_str(), base.c_str(), name.c_str(),
      calibration_profile_dir().c_str());
  if (!grid.evaluate_db.empty()) {
    print_evaluation(profile.hw, grid.evaluate_db, grid.evaluate_sessions, grid.evaluate_by_batch);
  }
  return 0;
}

// `twinstep calibrate-nccl` (docs/calibration.md "Collectives"), one process per GPU under
// mpirun: NCCL collective times against message size, fitted into a calibration profile.
int cmd_calibrate_nccl(const std::string& out_path, const std::string& json_path,
                       const std::string& name, const std::string& profile, bool quick,
                       bool single_process, const std::string& command, bool skew) {
#ifdef TWINSTEP_HAVE_NCCL_CALIBRATE
  DistributedSession session;  // MPI up under mpirun; refused without MPI in the build
  try {
    return calibrate_nccl_command(out_path, json_path, name, profile, quick, single_process,
                                  command, skew);
  } catch (const std::exception& ex) {
    if (!session.distributed()) throw;
    std::fflush(stdout);
    std::fprintf(stderr, "twinstep: rank %d of %d: %s\n", session.rank(), session.size(),
                 ex.what());
    session.abort(1);
  }
#else
  (void)out_path, (void)json_path, (void)name, (void)profile, (void)quick, (void)single_process,
      (void)command, (void)skew;
  throw Error("calibrate-nccl needs a CUDA + NCCL + MPI build (this twinstep has no NCCL)");
#endif
}

}  // namespace
}  // namespace twinstep

int main(int argc, char** argv) {
  using namespace twinstep;
  CLI::App app{"twinstep: simulation-backed scheduling research for LLM decode"};
  // What this binary was built from, as runs, calibration sessions and profiles record it
  // (results/build_info.cmake: TWINSTEP_COMMIT at build time wins over git).
  const BuildInfo& build = build_info();
  app.set_version_flag("--version", "twinstep " + build.version + " (commit " + build.git_sha +
                                        (build.git_dirty ? "-dirty" : "") + "; " + build.compiler +
                                        "; CUDA " + build.cuda_version + "; NCCL " +
                                        build.nccl_version + ")");
  app.require_subcommand(1);
  // Subcommands pass options they do not know to the app, so `--db` may follow the subcommand
  // (`twinstep run x.yaml --db r.db`) as well as precede it. Set before any subcommand is added:
  // each inherits it at creation.
  app.fallthrough();
  std::string db_path = kDefaultDb;
  app.add_option("--db", db_path, "results database (SQLite)")->capture_default_str();
  std::string format = "table";
  bool csv = false, json = false;
  auto add_format = [&](CLI::App* c) {
    c->add_flag("--csv", csv, "CSV output");
    c->add_flag("--json", json, "JSON output");
  };

  std::string file;
  bool quiet = false;
  CLI::App* run =
      app.add_subcommand("run", "run an experiment, store its runs, print a comparison");
  run->add_option("file", file, "experiment YAML")->required();
  run->add_flag("-q,--quiet", quiet, "no progress on stderr");
  bool resume = false;
  run->add_flag("--resume", resume,
                "continue this experiment in the database: skip variants already complete, "
                "mark runs a killed process left running as interrupted, run the rest");
  add_format(run);

  CLI::App* validate = app.add_subcommand("validate", "check an experiment YAML; run nothing");
  validate->add_option("file", file, "experiment YAML")->required();

  std::string sql;
  CLI::App* query = app.add_subcommand("query", "run SQL (read-only) on the results database");
  query->add_option("sql", sql, "SQL statement")->required();
  add_format(query);

  std::vector<int64_t> run_ids;
  std::string experiment;
  CLI::App* compare =
      app.add_subcommand("compare", "runs side by side (default: the latest experiment)");
  compare->add_option("run_ids", run_ids, "run ids");
  compare->add_option("--experiment", experiment, "the latest runs of this experiment");
  bool compare_sim_real = false;
  double compare_tolerance = -1;
  std::vector<std::string> compare_metrics = {"tpot_ms_mean", "step_ms_mean", "ttft_ms_mean",
                                              "gpu_busy_frac", "output_throughput_tok_s"};
  compare->add_flag("--sim-vs-real", compare_sim_real,
                    "simulated against measured per variant, with the error in percent");
  bool compare_ops = false;
  compare->add_flag("--ops", compare_ops,
                    "simulated against measured operation by operation over the traced steps "
                    "(per op: matched spans, mean durations, error, start drift)");
  bool compare_collectives = false;
  compare->add_flag("--collectives", compare_collectives,
                    "multi-rank runs: simulated against measured collective waits per rank and "
                    "collective over the traced steps (a span less the group's shortest span of "
                    "the same instance)");
  compare->add_option("--tolerance", compare_tolerance,
                      "fail (exit 3) when a simulated metric is off the measured one by more "
                      "than this many percent (implies --sim-vs-real)");
  CLI::Option* metrics_option =
      compare
          ->add_option("--metrics", compare_metrics,
                       "metrics for --sim-vs-real / --tolerance (space- or comma-separated; the "
                       "keys of docs/database.md's metric table)")
          ->delimiter(',')
          ->capture_default_str();
  bool compare_accept = false;
  double compare_accept_tolerance = -1;
  compare->add_flag("--accept", compare_accept,
                    "speculative decoding: simulated against measured accept-length "
                    "distribution per variant (fraction of verify rounds per tokens committed, "
                    "mean, total variation)");
  compare->add_option("--accept-tolerance", compare_accept_tolerance,
                      "fail (exit 3) when a simulated mean accept length is off the measured one "
                      "by more than this many tokens (implies --accept)");
  add_format(compare);

  int64_t trace_run = 0;
  std::string trace_out;
  CLI::App* trace = app.add_subcommand("trace", "a run's timeline as Chrome/Perfetto trace JSON");
  trace->add_option("run_id", trace_run, "run id")->required();
  trace->add_option("-o,--out", trace_out, "output file (default stdout)");

  std::string plot_out = "results/figures";
  CLI::App* plot = app.add_subcommand("plot", "an experiment's figures as PNGs (gnuplot)");
  plot->add_option("run_ids", run_ids, "run ids (default: the latest runs of the experiment)");
  plot->add_option("--experiment", experiment, "the latest runs of this experiment");
  plot->add_option("-o,--out-dir", plot_out, "directory for the PNGs")->capture_default_str();

  std::string report_out;
  CLI::App* report =
      app.add_subcommand("report", "a self-contained HTML report: compare tables and figures");
  report->add_option("run_ids", run_ids, "run ids (default: the latest runs of the experiment)");
  report->add_option("--experiment", experiment, "the latest runs of this experiment");
  report->add_option("-o,--out", report_out, "HTML file (default results/<experiment>.html)");

  bool sources = false;
  CLI::App* models = app.add_subcommand("models", "model presets and their key figures");
  add_format(models);
  std::string cap_model = "deepseek-like", cap_hardware = "h20";
  std::vector<std::string> cap_layouts = {"TP8", "PP2-TP8", "DP16-EP16", "DP32-EP32"};
  bool cap_seed004 = false;
  CLI::App* capacity = app.add_subcommand(
      "capacity", "per-rank memory and full-token KV capacity across layouts and dtypes");
  capacity->add_option("--model", cap_model, "model preset")->capture_default_str();
  capacity->add_option("--hardware", cap_hardware, "hardware preset")->capture_default_str();
  capacity->add_option("--layouts", cap_layouts, "layouts, e.g. TP8 PP2-TP8 DP32-EP32")
      ->capture_default_str();
  capacity->add_flag("--seed004", cap_seed004,
                     "each layout at seed 004's dtypes: fp8 weights, then MXFP4 experts, then "
                     "compact KV state, then both (ratios against the first)");
  add_format(capacity);

  std::vector<std::string> import_records;
  std::string import_as;
  CLI::App* import = app.add_subcommand(
      "import", "store measured records (results/<gpu>/*.json) as real runs of an experiment");
  import->add_option("records", import_records, "record JSON files")->required();
  import->add_option("--as", import_as, "the experiment YAML whose variants the rows match")
      ->required();

  std::string ckpt_preset, ckpt_out;
  uint64_t ckpt_seed = 0, ckpt_shard_mb = 4096;
  double ckpt_fidelity = -1;
  CLI::App* make_ckpt = app.add_subcommand(
      "make-checkpoint", "write a synthetic Hugging Face checkpoint (config.json + safetensors)");
  make_ckpt->add_option("--preset", ckpt_preset, "model preset")->required();
  make_ckpt->add_option("--out", ckpt_out, "output directory")->required();
  make_ckpt->add_option("--seed", ckpt_seed, "weight seed")->capture_default_str();
  make_ckpt->add_option("--shard-mb", ckpt_shard_mb, "safetensors shard size")
      ->capture_default_str();
  make_ckpt
      ->add_option("--draft-fidelity", ckpt_fidelity,
                   "also write a speculative draft module; 0..1 sets target/draft agreement")
      ->check(CLI::Range(0.0, 1.0));

  CLI::App* hardware = app.add_subcommand("hardware", "hardware presets and their key figures");
  hardware->add_flag("--sources", sources, "show where each preset's numbers come from");
  add_format(hardware);

  std::string cal_out, cal_base;
  bool cal_quick = false, cal_fit_only = false;
  std::vector<std::string> cal_models;
  CLI::App* calibrate = app.add_subcommand(
      "calibrate", "measure this GPU and fit a calibrated hardware profile (docs/calibration.md)");
  calibrate->add_option("--out", cal_out, "profile to write, NAME.yaml")->required();
  calibrate->add_option("--db", db_path, "results database for the raw samples")
      ->capture_default_str();
  calibrate->add_flag("--quick", cal_quick, "a small grid (tests the pipeline)");
  calibrate->add_flag("--fit-only", cal_fit_only,
                      "refit the latest calibration session in --db; no GPU needed");
  calibrate->add_option("--base", cal_base, "datasheet preset (default: from the GPU name)");
  calibrate->add_option("--models", cal_models, "model presets to measure (dense or MoE)")
      ->delimiter(',');
  CalibrateGrid cal_grid;
  calibrate->add_option("--contexts", cal_grid.contexts, "prompt contexts of the grid, tokens")
      ->delimiter(',');
  calibrate->add_option("--batches", cal_grid.batches, "decode batches of the grid, increasing")
      ->delimiter(',');
  calibrate->add_option("--tp", cal_grid.tp,
                        "measure rank 0's shard of TP-N (MoE: EP-N) on one GPU, no collectives");
  calibrate->add_flag("--no-spec", cal_grid.no_spec,
                      "skip the speculative graphs (measured by default for models with a draft "
                      "module, ~11 s for llama-3-8b on an H200)");
  calibrate->add_flag("--spec-only", cal_grid.spec_only,
                      "measure only the speculative graphs (fit them with stored sessions: "
                      "--fit-only --sessions)");
  calibrate->add_flag("--no-prefill", cal_grid.no_prefill,
                      "skip the prefill passes (one prompt per length, measured by default; "
                      "they fit the profile's prefill rates)");
  calibrate
      ->add_option("--spec-batches", cal_grid.spec_batches,
                   "batches of the speculative graphs, increasing, 1..64 (default 1,4; "
                   "with --batches, those <= 4)")
      ->delimiter(',');
  calibrate->add_option("--spec-capacity-tokens", cal_grid.spec_capacity_tokens,
                        "KV capacity of the speculative graphs' engine, tokens (default: each "
                        "context plus one round); the attention's partition follows it");
  calibrate->add_option("--spec-partitions", cal_grid.spec_partitions,
                        "attention split sizes the speculative graphs are measured at, at the "
                        "largest context (1..8, default 3): one round's capacity, then larger "
                        "ones");
  calibrate->add_flag("--partition-only", cal_grid.partition_only,
                      "measure only the decode attention at several KV capacities (stored for "
                      "reading, no fit uses them); with --spec-only, both");
  calibrate->add_flag("--prefill-only", cal_grid.prefill_only,
                      "measure only the prefill passes (fit them with stored sessions: --fit-only "
                      "--sessions); with --spec-only, both");
  calibrate->add_flag("--breaks-only", cal_grid.breaks_only,
                      "with --tp N: measure only the shard's decode steps with and without an "
                      "empty non-PDL kernel at each collective position (collective_break "
                      "samples; fit them with stored sessions: --fit-only --sessions)");
  calibrate->add_flag("--in-situ", cal_grid.in_situ,
                      "with --breaks-only --tp N under mpirun -np N (one GPU per rank): the "
                      "shard's steps with its real collectives instead of the stubs (in_situ "
                      "samples; the fit subtracts the profile's collective prices)");
  calibrate
      ->add_option("--fusion", cal_grid.fusion,
                   "kernel fusions to measure, norms and/or rope (policies.fusion): the decode "
                   "grid and speculative graphs of fused engines, labelled <model>+norms+rope; "
                   "fit them with the unfused sessions (--fit-only --sessions)")
      ->delimiter(',');
  calibrate
      ->add_option("--prefill-tokens", cal_grid.prefill_tokens,
                   "prompt lengths of the prefill passes (default 1024,2048,4096,8192)")
      ->delimiter(',');
  calibrate->add_option("--collectives-from", cal_grid.collectives_from,
                        "keep the collective calibration (calibrate-nccl) of this profile file; "
                        "repeated: each further file adds its tables for its group size");
  calibrate
      ->add_option("--sessions", cal_grid.sessions,
                   "with --fit-only: stored sessions fitted together (default: the latest)")
      ->delimiter(',');
  calibrate
      ->add_option("--spec-sessions", cal_grid.spec_sessions,
                   "with --fit-only --sessions: only these of them give the speculative graphs "
                   "(spec_graph samples; default: all of them)")
      ->delimiter(',');
  calibrate->add_option("--evaluate-db", cal_grid.evaluate_db,
                        "after the fit, price the kernel and step samples of this database's "
                        "calibration sessions with the profile (held-out evaluation)");
  calibrate
      ->add_option("--evaluate-sessions", cal_grid.evaluate_sessions,
                   "sessions of --evaluate-db evaluated (default: the latest)")
      ->delimiter(',');
  calibrate->add_flag("--evaluate-by-batch", cal_grid.evaluate_by_batch,
                      "also print the kernel errors per batch");

  std::string eval_profile;
  std::vector<int64_t> eval_sessions;
  bool eval_by_batch = false;
  CLI::App* calibrate_eval = app.add_subcommand(
      "calibrate-eval",
      "price stored calibration samples with a profile: per-kernel and per-step errors");
  calibrate_eval->add_option("--profile", eval_profile, "profile file, or a hardware name")
      ->required();
  calibrate_eval->add_option("--db", db_path, "results database holding the sessions")
      ->capture_default_str();
  calibrate_eval
      ->add_option("--sessions", eval_sessions, "calibration sessions (default: the latest)")
      ->delimiter(',');
  calibrate_eval->add_flag("--by-batch", eval_by_batch, "also print the kernel errors per batch");

  std::string nccl_out, nccl_json, nccl_name, nccl_profile;
  bool nccl_quick = false, nccl_single = false, nccl_no_skew = false;
  CLI::App* calibrate_nccl = app.add_subcommand(
      "calibrate-nccl",
      "time NCCL collectives vs message size (mpirun -np GPUS) and fit them into a profile");
  calibrate_nccl->add_option("--out", nccl_out, "profile file to write (.yaml)")->required();
  calibrate_nccl->add_option("--json", nccl_json,
                             "also write the table and fits as a results/<gpu>/*.json record");
  calibrate_nccl->add_option("--name", nccl_name, "profile name (default: --out's stem)");
  calibrate_nccl->add_option("--profile", nccl_profile,
                             "calibrated profile to extend (default: the GPU's datasheet preset)");
  calibrate_nccl->add_flag("--quick", nccl_quick, "x4 size steps, fewer repetitions");
  calibrate_nccl->add_flag("--single-process", nccl_single,
                           "no mpirun: one thread per visible GPU in this process");
  calibrate_nccl->add_flag("--no-skew", nccl_no_skew,
                           "skip the skewed-arrival sweep (graph all-reduce, one rank late; "
                           "a few seconds on 2 GPUs)");

  int32_t bench_requests = 1000;
  CLI::App* bench =
      app.add_subcommand("bench-sim", "simulator speed benchmark (wall time, memory)");
  bench->add_option("--requests", bench_requests, "requests of 8192/1024")->capture_default_str();
  bool bench_store_run = false;
  bench->add_flag("--store", bench_store_run,
                  "then time storing the run in a new database under $TMPDIR (metrics, the "
                  "one transaction)");

  CLI11_PARSE(app, argc, argv);
  const OutputFormat f = json  ? OutputFormat::kJson
                         : csv ? OutputFormat::kCsv
                               : OutputFormat::kTable;
  try {
    if (*run) return cmd_run(file, db_path, quiet, resume, f);
    if (*validate) return cmd_validate(file);
    if (*query) return cmd_query(sql, db_path, f);
    if (*compare) {
      // `--metrics a b 5 6` takes the run ids too (a list option is greedy); a metric key is
      // never an integer, so integers among the metrics are run ids given after them.
      for (auto it = compare_metrics.begin(); it != compare_metrics.end();) {
        const bool id = !it->empty() && it->find_first_not_of("0123456789") == std::string::npos &&
                        it->size() < 19;
        if (!id) {
          ++it;
          continue;
        }
        run_ids.push_back(std::stoll(*it));
        it = compare_metrics.erase(it);
      }
      // A name outside the catalogue would compare nothing and, under --tolerance, gate nothing.
      for (const std::string& key : compare_metrics) {
        const auto& defs = metric_definitions();
        if (std::none_of(defs.begin(), defs.end(),
                         [&](const MetricDef& d) { return d.key == key; })) {
          std::string known;
          for (const MetricDef& d : defs) known += (known.empty() ? "" : ", ") + d.key;
          throw Error("compare --metrics: unknown metric \"" + key + "\" (known: " + known + ")");
        }
      }
      return cmd_compare(run_ids, experiment, db_path, f, compare_sim_real, compare_ops,
                         compare_collectives, compare_tolerance, compare_metrics,
                         metrics_option->count() > 0, compare_accept, compare_accept_tolerance);
    }
    if (*trace) return cmd_trace(trace_run, trace_out, db_path);
    if (*plot) return cmd_plot(run_ids, experiment, plot_out, db_path);
    if (*report) return cmd_report(run_ids, experiment, report_out, db_path);
    if (*models) return cmd_models(f);
    if (*hardware) return cmd_hardware(f, sources);
    if (*bench) return cmd_bench_sim(bench_requests, bench_store_run);
    if (*calibrate) {
      std::string command = "twinstep";
      for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
      return cmd_calibrate(cal_out, db_path, cal_quick, cal_fit_only, cal_base, cal_models,
                           cal_grid, command);
    }
    if (*calibrate_eval) {
      return cmd_calibrate_eval(eval_profile, db_path, eval_sessions, eval_by_batch);
    }
    if (*calibrate_nccl) {
      std::string command = "twinstep";
      for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
      return cmd_calibrate_nccl(nccl_out, nccl_json, nccl_name, nccl_profile, nccl_quick,
                                nccl_single, command, !nccl_no_skew);
    }
    if (*capacity) return cmd_capacity(cap_model, cap_hardware, cap_layouts, cap_seed004, f);
    if (*import) return cmd_import(import_records, import_as, db_path);
    if (*make_ckpt)
      return cmd_make_checkpoint(ckpt_preset, ckpt_out, ckpt_seed, ckpt_shard_mb, ckpt_fidelity);
  } catch (const ConfigError& e) {
    // Every rank of an mpirun job reads the same file: only the first reports it.
    std::fflush(stdout);
    if (launcher_rank() == 0) std::fprintf(stderr, "twinstep: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "twinstep: %s\n", e.what());
    return 1;
  }
  return 0;
}
