#include "results/trace.h"

#include <gtest/gtest.h>

#include <sstream>

#include "policies/error.h"
#include "sample_record.h"

namespace twinstep {
namespace {

TEST(Trace, ChromeTraceOfHandTimeline) {
  auto db = ResultsDb::open(":memory:");
  RunInfo info;
  info.experiment_name = "t";
  info.backend = "sim";
  const int64_t id = db.begin_run(info);
  db.finish_run(id, testing::hand_record(), {}, 0);
  std::ostringstream out;
  write_chrome_trace(db, id, out);
  // Spans of sample_record.h, sorted by lane then start; ts/dur are ns / 1000 with 3 decimals:
  // host prepare_decode 60000000 ns + 2000000 -> 60000.000 / 2000.000, launch 62000000 + 1500
  // -> 62000.000 / 1.500 (flow 7 starts here), compute 62001234 + 7998766 -> 62001.234 /
  // 7998.766 (flow 7 ends here), copy 70000000 + 10500 -> 70000.000 / 10.500.
  const std::string expected =
      "{\"traceEvents\":[\n"
      "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"rank 0\"}},\n"
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"host\"}},\n"
      "{\"name\":\"prepare_decode\",\"cat\":\"host\",\"ph\":\"X\",\"ts\":60000.000,"
      "\"dur\":2000.000,\"pid\":0,\"tid\":0,\"args\":{\"step\":1}},\n"
      "{\"name\":\"launch\",\"cat\":\"host\",\"ph\":\"X\",\"ts\":62000.000,\"dur\":1.500,"
      "\"pid\":0,\"tid\":0,\"args\":{\"step\":1}},\n"
      "{\"name\":\"launch\",\"cat\":\"flow\",\"id\":7,\"ts\":62000.000,\"pid\":0,\"tid\":0,"
      "\"ph\":\"s\"},\n"
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":1,"
      "\"args\":{\"name\":\"compute stream\"}},\n"
      "{\"name\":\"decode_graph\",\"cat\":\"compute\",\"ph\":\"X\",\"ts\":62001.234,"
      "\"dur\":7998.766,\"pid\":0,\"tid\":1,\"args\":{\"step\":1}},\n"
      "{\"name\":\"launch\",\"cat\":\"flow\",\"id\":7,\"ts\":62001.234,\"pid\":0,\"tid\":1,"
      "\"ph\":\"f\",\"bp\":\"e\"},\n"
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":2,"
      "\"args\":{\"name\":\"copy stream\"}},\n"
      "{\"name\":\"copy_out\",\"cat\":\"copy\",\"ph\":\"X\",\"ts\":70000.000,\"dur\":10.500,"
      "\"pid\":0,\"tid\":2,\"args\":{\"step\":1}}\n"
      "],\"displayTimeUnit\":\"ns\"}\n";
  EXPECT_EQ(out.str(), expected);
}

TEST(Trace, MultipleRanksGetTheirOwnProcess) {
  auto db = ResultsDb::open(":memory:");
  RunInfo info;
  info.backend = "real";
  const int64_t id = db.begin_run(info);
  RunRecord rec;
  rec.timeline = {{1, Lane::kCompute, "k\"q", 3, 999, 1, 0}, {0, Lane::kCompute, "k", 3, 5, 2, 0}};
  db.finish_run(id, rec, {}, 0);
  std::ostringstream out;
  write_chrome_trace(db, id, out);
  const std::string s = out.str();
  EXPECT_NE(s.find("\"args\":{\"name\":\"rank 1\"}"), std::string::npos);
  // Rank 0 sorts first even though it was recorded second; ts 5 ns -> 0.005 us.
  EXPECT_LT(s.find("\"rank 0\""), s.find("\"rank 1\""));
  EXPECT_NE(s.find("\"ts\":0.005,\"dur\":0.002,\"pid\":0,\"tid\":1"), std::string::npos);
  EXPECT_NE(s.find("\"name\":\"k\\\"q\""), std::string::npos);  // escaped name
}

TEST(Trace, RunWithoutTimelineIsAnError) {
  auto db = ResultsDb::open(":memory:");
  RunInfo info;
  info.backend = "sim";
  const int64_t id = db.begin_run(info);
  std::ostringstream out;
  try {
    write_chrome_trace(db, id, out);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "run " + std::to_string(id) +
                  " has no timeline; set trace: {first_step, steps} in the experiment or pass "
                  "--trace-steps");
  }
  EXPECT_THROW(write_chrome_trace(db, 12345, out), Error);
}

}  // namespace
}  // namespace twinstep
