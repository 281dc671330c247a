#include <gtest/gtest.h>

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

struct MultiRun {
  RunRecord record;
  std::map<int64_t, std::vector<StepSample>> by_step;  // step -> per-rank samples
};

MultiRun simulate(const LayoutSpec& layout, const HostCostSpec& costs, const HardwareSpec& hw,
                  int32_t output_len = 120) {
  PolicySpec policy;  // run-ahead, graphs
  WorkloadSpec w;
  w.input_len = {64, 64};
  w.output_len = {output_len, output_len};
  const std::vector<RequestSpec> requests = generate_requests(w);
  MultiRun m;
  std::vector<RunRecord> shadow(size_t(layout.world()));
  std::vector<std::unique_ptr<DecodeLoop>> loops;
  std::vector<HostProgram*> ranks;
  for (int32_t r = 0; r < layout.world(); ++r) {
    loops.push_back(
        std::make_unique<DecodeLoop>(policy, w, requests, r == 0 ? &m.record : &shadow[size_t(r)]));
    ranks.push_back(loops.back().get());
  }
  HostCostModel host(costs, 1);
  SimOptions options;
  options.layout = layout;
  SimBackend backend(model_preset("tiny-llama"), hw, host, requests, options);
  backend.run(ranks, m.record);
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
      EXPECT_EQ(s.idle_dep_ns, 0);  // nobody waits for anybody
      EXPECT_GT(s.collective_ns, 0);
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
    if (samples[2].idle_host_ns == 0) {
      for (const StepSample& s : samples) EXPECT_EQ(s.idle_dep_ns, 0) << step;
      continue;
    }
    ++spiked_steps;
    EXPECT_EQ(samples[2].idle_host_ns, late) << step;
    EXPECT_EQ(samples[2].idle_dep_ns, 0) << step;
    for (int r : {0, 1, 3}) {
      EXPECT_EQ(samples[size_t(r)].idle_dep_ns, late) << "rank " << r << " step " << step;
      EXPECT_EQ(samples[size_t(r)].idle_host_ns, 0);
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
// the nanosecond on coupled ranks, for TP and EP layouts with node gaps.
TEST(MultiRank, TracingDoesNotChangeTimes) {
  for (const char* layout_name : {"TP2", "TP4"}) {
    for (const char* model : {"llama-3-8b", "qwen3-30b-a3b"}) {
      auto once = [&](int64_t trace_steps) {
        PolicySpec policy;
        WorkloadSpec w;
        w.input_len = {100, 3000};
        w.output_len = {20, 40};
        w.num_requests = 6;
        w.max_concurrency = 3;
        w.seed = 3;
        const std::vector<RequestSpec> requests = generate_requests(w);
        const LayoutSpec layout = parse_layout(layout_name);
        RunRecord r;
        std::vector<RunRecord> shadow(size_t(layout.world()));
        std::vector<std::unique_ptr<DecodeLoop>> loops;
        std::vector<HostProgram*> ranks;
        for (int32_t i = 0; i < layout.world(); ++i) {
          loops.push_back(
              std::make_unique<DecodeLoop>(policy, w, requests, i == 0 ? &r : &shadow[size_t(i)]));
          ranks.push_back(loops.back().get());
        }
        HostCostModel host(testing::fixed_host_costs(30 * kUs, 40 * kUs, 30 * kUs), 1);
        SimOptions options;
        options.layout = layout;
        options.trace_steps = trace_steps;
        SimBackend backend(model_preset(model), hardware_preset("h200"), host, requests, options);
        backend.run(ranks, r);
        return r;
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
