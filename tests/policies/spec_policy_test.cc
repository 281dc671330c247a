#include <gtest/gtest.h>

#include "policies/acceptance_spec.h"
#include "policies/decode_loop.h"
#include "policies/spec_rules.h"
#include "tests/support/recording_backend.h"

namespace twinstep {
namespace {

using Steps = std::vector<std::vector<std::string>>;

Steps run_spec(const SpecSpec& spec, HostSchedule schedule, int32_t output_len) {
  PolicySpec policy;
  policy.host_schedule = schedule;
  policy.spec = spec;
  WorkloadSpec w;
  w.input_len = {16, 16};
  w.output_len = {output_len, output_len};
  RunRecord record;
  DecodeLoop loop(policy, w, generate_requests(w), &record);
  testing::RecordingBackend backend;
  HostProgram* ranks[] = {&loop};
  backend.run(ranks, record);
  // Every token delivered exactly once, whatever the policy.
  int32_t tokens = 0;
  for (const ChunkSample& c : record.chunks) tokens += c.tokens;
  EXPECT_EQ(tokens, output_len);
  return backend.steps;
}

TEST(SpecPolicy, ChainLaunchesDraftVerifyExtend) {
  SpecSpec spec;
  spec.method = SpecMethod::kChain;  // steps 5, draft_tokens 6
  const Steps s = run_spec(spec, HostSchedule::kLockstep, 13);
  // Prefill (1 token), then rounds committing 6 tokens each (everything accepted): 1 + 6 + 6.
  ASSERT_EQ(s.size(), 3u);
  const std::vector<std::string> want = {
      "schedule",           "prepare_decode",  "launch:draftx1",
      "launch:verifyx1",    "launch:extendx1", "record_event:compute#2",
      "stream_wait:copy#2", "copy_d2h:step1",  "record_event:copy#3",
      "host_wait#3:step1",  "process_outputs"};
  EXPECT_EQ(s[1], want);
}

TEST(SpecPolicy, HostBlockingSplitsAStepAtTheBlockingRead) {
  SpecSpec spec;
  spec.method = SpecMethod::kConfidence;
  spec.mode = DraftMode::kHostBlocking;
  spec.max_steps = 4;
  const Steps s = run_spec(spec, HostSchedule::kRunahead, 11);
  ASSERT_GE(s.size(), 3u);
  const std::vector<std::string> draft_half = {
      "schedule",           "prepare_decode", "launch:draftx1",      "record_event:compute#2",
      "stream_wait:copy#2", "copy_d2h:step1", "record_event:copy#3", "host_wait#3:step1"};
  EXPECT_EQ(s[1], draft_half);
  // The verify half verifies what was read: 4 drafts + the committed token.
  EXPECT_EQ(s[2][2], "launch:verifyx1");
  EXPECT_EQ(s[2][3], "launch:extendx1");
}

TEST(SpecPolicy, HostLateGrowsTheDraftFromLateConfidence) {
  SpecSpec spec;
  spec.method = SpecMethod::kConfidence;
  spec.mode = DraftMode::kHostLate;
  spec.min_steps = 1;
  spec.max_steps = 4;
  // With every draft token confident, each observed round suggests one more token, capped at
  // max_steps. Under lockstep the host reads round k before planning round k+1.
  PolicySpec policy;
  policy.host_schedule = HostSchedule::kLockstep;
  policy.spec = spec;
  WorkloadSpec w;
  w.input_len = {16, 16};
  w.output_len = {40, 40};
  RunRecord record;
  DecodeLoop loop(policy, w, generate_requests(w), &record);
  testing::RecordingBackend backend;
  HostProgram* ranks[] = {&loop};
  backend.run(ranks, record);
  std::vector<int32_t> committed;
  for (size_t i = 0; i < record.chunks.size(); ++i) committed.push_back(record.chunks[i].tokens);
  // Prefill 1; then drafts of 1, 2, 3, 4, 4, ... commit draft + 1 tokens; the last is cut at 40.
  const std::vector<int32_t> want = {1, 2, 3, 4, 5, 5, 5, 5, 5, 5};
  EXPECT_EQ(committed, want);
}

TEST(SpecRules, DeviceDraftLength) {
  SpecSpec spec;
  spec.threshold = 0.5;
  spec.min_steps = 2;
  const float c[] = {0.9f, 0.2f, 0.8f, 0.1f, 0.9f};
  // Position 2 is below the threshold but min_steps is 2: stops after it.
  EXPECT_EQ(device_draft_len(spec, c, 5), 2);
  spec.min_steps = 3;  // must draft 3; position 4 is the next below the threshold
  EXPECT_EQ(device_draft_len(spec, c, 5), 4);
  EXPECT_EQ(device_draft_len(spec, c, 3), 3);  // capped
  EXPECT_EQ(confident_prefix(spec, c, 4), 1);
  const bool agree[] = {true, true, false, true};
  EXPECT_EQ(accepted_prefix(agree, 4), 2);
  EXPECT_EQ(accepted_prefix(agree, 1), 1);
}

// Draft forwards (NEXTN: L tokens take L - 1), hand-worked per rule.
TEST(SpecRules, DraftPassesFollowWhoDecidesTheLength) {
  SpecSpec chain;
  chain.method = SpecMethod::kChain;
  EXPECT_EQ(draft_passes(chain, GraphMode::kCudaGraph, 5, 5), 4);
  EXPECT_EQ(draft_passes(chain, GraphMode::kEager, 5, 5), 4);
  EXPECT_EQ(draft_passes(chain, GraphMode::kCudaGraph, 0, 5), 0);  // never below 0
  SpecSpec device;
  device.method = SpecMethod::kConfidence;
  device.mode = DraftMode::kDevice;
  device.early_exit = true;
  // Early exit in a graph stops past the longest draft; eager runs the whole width.
  EXPECT_EQ(draft_passes(device, GraphMode::kCudaGraph, 3, 8), 2);
  EXPECT_EQ(draft_passes(device, GraphMode::kCudaGraphPdl, 3, 8), 2);
  EXPECT_EQ(draft_passes(device, GraphMode::kEager, 3, 8), 7);
  device.early_exit = false;
  EXPECT_EQ(draft_passes(device, GraphMode::kCudaGraph, 3, 8), 7);
  SpecSpec late = device;
  late.mode = DraftMode::kHostLate;  // the host chose the length: exactly its longest
  EXPECT_EQ(draft_passes(late, GraphMode::kEager, 3, 8), 2);
  SpecSpec blocking = device;
  blocking.mode = DraftMode::kHostBlocking;  // decided on the device, then read by the host
  EXPECT_EQ(draft_passes(blocking, GraphMode::kEager, 3, 8), 7);
}

TEST(AcceptanceSpec, ChainLengthAndInverse) {
  // Σ_{i=0}^{5} 0.5^i = 1 + 0.5 + 0.25 + 0.125 + 0.0625 + 0.03125 = 1.96875.
  EXPECT_DOUBLE_EQ(chain_accept_len(0.5, 5), 1.96875);
  EXPECT_DOUBLE_EQ(chain_accept_len(1.0, 5), 6.0);
  EXPECT_DOUBLE_EQ(chain_accept_len(0.0, 5), 1.0);
  EXPECT_NEAR(rate_for_chain_accept_len(1.96875, 5), 0.5, 1e-12);
  EXPECT_NEAR(chain_accept_len(rate_for_chain_accept_len(3.25, 5), 5), 3.25, 1e-12);
}

}  // namespace
}  // namespace twinstep
