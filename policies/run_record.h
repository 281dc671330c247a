// RunRecord: everything one run of one variant on one backend produces — per-request samples
// (written by the host program), per-step samples and an optional timeline (written by the
// backend). Raw samples, so any statistic can be recomputed from the database.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "policies/host_costs.h"
#include "policies/moe_routing.h"

namespace twinstep {

// Tokens reaching the client at host time t_ns (several at once under speculation).
struct ChunkSample {
  int32_t request;
  int32_t tokens;
  int64_t t_ns;
};

struct RequestSample {
  int32_t id = 0;
  int32_t input_len = 0;
  int32_t output_len = 0;  // tokens delivered (the requested count; extra steps discarded)
  int64_t arrival_ns = 0;  // when the workload says it arrives
  int64_t start_ns = 0;    // when the client issued it (closed loop: a client slot was free)
  int64_t first_token_ns = -1;
  int64_t end_ns = -1;      // last token delivered
  int32_t first_chunk = 0;  // index into RunRecord::chunks
  int32_t chunk_count = 0;
};

// One step of one rank. The GPU interval of step k runs from the end of step k-1's compute work
// to the end of step k's: busy + idle_host + idle_launch + idle_dep == dur. GPU busy is every
// launch's span on the compute stream, as the real backend measures it (one event pair per
// launch): a collective waiting inside a launch for its group's late rank is busy there (a
// spinning NCCL kernel) and that wait is in collective_wait_ns.
struct StepSample {
  int32_t rank = 0;
  int64_t step = 0;
  int64_t end_ns = 0;
  int64_t dur_ns = 0;
  int64_t gpu_busy_ns = 0;
  int64_t idle_host_ns = 0;        // compute stream empty: the host had not issued the work yet
  int64_t idle_launch_ns = 0;      // work issued, GPU waiting on launch latency / node gaps
  int64_t idle_dep_ns = 0;         // between launches, waiting on another stream's event
  int64_t collective_ns = 0;       // in collectives, waiting for the late rank included
  int64_t collective_wait_ns = 0;  // of collective_ns: waiting for the group's late rank (or a
                                   // pipeline receive's data); GPU busy (simulator only)
  int32_t batch = 0;               // requests decoded this step
  int32_t prefills = 0;            // requests prefilled this step
  int32_t tokens = 0;              // tokens committed by decode this step (all requests)
  int32_t draft_len = 0;           // most draft tokens of a request this step (0: no speculation)
  int64_t bytes_read = 0;          // decode, draft, verify and extend kernels' bytes read
  std::array<int64_t, kHostOpCount> host_ns{};  // per host op, this step's plan
  int64_t host_launch_ns = 0;                   // host time spent in launch calls
  int64_t host_wait_ns = 0;                     // host time blocked on events
};

// One verify round of one request under speculative decoding: the draft's proposal and what
// the target accepted of it. Rank 0's view (every rank of a sharded model agrees).
struct DraftRound {
  static constexpr int32_t kMaxPositions = 64;
  int32_t request = 0;
  int64_t step = 0;               // the step whose verify decided it
  int32_t draft_len = 0;          // draft tokens proposed (<= kMaxPositions)
  int32_t accepted = 0;           // leading draft tokens the target agreed with (<= draft_len)
  std::vector<float> confidence;  // draft token i's top-1 probability, draft_len values
};

enum class Lane : uint8_t { kHost = 0, kCompute = 1, kCopy = 2 };

// A span on a lane; `name` has static storage. flow > 0 links a host launch to the GPU work it
// issued (Chrome trace flow arrows).
struct TimelineSpan {
  int32_t rank;
  Lane lane;
  const char* name;
  int64_t step;
  int64_t start_ns;
  int64_t dur_ns;
  int64_t flow;
};

struct RunRecord {
  std::vector<RequestSample> requests;
  std::vector<ChunkSample> chunks;
  std::vector<StepSample> steps;
  std::vector<TimelineSpan> timeline;
  std::vector<DraftRound> rounds;  // speculative runs: every verify round, in commit order
  int64_t end_ns = 0;              // backend clock when the run ended
  // MoE routing of the traced decode launches (rank 0's view; every rank routes alike).
  MoeRoutingStats moe_routing;
};

// Room for `steps` step samples before a run (step_capacity_hint, workload.h, times the ranks).
// Where the kernel grants transparent huge pages on request (Linux, "madvise" mode) the buffer
// asks for them: a million samples (150 MB) then fault in 2 MB pages instead of 4 KB ones, which
// on this project's virtual machines was a third of bench-sim's wall time. Advice only.
void reserve_steps(RunRecord& record, int64_t steps);

}  // namespace twinstep
