#include "results/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "sample_record.h"

namespace twinstep {
namespace {

using testing::hand_record;
using testing::kMs;

std::map<std::string, double> as_map(const std::vector<Metric>& metrics) {
  std::map<std::string, double> m;
  for (const Metric& x : metrics) m[x.key] = x.value;
  return m;
}

TEST(Metrics, HandExampleLatencies) {
  const auto m = as_map(compute_metrics(hand_record(), {4.0}));
  // TTFT ms: r0 100, r1 200, r2 200. Deviations from 166.67: -66.67, 33.33, 33.33 ->
  // variance (40000/9 + 2 * 10000/9) / 3 = 20000/9. Sorted 100 200 200: p90 h=1.8 -> 200.
  EXPECT_DOUBLE_EQ(m.at("ttft_ms_mean"), 500.0 / 3);
  EXPECT_DOUBLE_EQ(m.at("ttft_ms_median"), 200);
  EXPECT_NEAR(m.at("ttft_ms_std"), std::sqrt(20000.0 / 9), 1e-9);
  EXPECT_DOUBLE_EQ(m.at("ttft_ms_p50"), 200);
  EXPECT_DOUBLE_EQ(m.at("ttft_ms_p90"), 200);
  EXPECT_DOUBLE_EQ(m.at("ttft_ms_p99"), 200);
  // TPOT ms: r0 (400 - 100) / 3 = 100; r1 excluded (1 token); r2 (2200 - 1200) / 2 = 500.
  // p90: h = 0.9 -> 100 + 0.9 * 400 = 460; p99: 100 + 0.99 * 400 = 496.
  EXPECT_DOUBLE_EQ(m.at("tpot_ms_mean"), 300);
  EXPECT_DOUBLE_EQ(m.at("tpot_ms_median"), 300);
  EXPECT_DOUBLE_EQ(m.at("tpot_ms_std"), 200);
  EXPECT_NEAR(m.at("tpot_ms_p90"), 460, 1e-9);
  EXPECT_NEAR(m.at("tpot_ms_p99"), 496, 1e-9);
  // ITL ms: r0 150, 150; r1 none; r2 400, 600. Mean 325; deviations -175 -175 75 275 ->
  // variance 142500/4. Sorted 150 150 400 600: median h=1.5 -> 275; p90 h=2.7 -> 540;
  // p99 h=2.97 -> 594.
  EXPECT_DOUBLE_EQ(m.at("itl_ms_mean"), 325);
  EXPECT_DOUBLE_EQ(m.at("itl_ms_median"), 275);
  EXPECT_NEAR(m.at("itl_ms_std"), std::sqrt(35625.0), 1e-9);
  EXPECT_NEAR(m.at("itl_ms_p90"), 540, 1e-9);
  EXPECT_NEAR(m.at("itl_ms_p99"), 594, 1e-9);
  // E2E ms: 400, 200, 1200. Mean 600; variance (200^2 + 400^2 + 600^2) / 3 = 560000/3.
  // Sorted 200 400 1200: p90 h=1.8 -> 400 + 0.8 * 800 = 1040; p99 h=1.98 -> 1184.
  EXPECT_DOUBLE_EQ(m.at("e2e_ms_mean"), 600);
  EXPECT_DOUBLE_EQ(m.at("e2e_ms_median"), 400);
  EXPECT_NEAR(m.at("e2e_ms_std"), std::sqrt(560000.0 / 3), 1e-9);
  EXPECT_NEAR(m.at("e2e_ms_p90"), 1040, 1e-9);
  EXPECT_NEAR(m.at("e2e_ms_p99"), 1184, 1e-9);
}

TEST(Metrics, HandExampleThroughput) {
  const auto m = as_map(compute_metrics(hand_record(), {4.0}));
  EXPECT_EQ(m.at("requests"), 3);
  EXPECT_EQ(m.at("output_tokens"), 8);        // 4 + 1 + 3
  EXPECT_DOUBLE_EQ(m.at("duration_s"), 2.2);  // start 0 to end 2200 ms
  EXPECT_DOUBLE_EQ(m.at("output_throughput_tok_s"), 8 / 2.2);
  // Windows from t=0: [0,1 s) holds 1+2+1 (r0) + 1 (r1) = 5; [1,2 s) 2; [2,3 s) 1.
  EXPECT_EQ(m.at("peak_output_throughput_tok_s"), 5);
}

TEST(Metrics, HandExampleSteps) {
  const auto m = as_map(compute_metrics(hand_record(), {4.0}));
  // Decode steps s1, s2 only (s0 has batch 0).
  EXPECT_DOUBLE_EQ(m.at("accept_len_mean"), 5.0 / 3);    // (2 + 3) / (1 + 2)
  EXPECT_DOUBLE_EQ(m.at("step_time_estimate_ms"), 500);  // 300 * 5/3
  EXPECT_DOUBLE_EQ(m.at("step_ms_mean"), 20);            // (10 + 30) / 2
  EXPECT_DOUBLE_EQ(m.at("gpu_busy_frac"), 35.0 / 40);    // (8 + 27) / 40
  EXPECT_DOUBLE_EQ(m.at("idle_host_frac"), 3.0 / 40);
  EXPECT_DOUBLE_EQ(m.at("idle_launch_frac"), 1.5 / 40);
  EXPECT_DOUBLE_EQ(m.at("idle_dep_frac"), 0.5 / 40);
  EXPECT_DOUBLE_EQ(m.at("collective_wait_frac"), 2.5 / 40);  // (1.5 + 1) / 40, inside busy
  // 60e9 B in 40 ms = 1.5e12 B/s.
  EXPECT_DOUBLE_EQ(m.at("achieved_tbps"), 1.5);
  // Floors at 4 TB/s: 20e9 B -> 5 ms, 40e9 B -> 10 ms; mean 7.5; 100 * 15 / 40 = 37.5 %.
  EXPECT_DOUBLE_EQ(m.at("floor_ms"), 7.5);
  EXPECT_DOUBLE_EQ(m.at("pct_of_floor"), 37.5);
  EXPECT_DOUBLE_EQ(m.at("host_schedule_ms_mean"), 2);         // (1 + 3) / 2
  EXPECT_DOUBLE_EQ(m.at("host_prepare_prefill_ms_mean"), 2);  // (0 + 4) / 2
  EXPECT_DOUBLE_EQ(m.at("host_prepare_decode_ms_mean"), 4);   // (2 + 6) / 2
  EXPECT_DOUBLE_EQ(m.at("host_process_outputs_ms_mean"), 2);  // (3 + 1) / 2
  EXPECT_DOUBLE_EQ(m.at("host_launch_ms_mean"), 1);           // (0.5 + 1.5) / 2
  EXPECT_DOUBLE_EQ(m.at("host_wait_ms_mean"), 3);             // (2 + 4) / 2
}

// Steps without collective times (one-rank runs, real runs) have no collective-wait fraction.
TEST(Metrics, NoCollectivesNoWaitFraction) {
  RunRecord rec = hand_record();
  for (StepSample& s : rec.steps) s.collective_ns = s.collective_wait_ns = 0;
  const auto m = as_map(compute_metrics(rec, {4.0}));
  EXPECT_EQ(m.count("collective_wait_frac"), 0u);
  EXPECT_DOUBLE_EQ(m.at("gpu_busy_frac"), 35.0 / 40);
}

// sample_record.h's routing, by hand. Distinct experts per (pass, rank): A rank 0 {1, 2} 2,
// rank 1 {5} 1; B rank 0 none 0, rank 1 {4, 6, 7} 3; C rank 0 {0, 1, 3} 3, rank 1 {6} 1. Mean
// 10 / 6; most per pass 2, 3, 3: mean 8 / 3. Picks: layer 0 (A and C) 8, expert 1 three of them
// (3 / 8); layer 1 (B) 4, expert 7 two (1 / 2); mean over the layers 7 / 16.
TEST(Metrics, HandExampleMoeRouting) {
  const auto m = as_map(compute_metrics(hand_record(), {4.0}));
  EXPECT_DOUBLE_EQ(m.at("moe_routing_passes"), 3);
  EXPECT_DOUBLE_EQ(m.at("moe_rank_experts_mean"), 10.0 / 6);
  EXPECT_DOUBLE_EQ(m.at("moe_rank_experts_max_mean"), 8.0 / 3);
  EXPECT_DOUBLE_EQ(m.at("moe_expert_share_max"), 7.0 / 16);
  // No routing recorded: no moe_* metric.
  RunRecord rec = hand_record();
  rec.moe_routing = {};
  for (const Metric& x : compute_metrics(rec, {4.0})) EXPECT_NE(x.key.rfind("moe_", 0), 0u);
}

// One EP rank (ep = 1): the rank's distinct experts are the pass's; uneven blocks follow
// layout.h's ⌊E·i/ep⌋ boundaries (5 experts over 2 ranks: [0, 2), [2, 5)).
TEST(Metrics, MoeRoutingBlocks) {
  MoeRoutingStats one;
  add_moe_routing(one, 3, std::vector<int32_t>{0, 1, 1, 7, 2, 0}, 2, 8, 1);
  EXPECT_EQ(one.passes, 1);
  EXPECT_EQ(one.rank_experts, 4);  // {0, 1, 2, 7}
  EXPECT_EQ(one.rank_experts_max, 4);
  EXPECT_EQ(one.picks.size(), 4u * 8);  // layers 0 .. 3
  EXPECT_DOUBLE_EQ(moe_routing_figures(one).expert_share_max, 2.0 / 6);
  MoeRoutingStats odd;
  add_moe_routing(odd, 0, std::vector<int32_t>{1, 2, 3, 4}, 1, 5, 2);
  EXPECT_EQ(odd.rank_experts, 4);      // rank 0 {1}, rank 1 {2, 3, 4}
  EXPECT_EQ(odd.rank_experts_max, 3);  // rank 1
}

TEST(Metrics, UnitsAndOrderFollowTheCatalogue) {
  const std::vector<Metric> metrics = compute_metrics(hand_record(), {4.0});
  const auto& defs = metric_definitions();
  // Every metric is computable for the hand example, so the output is the whole catalogue.
  ASSERT_EQ(metrics.size(), defs.size());
  for (size_t i = 0; i < defs.size(); ++i) {
    EXPECT_EQ(metrics[i].key, defs[i].key);
    EXPECT_EQ(metrics[i].unit, defs[i].unit);
  }
  const auto m = as_map(metrics);
  EXPECT_EQ(defs[0].key, "ttft_ms_mean");
  EXPECT_EQ(metrics[0].unit, "ms");
  std::set<std::string> keys;
  for (const auto& d : defs) EXPECT_TRUE(keys.insert(d.key).second) << d.key;
}

TEST(Metrics, OneTokenRequestsAreExcludedFromTpot) {
  RunRecord rec = hand_record();
  // Only r1 (one token) left: no TPOT sample, hence no tpot_* and no step time estimate.
  rec.requests = {rec.requests[1]};
  auto m = as_map(compute_metrics(rec, {4.0}));
  EXPECT_EQ(m.count("tpot_ms_mean"), 0u);
  EXPECT_EQ(m.count("tpot_ms_p99"), 0u);
  EXPECT_EQ(m.count("step_time_estimate_ms"), 0u);
  EXPECT_EQ(m.count("itl_ms_mean"), 0u);  // a single chunk has no gap
  EXPECT_DOUBLE_EQ(m.at("ttft_ms_mean"), 200);
  EXPECT_EQ(m.at("requests"), 1);

  // A 2-token request next to it: TPOT is that request's alone, (900 - 300) / 1 = 600 ms.
  RequestSample two = rec.requests[0];
  two.id = 5;
  two.output_len = 2;
  two.start_ns = 0;
  two.first_token_ns = 300 * kMs;
  two.end_ns = 900 * kMs;
  two.chunk_count = 0;
  rec.requests.push_back(two);
  m = as_map(compute_metrics(rec, {4.0}));
  EXPECT_DOUBLE_EQ(m.at("tpot_ms_mean"), 600);
  EXPECT_DOUBLE_EQ(m.at("tpot_ms_std"), 0);
}

TEST(Metrics, PeakWindowBoundariesBelongToTheLaterWindow) {
  RunRecord rec;
  // Start at 5 s; windows [5,6), [6,7), ... Chunks: 5.0 s 3 tok, 5.999999999 s 1 tok,
  // 6.0 s 2 tok, 6.5 s 2 tok, 6.999999999 s 1 tok, 7.0 s 4 tok.
  // Windows: [5,6) = 4, [6,7) = 5, [7,8) = 4 -> peak 5.
  const int64_t s = 1'000'000'000;
  rec.chunks = {{0, 3, 5 * s},         {0, 1, 6 * s - 1}, {0, 2, 6 * s},
                {0, 2, 6 * s + s / 2}, {0, 1, 7 * s - 1}, {0, 4, 7 * s}};
  RequestSample r;
  r.output_len = 13;
  r.start_ns = 5 * s;
  r.first_token_ns = 5 * s;
  r.end_ns = 7 * s;
  r.chunk_count = 6;
  rec.requests = {r};
  const auto m = as_map(compute_metrics(rec, {}));
  EXPECT_EQ(m.at("peak_output_throughput_tok_s"), 5);
  EXPECT_DOUBLE_EQ(m.at("output_throughput_tok_s"), 13 / 2.0);
  // No steps and no floor bandwidth: step metrics omitted.
  EXPECT_EQ(m.count("accept_len_mean"), 0u);
  EXPECT_EQ(m.count("pct_of_floor"), 0u);
}

TEST(Metrics, IncompleteRequestsAreIgnored) {
  RunRecord rec = hand_record();
  RequestSample unfinished = rec.requests[2];
  unfinished.id = 9;
  unfinished.end_ns = -1;  // never finished
  unfinished.start_ns = 9000 * kMs;
  rec.requests.push_back(unfinished);
  const auto m = as_map(compute_metrics(rec, {4.0}));
  EXPECT_EQ(m.at("requests"), 3);
  EXPECT_DOUBLE_EQ(m.at("duration_s"), 2.2);
}

TEST(Metrics, PerRequestHelpers) {
  const RunRecord rec = hand_record();
  EXPECT_DOUBLE_EQ(*request_ttft_ms(rec.requests[0]), 100);
  EXPECT_DOUBLE_EQ(*request_tpot_ms(rec.requests[0]), 100);
  EXPECT_DOUBLE_EQ(*request_e2e_ms(rec.requests[0]), 400);
  EXPECT_FALSE(request_tpot_ms(rec.requests[1]).has_value());
  RequestSample r = rec.requests[0];
  r.first_token_ns = -1;
  EXPECT_FALSE(request_ttft_ms(r).has_value());
}

// docs/database.md documents every metric key, so docs and code cannot drift apart.
TEST(Metrics, EveryKeyIsDocumented) {
  std::ifstream in(std::string(TWINSTEP_SOURCE_DIR) + "/docs/database.md");
  ASSERT_TRUE(in) << "docs/database.md missing";
  std::stringstream doc;
  doc << in.rdbuf();
  for (const MetricDef& def : metric_definitions()) {
    if (def.key.rfind("ttft_", 0) == 0 || def.key.rfind("tpot_", 0) == 0 ||
        def.key.rfind("itl_", 0) == 0 || def.key.rfind("e2e_", 0) == 0) {
      continue;  // documented as a family: {ttft,tpot,itl,e2e}_ms_{mean,...}
    }
    EXPECT_NE(doc.str().find("`" + def.key + "`"), std::string::npos) << def.key;
  }
}

}  // namespace
}  // namespace twinstep
