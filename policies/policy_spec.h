// The scheduling choices of one variant, as parsed from YAML and read by the policies.
#pragma once

#include <cstdint>

namespace twinstep {

// lockstep: the host waits for step k's results before preparing step k+1.
// runahead: the host enqueues step k+1 while k runs and reads step k's results `depth` steps
// late through a copy-done event.
enum class HostSchedule : uint8_t { kLockstep, kRunahead };
enum class GraphMode : uint8_t { kEager, kCudaGraph, kCudaGraphPdl };

const char* host_schedule_name(HostSchedule s);
const char* graph_mode_name(GraphMode m);

struct PolicySpec {
  HostSchedule host_schedule = HostSchedule::kRunahead;
  int32_t runahead_depth = 1;
  GraphMode graph_mode = GraphMode::kCudaGraph;
  // The seed's host pin: the host reads the previous step's sequence lengths with a blocking
  // wait before preparing each step (an attention backend that needs CPU seq lens).
  bool seq_lens_sync = false;
  // Bytes copied device-to-host per request per step (tokens, lengths, stop flags).
  int32_t output_copy_bytes_per_request = 64;
};

}  // namespace twinstep
