// Printable names of the policy enums (database values, trace names, CLI output).
#include "policies/plan.h"
#include "policies/policy_spec.h"

namespace twinstep {

const char* host_schedule_name(HostSchedule s) {
  return s == HostSchedule::kLockstep ? "lockstep" : "runahead";
}

const char* graph_mode_name(GraphMode m) {
  switch (m) {
    case GraphMode::kEager:
      return "eager";
    case GraphMode::kCudaGraph:
      return "cuda_graph";
    case GraphMode::kCudaGraphPdl:
      return "cuda_graph_pdl";
  }
  return "?";
}

const char* spec_method_name(SpecMethod m) {
  switch (m) {
    case SpecMethod::kNone:
      return "none";
    case SpecMethod::kChain:
      return "chain";
    case SpecMethod::kConfidence:
      return "confidence";
  }
  return "?";
}

const char* draft_mode_name(DraftMode m) {
  switch (m) {
    case DraftMode::kDevice:
      return "device";
    case DraftMode::kHostLate:
      return "host_late";
    case DraftMode::kHostBlocking:
      return "host_blocking";
  }
  return "?";
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kPrefill:
      return "prefill";
    case Phase::kDecode:
      return "decode";
    case Phase::kDraft:
      return "draft";
    case Phase::kVerify:
      return "verify";
    case Phase::kExtend:
      return "extend";
  }
  return "?";
}

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::kHostWork:
      return "host_work";
    case OpKind::kHostSleep:
      return "host_sleep";
    case OpKind::kLaunch:
      return "launch";
    case OpKind::kRecordEvent:
      return "record_event";
    case OpKind::kStreamWait:
      return "stream_wait";
    case OpKind::kCopyD2H:
      return "copy_d2h";
    case OpKind::kHostWait:
      return "host_wait";
  }
  return "?";
}

}  // namespace twinstep
