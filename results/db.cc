#include "results/db.h"

#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "policies/error.h"
#include "results/build_info.h"
#include "results/json.h"

namespace twinstep {
namespace {

// SQLite's "database is locked" once the busy timeout has passed, said with what to do about it.
std::string busy_message(sqlite3* db) {
  const char* file = sqlite3_db_filename(db, "main");
  return std::string("results database ") + (file != nullptr ? file : "") +
         " is locked: another process held its write lock longer than this one waits (it is "
         "writing a long run's samples, or it was stopped mid-write); try again when it is done";
}

[[noreturn]] void throw_sqlite(sqlite3* db, const std::string& what) {
  if (db != nullptr && (sqlite3_errcode(db) & 0xff) == SQLITE_BUSY) throw Error(busy_message(db));
  throw Error(what + ": " + (db ? sqlite3_errmsg(db) : "out of memory"));
}

void exec(sqlite3* db, const std::string& sql) {
  char* message = nullptr;
  if (const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &message); rc != SQLITE_OK) {
    const std::string text = message != nullptr ? message : sqlite3_errmsg(db);
    sqlite3_free(message);
    if ((rc & 0xff) == SQLITE_BUSY) throw Error(busy_message(db));
    throw Error("results database: " + text);
  }
}

// A prepared statement, reset between uses. Binding is by 1-based index.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK) {
      throw_sqlite(db, "results database: preparing statement");
    }
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& bind(int i, int64_t v) { return check(sqlite3_bind_int64(stmt_, i, v)); }
  Stmt& bind(int i, int32_t v) { return check(sqlite3_bind_int64(stmt_, i, v)); }
  Stmt& bind(int i, double v) { return check(sqlite3_bind_double(stmt_, i, v)); }
  Stmt& bind(int i, const std::string& v) {
    return check(
        sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
  }
  Stmt& bind(int i, const char* v) {
    return check(sqlite3_bind_text(stmt_, i, v, -1, SQLITE_STATIC));
  }
  Stmt& bind_null(int i) { return check(sqlite3_bind_null(stmt_, i)); }
  Stmt& bind(int i, const std::optional<double>& v) { return v ? bind(i, *v) : bind_null(i); }

  // Steps once; true if a row is available.
  bool step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw_sqlite(db_, "results database");
  }
  // Runs a statement that returns no rows, then resets it for reuse.
  void run() {
    step();
    sqlite3_reset(stmt_);
  }
  void reset() { sqlite3_reset(stmt_); }
  int64_t int64(int col) const { return sqlite3_column_int64(stmt_, col); }
  double number(int col) const { return sqlite3_column_double(stmt_, col); }
  std::string text(int col) const {
    const auto* p = sqlite3_column_text(stmt_, col);
    return p ? reinterpret_cast<const char*>(p) : "";
  }

 private:
  Stmt& check(int rc) {
    if (rc != SQLITE_OK) throw_sqlite(db_, "results database: binding a value");
    return *this;
  }
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

// The INSERT of `rows` rows of `columns` values into `head` ("INSERT INTO t (a, b)"). Its
// parameters are anonymous ("?", numbered 1, 2, ... in order): SQLite looks up the names of
// numbered ones ("?7") by a linear search on every bind, quadratic over a batch.
std::string insert_sql(const std::string& head, int columns, int rows) {
  std::string row = "(?";
  for (int c = 1; c < columns; ++c) row += ",?";
  row += ")";
  std::string out = head + " VALUES " + row;
  for (int r = 1; r < rows; ++r) out += "," + row;
  return out;
}

// Inserts `rows` rows: kBatchRows per execution of `batch` (one VDBE run and one cursor seek per
// batch, not per row), the rest one by one with `one`. Both statements are insert_sql of the
// same head and columns, for kBatchRows rows and for 1. put() binds a row's values in column
// order and end_row() ends it (or add() all of them), writing what is complete; after `rows`
// rows everything is written.
class RowInserter {
 public:
  static constexpr int kBatchRows = 32;

  RowInserter(Stmt& batch, Stmt& one, int columns, size_t rows)
      : batch_(batch), one_(one), columns_(columns), left_(rows) {}

  template <typename V>
  RowInserter& put(const V& value) {
    if (put_ == 0 && row_in_batch_ == 0) {
      if (left_ == 0) throw Error("results database: more rows than announced");
      batch_rows_ = left_ >= size_t(kBatchRows) ? kBatchRows : 1;
      current_ = batch_rows_ == kBatchRows ? &batch_ : &one_;
    }
    if (put_ == columns_) throw Error("results database: a row wider than its table");
    current_->bind(row_in_batch_ * columns_ + ++put_, value);
    return *this;
  }
  void end_row() {
    if (put_ != columns_) throw Error("results database: a row narrower than its table");
    put_ = 0;
    if (++row_in_batch_ == batch_rows_) {
      current_->run();
      left_ -= size_t(batch_rows_);
      row_in_batch_ = 0;
    }
  }
  template <typename... V>
  void add(const V&... values) {
    (put(values), ...);
    end_row();
  }

 private:
  Stmt& batch_;
  Stmt& one_;
  int columns_;
  size_t left_;  // rows not yet written
  int batch_rows_ = 0;
  int row_in_batch_ = 0;
  int put_ = 0;  // values of the current row bound so far
  Stmt* current_ = nullptr;
};

// Rolls back unless committed.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) { exec(db_, "BEGIN IMMEDIATE"); }
  ~Transaction() {
    if (!done_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  void commit() {
    exec(db_, "COMMIT");
    done_ = true;
  }

 private:
  sqlite3* db_;
  bool done_ = false;
};

int user_version(sqlite3* db) {
  Stmt s(db, "PRAGMA user_version");
  s.step();
  return static_cast<int>(s.int64(0));
}

std::string step_sample_host_columns(const char* suffix) {
  std::string cols;
  for (int op = 0; op < kHostOpCount; ++op) {
    cols += std::string(",\n  host_") + host_op_db_name(static_cast<HostOp>(op)) + "_ns" + suffix;
  }
  return cols;
}

// Schema version 1. Every table holding samples of a run references run(id) ON DELETE CASCADE,
// so `DELETE FROM run WHERE ...` removes a run completely. The large sample tables are
// WITHOUT ROWID tables keyed (run_id, ...): rows of one run are stored together, no separate
// run_id index is maintained, and a million-row run inserts in about a second.
void create_schema_v1(sqlite3* db) {
  exec(db, R"sql(
CREATE TABLE build (
  id               INTEGER PRIMARY KEY,
  git_sha          TEXT NOT NULL,
  git_dirty        INTEGER NOT NULL CHECK (git_dirty IN (0, 1)),
  compiler         TEXT NOT NULL,
  cuda_version     TEXT NOT NULL,
  nccl_version     TEXT NOT NULL,
  twinstep_version TEXT NOT NULL,
  UNIQUE (git_sha, git_dirty, compiler, cuda_version, nccl_version, twinstep_version)
);
CREATE TABLE host (
  id        INTEGER PRIMARY KEY,
  hostname  TEXT NOT NULL,
  cpu_model TEXT NOT NULL,
  cores     INTEGER NOT NULL,
  mem_bytes INTEGER NOT NULL,
  gpu_name  TEXT
);
CREATE TABLE experiment (
  id          INTEGER PRIMARY KEY,
  name        TEXT NOT NULL,
  yaml_text   TEXT NOT NULL,
  yaml_hash   TEXT NOT NULL,
  source_path TEXT NOT NULL,
  created_at  TEXT NOT NULL,
  UNIQUE (name, yaml_hash)
);
CREATE TABLE run (
  id            INTEGER PRIMARY KEY,
  experiment_id INTEGER NOT NULL REFERENCES experiment(id),
  build_id      INTEGER NOT NULL REFERENCES build(id),
  host_id       INTEGER NOT NULL REFERENCES host(id),
  variant_index INTEGER NOT NULL,
  variant_label TEXT NOT NULL,
  variant_json  TEXT NOT NULL,
  backend       TEXT NOT NULL CHECK (backend IN ('sim', 'real')),
  seed          TEXT NOT NULL,
  status        TEXT NOT NULL CHECK (status IN ('running', 'complete', 'failed', 'interrupted')),
  error         TEXT,
  started_at    TEXT NOT NULL,
  ended_at      TEXT,
  wall_s        REAL
);
CREATE INDEX run_experiment ON run(experiment_id);
CREATE TABLE metric (
  run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  key    TEXT NOT NULL,
  value  REAL NOT NULL,
  unit   TEXT NOT NULL,
  PRIMARY KEY (run_id, key)
);
CREATE TABLE request_sample (
  run_id         INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  request_id     INTEGER NOT NULL,
  input_len      INTEGER NOT NULL,
  output_len     INTEGER NOT NULL,
  arrival_ns     INTEGER NOT NULL,
  start_ns       INTEGER NOT NULL,
  first_token_ns INTEGER NOT NULL,
  end_ns         INTEGER NOT NULL,
  ttft_ms        REAL,
  tpot_ms        REAL,
  e2e_ms         REAL,
  chunk_count    INTEGER NOT NULL,
  PRIMARY KEY (run_id, request_id)
) WITHOUT ROWID;
CREATE TABLE chunk_sample (
  run_id     INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  request_id INTEGER NOT NULL,
  idx        INTEGER NOT NULL,
  t_ns       INTEGER NOT NULL,
  tokens     INTEGER NOT NULL,
  PRIMARY KEY (run_id, request_id, idx)
) WITHOUT ROWID;
CREATE TABLE timeline_span (
  run_id   INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  rank     INTEGER NOT NULL,
  lane     TEXT NOT NULL CHECK (lane IN ('host', 'compute', 'copy')),
  name     TEXT NOT NULL,
  step     INTEGER NOT NULL,
  start_ns INTEGER NOT NULL,
  dur_ns   INTEGER NOT NULL,
  flow     INTEGER NOT NULL
);
CREATE INDEX timeline_span_run ON timeline_span(run_id);
)sql");
  exec(db, R"sql(
CREATE TABLE step_sample (
  run_id         INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  rank           INTEGER NOT NULL,
  step           INTEGER NOT NULL,
  end_ns         INTEGER NOT NULL,
  dur_ns         INTEGER NOT NULL,
  gpu_busy_ns    INTEGER NOT NULL,
  idle_host_ns   INTEGER NOT NULL,
  idle_launch_ns INTEGER NOT NULL,
  idle_dep_ns    INTEGER NOT NULL,
  batch          INTEGER NOT NULL,
  prefills       INTEGER NOT NULL,
  tokens         INTEGER NOT NULL,
  draft_len      INTEGER NOT NULL,
  bytes_read     INTEGER NOT NULL)sql" +
               step_sample_host_columns(" INTEGER NOT NULL") + R"sql(,
  host_launch_ns INTEGER NOT NULL,
  host_wait_ns   INTEGER NOT NULL,
  PRIMARY KEY (run_id, rank, step)
) WITHOUT ROWID;
)sql");
}

// Version 2: time each step spent in collectives (multi-rank runs; 0 on one rank).
void migrate_v1_to_v2(sqlite3* db) {
  exec(db, "ALTER TABLE step_sample ADD COLUMN collective_ns INTEGER NOT NULL DEFAULT 0");
}

// Version 3: speculative decoding's verify rounds (RunRecord::rounds). `idx` numbers a request's
// rounds from 0 in commit order; `confidence` is a JSON array of draft_len numbers (draft token
// i's top-1 probability), readable with json_each.
void migrate_v2_to_v3(sqlite3* db) {
  exec(db, R"sql(
CREATE TABLE draft_round (
  run_id     INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  request_id INTEGER NOT NULL,
  idx        INTEGER NOT NULL,
  step       INTEGER NOT NULL,
  draft_len  INTEGER NOT NULL CHECK (draft_len BETWEEN 1 AND 64),
  accepted   INTEGER NOT NULL CHECK (accepted BETWEEN 0 AND draft_len),
  confidence TEXT NOT NULL,
  PRIMARY KEY (run_id, request_id, idx)
) WITHOUT ROWID;
)sql");
}

// Version 4: of collective_ns, the wait for the group's late rank (GPU busy since: inside a
// launch's span, as the real backend measures busy; before, the simulator counted it in
// idle_dep_ns). 0 in real runs (not measured) and in rows written before version 4.
void migrate_v3_to_v4(sqlite3* db) {
  exec(db, "ALTER TABLE step_sample ADD COLUMN collective_wait_ns INTEGER NOT NULL DEFAULT 0");
}

// Version 5: the process running a run (this_process_owner(): boot id, pid, start time), so a
// run another live process is running is not reported as never completed nor marked interrupted
// by --resume. NULL in rows written before version 5 (never taken for live).
void migrate_v4_to_v5(sqlite3* db) { exec(db, "ALTER TABLE run ADD COLUMN owner TEXT"); }

// Migration i takes the schema from version i to i + 1. Append, never edit.
using MigrationFn = void (*)(sqlite3*);
constexpr MigrationFn kMigrations[] = {&create_schema_v1, &migrate_v1_to_v2, &migrate_v2_to_v3,
                                       &migrate_v3_to_v4, &migrate_v4_to_v5};
static_assert(std::size(kMigrations) == ResultsDb::kSchemaVersion);

void migrate(sqlite3* db, const std::string& path) {
  // A current database needs no write lock: a reader (query, compare) opens it while another
  // process writes a run.
  if (user_version(db) >= ResultsDb::kSchemaVersion) return;
  Transaction txn(db);
  const int version = user_version(db);  // re-read under the write lock
  if (version >= ResultsDb::kSchemaVersion) return;
  if (version == 0) {
    Stmt s(db, "SELECT count(*) FROM sqlite_schema");
    s.step();
    if (s.int64(0) != 0) {
      throw Error("results database " + path +
                  " is not a twinstep database (it has tables but no schema version)");
    }
  }
  for (int v = version; v < ResultsDb::kSchemaVersion; ++v) kMigrations[v](db);
  exec(db, "PRAGMA user_version = " + std::to_string(ResultsDb::kSchemaVersion));
  txn.commit();
}

std::string now_iso8601_utc() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(ms));
  return buf;
}

std::string params_json(const std::vector<std::pair<std::string, std::string>>& params) {
  std::ostringstream out;
  out << '{';
  for (size_t i = 0; i < params.size(); ++i) {
    if (i) out << ',';
    write_json_string(out, params[i].first);
    out << ':';
    const std::string& v = params[i].second;
    if (is_json_number(v) || v == "true" || v == "false") {
      out << v;
    } else {
      write_json_string(out, v);
    }
  }
  out << '}';
  return out.str();
}

const char* lane_name(Lane lane) {
  switch (lane) {
    case Lane::kHost:
      return "host";
    case Lane::kCompute:
      return "compute";
    case Lane::kCopy:
      return "copy";
  }
  return "host";
}

// Returns the id of the row matching `select` (bound by `bind`), inserting it first if absent.
template <typename Bind>
int64_t find_or_insert(sqlite3* db, const char* select, const char* insert, Bind bind) {
  {
    Stmt s(db, select);
    bind(s);
    if (s.step()) return s.int64(0);
  }
  Stmt s(db, insert);
  bind(s);
  s.run();
  return sqlite3_last_insert_rowid(db);
}

Cell column_cell(sqlite3_stmt* stmt, int col) {
  switch (sqlite3_column_type(stmt, col)) {
    case SQLITE_INTEGER:
      return sqlite3_column_int64(stmt, col);
    case SQLITE_FLOAT:
      return sqlite3_column_double(stmt, col);
    case SQLITE_NULL:
      return std::monostate{};
    default: {
      const auto* p = static_cast<const char*>(sqlite3_column_blob(stmt, col));
      return std::string(p ? p : "", static_cast<size_t>(sqlite3_column_bytes(stmt, col)));
    }
  }
}

}  // namespace

std::string fnv1a64_hex(std::string_view data) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : data) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

ResultsDb ResultsDb::open(const std::string& path) {
  const bool special = path.empty() || path == ":memory:" || path.rfind("file:", 0) == 0;
  if (!special) {
    namespace fs = std::filesystem;
    const fs::path parent = fs::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty() && !fs::is_directory(parent, ec)) {
      throw Error("cannot open results database " + path + ": directory " + parent.string() +
                  " does not exist (create it first)");
    }
    if (fs::is_directory(path, ec)) {
      throw Error("cannot open results database " + path + ": it is a directory");
    }
  }
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI |
                                     SQLITE_OPEN_NOMUTEX,  // one thread per ResultsDb
                                 nullptr);
  ResultsDb db(raw, path);  // owns raw from here, even on failure
  if (rc == SQLITE_CANTOPEN && raw != nullptr) {
    // SQLite's "unable to open database file" does not say why; find out.
    std::string parent = std::filesystem::path(path).parent_path().string();
    if (parent.empty()) parent = ".";
    std::string why;
    if (::access(parent.c_str(), W_OK) != 0) {
      why = "directory " + parent + " is not writable (" + std::strerror(errno) + ")";
    } else {
      const int os_error = sqlite3_system_errno(raw);
      why = std::string("unable to open database file") +
            (os_error != 0 ? std::string(" (") + std::strerror(os_error) + ")" : "");
    }
    throw Error("cannot open results database " + path + ": " + why);
  }
  if (rc != SQLITE_OK) throw_sqlite(raw, "cannot open results database " + path);
  sqlite3_busy_timeout(raw, kBusyTimeoutMs);
  try {
    exec(raw, "PRAGMA foreign_keys = ON");
    const int version = user_version(raw);
    if (version > kSchemaVersion) {
      throw Error("results database " + path + " has schema version " + std::to_string(version) +
                  ", newer than this twinstep supports (" + std::to_string(kSchemaVersion) +
                  "); use a newer twinstep build");
    }
    exec(raw, "PRAGMA journal_mode = WAL");
    exec(raw, "PRAGMA synchronous = NORMAL");  // WAL + NORMAL: durable against process crashes
    exec(raw, "PRAGMA cache_size = -32768");   // 32 MiB: large runs insert without thrashing
    migrate(raw, path);
    // A current user_version says nothing about the tables: a file stamped by hand (or by
    // another program) would fail later with "no such table".
    Stmt tables(raw, "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'run'");
    tables.step();
    if (tables.int64(0) == 0) {
      throw Error("results database " + path + " has schema version " +
                  std::to_string(user_version(raw)) +
                  " but no run table: it is not a twinstep database");
    }
  } catch (const Error& e) {
    if (sqlite3_errcode(raw) == SQLITE_NOTADB ||
        std::string(e.what()).find("file is not a database") != std::string::npos) {
      throw Error("results database " + path +
                  " is not an SQLite database (SQLite: file is not a database); give --db a "
                  "new file name or an existing twinstep database");
    }
    std::string what = e.what();
    // Errors from exec() carry a generic "results database: " prefix; name the file instead.
    const std::string generic = "results database: ";
    if (what.rfind(generic, 0) == 0) what = what.substr(generic.size());
    if (what.find(path) == std::string::npos) what = "results database " + path + ": " + what;
    throw Error(what);
  }
  return db;
}

// Prepared once per connection: a sweep stores thousands of small runs, and preparing the
// batch INSERTs (hundreds of parameters) for each would cost more than writing their rows.
struct ResultsDb::Statements {
  std::map<std::string, std::unique_ptr<Stmt>> by_sql;
  // By INSERT head: the kBatchRows-row and the one-row statement (their SQL built once).
  std::map<std::string, std::pair<std::unique_ptr<Stmt>, std::unique_ptr<Stmt>>> inserts;

  Stmt& get(sqlite3* db, const std::string& sql) {
    std::unique_ptr<Stmt>& s = by_sql[sql];
    if (!s) s = std::make_unique<Stmt>(db, sql.c_str());
    s->reset();
    return *s;
  }
  RowInserter inserter(sqlite3* db, const std::string& head, int columns, size_t rows) {
    auto& [batch, one] = inserts[head];
    if (!batch) {
      batch =
          std::make_unique<Stmt>(db, insert_sql(head, columns, RowInserter::kBatchRows).c_str());
      one = std::make_unique<Stmt>(db, insert_sql(head, columns, 1).c_str());
    }
    batch->reset();
    one->reset();
    return RowInserter(*batch, *one, columns, rows);
  }
};

ResultsDb::ResultsDb(sqlite3* db, std::string path)
    : db_(db), path_(std::move(path)), statements_(std::make_unique<Statements>()) {}

ResultsDb::ResultsDb(ResultsDb&& other) noexcept
    : db_(std::exchange(other.db_, nullptr)),
      path_(std::move(other.path_)),
      statements_(std::move(other.statements_)) {}

ResultsDb& ResultsDb::operator=(ResultsDb&& other) noexcept {
  if (this != &other) {
    statements_.reset();  // finalized before their connection closes
    sqlite3_close_v2(db_);
    db_ = std::exchange(other.db_, nullptr);
    path_ = std::move(other.path_);
    statements_ = std::move(other.statements_);
  }
  return *this;
}

ResultsDb::~ResultsDb() {
  statements_.reset();
  sqlite3_close_v2(db_);
}

int ResultsDb::schema_version() { return user_version(db_); }

void ResultsDb::set_busy_timeout_ms(int ms) { sqlite3_busy_timeout(db_, ms); }

int64_t ResultsDb::begin_run(const RunInfo& info) {
  if (info.backend != "sim" && info.backend != "real") {
    throw Error("backend must be \"sim\" or \"real\", got \"" + info.backend + "\"");
  }
  Transaction txn(db_);
  const BuildInfo& b = info.build != nullptr ? *info.build : build_info();
  const int64_t build_id =
      find_or_insert(db_,
                     "SELECT id FROM build WHERE git_sha=?1 AND git_dirty=?2 AND compiler=?3 AND "
                     "cuda_version=?4 AND nccl_version=?5 AND twinstep_version=?6",
                     "INSERT INTO build (git_sha, git_dirty, compiler, cuda_version, nccl_version, "
                     "twinstep_version) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                     [&](Stmt& s) {
                       s.bind(1, b.git_sha).bind(2, int64_t{b.git_dirty}).bind(3, b.compiler);
                       s.bind(4, b.cuda_version).bind(5, b.nccl_version).bind(6, b.version);
                     });
  const HostInfo& h = host_info();
  const int64_t host_id = find_or_insert(
      db_,
      "SELECT id FROM host WHERE hostname=?1 AND cpu_model=?2 AND cores=?3 AND mem_bytes=?4 AND "
      "gpu_name IS ?5",
      "INSERT INTO host (hostname, cpu_model, cores, mem_bytes, gpu_name) "
      "VALUES (?1, ?2, ?3, ?4, ?5)",
      [&](Stmt& s) {
        s.bind(1, h.hostname).bind(2, h.cpu_model).bind(3, h.cores).bind(4, h.mem_bytes);
        if (info.gpu_name.empty()) {
          s.bind_null(5);
        } else {
          s.bind(5, info.gpu_name);
        }
      });
  const std::string hash = fnv1a64_hex(info.yaml_text);
  int64_t experiment_id = 0;
  {
    Stmt find(db_, "SELECT id FROM experiment WHERE name=?1 AND yaml_hash=?2");
    find.bind(1, info.experiment_name).bind(2, hash);
    if (find.step()) {
      experiment_id = find.int64(0);
    } else {
      Stmt insert(db_,
                  "INSERT INTO experiment (name, yaml_hash, yaml_text, source_path, created_at) "
                  "VALUES (?1, ?2, ?3, ?4, ?5)");
      insert.bind(1, info.experiment_name).bind(2, hash).bind(3, info.yaml_text);
      insert.bind(4, info.source_path).bind(5, now_iso8601_utc());
      insert.run();
      experiment_id = sqlite3_last_insert_rowid(db_);
    }
  }
  Stmt run(db_,
           "INSERT INTO run (experiment_id, build_id, host_id, variant_index, variant_label, "
           "variant_json, backend, seed, status, started_at, owner) "
           "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'running', ?9, ?10)");
  run.bind(1, experiment_id).bind(2, build_id).bind(3, host_id).bind(4, info.variant_index);
  run.bind(5, info.variant_label).bind(6, params_json(info.variant_params));
  run.bind(7, info.backend).bind(8, std::to_string(info.seed)).bind(9, now_iso8601_utc());
  if (const std::string owner = this_process_owner(); owner.empty()) {
    run.bind_null(10);
  } else {
    run.bind(10, owner);
  }
  run.run();
  const int64_t run_id = sqlite3_last_insert_rowid(db_);
  // SQLite gives a new run the largest id + 1, which a deleted run may have had; one deleted with
  // foreign keys off (the sqlite3 shell's default) leaves its rows behind, and this run's first
  // sample would collide with them. They belong to no run: drop them before this one writes.
  for (const char* sql :
       {"DELETE FROM metric WHERE run_id = ?1", "DELETE FROM request_sample WHERE run_id = ?1",
        "DELETE FROM chunk_sample WHERE run_id = ?1", "DELETE FROM timeline_span WHERE run_id = ?1",
        "DELETE FROM step_sample WHERE run_id = ?1", "DELETE FROM draft_round WHERE run_id = ?1"}) {
    Stmt stale(db_, sql);
    stale.bind(1, run_id);
    stale.run();
  }
  txn.commit();
  return run_id;
}

namespace {

// finish_run switches the foreign-key checks off for runs of at least this many sample rows.
constexpr size_t kForeignKeyChecksOffRows = 8192;

// Indices 0..n-1 stably sorted by key(i).
template <typename Key>
std::vector<size_t> key_order(size_t n, Key key) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  bool sorted = true;  // the common case: backends record in key order
  for (size_t i = 1; i < n && sorted; ++i) sorted = !(key(i) < key(i - 1));
  if (sorted) return order;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  return order;
}

// Throws unless run `run_id` exists with status 'running'.
void require_running(sqlite3* db, int64_t run_id) {
  Stmt s(db, "SELECT status FROM run WHERE id = ?1");
  s.bind(1, run_id);
  if (!s.step()) throw Error("results database: no run with id " + std::to_string(run_id));
  const std::string status = s.text(0);
  if (status != "running") {
    throw Error("results database: run " + std::to_string(run_id) + " is " + status +
                ", not running");
  }
}

}  // namespace

void ResultsDb::finish_run(int64_t run_id, const RunRecord& record,
                           const std::vector<Metric>& metrics, double wall_s) {
  // Rows go in primary-key order (B-tree appends, not random inserts). Sorting also finds
  // duplicate keys, reported here rather than as a constraint failure mid-transaction.
  const std::vector<size_t> req_order = key_order(record.requests.size(), [&](size_t i) {
    return std::pair<int64_t, int64_t>{record.requests[i].id, 0};
  });
  for (size_t k = 1; k < req_order.size(); ++k) {
    if (record.requests[req_order[k]].id == record.requests[req_order[k - 1]].id) {
      throw Error("run record has two request samples with id " +
                  std::to_string(record.requests[req_order[k]].id));
    }
  }
  const std::vector<size_t> step_order = key_order(record.steps.size(), [&](size_t i) {
    return std::pair<int64_t, int64_t>{record.steps[i].rank, record.steps[i].step};
  });
  for (size_t k = 1; k < step_order.size(); ++k) {
    const StepSample& a = record.steps[step_order[k - 1]];
    const StepSample& b = record.steps[step_order[k]];
    if (a.rank == b.rank && a.step == b.step) {
      throw Error("run record has two step samples for rank " + std::to_string(a.rank) + " step " +
                  std::to_string(a.step));
    }
  }
  // Stable: a request's chunks keep their record order, which defines idx.
  const std::vector<size_t> chunk_order = key_order(record.chunks.size(), [&](size_t i) {
    return std::pair<int64_t, int64_t>{record.chunks[i].request, 0};
  });

  // A large run skips the per-row foreign-key checks (their only parent is this run, checked
  // once below while the write lock is held). Switching them off and on expires every prepared
  // statement, and preparing the batch INSERTs again costs about a millisecond: more than the
  // checks of a small run's rows, so small runs keep them.
  const size_t sample_rows = record.requests.size() + record.chunks.size() + record.steps.size() +
                             record.timeline.size() + record.rounds.size();
  const bool checks_off = sample_rows >= kForeignKeyChecksOffRows;
  if (checks_off) exec(db_, "PRAGMA foreign_keys = OFF");
  struct RestoreForeignKeys {
    sqlite3* db;
    bool restore;
    ~RestoreForeignKeys() {
      if (restore) sqlite3_exec(db, "PRAGMA foreign_keys = ON", nullptr, nullptr, nullptr);
    }
  } restore{db_, checks_off};
  Transaction txn(db_);
  require_running(db_, run_id);

  RowInserter req = statements_->inserter(
      db_,
      "INSERT INTO request_sample (run_id, request_id, input_len, output_len, "
      "arrival_ns, start_ns, first_token_ns, end_ns, ttft_ms, tpot_ms, e2e_ms, "
      "chunk_count)",
      12, req_order.size());
  for (size_t i : req_order) {
    const RequestSample& r = record.requests[i];
    req.add(run_id, r.id, r.input_len, r.output_len, r.arrival_ns, r.start_ns, r.first_token_ns,
            r.end_ns, request_ttft_ms(r), request_tpot_ms(r), request_e2e_ms(r), r.chunk_count);
  }

  RowInserter chunk =
      statements_->inserter(db_, "INSERT INTO chunk_sample (run_id, request_id, idx, t_ns, tokens)",
                            5, chunk_order.size());
  int32_t idx = 0;
  for (size_t k = 0; k < chunk_order.size(); ++k) {
    const ChunkSample& c = record.chunks[chunk_order[k]];
    if (k > 0 && record.chunks[chunk_order[k - 1]].request != c.request) idx = 0;
    chunk.add(run_id, c.request, idx++, c.t_ns, c.tokens);
  }

  RowInserter step = statements_->inserter(
      db_,
      "INSERT INTO step_sample (run_id, rank, step, end_ns, dur_ns, gpu_busy_ns, "
      "idle_host_ns, idle_launch_ns, idle_dep_ns, batch, prefills, tokens, draft_len, "
      "bytes_read" +
          step_sample_host_columns("") +
          ", host_launch_ns, host_wait_ns, collective_ns, collective_wait_ns)",
      18 + kHostOpCount, step_order.size());
  for (size_t i : step_order) {
    const StepSample& s = record.steps[i];
    step.put(run_id).put(s.rank).put(s.step).put(s.end_ns).put(s.dur_ns).put(s.gpu_busy_ns);
    step.put(s.idle_host_ns).put(s.idle_launch_ns).put(s.idle_dep_ns).put(s.batch);
    step.put(s.prefills).put(s.tokens).put(s.draft_len).put(s.bytes_read);
    for (int op = 0; op < kHostOpCount; ++op) step.put(s.host_ns[op]);
    step.put(s.host_launch_ns).put(s.host_wait_ns).put(s.collective_ns).put(s.collective_wait_ns);
    step.end_row();
  }

  RowInserter span = statements_->inserter(
      db_,
      "INSERT INTO timeline_span (run_id, rank, lane, name, step, start_ns, dur_ns, "
      "flow)",
      8, record.timeline.size());
  for (const TimelineSpan& t : record.timeline) {
    span.add(run_id, t.rank, lane_name(t.lane), t.name ? t.name : "", t.step, t.start_ns, t.dur_ns,
             t.flow);
  }

  RowInserter round =
      statements_->inserter(db_,
                            "INSERT INTO draft_round (run_id, request_id, idx, step, draft_len, "
                            "accepted, confidence)",
                            7, record.rounds.size());
  std::vector<int32_t> round_idx;  // per request: rounds stored so far
  for (const DraftRound& d : record.rounds) {
    if (d.request < 0 || d.draft_len < 1 || d.draft_len > DraftRound::kMaxPositions ||
        d.accepted < 0 || d.accepted > d.draft_len || d.confidence.size() != size_t(d.draft_len)) {
      throw Error("run record: draft round of request " + std::to_string(d.request) + " at step " +
                  std::to_string(d.step) + " is inconsistent (draft_len " +
                  std::to_string(d.draft_len) + ", accepted " + std::to_string(d.accepted) + ", " +
                  std::to_string(d.confidence.size()) + " confidences)");
    }
    if (size_t(d.request) >= round_idx.size()) round_idx.resize(size_t(d.request) + 1, 0);
    std::string conf = "[";
    for (size_t i = 0; i < d.confidence.size(); ++i) {
      if (!std::isfinite(d.confidence[i])) {
        throw Error("run record: draft round of request " + std::to_string(d.request) +
                    " has a non-finite confidence");
      }
      char buf[32];
      std::snprintf(buf, sizeof buf, "%s%.9g", i ? "," : "", double(d.confidence[i]));
      conf += buf;
    }
    conf += "]";
    round.add(run_id, d.request, round_idx[size_t(d.request)]++, d.step, d.draft_len, d.accepted,
              conf);
  }

  Stmt& metric = statements_->get(
      db_, "INSERT INTO metric (run_id, key, value, unit) VALUES (?1, ?2, ?3, ?4)");
  for (const Metric& m : metrics) {
    if (!std::isfinite(m.value)) {
      throw Error("results database: metric " + m.key + " is not finite");
    }
    metric.bind(1, run_id).bind(2, m.key).bind(3, m.value).bind(4, m.unit);
    metric.run();
  }

  Stmt done(db_,
            "UPDATE run SET status = 'complete', error = NULL, ended_at = ?2, wall_s = ?3 "
            "WHERE id = ?1");
  done.bind(1, run_id).bind(2, now_iso8601_utc()).bind(3, wall_s);
  done.run();
  txn.commit();
}

void ResultsDb::fail_run(int64_t run_id, const std::string& status, const std::string& error) {
  if (status != "failed" && status != "interrupted") {
    throw Error("fail_run: status must be \"failed\" or \"interrupted\", got \"" + status + "\"");
  }
  Transaction txn(db_);
  require_running(db_, run_id);
  Stmt s(db_, "UPDATE run SET status = ?2, error = ?3, ended_at = ?4 WHERE id = ?1");
  s.bind(1, run_id).bind(2, status).bind(3, error).bind(4, now_iso8601_utc());
  s.run();
  txn.commit();
}

namespace {
[[noreturn]] void bad_cell(const char* what, const char* want) {
  throw Error(std::string("results database: ") + what + " is not " + want +
              " (was the database edited by hand?)");
}
}  // namespace

const std::string& cell_text(const Cell& c, const char* what) {
  if (const auto* s = std::get_if<std::string>(&c)) return *s;
  bad_cell(what, "text");
}

int64_t cell_int(const Cell& c, const char* what) {
  if (const auto* i = std::get_if<int64_t>(&c)) return *i;
  bad_cell(what, "an integer");
}

double cell_number(const Cell& c, const char* what) {
  if (const auto* d = std::get_if<double>(&c)) return *d;
  if (const auto* i = std::get_if<int64_t>(&c)) return double(*i);
  bad_cell(what, "a number");
}

std::vector<int64_t> ResultsDb::incomplete_runs() {
  // A run redone later (twinstep run --resume) is superseded, not incomplete; one a live process
  // is running is in progress.
  Stmt s(db_,
         "SELECT r.id, r.status, r.owner FROM run r WHERE r.status != 'complete' AND NOT EXISTS "
         "(SELECT 1 FROM run c WHERE c.experiment_id = r.experiment_id AND "
         "c.variant_index = r.variant_index AND c.backend = r.backend AND "
         "c.status = 'complete' AND c.id > r.id) ORDER BY r.id");
  std::vector<int64_t> ids;
  while (s.step()) {
    if (s.text(1) == "running" && process_owner_alive(s.text(2))) continue;
    ids.push_back(s.int64(0));
  }
  return ids;
}

bool ResultsDb::run_in_progress(int64_t run_id) {
  Stmt s(db_, "SELECT status, owner FROM run WHERE id = ?1");
  s.bind(1, run_id);
  if (!s.step()) throw Error("results database: no run with id " + std::to_string(run_id));
  return s.text(0) == "running" && process_owner_alive(s.text(1));
}

// ---- calibration -------------------------------------------------------------------------------

namespace {

void create_calibration_tables(sqlite3* db) {
  exec(db, R"sql(
CREATE TABLE IF NOT EXISTS calibration_session (
  id         INTEGER PRIMARY KEY,
  created_at TEXT NOT NULL,
  command    TEXT NOT NULL,
  git_sha    TEXT NOT NULL,
  gpu_name   TEXT NOT NULL,
  driver     TEXT NOT NULL,
  quick      INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS calibration_sample (
  session_id INTEGER NOT NULL REFERENCES calibration_session(id),
  seq        INTEGER NOT NULL,
  kind       TEXT NOT NULL,
  name       TEXT NOT NULL,
  class      TEXT NOT NULL,
  model      TEXT NOT NULL,
  mode       TEXT NOT NULL,
  batch      INTEGER NOT NULL,
  ctx_tokens INTEGER NOT NULL,
  nodes      INTEGER NOT NULL,
  bytes      INTEGER NOT NULL,
  flops      INTEGER NOT NULL,
  value_ns   REAL NOT NULL,
  PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
)sql");
}

}  // namespace

int64_t ResultsDb::store_calibration(const ProfileHeader& header, bool quick,
                                     const std::vector<CalibrationSample>& samples) {
  Transaction txn(db_);
  create_calibration_tables(db_);
  Stmt session(db_,
               "INSERT INTO calibration_session (created_at, command, git_sha, gpu_name, driver, "
               "quick) VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
  session.bind(1, header.date)
      .bind(2, header.command)
      .bind(3, header.commit)
      .bind(4, header.gpu)
      .bind(5, header.driver)
      .bind(6, int64_t{quick});
  session.run();
  const int64_t id = sqlite3_last_insert_rowid(db_);
  Stmt row(db_,
           "INSERT INTO calibration_sample VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, "
           "?12, ?13)");
  int64_t seq = 0;
  for (const CalibrationSample& s : samples) {
    row.bind(1, id)
        .bind(2, seq++)
        .bind(3, s.kind)
        .bind(4, s.name)
        .bind(5, s.cls)
        .bind(6, s.model)
        .bind(7, s.mode)
        .bind(8, s.batch)
        .bind(9, s.ctx_tokens)
        .bind(10, s.nodes)
        .bind(11, s.bytes)
        .bind(12, s.flops)
        .bind(13, s.value_ns);
    row.run();
  }
  txn.commit();
  return id;
}

std::vector<CalibrationSample> ResultsDb::calibration_samples(int64_t session_id,
                                                              ProfileHeader* header) {
  Stmt has(db_,
           "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = "
           "'calibration_session'");
  has.step();
  if (has.int64(0) == 0) {
    throw Error("results database " + path_ +
                " holds no calibration session (run twinstep calibrate --db " + path_ + ")");
  }
  Stmt session(db_,
               "SELECT id, created_at, command, git_sha, gpu_name, driver FROM "
               "calibration_session WHERE ?1 = 0 OR id = ?1 ORDER BY id DESC LIMIT 1");
  session.bind(1, session_id);
  if (!session.step()) {
    throw Error("results database " + path_ + " has no calibration session " +
                (session_id == 0 ? std::string("at all") : std::to_string(session_id)));
  }
  const int64_t id = session.int64(0);
  if (header != nullptr) {
    *header = {session.text(2), session.text(3), session.text(4), session.text(5), session.text(1)};
  }
  Stmt rows(db_,
            "SELECT kind, name, class, model, mode, batch, ctx_tokens, nodes, bytes, flops, "
            "value_ns FROM calibration_sample WHERE session_id = ?1 ORDER BY seq");
  rows.bind(1, id);
  std::vector<CalibrationSample> out;
  while (rows.step()) {
    CalibrationSample s;
    s.kind = rows.text(0);
    s.name = rows.text(1);
    s.cls = rows.text(2);
    s.model = rows.text(3);
    s.mode = rows.text(4);
    s.batch = rows.int64(5);
    s.ctx_tokens = rows.int64(6);
    s.nodes = rows.int64(7);
    s.bytes = rows.int64(8);
    s.flops = rows.int64(9);
    s.value_ns = rows.number(10);
    out.push_back(std::move(s));
  }
  return out;
}

QueryResult ResultsDb::query(const std::string& sql, bool allow_write) {
  return query_params(sql, {}, allow_write);
}

QueryResult ResultsDb::query_params(const std::string& sql, const std::vector<Cell>& params,
                                    bool allow_write) {
  // Second line of defence behind sqlite3_stmt_readonly: the connection refuses writes.
  struct QueryOnly {
    sqlite3* db;
    bool on;
    QueryOnly(sqlite3* d, bool enable) : db(d), on(enable) {
      if (on) exec(db, "PRAGMA query_only = ON");
    }
    ~QueryOnly() {
      if (on) sqlite3_exec(db, "PRAGMA query_only = OFF", nullptr, nullptr, nullptr);
    }
  } query_only(db_, !allow_write);

  QueryResult result;
  const char* tail = sql.c_str();
  int statements = 0;
  while (tail && *tail) {
    sqlite3_stmt* raw = nullptr;
    const char* next = nullptr;
    if (sqlite3_prepare_v2(db_, tail, -1, &raw, &next) != SQLITE_OK) {
      throw Error(std::string("SQL error: ") + sqlite3_errmsg(db_));
    }
    tail = next;
    if (!raw) continue;  // whitespace or a comment
    std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt*)> stmt(raw, sqlite3_finalize);
    ++statements;
    if (!params.empty() && statements > 1) {
      throw Error("SQL error: query parameters need a single statement");
    }
    if (!allow_write && !sqlite3_stmt_readonly(raw)) {
      throw Error("query is read-only: \"" + std::string(sqlite3_sql(raw)) +
                  "\" would modify the database");
    }
    if (!params.empty() && sqlite3_bind_parameter_count(raw) != static_cast<int>(params.size())) {
      throw Error("SQL error: statement has " + std::to_string(sqlite3_bind_parameter_count(raw)) +
                  " parameters, " + std::to_string(params.size()) + " given");
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const int idx = static_cast<int>(i) + 1;
      const Cell& p = params[i];
      int rc = SQLITE_OK;
      if (const auto* v = std::get_if<int64_t>(&p)) {
        rc = sqlite3_bind_int64(raw, idx, *v);
      } else if (const auto* d = std::get_if<double>(&p)) {
        rc = sqlite3_bind_double(raw, idx, *d);
      } else if (const auto* t = std::get_if<std::string>(&p)) {
        rc = sqlite3_bind_text(raw, idx, t->data(), static_cast<int>(t->size()), SQLITE_TRANSIENT);
      } else {
        rc = sqlite3_bind_null(raw, idx);
      }
      if (rc != SQLITE_OK) throw Error(std::string("SQL error: ") + sqlite3_errmsg(db_));
    }
    const int columns = sqlite3_column_count(raw);
    QueryResult current;
    for (int c = 0; c < columns; ++c) current.columns.push_back(sqlite3_column_name(raw, c));
    for (;;) {
      const int rc = sqlite3_step(raw);
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) throw Error(std::string("SQL error: ") + sqlite3_errmsg(db_));
      std::vector<Cell> row;
      row.reserve(columns);
      for (int c = 0; c < columns; ++c) row.push_back(column_cell(raw, c));
      current.rows.push_back(std::move(row));
    }
    if (columns > 0) result = std::move(current);
  }
  return result;
}

}  // namespace twinstep
