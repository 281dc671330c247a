#include "policies/decode_loop.h"

#include <gtest/gtest.h>

#include "tests/support/recording_backend.h"

namespace twinstep {
namespace {

using Steps = std::vector<std::vector<std::string>>;

Steps run_policy(HostSchedule schedule, int32_t requests, int32_t output_len, int32_t concurrency,
                 RunRecord* record_out = nullptr) {
  PolicySpec policy;
  policy.host_schedule = schedule;
  WorkloadSpec w;
  w.input_len = {16, 16};
  w.output_len = {output_len, output_len};
  w.num_requests = requests;
  w.max_concurrency = concurrency;
  RunRecord record;
  DecodeLoop loop(policy, w, generate_requests(w), &record);
  testing::RecordingBackend backend;
  HostProgram* ranks[] = {&loop};
  backend.run(ranks, record);
  if (record_out) *record_out = record;
  return backend.steps;
}

TEST(DecodeLoop, LockstepWaitsForItsOwnStep) {
  const Steps s = run_policy(HostSchedule::kLockstep, 1, 3, 1);
  const Steps want = {
      {"schedule", "prepare_prefill", "launch:prefillx1", "record_event:compute#0",
       "stream_wait:copy#0", "copy_d2h:step0", "record_event:copy#1", "host_wait#1:step0",
       "process_outputs"},
      {"schedule", "prepare_decode", "launch:decodex1", "record_event:compute#2",
       "stream_wait:copy#2", "copy_d2h:step1", "record_event:copy#3", "host_wait#3:step1",
       "process_outputs"},
      {"schedule", "prepare_decode", "launch:decodex1", "record_event:compute#4",
       "stream_wait:copy#4", "copy_d2h:step2", "record_event:copy#5", "host_wait#5:step2",
       "process_outputs"},
  };
  EXPECT_EQ(s, want);
}

TEST(DecodeLoop, RunaheadReadsOneStepLateAndWastesOneStep) {
  const Steps s = run_policy(HostSchedule::kRunahead, 1, 3, 1);
  const Steps want = {
      {"schedule", "prepare_prefill", "launch:prefillx1", "record_event:compute#0",
       "stream_wait:copy#0", "copy_d2h:step0", "record_event:copy#1"},
      {"schedule", "prepare_decode", "launch:decodex1", "record_event:compute#2",
       "stream_wait:copy#2", "copy_d2h:step1", "record_event:copy#3", "host_wait#1:step0",
       "process_outputs"},
      {"schedule", "prepare_decode", "launch:decodex1", "record_event:compute#4",
       "stream_wait:copy#4", "copy_d2h:step2", "record_event:copy#5", "host_wait#3:step1",
       "process_outputs"},
      // The host does not know yet that step 2 finished the request: one extra step.
      {"schedule", "prepare_decode", "launch:decodex1", "record_event:compute#6",
       "stream_wait:copy#6", "copy_d2h:step3", "record_event:copy#7", "host_wait#5:step2",
       "process_outputs"},
      {"host_wait#7:step3", "process_outputs"},
  };
  EXPECT_EQ(s, want);
}

TEST(DecodeLoop, SeqLensSyncBlocksOnPreviousCompute) {
  PolicySpec policy;
  policy.host_schedule = HostSchedule::kRunahead;
  policy.seq_lens_sync = true;
  WorkloadSpec w;
  w.input_len = {16, 16};
  w.output_len = {2, 2};
  RunRecord record;
  DecodeLoop loop(policy, w, generate_requests(w), &record);
  testing::RecordingBackend backend;
  HostProgram* ranks[] = {&loop};
  backend.run(ranks, record);
  ASSERT_GE(backend.steps.size(), 2u);
  EXPECT_EQ(backend.steps[1][1], "host_wait#0");  // step 0's compute event, no payload
  EXPECT_EQ(backend.steps[1][2], "prepare_decode");
}

// Property: every request gets exactly its output length, in chunks whose times never
// decrease, for any concurrency and schedule.
TEST(DecodeLoop, EveryRequestCompletesExactly) {
  for (HostSchedule sched : {HostSchedule::kLockstep, HostSchedule::kRunahead}) {
    for (int32_t conc : {1, 3, 8}) {
      RunRecord r;
      run_policy(sched, 10, 7, conc, &r);
      ASSERT_EQ(r.requests.size(), 10u);
      int64_t total = 0;
      for (const RequestSample& q : r.requests) {
        int32_t tokens = 0;
        for (int32_t c = 0; c < q.chunk_count; ++c) {
          const ChunkSample& ch = r.chunks[size_t(q.first_chunk + c)];
          EXPECT_EQ(ch.request, q.id);
          if (c > 0) {
            EXPECT_GE(ch.t_ns, r.chunks[size_t(q.first_chunk + c - 1)].t_ns);
          }
          tokens += ch.tokens;
        }
        EXPECT_EQ(tokens, 7);
        EXPECT_GE(q.first_token_ns, q.start_ns);
        EXPECT_GE(q.end_ns, q.first_token_ns);
        total += tokens;
      }
      EXPECT_EQ(total, 70);
    }
  }
}

}  // namespace
}  // namespace twinstep
