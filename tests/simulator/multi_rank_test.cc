#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "policies/decode_loop.h"
#include "policies/error.h"
#include "policies/layout.h"
#include "simulator/sim_backend.h"
#include "tests/support/sim_fixtures.h"

namespace twinstep {
namespace {

using testing::kFloorNs;
using testing::kUs;

// One DecodeLoop per rank (rank 0 records), run on the simulator.
RunRecord simulate_layout(const ModelSpec& model, const LayoutSpec& layout, const WorkloadSpec& w,
                          const HardwareSpec& hw, const HostCostSpec& costs = HostCostSpec{},
                          int64_t trace_steps = 0, const PolicySpec& policy = PolicySpec{}) {
  const std::vector<RequestSpec> requests = generate_requests(w);
  RunRecord record;
  std::vector<RunRecord> shadow(size_t(layout.world()));
  std::vector<std::unique_ptr<DecodeLoop>> loops;
  std::vector<HostProgram*> ranks;
  for (int32_t r = 0; r < layout.world(); ++r) {
    loops.push_back(
        std::make_unique<DecodeLoop>(policy, w, requests, r == 0 ? &record : &shadow[size_t(r)]));
    ranks.push_back(loops.back().get());
  }
  HostCostModel host(costs, 1);
  SimOptions options;
  options.layout = layout;
  options.trace_steps = trace_steps;
  options.spec = policy.spec;
  SimBackend backend(model, hw, host, requests, options);
  backend.run(ranks, record);
  return record;
}

struct MultiRun {
  RunRecord record;
  std::map<int64_t, std::vector<StepSample>> by_step;  // step -> per-rank samples
};

MultiRun simulate(const LayoutSpec& layout, const HostCostSpec& costs, const HardwareSpec& hw,
                  int32_t output_len = 120) {
  WorkloadSpec w;
  w.input_len = {64, 64};
  w.output_len = {output_len, output_len};
  MultiRun m;
  m.record = simulate_layout(model_preset("tiny-llama"), layout, w, hw, costs);
  for (const StepSample& s : m.record.steps) m.by_step[s.step].push_back(s);
  return m;
}

// Per rank: the compute nodes at the floor plus every collective's cost, nothing else.
int64_t expected_step_ns(const LayoutSpec& layout, const HardwareSpec& hw) {
  StepKernels k;
  step_kernels(model_preset("tiny-llama"), decode_shape(1, 1, 100), layout, 0, k);
  const CostModel cost(hw);
  int64_t ns = 0;
  for (const LayerRun& run : k.runs) {
    for (int32_t i = run.first; i < run.first + run.count; ++i) {
      const KernelDesc& d = k.kernels[size_t(i)];
      ns += run.repeat * (d.cls == KernelClass::kCollective ? cost.collective_ns(d) : kFloorNs);
    }
  }
  return ns;
}

TEST(MultiRank, SymmetricTensorParallelSteps) {
  const HardwareSpec hw = testing::ideal_machine();
  const LayoutSpec tp2 = parse_layout("TP2");
  const MultiRun m = simulate(tp2, testing::fixed_host_costs(0, 0, 0), hw);
  const int64_t want = expected_step_ns(tp2, hw);
  int checked = 0;
  for (const auto& [step, samples] : m.by_step) {
    if (step < 5 || step > 100) continue;
    ASSERT_EQ(samples.size(), 2u);
    for (const StepSample& s : samples) {
      EXPECT_EQ(s.dur_ns, want) << "step " << step << " rank " << s.rank;
      EXPECT_EQ(s.idle_dep_ns, 0);
      EXPECT_EQ(s.collective_wait_ns, 0);  // nobody waits for anybody
      EXPECT_GT(s.collective_ns, 0);
      EXPECT_EQ(s.gpu_busy_ns, s.dur_ns);  // the collectives' cost is GPU busy
      EXPECT_EQ(s.gpu_busy_ns + s.idle_host_ns + s.idle_launch_ns + s.idle_dep_ns, s.dur_ns);
    }
    ++checked;
  }
  EXPECT_GT(checked, 50);
  // Two all-reduces per layer (attention and MLP) of hidden·2 B, plus the LM head's argmax
  // all-gather: the collectives of a step are priced into the step, not added twice.
  EXPECT_GT(want, 23 * kFloorNs / 2);
}

// The seed's observation: a late rank's host jitter shows up as a long collective on the
// others. One rank of four gets a 2 ms host spike every 10 steps; with a 100 µs host loop and
// a GPU step of a few hundred µs the spike exceeds the slack, so that rank launches late; the
// other ranks wait for it in the step's first collective, and every rank ends the step together.
// The late rank's GPU is idle (host-bound); the others are busy in the collective, as a real
// profile shows it (a spinning all-reduce), and the wait is their collective_wait_ns.
TEST(MultiRank, LateRankSkewIsAbsorbedByTheOthersCollectives) {
  const HardwareSpec hw = testing::ideal_machine();
  const LayoutSpec tp4 = parse_layout("TP4");
  HostCostSpec costs = testing::fixed_host_costs(30 * kUs, 40 * kUs, 30 * kUs);
  const int64_t extra = 2000 * kUs;
  costs.spikes.push_back({.op = HostOp::kProcessOutputs,
                          .rank = 2,
                          .every_steps = 10,
                          .phase_step = 5,
                          .extra_ns = extra});
  const MultiRun m = simulate(tp4, costs, hw);
  const int64_t g = expected_step_ns(tp4, hw);
  const int64_t late = extra - (g - 100 * kUs);  // spike beyond the slack
  ASSERT_GT(late, 0);
  int spiked_steps = 0;
  for (const auto& [step, samples] : m.by_step) {
    if (step < 5 || step > 100) continue;
    ASSERT_EQ(samples.size(), 4u);
    for (const StepSample& s : samples) EXPECT_EQ(s.end_ns, samples[0].end_ns) << step;
    for (const StepSample& s : samples) {
      EXPECT_EQ(s.idle_dep_ns, 0) << step;
      EXPECT_EQ(s.gpu_busy_ns + s.idle_host_ns + s.idle_launch_ns, s.dur_ns) << step;
    }
    if (samples[2].idle_host_ns == 0) {
      for (const StepSample& s : samples) EXPECT_EQ(s.collective_wait_ns, 0) << step;
      continue;
    }
    ++spiked_steps;
    EXPECT_EQ(samples[2].idle_host_ns, late) << step;
    EXPECT_EQ(samples[2].collective_wait_ns, 0) << step;
    for (int r : {0, 1, 3}) {
      EXPECT_EQ(samples[size_t(r)].collective_wait_ns, late) << "rank " << r << " step " << step;
      EXPECT_EQ(samples[size_t(r)].idle_host_ns, 0);
      EXPECT_EQ(samples[size_t(r)].gpu_busy_ns, samples[size_t(r)].dur_ns);
      EXPECT_EQ(samples[size_t(r)].dur_ns, samples[2].dur_ns);
    }
  }
  EXPECT_GE(spiked_steps, 8);
}

// Coupled ranks must decide the same plans; a program that does not is reported, not run.
class Divergent final : public HostProgram {
 public:
  explicit Divergent(int32_t rank) : rank_(rank) {}
  bool next_plan(int64_t, Plan& plan) override {
    plan.step = 0;
    plan.host_work(rank_ == 0 ? HostOp::kSchedule : HostOp::kPrepareDecode);
    plan.record(StreamId::kCompute, rank_);
    return calls_++ == 0;
  }
  void observe(const StepOutputs&, int64_t) override {}
  void host_work_done(HostOp, int64_t, int64_t) override {}

 private:
  int32_t rank_;
  int calls_ = 0;
};

TEST(MultiRank, DivergentPlansAreAnError) {
  Divergent a(0), b(1);
  HostProgram* ranks[] = {&a, &b};
  SimOptions options;
  options.layout = parse_layout("TP2");
  const std::vector<RequestSpec> none;
  HostCostModel host(HostCostSpec{}, 1);
  SimBackend backend(model_preset("tiny-llama"), hardware_preset("h200"), host, none, options);
  RunRecord record;
  try {
    backend.run(ranks, record);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different plans at step 0"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace twinstep

namespace twinstep {
namespace {

// Segment pricing (context-affine templates) and the node-by-node walk of traced steps agree to
// the nanosecond on coupled ranks, for TP, EP and pipelined (microbatched) layouts with node gaps.
TEST(MultiRank, TracingDoesNotChangeTimes) {
  for (const char* layout_name : {"TP2", "TP4", "PP2-TP2", "PP4"}) {
    for (const char* model : {"llama-3-8b", "qwen3-30b-a3b"}) {
      auto once = [&](int64_t trace_steps) {
        WorkloadSpec w;
        w.input_len = {100, 3000};
        w.output_len = {20, 40};
        w.num_requests = 6;
        w.max_concurrency = 3;
        w.seed = 3;
        return simulate_layout(
            model_preset(model), parse_layout(layout_name), w, hardware_preset("h200"),
            testing::fixed_host_costs(30 * kUs, 40 * kUs, 30 * kUs), trace_steps);
      };
      const RunRecord plain = once(0), traced = once(1'000'000);
      ASSERT_EQ(plain.steps.size(), traced.steps.size());
      EXPECT_GT(traced.timeline.size(), plain.steps.size() * 10);
      for (size_t i = 0; i < plain.steps.size(); ++i) {
        const StepSample& a = plain.steps[i];
        const StepSample& b = traced.steps[i];
        EXPECT_EQ(a.end_ns, b.end_ns) << layout_name << " " << model << " step " << i;
        EXPECT_EQ(a.gpu_busy_ns, b.gpu_busy_ns) << layout_name << " " << model;
        EXPECT_EQ(a.idle_launch_ns, b.idle_launch_ns) << layout_name << " " << model;
        EXPECT_EQ(a.collective_ns, b.collective_ns) << layout_name << " " << model;
        EXPECT_EQ(a.bytes_read, b.bytes_read) << layout_name << " " << model;
      }
    }
  }
}

}  // namespace
}  // namespace twinstep

namespace twinstep {
namespace {

// ---- Pipeline parallelism ---------------------------------------------------------------------

// One microbatch on stage `stage` with every kernel at the floor: its nodes, plus the
// collectives within the stage (TP all-reduces) at their cost; pipeline transfers excluded.
int64_t stage_ns(const ModelSpec& m, const LayoutSpec& l, const HardwareSpec& hw, int32_t stage,
                 const StepShape& s) {
  StepKernels k;
  step_kernels(m, s, l, stage * l.width(), k);
  const CostModel cost(hw);
  int64_t ns = 0;
  for (const LayerRun& run : k.runs) {
    for (int32_t i = run.first; i < run.first + run.count; ++i) {
      const KernelDesc& d = k.kernels[size_t(i)];
      if (d.cls != KernelClass::kCollective) {
        ns += run.repeat * kFloorNs;
      } else if (d.coll != CollectiveKind::kSendRecv) {
        ns += run.repeat * cost.collective_ns(d);
      }
    }
  }
  return ns;
}

// Every kernel at the floor; point-to-point transfers cost exactly their α (bandwidth unbounded).
HardwareSpec pipeline_machine(int64_t p2p_alpha_ns) {
  HardwareSpec hw = testing::ideal_machine();
  hw.interconnect_gbps = 1e12;
  hw.p2p_alpha_ns = p2p_alpha_ns;
  return hw;
}

ModelSpec eight_layer_llama() {
  ModelSpec m = model_preset("tiny-llama");
  m.layers.assign(8, m.layers[0]);
  return m;
}

// A pp-stage pipeline of m microbatches whose stage s takes t_s: the last stage finishes
// microbatch m − 1 at Σ t_s + (m − 1)·max t_s plus one hidden-state transfer per stage boundary
// (α each); the sampled ids then return to stage 0 (α), which starts the next step. With equal
// t_s = t that is (m + pp − 1)·t, and a stage idles (pp − 1)/(m + pp − 1) of the step.
TEST(Pipeline, DecodeStepIsTheMicrobatchPipelineMakespan) {
  const ModelSpec model = eight_layer_llama();
  const int64_t alpha = 7 * kUs;
  const HardwareSpec hw = pipeline_machine(alpha);
  struct Case {
    const char* layout;
    int32_t microbatches;  // 0: auto (pp)
    int32_t batch;
    int32_t want_m;
  };
  for (const Case c : {Case{"PP2", 0, 4, 2}, Case{"PP4", 0, 8, 4}, Case{"PP4", 2, 8, 2},
                       Case{"PP4", 0, 3, 3}, Case{"PP2-TP2", 0, 2, 2}, Case{"PP2", 0, 1, 1}}) {
    LayoutSpec l = parse_layout(c.layout);
    l.microbatches = c.microbatches;
    ASSERT_EQ(decode_microbatches(l, c.batch), c.want_m) << c.layout;
    WorkloadSpec w;
    w.input_len = {64, 64};
    w.output_len = {40, 40};
    w.num_requests = c.batch;
    w.max_concurrency = c.batch;
    const RunRecord rec = simulate_layout(model, l, w, hw);
    const StepShape mb = decode_shape(1, 1, 0);  // every kernel is at the floor whatever the shape
    int64_t sum_t = 0, max_t = 0;
    std::vector<int64_t> t(size_t(l.pp));
    for (int32_t s = 0; s < l.pp; ++s) {
      t[size_t(s)] = stage_ns(model, l, hw, s, mb);
      sum_t += t[size_t(s)];
      max_t = std::max(max_t, t[size_t(s)]);
    }
    const int64_t m = c.want_m;
    const int64_t want = sum_t + (m - 1) * max_t + int64_t(l.pp) * alpha;
    int checked = 0;
    for (const StepSample& s : rec.steps) {
      if (s.step < 3 || s.step > 30) continue;
      const int32_t stage = s.rank / l.width();
      if (stage == 0) {
        EXPECT_EQ(s.dur_ns, want) << c.layout << " m=" << m << " step " << s.step;
        ++checked;
      }
      // Computing m·t_s; the rest of the step is pipeline bubble: waiting for data, inside the
      // launch (GPU busy, collective_wait_ns) or before it (idle).
      EXPECT_EQ(s.gpu_busy_ns - s.collective_wait_ns, m * t[size_t(stage)])
          << c.layout << " stage " << stage;
      EXPECT_EQ(s.gpu_busy_ns + s.idle_host_ns + s.idle_launch_ns + s.idle_dep_ns, s.dur_ns);
    }
    EXPECT_GT(checked, 20) << c.layout;
  }
}

// Stages of equal time: on the ideal machine a dense GQA layer is 10 nodes, a MoE layer (no
// shared expert) 11; stage 0 adds the embedding (1), the last stage final_norm + lm_head (2).
// [moe, dense, moe, moe, moe, moe, dense, dense] is 44 | 44 nodes under PP2 and
// 22 | 22 | 22 | 22 under PP4.
ModelSpec balanced_stages_model() {
  ModelSpec m = model_preset("tiny-llama");
  const LayerSpec dense = m.layers[0];
  LayerSpec moe = dense;
  moe.mlp = model_preset("qwen3-30b-a3b").layers[0].mlp;
  m.layers = {moe, dense, moe, moe, moe, moe, dense, dense};
  return m;
}

// Equal stage times t, m microbatches, free transfers: a step takes (m + pp − 1)·t and every
// stage spends (pp − 1)/(m + pp − 1) of it not computing (the pipeline bubble: idle, or busy
// waiting in a receive).
TEST(Pipeline, BubbleFractionMatchesTheAnalyticValue) {
  const HardwareSpec hw = pipeline_machine(0);
  for (int32_t pp : {2, 4}) {
    const ModelSpec model = balanced_stages_model();
    for (int32_t m : {1, 2, 4, 8}) {
      LayoutSpec l;
      l.pp = pp;
      l.microbatches = m;
      const int64_t t = stage_ns(model, l, hw, 0, decode_shape(1, 1, 0));
      ASSERT_EQ(t, (pp == 2 ? 44 : 22) * kFloorNs);
      for (int32_t s = 1; s < pp; ++s)
        ASSERT_EQ(stage_ns(model, l, hw, s, decode_shape(1, 1, 0)), t);
      WorkloadSpec w;
      w.input_len = {64, 64};
      w.output_len = {30, 30};
      w.num_requests = 8;
      w.max_concurrency = 8;
      const RunRecord rec = simulate_layout(model, l, w, hw);
      int checked = 0;
      for (const StepSample& s : rec.steps) {
        if (s.step < 5 || s.step > 20) continue;
        if (s.rank == 0) {
          EXPECT_EQ(s.dur_ns, (m + pp - 1) * t) << "pp " << pp << " m " << m;
        }
        const double idle =
            double(s.dur_ns - s.gpu_busy_ns + s.collective_wait_ns) / double(s.dur_ns);
        EXPECT_NEAR(idle, double(pp - 1) / double(m + pp - 1), 1e-12)
            << "pp " << pp << " m " << m << " rank " << s.rank;
        ++checked;
      }
      EXPECT_EQ(checked, 16 * pp);
    }
  }
}

// A prefill chunked through the stages: chunks of prefill_chunk_tokens enter one after
// another, the same makespan as decode microbatches.
TEST(Pipeline, PrefillChunksFlowThroughTheStages) {
  const ModelSpec model = eight_layer_llama();
  const int64_t alpha = 5 * kUs;
  const HardwareSpec hw = pipeline_machine(alpha);
  for (int64_t chunk : {250, 1000, 0}) {
    LayoutSpec l = parse_layout("PP4");
    l.prefill_chunk_tokens = chunk;
    const int64_t chunks = chunk == 0 ? 4 : (1000 + chunk - 1) / chunk;  // auto: pp chunks
    WorkloadSpec w;
    w.input_len = {1000, 1000};
    w.output_len = {4, 4};
    w.num_requests = 1;
    w.max_concurrency = 1;
    const RunRecord rec = simulate_layout(model, l, w, hw);
    const StepShape s1 = prefill_shape(1, 1, 1);
    int64_t sum_t = 0, max_t = 0;
    for (int32_t s = 0; s < l.pp; ++s) {
      const int64_t ts = stage_ns(model, l, hw, s, s1);
      sum_t += ts;
      max_t = std::max(max_t, ts);
    }
    ASSERT_FALSE(rec.steps.empty());
    const StepSample& first = rec.steps[0];
    ASSERT_EQ(first.step, 0);
    ASSERT_EQ(first.rank, 0);
    EXPECT_EQ(first.dur_ns, sum_t + (chunks - 1) * max_t + 4 * alpha) << "chunk " << chunk;
  }
}

// pp = 1 has one microbatch and no pipeline transfers: the kernel list is step_kernels'.
TEST(Pipeline, OneStageIsUnchanged) {
  const ModelSpec model = eight_layer_llama();
  for (const char* name : {"TP1", "TP2"}) {
    const LayoutSpec l = parse_layout(name);
    EXPECT_EQ(decode_microbatches(l, 16), 1);
    std::vector<StepShape> mbs;
    const int64_t ctx[] = {100, 200, 300};
    decode_microbatch_shapes(l, ctx, 1, mbs);
    ASSERT_EQ(mbs.size(), 1u);
    EXPECT_EQ(mbs[0].ctx_tokens, 600);
    StepKernels a, b;
    step_kernels(model, mbs[0], l, 0, a);
    pipeline_step_kernels(model, mbs, l, 0, b);
    ASSERT_EQ(a.kernels.size(), b.kernels.size());
    for (size_t i = 0; i < a.kernels.size(); ++i) {
      EXPECT_STREQ(a.kernels[i].name, b.kernels[i].name);
      EXPECT_EQ(a.kernels[i].bytes_read, b.kernels[i].bytes_read);
    }
  }
}

// ---- Expert-load skew under EP ------------------------------------------------------------------

// Only bytes cost time, 1 B per ns; FLOPs free; no floor, gaps or host costs; collectives cost
// their α alone (unbounded link bandwidth), so a bigger all-to-all message costs nothing extra.
HardwareSpec byte_machine() {
  HardwareSpec hw = testing::ideal_machine();
  hw.interconnect_gbps = 1e12;
  hw.stream_read_tbps = 1e-3;
  hw.mem_efficiency = 1.0;
  hw.kernel_floor_ns = 0;
  return hw;
}

ModelSpec small_qwen_moe(int32_t layers) {
  ModelSpec m = model_preset("qwen3-30b-a3b");  // 128 experts top-8, width 768, hidden 2048
  m.layers.resize(size_t(layers));
  return m;
}

RunRecord skew_prefill(const ExpertLoad& load, uint64_t seed, int32_t layers,
                       const char* layout = "TP2-EP2", int32_t requests = 1) {
  LayoutSpec l = parse_layout(layout);
  l.expert_load = load;
  l.expert_load.seed = seed;
  WorkloadSpec w;
  w.input_len = {635, 635};
  w.output_len = {2, 2};
  w.num_requests = requests;
  w.max_concurrency = requests;
  return simulate_layout(small_qwen_moe(layers), l, w, byte_machine());
}

// One expert asked for 40 % of the routed copies.
ExpertLoad one_hot_expert() {
  ExpertLoad hot;
  hot.kind = ExpertLoad::Kind::kHot;
  hot.hot_experts = 1;
  hot.hot_fraction = 0.4;
  return hot;
}

TEST(ExpertSkew, UniformLoadGivesEqualRankTimes) {
  const RunRecord rec = skew_prefill(ExpertLoad{}, 1, 8);
  ASSERT_GE(rec.steps.size(), 2u);
  const StepSample& a = rec.steps[0];
  const StepSample& b = rec.steps[1];
  ASSERT_EQ(a.step, 0);
  ASSERT_EQ(b.step, 0);
  EXPECT_EQ(a.gpu_busy_ns, b.gpu_busy_ns);
  EXPECT_EQ(a.collective_wait_ns, 0);
  EXPECT_EQ(b.collective_wait_ns, 0);
  EXPECT_EQ(a.end_ns, b.end_ns);
}

// One hot expert of 128 is asked for 40 % of the routed copies, but a token picks it at most once
// (top-8 of distinct experts), so its share is capped at 1/8 and the other 127 share 7/8. A
// 635-token prefill routes R = 635 · 8 = 5080 copies: the hot expert serves 635, each cold one
// 5080 · 0.875/127 = 35. The hot expert's EP rank serves 635 + 63 · 35 = 2840, the other
// 64 · 35 = 2240: 600 more (uniform: 2540 each). Every expert is hit on both ranks (a cold one
// misses all 635 tokens with probability (1 − 8 · 0.875/127)^635 < 1e-15), so weights read are
// equal; each extra copy costs 2h + 2i (gate_up: input in, intermediate out), 2i + 2h (down)
// and 2h (the weighted combine reads it) bytes, h = 2048, i = 768. The cold rank waits that long
// in the layer's all-reduce, whichever rank the draw made hot.
TEST(ExpertSkew, HotExpertRankIsTheStraggler) {
  const ExpertLoad hot = one_hot_expert();
  const int32_t layers = 16;
  const int64_t h = 2048, i = 768;
  const int64_t extra_copies = 2840 - 2240;
  const int64_t straggle_ns = extra_copies * (6 * h + 4 * i);  // 1 B per ns
  const RunRecord uniform = skew_prefill(ExpertLoad{}, 7, layers);
  const RunRecord rec = skew_prefill(hot, 7, layers);
  ASSERT_GE(rec.steps.size(), 2u);
  const StepSample& a = rec.steps[0];
  const StepSample& b = rec.steps[1];
  ASSERT_EQ(a.step, 0);
  ASSERT_EQ(b.step, 0);
  // One rank waits per layer; the draw moves the hot expert between ranks across layers.
  EXPECT_EQ(a.collective_wait_ns + b.collective_wait_ns, layers * straggle_ns);
  EXPECT_EQ(a.collective_wait_ns % straggle_ns, 0);
  EXPECT_GT(a.collective_wait_ns, 0);
  EXPECT_GT(b.collective_wait_ns, 0);
  EXPECT_EQ(a.end_ns, b.end_ns);
  // The step is the uniform one plus, per layer, the hot rank's extra work over the uniform
  // rank's 2540 copies (2840 − 2540 = 300 more).
  EXPECT_EQ(a.dur_ns - uniform.steps[0].dur_ns, layers * (2840 - 2540) * (6 * h + 4 * i));
  // Deterministic from the run seed; another seed draws other placements.
  const RunRecord again = skew_prefill(hot, 7, layers);
  EXPECT_EQ(again.steps[0].collective_wait_ns, a.collective_wait_ns);
  EXPECT_EQ(again.steps[1].collective_wait_ns, b.collective_wait_ns);
  bool differs = false;
  for (uint64_t seed = 8; seed < 12 && !differs; ++seed) {
    differs = skew_prefill(hot, seed, layers).steps[0].collective_wait_ns != a.collective_wait_ns;
  }
  EXPECT_TRUE(differs);
}

// The routing metrics of a simulated TP2-EP2 decode under uniform sampled routing (RunRecord::
// moe_routing, from the routing the simulator draws for its traced decode steps) against their
// analytic expectation. A token picks k = 8 distinct of E = 128 experts uniformly, so it misses
// a given expert with probability (E − k)/E and two given ones with (E − k)(E − k − 1)/(E(E − 1));
// b independent tokens miss them with m1 = ((E − k)/E)^b and m2 = (...)^b. A block of B = 64
// experts then gets D = Σ (1 − miss_e) distinct experts, E[D] = B(1 − m1), Var D = B m1 (1 − m1)
// + B(B − 1)(m2 − m1²). Each (step, layer) is a pass of its own draw; the mean over n passes (and
// the 2 ranks, which averages no worse than one rank) lies within 4.5 sd, sd ≤ sqrt(Var D / n).
// At b = 1 the ranks split the token's 8 picks: rank 0 gets X ~ hypergeometric(128, 64, 8), the
// busier max(X, 8 − X), both exact from the pmf.
TEST(ExpertSkew, SampledRoutingMetricsMatchUniformExpectation) {
  const double E = 128, k = 8, B = 64;
  const int64_t decode_steps = 40, layers = 12;
  auto simulate_routing = [&](int32_t batch, uint64_t seed) {
    LayoutSpec l = parse_layout("TP2-EP2");
    l.vocab_parallel = false;
    l.expert_load.sampled = true;
    l.expert_load.seed = seed;
    WorkloadSpec w;
    w.input_len = {64, 64};
    w.output_len = {int32_t(decode_steps + 10), int32_t(decode_steps + 10)};
    w.num_requests = batch;
    w.max_concurrency = batch;
    // Traced steps 0 .. decode_steps: the prefill (step 0) is not a decode launch.
    return simulate_layout(small_qwen_moe(int32_t(layers)), l, w, byte_machine(), HostCostSpec{},
                           decode_steps + 1)
        .moe_routing;
  };
  for (const int32_t batch : {1, 4}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const MoeRoutingStats st = simulate_routing(batch, 5);
    ASSERT_EQ(st.passes, decode_steps * layers);
    ASSERT_EQ(st.ep, 2);
    const MoeRoutingFigures f = moe_routing_figures(st);
    const double m1 = std::pow((E - k) / E, batch);
    const double m2 = std::pow((E - k) * (E - k - 1) / (E * (E - 1)), batch);
    const double mean = B * (1 - m1);
    const double var = B * m1 * (1 - m1) + B * (B - 1) * (m2 - m1 * m1);
    std::printf("batch %d: rank experts %.4f (expected %.4f), busiest %.4f, share max %.4f\n",
                batch, f.rank_experts_mean, mean, f.rank_experts_max_mean, f.expert_share_max);
    EXPECT_NEAR(f.rank_experts_mean, mean, 4.5 * std::sqrt(var / double(st.passes)));
    EXPECT_GE(f.rank_experts_max_mean, f.rank_experts_mean);
    // A token picks an expert at most once: no expert gets more than 1/k of a layer's picks.
    EXPECT_LE(f.expert_share_max, 1 / k);
    EXPECT_GT(f.expert_share_max, 1 / E);
    // Deterministic for a seed; another seed draws other routing.
    const MoeRoutingStats again = simulate_routing(batch, 5);
    EXPECT_EQ(again.rank_experts_max, st.rank_experts_max);
    EXPECT_EQ(again.picks, st.picks);
    EXPECT_NE(simulate_routing(batch, 6).picks, st.picks);
    if (batch != 1) continue;
    EXPECT_DOUBLE_EQ(f.rank_experts_mean, 4.0);  // the 8 picks split between 2 ranks
    auto choose = [](double n, double r) {
      double c = 1;
      for (int i = 0; i < r; ++i) c = c * (n - i) / (i + 1);
      return c;
    };
    double busier = 0, busier_sq = 0;
    for (int x = 0; x <= 8; ++x) {
      const double p = choose(64, x) * choose(64, 8 - x) / choose(128, 8);
      busier += std::max(x, 8 - x) * p;
      busier_sq += std::max(x, 8 - x) * std::max(x, 8 - x) * p;
    }
    const double sd = std::sqrt((busier_sq - busier * busier) / double(st.passes));
    EXPECT_NEAR(f.rank_experts_max_mean, busier, 4.5 * sd);  // busier = 5.10
  }
}

// Speculative decoding under PP2 (run-ahead, NEXTN chain of 3 drafts, one request): the draft
// module runs on the last stage, 2 forwards (the first draft comes from the extend), and its 3
// drafts go to stage 0 (α); stage 0 runs its verify layers and hands off (α); the last stage
// finishes the verify and runs the extend. The last stage never waits for stage 0 otherwise
// (it holds the logits the next draft starts from), so its round is
// 2·t_draft + t_extend + t_verify,0 + t_verify,1 + 2α, every kernel at the floor; the extend is
// the draft's KV pass (embedding, enorm, hnorm, eh_proj, attn_norm, qkv_proj, rope, kv_append:
// 8 nodes).
TEST(Pipeline, SpeculativeRoundRunsTheDraftOnTheLastStage) {
  const ModelSpec model = eight_layer_llama();
  const int64_t alpha = 9 * kUs;
  const HardwareSpec hw = pipeline_machine(alpha);
  PolicySpec policy;
  policy.spec.method = SpecMethod::kChain;
  policy.spec.steps = 3;
  policy.spec.draft_tokens = 4;
  const LayoutSpec l = parse_layout("PP2");
  WorkloadSpec w;
  w.input_len = {64, 64};
  w.output_len = {400, 400};
  w.num_requests = 1;
  w.max_concurrency = 1;
  const RunRecord rec = simulate_layout(model, l, w, hw, HostCostSpec{}, 0, policy);
  StepKernels draft;
  draft_module_kernels(nextn_draft(model), decode_shape(1, 1, 0), l, 1, draft);
  const int64_t t_draft = draft.node_count() * kFloorNs;
  EXPECT_GT(t_draft, 0);
  StepShape extend = decode_shape(1, 4, 0);
  extend.row_exact = extend.kv_pass = true;
  draft_module_kernels(nextn_draft(model), extend, l, 1, draft);
  EXPECT_EQ(draft.node_count(), 8);
  const int64_t t_extend = 8 * kFloorNs;
  draft_module_kernels(nextn_draft(model), decode_shape(1, 1, 0), l, 0, draft);
  EXPECT_EQ(draft.node_count(), 0);  // stage 0 holds no draft module
  const StepShape verify = decode_shape(1, 4, 0);
  const int64_t want = 2 * t_draft + t_extend + stage_ns(model, l, hw, 0, verify) +
                       stage_ns(model, l, hw, 1, verify) + 2 * alpha;
  int checked = 0;
  for (const StepSample& s : rec.steps) {
    if (s.rank != 1 || s.step < 5 || s.step > 40) continue;
    EXPECT_EQ(s.dur_ns, want) << "step " << s.step;
    ++checked;
  }
  EXPECT_GT(checked, 20);
}

// DP attention with EP: two 635-token prompts, one per rank; the experts see both ranks' tokens
// through the dispatch all-to-all. R = 2 · 635 · 8 = 10160 copies: the capped hot expert serves
// 1270, each cold one 10160 · 0.875/127 = 70; the hot rank 1270 + 63 · 70 = 5680, the other
// 64 · 70 = 4480. An extra copy costs 2h + 2i (gate_up) and 2i + 2h (down); the weighted combine
// reads the rank's own tokens' copies, the same on both. The cold rank waits the difference in
// the layer's combine all-to-all.
TEST(ExpertSkew, HotRankStragglesIntoTheCombineAllToAll) {
  const ExpertLoad hot = one_hot_expert();
  const int32_t layers = 12;
  const int64_t h = 2048, i = 768;
  const int64_t straggle_ns = (5680 - 4480) * (4 * h + 4 * i);
  const RunRecord uniform = skew_prefill(ExpertLoad{}, 3, layers, "DP2-EP2", 2);
  const RunRecord rec = skew_prefill(hot, 3, layers, "DP2-EP2", 2);
  ASSERT_GE(rec.steps.size(), 2u);
  const StepSample& a = rec.steps[0];
  const StepSample& b = rec.steps[1];
  ASSERT_EQ(a.step, 0);
  ASSERT_EQ(b.step, 0);
  EXPECT_EQ(uniform.steps[0].collective_wait_ns, 0);
  EXPECT_EQ(uniform.steps[1].collective_wait_ns, 0);
  EXPECT_EQ(a.collective_wait_ns + b.collective_wait_ns, layers * straggle_ns);
  EXPECT_EQ(a.collective_wait_ns % straggle_ns, 0);
  EXPECT_EQ(a.end_ns, b.end_ns);
  EXPECT_EQ(a.dur_ns - uniform.steps[0].dur_ns, layers * (5680 - 5080) * (4 * h + 4 * i));
}

}  // namespace
}  // namespace twinstep
