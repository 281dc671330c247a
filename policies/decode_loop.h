// DecodeLoop: the host program of continuous-batching decode under a host schedule.
//
// Step k: schedule (admit arrivals into free slots, retire requests known to be finished);
// prefill the admitted ones; decode the running ones (one graph, weights read once); record a
// compute event, copy the step's outputs on the copy stream, record copy_done[k]. Lockstep then
// waits on copy_done[k]; run-ahead(d) waits on copy_done[k-d], so the host prepares step k+1
// while step k runs and learns finished requests d steps late (extra steps are discarded).
// With seq_lens_sync the host also blocks on step k-1's compute before preparing step k.
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
};

}  // namespace twinstep
