// RealBackend: executes the policies' plans on one CUDA GPU. The same Plan ops as the simulator
// (simulator/sim_backend.cc), with the same meaning and the same StepSample definitions:
//   kHostWork    the op's real host work (slot bookkeeping, prompt and batch-list building) plus
//                a busy-wait of HostCostModel::sample_ns(op, step) — the simulator's draw, so a
//                YAML's host costs mean the same on both backends;
//   kLaunch      prefill (eager) or decode (eager kernels, a CUDA graph per batch bucket, or the
//                graph with programmatic dependent launch) on the compute stream; tokens and
//                lengths are relayed on the GPU by slot (runtime/engine.h). Speculative steps:
//                draft / verify / extend graphs (Engine::enqueue_draft ...); the accepted counts
//                reach the host only through the outputs (RequestOutput tokens, draft_len,
//                conf_len), and the step's StepSample tokens / draft_len with them;
//   kRecordEvent / kStreamWait  cudaEventRecord / cudaStreamWaitEvent;
//   kCopyD2H     the step's output rows to pinned host memory on the op's stream;
//   kHostWait    cudaEventSynchronize; with a payload, the copied rows go to observe().
//
// Measurement (docs/runtime.md): every launch is bracketed by CUDA timing events. GPU times are
// placed on the host's steady clock through an anchor event (recorded on the idle stream and
// synchronised at the start: host time = midpoint of record/sync, error ~ a few µs), refreshed
// every 250 ms of GPU time by chaining elapsed times. Per step: busy = Σ launch spans (start to
// end event, node gaps inside a graph included); idle = gaps between the previous compute end and
// each launch's start, host-bound up to the moment the host began issuing that launch,
// launch-bound after it; idle_dep = 0 (the compute stream never waits on another stream here).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "policies/backend.h"
#include "policies/host_costs.h"
#include "policies/kv_capacity.h"  // spec_kv_margin, request_kv_tokens
#include "policies/model_spec.h"
#include "policies/policy_spec.h"
#include "policies/workload.h"

namespace twinstep {

namespace runtime {
class Engine;
}

// True when this process can run the real backend (a CUDA device is visible); otherwise *why
// says what is missing.
bool real_backend_available(std::string* why);

struct RealOptions {
  // Timeline for plan steps [trace_first_step, trace_first_step + trace_steps).
  int64_t trace_first_step = 0;
  int64_t trace_steps = 0;
  // The traced plain decode launches are profiled (Engine::enqueue_decode's `profiled`; needs an
  // engine with node_trace): their timelines get a span per kernel, less the per-node profiling
  // overhead (see trace_nodes in real_backend.cc). The launches themselves run longer by it.
  bool trace_nodes = false;
  GraphMode prepare_mode = GraphMode::kCudaGraph;  // graphs captured before the run starts
  int32_t prepare_max_batch = 1;
  float temperature = 0.0f;  // sampling of every request of the run (<= 0: greedy)
  uint64_t sampling_seed = 0;
  uint64_t prompt_seed = 0;  // prompt token t of request r: a hash of (seed, r, t) mod vocab
  // Untimed warm-up before the run's clock starts (Engine::warm_up: a 16-token prefill and this
  // many batch-1 decode launches on slot 0 in prepare_mode; the run's first prefill of slot 0
  // overwrites it). A fixed count, so that the ranks of a multi-GPU run issue the same
  // collectives (docs/calibration.md "Warm-up before timed decode").
  int32_t warmup_launches = 0;
  // The policy's speculation (must match the DecodeLoop's): which graphs to capture, the draft
  // control of each draft launch (runtime::draft_control). Needs an engine with the draft module.
  SpecSpec spec;
};

class RealBackend final : public Backend {
 public:
  // `engine`, `host_costs` and `requests` must outlive the backend; `model` gives the bytes each
  // decode step reads (policies/step_kernels.h, as the simulator counts them).
  RealBackend(runtime::Engine& engine, const ModelSpec& model, const HostCostModel& host_costs,
              const std::vector<RequestSpec>& requests, RealOptions options = {});
  ~RealBackend() override;
  void run(std::span<HostProgram* const> ranks, RunRecord& record) override;

  // Tokens delivered to the host for `request` (the prefill's first token, then one per decode
  // step), at most its output_len.
  std::vector<int32_t> output_tokens(int32_t request) const;
  static int32_t prompt_token(uint64_t seed, int32_t request, int32_t position, int64_t vocab);

 private:
  struct State;
  runtime::Engine& engine_;
  const ModelSpec& model_;
  const HostCostModel& host_costs_;
  const std::vector<RequestSpec>& requests_;
  RealOptions options_;
  std::vector<std::vector<int32_t>> tokens_;
};

}  // namespace twinstep
