// DecodeLoop: the host program of continuous-batching decode under a host schedule.
//
// Step k: schedule (admit arrivals into free slots, retire requests known to be finished);
// prefill the admitted ones; decode the running ones (one graph, weights read once); record a
// compute event, copy the step's outputs on the copy stream, record copy_done[k]. Lockstep then
// waits on copy_done[k]; run-ahead(d) waits on copy_done[k-d], so the host prepares step k+1
// while step k runs and learns finished requests d steps late (extra steps are discarded).
// With seq_lens_sync the host also blocks on step k-1's compute before preparing step k.
//
// Speculative decoding replaces the decode graph with three: draft (the draft chain), verify
// (the target over the committed token and the drafts, acceptance decided on the device) and
// extend (the draft over the accepted prefix, seeding the next round). Draft length L: chain
// draft_tokens - 1; confidence/device max_steps (the device stops early); confidence/host_late
// the host's choice from confidence read `lag` steps late. confidence/host_blocking splits a
// step into two plans: draft, then a blocking read of the draft lengths, then verify + extend
// sized by what was read.
//
// The host sees only what observe() delivers. Request samples and chunks go to `record`.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "policies/backend.h"
#include "policies/policy_spec.h"
#include "policies/run_record.h"
#include "policies/workload.h"

namespace twinstep {

class DecodeLoop final : public HostProgram {
 public:
  DecodeLoop(const PolicySpec& policy, const WorkloadSpec& workload,
             std::vector<RequestSpec> requests, RunRecord* record);

  bool next_plan(int64_t now_ns, Plan& plan) override;
  void observe(const StepOutputs& out, int64_t now_ns) override;
  void host_work_done(HostOp op, int64_t step, int64_t now_ns) override;

 private:
  struct Outstanding {
    int64_t step;
    EventId copy_done;
  };
  struct HostRequest {
    int64_t start_ns = -1;
    int32_t delivered = 0;
    bool finished = false;
  };

  void admit(int64_t now_ns, Plan& plan);
  void launch_speculative(Plan& plan, int32_t first, int32_t count, int32_t draft_len);
  int32_t host_late_draft_len(int64_t step) const;
  void wait_oldest(Plan& plan);
  void finish_record();

  PolicySpec policy_;
  int32_t max_concurrency_;
  std::vector<RequestSpec> requests_;
  std::vector<HostRequest> host_;
  RunRecord* record_;

  int32_t next_request_ = 0;
  std::deque<int64_t> free_slot_ns_;  // when each free client slot became free
  std::vector<int32_t> running_;      // admitted, not known to be finished
  std::deque<Outstanding> outstanding_;
  std::vector<RequestOutput> pending_chunks_;  // observed, stamped at process_outputs end
  int32_t finished_count_ = 0;
  int64_t step_ = 0;
  EventId next_event_ = 0;
  EventId last_compute_event_ = -1;

  // Speculation state (host view).
  bool verify_pending_ = false;  // host_blocking: drafted, lengths read, verify not launched
  int32_t blocking_draft_len_ = 0;
  std::deque<std::pair<int64_t, int32_t>> late_suggestions_;  // (observed step, suggested L)
};

}  // namespace twinstep
