// Distributed wire format, figure data, plots and the HTML report. Expected values are worked
// out by hand from tests/results/sample_record.h (see the comments at each check).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "experiments/distributed.h"
#include "experiments/plot.h"
#include "experiments/plot_data.h"
#include "experiments/plot_gnuplot.h"
#include "experiments/report.h"
#include "policies/error.h"
#include "results/metrics.h"
#include "tests/results/sample_record.h"

namespace twinstep {
namespace {

namespace fs = std::filesystem;
using testing::hand_record;
using testing::kMs;

class TempDir {
 public:
  TempDir() {
    std::string p = (fs::temp_directory_path() / "twinstep-report-test-XXXXXX").string();
    EXPECT_NE(mkdtemp(p.data()), nullptr);
    path_ = p;
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// hand_record with a second rank whose decode steps each waited 3 ms on a collective.
RunRecord two_rank_record() {
  RunRecord rec = hand_record();
  for (const StepSample& s : hand_record().steps) {
    StepSample r1 = s;
    r1.rank = 1;
    r1.collective_wait_ns = 3 * kMs;
    rec.steps.push_back(r1);
  }
  return rec;
}

int64_t store(ResultsDb& db, const RunRecord& rec, int32_t variant, const std::string& label,
              const std::string& backend) {
  RunInfo info;
  info.experiment_name = "report_test";
  info.yaml_text = "name: report_test\n";
  info.variant_index = variant;
  info.variant_label = label;
  info.backend = backend;
  if (backend == "real") info.gpu_name = "NVIDIA H200";
  const int64_t id = db.begin_run(info);
  db.finish_run(id, rec, compute_metrics(rec, MetricsContext{4.0}), 0.5);
  return id;
}

TEST(Distributed, WireFormatRoundTripsEveryField) {
  FinishedRun run;
  run.variant_index = 17;
  run.backend = BackendKind::kSim;
  run.record = hand_record();
  run.metrics = compute_metrics(run.record, MetricsContext{4.0});
  run.wall_s = 0.25;
  // A name without static storage: the decoder must copy it into the pool.
  std::string dynamic_name = "dynamic_kernel";
  run.record.timeline.push_back({0, Lane::kCompute, dynamic_name.c_str(), 2, 1, 2, 0});
  run.record.rounds = {{1, 4, 3, 2, {0.75f, 0.5f, 0.125f}}, {0, 5, 1, 0, {0.25f}}};

  const std::string bytes = encode_finished_run(run);
  dynamic_name = "overwritten!!!";
  const FinishedRun back = decode_finished_run(bytes);
  EXPECT_EQ(back.variant_index, 17);
  EXPECT_EQ(back.backend, BackendKind::kSim);
  EXPECT_EQ(back.wall_s, 0.25);
  EXPECT_EQ(back.error, "");
  ASSERT_EQ(back.record.requests.size(), 3u);
  EXPECT_EQ(back.record.requests[2].end_ns, 2200 * kMs);
  EXPECT_EQ(back.record.requests[0].chunk_count, 3);
  ASSERT_EQ(back.record.chunks.size(), 7u);
  EXPECT_EQ(back.record.chunks[1].tokens, 2);
  ASSERT_EQ(back.record.steps.size(), 3u);
  EXPECT_EQ(back.record.steps[2].host_ns[1], 4 * kMs);
  EXPECT_EQ(back.record.steps[1].collective_wait_ns, 3 * kMs / 2);
  EXPECT_EQ(back.record.end_ns, 2200 * kMs);
  ASSERT_EQ(back.record.timeline.size(), 5u);
  EXPECT_STREQ(back.record.timeline[2].name, "decode_graph");
  EXPECT_EQ(back.record.timeline[2].flow, 7);
  EXPECT_EQ(back.record.timeline[3].lane, Lane::kCopy);
  EXPECT_STREQ(back.record.timeline[4].name, "dynamic_kernel");
  ASSERT_EQ(back.record.rounds.size(), 2u);
  EXPECT_EQ(back.record.rounds[0].request, 1);
  EXPECT_EQ(back.record.rounds[0].step, 4);
  EXPECT_EQ(back.record.rounds[0].draft_len, 3);
  EXPECT_EQ(back.record.rounds[0].accepted, 2);
  EXPECT_EQ(back.record.rounds[0].confidence, (std::vector<float>{0.75f, 0.5f, 0.125f}));
  EXPECT_EQ(back.record.rounds[1].confidence, (std::vector<float>{0.25f}));
  const MoeRoutingStats& mr = back.record.moe_routing;  // hand_record's 3 passes
  EXPECT_EQ(mr.num_experts, 8);
  EXPECT_EQ(mr.ep, 2);
  EXPECT_EQ(mr.passes, 3);
  EXPECT_EQ(mr.rank_experts, 10);
  EXPECT_EQ(mr.rank_experts_max, 8);
  EXPECT_EQ(mr.picks, run.record.moe_routing.picks);
  ASSERT_EQ(back.metrics.size(), run.metrics.size());
  for (size_t i = 0; i < run.metrics.size(); ++i) {
    EXPECT_EQ(back.metrics[i].key, run.metrics[i].key);
    EXPECT_EQ(back.metrics[i].value, run.metrics[i].value);  // bit-exact
    EXPECT_EQ(back.metrics[i].unit, run.metrics[i].unit);
  }
  // Names are interned: two decodes share one pointer per name.
  const FinishedRun again = decode_finished_run(bytes);
  EXPECT_EQ(again.record.timeline[2].name, back.record.timeline[2].name);
}

TEST(Distributed, FailureTravelsWithItsMessage) {
  FinishedRun run;
  run.variant_index = 3;
  run.backend = BackendKind::kReal;
  run.error = "boom: out of memory";
  const FinishedRun back = decode_finished_run(encode_finished_run(run));
  EXPECT_EQ(back.variant_index, 3);
  EXPECT_EQ(back.backend, BackendKind::kReal);
  EXPECT_EQ(back.error, "boom: out of memory");
  EXPECT_TRUE(back.record.steps.empty());
}

TEST(Distributed, MalformedMessagesAreErrors) {
  FinishedRun run;
  run.record = hand_record();
  const std::string bytes = encode_finished_run(run);
  EXPECT_THROW(decode_finished_run(std::string_view(bytes).substr(0, bytes.size() / 2)), Error);
  EXPECT_THROW(decode_finished_run(bytes + "x"), Error);
  EXPECT_THROW(decode_finished_run("nope"), Error);
}

TEST(Distributed, EveryRunHasExactlyOneSimulatingRank) {
  // 3 simulating ranks (1..3) for 4 ranks: run u goes to 1 + u % 3.
  const int expected[] = {1, 2, 3, 1, 2, 3, 1};
  for (int u = 0; u < 7; ++u) EXPECT_EQ(rank_of_run(u, 4), expected[u]);
  EXPECT_EQ(rank_of_run(12345, 2), 1);
}

TEST(Distributed, InternReturnsOnePointerPerName) {
  std::string a = "x_kernel", b = "x_kernel";
  EXPECT_EQ(intern_span_name(a), intern_span_name(b));
  EXPECT_NE(intern_span_name("x_kernel"), intern_span_name("y_kernel"));
  EXPECT_STREQ(intern_span_name("y_kernel"), "y_kernel");
}

TEST(PlotData, ShortLabelsKeepTheLastKeyComponent) {
  EXPECT_EQ(short_variant_label("policies.host_schedule=lockstep, workload.concurrency=4"),
            "host_schedule=lockstep, concurrency=4");
  // A flow-style value with ", " inside stays whole.
  EXPECT_EQ(short_variant_label("host.prepare_decode={dist: uniform, lo: 1us, hi: 2us}, seed=3"),
            "prepare_decode={dist: uniform, lo: 1us, hi: 2us}, seed=3");
  EXPECT_EQ(short_variant_label("base"), "base");
}

TEST(PlotData, EcdfKeepsEndsAndSubsamplesEvenly) {
  const std::vector<double> v = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const auto all = ecdf_points(v, 100);
  ASSERT_EQ(all.size(), 9u);
  EXPECT_DOUBLE_EQ(all[0].second, 1.0 / 9);
  EXPECT_DOUBLE_EQ(all[8].second, 1.0);
  const auto three = ecdf_points(v, 3);  // order statistics 0, 4, 8
  ASSERT_EQ(three.size(), 3u);
  EXPECT_EQ(three[0].first, 1);
  EXPECT_EQ(three[1].first, 5);
  EXPECT_EQ(three[2].first, 9);
  EXPECT_DOUBLE_EQ(three[1].second, 5.0 / 9);
  EXPECT_TRUE(ecdf_points({}, 10).empty());
}

TEST(PlotData, SamplesFromTheDatabaseMatchHandValues) {
  TempDir dir;
  ResultsDb db = ResultsDb::open(dir.file("t.db"));
  const int64_t id = store(db, hand_record(), 0, "policies.host_schedule=lockstep", "sim");
  // TPOT: r0 (400 - 100) / 3 = 100 ms, r2 (2200 - 1200) / 2 = 500 ms; r1 has one token.
  EXPECT_EQ(request_tpot_ms(db, id), (std::vector<double>{100, 500}));
  // ITL: r0 gaps 150, 150; r2 gaps 400, 600; r1 has a single chunk.
  EXPECT_EQ(itl_ms(db, id), (std::vector<double>{150, 150, 400, 600}));
  // Accept length: s1 2 tokens / batch 1 = 2.0, s2 3 / 2 = 1.5; s0 (batch 0) excluded.
  const auto hist = accept_length_histogram(db, id, 0.25);
  ASSERT_EQ(hist.size(), 2u);
  EXPECT_DOUBLE_EQ(hist[0].first, 1.5);
  EXPECT_DOUBLE_EQ(hist[0].second, 0.5);
  EXPECT_DOUBLE_EQ(hist[1].first, 2.0);
  EXPECT_DOUBLE_EQ(hist[1].second, 0.5);
  EXPECT_TRUE(collective_wait_ms_by_rank(db, id).empty());  // one rank

  const int64_t two = store(db, two_rank_record(), 1, "policies.host_schedule=runahead", "sim");
  // Rank 0: collective waits 1.5 ms (s1) and 1 ms (s2) -> 1.25 ms; rank 1: 3 ms on both decode
  // steps.
  const auto waits = collective_wait_ms_by_rank(db, two);
  ASSERT_EQ(waits.size(), 2u);
  EXPECT_EQ(waits[0].first, 0);
  EXPECT_DOUBLE_EQ(waits[0].second, 1.25);
  EXPECT_EQ(waits[1].first, 1);
  EXPECT_DOUBLE_EQ(waits[1].second, 3.0);
}

TEST(PlotData, TimelineWindowFollowsTheGpuSteps) {
  TempDir dir;
  ResultsDb db = ResultsDb::open(dir.file("t.db"));
  const int64_t id = store(db, hand_record(), 0, "base", "sim");
  std::vector<SpanRow> spans = timeline_spans(db, id);
  ASSERT_EQ(spans.size(), 4u);
  int64_t begin = 0, end = 0;
  ASSERT_TRUE(clip_to_gpu_steps(spans, 3, &begin, &end));
  // Window: step 1's kernel start (62,001,234) to its output copy's end (70,000,000 + 10,500).
  EXPECT_EQ(begin, 62'001'234);
  EXPECT_EQ(end, 70'010'500);
  // prepare_decode ended before the window and is dropped; the launch is clipped to 266 ns.
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].name, "launch");
  EXPECT_EQ(spans[0].start_ns, 62'001'234);
  EXPECT_EQ(spans[0].dur_ns, 266);
}

TEST(Report, Base64MatchesRfc4648Vectors) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("foob"), "Zm9vYg==");
  EXPECT_EQ(base64_encode("fooba"), "Zm9vYmE=");
  EXPECT_EQ(base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(base64_encode(std::string("\xff\x00\x80", 3)), "/wCA");
}

TEST(Report, HtmlEscape) {
  EXPECT_EQ(html_escape("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;");
}

// PNG width and height from the IHDR chunk (bytes 16..23, big-endian).
std::pair<uint32_t, uint32_t> png_size(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string head(24, '\0');
  in.read(head.data(), 24);
  EXPECT_EQ(head.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << path;
  auto be32 = [&](size_t at) {
    return uint32_t(uint8_t(head[at])) << 24 | uint32_t(uint8_t(head[at + 1])) << 16 |
           uint32_t(uint8_t(head[at + 2])) << 8 | uint32_t(uint8_t(head[at + 3]));
  };
  return {be32(16), be32(20)};
}

TEST(Plot, EveryFigureFromSimRealAndMultiRankRuns) {
  try {
    find_gnuplot();
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  TempDir dir;
  ResultsDb db = ResultsDb::open(dir.file("t.db"));
  RunRecord measured = hand_record();
  for (ChunkSample& c : measured.chunks) c.t_ns += c.t_ns / 10;  // "measured" 10 % slower
  std::vector<int64_t> ids = {
      store(db, hand_record(), 0, "workload.concurrency=1", "sim"),
      store(db, measured, 0, "workload.concurrency=1", "real"),
      store(db, two_rank_record(), 1, "workload.concurrency=2", "sim"),
  };
  PlotOptions options;
  options.out_dir = dir.file("figs");
  const std::vector<Figure> figures = plot_runs(db, ids, options);
  const std::vector<std::string> names = {"tpot_itl",        "throughput_vs_tpot",
                                          "sim_vs_measured", "accept_length",
                                          "timeline",        "collective_waits"};
  ASSERT_EQ(figures.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(figures[i].name, names[i]);
    EXPECT_EQ(figures[i].skipped, "") << names[i];
    ASSERT_EQ(figures[i].path, dir.file("figs/" + names[i] + ".png"));
    EXPECT_GT(png_size(figures[i].path).first, 500u);
  }
  if (const char* keep = std::getenv("TWINSTEP_KEEP_FIGURES")) {  // for looking at them
    for (const Figure& f : figures) {
      fs::copy_file(f.path, fs::path(keep) / (f.name + ".png"),
                    fs::copy_options::overwrite_existing);
    }
  }
  // Six paired metrics -> a 3 x 2 grid of 520 x 500 px panels plus a 60 px title.
  EXPECT_EQ(png_size(figures[2].path), std::make_pair(1560u, 1060u));

  std::ostringstream html;
  write_report(db, "report_test", ids, figures, html);
  const std::string page = html.str();
  size_t images = 0;
  for (size_t at = page.find("data:image/png;base64,"); at != std::string::npos;
       at = page.find("data:image/png;base64,", at + 1)) {
    ++images;
  }
  EXPECT_EQ(images, 6u);
  EXPECT_NE(page.find("id=\"image-check\""), std::string::npos);
  EXPECT_EQ(page.find("src=\"http"), std::string::npos);  // nothing fetched from the network
}

TEST(Plot, SkipsWhatTheDatabaseCannotShow) {
  try {
    find_gnuplot();
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  TempDir dir;
  ResultsDb db = ResultsDb::open(dir.file("t.db"));
  RunRecord untraced = hand_record();
  untraced.timeline.clear();
  const std::vector<int64_t> ids = {store(db, untraced, 0, "base", "sim")};
  PlotOptions options;
  options.out_dir = dir.file("figs");
  const std::vector<Figure> figures = plot_runs(db, ids, options);
  std::set<std::string> skipped;
  for (const Figure& f : figures) {
    if (f.path.empty()) skipped.insert(f.name);
  }
  EXPECT_EQ(skipped, (std::set<std::string>{"sim_vs_measured", "timeline", "collective_waits"}));
  EXPECT_FALSE(fs::exists(dir.file("figs/timeline.png")));
}

TEST(Plot, MissingGnuplotIsAnActionableError) {
  ::setenv("TWINSTEP_GNUPLOT", "/nonexistent/gnuplot", 1);
  try {
    find_gnuplot();
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TWINSTEP_GNUPLOT"), std::string::npos);
  }
  ::unsetenv("TWINSTEP_GNUPLOT");
  const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  ::setenv("PATH", "/nonexistent", 1);
  try {
    find_gnuplot();
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("install gnuplot-nox"), std::string::npos);
  }
  ::setenv("PATH", path.c_str(), 1);
}

}  // namespace
}  // namespace twinstep
