#include "simulator/sim_backend.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <map>
#include <optional>
#include <queue>
#include <tuple>
#include <unordered_map>

#include "policies/calibration_model.h"
#include "policies/error.h"
#include "policies/kv_capacity.h"
#include "policies/layout.h"
#include "policies/spec_rules.h"
#include "policies/step_kernels.h"
#include "simulator/acceptance_model.h"
#include "simulator/node_placement.h"
#include "simulator/spec_graphs.h"

namespace twinstep {
namespace {

// `model`'s TP shard label "<model>@tp<N>" where every rank of a stage is a TP rank (tp equal to
// the stage's width, more than 1), else "".
std::string tp_shard_label(const std::string& model, const LayoutSpec& layout) {
  return layout.tp > 1 && layout.tp == layout.width() ? calibration_model_label(model, layout.tp)
                                                      : std::string();
}

// The spec_graph_residuals label of `model` under `layout`: the model itself on one GPU; under
// tensor parallelism alone (tp ranks, no pipeline, data or context split) its TP shard, where
// calibrate measured that shard's speculative graphs alone; else none (""). With its fusion
// where calibrate measured the fused graphs, else without.
std::string spec_residual_model(const HardwareSpec& hw, const ModelSpec& model,
                                const LayoutSpec& layout) {
  const int32_t world = layout.world();
  if (world != 1 && layout.tp != world) return {};
  auto fitted = [&](const std::string& label) {
    return std::any_of(hw.spec_graph_residuals.begin(), hw.spec_graph_residuals.end(),
                       [&](const auto& r) { return r.model == label; });
  };
  for (const KernelFusion& f : {model.fusion, KernelFusion{}}) {
    const std::string label = calibration_model_label(model.name, world, f);
    if (fitted(label)) return label;
  }
  return {};
}

constexpr size_t kEventRing = 1024;  // events alive at once per rank (policy depth ≪ this)
constexpr size_t kOutputRing = 64;   // steps whose outputs may be in flight per rank
constexpr int32_t kMaxDraft = 64;    // draft tokens per round the device model supports

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
  bool draft_only = false;
  std::vector<RequestOutput> outputs;
};

// What one launch runs on the device: `repeat` forward passes of `model` over `shape`.
struct DeviceWork {
  const ModelSpec* model;
  StepShape shape;
  int32_t q_tokens;
  int32_t repeat;
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

// The cost of a decode-shaped launch for fixed (requests, q_tokens) is exact integer-affine in
// the cached context: every kernel's bytes and FLOPs are. Kernels that do not depend on the
// context are summed once; only the others (attention) are re-priced each step.
struct DecodeCost {
  int64_t fixed_busy_ns = 0;
  int64_t fixed_bytes_read = 0;
  int64_t nodes = 0;
  struct Varying {
    KernelDesc at_zero;
    KernelDesc per_token;  // bytes/FLOPs added per cached context token
    int32_t repeat;
  };
  std::vector<Varying> varying;
};

class Engine {
 public:
  Engine(const ModelSpec& model, const ModelSpec& draft, const HardwareSpec& hw,
         const HostCostModel& host_costs, const std::vector<RequestSpec>& requests,
         const SimOptions& options, const CostModel& cost, RunRecord& record)
      : model_(model),
        draft_(draft),
        acceptance_(options.acceptance, options.acceptance_seed),
        hw_(hw),
        host_costs_(host_costs),
        requests_(requests),
        options_(options),
        cost_(cost),
        record_(record),
        width_(options.layout.width()),
        gap_model_(pdl_gap_model(hw, model.name, options.layout.width(), model.fusion)),
        gap_draft_(pdl_gap_model(hw, draft.name, options.layout.width(), draft.fusion)),
        break_model_(tp_shard_label(model.name, options.layout)),
        break_draft_(tp_shard_label(draft.name, options.layout)),
        spec_model_(spec_residual_model(hw, model, options.layout)),
        kv_capacity_(engine_kv_capacity_tokens(requests, options.spec)),
        model_moe_(model.has_moe()) {}

  void run(std::span<HostProgram* const> programs) {
    const int32_t world = options_.layout.world();
    if (options_.spec.method != SpecMethod::kNone &&
        options_.spec.max_draft() > acceptance_.max_position()) {
      throw Error("simulator: the calibrated acceptance from " +
                  options_.acceptance.calibrated->source + " measured drafts of " +
                  std::to_string(acceptance_.max_position()) + " tokens, but this policy drafts " +
                  "up to " + std::to_string(options_.spec.max_draft()) +
                  "; calibrate with a chain at least that long");
    }
    if (world > 1 && int32_t(programs.size()) != world) {
      throw Error("simulator: layout " + layout_name(options_.layout) + " has " +
                  std::to_string(world) + " ranks but " + std::to_string(programs.size()) +
                  " host programs were given");
    }
    ranks_.resize(programs.size());
    for (size_t r = 0; r < programs.size(); ++r) {
      Rank& rank = ranks_[r];
      rank.program = programs[r];
      rank.host_costs = host_costs_.for_rank(int32_t(r));
      rank.device_ctx.assign(requests_.size(), 0);
      rank.draft_len.assign(requests_.size(), 0);
      rank.conf_len.assign(requests_.size(), 0);
      rank.rounds.assign(requests_.size(), 0);
      rank.text_offset.assign(requests_.size(), 0);
    }
    if (world > 1) {
      run_coupled();
    } else {
      run_independent();
    }
    for (const Rank& r : ranks_) {
      record_.end_ns =
          std::max({record_.end_ns, r.host_ns, r.streams[0].free_ns, r.streams[1].free_ns});
    }
  }

 private:
  struct Rank {
    HostProgram* program = nullptr;
    HostCostModel host_costs{HostCostSpec{}, 0};
    Plan plan;
    int64_t host_ns = 0;
    std::array<StreamState, kStreamCount> streams{};
    std::array<EventSlot, kEventRing> events{};
    std::array<OutputSlot, kOutputRing> outputs{};
    std::vector<int64_t> device_ctx;   // per request: sequence length on the device
    std::vector<int32_t> draft_len;    // per request: tokens the current round drafted
    std::vector<int32_t> conf_len;     // per request: of those, the confident prefix
    std::vector<int64_t> rounds;       // per request: verify rounds done
    std::vector<int32_t> text_offset;  // per request: tokens its verify rounds committed
    int64_t prev_step_end_ns = 0;
    StepSample carry;  // a draft-only plan's sample, merged into the next step's
    bool has_carry = false;
    // The plan being executed.
    OutputSlot* out = nullptr;
    StepSample sample;
    bool trace = false;
    bool launched = false;
    bool active = false;
  };

  // A launch issued by one rank, before its GPU timing is known (coupled ranks): a sequence of
  // items, each compute time (one node, or a run of nodes between collectives) optionally
  // followed by a collective.
  struct Item {
    int64_t compute_ns;      // node durations before the collective
    int64_t gap_ns;          // node gaps among them (inside the launch's span: GPU busy)
    int64_t ready_ns;        // eager: when the item's launch lands (0 for graphs)
    const char* name;        // for traces (node-level items only)
    const KernelDesc* coll;  // the collective ending the item, or null
  };
  struct SegmentTemplate;
  struct Issued {
    const GraphLaunch* g = nullptr;
    StepKernels kernels;
    std::vector<StepShape> microbatches;  // the launch's pipeline microbatches (one without PP)
    std::vector<const SegmentTemplate*> templates;  // per microbatch, when priced by segments
    KernelDesc ids{};  // PP: the sampled ids' return (pipeline_ids_kernel)
    std::vector<Item> items;
    int64_t host_begin = 0;
    int64_t flow = 0;
    // Walk state.
    size_t next = 0;
    int64_t start = 0;  // when the launch starts on the rank's stream
    int64_t t = 0;
    int64_t coll_arrival = 0;
    // PDL overlap not yet taken (<= 0): a node starts no earlier than its predecessor (prev_start,
    // when has_prev), and what a tiny predecessor cannot absorb carries to the next node; it is
    // taken in full before each collective and at the launch's end, so those times are the plain
    // sums' (simulator/node_placement.h).
    int64_t carry = 0;
    int64_t prev_start = 0;
    bool has_prev = false;
    bool waiting = false;
    bool done = false;
    std::map<int64_t, int32_t> seq;  // per collective group: instances reached
  };

  // A rank's decode-like launch whose kernel bytes and FLOPs are affine in the cached context
  // (checked, not assumed): segments between collectives with their context-independent time
  // summed once and the context-dependent kernels kept as base + slope.
  struct SegmentTemplate {
    struct Varying {
      KernelDesc base;
      KernelDesc slope;
    };
    struct Segment {
      int64_t fixed_ns = 0;
      int64_t gap_ns = 0;
      std::vector<Varying> varying;
      int64_t fixed_bytes = 0;
      KernelDesc coll{};
      bool has_coll = false;
    };
    bool affine = true;
    std::vector<Segment> segments;
  };

  // The ranks that take part in collective `k` issued by `rank`, as a key; members share it.
  int64_t collective_group(const KernelDesc& k, int32_t rank) const {
    const int32_t stage = rank / width_;
    const int32_t index = rank % width_;
    if (k.coll == CollectiveKind::kSendRecv) {  // k.group: the peer stage
      const int32_t low = std::min(stage, k.group), high = std::max(stage, k.group);
      return (int64_t(1) << 40) | (int64_t(low) << 28) | (int64_t(high) << 16) | index;
    }
    return stage;
  }
  int32_t group_size(const KernelDesc& k) const {
    return k.coll == CollectiveKind::kSendRecv ? 2 : k.group;
  }

  // Everyone independent (one rank, or ranks without collectives): an event queue of host
  // resumptions keyed by (time, sequence).
  void run_independent() {
    for (size_t r = 0; r < ranks_.size(); ++r) queue_.push({0, seq_++, int32_t(r)});
    while (!queue_.empty()) {
      const Resume next = queue_.top();
      queue_.pop();
      Rank& rank = ranks_[size_t(next.rank)];
      assert(rank.host_ns == next.t_ns);
      rank.plan.clear();
      if (!rank.program->next_plan(rank.host_ns, rank.plan)) continue;
      begin_plan(next.rank, rank);
      for (const Op& op : rank.plan.ops) {
        if (op.kind == OpKind::kLaunch) {
          launch_single(next.rank, rank, op);
        } else {
          execute_local(next.rank, rank, op);
        }
      }
      end_plan(next.rank, rank);
      queue_.push({rank.host_ns, seq_++, next.rank});
    }
  }

  // Ranks coupled by collectives run the same program (SPMD): each rank's host decides its own
  // plan, the plans must agree, and each operation is executed on every rank before the next,
  // a launch's collectives completing at their latest member's arrival plus their cost (plus,
  // for members arriving apart, the calibrated late-arrival extra).
  void run_coupled() {
    for (;;) {
      int32_t more = 0;
      for (Rank& r : ranks_) {
        r.plan.clear();
        more += r.program->next_plan(r.host_ns, r.plan);
      }
      if (more == 0) return;
      check_same_plans(more);
      for (size_t r = 0; r < ranks_.size(); ++r) begin_plan(int32_t(r), ranks_[r]);
      const Plan& plan0 = ranks_[0].plan;
      for (size_t i = 0; i < plan0.ops.size(); ++i) {
        if (plan0.ops[i].kind == OpKind::kLaunch) {
          launch_coupled(i);
        } else {
          for (size_t r = 0; r < ranks_.size(); ++r) {
            execute_local(int32_t(r), ranks_[r], ranks_[r].plan.ops[i]);
          }
        }
      }
      for (size_t r = 0; r < ranks_.size(); ++r) end_plan(int32_t(r), ranks_[r]);
    }
  }

  void check_same_plans(int32_t more) const {
    const Plan& a = ranks_[0].plan;
    bool same = more == int32_t(ranks_.size());
    for (size_t r = 1; same && r < ranks_.size(); ++r) {
      const Plan& b = ranks_[r].plan;
      same = a.ops.size() == b.ops.size() && a.requests == b.requests &&
             a.launches.size() == b.launches.size();
      for (size_t i = 0; same && i < a.ops.size(); ++i) {
        same = a.ops[i].kind == b.ops[i].kind && a.ops[i].event == b.ops[i].event &&
               a.ops[i].graph == b.ops[i].graph && a.ops[i].stream == b.ops[i].stream;
      }
      for (size_t i = 0; same && i < a.launches.size(); ++i) {
        same = a.launches[i].phase == b.launches[i].phase &&
               a.launches[i].q_tokens == b.launches[i].q_tokens &&
               a.launches[i].request_count == b.launches[i].request_count;
      }
    }
    if (!same) {
      throw Error("simulator: the ranks' host programs decided different plans at step " +
                  std::to_string(a.step) +
                  "; coupled ranks must make the same decisions (a closed-loop workload, no "
                  "time-dependent admission)");
    }
  }

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
    if (e.id != id) {
      throw Error("simulator: plan waits on event " + std::to_string(id) +
                  " that was never recorded (or is too old)");
    }
    return e.t_ns;
  }

  // moe_tokens, row_exact, kv_pass: those of the launch's StepShape.
  const DecodeCost& decode_cost(const ModelSpec& m, int32_t requests, int32_t q_tokens,
                                int64_t moe_tokens, bool row_exact, bool kv_pass) {
    // One 64-bit key: draft, row_exact, kv_pass (1 bit each), requests (21), q_tokens (8),
    // moe_tokens + 1 (32).
    assert(requests >= 0 && requests < (1 << 21) && q_tokens >= 0 && q_tokens < 256 &&
           moe_tokens >= -1 && moe_tokens < (int64_t{1} << 32) - 1);
    const uint64_t key = (uint64_t(&m == &draft_) << 63) | (uint64_t(row_exact) << 62) |
                         (uint64_t(kv_pass) << 61) | (uint64_t(requests) << 40) |
                         (uint64_t(q_tokens) << 32) | uint64_t(moe_tokens + 1);
    auto it = decode_costs_.find(key);
    if (it != decode_costs_.end()) return it->second;
    DecodeCost c;
    StepKernels base, one;
    StepShape at0 = decode_shape(requests, q_tokens, 0), at1 = decode_shape(requests, q_tokens, 1);
    at0.moe_tokens = at1.moe_tokens = moe_tokens;
    at0.row_exact = at1.row_exact = row_exact;
    at0.kv_pass = at1.kv_pass = kv_pass;
    step_kernels(m, at0, base);
    step_kernels(m, at1, one);
    for (const LayerRun& run : base.runs) {
      for (int32_t i = run.first; i < run.first + run.count; ++i) {
        const KernelDesc& k0 = base.kernels[size_t(i)];
        const KernelDesc& k1 = one.kernels[size_t(i)];
        c.nodes += run.repeat;
        if (k0.bytes_read == k1.bytes_read && k0.bytes_written == k1.bytes_written &&
            k0.flops == k1.flops) {
          c.fixed_busy_ns += run.repeat * cost_.kernel_ns(k0);
          c.fixed_bytes_read += run.repeat * k0.bytes_read;
          continue;
        }
        const KernelDesc slope{k0.name, k0.cls, k1.bytes_read - k0.bytes_read,
                               k1.bytes_written - k0.bytes_written, k1.flops - k0.flops};
        c.varying.push_back({k0, slope, run.repeat});
      }
    }
    return decode_costs_.emplace(key, std::move(c)).first->second;
  }

  GraphCost priced_decode(const ModelSpec& m, const StepShape& shape, int32_t q_tokens) {
    const DecodeCost& c =
        decode_cost(m, shape.requests, q_tokens, shape.moe_tokens, shape.row_exact, shape.kv_pass);
    GraphCost g{c.fixed_busy_ns, c.nodes, c.fixed_bytes_read};
    for (const DecodeCost::Varying& v : c.varying) {
      KernelDesc k = v.at_zero;  // name, class and requests
      k.bytes_read += v.per_token.bytes_read * shape.ctx_tokens;
      k.bytes_written += v.per_token.bytes_written * shape.ctx_tokens;
      k.flops += v.per_token.flops * shape.ctx_tokens;
      g.busy_ns += v.repeat * cost_.kernel_ns(k);
      g.bytes_read += v.repeat * k.bytes_read;
    }
    return g;
  }

  // The module, shape and passes of a launch (launch_work, shared with the real backend).
  DeviceWork work_of(const LaunchWork& w, int32_t q_tokens) const {
    return {w.draft_module ? &draft_ : &model_, w.shape, q_tokens, w.passes};
  }

  // Applies a launch's device-side effects (contexts, drafts, acceptance, outputs) and says
  // what it runs.
  DeviceWork device_execute(Rank& r, const Plan& plan, const GraphLaunch& g, OutputSlot& out,
                            StepSample& sample) {
    const int32_t* ids = plan.requests.data() + g.first_request;
    const int32_t n = g.request_count;
    if (g.phase == Phase::kPrefill) {
      int64_t tokens = 0;
      int64_t sq = 0;
      for (int32_t i = 0; i < n; ++i) {
        const int64_t len = requests_[static_cast<size_t>(ids[i])].input_len;
        tokens += len;
        sq += len * len;
        r.device_ctx[static_cast<size_t>(ids[i])] = len + 1;  // the prompt plus the first token
        out.outputs.push_back({ids[i], 1});
      }
      sample.prefills += n;
      return {&model_, prefill_shape(n, tokens, sq), 0, 1};
    }
    int64_t ctx = 0;  // cached tokens: the newest token is this step's input
    for (int32_t i = 0; i < n; ++i) ctx += r.device_ctx[static_cast<size_t>(ids[i])] - 1;

    switch (g.phase) {
      case Phase::kDecode:
        for (int32_t i = 0; i < n; ++i) {
          r.device_ctx[static_cast<size_t>(ids[i])] += g.q_tokens;
          out.outputs.push_back({ids[i], g.q_tokens});
        }
        sample.batch += n;
        sample.tokens += n * g.q_tokens;
        return work_of(launch_work(Phase::kDecode, n, g.q_tokens, ctx), g.q_tokens);
      case Phase::kDraft: {
        // Confidence-scheduled drafts stop on the device; chains and host-chosen lengths run
        // exactly q_tokens. The draft loop runs as long as any request drafts.
        const bool device_decides = options_.spec.method == SpecMethod::kConfidence &&
                                    options_.spec.mode != DraftMode::kHostLate;
        int32_t longest = 0;
        for (int32_t i = 0; i < n; ++i) {
          const auto id = static_cast<size_t>(ids[i]);
          float conf[kMaxDraft];
          const int32_t max_len = std::min(g.q_tokens, kMaxDraft);
          for (int32_t p = 0; p < max_len; ++p) {
            conf[p] = acceptance_.draw(ids[i], r.rounds[id], p + 1, r.text_offset[id]).confidence;
          }
          const std::span<const float> c(conf, size_t(max_len));
          r.draft_len[id] = device_decides ? device_draft_len(options_.spec, c, max_len) : max_len;
          r.conf_len[id] = confident_prefix(options_.spec, c, r.draft_len[id]);
          longest = std::max(longest, r.draft_len[id]);
          out.outputs.push_back({ids[i], 0, r.draft_len[id], r.conf_len[id]});
        }
        const int32_t passes = draft_passes(options_.spec, g.mode, longest, g.q_tokens);
        return work_of(launch_work(Phase::kDraft, n, g.q_tokens, ctx, passes), 1);
      }
      case Phase::kVerify: {
        int32_t widest = 0;
        int64_t routed = 0;  // positions routed through MoE experts
        for (int32_t i = 0; i < n; ++i) {
          const auto id = static_cast<size_t>(ids[i]);
          const int32_t d = std::min(r.draft_len[id], g.q_tokens - 1);
          bool agrees[kMaxDraft];
          const bool keep = sample.rank == 0 && d > 0;
          if (keep) record_.rounds.push_back({ids[i], sample.step, d, 0, {}});
          for (int32_t p = 0; p < d; ++p) {
            const AcceptanceModel::Draw draw =
                acceptance_.draw(ids[i], r.rounds[id], p + 1, r.text_offset[id]);
            agrees[p] = draw.agrees;
            if (keep) record_.rounds.back().confidence.push_back(draw.confidence);
          }
          const int32_t committed =
              accepted_prefix(std::span<const bool>(agrees, size_t(d)), d) + 1;
          if (keep) record_.rounds.back().accepted = committed - 1;
          r.device_ctx[id] += committed;
          ++r.rounds[id];
          r.text_offset[id] += committed;
          out.outputs.push_back({ids[i], committed, d, r.conf_len[id]});
          sample.tokens += committed;
          widest = std::max(widest, d);
          routed += d + 1;
        }
        sample.batch += n;
        sample.draft_len = std::max(sample.draft_len, widest);
        // The runtime routes a request's draft positions and committed token through the MoE
        // experts, not the padding up to the launch's width (kernels/moe.h active_rows).
        return work_of(launch_work(Phase::kVerify, n, g.q_tokens, ctx, 0, model_moe_ ? routed : -1),
                       g.q_tokens);
      }
      case Phase::kExtend:
        return work_of(launch_work(Phase::kExtend, n, g.q_tokens, ctx), g.q_tokens);
      case Phase::kPrefill:
        break;
    }
    return {&model_, StepShape{}, 0, 0};
  }

  // PP: per request of launch `g`, in launch order, what microbatching splits: the prompt length
  // (prefill) or the cached context (every other phase), into lengths_.
  void pipeline_lengths(const Rank& r, const GraphLaunch& g) {
    lengths_.clear();
    const int32_t* ids = r.plan.requests.data() + g.first_request;
    for (int32_t i = 0; i < g.request_count; ++i) {
      const auto id = static_cast<size_t>(ids[i]);
      lengths_.push_back(g.phase == Phase::kPrefill ? requests_[id].input_len
                                                    : r.device_ctx[id] - 1);
    }
  }

  // The GPU time between consecutive nodes of launch `g` running `w`. PDL: by model and rows
  // where the profile measured it (pdl_node_gap_for); it may be negative (an overlap of a
  // kernel's prologue with its predecessor's tail), which shortens the launch's span. Graph: a
  // plain decode step by model and rows where measured (graph_node_gap_for), other launches
  // (speculative graphs: their residuals are fitted against it) graph_node_gap_ns. Eager:
  // between kernels already queued, a decode step by model and rows where measured
  // (eager_node_gap_for), other launches eager_node_gap_ns; a kernel launched late waits for its
  // launch besides.
  int64_t node_gap_ns(const GraphLaunch& g, const DeviceWork& w) const {
    const std::string& key = w.model == &draft_ ? gap_draft_ : gap_model_;
    switch (g.mode) {
      case GraphMode::kCudaGraphPdl:
        return pdl_node_gap_for(hw_, key, w.shape.tokens);
      case GraphMode::kEager:
        return g.phase == Phase::kDecode ? eager_node_gap_for(hw_, key, w.shape.tokens)
                                         : hw_.eager_node_gap_ns;
      default:
        return g.phase == Phase::kDecode ? graph_node_gap_for(hw_, key, w.shape.tokens)
                                         : hw_.graph_node_gap_ns;
    }
  }

  // The calibrated residual of speculative launch `g` running `w` (simulator/spec_graphs.h,
  // docs/calibration.md "Speculative graphs"): the profile's fit for this model (spec_model_: one
  // GPU, or the TP shard calibrate --tp measured), the graph kind, the launch's requests and
  // graph mode. Only plain graph mode, the one calibrate measures: PDL, eager and other phases
  // get 0, as does a run whose model (or shard) the profile has no fit for.
  int64_t spec_residual_ns(const GraphLaunch& g, const DeviceWork& w) const {
    if (spec_model_.empty() || g.mode != GraphMode::kCudaGraph || w.shape.requests < 1) return 0;
    SpecGraph graph = SpecGraph::kVerify;
    int32_t positions = w.q_tokens;
    int32_t skipped = 0;
    switch (g.phase) {
      case Phase::kDraft: {
        // As device_execute: device-decided lengths in a graph skip steps through conditional
        // nodes when early exit is on (the runtime's draft_early_exit graphs); the runtime runs
        // the draft tokens' forwards, repeat + 1.
        const bool device_decides = options_.spec.method == SpecMethod::kConfidence &&
                                    options_.spec.mode != DraftMode::kHostLate;
        graph = device_decides && options_.spec.early_exit ? SpecGraph::kDraftEarlyExit
                                                           : SpecGraph::kDraft;
        positions = w.repeat + 1;
        // The early-exit graph holds the policy's longest draft (Engine::prepare_spec) and
        // skips the conditional steps past this one's length.
        if (graph == SpecGraph::kDraftEarlyExit)
          skipped = std::max(0, options_.spec.max_draft() - positions);
        break;
      }
      case Phase::kVerify:
        break;
      case Phase::kExtend:
        graph = SpecGraph::kExtend;
        break;
      default:
        return 0;
    }
    const HardwareSpec::SpecGraphResidual* r =
        spec_graph_residual_for(hw_, spec_model_, graph, "graph", w.shape.requests);
    if (r == nullptr) return 0;
    const int64_t split = spec_graph_split_tokens(model_, options_.layout.tp, w.shape.requests,
                                                  kv_capacity_, hw_.sm_count);
    return spec_graph_residual_ns(*r, graph, w.shape.requests, positions,
                                  double(w.shape.ctx_tokens) / w.shape.requests, skipped, split);
  }

  // A calibrated speculative graph's residual on a rank of coupled ranks (its TP shard, measured
  // alone): spread over the launch's compute in proportion to it, so that the items' compute
  // grows by exactly residual_ns (to no less than zero in all); collectives keep their price.
  // Cumulative rounding keeps the sum exact.
  static void spread_residual(std::vector<Item>& items, int64_t residual_ns) {
    if (residual_ns == 0) return;
    int64_t total = 0;
    for (const Item& it : items) total += it.compute_ns;
    if (total <= 0) {
      if (residual_ns > 0) items.push_back({residual_ns, 0, 0, "spec_graph_residual", nullptr});
      return;
    }
    const double f = double(std::max<int64_t>(0, total + residual_ns)) / double(total);
    int64_t before = 0, placed = 0;
    for (Item& it : items) {
      before += it.compute_ns;
      const int64_t upto = std::llround(double(before) * f);
      it.compute_ns = upto - placed;
      placed = upto;
    }
  }

  // The gap before the first node after a collective in launch `g` running `w`, whose nodes are
  // `gap_ns` apart: in graph and PDL modes that gap plus the profile's break gap of the rank's
  // shard and rows (break_gap_for: the shard's steps measured with a non-PDL empty kernel at each
  // collective position); otherwise (eager, or no entry) no overlap with the collective, at least
  // the plain graph node gap.
  int64_t resume_gap_ns(const GraphLaunch& g, const DeviceWork& w, int64_t gap_ns) const {
    if (g.mode != GraphMode::kEager) {
      const std::string& key = w.model == &draft_ ? break_draft_ : break_model_;
      if (const std::optional<int64_t> extra =
              break_gap_for(hw_, g.mode == GraphMode::kCudaGraphPdl, key, w.shape.tokens)) {
        return gap_ns + *extra;
      }
    }
    return std::max(gap_ns, hw_.graph_node_gap_ns);
  }

  // One rank alone: the graph is priced as a whole where nothing observes its nodes.
  void launch_single(int32_t rank_id, Rank& r, const Op& op) {
    const Plan& plan = r.plan;
    const GraphLaunch& g = plan.launches[static_cast<size_t>(op.graph)];
    StepSample& sample = r.sample;
    const bool trace = r.trace;
    const DeviceWork work = device_execute(r, plan, g, *r.out, sample);
    const bool aggregate = g.mode != GraphMode::kEager && g.phase != Phase::kPrefill && !trace;
    GraphCost cost;
    if (aggregate) {
      cost = priced_decode(*work.model, work.shape, work.q_tokens);
    } else {
      step_kernels(*work.model, work.shape, kernels_);
      cost = cost_.graph_cost(kernels_);
    }
    repeat_ = work.repeat;
    cost.busy_ns *= work.repeat;
    cost.nodes *= work.repeat;
    cost.bytes_read *= work.repeat;
    if (g.phase != Phase::kPrefill) sample.bytes_read += cost.bytes_read;

    StreamState& s = r.streams[static_cast<size_t>(op.stream)];
    const int64_t host_begin = r.host_ns;
    const int64_t flow = trace ? ++flow_ : 0;
    const int64_t gap_ns = node_gap_ns(g, work);
    const int64_t residual_ns = spec_residual_ns(g, work);

    if (g.mode != GraphMode::kEager) {
      r.host_ns += hw_.graph_launch_ns;
      sample.host_launch_ns += hw_.graph_launch_ns;
      const int64_t start = std::max({s.free_ns, r.host_ns, s.dep_ns});
      const IdleSplit idle = split_idle(s.free_ns, start, host_begin, r.host_ns);
      // GPU busy is the launch's span on the GPU, its node gaps included (docs/calibration.md,
      // "GPU busy inside a graph": what the real backend measures with one event pair per
      // launch). A negative gap (PDL overlap) shortens the span.
      const int64_t span_ns =
          std::max<int64_t>(0, cost.busy_ns + cost.nodes * gap_ns + residual_ns);
      sample.idle_host_ns += idle.host;
      sample.idle_launch_ns += idle.launch;
      sample.idle_dep_ns += idle.dep;
      sample.gpu_busy_ns += span_ns;
      const int64_t end = start + span_ns;
      if (trace) {
        span(rank_id, Lane::kHost, "launch_graph", plan.step, host_begin, r.host_ns - host_begin,
             flow);
        trace_nodes(rank_id, plan.step, start, gap_ns, flow);
        // A calibrated speculative graph's added time, after its nodes (a negative one is not
        // drawn: the nodes overrun the launch's span by it).
        if (residual_ns > 0) {
          span(rank_id, Lane::kCompute, "spec_graph_residual", plan.step, end - residual_ns,
               residual_ns);
        }
      }
      s.free_ns = end;
      s.dep_ns = 0;
      return;
    }

    // Eager: every kernel is a host launch call; the GPU cannot start a kernel before its
    // launch reaches it. Before the launch's first kernel the GPU is idle (host- or
    // launch-bound); after it, node gaps and waits for later launch calls are inside the
    // launch's span, busy as the real backend measures it (one event pair per launch).
    int64_t first_flow = flow;
    bool first_kernel = true;
    for (int32_t pass = 0; pass < repeat_; ++pass) {
      for (const LayerRun& run : kernels_.runs) {
        for (int32_t rep = 0; rep < run.repeat; ++rep) {
          for (int32_t i = run.first; i < run.first + run.count; ++i) {
            const KernelDesc& k = kernels_.kernels[static_cast<size_t>(i)];
            const int64_t call_begin = r.host_ns;
            r.host_ns += hw_.eager_launch_ns;
            const int64_t ready = s.free_ns + gap_ns;
            const int64_t start = std::max({ready, r.host_ns, s.dep_ns});
            if (first_kernel) {
              const IdleSplit idle =
                  split_idle(s.free_ns, start, host_begin, std::max(r.host_ns, ready));
              sample.idle_host_ns += idle.host;
              sample.idle_launch_ns += idle.launch;
              sample.idle_dep_ns += idle.dep;
              first_kernel = false;
            } else {
              sample.gpu_busy_ns += start - s.free_ns;
            }
            const int64_t dur = cost_.kernel_ns(k);
            sample.gpu_busy_ns += dur;
            if (trace) {
              span(rank_id, Lane::kHost, "launch_kernel", plan.step, call_begin,
                   hw_.eager_launch_ns, first_flow);
              span(rank_id, Lane::kCompute, k.name, plan.step, start, dur, first_flow);
              first_flow = 0;
            }
            s.free_ns = start + dur;
            s.dep_ns = 0;
          }
        }
      }
    }
    sample.host_launch_ns += r.host_ns - host_begin;
  }

  // Draws the kernels of a launch priced as a whole, from `start`: each node `gap_ns` after its
  // predecessor's end, but never before its start (simulator/node_placement.h).
  void trace_nodes(int32_t rank_id, int64_t step, int64_t start, int64_t gap_ns, int64_t flow) {
    int64_t t = start, carry = 0, prev_start = 0;
    bool has_prev = false;
    for (int32_t pass = 0; pass < repeat_; ++pass) {
      for (const LayerRun& run : kernels_.runs) {
        for (int32_t rep = 0; rep < run.repeat; ++rep) {
          for (int32_t i = run.first; i < run.first + run.count; ++i) {
            const KernelDesc& k = kernels_.kernels[static_cast<size_t>(i)];
            const int64_t dur = cost_.kernel_ns(k);
            prev_start = place_node(t, gap_ns, carry, has_prev, prev_start);
            has_prev = true;
            span(rank_id, Lane::kCompute, k.name, step, prev_start, dur, flow);
            flow = 0;
            t = prev_start + dur;
          }
        }
      }
    }
  }

  // Calls f(kernel) for every node of `k` in execution order.
  template <typename F>
  static void for_each_node(const StepKernels& k, int32_t passes, F&& f) {
    for (int32_t pass = 0; pass < passes; ++pass) {
      for (const LayerRun& run : k.runs) {
        for (int32_t rep = 0; rep < run.repeat; ++rep) {
          for (int32_t i = run.first; i < run.first + run.count; ++i) f(k.kernels[size_t(i)]);
        }
      }
    }
  }

  static KernelDesc at_ctx(const SegmentTemplate::Varying& v, int64_t ctx) {
    KernelDesc k = v.base;
    k.bytes_read += v.slope.bytes_read * ctx;
    k.bytes_written += v.slope.bytes_written * ctx;
    k.flops += v.slope.flops * ctx;
    return k;
  }

  // gap_ns: between two compute nodes (under PDL possibly negative: an overlap); the first node
  // after a collective waits for it (an NCCL kernel neither triggers early nor is PDL-launched),
  // so it gets resume_ns (resume_gap_ns).
  // `mb`: the microbatch's requests and launch rules (row_exact, kv_pass); its context varies.
  const SegmentTemplate& segment_template(const ModelSpec& m, const StepShape& mb, int32_t q_tokens,
                                          int32_t rank, int64_t gap_ns, int64_t resume_ns) {
    const int32_t requests = mb.requests;
    const auto key = std::make_tuple(&m == &draft_, mb.row_exact, mb.kv_pass, requests, q_tokens,
                                     rank, gap_ns, resume_ns);
    auto it = templates_.find(key);
    if (it != templates_.end()) return it->second;
    SegmentTemplate t;
    StepKernels k0, k1, kfar;
    constexpr int64_t kFar = 1'000'003;  // a far context to check affinity
    const auto at = [&](int64_t ctx) {
      StepShape s = decode_shape(requests, q_tokens, ctx);
      s.row_exact = mb.row_exact;
      s.kv_pass = mb.kv_pass;
      return s;
    };
    step_kernels(m, at(0), options_.layout, rank, k0);
    step_kernels(m, at(1), options_.layout, rank, k1);
    step_kernels(m, at(kFar), options_.layout, rank, kfar);
    std::vector<const KernelDesc*> n0, n1, nfar;
    for_each_node(k0, 1, [&](const KernelDesc& d) { n0.push_back(&d); });
    for_each_node(k1, 1, [&](const KernelDesc& d) { n1.push_back(&d); });
    for_each_node(kfar, 1, [&](const KernelDesc& d) { nfar.push_back(&d); });
    t.affine = n0.size() == n1.size() && n0.size() == nfar.size();
    SegmentTemplate::Segment seg;
    bool after_coll = false;
    for (size_t i = 0; t.affine && i < n0.size(); ++i) {
      const KernelDesc& a = *n0[i];
      const KernelDesc& b = *n1[i];
      const SegmentTemplate::Varying v{a,
                                       {a.name, a.cls, b.bytes_read - a.bytes_read,
                                        b.bytes_written - a.bytes_written, b.flops - a.flops}};
      const KernelDesc predicted = at_ctx(v, kFar);
      const KernelDesc& far = *nfar[i];
      t.affine = predicted.bytes_read == far.bytes_read &&
                 predicted.bytes_written == far.bytes_written && predicted.flops == far.flops &&
                 a.cls == far.cls && a.coll == far.coll;
      if (a.cls == KernelClass::kCollective) {
        t.affine = t.affine && v.slope.bytes_read == 0 && v.slope.bytes_written == 0;
        seg.coll = a;
        seg.has_coll = true;
        t.segments.push_back(std::move(seg));
        seg = {};
        after_coll = true;
        continue;
      }
      seg.gap_ns += after_coll ? resume_ns : gap_ns;
      after_coll = false;
      if (v.slope.bytes_read == 0 && v.slope.bytes_written == 0 && v.slope.flops == 0) {
        seg.fixed_ns += cost_.kernel_ns(a);
        seg.fixed_bytes += a.bytes_read;
      } else {
        seg.varying.push_back(v);
      }
    }
    t.segments.push_back(std::move(seg));
    return templates_.emplace(key, std::move(t)).first->second;
  }

  // Coupled ranks: every rank issues the launch (host side, device effects, its own kernel
  // list), then their items are walked rank by rank; a rank reaching a collective waits until
  // every member of its group has arrived.
  void launch_coupled(size_t op_index) {
    const size_t n = ranks_.size();
    issued_.resize(n);
    const LayoutSpec& layout = options_.layout;
    // Skewed expert loads under EP are drawn per launch (the same key on every rank).
    const bool drawn = layout.ep > 1 && (layout.expert_load.kind != ExpertLoad::Kind::kUniform ||
                                         layout.expert_load.sampled);
    const std::optional<uint64_t> pass_key =
        drawn ? std::optional<uint64_t>((uint64_t(ranks_[0].plan.step) << 16) ^ op_index)
              : std::nullopt;
    for (size_t ri = 0; ri < n; ++ri) {
      Rank& r = ranks_[ri];
      const Op& op = r.plan.ops[op_index];
      Issued& is = issued_[ri];
      is.g = &r.plan.launches[size_t(op.graph)];
      if (layout.pp > 1) pipeline_lengths(r, *is.g);  // before device_execute moves contexts
      const DeviceWork work = device_execute(r, r.plan, *is.g, *r.out, r.sample);
      // Node-by-node timing: a negative PDL gap overlaps a node with its predecessor, except
      // right after a collective (resume_gap_ns).
      const int64_t gap_ns = node_gap_ns(*is.g, work);
      const int64_t resume_ns = resume_gap_ns(*is.g, work, gap_ns);
      const bool eager = is.g->mode == GraphMode::kEager;
      const bool prefill = is.g->phase == Phase::kPrefill;
      // Under PP the draft module runs on the last stage (draft_module_kernels), whole.
      const bool draft_on_last = layout.pp > 1 && work.model == &draft_;
      is.microbatches.clear();
      if (layout.pp == 1 || draft_on_last) {
        is.microbatches.push_back(work.shape);
      } else if (prefill) {
        prefill_microbatch_shapes(layout, lengths_, is.microbatches);
      } else {
        decode_microbatch_shapes(layout, lengths_, work.q_tokens, is.microbatches);
        for (StepShape& mb : is.microbatches) {  // a verify's or extend's launch rules
          mb.row_exact = work.shape.row_exact;
          mb.kv_pass = work.shape.kv_pass;
        }
      }
      // The routing this launch draws, recorded for the traced steps' decode and verify launches
      // (moe_* metrics, as the runtime records them); every rank draws the same, so rank 0's.
      if (ri == 0 && r.trace && pass_key &&
          (is.g->phase == Phase::kDecode || is.g->phase == Phase::kVerify) && !draft_on_last)
        add_sampled_routing(*work.model, is.microbatches, layout, 0, *pass_key,
                            record_.moe_routing);
      bool has_ids = false;
      if (!draft_on_last) {
        has_ids = pipeline_ids_kernel(layout, int32_t(ri), is.microbatches, is.ids);
      } else if (is.g->phase == Phase::kDraft) {
        // The drafts (repeat + 1 per request: the first came from the extend) go to stage 0.
        const StepShape drafted = decode_shape(work.shape.requests, work.repeat + 1, 0);
        has_ids = pipeline_ids_kernel(layout, int32_t(ri), {&drafted, 1}, is.ids);
      }
      is.items.clear();
      is.host_begin = r.host_ns;
      is.flow = r.trace ? ++flow_ : 0;
      int64_t bytes = 0;
      bool affine = !eager && !r.trace && !prefill && !drawn && !draft_on_last;
      is.templates.clear();
      for (size_t j = 0; affine && j < is.microbatches.size(); ++j) {
        is.templates.push_back(&segment_template(*work.model, is.microbatches[j], work.q_tokens,
                                                 int32_t(ri), gap_ns, resume_ns));
        affine = is.templates.back()->affine;
      }
      if (affine) {
        for (int32_t pass = 0; pass < work.repeat; ++pass) {
          for (size_t j = 0; j < is.microbatches.size(); ++j) {
            const StepShape& mb = is.microbatches[j];
            for (const SegmentTemplate::Segment& seg : is.templates[j]->segments) {
              int64_t ns = seg.fixed_ns;
              bytes += seg.fixed_bytes;
              for (const SegmentTemplate::Varying& v : seg.varying) {
                const KernelDesc k = at_ctx(v, mb.ctx_tokens);
                ns += cost_.kernel_ns(k);
                bytes += k.bytes_read;
              }
              is.items.push_back({ns, seg.gap_ns, 0, nullptr, seg.has_coll ? &seg.coll : nullptr});
            }
          }
          if (has_ids) is.items.push_back({0, 0, 0, nullptr, &is.ids});
        }
      } else {
        if (draft_on_last) {
          draft_module_kernels(draft_, work.shape, layout, int32_t(ri), is.kernels, pass_key);
        } else {
          pipeline_step_kernels(*work.model, is.microbatches, layout, int32_t(ri), is.kernels,
                                pass_key);
        }
        bool after_coll = false;
        for_each_node(is.kernels, work.repeat, [&](const KernelDesc& k) {
          if (eager) {
            r.host_ns += hw_.eager_launch_ns;
          }
          const int64_t ready = eager ? r.host_ns : 0;
          if (k.cls == KernelClass::kCollective) {
            is.items.push_back({0, 0, ready, k.name, &k});
            after_coll = true;
          } else {
            is.items.push_back(
                {cost_.kernel_ns(k), after_coll ? resume_ns : gap_ns, ready, k.name, nullptr});
            after_coll = false;
            bytes += k.bytes_read;
          }
        });
        if (draft_on_last && has_ids) is.items.push_back({0, 0, 0, "pp_ids", &is.ids});
      }
      spread_residual(is.items, spec_residual_ns(*is.g, work));
      if (is.g->phase != Phase::kPrefill) r.sample.bytes_read += bytes;
      if (!eager) r.host_ns += hw_.graph_launch_ns;
      r.sample.host_launch_ns += r.host_ns - is.host_begin;
      if (r.trace) {
        span(int32_t(ri), Lane::kHost, eager ? "launch_kernels" : "launch_graph", r.plan.step,
             is.host_begin, r.host_ns - is.host_begin, is.flow);
      }
      StreamState& s = r.streams[size_t(op.stream)];
      const int64_t first_arrival = eager && !is.items.empty() ? is.items[0].ready_ns : r.host_ns;
      const int64_t start = std::max({s.free_ns, first_arrival, s.dep_ns});
      const IdleSplit idle = split_idle(s.free_ns, start, is.host_begin, first_arrival);
      r.sample.idle_host_ns += idle.host;
      r.sample.idle_launch_ns += idle.launch;
      r.sample.idle_dep_ns += idle.dep;
      s.dep_ns = 0;
      is.next = 0;
      is.start = start;
      is.t = start;
      is.carry = 0;
      is.has_prev = false;
      is.waiting = false;
      is.done = false;
      is.seq.clear();
    }

    // Walk until every rank has run all its items. Collective instances are keyed by (group,
    // instance number); done_ns is set once every member has arrived: the latest arrival, plus
    // the cost, plus the late-arrival extra of the members' skew (latest - earliest,
    // CostModel::collective_skew_extra_ns), which every member spends inside the collective.
    struct Instance {
      int32_t arrived = 0;
      int64_t earliest = 0;
      int64_t latest = 0;
      int64_t cost = 0;
      int64_t done_ns = -1;
    };
    std::map<std::pair<int64_t, int32_t>, Instance> instances;
    size_t finished = 0;
    while (finished < n) {
      bool progress = false;
      for (size_t ri = 0; ri < n; ++ri) {
        Issued& is = issued_[ri];
        Rank& r = ranks_[ri];
        if (is.done) continue;
        while (is.next < is.items.size()) {
          const Item& item = is.items[is.next];
          if (!is.waiting) {
            // The compute part: eager items wait for their launch. Everything inside a launch's
            // span on the GPU is busy, node gaps and waits for a late eager launch call included:
            // what the real backend measures with one event pair per launch (docs/calibration.md,
            // "GPU busy inside a graph").
            const int64_t begin = std::max(is.t, item.ready_ns);
            const int64_t node_start =
                place_node(begin, item.gap_ns, is.carry, is.has_prev, is.prev_start);
            r.sample.gpu_busy_ns += node_start - is.t;
            r.sample.gpu_busy_ns += item.compute_ns;
            if (r.trace && item.name != nullptr && item.coll == nullptr) {
              span(int32_t(ri), Lane::kCompute, item.name, r.plan.step, node_start, item.compute_ns,
                   is.next == 0 ? is.flow : 0);
            }
            is.t = node_start + item.compute_ns;
            is.prev_start = node_start;
            is.has_prev = true;
            if (item.coll == nullptr) {
              ++is.next;
              progress = true;
              continue;
            }
            // The overlap left is taken before the collective: its arrival is the plain sum's.
            is.t += is.carry;
            r.sample.gpu_busy_ns += is.carry;
            is.carry = 0;
            is.has_prev = false;
            const int64_t group = collective_group(*item.coll, int32_t(ri));
            const int32_t number = is.seq[group]++;
            Instance& inst = instances[{group, number}];
            // PP transfers run beside the compute stream: a send is posted when its data is
            // ready and does not hold the stream; a receive is posted when the launch starts
            // (buffers are pre-posted), and the stream waits only until the data is in.
            const bool p2p = item.coll->coll == CollectiveKind::kSendRecv;
            const bool send = p2p && item.coll->bytes_written == 0;
            is.coll_arrival = is.t;
            const int64_t arrival = p2p && !send ? is.start : is.t;
            const bool in_graph = is.g->mode != GraphMode::kEager;
            inst.earliest = inst.arrived == 0 ? arrival : std::min(inst.earliest, arrival);
            inst.arrived += 1;
            inst.latest = std::max(inst.latest, arrival);
            inst.cost = std::max(inst.cost, cost_.collective_ns(*item.coll, in_graph));
            if (inst.arrived == group_size(*item.coll)) {
              inst.done_ns =
                  inst.latest + inst.cost +
                  cost_.collective_skew_extra_ns(*item.coll, in_graph, inst.latest - inst.earliest);
            }
            progress = true;
            if (send) {
              ++is.next;
              continue;
            }
            is.waiting = true;
          }
          const int64_t group = collective_group(*item.coll, int32_t(ri));
          const Instance& inst = instances[{group, is.seq[group] - 1}];
          if (inst.done_ns < 0) break;  // blocked until the group's last member arrives
          // Inside the launch's span all of it is GPU busy, as the real backend measures it
          // (one event pair per launch; the collective's kernel spins until its peers arrive):
          // the wait for the group's last member (a receive: for the data) is recorded apart.
          if (item.coll->coll == CollectiveKind::kSendRecv) {
            const int64_t wait = std::max<int64_t>(0, inst.done_ns - is.coll_arrival);
            r.sample.gpu_busy_ns += wait;
            r.sample.collective_ns += wait;
            r.sample.collective_wait_ns += wait;
          } else {
            r.sample.gpu_busy_ns += inst.done_ns - is.coll_arrival;
            r.sample.collective_ns += inst.done_ns - is.coll_arrival;
            r.sample.collective_wait_ns += inst.latest - is.coll_arrival;
          }
          const int64_t resume = std::max(is.t, inst.done_ns);
          if (r.trace && resume > is.coll_arrival) {
            // Named as the kernel (attn_all_reduce, moe_all_reduce, ...): the real backend's
            // profiled nodes carry the same names.
            span(int32_t(ri), Lane::kCompute, item.name, r.plan.step, is.coll_arrival,
                 resume - is.coll_arrival);
          }
          is.t = resume;
          is.waiting = false;
          ++is.next;
          progress = true;
        }
        if (is.next == is.items.size() && !is.waiting) {
          is.t += is.carry;  // the overlap left: the launch ends where the plain sum does
          r.sample.gpu_busy_ns += is.carry;
          is.carry = 0;
          is.done = true;
          ++finished;
          progress = true;
          r.streams[size_t(r.plan.ops[op_index].stream)].free_ns = is.t;
        }
      }
      if (!progress) {
        throw Error("simulator: collectives deadlocked in layout " + layout_name(options_.layout) +
                    " at step " + std::to_string(ranks_[0].plan.step) +
                    " (ranks wait on groups that never complete)");
      }
    }
  }

  void begin_plan(int32_t rank_id, Rank& r) {
    const Plan& plan = r.plan;
    r.trace = tracing(plan.step);
    OutputSlot& out = r.outputs[static_cast<size_t>(plan.step) % kOutputRing];
    out.step = plan.step;
    out.outputs.clear();
    bool commits = false;  // the plan launches work that commits tokens
    for (const GraphLaunch& g : plan.launches) {
      commits |= g.phase != Phase::kDraft && g.phase != Phase::kExtend;
    }
    out.draft_only = !plan.launches.empty() && !commits;
    r.out = &out;
    r.sample = r.has_carry ? r.carry : StepSample{};
    r.has_carry = false;
    r.sample.rank = rank_id;
    r.sample.step = plan.step;
    r.launched = false;
    r.active = false;
    for (const Op& op : plan.ops) {
      r.launched |= op.kind == OpKind::kLaunch;
      r.active |= op.kind == OpKind::kLaunch || op.kind == OpKind::kHostWork ||
                  op.kind == OpKind::kHostWait;
    }
  }

  void execute_local(int32_t rank_id, Rank& r, const Op& op) {
    const Plan& plan = r.plan;
    StepSample& sample = r.sample;
    const bool trace = r.trace;
    switch (op.kind) {
      case OpKind::kHostWork: {
        const int64_t d = r.host_costs.sample_ns(op.host_op, plan.step);
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
        assert(false && "launches are executed by launch_single / launch_coupled");
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
        const int64_t t_ev = event_time(r, op.event);
        const int64_t begin = r.host_ns;
        if (t_ev > r.host_ns) r.host_ns = t_ev + hw_.host_wake_ns;
        sample.host_wait_ns += r.host_ns - begin;
        if (trace && r.host_ns > begin) {
          span(rank_id, Lane::kHost, "wait", plan.step, begin, r.host_ns - begin);
        }
        if (op.payload_step >= 0) {
          const OutputSlot& o = r.outputs[static_cast<size_t>(op.payload_step) % kOutputRing];
          if (o.step != op.payload_step) {
            throw Error("simulator: outputs of step " + std::to_string(op.payload_step) +
                        " are no longer held (run-ahead deeper than the output ring)");
          }
          r.program->observe({op.payload_step, o.outputs, o.draft_only}, r.host_ns);
        }
        break;
      }
    }
  }

  void end_plan(int32_t /*rank_id*/, Rank& r) {
    if (!r.active) return;
    if (r.out->draft_only) {  // half a step (host_blocking): counted with the step it belongs to
      r.carry = r.sample;
      r.has_carry = true;
      return;
    }
    const int64_t end = r.launched ? r.streams[static_cast<size_t>(StreamId::kCompute)].free_ns
                                   : r.prev_step_end_ns;
    r.sample.end_ns = end;
    r.sample.dur_ns = end - r.prev_step_end_ns;
    r.prev_step_end_ns = end;
    record_.steps.push_back(r.sample);
  }

  const ModelSpec& model_;
  const ModelSpec& draft_;
  AcceptanceModel acceptance_;
  const HardwareSpec& hw_;
  const HostCostModel& host_costs_;
  const std::vector<RequestSpec>& requests_;
  const SimOptions& options_;
  const CostModel& cost_;
  RunRecord& record_;
  int32_t width_;
  // pdl_node_gap_by_rows / graph_node_gap_by_rows keys of the target and the draft: a measured TP
  // shard where there is one
  // (policies/calibration_model.h), else the model.
  std::string gap_model_, gap_draft_;
  // *_break_gap_by_rows keys: the TP shard's label under tensor parallelism alone (break gaps are
  // measured on TP shards only), else "" (no entry: the earlier rule).
  std::string break_model_, break_draft_;
  // The label whose speculative graph residuals price this run's spec launches: the model on one
  // GPU, its shard "<model>@tp<N>" for tensor parallelism alone (every rank the same shard);
  // empty where the profile has none (spec_residual_model).
  std::string spec_model_;
  // The KV capacity of the engine the real backend builds for these requests (policies/
  // kv_capacity.h): the attention's split size follows it, and a speculative launch's residual
  // takes the corrections measured at the split size nearest its own.
  int32_t kv_capacity_;
  bool model_moe_;  // the target has MoE layers (a verify's routed positions change its price)
  std::vector<Rank> ranks_;
  std::vector<Issued> issued_;
  std::vector<int64_t> lengths_;  // pipeline_lengths of the rank being issued
  std::priority_queue<Resume, std::vector<Resume>, std::greater<Resume>> queue_;
  uint64_t seq_ = 0;
  int64_t flow_ = 0;
  StepKernels kernels_;
  int32_t repeat_ = 1;  // forward passes of kernels_ in the launch being executed
  std::unordered_map<uint64_t, DecodeCost> decode_costs_;
  std::map<std::tuple<bool, bool, bool, int32_t, int32_t, int32_t, int64_t, int64_t>,
           SegmentTemplate>
      templates_;
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
      draft_(nextn_draft(model)),
      // The target's kernel fits for its shard on this layout. The draft (NEXTN) module runs
      // the same kernel names at the target's layer shapes and is priced by the same fits; no
      // calibration measures a draft alone.
      cost_(hw, kernel_fit_model(hw, model.name, options.layout.width(), model.fusion),
            attention_fit_model(hw, model, options.layout)) {}

void SimBackend::run(std::span<HostProgram* const> ranks, RunRecord& record) {
  Engine engine(model_, draft_, hw_, host_costs_, requests_, options_, cost_, record);
  engine.run(ranks);
}

}  // namespace twinstep
