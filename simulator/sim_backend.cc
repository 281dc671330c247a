#include "simulator/sim_backend.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <queue>

#include "policies/error.h"
#include "policies/step_kernels.h"

namespace twinstep {
namespace {

constexpr size_t kEventRing = 1024;  // events alive at once per rank (policy depth ≪ this)
constexpr size_t kOutputRing = 64;   // steps whose outputs may be in flight per rank

struct EventSlot {
  EventId id = -1;
  int64_t t_ns = 0;
};

struct StreamState {
  int64_t free_ns = 0;  // when the last enqueued op completes
  int64_t dep_ns = 0;   // a pending stream wait, applied to the next op
};

struct OutputSlot {
  int64_t step = -1;
  std::vector<RequestOutput> outputs;
};

// Idle time before an op that starts at start_ns on a stream free since free_ns, split by
// cause: the host had not begun issuing it (host-bound), it was being issued or in flight
// (launch-bound), or it waited on another stream (dependency).
struct IdleSplit {
  int64_t host = 0;
  int64_t launch = 0;
  int64_t dep = 0;
};

IdleSplit split_idle(int64_t free_ns, int64_t start_ns, int64_t host_begin_ns, int64_t arrival_ns) {
  IdleSplit s;
  if (start_ns <= free_ns) return s;
  s.host = std::max<int64_t>(0, std::min(start_ns, host_begin_ns) - free_ns);
  s.launch =
      std::max<int64_t>(0, std::min(start_ns, arrival_ns) - std::max(free_ns, host_begin_ns));
  s.dep = (start_ns - free_ns) - s.host - s.launch;
  return s;
}

struct Resume {
  int64_t t_ns;
  uint64_t seq;
  int32_t rank;
  bool operator>(const Resume& o) const { return t_ns != o.t_ns ? t_ns > o.t_ns : seq > o.seq; }
};

class Engine {
 public:
  Engine(const ModelSpec& model, const HardwareSpec& hw, const HostCostModel& host_costs,
         const std::vector<RequestSpec>& requests, const SimOptions& options, const CostModel& cost,
         RunRecord& record)
      : model_(model),
        hw_(hw),
        host_costs_(host_costs),
        requests_(requests),
        options_(options),
        cost_(cost),
        record_(record) {}

  void run(std::span<HostProgram* const> programs) {
    ranks_.resize(programs.size());
    for (size_t r = 0; r < programs.size(); ++r) {
      ranks_[r].program = programs[r];
      ranks_[r].device_ctx.assign(requests_.size(), 0);
      queue_.push({0, seq_++, static_cast<int32_t>(r)});
    }
    while (!queue_.empty()) {
      const Resume next = queue_.top();
      queue_.pop();
      Rank& rank = ranks_[static_cast<size_t>(next.rank)];
      assert(rank.host_ns == next.t_ns);
      rank.plan.clear();
      if (!rank.program->next_plan(rank.host_ns, rank.plan)) continue;
      execute_plan(next.rank, rank);
      queue_.push({rank.host_ns, seq_++, next.rank});
    }
    for (const Rank& r : ranks_) {
      record_.end_ns =
          std::max({record_.end_ns, r.host_ns, r.streams[0].free_ns, r.streams[1].free_ns});
    }
  }

 private:
  struct Rank {
    HostProgram* program = nullptr;
    Plan plan;
    int64_t host_ns = 0;
    std::array<StreamState, kStreamCount> streams{};
    std::array<EventSlot, kEventRing> events{};
    std::array<OutputSlot, kOutputRing> outputs{};
    std::vector<int64_t> device_ctx;  // per request: tokens in its KV cache on the device
    int64_t prev_step_end_ns = 0;
  };

  bool tracing(int64_t step) const {
    return step >= options_.trace_first_step &&
           step < options_.trace_first_step + options_.trace_steps;
  }

  void span(int32_t rank, Lane lane, const char* name, int64_t step, int64_t start, int64_t dur,
            int64_t flow = 0) {
    record_.timeline.push_back({rank, lane, name, step, start, dur, flow});
  }

  int64_t event_time(Rank& r, EventId id) const {
    const EventSlot& e = r.events[static_cast<size_t>(id) % kEventRing];
    if (e.id != id)
      throw Error("simulator: plan waits on event " + std::to_string(id) +
                  " that was never recorded (or is too old)");
    return e.t_ns;
  }

  // Sets up the device-side effects of a launch (contexts, outputs) and returns its shape.
  StepShape device_execute(Rank& r, const Plan& plan, const GraphLaunch& g, OutputSlot& out,
                           StepSample& sample) {
    const int32_t* ids = plan.requests.data() + g.first_request;
    if (g.phase == Phase::kPrefill) {
      int64_t tokens = 0;
      int64_t sq = 0;
      for (int32_t i = 0; i < g.request_count; ++i) {
        const int64_t len = requests_[static_cast<size_t>(ids[i])].input_len;
        tokens += len;
        sq += len * len;
        r.device_ctx[static_cast<size_t>(ids[i])] = len + 1;  // the prompt plus the first token
        out.outputs.push_back({ids[i], 1, 0});
      }
      sample.prefills += g.request_count;
      return prefill_shape(g.request_count, tokens, sq);
    }
    int64_t ctx = 0;
    for (int32_t i = 0; i < g.request_count; ++i) {
      int64_t& c = r.device_ctx[static_cast<size_t>(ids[i])];
      ctx += c - 1;  // the newest token is this step's input, not yet in the cache
      c += g.q_tokens;
      out.outputs.push_back({ids[i], g.q_tokens, 0});
    }
    sample.batch += g.request_count;
    sample.tokens += g.request_count * g.q_tokens;
    return decode_shape(g.request_count, g.q_tokens, ctx);
  }

  void launch(int32_t rank_id, Rank& r, const Plan& plan, const Op& op, OutputSlot& out,
              StepSample& sample, bool trace) {
    const GraphLaunch& g = plan.launches[static_cast<size_t>(op.graph)];
    const StepShape shape = device_execute(r, plan, g, out, sample);
    step_kernels(model_, shape, kernels_);
    const GraphCost cost = cost_.graph_cost(kernels_);
    if (g.phase != Phase::kPrefill) sample.bytes_read += cost.bytes_read;

    StreamState& s = r.streams[static_cast<size_t>(op.stream)];
    const int64_t host_begin = r.host_ns;
    const int64_t flow = trace ? ++flow_ : 0;
    const int64_t gap_ns =
        g.mode == GraphMode::kCudaGraphPdl ? hw_.pdl_node_gap_ns : hw_.graph_node_gap_ns;

    if (g.mode != GraphMode::kEager) {
      r.host_ns += hw_.graph_launch_ns;
      sample.host_launch_ns += hw_.graph_launch_ns;
      const int64_t start = std::max({s.free_ns, r.host_ns, s.dep_ns});
      const IdleSplit idle = split_idle(s.free_ns, start, host_begin, r.host_ns);
      sample.idle_host_ns += idle.host;
      sample.idle_launch_ns += idle.launch + cost.nodes * gap_ns;
      sample.idle_dep_ns += idle.dep;
      sample.gpu_busy_ns += cost.busy_ns;
      const int64_t end = start + cost.busy_ns + cost.nodes * gap_ns;
      if (trace) {
        span(rank_id, Lane::kHost, "launch_graph", plan.step, host_begin, r.host_ns - host_begin,
             flow);
        trace_nodes(rank_id, plan.step, start, gap_ns, flow);
      }
      s.free_ns = end;
      s.dep_ns = 0;
      return;
    }

    // Eager: every kernel is a host launch call; the GPU cannot start a kernel before its
    // launch reaches it.
    int64_t first_flow = flow;
    for (const LayerRun& run : kernels_.runs) {
      for (int32_t rep = 0; rep < run.repeat; ++rep) {
        for (int32_t i = run.first; i < run.first + run.count; ++i) {
          const KernelDesc& k = kernels_.kernels[static_cast<size_t>(i)];
          const int64_t call_begin = r.host_ns;
          r.host_ns += hw_.eager_launch_ns;
          const int64_t ready = s.free_ns + gap_ns;
          const int64_t start = std::max({ready, r.host_ns, s.dep_ns});
          const IdleSplit idle = split_idle(s.free_ns, start, host_begin, r.host_ns);
          sample.idle_host_ns += idle.host;
          sample.idle_launch_ns += idle.launch;
          sample.idle_dep_ns += idle.dep;
          const int64_t dur = cost_.kernel_ns(k);
          sample.gpu_busy_ns += dur;
          if (trace) {
            span(rank_id, Lane::kHost, "launch_kernel", plan.step, call_begin, hw_.eager_launch_ns,
                 first_flow);
            span(rank_id, Lane::kCompute, k.name, plan.step, start, dur, first_flow);
            first_flow = 0;
          }
          s.free_ns = start + dur;
          s.dep_ns = 0;
        }
      }
    }
    sample.host_launch_ns += r.host_ns - host_begin;
  }

  void trace_nodes(int32_t rank_id, int64_t step, int64_t start, int64_t gap_ns, int64_t flow) {
    int64_t t = start;
    for (const LayerRun& run : kernels_.runs) {
      for (int32_t rep = 0; rep < run.repeat; ++rep) {
        for (int32_t i = run.first; i < run.first + run.count; ++i) {
          const KernelDesc& k = kernels_.kernels[static_cast<size_t>(i)];
          const int64_t dur = cost_.kernel_ns(k);
          t += gap_ns;
          span(rank_id, Lane::kCompute, k.name, step, t, dur, flow);
          flow = 0;
          t += dur;
        }
      }
    }
  }

  void execute_plan(int32_t rank_id, Rank& r) {
    const Plan& plan = r.plan;
    const bool trace = tracing(plan.step);
    OutputSlot& out = r.outputs[static_cast<size_t>(plan.step) % kOutputRing];
    out.step = plan.step;
    out.outputs.clear();
    StepSample sample;
    sample.rank = rank_id;
    sample.step = plan.step;
    bool launched = false;
    bool active = false;

    for (const Op& op : plan.ops) {
      switch (op.kind) {
        case OpKind::kHostWork: {
          active = true;
          const int64_t d = host_costs_.sample_ns(op.host_op, plan.step);
          if (trace) span(rank_id, Lane::kHost, host_op_name(op.host_op), plan.step, r.host_ns, d);
          r.host_ns += d;
          sample.host_ns[static_cast<size_t>(op.host_op)] += d;
          r.program->host_work_done(op.host_op, plan.step, r.host_ns);
          break;
        }
        case OpKind::kHostSleep:
          r.host_ns = std::max(r.host_ns, op.until_ns);
          break;
        case OpKind::kLaunch:
          active = launched = true;
          launch(rank_id, r, plan, op, out, sample, trace);
          break;
        case OpKind::kRecordEvent: {
          const StreamState& s = r.streams[static_cast<size_t>(op.stream)];
          r.events[static_cast<size_t>(op.event) % kEventRing] = {op.event,
                                                                  std::max(s.free_ns, s.dep_ns)};
          break;
        }
        case OpKind::kStreamWait: {
          StreamState& s = r.streams[static_cast<size_t>(op.stream)];
          s.dep_ns = std::max(s.dep_ns, event_time(r, op.event));
          break;
        }
        case OpKind::kCopyD2H: {
          StreamState& s = r.streams[static_cast<size_t>(op.stream)];
          const int64_t host_begin = r.host_ns;
          r.host_ns += hw_.eager_launch_ns;  // the cudaMemcpyAsync call
          sample.host_launch_ns += hw_.eager_launch_ns;
          const int64_t start = std::max({s.free_ns, s.dep_ns, r.host_ns});
          const int64_t dur = cost_.copy_d2h_ns(op.bytes);
          if (trace) {
            const int64_t flow = ++flow_;
            span(rank_id, Lane::kHost, "copy_issue", plan.step, host_begin, r.host_ns - host_begin,
                 flow);
            span(rank_id, Lane::kCopy, "d2h_outputs", plan.step, start, dur, flow);
          }
          s.free_ns = start + dur;
          s.dep_ns = 0;
          break;
        }
        case OpKind::kHostWait: {
          active = true;
          const int64_t t_ev = event_time(r, op.event);
          const int64_t begin = r.host_ns;
          if (t_ev > r.host_ns) r.host_ns = t_ev + hw_.host_wake_ns;
          sample.host_wait_ns += r.host_ns - begin;
          if (trace && r.host_ns > begin)
            span(rank_id, Lane::kHost, "wait", plan.step, begin, r.host_ns - begin);
          if (op.payload_step >= 0) {
            const OutputSlot& o = r.outputs[static_cast<size_t>(op.payload_step) % kOutputRing];
            if (o.step != op.payload_step) {
              throw Error("simulator: outputs of step " + std::to_string(op.payload_step) +
                          " are no longer held (run-ahead deeper than the output ring)");
            }
            r.program->observe({op.payload_step, o.outputs}, r.host_ns);
          }
          break;
        }
      }
    }
    if (!active) return;
    const int64_t end =
        launched ? r.streams[static_cast<size_t>(StreamId::kCompute)].free_ns : r.prev_step_end_ns;
    sample.end_ns = end;
    sample.dur_ns = end - r.prev_step_end_ns;
    r.prev_step_end_ns = end;
    record_.steps.push_back(sample);
  }

  const ModelSpec& model_;
  const HardwareSpec& hw_;
  const HostCostModel& host_costs_;
  const std::vector<RequestSpec>& requests_;
  const SimOptions& options_;
  const CostModel& cost_;
  RunRecord& record_;
  std::vector<Rank> ranks_;
  std::priority_queue<Resume, std::vector<Resume>, std::greater<Resume>> queue_;
  uint64_t seq_ = 0;
  int64_t flow_ = 0;
  StepKernels kernels_;
};

}  // namespace

SimBackend::SimBackend(const ModelSpec& model, const HardwareSpec& hw,
                       const HostCostModel& host_costs, const std::vector<RequestSpec>& requests,
                       SimOptions options)
    : model_(model),
      hw_(hw),
      host_costs_(host_costs),
      requests_(requests),
      options_(options),
      cost_(hw) {}

void SimBackend::run(std::span<HostProgram* const> ranks, RunRecord& record) {
  Engine engine(model_, hw_, host_costs_, requests_, options_, cost_, record);
  engine.run(ranks);
}

}  // namespace twinstep
