// RecordingBackend: executes plans in zero time and logs every operation as text, so tests see
// the operation sequence a policy issues with no GPU and no cost model. Each launch commits
// q_tokens per decoded request and one token per prefilled request, delivered by host waits
// that carry a payload — the same information flow as the real backends.
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "policies/backend.h"

namespace twinstep::testing {

inline std::string describe(const Plan& plan, const Op& op) {
  std::string s = op_kind_name(op.kind);
  switch (op.kind) {
    case OpKind::kHostWork:
      return host_op_name(op.host_op);
    case OpKind::kHostSleep:
      return s + "@" + std::to_string(op.until_ns);
    case OpKind::kLaunch: {
      const GraphLaunch& g = plan.launches[size_t(op.graph)];
      return s + ":" + phase_name(g.phase) + "x" + std::to_string(g.request_count);
    }
    case OpKind::kRecordEvent:
    case OpKind::kStreamWait:
      return s + ":" + (op.stream == StreamId::kCompute ? "compute" : "copy") + "#" +
             std::to_string(op.event);
    case OpKind::kCopyD2H:
      return s + ":step" + std::to_string(op.payload_step);
    case OpKind::kHostWait:
      return s + "#" + std::to_string(op.event) +
             (op.payload_step >= 0 ? ":step" + std::to_string(op.payload_step) : "");
  }
  return s;
}

class RecordingBackend final : public Backend {
 public:
  std::vector<std::vector<std::string>> steps;  // one op list per plan

  void run(std::span<HostProgram* const> ranks, RunRecord&) override {
    HostProgram& p = *ranks[0];
    Plan plan;
    int64_t now = 0;
    std::map<int64_t, std::vector<RequestOutput>> outputs;
    std::map<int64_t, bool> draft_only;
    for (;;) {
      plan.clear();
      if (!p.next_plan(now, plan)) return;
      std::vector<std::string>& log = steps.emplace_back();
      for (const Op& op : plan.ops) {
        log.push_back(describe(plan, op));
        if (op.kind == OpKind::kLaunch) {
          const GraphLaunch& g = plan.launches[size_t(op.graph)];
          for (int32_t i = 0; i < g.request_count; ++i) {
            const int32_t id = plan.requests[size_t(g.first_request + i)];
            switch (g.phase) {
              case Phase::kPrefill:
                outputs[plan.step].push_back({id, 1});
                break;
              case Phase::kDecode:
                outputs[plan.step].push_back({id, g.q_tokens});
                break;
              // Every draft token is confident and accepted.
              case Phase::kDraft:
                draft_only[plan.step] = true;
                outputs[plan.step].push_back({id, 0, g.q_tokens, g.q_tokens});
                break;
              case Phase::kVerify:
                draft_only[plan.step] = false;
                outputs[plan.step].erase(
                    std::remove_if(outputs[plan.step].begin(), outputs[plan.step].end(),
                                   [](const RequestOutput& o) { return o.tokens == 0; }),
                    outputs[plan.step].end());
                outputs[plan.step].push_back({id, g.q_tokens, g.q_tokens - 1, g.q_tokens - 1});
                break;
              case Phase::kExtend:
                break;
            }
          }
        } else if (op.kind == OpKind::kHostWait && op.payload_step >= 0) {
          p.observe({op.payload_step, outputs[op.payload_step], draft_only[op.payload_step]}, now);
        } else if (op.kind == OpKind::kHostWork) {
          p.host_work_done(op.host_op, plan.step, now);
        } else if (op.kind == OpKind::kHostSleep) {
          now = std::max(now, op.until_ns);
        }
      }
      ++now;
    }
  }
};

}  // namespace twinstep::testing
