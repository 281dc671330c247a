#include "simulator/sim_backend.h"

#include <gtest/gtest.h>

#include "policies/decode_loop.h"
#include "policies/rng.h"
#include "tests/support/recording_backend.h"
#include "tests/support/sim_fixtures.h"

namespace twinstep {
namespace {

using testing::ideal_machine;
using testing::kFloorNs;
using testing::kUs;
// tiny-llama decode: embedding + 2 layers × 10 kernels + final norm + lm_head = 23 nodes, each
// at the kernel floor on the ideal machine: G = 230 µs.
constexpr int64_t kGpuStepNs = 23 * kFloorNs;

struct SimRun {
  RunRecord record;
  // Decode steps away from the start and the end of the run.
  std::vector<StepSample> steady() const {
    std::vector<StepSample> s;
    for (size_t i = 5; i + 5 < record.steps.size(); ++i)
      if (record.steps[i].batch > 0) s.push_back(record.steps[i]);
    return s;
  }
};

SimRun simulate(HostSchedule schedule, const HostCostSpec& costs, const HardwareSpec& hw,
                bool seq_lens_sync = false, int32_t output_len = 200,
                GraphMode graph_mode = GraphMode::kCudaGraph, int32_t requests = 1,
                const ModelSpec& model = model_preset("tiny-llama")) {
  PolicySpec policy;
  policy.host_schedule = schedule;
  policy.graph_mode = graph_mode;
  policy.seq_lens_sync = seq_lens_sync;
  WorkloadSpec w;
  w.input_len = {64, 64};
  w.output_len = {output_len, output_len};
  w.num_requests = requests;
  w.max_concurrency = requests;
  const std::vector<RequestSpec> reqs = generate_requests(w);
  SimRun run;
  DecodeLoop loop(policy, w, reqs, &run.record);
  HostCostModel host(costs, 1);
  SimBackend backend(model, hw, host, reqs);
  HostProgram* ranks[] = {&loop};
  backend.run(ranks, run.record);
  return run;
}

HostCostSpec host_costs(int64_t schedule_ns, int64_t prepare_ns, int64_t process_ns) {
  return testing::fixed_host_costs(schedule_ns, prepare_ns, process_ns);
}

TEST(SimBackend, ZeroHostCostSchedulesAgree) {
  const HardwareSpec hw = ideal_machine();
  for (HostSchedule s : {HostSchedule::kLockstep, HostSchedule::kRunahead}) {
    for (const StepSample& st : simulate(s, host_costs(0, 0, 0), hw).steady()) {
      EXPECT_EQ(st.dur_ns, kGpuStepNs) << host_schedule_name(s) << " step " << st.step;
      EXPECT_EQ(st.gpu_busy_ns, kGpuStepNs);
    }
  }
}

TEST(SimBackend, LockstepPaysHostPlusGpuRunaheadPaysTheMax) {
  const HardwareSpec hw = ideal_machine();
  // H = 30 + 40 + 30 = 100 µs < G = 230 µs, then H = 400 µs > G.
  for (int64_t h_us : {100, 400}) {
    const HostCostSpec c = host_costs(30 * kUs, (h_us - 60) * kUs, 30 * kUs);
    const int64_t h = h_us * kUs;
    for (const StepSample& st : simulate(HostSchedule::kLockstep, c, hw).steady()) {
      EXPECT_EQ(st.dur_ns, h + kGpuStepNs) << "lockstep H=" << h_us;
      EXPECT_EQ(st.idle_host_ns, h);
    }
    for (const StepSample& st : simulate(HostSchedule::kRunahead, c, hw).steady()) {
      EXPECT_EQ(st.dur_ns, std::max(h, kGpuStepNs)) << "runahead H=" << h_us;
      EXPECT_EQ(st.idle_host_ns, std::max<int64_t>(0, h - kGpuStepNs));
    }
  }
}

TEST(SimBackend, SpikeBeyondSlackIsGpuIdleInRunaheadAndPaidInLockstep) {
  const HardwareSpec hw = ideal_machine();
  HostCostSpec c = host_costs(30 * kUs, 40 * kUs, 30 * kUs);  // H = 100 µs, slack 130 µs
  const int64_t extra = 500 * kUs;
  c.spikes.push_back(
      {.op = HostOp::kProcessOutputs, .every_steps = 20, .phase_step = 10, .extra_ns = extra});
  const int64_t slack = kGpuStepNs - 100 * kUs;

  const SimRun ra = simulate(HostSchedule::kRunahead, c, hw);
  int64_t spikes = 0, idle = 0;
  for (const StepSample& st : ra.steady()) {
    spikes += st.host_ns[size_t(HostOp::kProcessOutputs)] > 30 * kUs;
    idle += st.idle_host_ns;
  }
  ASSERT_GT(spikes, 5);
  EXPECT_EQ(idle, spikes * (extra - slack));

  const SimRun ls = simulate(HostSchedule::kLockstep, c, hw);
  int64_t ls_spikes = 0, ls_dur = 0, n = 0;
  for (const StepSample& st : ls.steady()) {
    ls_spikes += st.host_ns[size_t(HostOp::kProcessOutputs)] > 30 * kUs;
    ls_dur += st.dur_ns;
    ++n;
  }
  // The spike in step k's processing delays step k+1 by its whole length.
  EXPECT_NEAR(double(ls_dur), double(n * (100 * kUs + kGpuStepNs) + ls_spikes * extra),
              double(extra));
}

TEST(SimBackend, SeqLensSyncPinsRunaheadToGpuPlusPrepare) {
  const HardwareSpec hw = ideal_machine();
  const HostCostSpec c = host_costs(30 * kUs, 40 * kUs, 30 * kUs);
  for (const StepSample& st : simulate(HostSchedule::kRunahead, c, hw, true).steady()) {
    EXPECT_EQ(st.dur_ns, kGpuStepNs + 40 * kUs);
    EXPECT_EQ(st.idle_host_ns, 40 * kUs);
  }
}

TEST(SimBackend, GraphNodeGapsArePartOfTheLaunchSpanAndBusy) {
  // docs/calibration.md, "GPU busy inside a graph": the real backend times a launch with one
  // event pair, so a graph's node gaps are GPU busy in both backends.
  HardwareSpec hw = ideal_machine();
  hw.graph_node_gap_ns = 1 * kUs;
  for (const StepSample& st : simulate(HostSchedule::kRunahead, host_costs(0, 0, 0), hw).steady()) {
    EXPECT_EQ(st.dur_ns, kGpuStepNs + 23 * kUs);
    EXPECT_EQ(st.idle_launch_ns, 0);
    EXPECT_EQ(st.gpu_busy_ns, kGpuStepNs + 23 * kUs);
    EXPECT_EQ(st.gpu_busy_ns + st.idle_host_ns + st.idle_launch_ns + st.idle_dep_ns, st.dur_ns);
  }
}

// ModelSpec::fusion (policies.fusion) on the ideal machine, where every kernel costs the floor:
// tiny-llama's 23-node decode step (2 layers) loses 3 norms with carried norms (the first
// layer's attn_norm stays, as the sums-of-squares kernel), 4 kernels with the rope fused (rope and
// kv_append per layer), 7 with both; 32 requests (bucket 32, over 16 rows) keep their norms.
TEST(SimBackend, KernelFusionRemovesTheFusedKernelsFromTheStep) {
  const HardwareSpec hw = ideal_machine();
  struct Case {
    bool norms, rope;
    int32_t requests;
    int64_t nodes;
  };
  for (const Case& c : {Case{true, false, 1, 20}, Case{false, true, 1, 19}, Case{true, true, 1, 16},
                        Case{true, false, 32, 23}, Case{true, true, 32, 19}}) {
    ModelSpec m = model_preset("tiny-llama");
    m.fusion.norms = c.norms;
    m.fusion.rope = c.rope;
    const SimRun run = simulate(HostSchedule::kRunahead, host_costs(0, 0, 0), hw, false, 60,
                                GraphMode::kCudaGraph, c.requests, m);
    const std::vector<StepSample> steady = run.steady();
    ASSERT_FALSE(steady.empty());
    for (const StepSample& st : steady)
      EXPECT_EQ(st.dur_ns, c.nodes * kFloorNs)
          << "norms " << c.norms << " rope " << c.rope << " requests " << c.requests;
  }
}

TEST(SimBackend, NodeGapByModelAndRowsAndANegativeGapShortensTheSpan) {
  // tiny-llama's decode step: 23 nodes, one request (1 row).
  HardwareSpec hw = ideal_machine();
  hw.pdl_node_gap_ns = 2 * kUs;
  auto steady_pdl = [&] {
    return simulate(HostSchedule::kRunahead, host_costs(0, 0, 0), hw, false, 200,
                    GraphMode::kCudaGraphPdl)
        .steady();
  };
  for (const StepSample& st : steady_pdl()) {  // no table: the scalar gap
    EXPECT_EQ(st.dur_ns, kGpuStepNs + 23 * 2 * kUs);
    EXPECT_EQ(st.gpu_busy_ns, st.dur_ns);
  }
  hw.pdl_node_gap_by_rows = {{"other-model", 1, 5 * kUs}, {"tiny-llama", 1, -100}};
  for (const StepSample& st : steady_pdl()) {  // its own entry: an overlap of 100 ns a node
    EXPECT_EQ(st.dur_ns, kGpuStepNs - 23 * 100);
    EXPECT_EQ(st.gpu_busy_ns, kGpuStepNs - 23 * 100);
    EXPECT_EQ(st.idle_launch_ns, 0);
  }
  hw.pdl_node_gap_by_rows = {{"tiny-llama", 1, -100}};
  hw.pdl_node_gap_by_rows.front().rows = 0;  // 1 row is above the last entry: the last applies
  for (const StepSample& st : steady_pdl()) EXPECT_EQ(st.dur_ns, kGpuStepNs - 23 * 100);

  // Plain graph mode: the scalar gap, then the model's entry for its rows; the PDL table plays
  // no part there.
  hw.graph_node_gap_ns = 1 * kUs;
  auto steady_graph = [&] {
    return simulate(HostSchedule::kRunahead, host_costs(0, 0, 0), hw, false, 200,
                    GraphMode::kCudaGraph)
        .steady();
  };
  for (const StepSample& st : steady_graph()) EXPECT_EQ(st.dur_ns, kGpuStepNs + 23 * kUs);
  hw.graph_node_gap_by_rows = {{"other-model", 1, 5 * kUs}, {"tiny-llama", 1, 3 * kUs}};
  for (const StepSample& st : steady_graph()) {
    EXPECT_EQ(st.dur_ns, kGpuStepNs + 23 * 3 * kUs);
    EXPECT_EQ(st.gpu_busy_ns, st.dur_ns);
  }
}

// A decode launch runs every row of its batch bucket (Engine::bucket_for): 3 requests cost what 4
// do, 5 what 8 do. By hand on the ideal machine with attention priced 1 us per request (a fit of
// base 0, ns_per_request 1000; no floor for a fitted class): 21 other nodes at the 10 us floor +
// 2 layers x 1 us x bucket.
TEST(SimBackend, DecodeIsPricedAtTheBatchBucket) {
  HardwareSpec hw = ideal_machine();
  KernelFit& attn = hw.kernel_fits[size_t(KernelClass::kAttention)];
  attn.fitted = true;
  attn.ns_per_request = 1000;
  for (const auto& [requests, bucket] : {std::pair{3, 4}, std::pair{4, 4}, std::pair{5, 8}}) {
    const SimRun run = simulate(HostSchedule::kRunahead, host_costs(0, 0, 0), hw, false, 100,
                                GraphMode::kCudaGraph, requests);
    int checked = 0;
    for (const StepSample& st : run.record.steps) {
      if (st.batch != requests || st.prefills > 0) continue;
      EXPECT_EQ(st.dur_ns, 21 * kFloorNs + 2 * 1000 * bucket) << requests << " requests";
      ++checked;
    }
    EXPECT_GT(checked, 50) << requests << " requests";
  }
}

TEST(SimBackend, EagerLaunchSlowerThanKernelsStretchesTheLaunchSpan) {
  HardwareSpec hw = ideal_machine();
  hw.eager_launch_ns = 15 * kUs;  // longer than the 10 µs kernels
  PolicySpec policy;
  const HostCostSpec c = host_costs(0, 0, 0);
  policy.graph_mode = GraphMode::kEager;
  WorkloadSpec w;
  w.input_len = {64, 64};
  w.output_len = {50, 50};
  const std::vector<RequestSpec> requests = generate_requests(w);
  RunRecord record;
  DecodeLoop loop(policy, w, requests, &record);
  HostCostModel host(c, 1);
  SimBackend backend(model_preset("tiny-llama"), hw, host, requests);
  HostProgram* ranks[] = {&loop};
  backend.run(ranks, record);
  // Each host iteration issues 23 kernel launches and one copy, 15 µs each: 360 µs per step.
  // The first kernel of a step waits 5 µs for the host to finish the copy call (host-bound) and
  // 15 µs for its own launch (launch-bound). Kernel i > 1 starts when its launch lands, 5 µs
  // after kernel i-1 ended: inside the launch's span, which the real backend measures with one
  // event pair, so GPU busy.
  for (size_t i = 5; i + 5 < record.steps.size(); ++i) {
    const StepSample& st = record.steps[i];
    EXPECT_EQ(st.dur_ns, 24 * 15 * kUs);
    EXPECT_EQ(st.gpu_busy_ns, kGpuStepNs + 22 * 5 * kUs);
    EXPECT_EQ(st.idle_host_ns, 5 * kUs);
    EXPECT_EQ(st.idle_launch_ns, 15 * kUs);
  }
}

TEST(SimBackend, EagerKernelsQueuedAheadAreSeparatedByTheEagerNodeGap) {
  // The host launches 23 kernels and one copy per step at 1 µs each (24 µs), far ahead of the
  // 230 µs of kernels: every kernel is queued before its predecessor ends, so it starts one
  // eager node gap (3 µs) after it; graph launches would use the 0.5 µs graph gap instead.
  HardwareSpec hw = ideal_machine();
  hw.eager_launch_ns = 1 * kUs;
  hw.eager_node_gap_ns = 3 * kUs;
  hw.graph_node_gap_ns = kUs / 2;
  const SimRun eager =
      simulate(HostSchedule::kRunahead, host_costs(0, 0, 0), hw, false, 200, GraphMode::kEager);
  ASSERT_FALSE(eager.steady().empty());
  for (const StepSample& st : eager.steady()) {
    EXPECT_EQ(st.dur_ns, kGpuStepNs + 23 * 3 * kUs);
    // The first kernel's gap is before the launch's span (launch-bound idle); the other 22 are
    // inside it (busy, as the real backend's event pair measures it).
    EXPECT_EQ(st.gpu_busy_ns, kGpuStepNs + 22 * 3 * kUs);
    EXPECT_EQ(st.idle_launch_ns, 3 * kUs);
    EXPECT_EQ(st.idle_host_ns, 0);
  }
  for (const StepSample& st : simulate(HostSchedule::kRunahead, host_costs(0, 0, 0), hw).steady())
    EXPECT_EQ(st.dur_ns, kGpuStepNs + 23 * kUs / 2);
  // The model's measured eager gap for its rows replaces the scalar one (other models' entries
  // play no part).
  hw.eager_node_gap_by_rows = {{"other-model", 1, 9 * kUs}, {"tiny-llama", 1, 4 * kUs}};
  for (const StepSample& st :
       simulate(HostSchedule::kRunahead, host_costs(0, 0, 0), hw, false, 200, GraphMode::kEager)
           .steady())
    EXPECT_EQ(st.dur_ns, kGpuStepNs + 23 * 4 * kUs);
}

// Plans are data: the simulator issues exactly the operation sequence the policy decided, the
// same sequence a zero-time recording backend sees.
class PlanLogger final : public HostProgram {
 public:
  explicit PlanLogger(HostProgram& inner) : inner_(inner) {}
  std::vector<std::vector<std::string>> plans;
  bool next_plan(int64_t now, Plan& plan) override {
    if (!inner_.next_plan(now, plan)) return false;
    std::vector<std::string>& log = plans.emplace_back();
    for (const Op& op : plan.ops) log.push_back(testing::describe(plan, op));
    return true;
  }
  void observe(const StepOutputs& o, int64_t now) override { inner_.observe(o, now); }
  void host_work_done(HostOp op, int64_t step, int64_t now) override {
    inner_.host_work_done(op, step, now);
  }

 private:
  HostProgram& inner_;
};

TEST(SimBackend, SameOperationSequenceAsRecordingBackend) {
  for (HostSchedule s : {HostSchedule::kLockstep, HostSchedule::kRunahead}) {
    PolicySpec policy;
    policy.host_schedule = s;
    WorkloadSpec w;
    w.input_len = {32, 96};
    w.output_len = {5, 40};
    w.num_requests = 12;
    w.max_concurrency = 4;
    w.seed = 5;
    const std::vector<RequestSpec> requests = generate_requests(w);

    RunRecord sim_record, rec_record;
    DecodeLoop sim_loop(policy, w, requests, &sim_record),
        rec_loop(policy, w, requests, &rec_record);
    PlanLogger sim_log(sim_loop), rec_log(rec_loop);
    HostCostModel host(host_costs(30 * kUs, 40 * kUs, 30 * kUs), 1);
    SimBackend sim(model_preset("tiny-llama"), hardware_preset("h200"), host, requests);
    HostProgram* a[] = {&sim_log};
    sim.run(a, sim_record);
    testing::RecordingBackend rec;
    HostProgram* b[] = {&rec_log};
    rec.run(b, rec_record);
    EXPECT_EQ(sim_log.plans, rec_log.plans) << host_schedule_name(s);
    EXPECT_GT(sim_log.plans.size(), 50u);
  }
}

TEST(SimBackend, SameSeedSameRecord) {
  HostCostSpec c;
  c.ops[size_t(HostOp::kPrepareDecode)] = {DistKind::kLognormal, 200 * kUs, 80 * kUs};
  c.spikes.push_back({.op = HostOp::kSchedule, .probability = 0.02, .extra_ns = 3000 * kUs});
  auto once = [&](uint64_t seed) {
    PolicySpec policy;
    WorkloadSpec w;
    w.input_len = {100, 2000};
    w.output_len = {10, 300};
    w.num_requests = 30;
    w.max_concurrency = 4;
    w.arrival_rate_per_s = 50;
    w.seed = seed;
    const std::vector<RequestSpec> requests = generate_requests(w);
    RunRecord r;
    DecodeLoop loop(policy, w, requests, &r);
    HostCostModel host(c, seed);
    SimBackend backend(model_preset("llama-3-8b"), hardware_preset("h200"), host, requests);
    HostProgram* ranks[] = {&loop};
    backend.run(ranks, r);
    std::string s;
    for (const StepSample& st : r.steps)
      s += std::to_string(st.step) + "," + std::to_string(st.end_ns) + "," +
           std::to_string(st.gpu_busy_ns) + "," + std::to_string(st.idle_host_ns) + "," +
           std::to_string(st.host_wait_ns) + ";";
    for (const ChunkSample& ch : r.chunks) s += std::to_string(ch.t_ns) + ";";
    return s;
  };
  EXPECT_EQ(once(9), once(9));
  EXPECT_NE(once(9), once(10));
}

// step_capacity_hint (workload.h) bounds the steps a closed loop takes, over random workloads,
// concurrencies and host schedules, and tight: at most the run's steps plus two per request (a
// step commits at most one token per running request) and the margin.
TEST(SimBackend, StepCapacityHintBoundsTheSteps) {
  const ModelSpec model = model_preset("tiny-llama");
  const HardwareSpec hw = ideal_machine();
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    WorkloadSpec w;
    w.num_requests = 1 + int32_t(rng_uniform(seed, 1, 0) * 12);
    w.max_concurrency = 1 + int32_t(rng_uniform(seed, 2, 0) * w.num_requests);
    const int32_t lo = 1 + int32_t(rng_uniform(seed, 3, 0) * 60);
    w.output_len = seed % 3 == 0 ? LengthDist{lo, lo} : LengthDist{lo, lo + 90};
    w.input_len = {16, 400};
    w.seed = seed;
    PolicySpec policy;
    policy.host_schedule = seed % 2 ? HostSchedule::kRunahead : HostSchedule::kLockstep;
    const std::vector<RequestSpec> reqs = generate_requests(w);
    RunRecord r;
    DecodeLoop loop(policy, w, reqs, &r);
    HostCostModel host(host_costs(20 * kUs, 50 * kUs, 30 * kUs), seed);
    SimBackend backend(model, hw, host, reqs);  // holds references: named, not temporaries
    HostProgram* ranks[] = {&loop};
    backend.run(ranks, r);
    const int64_t hint = step_capacity_hint(w, reqs);
    EXPECT_LE(int64_t(r.steps.size()), hint) << "seed " << seed << ": " << w.num_requests
                                             << " requests at concurrency " << w.max_concurrency;
    // A step commits at most one token per running request: steps >= sum(output_len) / c.
    EXPECT_LE(hint - int64_t(r.steps.size()), 2 * w.num_requests + 65) << "seed " << seed;
  }
}

}  // namespace
}  // namespace twinstep

namespace twinstep {
namespace {

// Pricing a decode graph as a whole (context-affine cache) and node by node (tracing) agree to
// the nanosecond, for dense, MoE and hybrid models across batch sizes.
TEST(SimBackend, TracingDoesNotChangeTimes) {
  for (const char* model : {"llama-3-8b", "qwen3-30b-a3b", "ling-flash-like"}) {
    auto once = [&](int64_t trace_steps) {
      PolicySpec policy;
      WorkloadSpec w;
      w.input_len = {100, 3000};
      w.output_len = {20, 60};
      w.num_requests = 16;
      w.max_concurrency = 5;
      w.seed = 3;
      const std::vector<RequestSpec> requests = generate_requests(w);
      RunRecord r;
      DecodeLoop loop(policy, w, requests, &r);
      HostCostModel host(host_costs(30 * kUs, 40 * kUs, 30 * kUs), 1);
      SimOptions options;
      options.trace_steps = trace_steps;
      SimBackend backend(model_preset(model), hardware_preset("h200"), host, requests, options);
      HostProgram* ranks[] = {&loop};
      backend.run(ranks, r);
      return r;
    };
    const RunRecord plain = once(0), traced = once(1'000'000);
    ASSERT_EQ(plain.steps.size(), traced.steps.size());
    EXPECT_TRUE(plain.timeline.empty());
    EXPECT_GT(traced.timeline.size(), plain.steps.size() * 10);
    for (size_t i = 0; i < plain.steps.size(); ++i) {
      EXPECT_EQ(plain.steps[i].end_ns, traced.steps[i].end_ns) << model << " step " << i;
      EXPECT_EQ(plain.steps[i].gpu_busy_ns, traced.steps[i].gpu_busy_ns) << model;
      EXPECT_EQ(plain.steps[i].bytes_read, traced.steps[i].bytes_read) << model;
    }
  }
}

}  // namespace
}  // namespace twinstep
