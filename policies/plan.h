// A step plan: the operations a policy decides the host performs for one step, in host program
// order. Plans are data; a backend executes them (the simulator in virtual time, the runtime on
// a GPU), so a policy issues the same operation sequence on both, given the same observations.
#pragma once

#include <cstdint>
#include <vector>

#include "policies/host_costs.h"
#include "policies/policy_spec.h"

namespace twinstep {

enum class StreamId : uint8_t { kCompute = 0, kCopy = 1 };
constexpr int kStreamCount = 2;

// Events are named by the policy with ids unique within a run, increasing in record order.
using EventId = int64_t;

enum class Phase : uint8_t { kPrefill, kDecode, kDraft, kVerify, kExtend };
const char* phase_name(Phase p);

// A forward pass to launch. Which requests it serves is given by request slots, not token
// counts: context lengths live on the device, where the host may not know them yet.
struct GraphLaunch {
  Phase phase = Phase::kDecode;
  GraphMode mode = GraphMode::kCudaGraph;
  int32_t q_tokens = 1;       // new tokens per request (decode 1, verify draft_len + 1)
  int32_t first_request = 0;  // into Plan::requests
  int32_t request_count = 0;
};

enum class OpKind : uint8_t {
  kHostWork,     // host_op: a named piece of host work
  kHostSleep,    // the host idles until until_ns (no running requests, next arrival later)
  kLaunch,       // graph: launch Plan::launches[graph] on `stream`
  kRecordEvent,  // record `event` on `stream`
  kStreamWait,   // `stream` waits for `event`
  kCopyD2H,      // copy step `payload_step`'s outputs device-to-host on `stream`
  kHostWait,     // the host blocks on `event`; payload_step >= 0: outputs become visible
};
const char* op_kind_name(OpKind k);

struct Op {
  OpKind kind;
  StreamId stream = StreamId::kCompute;
  HostOp host_op = HostOp::kSchedule;
  EventId event = -1;
  int32_t graph = -1;
  int64_t payload_step = -1;
  int64_t bytes = 0;
  int64_t until_ns = 0;
};

// Reused across steps: clear() keeps capacity so steady-state planning does not allocate.
struct Plan {
  int64_t step = 0;
  std::vector<Op> ops;
  std::vector<GraphLaunch> launches;
  std::vector<int32_t> requests;  // request ids referenced by launches

  void clear() {
    ops.clear();
    launches.clear();
    requests.clear();
  }
  void host_work(HostOp op) { ops.push_back({.kind = OpKind::kHostWork, .host_op = op}); }
  void host_sleep(int64_t until_ns) {
    ops.push_back({.kind = OpKind::kHostSleep, .until_ns = until_ns});
  }
  void launch(StreamId s, int32_t graph) {
    ops.push_back({.kind = OpKind::kLaunch, .stream = s, .graph = graph});
  }
  void record(StreamId s, EventId e) {
    ops.push_back({.kind = OpKind::kRecordEvent, .stream = s, .event = e});
  }
  void stream_wait(StreamId s, EventId e) {
    ops.push_back({.kind = OpKind::kStreamWait, .stream = s, .event = e});
  }
  void copy_d2h(StreamId s, int64_t step, int64_t bytes) {
    ops.push_back({.kind = OpKind::kCopyD2H, .stream = s, .payload_step = step, .bytes = bytes});
  }
  void host_wait(EventId e, int64_t payload_step = -1) {
    ops.push_back({.kind = OpKind::kHostWait, .event = e, .payload_step = payload_step});
  }
};

}  // namespace twinstep
