// SimBackend: executes plans in integer-nanosecond virtual time. Per rank: a host lane, a
// compute stream and a copy stream (FIFO). Ranks are resumed from an event queue keyed by
// (time, sequence number), so ties resolve first-in first-out and runs are reproducible.
//
// The simulated device holds the truth the host must not see early: each request's context
// length and the tokens each step commits. A host program learns them only when a host wait
// on a copy-done event delivers them, exactly as on a GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "policies/acceptance_spec.h"
#include "policies/backend.h"
#include "policies/hardware_spec.h"
#include "policies/host_costs.h"
#include "policies/layout.h"
#include "policies/model_spec.h"
#include "policies/policy_spec.h"
#include "policies/workload.h"
#include "simulator/cost_model.h"

namespace twinstep {

struct SimOptions {
  // Node-level timeline for plan steps [trace_first_step, trace_first_step + trace_steps).
  int64_t trace_first_step = 0;
  int64_t trace_steps = 0;
  // Speculative decoding: the device-side rules (spec_rules.h) read `spec`; draft/target
  // agreement comes from `acceptance`, drawn with `acceptance_seed`. The draft is the model's
  // NEXTN module (nextn_draft).
  SpecSpec spec;
  AcceptanceSpec acceptance;
  uint64_t acceptance_seed = 0;
  // Ranks and how the model is sharded over them. With more than one rank, run() takes one
  // host program per rank (SPMD: they must decide the same plans) and couples the ranks
  // through the collectives of their kernel lists.
  LayoutSpec layout;
};

class SimBackend final : public Backend {
 public:
  // `requests` is the device's view of the workload (prompt lengths); the references must
  // outlive the backend.
  SimBackend(const ModelSpec& model, const HardwareSpec& hw, const HostCostModel& host_costs,
             const std::vector<RequestSpec>& requests, SimOptions options = {});
  void run(std::span<HostProgram* const> ranks, RunRecord& record) override;

 private:
  const ModelSpec& model_;
  const HardwareSpec& hw_;
  const HostCostModel& host_costs_;
  const std::vector<RequestSpec>& requests_;
  SimOptions options_;
  ModelSpec draft_;
  CostModel cost_;
};

}  // namespace twinstep
