// The backend contract. A policy is a HostProgram: it decides, step by step, which operations
// the host performs (a Plan) and sees results only when a host wait delivers them. A Backend
// executes plans: the simulator in integer-nanosecond virtual time, the runtime on CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "policies/plan.h"
#include "policies/run_record.h"

namespace twinstep {

// What a step's copied outputs tell the host about one request.
struct RequestOutput {
  int32_t request;
  int32_t tokens;         // tokens committed this step (decode 1; speculation accepted + 1)
  int32_t draft_len = 0;  // draft tokens proposed (0 without speculation)
  int32_t conf_len = 0;   // leading drafted tokens whose confidence met the threshold
};

struct StepOutputs {
  int64_t step;
  std::span<const RequestOutput> outputs;
  // A blocking read of draft lengths only (tokens 0): no token is committed yet.
  bool draft_only = false;
};

class HostProgram {
 public:
  virtual ~HostProgram() = default;
  // Fills `plan` (already cleared) with the next step's operations at host time now_ns.
  // Returns false when the run is over. Called again only after the previous plan ran.
  virtual bool next_plan(int64_t now_ns, Plan& plan) = 0;
  // A host wait made step `out.step`'s outputs visible at host time now_ns. The current plan
  // is already fixed; what is learnt here shapes the next one.
  virtual void observe(const StepOutputs& out, int64_t now_ns) = 0;
  // Host work `op` of plan `step` ended at now_ns.
  virtual void host_work_done(HostOp op, int64_t step, int64_t now_ns) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Runs one program per rank to completion, appending step samples and timeline spans to
  // `record`. Throws Error on a failure the user can act on.
  virtual void run(std::span<HostProgram* const> ranks, RunRecord& record) = 0;
};

}  // namespace twinstep
