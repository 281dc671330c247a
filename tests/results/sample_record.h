// A small hand-built RunRecord shared by the results tests. Every derived value used in a test
// is worked out in metrics_test.cc.
#pragma once

#include <vector>

#include "policies/run_record.h"

namespace twinstep::testing {

constexpr int64_t kMs = 1'000'000;

// Requests (times in ms):
//   r0: out 4, start 0,    first token 100,  end 400,  chunks at 100 (1 tok), 250 (2), 400 (1)
//   r1: out 1, start 500,  first token 700,  end 700,  chunk at 700 (1)
//   r2: out 3, start 1000, first token 1200, end 2200, chunks at 1200 (1), 1600 (1), 2200 (1)
// Steps: s0 prefill only (batch 0, excluded everywhere); s1 and s2 decode steps.
// Timeline: step 1 on rank 0, one host launch linked (flow 7) to one compute span.
// MoE routing: 8 experts in 2 EP blocks ([0, 4), [4, 8)), top-2, 2 tokens per pass:
//   pass A, layer 0: tokens {1, 5}, {1, 2}   pass B, layer 1: {6, 7}, {4, 7}
//   pass C, layer 0: {0, 1}, {3, 6}
inline RunRecord hand_record() {
  RunRecord rec;
  auto add_request = [&](int32_t id, int32_t out, int64_t start_ms, int64_t first_ms,
                         int64_t end_ms, std::vector<std::pair<int64_t, int32_t>> chunks) {
    RequestSample r;
    r.id = id;
    r.input_len = 8;
    r.output_len = out;
    r.arrival_ns = start_ms * kMs;
    r.start_ns = start_ms * kMs;
    r.first_token_ns = first_ms * kMs;
    r.end_ns = end_ms * kMs;
    r.first_chunk = static_cast<int32_t>(rec.chunks.size());
    r.chunk_count = static_cast<int32_t>(chunks.size());
    for (auto [t_ms, tokens] : chunks) rec.chunks.push_back({id, tokens, t_ms * kMs});
    rec.requests.push_back(r);
  };
  add_request(0, 4, 0, 100, 400, {{100, 1}, {250, 2}, {400, 1}});
  add_request(1, 1, 500, 700, 700, {{700, 1}});
  add_request(2, 3, 1000, 1200, 2200, {{1200, 1}, {1600, 1}, {2200, 1}});

  StepSample s0;  // prefill only: huge values that would show up if it were not excluded
  s0.step = 0;
  s0.end_ns = 60 * kMs;
  s0.dur_ns = 50 * kMs;
  s0.gpu_busy_ns = 50 * kMs;
  s0.prefills = 1;
  s0.bytes_read = 1'000'000'000'000;
  s0.host_ns = {100 * kMs, 100 * kMs, 100 * kMs, 100 * kMs};
  s0.host_wait_ns = 100 * kMs;

  StepSample s1;
  s1.step = 1;
  s1.end_ns = 70 * kMs;
  s1.dur_ns = 10 * kMs;
  s1.gpu_busy_ns = 8 * kMs;
  s1.idle_host_ns = 1 * kMs;
  s1.idle_launch_ns = kMs / 2;
  s1.idle_dep_ns = kMs / 2;
  s1.collective_ns = 2 * kMs;  // of busy; 1.5 ms of it waiting for a late rank
  s1.collective_wait_ns = 3 * kMs / 2;
  s1.batch = 1;
  s1.tokens = 2;
  s1.draft_len = 3;
  s1.bytes_read = 20'000'000'000;
  s1.host_ns = {1 * kMs, 0, 2 * kMs, 3 * kMs};
  s1.host_launch_ns = kMs / 2;
  s1.host_wait_ns = 2 * kMs;

  StepSample s2;
  s2.step = 2;
  s2.end_ns = 100 * kMs;
  s2.dur_ns = 30 * kMs;
  s2.gpu_busy_ns = 27 * kMs;
  s2.idle_host_ns = 2 * kMs;
  s2.idle_launch_ns = 1 * kMs;
  s2.collective_ns = 4 * kMs;
  s2.collective_wait_ns = 1 * kMs;
  s2.batch = 2;
  s2.tokens = 3;
  s2.draft_len = 3;
  s2.bytes_read = 40'000'000'000;
  s2.host_ns = {3 * kMs, 4 * kMs, 6 * kMs, 1 * kMs};
  s2.host_launch_ns = 3 * kMs / 2;
  s2.host_wait_ns = 4 * kMs;
  rec.steps = {s0, s1, s2};

  rec.timeline = {
      {0, Lane::kHost, "prepare_decode", 1, 60'000'000, 2'000'000, 0},
      {0, Lane::kHost, "launch", 1, 62'000'000, 1'500, 7},
      {0, Lane::kCompute, "decode_graph", 1, 62'001'234, 7'998'766, 7},
      {0, Lane::kCopy, "copy_out", 1, 70'000'000, 10'500, 0},
  };
  rec.end_ns = 2200 * kMs;
  add_moe_routing(rec.moe_routing, 0, std::vector<int32_t>{1, 5, 1, 2}, 2, 8, 2);
  add_moe_routing(rec.moe_routing, 1, std::vector<int32_t>{6, 7, 4, 7}, 2, 8, 2);
  add_moe_routing(rec.moe_routing, 0, std::vector<int32_t>{0, 1, 3, 6}, 2, 8, 2);
  return rec;
}

}  // namespace twinstep::testing
