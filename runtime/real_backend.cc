#include "runtime/real_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "policies/error.h"
#include "policies/moe_routing.h"
#include "policies/rng.h"
#include "policies/spec_rules.h"
#include "policies/step_kernels.h"
#include "runtime/engine.h"

namespace twinstep {

bool real_backend_available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    *why = std::string("no usable CUDA device (") + cudaGetErrorString(err) + ")";
    return false;
  }
  if (count == 0) {
    *why = "no CUDA device is visible";
    return false;
  }
  return true;
}

namespace {

constexpr int kPlanEvents = 256;     // plan events alive at once (policy depth ≪ this)
constexpr int kTimingEvents = 4096;  // measurement events in flight
constexpr int kStepRing = 64;        // steps whose launches may be awaiting their outputs
constexpr int64_t kReanchorNs = 250'000'000;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct LaunchRecord {
  const char* gpu_name;
  const char* host_name;
  int start_ev;
  int end_ev;
  int64_t host_begin_ns;
  int64_t host_end_ns;
  int64_t seq;
  int32_t batch;
  int64_t flow;
  bool decode;
  bool profiled;        // a timestamp per kernel (RealOptions::trace_nodes)
  int32_t routed_rows;  // rows whose MoE routing the launch recorded (record_routing), else 0
};

struct CopyRecord {
  int start_ev;
  int end_ev;
  int64_t flow;
};

// A decode-phase launch as a step's bytes_read counts it (launch_work, as the simulator prices
// it). A draft's and a verify's entry is completed by the host wait that reads its outputs: the
// requests' exact context (ctx_sum is the bound ctx + ctx_slack until then), the longest draft
// and the positions a verify routed through the experts; an extend's context by the wait that
// reads its step's verify.
struct CountedLaunch {
  Phase phase = Phase::kDecode;
  GraphMode mode = GraphMode::kEager;
  int32_t q_tokens = 1;
  int64_t seq = -1;  // output entry (-1: none)
  int64_t ctx_sum = 0;
  int32_t longest = 0;  // draft: its requests' longest draft
  int64_t routed = -1;  // verify: Σ (draft length + 1) over its requests
  std::vector<int32_t> ids;
};

struct PendingStep {
  StepSample sample;
  bool awaits_outputs = false;  // speculative: tokens and draft length come with the outputs
  std::vector<LaunchRecord> launches;
  std::vector<CopyRecord> copies;
  std::vector<CountedLaunch> counted;  // decode, draft, verify and extend launches
  bool trace = false;
};

// What each launch of a step will deliver: rows of output entry `seq` for requests
// [first, first + count) of `requests`, with the context length the device must report.
struct StepOutputsPlan {
  int64_t step = -1;
  struct Launch {
    int64_t seq = -1;
    int32_t count = 0;
    Phase phase = Phase::kDecode;
    int32_t width = 1;  // verify: positions per request (committed tokens <= width)
    std::vector<int32_t> requests;
    std::vector<int32_t> expect_ctx;  // prefill/decode: exact; verify: ctx before the launch
  };
  std::vector<Launch> launches;
};

}  // namespace

struct RealBackend::State {
  State(RealBackend& owner, HostProgram* program, RunRecord& record)
      : b(owner), engine(owner.engine_), program(program), record(record) {
    std::tie(shard_layout, shard_rank) = runtime::engine_shard(engine.options(), b.model_);
  }

  RealBackend& b;
  runtime::Engine& engine;
  HostProgram* program;
  RunRecord& record;
  LayoutSpec shard_layout;  // this engine's kernels (a step's bytes_read): engine_shard
  int32_t shard_rank = 0;
  const ModelSpec draft_model = nextn_draft(b.model_);  // the draft module's kernels
  int64_t t0 = 0;
  std::array<cudaEvent_t, kPlanEvents> plan_events{};
  std::array<EventId, kPlanEvents> plan_event_ids{};
  std::vector<cudaEvent_t> timing;
  int64_t timing_next = 0;
  cudaEvent_t anchor = nullptr, candidate = nullptr;
  int64_t anchor_ns = 0;
  bool candidate_pending = false;
  int64_t candidate_step = -1;  // the candidate anchor was recorded during this step
  std::deque<PendingStep> pending;
  std::optional<PendingStep> carry;
  std::array<StepOutputsPlan, kStepRing> step_outputs;
  int64_t prev_step_end_ns = 0;
  int64_t last_gpu_end_ns = 0;
  std::map<int32_t, int64_t> plain_decode_ns;  // batch -> GPU span of its last unprofiled decode
  int64_t flow = 0;
  // Slots and the host's mirror of the device's context lengths (the backend's own truth, as in
  // the simulator; the policy never sees it).
  std::vector<int32_t> slot_of;  // per request, -1 when none
  std::vector<int32_t> free_slots;
  // Per request: tokens cached on the device, exact for prefill/decode launches; with speculation
  // the value after the last observed verify, and ctx_slack the widths of verify launches not
  // yet observed (the device's ctx is at most ctx + ctx_slack).
  std::vector<int32_t> ctx;
  std::vector<int32_t> ctx_slack;
  // Per plan.
  bool slots_done = false;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> decode_slots;
  std::vector<RequestOutput> outputs;

  int64_t now() const { return steady_ns() - t0; }
  cudaStream_t stream(StreamId s) const {
    return s == StreamId::kCompute ? engine.compute_stream() : engine.copy_stream();
  }
  int take_timing_event() { return int(timing_next++ % kTimingEvents); }
  int64_t gpu_ns(int ev) {
    float ms = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&ms, anchor, timing[size_t(ev)]));
    return anchor_ns + int64_t(double(ms) * 1e6);
  }
  bool tracing(int64_t step) const {
    return step >= b.options_.trace_first_step &&
           step < b.options_.trace_first_step + b.options_.trace_steps;
  }
  void span(Lane lane, const char* name, int64_t step, int64_t start, int64_t dur, int64_t f = 0) {
    record.timeline.push_back({0, lane, name, step, start, dur, f});
  }

  void init() {
    engine.warm_up(b.options_.prepare_mode, b.options_.warmup_launches);
    for (int i = 0; i < kPlanEvents; ++i) {
      TS_CUDA_CHECK(cudaEventCreateWithFlags(&plan_events[size_t(i)], cudaEventDisableTiming));
      plan_event_ids[size_t(i)] = -1;
    }
    timing.resize(kTimingEvents);
    for (cudaEvent_t& e : timing) TS_CUDA_CHECK(cudaEventCreate(&e));
    TS_CUDA_CHECK(cudaEventCreate(&anchor));
    TS_CUDA_CHECK(cudaEventCreate(&candidate));
    const size_t n = b.requests_.size();
    slot_of.assign(n, -1);
    ctx.assign(n, 0);
    ctx_slack.assign(n, 0);
    b.tokens_.assign(n, {});
    free_slots.clear();
    for (int s = engine.options().max_slots - 1; s >= 0; --s) free_slots.push_back(s);
    TS_CUDA_CHECK(cudaStreamSynchronize(engine.compute_stream()));
    TS_CUDA_CHECK(cudaStreamSynchronize(engine.copy_stream()));
    t0 = steady_ns();
    // Anchor: the event completes as soon as it is recorded on the idle stream; the host time
    // is taken as the midpoint of record and synchronise.
    for (int i = 0; i < 3; ++i) {  // the last of three tries (warm driver paths)
      const int64_t h0 = now();
      TS_CUDA_CHECK(cudaEventRecord(anchor, engine.compute_stream()));
      TS_CUDA_CHECK(cudaEventSynchronize(anchor));
      const int64_t h1 = now();
      anchor_ns = h0 + (h1 - h0) / 2;
    }
    prev_step_end_ns = anchor_ns;
    last_gpu_end_ns = anchor_ns;
  }

  void destroy() {
    for (cudaEvent_t e : plan_events) cudaEventDestroy(e);
    for (cudaEvent_t e : timing) cudaEventDestroy(e);
    cudaEventDestroy(anchor);
    cudaEventDestroy(candidate);
  }

  cudaEvent_t plan_event(EventId id, bool recording) {
    const size_t i = size_t(id % kPlanEvents);
    if (recording) {
      plan_event_ids[i] = id;
    } else if (plan_event_ids[i] != id) {
      throw Error("real backend: plan waits on event " + std::to_string(id) +
                  " that was never recorded (or is too old)");
    }
    return plan_events[i];
  }

  // Slot bookkeeping for a plan with launches: requests absent from it are finished (a policy
  // never launches a request again once it stops), their slots are reused; admitted requests
  // get one. Stream order on the compute stream makes reuse safe.
  void assign_slots(const Plan& plan) {
    if (slots_done || plan.launches.empty()) return;
    slots_done = true;
    std::vector<char> present(b.requests_.size(), 0);
    for (const int32_t r : plan.requests) present[size_t(r)] = 1;
    for (size_t r = 0; r < slot_of.size(); ++r) {
      if (slot_of[r] >= 0 && !present[r]) {
        free_slots.push_back(slot_of[r]);
        slot_of[r] = -1;
      }
    }
    for (const GraphLaunch& g : plan.launches) {
      if (g.phase != Phase::kPrefill) continue;
      for (int32_t i = 0; i < g.request_count; ++i) {
        const int32_t r = plan.requests[size_t(g.first_request + i)];
        if (slot_of[size_t(r)] < 0) {
          if (free_slots.empty())
            throw Error("real backend: more running requests than the engine's " +
                        std::to_string(engine.options().max_slots) + " slots");
          slot_of[size_t(r)] = free_slots.back();
          free_slots.pop_back();
        }
      }
    }
  }

  void build_prompts(const Plan& plan, const GraphLaunch& g) {
    prompts.clear();
    for (int32_t i = 0; i < g.request_count; ++i) {
      const int32_t r = plan.requests[size_t(g.first_request + i)];
      const RequestSpec& spec = b.requests_[size_t(r)];
      std::vector<int32_t> p(size_t(spec.input_len));
      for (int32_t t = 0; t < spec.input_len; ++t)
        p[size_t(t)] = prompt_token(b.options_.prompt_seed, r, t, engine.config().vocab);
      prompts.push_back(std::move(p));
    }
  }

  void build_decode_slots(const Plan& plan, const GraphLaunch& g) {
    decode_slots.clear();
    for (int32_t i = 0; i < g.request_count; ++i)
      decode_slots.push_back(slot_of[size_t(plan.requests[size_t(g.first_request + i)])]);
  }

  void host_work(const Plan& plan, const Op& op, StepSample& sample, bool trace) {
    const int64_t begin = now();
    switch (op.host_op) {
      case HostOp::kSchedule:
        assign_slots(plan);
        break;
      case HostOp::kPreparePrefill:
        assign_slots(plan);
        for (const GraphLaunch& g : plan.launches)
          if (g.phase == Phase::kPrefill) build_prompts(plan, g);
        break;
      case HostOp::kPrepareDecode:
        assign_slots(plan);
        for (const GraphLaunch& g : plan.launches)
          if (g.phase != Phase::kPrefill) build_decode_slots(plan, g);
        break;
      default:
        break;
    }
    const int64_t until = begin + b.host_costs_.sample_ns(op.host_op, plan.step);
    while (now() < until) {
    }
    const int64_t end = now();
    sample.host_ns[size_t(op.host_op)] += end - begin;
    if (trace) span(Lane::kHost, host_op_name(op.host_op), plan.step, begin, end - begin);
    program->host_work_done(op.host_op, plan.step, end);
  }

  void launch(const Plan& plan, const Op& op, PendingStep& p) {
    const GraphLaunch& g = plan.launches[size_t(op.graph)];
    assign_slots(plan);
    StepOutputsPlan& so = step_outputs[size_t(plan.step % kStepRing)];
    if (so.step != plan.step) {
      so.step = plan.step;
      so.launches.clear();
    }
    StepOutputsPlan::Launch out;
    out.count = g.request_count;
    const int32_t* ids = plan.requests.data() + g.first_request;
    const int capacity = engine.options().capacity_tokens;
    LaunchRecord rec{};
    rec.batch = g.request_count;
    rec.decode = g.phase != Phase::kPrefill;
    rec.flow = p.trace ? ++flow : 0;
    rec.host_begin_ns = now();
    rec.start_ev = take_timing_event();
    rec.end_ev = take_timing_event();
    TS_CUDA_CHECK(cudaEventRecord(timing[size_t(rec.start_ev)], engine.compute_stream()));
    if (g.phase == Phase::kPrefill) {
      if (prompts.size() != size_t(g.request_count)) build_prompts(plan, g);
      std::vector<int32_t> slots;
      for (int32_t i = 0; i < g.request_count; ++i) slots.push_back(slot_of[size_t(ids[i])]);
      out.seq = engine.enqueue_prefill(slots, prompts);
      for (int32_t i = 0; i < g.request_count; ++i) {
        ctx[size_t(ids[i])] = int32_t(prompts[size_t(i)].size());
        out.requests.push_back(ids[i]);
        out.expect_ctx.push_back(ctx[size_t(ids[i])]);
      }
      prompts.clear();
      p.sample.prefills += g.request_count;
      rec.gpu_name = "prefill";
      rec.host_name = "launch_prefill";
    } else if (g.phase == Phase::kDecode) {
      if (g.q_tokens != 1)
        throw Error("real backend: decode launches of " + std::to_string(g.q_tokens) +
                    " tokens per request are not supported (speculation uses draft/verify/extend)");
      if (decode_slots.size() != size_t(g.request_count)) build_decode_slots(plan, g);
      int64_t ctx_sum = 0;
      for (int32_t i = 0; i < g.request_count; ++i) {
        int32_t& c = ctx[size_t(ids[i])];
        if (c + 1 > capacity)
          throw Error("real backend: request " + std::to_string(ids[i]) +
                      " outgrew the KV capacity of " + std::to_string(capacity) + " tokens");
        ctx_sum += c;
        c += 1;
        out.requests.push_back(ids[i]);
        out.expect_ctx.push_back(c);
      }
      // An engine made with profile_nodes profiles every launch (the spans are then uncorrected).
      rec.profiled = engine.options().profile_nodes || (p.trace && b.options_.trace_nodes);
      out.seq = engine.enqueue_decode(decode_slots, g.mode, rec.profiled);
      decode_slots.clear();
      p.sample.batch += g.request_count;
      p.sample.tokens += g.request_count;
      p.counted.push_back({Phase::kDecode, g.mode, 1, out.seq, ctx_sum, 0, -1, out.requests});
      rec.routed_rows = g.request_count;
      rec.gpu_name = g.mode == GraphMode::kEager ? "decode_eager" : "decode_graph";
      rec.host_name = g.mode == GraphMode::kEager ? "launch_eager" : "launch_graph";
    } else {
      launch_speculative(plan, g, out, p, rec);
    }
    TS_CUDA_CHECK(cudaEventRecord(timing[size_t(rec.end_ev)], engine.compute_stream()));
    rec.host_end_ns = now();
    rec.seq = out.seq;
    p.sample.host_launch_ns += rec.host_end_ns - rec.host_begin_ns;
    if (p.trace)
      span(Lane::kHost, rec.host_name, plan.step, rec.host_begin_ns,
           rec.host_end_ns - rec.host_begin_ns, rec.flow);
    p.launches.push_back(rec);
    if (out.seq >= 0) so.launches.push_back(std::move(out));
    // Refresh the anchor: a fresh event, converted once complete (finalize()).
    if (!candidate_pending && rec.host_begin_ns - anchor_ns > kReanchorNs) {
      TS_CUDA_CHECK(cudaEventRecord(candidate, engine.compute_stream()));
      candidate_pending = true;
      candidate_step = plan.step;
    }
  }

  // Draft / verify / extend of a speculative step (runtime/engine.h). Verify's committed count
  // is a device value: the host bounds the context by the launch width until the outputs come.
  void launch_speculative(const Plan& plan, const GraphLaunch& g, StepOutputsPlan::Launch& out,
                          PendingStep& p, LaunchRecord& rec) {
    const int32_t* ids = plan.requests.data() + g.first_request;
    const int capacity = engine.options().capacity_tokens;
    if (decode_slots.size() != size_t(g.request_count)) build_decode_slots(plan, g);
    out.phase = g.phase;
    out.width = g.q_tokens;
    for (int32_t i = 0; i < g.request_count; ++i) {
      out.requests.push_back(ids[i]);
      out.expect_ctx.push_back(ctx[size_t(ids[i])]);
    }
    const bool graph = g.mode != GraphMode::kEager;
    const SpecSpec& spec = b.options_.spec;
    p.awaits_outputs = true;
    CountedLaunch counted{g.phase, g.mode, g.q_tokens, -1, 0, 0, -1, out.requests};
    for (const int32_t r : out.requests) counted.ctx_sum += ctx[size_t(r)] + ctx_slack[size_t(r)];
    switch (g.phase) {
      case Phase::kDraft:
        out.seq =
            engine.enqueue_draft(decode_slots, runtime::draft_control(spec, g.q_tokens), g.mode);
        rec.gpu_name = graph ? "draft_graph" : "draft_eager";
        break;
      case Phase::kVerify: {
        for (int32_t i = 0; i < g.request_count; ++i) {
          const size_t r = size_t(ids[i]);
          if (ctx[r] + ctx_slack[r] + g.q_tokens > capacity)
            throw Error("real backend: request " + std::to_string(ids[i]) +
                        " may outgrow the KV capacity of " + std::to_string(capacity) +
                        " tokens (verify of " + std::to_string(g.q_tokens) + " positions)");
          ctx_slack[r] += g.q_tokens;
        }
        out.seq = engine.enqueue_verify(decode_slots, g.q_tokens, float(spec.threshold), g.mode);
        p.sample.batch += g.request_count;
        rec.routed_rows = g.request_count * g.q_tokens;  // request r's position j: r * W + j
        rec.gpu_name = graph ? "verify_graph" : "verify_eager";
        break;
      }
      case Phase::kExtend:
        engine.enqueue_extend(decode_slots, g.q_tokens, g.mode);
        out.seq = -1;  // no output entry
        rec.gpu_name = graph ? "extend_graph" : "extend_eager";
        break;
      default:
        assert(false);
    }
    counted.seq = out.seq;
    p.counted.push_back(std::move(counted));
    if (g.phase == Phase::kExtend) decode_slots.clear();
    rec.decode = false;  // node timestamps are taken for plain decode graphs only
    rec.host_name = graph ? "launch_graph" : "launch_eager";
  }

  void copy(const Plan& plan, const Op& op, PendingStep& p) {
    const StepOutputsPlan& so = step_outputs[size_t(op.payload_step % kStepRing)];
    if (so.step != op.payload_step)
      throw Error("real backend: copy of step " + std::to_string(op.payload_step) +
                  " whose launches are unknown");
    const int64_t begin = now();
    cudaStream_t s = stream(op.stream);
    CopyRecord c{-1, -1, 0};
    if (p.trace) {
      c.start_ev = take_timing_event();
      c.end_ev = take_timing_event();
      c.flow = ++flow;
      TS_CUDA_CHECK(cudaEventRecord(timing[size_t(c.start_ev)], s));
    }
    for (const StepOutputsPlan::Launch& l : so.launches)
      engine.enqueue_output_copy(l.seq, l.count, s);
    if (p.trace) {
      TS_CUDA_CHECK(cudaEventRecord(timing[size_t(c.end_ev)], s));
      p.copies.push_back(c);
      span(Lane::kHost, "copy_issue", plan.step, begin, now() - begin, c.flow);
    }
    p.sample.host_launch_ns += now() - begin;
  }

  // The counted entry of launch `l` of `owner`, from its output rows, read before they update
  // the host's contexts: the exact context before the launch, a draft's longest draft, a
  // verify's routed positions (each request's drafts, at most width - 1, and its committed token).
  void complete_counted(PendingStep& owner, const StepOutputsPlan::Launch& l,
                        const runtime::OutputRow* rows) {
    for (CountedLaunch& c : owner.counted) {
      if (c.seq != l.seq || (c.phase != Phase::kDraft && c.phase != Phase::kVerify)) continue;
      c.ctx_sum = 0;
      c.longest = 0;
      c.routed = 0;
      for (int32_t i = 0; i < l.count; ++i) {
        c.ctx_sum += ctx[size_t(l.requests[size_t(i)])];
        c.longest = std::max(c.longest, rows[i].draft_len);
        c.routed += std::clamp(rows[i].draft_len, 0, l.width - 1) + 1;
      }
    }
  }

  void host_wait(const Plan& plan, const Op& op, PendingStep& p) {
    cudaEvent_t ev = plan_event(op.event, false);
    const int64_t begin = now();
    TS_CUDA_CHECK(cudaEventSynchronize(ev));
    const int64_t end = now();
    p.sample.host_wait_ns += end - begin;
    if (p.trace && end > begin) span(Lane::kHost, "wait", plan.step, begin, end - begin);
    if (op.payload_step < 0) return;
    const StepOutputsPlan& so = step_outputs[size_t(op.payload_step % kStepRing)];
    if (so.step != op.payload_step)
      throw Error("real backend: outputs of step " + std::to_string(op.payload_step) +
                  " are no longer held (run-ahead deeper than the step ring)");
    outputs.clear();
    PendingStep* owner = op.payload_step == plan.step ? &p : nullptr;
    for (PendingStep& q : pending)
      if (q.sample.step == op.payload_step) owner = &q;
    bool draft_only = true;
    int32_t committed = 0, longest = 0;
    for (const StepOutputsPlan::Launch& l : so.launches) {
      const runtime::OutputRow* rows = engine.host_outputs(l.seq);
      draft_only = draft_only && l.phase == Phase::kDraft;
      if (owner != nullptr) complete_counted(*owner, l, rows);
      for (int32_t i = 0; i < l.count; ++i) {
        const int32_t r = l.requests[size_t(i)];
        const runtime::OutputRow& row = rows[i];
        std::vector<int32_t>& toks = b.tokens_[size_t(r)];
        const int32_t out_len = b.requests_[size_t(r)].output_len;
        if (l.phase == Phase::kDraft) {
          outputs.push_back({r, 0, row.draft_len, row.conf_len});
          longest = std::max(longest, row.draft_len);
          continue;
        }
        if (l.phase == Phase::kVerify) {
          const int32_t before = ctx[size_t(r)];
          if (row.accepted < 0 || row.accepted >= l.width || row.ctx != before + row.accepted + 1)
            throw Error("real backend: verify output of request " + std::to_string(r) +
                        " inconsistent: accepted " + std::to_string(row.accepted) + ", ctx " +
                        std::to_string(row.ctx) + " after " + std::to_string(before) + " (width " +
                        std::to_string(l.width) + ")");
          ctx[size_t(r)] = row.ctx;
          ctx_slack[size_t(r)] -= l.width;
          for (int32_t j = 0; j <= row.accepted; ++j)
            if (int32_t(toks.size()) < out_len)
              toks.push_back(j < row.accepted ? row.draft[j] : row.token);
          outputs.push_back({r, row.accepted + 1, row.draft_len, row.conf_len});
          if (row.draft_len > 0) {
            const int32_t d = std::min(row.draft_len, runtime::kMaxDraftTokens);
            record.rounds.push_back({r, op.payload_step, d, std::min(row.accepted, d),
                                     std::vector<float>(row.confidence, row.confidence + d)});
          }
          committed += row.accepted + 1;
          longest = std::max(longest, row.draft_len);
          continue;
        }
        if (row.ctx != l.expect_ctx[size_t(i)])
          throw Error("real backend: relay mismatch for request " + std::to_string(r) +
                      ": device reports " + std::to_string(row.ctx) +
                      " cached tokens, host expects " + std::to_string(l.expect_ctx[size_t(i)]));
        if (int32_t(toks.size()) < out_len) toks.push_back(row.token);
        outputs.push_back({r, 1, 0});
      }
    }
    draft_only = draft_only && !so.launches.empty();
    // The extend runs after its step's verify: its context is the one the verify left.
    if (owner != nullptr && !draft_only)
      for (CountedLaunch& c : owner->counted)
        if (c.phase == Phase::kExtend) {
          c.ctx_sum = 0;
          for (const int32_t r : c.ids) c.ctx_sum += ctx[size_t(r)];
        }
    // The step's committed tokens and draft length (StepSample), known only now.
    if (owner != nullptr && owner->awaits_outputs) {
      owner->sample.tokens += committed;
      owner->sample.draft_len = std::max(owner->sample.draft_len, longest);
      if (!draft_only) owner->awaits_outputs = false;
    }
    program->observe({op.payload_step, outputs, draft_only}, now());
  }

  void execute(const Plan& plan) {
    PendingStep p;
    if (carry) {  // host_blocking: the draft half of this step ran in the previous plan
      p = std::move(*carry);
      carry.reset();
    }
    p.trace = tracing(plan.step);
    p.sample.rank = 0;
    p.sample.step = plan.step;
    slots_done = false;
    bool active = false;
    for (const Op& op : plan.ops) {
      switch (op.kind) {
        case OpKind::kHostWork:
          active = true;
          host_work(plan, op, p.sample, p.trace);
          break;
        case OpKind::kHostSleep: {
          while (now() < op.until_ns) {
            const int64_t left = op.until_ns - now();
            if (left > 2'000'000) std::this_thread::sleep_for(std::chrono::nanoseconds(left / 2));
          }
          break;
        }
        case OpKind::kLaunch:
          active = true;
          launch(plan, op, p);
          break;
        case OpKind::kRecordEvent:
          TS_CUDA_CHECK(cudaEventRecord(plan_event(op.event, true), stream(op.stream)));
          break;
        case OpKind::kStreamWait:
          TS_CUDA_CHECK(cudaStreamWaitEvent(stream(op.stream), plan_event(op.event, false), 0));
          break;
        case OpKind::kCopyD2H:
          copy(plan, op, p);
          break;
        case OpKind::kHostWait:
          active = true;
          host_wait(plan, op, p);
          break;
      }
    }
    const bool draft_half =
        !plan.launches.empty() &&
        std::all_of(plan.launches.begin(), plan.launches.end(),
                    [](const GraphLaunch& g) { return g.phase == Phase::kDraft; });
    if (draft_half) {  // counted with the step it belongs to, as the simulator does
      carry = std::move(p);
      return;
    }
    if (active) pending.push_back(std::move(p));
    finalize(false);
  }

  // Turns pending steps whose GPU work completed into StepSamples, in step order.
  void finalize(bool all) {
    while (!pending.empty()) {
      PendingStep& p = pending.front();
      if (p.awaits_outputs && !all) break;  // completed by the host wait that reads its outputs
      if (!p.launches.empty()) {
        cudaEvent_t last = timing[size_t(p.launches.back().end_ev)];
        if (all) {
          TS_CUDA_CHECK(cudaEventSynchronize(last));
        } else if (cudaEventQuery(last) != cudaSuccess) {
          (void)cudaGetLastError();
          break;
        }
      }
      StepSample& s = p.sample;
      int64_t prev = prev_step_end_ns;
      for (const LaunchRecord& l : p.launches) {
        const int64_t start = gpu_ns(l.start_ev);
        const int64_t end = gpu_ns(l.end_ev);
        if (start > prev) {
          const int64_t gap = start - prev;
          const int64_t host = std::clamp<int64_t>(std::min(start, l.host_begin_ns) - prev, 0, gap);
          s.idle_host_ns += host;
          s.idle_launch_ns += gap - host;
        }
        s.gpu_busy_ns += end - std::max(start, prev);
        if (l.decode && !l.profiled) plain_decode_ns[l.batch] = end - start;
        if (p.trace) {
          span(Lane::kCompute, l.gpu_name, s.step, start, end - start, l.flow);
          if (l.decode && l.profiled) trace_nodes(l, s.step, start, end - start);
          if (l.routed_rows > 0 && engine.options().record_routing) add_routing(l);
        }
        prev = std::max(prev, end);
      }
      for (const CopyRecord& c : p.copies) {
        if (cudaEventQuery(timing[size_t(c.end_ev)]) != cudaSuccess) {
          (void)cudaGetLastError();
          TS_CUDA_CHECK(cudaEventSynchronize(timing[size_t(c.end_ev)]));
        }
        const int64_t start = gpu_ns(c.start_ev);
        span(Lane::kCopy, "d2h_outputs", s.step, start, gpu_ns(c.end_ev) - start, c.flow);
      }
      // The kernels of this rank's shard, launch by launch as the simulator counts a rank's
      // bytes (launch_work): drafts by their forwards, verify and extend by their rows.
      for (const CountedLaunch& c : p.counted) {
        const int32_t passes = c.phase == Phase::kDraft
                                   ? draft_passes(b.options_.spec, c.mode, c.longest, c.q_tokens)
                                   : 1;
        const LaunchWork w = launch_work(c.phase, int32_t(c.ids.size()), c.q_tokens, c.ctx_sum,
                                         passes, b.model_.has_moe() ? c.routed : -1);
        StepKernels k;
        step_kernels(w.draft_module ? draft_model : b.model_, w.shape, shard_layout, shard_rank, k);
        s.bytes_read += int64_t{w.passes} * k.bytes_read();
      }
      s.end_ns = prev;
      s.dur_ns = prev - prev_step_end_ns;
      prev_step_end_ns = prev;
      last_gpu_end_ns = std::max(last_gpu_end_ns, prev);
      record.steps.push_back(s);
      const int64_t done_step = s.step;
      pending.pop_front();
      // Every event of later steps was recorded after the candidate: move the anchor forward
      // (elapsed times stay short, so float milliseconds keep sub-microsecond resolution).
      if (candidate_pending && done_step >= candidate_step) {
        TS_CUDA_CHECK(cudaEventSynchronize(candidate));
        float ms = 0;
        TS_CUDA_CHECK(cudaEventElapsedTime(&ms, anchor, candidate));
        anchor_ns += int64_t(double(ms) * 1e6);
        std::swap(anchor, candidate);
        candidate_pending = false;
      }
    }
  }

  // The routing of completed decode or verify launch `l` (its requests' rows, not the bucket's
  // padding; a verify's padded positions, routed nowhere, left out) into record.moe_routing, each
  // MoE layer a pass; EP ranks: the engine's equal expert blocks.
  void add_routing(const LaunchRecord& l) {
    const LlamaConfig& c = engine.config();
    if (!c.moe()) return;
    const std::vector<int32_t> ids = engine.decode_routing(l.seq, l.routed_rows);
    const size_t k = size_t(c.top_k), per_layer = size_t(l.routed_rows) * k;
    std::vector<int32_t> routed;
    for (int32_t layer = 0; layer < c.layers; ++layer) {
      routed.clear();
      for (size_t row = 0; row < size_t(l.routed_rows); ++row) {
        const int32_t* r = ids.data() + size_t(layer) * per_layer + row * k;
        if (r[0] >= 0) routed.insert(routed.end(), r, r + k);
      }
      if (!routed.empty())
        add_moe_routing(record.moe_routing, layer, routed, c.top_k, c.num_experts,
                        c.num_experts / c.local_experts());
    }
  }

  // The kernels of profiled launch `l` (GPU span start, dur_ns) as spans. Each timestamp
  // node adds a delay; spread evenly, it is δ = (dur − the last unprofiled decode launch of the
  // same batch) / nodes, taken off every interval (clamped at 0) so the spans add up to an
  // unprofiled launch, as calibrate's kernel samples do (docs/calibration.md).
  void trace_nodes(const LaunchRecord& l, int64_t step, int64_t start, int64_t dur_ns) {
    const std::vector<const char*>& names = engine.decode_node_names(l.batch);
    const auto ts = engine.node_timestamps(l.seq, l.seq);
    auto it = ts.find(l.seq);
    if (it == ts.end() || names.empty()) return;
    const std::vector<uint64_t>& t = it->second;
    const auto plain = plain_decode_ns.find(l.batch);
    const int64_t delta =
        plain == plain_decode_ns.end()
            ? 0
            : std::max<int64_t>(0, (dur_ns - plain->second) / int64_t(names.size()));
    int64_t at = start;
    for (size_t j = 0; j + 1 < names.size() && j + 1 < t.size(); ++j) {
      if (t[j + 1] < t[j]) break;
      const int64_t d = std::max<int64_t>(0, int64_t(t[j + 1] - t[j]) - delta);
      span(Lane::kCompute, names[j], step, at, d);
      at += d;
    }
  }
};

RealBackend::RealBackend(runtime::Engine& engine, const ModelSpec& model,
                         const HostCostModel& host_costs, const std::vector<RequestSpec>& requests,
                         RealOptions options)
    : engine_(engine),
      model_(model),
      host_costs_(host_costs),
      requests_(requests),
      options_(options) {
  engine_.set_sampling({options_.temperature, options_.sampling_seed});
  if (options_.spec.method == SpecMethod::kNone) {
    engine_.prepare(options_.prepare_mode, options_.prepare_max_batch);
  } else {
    if (!engine_.options().draft)
      throw Error("real backend: speculative decoding needs an engine with the draft module");
    if (options_.temperature > 0)
      throw Error("real backend: speculative decoding is greedy only (temperature " +
                  std::to_string(options_.temperature) + ")");
    engine_.prepare_spec(options_.prepare_mode, options_.prepare_max_batch, options_.spec);
  }
}

RealBackend::~RealBackend() = default;

int32_t RealBackend::prompt_token(uint64_t seed, int32_t request, int32_t position, int64_t vocab) {
  return int32_t(rng_key(seed, uint64_t(request), uint64_t(position)) % uint64_t(vocab));
}

std::vector<int32_t> RealBackend::output_tokens(int32_t request) const {
  return tokens_.at(size_t(request));
}

void RealBackend::run(std::span<HostProgram* const> ranks, RunRecord& record) {
  if (ranks.size() != 1)
    throw Error("real backend: one rank per process (multi-GPU runs are one process per GPU)");
  for (const RequestSpec& r : requests_) {
    const int64_t need = request_kv_tokens(r, options_.spec);
    if (need > engine_.options().capacity_tokens)
      throw Error("real backend: request " + std::to_string(r.id) + " needs " +
                  std::to_string(need) + " KV positions, the engine holds " +
                  std::to_string(engine_.options().capacity_tokens) + " per slot");
  }
  engine_.set_sampling({options_.temperature, options_.sampling_seed});
  State st(*this, ranks[0], record);
  st.init();
  try {
    Plan plan;
    for (;;) {
      plan.clear();
      if (!st.program->next_plan(st.now(), plan)) break;
      st.execute(plan);
    }
    TS_CUDA_CHECK(cudaStreamSynchronize(engine_.compute_stream()));
    TS_CUDA_CHECK(cudaStreamSynchronize(engine_.copy_stream()));
    st.finalize(true);
    record.end_ns = std::max(st.now(), st.last_gpu_end_ns);
  } catch (...) {
    cudaStreamSynchronize(engine_.compute_stream());
    cudaStreamSynchronize(engine_.copy_stream());
    st.destroy();
    throw;
  }
  st.destroy();
}

}  // namespace twinstep
