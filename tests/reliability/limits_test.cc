// Bad inputs and run-size limits: each case checks the exact message a user sees (the CLI prints
// "twinstep: " + what()). Expected numbers are worked out by hand in the comments.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "experiments/experiment.h"
#include "policies/error.h"
#include "results/db.h"

namespace twinstep {
namespace {

// A valid experiment with `workload` (and `extra` top-level lines) substituted.
std::string experiment(const std::string& workload, const std::string& extra = "") {
  return "name: limits\nmodel: llama-3-8b\nhardware: h200\nworkload: " + workload + "\n" + extra;
}

std::string load_error(const std::string& text) {
  try {
    load_experiment_text(text, "t.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(loaded)";
}

std::string values(int from, int to) {
  std::string out = "[";
  for (int i = from; i <= to; ++i) out += (i > from ? "," : "") + std::to_string(i);
  return out + "]";
}

// ---- integer overflow in YAML values ------------------------------------------------------------

TEST(YamlOverflow, HugeIntegerIsOutOfRangeNotWrapped) {
  EXPECT_EQ(
      load_error(experiment("{input_len: 8, output_len: 8, requests: 99999999999999999999}")),
      "t.yaml:4:51: workload.requests = 99999999999999999999 is out of range (1 to 10000000)");
}

TEST(YamlOverflow, Int32OverflowOfALength) {
  // 2^31 = 2147483648 would wrap to a negative int32 if cast before the range check.
  EXPECT_EQ(load_error(experiment("{input_len: 2147483648, output_len: 8, requests: 1}")),
            "t.yaml:4:23: workload.input_len = 2147483648 is out of range (1 to 10000000)");
}

TEST(YamlOverflow, SeedPast64Bits) {
  EXPECT_EQ(load_error(experiment("{input_len: 8, output_len: 8, requests: 1}",
                                  "seed: 18446744073709551616\n")),
            "t.yaml:5:7: seed = 18446744073709551616 is out of range (0 to 18446744073709551615)");
}

TEST(YamlOverflow, ConcurrencyLimit) {
  EXPECT_EQ(
      load_error(experiment("{input_len: 8, output_len: 8, requests: 1, concurrency: 1000001}")),
      "t.yaml:4:67: workload.concurrency = 1000001 is out of range (1 to 1000000)");
}

// yaml-cpp 0.7's LoadAll looped forever (allocating until the OOM killer came) on a node that
// starts with ','; found by fuzz/fuzz_experiment, guarded in yaml_tree.cc.
TEST(YamlParser, LoneCommaIsAnErrorNotAHang) {
  EXPECT_EQ(load_error(","),
            "t.yaml:1:1: malformed YAML: unexpected ',' (a node cannot start here)");
  EXPECT_EQ(load_error("---\n, x: 1\n"),
            "t.yaml:2:1: malformed YAML: unexpected ',' (a node cannot start here)");
}

// ---- run-size limits (experiment.cc check_run_size) ---------------------------------------------

TEST(RunSize, OutputTokensFitInt32) {
  // 10,000,000 requests x 1000 tokens = 1e10 > 2^31 - 1.
  EXPECT_EQ(load_error(experiment("{input_len: 8, output_len: 1000, requests: 10000000}")),
            "t.yaml:4:11: workload.requests x workload.output_len = 10000000 x 1000 = 10000000000 "
            "output tokens, over the limit of 2147483647 per run (samples are indexed with 32-bit "
            "integers); lower requests or output_len");
  // 2,147,483 x 1000 = 2,147,483,000 <= 2,147,483,647: accepted.
  EXPECT_EQ(load_error(experiment("{input_len: 8, output_len: 1000, requests: 2147483}")),
            "(loaded)");
}

TEST(RunSize, ArrivalSpan) {
  // 1000 requests at 1e-5 per second arrive over 1e8 s > 1e7 s.
  EXPECT_EQ(
      load_error(
          experiment("{input_len: 8, output_len: 8, requests: 1000, arrival_rate_per_s: 0.00001}")),
      "t.yaml:4:11: workload.arrival_rate_per_s = 1e-05 spreads 1000 requests over about 1e+08 s, "
      "over the limit of 1e+07 s of arrivals; raise the rate or lower requests");
  // 1000 / 1e-4 = 1e7 s: exactly the limit, accepted.
  EXPECT_EQ(load_error(experiment(
                "{input_len: 8, output_len: 8, requests: 1000, arrival_rate_per_s: 0.0001}")),
            "(loaded)");
}

TEST(RunSize, PrefillStepFitsInt64) {
  // 1000 concurrent prompts of 1e7 tokens: attention pairs <= 1000 x (1e7 + 1)^2 = 1.0000002e17,
  // x 4 FLOPs x 4096 (32 heads x 128) = 1.64e21 FLOPs in one kernel, over 2^62 = 4.61e18.
  EXPECT_EQ(
      load_error(
          experiment("{input_len: 10000000, output_len: 1, requests: 1000, concurrency: 1000}")),
      "t.yaml:4:11: a prefill step of this workload (1e+03 concurrent requests of 10000000 input "
      "tokens on model llama-3-8b) would need about 1.64e+21 FLOPs or bytes, over the simulator's "
      "limit of 4.61e+18 (64-bit counters); lower workload.concurrency or workload.input_len");
  // One such prompt: 1.0000002e14 x 4 x 4096 = 1.6e18 < 4.61e18, accepted.
  EXPECT_EQ(load_error(experiment("{input_len: 10000000, output_len: 1, requests: 1}")),
            "(loaded)");
}

TEST(RunSize, SimulatedTimeFitsInt64Nanoseconds) {
  // 1000 requests x (1e6 + 2) steps x 3600 s of host work = 3.6e21 ns ~ 1.14e5 years > 146.
  const std::string err = load_error(experiment(
      "{input_len: 8, output_len: 1000000, requests: 1000}", "host: {prepare_decode: 3600s}\n"));
  EXPECT_EQ(err.rfind("t.yaml:4:11: this variant could simulate up to about 1.14e+05 years (1000 "
                      "requests of up to 1000000 output tokens, host loop up to 3.6e+06 ms per "
                      "step on ",
                      0),
            0u)
      << err;
  EXPECT_NE(err.find("), over the limit of 146 years (64-bit nanosecond clock)"), std::string::npos)
      << err;
  // The seeds' 485 us: 1.0e9 steps x ~0.5 ms = ~16 years of simulated time, accepted.
  EXPECT_EQ(load_error(experiment("{input_len: 8, output_len: 1000000, requests: 1000}",
                                  "host: {prepare_decode: 485us}\n")),
            "(loaded)");
}

TEST(RunSize, TinyHardwareRateIsRejectedNotInfinite) {
  // 1e-300 TB/s passes the "> 0" range check but makes every kernel take ~1e297 ns.
  const std::string err = load_error(
      "name: limits\nmodel: llama-3-8b\nhardware: {preset: h200, stream_read_tbps: 1e-300}\n"
      "workload: {input_len: 8, output_len: 8, requests: 1}\n");
  EXPECT_NE(err.find("years (64-bit nanosecond clock); lower requests, output_len or host costs, "
                     "or raise the hardware rates"),
            std::string::npos)
      << err;
}

// ---- sweeps -------------------------------------------------------------------------------------

TEST(Sweep, OverAMillionVariants) {
  // 1000 x 1001 = 1,001,000 variants: rejected before any variant is expanded.
  const std::string text = experiment(
      "{input_len: 8, output_len: 8, requests: 1}",
      "sweep:\n  seed: " + values(1, 1000) + "\n  workload.requests: " + values(1, 1001) + "\n");
  EXPECT_EQ(
      load_error(text),
      "t.yaml:5:1: sweep expands to 1001000 variants (1000 x 1001), over the limit of 1000000");
}

TEST(Sweep, LayersHeldInMemory) {
  // 1000 x 100 variants of a 10,000-layer model: 1e5 x 1e4 = 1e9 layers > 1e8.
  const std::string text =
      "name: limits\nmodel: {preset: llama-3-8b, num_layers: 10000}\nhardware: h200\n"
      "workload: {input_len: 8, output_len: 8, requests: 1}\nsweep:\n  seed: " +
      values(1, 1000) + "\n  workload.requests: " + values(1, 100) + "\n";
  EXPECT_EQ(load_error(text),
            "t.yaml:5:1: sweep of 100000 variants holds about 1000000000 model layers in memory "
            "(10000 in variant 0), over the limit of 100000000; sweep fewer variants or split the "
            "experiment");
}

// ---- files --------------------------------------------------------------------------------------

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("twinstep_reliability_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
  }
  std::filesystem::path dir_;
};

std::string file_error(const std::string& path) {
  try {
    load_experiment_file(path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(loaded)";
}

std::string open_error(const std::string& path) {
  try {
    ResultsDb::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(opened)";
}

using Files = TempDir;

TEST_F(Files, EmptyYamlFile) {
  write("empty.yaml", "");
  EXPECT_EQ(file_error(path("empty.yaml")),
            path("empty.yaml") + ":1:1: the experiment is empty (no YAML content)");
  write("comments.yaml", "# nothing here\n\n");
  EXPECT_EQ(file_error(path("comments.yaml")),
            path("comments.yaml") + ":1:1: the experiment is empty (no YAML content)");
}

TEST_F(Files, YamlPathIsADirectory) {
  EXPECT_EQ(file_error(dir_.string()), dir_.string() + ": cannot read experiment file '" +
                                           dir_.string() + "': it is a directory");
}

TEST_F(Files, DatabaseThatIsNotSqlite) {
  write("notes.db", std::string(4096, 'x'));
  EXPECT_EQ(open_error(path("notes.db")),
            "results database " + path("notes.db") +
                " is not an SQLite database (SQLite: file is not a database); give --db a new "
                "file name or an existing twinstep database");
}

TEST_F(Files, DatabaseWithANewerSchema) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path("new.db").c_str(), &db), SQLITE_OK);
  const std::string newer = std::to_string(ResultsDb::kSchemaVersion + 1);
  ASSERT_EQ(sqlite3_exec(db, ("PRAGMA user_version = " + newer).c_str(), nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  EXPECT_EQ(open_error(path("new.db")),
            "results database " + path("new.db") + " has schema version " + newer +
                ", newer than this twinstep supports (" +
                std::to_string(ResultsDb::kSchemaVersion) + "); use a newer twinstep build");
}

TEST_F(Files, CurrentVersionStampWithoutTables) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path("stamped.db").c_str(), &db), SQLITE_OK);
  const std::string current = std::to_string(ResultsDb::kSchemaVersion);
  ASSERT_EQ(
      sqlite3_exec(db, ("PRAGMA user_version = " + current).c_str(), nullptr, nullptr, nullptr),
      SQLITE_OK);
  sqlite3_close(db);
  EXPECT_EQ(open_error(path("stamped.db")), "results database " + path("stamped.db") +
                                                " has schema version " + current +
                                                " but no run table: it is not a twinstep database");
}

TEST_F(Files, SqliteDatabaseOfAnotherProgram) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path("other.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE t (x)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  EXPECT_EQ(open_error(path("other.db")),
            "results database " + path("other.db") +
                " is not a twinstep database (it has tables but no schema version)");
}

TEST_F(Files, DatabaseDirectoryMissing) {
  EXPECT_EQ(open_error(path("missing/r.db")),
            "cannot open results database " + path("missing/r.db") + ": directory " +
                path("missing") + " does not exist (create it first)");
}

TEST_F(Files, DatabasePathIsADirectory) {
  EXPECT_EQ(open_error(dir_.string()),
            "cannot open results database " + dir_.string() + ": it is a directory");
}

}  // namespace
}  // namespace twinstep
