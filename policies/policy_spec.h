// The scheduling choices of one variant, as parsed from YAML and read by the policies.
#pragma once

#include <cstdint>

namespace twinstep {

// lockstep: the host waits for step k's results before preparing step k+1.
// runahead: the host enqueues step k+1 while k runs and reads step k's results `depth` steps
// late through a copy-done event.
enum class HostSchedule : uint8_t { kLockstep, kRunahead };
enum class GraphMode : uint8_t { kEager, kCudaGraph, kCudaGraphPdl };

// Speculative decoding. none: one token per step. chain: a fixed draft chain (NEXTN/MTP).
// confidence: the draft runs on while its top-1 probability stays >= threshold, between
// min_steps and max_steps draft tokens.
enum class SpecMethod : uint8_t { kNone, kChain, kConfidence };
// Who decides a confidence-scheduled draft's length: the device (no host round trip), the host
// from a confidence read `lag` steps late, or the host after a blocking read every step.
enum class DraftMode : uint8_t { kDevice, kHostLate, kHostBlocking };

const char* host_schedule_name(HostSchedule s);
const char* graph_mode_name(GraphMode m);
const char* spec_method_name(SpecMethod m);
const char* draft_mode_name(DraftMode m);

struct SpecSpec {
  SpecMethod method = SpecMethod::kNone;
  // chain: NEXTN semantics — `steps` draft steps need steps - 1 draft forwards (the first
  // candidate comes from the previous round's extend); draft_tokens = steps + 1 positions are
  // verified (the committed token plus the drafts).
  int32_t steps = 5;
  int32_t draft_tokens = 6;
  // confidence
  double threshold = 0.5;
  int32_t min_steps = 1;
  int32_t max_steps = 8;
  DraftMode mode = DraftMode::kDevice;
  int32_t lag = 1;  // host_late: steps between the step whose confidence is read and its use
  // Device-decided lengths (device, host_blocking) in graphs: the draft steps past min_steps
  // are skipped once every request stopped (conditional graph nodes). false: every one of
  // max_steps runs, stopped requests padded (eager runs always do).
  bool early_exit = true;

  // Draft tokens proposed per round at most (the verify graph is padded to this + 1).
  int32_t max_draft() const { return method == SpecMethod::kChain ? draft_tokens - 1 : max_steps; }
};

struct PolicySpec {
  HostSchedule host_schedule = HostSchedule::kRunahead;
  int32_t runahead_depth = 1;
  GraphMode graph_mode = GraphMode::kCudaGraph;
  // The seed's host pin: the host reads the previous step's sequence lengths with a blocking
  // wait before preparing each step (an attention backend that needs CPU seq lens).
  bool seq_lens_sync = false;
  SpecSpec spec;
  // Bytes copied device-to-host per request per step (tokens, lengths, stop flags).
  int32_t output_copy_bytes_per_request = 64;
};

}  // namespace twinstep
