#include "results/db.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "policies/error.h"
#include "results/build_info.h"
#include "results/metrics.h"
#include "sample_record.h"

namespace twinstep {
namespace {

namespace fs = std::filesystem;
using testing::hand_record;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string templ = (fs::temp_directory_path() / "twinstep_db_test_XXXXXX").string();
    path_ = mkdtemp(templ.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

RunInfo sample_info(const std::string& yaml = "name: demo\n") {
  RunInfo info;
  info.experiment_name = "demo";
  info.yaml_text = yaml;
  info.source_path = "experiments/demo.yaml";
  info.variant_index = 1;
  info.variant_label = "policies.host_schedule=run_ahead, draft_len=5";
  info.variant_params = {{"policies.host_schedule", "run_ahead"},
                         {"draft_len", "5"},
                         {"greedy", "true"},
                         {"odd", "5x"}};
  info.backend = "sim";
  info.seed = 18446744073709551615ULL;  // 2^64 - 1: does not fit int64
  return info;
}

int64_t scalar_int(ResultsDb& db, const std::string& sql) {
  const QueryResult r = db.query(sql);
  return std::get<int64_t>(r.rows.at(0).at(0));
}

std::string scalar_text(ResultsDb& db, const std::string& sql) {
  const QueryResult r = db.query(sql);
  return std::get<std::string>(r.rows.at(0).at(0));
}

double scalar_real(ResultsDb& db, const std::string& sql) {
  const QueryResult r = db.query(sql);
  return std::get<double>(r.rows.at(0).at(0));
}

TEST(ResultsDb, RoundTrip) {
  TempDir dir;
  auto db = ResultsDb::open(dir.file("r.db"));
  const int64_t id = db.begin_run(sample_info());
  EXPECT_EQ(scalar_text(db, "SELECT status FROM run WHERE id = " + std::to_string(id)), "running");
  const RunRecord rec = hand_record();
  db.finish_run(id, rec, compute_metrics(rec, {4.0}), 1.25);

  const std::string where = " WHERE run_id = " + std::to_string(id);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM request_sample" + where), 3);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM chunk_sample" + where), 7);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM step_sample" + where), 3);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM timeline_span" + where), 4);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM metric" + where),
            static_cast<int64_t>(metric_definitions().size()));

  // Per-request derived columns: r0 TTFT 100, TPOT 100, E2E 400; r1 TPOT NULL (one token).
  const QueryResult req =
      db.query("SELECT request_id, ttft_ms, tpot_ms, e2e_ms, chunk_count FROM request_sample" +
               where + " ORDER BY request_id");
  ASSERT_EQ(req.rows.size(), 3u);
  EXPECT_DOUBLE_EQ(std::get<double>(req.rows[0][1]), 100);
  EXPECT_DOUBLE_EQ(std::get<double>(req.rows[0][2]), 100);
  EXPECT_DOUBLE_EQ(std::get<double>(req.rows[0][3]), 400);
  EXPECT_EQ(std::get<int64_t>(req.rows[0][4]), 3);
  EXPECT_TRUE(std::holds_alternative<std::monostate>(req.rows[1][2]));
  EXPECT_DOUBLE_EQ(std::get<double>(req.rows[2][2]), 500);

  // Chunk positions within a request; tokens sum to the output lengths (4 + 1 + 3).
  EXPECT_EQ(scalar_text(db,
                        "SELECT group_concat(idx || ':' || (t_ns / 1000000), ' ') FROM "
                        "(SELECT * FROM chunk_sample" +
                            where + " AND request_id = 0 ORDER BY idx)"),
            "0:100 1:250 2:400");
  EXPECT_EQ(scalar_int(db, "SELECT sum(tokens) FROM chunk_sample" + where), 8);

  // Step columns, including the per-op host times: s2 prepare_decode 6 ms, launch 1.5 ms.
  const QueryResult step = db.query(
      "SELECT batch, tokens, draft_len, bytes_read, host_prepare_decode_ns, host_launch_ns, "
      "host_wait_ns, host_schedule_ns, host_prepare_prefill_ns, host_process_outputs_ns "
      "FROM step_sample" +
      where + " AND step = 2");
  ASSERT_EQ(step.rows.size(), 1u);
  const std::vector<int64_t> expect_step = {
      2, 3, 3, 40'000'000'000, 6'000'000, 1'500'000, 4'000'000, 3'000'000, 4'000'000, 1'000'000};
  for (size_t c = 0; c < expect_step.size(); ++c) {
    EXPECT_EQ(std::get<int64_t>(step.rows[0][c]), expect_step[c]) << step.columns[c];
  }

  EXPECT_EQ(scalar_text(db,
                        "SELECT group_concat(lane || '/' || name || '/' || flow, ' ') FROM "
                        "(SELECT * FROM timeline_span" +
                            where + " ORDER BY start_ns)"),
            "host/prepare_decode/0 host/launch/7 compute/decode_graph/7 copy/copy_out/0");

  // Metrics as computed: tpot_ms_mean 300 (see metrics_test.cc), unit kept.
  EXPECT_DOUBLE_EQ(
      scalar_real(db, "SELECT value FROM metric" + where + " AND key = 'tpot_ms_mean'"), 300);
  EXPECT_EQ(scalar_text(db, "SELECT unit FROM metric" + where + " AND key = 'achieved_tbps'"),
            "TB/s");

  // Run row: status, seed as exact decimal text, parameters as a JSON object.
  const std::string run = " FROM run WHERE id = " + std::to_string(id);
  EXPECT_EQ(scalar_text(db, "SELECT status" + run), "complete");
  EXPECT_EQ(scalar_text(db, "SELECT seed" + run), "18446744073709551615");
  EXPECT_DOUBLE_EQ(scalar_real(db, "SELECT wall_s" + run), 1.25);
  EXPECT_EQ(scalar_int(db, "SELECT ended_at IS NOT NULL AND error IS NULL" + run), 1);
  EXPECT_EQ(
      scalar_int(db, "SELECT length(started_at) = 24 AND started_at LIKE '____-__-__T%Z'" + run),
      1);
  EXPECT_EQ(scalar_text(db, "SELECT variant_json" + run),
            R"({"policies.host_schedule":"run_ahead","draft_len":5,"greedy":true,"odd":"5x"})");
  EXPECT_EQ(scalar_int(db, "SELECT json_extract(variant_json, '$.draft_len')" + run), 5);
  EXPECT_EQ(
      scalar_text(db, "SELECT json_extract(variant_json, '$.\"policies.host_schedule\"')" + run),
      "run_ahead");
  EXPECT_EQ(scalar_text(db, "SELECT backend" + run), "sim");

  // Build, host and experiment rows.
  EXPECT_EQ(scalar_text(db, "SELECT b.git_sha FROM build b JOIN run r ON r.build_id = b.id"),
            build_info().git_sha);
  EXPECT_EQ(scalar_text(db, "SELECT h.hostname FROM host h JOIN run r ON r.host_id = h.id"),
            host_info().hostname);
  EXPECT_EQ(scalar_int(db, "SELECT h.gpu_name IS NULL FROM host h"), 1);
  EXPECT_EQ(scalar_text(db, "SELECT yaml_hash FROM experiment"), fnv1a64_hex("name: demo\n"));
  EXPECT_EQ(scalar_text(db, "SELECT yaml_text FROM experiment"), "name: demo\n");
}

// finish_run writes many rows per statement: every row of every table must come back as it was
// given, whatever the count relative to the batch size (0, 1, a batch - 1, a batch, a batch + 1,
// two batches + 1), with the foreign-key checks on (small runs) or off (2100 rows in each of 4
// tables: a large run).
TEST(ResultsDb, EveryRowRoundTripsAcrossInsertBatches) {
  std::mt19937_64 rng(20261202);
  auto value = [&] { return int64_t(rng() >> 2); };
  for (const int n : {0, 1, 31, 32, 33, 65, 2100}) {
    SCOPED_TRACE("rows per table " + std::to_string(n));
    auto db = ResultsDb::open(":memory:");
    const int64_t id = db.begin_run(sample_info());
    RunRecord rec;
    const int32_t requests = 3;
    for (int32_t r = 0; r < requests; ++r) {
      RequestSample q;
      q.id = r;
      q.input_len = int32_t(rng() % 9000);
      q.output_len = int32_t(rng() % 900);
      q.start_ns = value();
      rec.requests.push_back(q);
    }
    for (int i = 0; i < n; ++i) {
      rec.chunks.push_back({int32_t(rng() % requests), int32_t(1 + rng() % 16), value()});
      StepSample s;
      s.rank = i % 3;
      s.step = i;
      for (int64_t* f : {&s.end_ns, &s.dur_ns, &s.gpu_busy_ns, &s.idle_host_ns, &s.idle_launch_ns,
                         &s.idle_dep_ns, &s.collective_ns, &s.collective_wait_ns, &s.bytes_read,
                         &s.host_launch_ns, &s.host_wait_ns}) {
        *f = value();
      }
      for (int64_t& h : s.host_ns) h = value();
      s.batch = int32_t(rng() % 1000);
      s.prefills = int32_t(rng() % 1000);
      s.tokens = int32_t(rng() % 1000);
      s.draft_len = int32_t(rng() % 17);
      rec.steps.push_back(s);
      static const char* const kNames[] = {"decode_graph", "launch", "copy_out"};
      rec.timeline.push_back(
          {s.rank, Lane(i % 3), kNames[i % 3], s.step, value(), value(), int64_t(i)});
      DraftRound d;
      d.request = int32_t(rng() % requests);
      d.step = i;
      d.draft_len = int32_t(1 + rng() % 8);
      d.accepted = int32_t(rng() % (d.draft_len + 1));
      for (int32_t k = 0; k < d.draft_len; ++k) d.confidence.push_back(float(k + 1) / 16.0f);
      rec.rounds.push_back(d);
    }
    db.finish_run(id, rec, {}, 0.5);

    // Chunks: by request, then record order (idx).
    std::vector<std::string> want, got;
    std::vector<int32_t> next_idx(requests, 0);
    std::vector<std::vector<std::string>> by_request(requests);
    for (const ChunkSample& c : rec.chunks) {
      by_request[size_t(c.request)].push_back(
          std::to_string(c.request) + "/" + std::to_string(next_idx[size_t(c.request)]++) + "/" +
          std::to_string(c.t_ns) + "/" + std::to_string(c.tokens));
    }
    for (const auto& rows : by_request) want.insert(want.end(), rows.begin(), rows.end());
    for (const auto& row : db.query("SELECT request_id || '/' || idx || '/' || t_ns || '/' || "
                                    "tokens FROM chunk_sample ORDER BY request_id, idx")
                               .rows) {
      got.push_back(std::get<std::string>(row[0]));
    }
    EXPECT_EQ(got, want);

    // Steps: every column, by (rank, step).
    std::vector<StepSample> steps = rec.steps;
    std::stable_sort(steps.begin(), steps.end(), [](const StepSample& a, const StepSample& b) {
      return std::pair(a.rank, a.step) < std::pair(b.rank, b.step);
    });
    std::string host_cols;
    for (int op = 0; op < kHostOpCount; ++op) {
      host_cols += std::string(", host_") + host_op_db_name(HostOp(op)) + "_ns";
    }
    const QueryResult step_rows = db.query(
        "SELECT rank, step, end_ns, dur_ns, gpu_busy_ns, idle_host_ns, idle_launch_ns, "
        "idle_dep_ns, collective_ns, collective_wait_ns, batch, prefills, tokens, draft_len, "
        "bytes_read, host_launch_ns, host_wait_ns" +
        host_cols + " FROM step_sample ORDER BY rank, step");
    ASSERT_EQ(step_rows.rows.size(), steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      const StepSample& s = steps[i];
      std::vector<int64_t> expect = {
          s.rank,           s.step,           s.end_ns,      s.dur_ns,        s.gpu_busy_ns,
          s.idle_host_ns,   s.idle_launch_ns, s.idle_dep_ns, s.collective_ns, s.collective_wait_ns,
          s.batch,          s.prefills,       s.tokens,      s.draft_len,     s.bytes_read,
          s.host_launch_ns, s.host_wait_ns};
      expect.insert(expect.end(), s.host_ns.begin(), s.host_ns.end());
      for (size_t c = 0; c < expect.size(); ++c) {
        ASSERT_EQ(std::get<int64_t>(step_rows.rows[i][c]), expect[c])
            << "step row " << i << " column " << step_rows.columns[c];
      }
    }

    // Timeline spans, in record order (flow numbers them here).
    want.clear();
    got.clear();
    for (const TimelineSpan& t : rec.timeline) {
      want.push_back(std::to_string(t.rank) + "/" +
                     (t.lane == Lane::kHost      ? "host"
                      : t.lane == Lane::kCompute ? "compute"
                                                 : "copy") +
                     "/" + t.name + "/" + std::to_string(t.step) + "/" +
                     std::to_string(t.start_ns) + "/" + std::to_string(t.dur_ns));
    }
    for (const auto& row :
         db.query("SELECT rank || '/' || lane || '/' || name || '/' || step || '/' || start_ns || "
                  "'/' || dur_ns FROM timeline_span ORDER BY flow")
             .rows) {
      got.push_back(std::get<std::string>(row[0]));
    }
    EXPECT_EQ(got, want);

    // Draft rounds: idx counts a request's rounds in record order.
    want.clear();
    got.clear();
    std::fill(next_idx.begin(), next_idx.end(), 0);
    by_request.assign(requests, {});
    for (const DraftRound& d : rec.rounds) {
      by_request[size_t(d.request)].push_back(
          std::to_string(d.request) + "/" + std::to_string(next_idx[size_t(d.request)]++) + "/" +
          std::to_string(d.step) + "/" + std::to_string(d.draft_len) + "/" +
          std::to_string(d.accepted) + "/" + std::to_string(d.draft_len / 16.0));
    }
    for (const auto& rows : by_request) want.insert(want.end(), rows.begin(), rows.end());
    for (const auto& row : db.query("SELECT request_id || '/' || idx || '/' || step || '/' || "
                                    "draft_len || '/' || accepted || '/' || "
                                    "printf('%f', json_extract(confidence, '$[#-1]')) "
                                    "FROM draft_round ORDER BY request_id, idx")
                               .rows) {
      got.push_back(std::get<std::string>(row[0]));
    }
    EXPECT_EQ(got, want);
    EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM request_sample"), requests);
    EXPECT_EQ(scalar_text(db, "SELECT status FROM run"), "complete");
    EXPECT_EQ(scalar_int(db, "PRAGMA foreign_keys"), 1);  // on again after a large run
  }
}

TEST(ResultsDb, DeduplicatesBuildHostAndExperiment) {
  auto db = ResultsDb::open(":memory:");
  db.begin_run(sample_info());
  db.begin_run(sample_info());
  RunInfo changed = sample_info("name: demo\nsteps: 2\n");
  db.begin_run(changed);
  RunInfo gpu = sample_info();
  gpu.backend = "real";
  gpu.gpu_name = "NVIDIA H200";
  db.begin_run(gpu);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM run"), 4);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM build"), 1);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM experiment"), 2);  // same name, two YAML texts
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM host"), 2);        // without and with a GPU
  EXPECT_EQ(scalar_int(db, "SELECT count(DISTINCT experiment_id) FROM run"), 2);
}

TEST(ResultsDb, Fnv1a64KnownVectors) {
  // Published FNV-1a 64 test vectors.
  EXPECT_EQ(fnv1a64_hex(""), "cbf29ce484222325");
  EXPECT_EQ(fnv1a64_hex("a"), "af63dc4c8601ec8c");
  EXPECT_EQ(fnv1a64_hex("foobar"), "85944171f73967e8");
}

TEST(ResultsDb, SchemaVersionAndPragmas) {
  TempDir dir;
  const std::string path = dir.file("v.db");
  {
    auto db = ResultsDb::open(path);
    EXPECT_EQ(db.schema_version(), ResultsDb::kSchemaVersion);
    EXPECT_EQ(scalar_int(db, "PRAGMA user_version"), 5);
    EXPECT_EQ(std::get<std::string>(db.query("PRAGMA journal_mode", true).rows.at(0).at(0)), "wal");
    EXPECT_EQ(scalar_int(db, "PRAGMA foreign_keys"), 1);
    EXPECT_EQ(scalar_text(db,
                          "SELECT group_concat(name, ',') FROM (SELECT name FROM "
                          "sqlite_schema WHERE type = 'table' ORDER BY name)"),
              "build,chunk_sample,draft_round,experiment,host,metric,request_sample,run,"
              "step_sample,timeline_span");
    db.begin_run(sample_info());
  }
  // Reopening an up-to-date database keeps its data (no migration re-run).
  auto db = ResultsDb::open(path);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM run"), 1);
  // Moving works; the moved-from object is inert.
  ResultsDb moved = std::move(db);
  EXPECT_EQ(scalar_int(moved, "SELECT count(*) FROM run"), 1);
}

void raw_exec(const std::string& path, const std::string& sql) {
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(raw);
}

std::string open_error(const std::string& path) {
  try {
    ResultsDb::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A version-1 database (no step_sample.collective_ns) is migrated in place on open, keeping
// its runs; new steps store the column.
TEST(ResultsDb, MigratesVersion1) {
  TempDir dir;
  const std::string path = dir.file("v1.db");
  ResultsDb::open(path).begin_run(sample_info());
  raw_exec(path,
           "DROP TABLE draft_round; ALTER TABLE step_sample DROP COLUMN collective_ns; "
           "ALTER TABLE step_sample DROP COLUMN collective_wait_ns; "
           "ALTER TABLE run DROP COLUMN owner; PRAGMA user_version = 1;");
  auto db = ResultsDb::open(path);
  EXPECT_EQ(scalar_int(db, "PRAGMA user_version"), 5);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM run"), 1);
  RunRecord record = hand_record();
  record.steps[0].collective_ns = 1234;
  const int64_t id = db.begin_run(sample_info());
  db.finish_run(id, record, {}, 0.1);
  EXPECT_EQ(
      scalar_int(db, "SELECT collective_ns FROM step_sample WHERE run_id = " + std::to_string(id) +
                         " AND step = " + std::to_string(record.steps[0].step)),
      1234);
}

// A version-2 database (no draft_round) gains the table on open, keeping its runs.
TEST(ResultsDb, MigratesVersion2) {
  TempDir dir;
  const std::string path = dir.file("v2.db");
  ResultsDb::open(path).begin_run(sample_info());
  raw_exec(path,
           "DROP TABLE draft_round; ALTER TABLE step_sample DROP COLUMN collective_wait_ns; "
           "ALTER TABLE run DROP COLUMN owner; PRAGMA user_version = 2;");
  auto db = ResultsDb::open(path);
  EXPECT_EQ(scalar_int(db, "PRAGMA user_version"), 5);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM run"), 1);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM draft_round"), 0);
}

// A version-3 database (no step_sample.collective_wait_ns) gains the column on open, its old rows
// 0; new steps store it.
TEST(ResultsDb, MigratesVersion3) {
  TempDir dir;
  const std::string path = dir.file("v3.db");
  {
    auto old = ResultsDb::open(path);
    const int64_t id = old.begin_run(sample_info());
    old.finish_run(id, hand_record(), {}, 0.1);
  }
  raw_exec(path,
           "ALTER TABLE step_sample DROP COLUMN collective_wait_ns; "
           "ALTER TABLE run DROP COLUMN owner; PRAGMA user_version = 3;");
  auto db = ResultsDb::open(path);
  EXPECT_EQ(scalar_int(db, "PRAGMA user_version"), 5);
  const int64_t old_steps = scalar_int(db, "SELECT count(*) FROM step_sample");
  EXPECT_GT(old_steps, 0);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM step_sample WHERE collective_wait_ns = 0"),
            old_steps);
  RunRecord record = hand_record();
  record.steps[0].collective_ns = 900;
  record.steps[0].collective_wait_ns = 700;
  const int64_t id = db.begin_run(sample_info());
  db.finish_run(id, record, {}, 0.1);
  EXPECT_EQ(scalar_int(db, "SELECT collective_wait_ns FROM step_sample WHERE run_id = " +
                               std::to_string(id) +
                               " AND step = " + std::to_string(record.steps[0].step)),
            700);
}

// A version-4 database (no run.owner) gains the column on open; its 'running' rows have no owner,
// so they are reported as never completed even though this very process began them.
TEST(ResultsDb, MigratesVersion4) {
  TempDir dir;
  const std::string path = dir.file("v4.db");
  const int64_t old_id = ResultsDb::open(path).begin_run(sample_info());
  raw_exec(path, "ALTER TABLE run DROP COLUMN owner; PRAGMA user_version = 4;");
  auto db = ResultsDb::open(path);
  EXPECT_EQ(scalar_int(db, "PRAGMA user_version"), 5);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM run WHERE owner IS NULL"), 1);
  EXPECT_FALSE(db.run_in_progress(old_id));
  const int64_t id = db.begin_run(sample_info());
  EXPECT_TRUE(db.run_in_progress(id));
  EXPECT_EQ(db.incomplete_runs(), std::vector<int64_t>{old_id});
}

// Verify rounds are stored one row per round, numbered per request in record order, with the
// confidences as a JSON array that json_each expands by position.
TEST(ResultsDb, StoresDraftRounds) {
  auto db = ResultsDb::open(":memory:");
  RunRecord record = hand_record();
  record.rounds = {
      {0, 3, 2, 1, {0.75f, 0.25f}}, {1, 3, 3, 3, {0.5f, 0.125f, 1.0f}}, {0, 4, 1, 0, {0.0625f}}};
  const int64_t id = db.begin_run(sample_info());
  db.finish_run(id, record, {}, 0.1);
  const std::string where = " FROM draft_round WHERE run_id = " + std::to_string(id);
  EXPECT_EQ(scalar_int(db, "SELECT count(*)" + where), 3);
  EXPECT_EQ(scalar_text(db, "SELECT group_concat(idx || ':' || step || ':' || accepted, ' ')" +
                                where + " AND request_id = 0 ORDER BY idx"),
            "0:3:1 1:4:0");
  EXPECT_EQ(scalar_text(db, "SELECT confidence" + where + " AND request_id = 1"), "[0.5,0.125,1]");
  // Position 2's confidence over all rounds that drafted it.
  EXPECT_EQ(scalar_text(db,
                        "SELECT group_concat(j.value, ',') FROM draft_round r, "
                        "json_each(r.confidence) j WHERE j.key = 1 ORDER BY r.request_id"),
            "0.25,0.125");
}

// An inconsistent round (more confidences than drafted tokens, or accepted > draft_len) fails
// the whole run's write: nothing of it is stored.
TEST(ResultsDb, RejectsInconsistentDraftRounds) {
  auto db = ResultsDb::open(":memory:");
  for (const DraftRound& bad : {DraftRound{0, 1, 2, 1, {0.5f}}, DraftRound{0, 1, 1, 2, {0.5f}},
                                DraftRound{0, 1, 0, 0, {}}}) {
    RunRecord record = hand_record();
    record.rounds = {bad};
    const int64_t id = db.begin_run(sample_info());
    try {
      db.finish_run(id, record, {}, 0.1);
      ADD_FAILURE() << "accepted a draft round of length " << bad.draft_len;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("inconsistent"), std::string::npos) << e.what();
    }
    EXPECT_EQ(
        scalar_int(db, "SELECT count(*) FROM step_sample WHERE run_id = " + std::to_string(id)), 0);
    EXPECT_EQ(scalar_text(db, "SELECT status FROM run WHERE id = " + std::to_string(id)),
              "running");
  }
}

TEST(ResultsDb, RejectsNewerSchema) {
  TempDir dir;
  const std::string path = dir.file("future.db");
  raw_exec(path, "CREATE TABLE future (x); PRAGMA user_version = 99;");
  const std::string error = open_error(path);
  EXPECT_NE(error.find("schema version 99"), std::string::npos) << error;
  EXPECT_NE(error.find("newer"), std::string::npos) << error;
}

TEST(ResultsDb, RejectsForeignDatabasesAndMissingDirectories) {
  TempDir dir;
  const std::string foreign = dir.file("foreign.db");
  raw_exec(foreign, "CREATE TABLE t (x);");
  EXPECT_NE(open_error(foreign).find("not a twinstep database"), std::string::npos);

  const std::string garbage = dir.file("garbage.db");
  std::ofstream(garbage) << "this is not a database, just text that is long enough to matter.";
  EXPECT_NE(open_error(garbage).find("garbage.db"), std::string::npos) << open_error(garbage);

  const std::string missing = dir.file("no/such/dir/r.db");
  const std::string error = open_error(missing);
  EXPECT_NE(error.find("does not exist"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(dir.file("no")));
}

// Another connection's write transaction: a writer waits for it (the run's samples of another
// process are one transaction), and past its wait fails saying which database and why.
TEST(ResultsDb, WaitsForAnotherWriterThenSaysTheDatabaseIsLocked) {
  TempDir dir;
  const std::string path = dir.file("shared.db");
  auto db = ResultsDb::open(path);
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);

  db.set_busy_timeout_ms(50);
  std::string error;
  try {
    db.begin_run(sample_info());
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("results database " + fs::canonical(path).string() + " is locked"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("another process"), std::string::npos) << error;
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM run"), 0);  // readers are not blocked
  // Nor is opening a current database (what `query` and `compare` do while a run is written).
  auto reader = ResultsDb::open(path);
  EXPECT_EQ(scalar_int(reader, "SELECT count(*) FROM run"), 0);

  // With the default wait, a write issued while the other transaction is open goes through once
  // it commits.
  db.set_busy_timeout_ms(ResultsDb::kBusyTimeoutMs);
  std::thread release([other] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr);
  });
  const auto start = std::chrono::steady_clock::now();
  const int64_t run_id = db.begin_run(sample_info());
  const double waited_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  release.join();
  sqlite3_close(other);
  EXPECT_GE(waited_s, 0.25);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM run WHERE status = 'running'"), 1);
  EXPECT_EQ(scalar_int(db, "SELECT max(id) FROM run"), run_id);
}

TEST(ResultsDb, QueryIsReadOnlyUnlessAllowed) {
  auto db = ResultsDb::open(":memory:");
  db.begin_run(sample_info());
  EXPECT_THROW(db.query("DELETE FROM run"), Error);
  EXPECT_THROW(db.query("SELECT 1; UPDATE run SET status = 'failed'"), Error);
  EXPECT_THROW(db.query("PRAGMA user_version = 5"), Error);
  EXPECT_EQ(scalar_text(db, "SELECT status FROM run"), "running");
  try {
    db.query("DROP TABLE run");
    FAIL() << "DROP accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("read-only"), std::string::npos) << e.what();
  }
  db.query("UPDATE run SET variant_label = 'x'", /*allow_write=*/true);
  EXPECT_EQ(scalar_text(db, "SELECT variant_label FROM run"), "x");
  // Writes are possible again after a read-only query (query_only switched back off).
  db.begin_run(sample_info());
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM run"), 2);
}

TEST(ResultsDb, QueryErrorsAndResults) {
  auto db = ResultsDb::open(":memory:");
  try {
    db.query("SELEC 1");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("syntax error"), std::string::npos) << e.what();
  }
  EXPECT_THROW(db.query("SELECT * FROM no_such_table"), Error);
  // Storage classes come back as their own alternatives; the last statement with columns wins.
  const QueryResult r = db.query("SELECT 0; SELECT 1 AS i, 2.5 AS r, 'x' AS t, NULL AS n");
  ASSERT_EQ(r.columns, (std::vector<std::string>{"i", "r", "t", "n"}));
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(std::get<int64_t>(r.rows[0][0]), 1);
  EXPECT_EQ(std::get<double>(r.rows[0][1]), 2.5);
  EXPECT_EQ(std::get<std::string>(r.rows[0][2]), "x");
  EXPECT_TRUE(std::holds_alternative<std::monostate>(r.rows[0][3]));
  const QueryResult p = db.query_params("SELECT ?1 + ?2, ?3", {int64_t{40}, 2.5, "s"});
  EXPECT_EQ(std::get<double>(p.rows[0][0]), 42.5);
  EXPECT_EQ(std::get<std::string>(p.rows[0][1]), "s");
  EXPECT_THROW(db.query_params("SELECT ?1", {int64_t{1}, int64_t{2}}), Error);
  EXPECT_TRUE(db.query("").columns.empty());
}

// run.owner: this process is alive; a child that has exited, a reused pid (another start time),
// another boot and malformed owners are not.
TEST(ProcessOwner, AliveOnlyForTheSameRunningProcess) {
  const std::string self = this_process_owner();
  ASSERT_FALSE(self.empty()) << "no /proc here";
  EXPECT_EQ(self.substr(self.find('/') + 1, self.rfind('/') - self.find('/') - 1),
            std::to_string(getpid()));
  EXPECT_TRUE(process_owner_alive(self));
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // the child reports its own owner, then exits
    close(fds[0]);
    const std::string child = this_process_owner();
    const ssize_t n = write(fds[1], child.data(), child.size());
    _exit(n == ssize_t(child.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string child;
  char buf[256];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) child.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_NE(child.find("/" + std::to_string(pid) + "/"), std::string::npos) << child;
  EXPECT_FALSE(process_owner_alive(child));
  const std::string boot = self.substr(0, self.find('/'));
  const std::string rest = self.substr(self.find('/'));
  EXPECT_FALSE(process_owner_alive(self.substr(0, self.rfind('/')) + "/1"));
  EXPECT_FALSE(process_owner_alive("00000000-0000-0000-0000-000000000000" + rest));
  for (const char* bad : {"", "x", "a/b", "/1/2", "boot/12x/5", "boot//5"})
    EXPECT_FALSE(process_owner_alive(bad)) << bad;
  EXPECT_FALSE(process_owner_alive(boot + "/" + std::to_string(getpid()) + "/"));
}

TEST(ResultsDb, FailAndIncompleteRuns) {
  auto db = ResultsDb::open(":memory:");
  const int64_t a = db.begin_run(sample_info());
  const int64_t b = db.begin_run(sample_info());
  const int64_t c = db.begin_run(sample_info());
  const int64_t d = db.begin_run(sample_info());
  const RunRecord rec = hand_record();
  db.finish_run(b, rec, {}, 0.5);
  db.fail_run(c, "failed", "CUDA error: out of memory");
  db.fail_run(d, "interrupted", "SIGINT");
  // All four are the same variant and backend: b (complete) supersedes the earlier a, not the
  // later c and d, which were redone after it.
  EXPECT_EQ(db.incomplete_runs(), (std::vector<int64_t>{c, d}));
  // A different variant is not superseded by b; while this process runs it, it is in progress.
  RunInfo other = sample_info();
  other.variant_index = 7;
  const int64_t e = db.begin_run(other);
  EXPECT_TRUE(db.run_in_progress(e));
  EXPECT_FALSE(db.run_in_progress(c));
  EXPECT_EQ(db.incomplete_runs(), (std::vector<int64_t>{c, d}));
  // Once its process is gone (here: another start time for this pid), it never completed.
  const std::string owner = this_process_owner();
  ASSERT_FALSE(owner.empty());
  db.query_params("UPDATE run SET owner = ?1 WHERE id = ?2",
                  {Cell(owner.substr(0, owner.rfind('/')) + "/0"), Cell(e)}, true);
  EXPECT_FALSE(db.run_in_progress(e));
  EXPECT_EQ(db.incomplete_runs(), (std::vector<int64_t>{c, d, e}));
  EXPECT_THROW(db.run_in_progress(999), Error);
  (void)a;
  EXPECT_EQ(scalar_text(db, "SELECT error FROM run WHERE id = " + std::to_string(c)),
            "CUDA error: out of memory");
  EXPECT_EQ(scalar_text(db, "SELECT status FROM run WHERE id = " + std::to_string(d)),
            "interrupted");
  EXPECT_THROW(db.fail_run(b, "failed", "late"), Error);  // complete already
  EXPECT_THROW(db.fail_run(a, "complete", "x"), Error);   // not a failure status
  EXPECT_THROW(db.finish_run(b, rec, {}, 0.5), Error);    // finished twice
  EXPECT_THROW(db.finish_run(999, rec, {}, 0.5), Error);  // no such run
  RunInfo bad = sample_info();
  bad.backend = "gpu";
  EXPECT_THROW(db.begin_run(bad), Error);
}

TEST(ResultsDb, FailedFinishKeepsNothing) {
  auto db = ResultsDb::open(":memory:");
  const int64_t id = db.begin_run(sample_info());
  // A duplicate metric key violates the primary key after every sample was inserted.
  const std::vector<Metric> dup = {{"x", 1, "ms"}, {"x", 2, "ms"}};
  EXPECT_THROW(db.finish_run(id, hand_record(), dup, 1), Error);
  EXPECT_EQ(scalar_text(db, "SELECT status FROM run"), "running");
  EXPECT_EQ(scalar_int(db,
                       "SELECT (SELECT count(*) FROM step_sample) + (SELECT count(*) FROM "
                       "chunk_sample) + (SELECT count(*) FROM request_sample) + (SELECT "
                       "count(*) FROM metric)"),
            0);
  // The run can still be finished properly.
  db.finish_run(id, hand_record(), {{"x", 1, "ms"}}, 1);
  EXPECT_EQ(scalar_text(db, "SELECT status FROM run"), "complete");
}

// A run deleted with foreign keys off (the sqlite3 shell's default) leaves its samples; SQLite
// gives the next run the same id. The new run must start empty and finish (it failed with
// "UNIQUE constraint failed: request_sample.run_id, request_sample.request_id" before).
TEST(ResultsDb, ANewRunDropsTheRowsOfADeletedRunWithItsId) {
  TempDir dir;
  const std::string path = dir.file("orphans.db");
  RunRecord rec = hand_record();
  rec.timeline = {{0, Lane::kCompute, "decode", 1, 0, 10, 0}};
  rec.rounds = {{0, 3, 2, 1, {0.75f, 0.25f}}};
  int64_t first = 0;
  {
    auto db = ResultsDb::open(path);
    first = db.begin_run(sample_info());
    db.finish_run(first, rec, {{"tpot_ms_mean", 4.0, "ms"}}, 1);
    db.query("PRAGMA foreign_keys = OFF; DELETE FROM run", /*allow_write=*/true);
  }
  const char* kRows =
      "SELECT (SELECT count(*) FROM metric) || ' ' || (SELECT count(*) FROM request_sample) || ' "
      "' || (SELECT count(*) FROM chunk_sample) || ' ' || (SELECT count(*) FROM timeline_span) || "
      "' ' || (SELECT count(*) FROM step_sample) || ' ' || (SELECT count(*) FROM draft_round)";
  auto db = ResultsDb::open(path);
  const std::string left = scalar_text(db, kRows);
  EXPECT_EQ(left.find(" 0"), std::string::npos) << "every table kept rows: " << left;
  const int64_t second = db.begin_run(sample_info());
  ASSERT_EQ(second, first);
  EXPECT_EQ(scalar_text(db, kRows), "0 0 0 0 0 0");
  db.finish_run(second, rec, {{"tpot_ms_mean", 5.0, "ms"}}, 1);
  EXPECT_EQ(scalar_text(db, "SELECT status FROM run"), "complete");
  EXPECT_EQ(scalar_text(db, kRows), left);  // this run's own rows, as many as the first had
  EXPECT_EQ(scalar_real(db, "SELECT value FROM metric"), 5.0);
}

TEST(ResultsDb, ChunksAreNumberedPerRequestInRecordOrder) {
  auto db = ResultsDb::open(":memory:");
  const int64_t id = db.begin_run(sample_info());
  RunRecord rec;
  // Two concurrent requests, chunks interleaved in time: request 1 gets idx 0, 1, 2 and
  // request 0 gets idx 0, 1, each in time order.
  rec.chunks = {{1, 1, 10}, {0, 1, 20}, {1, 2, 30}, {0, 3, 40}, {1, 1, 50}};
  db.finish_run(id, rec, {}, 0);
  EXPECT_EQ(scalar_text(db,
                        "SELECT group_concat(request_id || ':' || idx || '@' || t_ns, ' ') "
                        "FROM (SELECT * FROM chunk_sample ORDER BY t_ns)"),
            "1:0@10 0:0@20 1:1@30 0:1@40 1:2@50");
}

TEST(ResultsDb, DuplicateSampleKeysAreRejectedBeforeWriting) {
  auto db = ResultsDb::open(":memory:");
  const int64_t id = db.begin_run(sample_info());
  RunRecord rec = hand_record();
  rec.steps.push_back(rec.steps[1]);  // rank 0 step 1 twice
  try {
    db.finish_run(id, rec, {}, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "run record has two step samples for rank 0 step 1");
  }
  rec = hand_record();
  rec.requests.push_back(rec.requests[0]);
  EXPECT_THROW(db.finish_run(id, rec, {}, 0), Error);
  EXPECT_EQ(scalar_text(db, "SELECT status FROM run"), "running");
  // Steps recorded out of order are fine: rank 1 before rank 0.
  rec = hand_record();
  rec.steps[0].rank = 1;
  db.finish_run(id, rec, {}, 0);
  EXPECT_EQ(scalar_text(db, "SELECT group_concat(rank || '/' || step, ' ') FROM step_sample"),
            "0/1 0/2 1/0");
}

RunRecord large_record(int64_t steps, int64_t chunks) {
  RunRecord rec;
  rec.steps.resize(steps);
  for (int64_t i = 0; i < steps; ++i) {
    StepSample& s = rec.steps[i];
    s.step = i;
    s.end_ns = i * 10'000;
    s.dur_ns = 10'000;
    s.batch = 1;
    s.tokens = 2;
    s.host_ns = {1, 2, 3, 4};
  }
  rec.chunks.resize(chunks);
  for (int64_t i = 0; i < chunks; ++i) {
    rec.chunks[i] = {static_cast<int32_t>(i / 1024), 2, i * 10'000};
  }
  return rec;
}

// DESIGN: one transaction per run; 1M step rows + 1M chunk rows should take seconds.
TEST(ResultsDb, MillionRowRunInsertsQuickly) {
  TempDir dir;
  auto db = ResultsDb::open(dir.file("big.db"));
  const int64_t id = db.begin_run(sample_info());
  const RunRecord rec = large_record(1'000'000, 1'000'000);
  const auto t0 = std::chrono::steady_clock::now();
  db.finish_run(id, rec, {}, 0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("finish_run: 1M steps + 1M chunks in %.2f s\n", s);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM step_sample"), 1'000'000);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM chunk_sample"), 1'000'000);
  EXPECT_EQ(scalar_int(db, "SELECT max(idx) FROM chunk_sample"), 1023);
  EXPECT_LT(s, 30.0);  // generous: sanitizer builds and slow disks; ~2 s on a laptop
}

off_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

// kill -9 in the middle of finish_run: SQLite rolls the open transaction back on the next open,
// so the run stays 'running' (incomplete: its process, the child, is gone) with no sample rows
// and the file is intact.
TEST(ResultsDb, SigkillDuringFinishRunLeavesNoHalfWrittenRun) {
  TempDir dir;
  const std::string path = dir.file("kill.db");
  ResultsDb::open(path);                             // the schema
  const RunRecord rec = large_record(2'000'000, 0);  // ~100 MB of rows: seconds to write
  const off_t wal_before = file_size(path + "-wal");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      auto db = ResultsDb::open(path);
      db.finish_run(db.begin_run(sample_info()), rec, {}, 0);
    } catch (...) {
    }
    _exit(0);  // reaching here means the kill came too late; the parent's checks then fail
  }
  // The transaction spills pages into the WAL as it goes: once the WAL has grown by 8 MB the
  // child is inside finish_run, far from its commit.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool grown = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (file_size(path + "-wal") > wal_before + (8 << 20)) {
      grown = true;
      break;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) break;  // exited early
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(grown) << "child never reached the middle of finish_run";
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  auto db = ResultsDb::open(path);
  EXPECT_EQ(scalar_text(db, "PRAGMA integrity_check"), "ok");
  ASSERT_EQ(scalar_int(db, "SELECT count(*) FROM run"), 1);
  const int64_t id = scalar_int(db, "SELECT id FROM run");
  EXPECT_NE(scalar_text(db, "SELECT owner FROM run").find("/" + std::to_string(pid) + "/"),
            std::string::npos);
  EXPECT_EQ(db.incomplete_runs(), std::vector<int64_t>{id});
  EXPECT_EQ(scalar_text(db, "SELECT status FROM run WHERE id = " + std::to_string(id)), "running");
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM step_sample"), 0);
  EXPECT_EQ(scalar_int(db, "SELECT count(*) FROM metric"), 0);
  // The interrupted run can be marked as such afterwards.
  db.fail_run(id, "interrupted", "killed");
  EXPECT_EQ(scalar_text(db, "SELECT status FROM run"), "interrupted");
}

}  // namespace
}  // namespace twinstep
