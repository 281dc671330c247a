// ResultsDb: the SQLite results database (schema in docs/database.md). One transaction per
// finished run, so an interrupted run leaves its row 'running' and no sample rows.
// Not thread-safe: use one ResultsDb per thread (SQLite serialises writers across processes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "policies/calibration_profile.h"
#include "policies/run_record.h"
#include "results/build_info.h"
#include "results/metrics.h"

struct sqlite3;

namespace twinstep {

// A result cell; the alternative is the SQLite storage class (NULL, INTEGER, REAL, TEXT; a BLOB
// comes back as its bytes in std::string).
using Cell = std::variant<std::monostate, int64_t, double, std::string>;

// Typed reads of a cell, throwing Error (naming `what`) instead of std::bad_variant_access when
// a database edited by hand holds another type. cell_number accepts INTEGER and REAL.
const std::string& cell_text(const Cell& c, const char* what);
int64_t cell_int(const Cell& c, const char* what);
double cell_number(const Cell& c, const char* what);

struct QueryResult {
  std::vector<std::string> columns;
  std::vector<std::vector<Cell>> rows;
};

struct RunInfo {
  std::string experiment_name;
  std::string yaml_text;
  std::string source_path;
  int32_t variant_index = 0;
  std::string variant_label;
  // Swept key -> value as written; stored as a JSON object, values that are JSON numbers or
  // true/false stored as such, everything else as strings.
  std::vector<std::pair<std::string, std::string>> variant_params;
  std::string backend;  // "sim" or "real"
  // Stored as decimal TEXT: SQLite integers are int64 and seeds use all 64 bits.
  uint64_t seed = 0;
  std::string gpu_name;  // the driver's name for the GPU; empty (stored NULL) for none
  // The build that produced the run when it is not this binary (an imported record); null:
  // build_info().
  const BuildInfo* build = nullptr;
};

class ResultsDb {
 public:
  static constexpr int kSchemaVersion = 5;
  // How long a write waits for another process's write transaction (a run's samples are one
  // transaction: about 1.8 s per million decode steps) before failing with "locked".
  static constexpr int kBusyTimeoutMs = 60000;

  // Opens or creates the database at `path` (":memory:" for a private in-memory one), enables
  // WAL and foreign keys, and creates/migrates the schema. Throws Error if the parent directory
  // does not exist, the file is not a twinstep database, or its schema is newer than this code.
  static ResultsDb open(const std::string& path);

  ResultsDb(ResultsDb&& other) noexcept;
  ResultsDb& operator=(ResultsDb&& other) noexcept;
  ResultsDb(const ResultsDb&) = delete;
  ResultsDb& operator=(const ResultsDb&) = delete;
  ~ResultsDb();

  // Records build, host and experiment (deduplicated) and inserts a run with status 'running'.
  // Returns the run id. One short transaction.
  int64_t begin_run(const RunInfo& info);

  // In ONE transaction: every sample of `record`, `metrics`, status 'complete', ended_at, wall_s.
  // Throws Error if the run does not exist or is not 'running'; on any failure nothing is kept.
  void finish_run(int64_t run_id, const RunRecord& record, const std::vector<Metric>& metrics,
                  double wall_s);

  // Marks a 'running' run as `status` ("failed" or "interrupted") with an error message.
  void fail_run(int64_t run_id, const std::string& status, const std::string& error);

  // Ids of runs whose status is not 'complete' (running, failed, interrupted) and that no later
  // complete run of the same experiment version, variant and backend supersedes, ascending. A
  // 'running' run whose process is alive on this machine (run.owner) is in progress, not listed.
  std::vector<int64_t> incomplete_runs();

  // True when run `run_id` is 'running' in a process alive now on this machine (run.owner).
  // Throws Error when there is no such run.
  bool run_in_progress(int64_t run_id);

  // Runs `sql` (one or more statements; the result of the last statement returning columns is
  // returned). Unless allow_write, a statement that would modify the database is rejected with
  // Error before it runs. `params` bind ?1..?N and require a single statement. SQLite errors are
  // thrown as Error carrying SQLite's message.
  QueryResult query(const std::string& sql, bool allow_write = false);
  QueryResult query_params(const std::string& sql, const std::vector<Cell>& params,
                           bool allow_write = false);

  // Calibration (docs/calibration.md): a session row (the profile header, quick flag) and its
  // raw samples, in one transaction; returns the session id. The two tables are created on
  // first use and are not part of the versioned schema, so a database without them is current.
  int64_t store_calibration(const ProfileHeader& header, bool quick,
                            const std::vector<CalibrationSample>& samples);
  // The samples of calibration session `session_id` (0: the latest), with its header in
  // *header when non-null. Throws Error when the database holds no such session.
  std::vector<CalibrationSample> calibration_samples(int64_t session_id = 0,
                                                     ProfileHeader* header = nullptr);

  const std::string& path() const { return path_; }
  int schema_version();
  // Replaces kBusyTimeoutMs for this handle (tests; 0 fails at once when locked).
  void set_busy_timeout_ms(int ms);

 private:
  struct Statements;  // finish_run's prepared INSERTs, kept for the next run (db.cc)
  ResultsDb(sqlite3* db, std::string path);
  sqlite3* db_ = nullptr;
  std::string path_;
  std::unique_ptr<Statements> statements_;
};

// FNV-1a 64-bit hash as 16 lowercase hex digits (experiment.yaml_hash).
std::string fnv1a64_hex(std::string_view data);

}  // namespace twinstep
