// Collective arrival skew (issue #11, HardwareSpec::collective_skew): the profile section, the
// cost model's interpolation and the simulator's rendezvous, which ends a collective at the
// latest arrival + its cost + the extra of its members' skew.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "policies/calibration_profile.h"
#include "policies/decode_loop.h"
#include "policies/error.h"
#include "policies/layout.h"
#include "simulator/cost_model.h"
#include "simulator/sim_backend.h"
#include "tests/simulator/profile_text.h"
#include "tests/support/sim_fixtures.h"

namespace twinstep {
namespace {

using testing::kUs;

// all_reduce graph: extra 0 at no skew, 600 ns at 2 us, 1000 ns from 6 us on; all_reduce eager:
// one point (100 ns everywhere); all_to_all graph: 0 -> 2000 ns over the first microsecond.
const char* kSkewProfile = R"(format: 1
name: h200-skew
base: h200
header: {command: c, commit: abc, gpu: NVIDIA H200, driver: "570", date: d}
measurements: {}
collective_skew:
  ranks: 2
  all_reduce:
    graph: [[0, 0], [2000, 600], [6000, 1000]]
    eager: [[500, 100]]
  all_to_all: {graph: [[0, 0], [1000, 2000]]}
)";

HardwareSpec skew_hw() { return parse_calibration_profile(kSkewProfile, "p.yaml").hw; }

KernelDesc collective(CollectiveKind kind, int32_t group = 2) {
  return {"c", KernelClass::kCollective, 4096, 4096, 0, kind, group};
}

std::string error_of(const std::string& text) { return test::profile_error_of(text); }
std::string replace(const std::string& s, const std::string& from, const std::string& to) {
  return test::replace_once(s, from, to);
}

// ---- the profile section ------------------------------------------------------------------------

TEST(CollectiveSkew, LoadedInFileOrder) {
  const HardwareSpec hw = skew_hw();
  EXPECT_EQ(hw.collective_skew_ranks, 2);
  ASSERT_EQ(hw.collective_skew.size(), 3u);
  const HardwareSpec::CollectiveSkewTable& g = hw.collective_skew[0];
  EXPECT_EQ(g.collective, "all_reduce");
  EXPECT_TRUE(g.graph);
  ASSERT_EQ(g.points.size(), 3u);
  EXPECT_EQ(g.points[1].skew_ns, 2000);
  EXPECT_EQ(g.points[1].extra_ns, 600);
  EXPECT_EQ(hw.collective_skew[1].collective, "all_reduce");
  EXPECT_FALSE(hw.collective_skew[1].graph);
  EXPECT_EQ(hw.collective_skew[1].points.size(), 1u);
  EXPECT_EQ(hw.collective_skew[2].collective, "all_to_all");
  EXPECT_EQ(hw.collective_skew[2].points[1].extra_ns, 2000);
}

TEST(CollectiveSkew, WrittenInCanonicalOrderAndReadBack) {
  const CalibrationProfile p = parse_calibration_profile(kSkewProfile, "p.yaml");
  const std::string text = write_calibration_profile(p);
  // Collectives in the loader's order, eager before graph.
  const std::string section =
      "collective_skew:\n"
      "  ranks: 2\n"
      "  all_reduce:\n"
      "    eager: [[500, 100]]\n"
      "    graph: [[0, 0], [2000, 600], [6000, 1000]]\n"
      "  all_to_all:\n"
      "    graph: [[0, 0], [1000, 2000]]\n";
  ASSERT_NE(text.find(section), std::string::npos) << text;
  EXPECT_EQ(text.substr(text.size() - section.size()), section);  // the last section
  const CalibrationProfile q = parse_calibration_profile(text, "q.yaml");
  EXPECT_EQ(q.hw.collective_skew_ranks, 2);
  ASSERT_EQ(q.hw.collective_skew.size(), 3u);
  EXPECT_FALSE(q.hw.collective_skew[0].graph);  // eager first now
  EXPECT_EQ(q.hw.collective_skew[1].points.size(), 3u);
  EXPECT_EQ(q.hw.collective_skew[1].points[2].skew_ns, 6000);
  EXPECT_EQ(q.hw.collective_skew[1].points[2].extra_ns, 1000);
  // Fractional values survive (shortest round-trip form).
  CalibrationProfile r = p;
  r.hw.collective_skew[0].points[1] = {2000.25, 612.125};
  const CalibrationProfile back = parse_calibration_profile(write_calibration_profile(r), "r.yaml");
  EXPECT_EQ(back.hw.collective_skew[1].points[1].skew_ns, 2000.25);
  EXPECT_EQ(back.hw.collective_skew[1].points[1].extra_ns, 612.125);
}

TEST(CollectiveSkew, ProfilesWithoutTheSectionLoadAndWriteAsBefore) {
  const std::string text = kSkewProfile;
  const std::string plain = text.substr(0, text.find("collective_skew:"));
  const CalibrationProfile p = parse_calibration_profile(plain, "p.yaml");
  EXPECT_EQ(p.hw.collective_skew_ranks, 0);
  EXPECT_TRUE(p.hw.collective_skew.empty());
  EXPECT_EQ(write_calibration_profile(p).find("collective_skew"), std::string::npos);
  EXPECT_EQ(
      CostModel(p.hw).collective_skew_extra_ns(collective(CollectiveKind::kAllReduce), true, 5000),
      0);
}

TEST(CollectiveSkew, MalformedSectionsSayWhereAndWhat) {
  // Line 9 is "    graph: [[0, 0], [2000, 600], [6000, 1000]]": the list at column 12, its
  // points at 13, 21 and 34, the second point's numbers at 22 and 28.
  const std::string graph = "graph: [[0, 0], [2000, 600], [6000, 1000]]";
  EXPECT_EQ(error_of(replace(kSkewProfile, graph, "graph: [[0, 0], [2000, -600], [6000, 1000]]")),
            "p.yaml:9:28: collective_skew.all_reduce.graph[1].extra_ns = -600 is out of range "
            "[0, 1e+12]");
  EXPECT_EQ(error_of(replace(kSkewProfile, graph, "graph: [[0, 0], [2000, .nan], [6000, 1000]]")),
            "p.yaml:9:28: collective_skew.all_reduce.graph[1].extra_ns must be a finite number, "
            "got '.nan'");
  EXPECT_EQ(error_of(replace(kSkewProfile, graph, "graph: [[0, 0], [-1, 600], [6000, 1000]]")),
            "p.yaml:9:22: collective_skew.all_reduce.graph[1].skew_ns = -1 is out of range "
            "[0, 1e+12]");
  EXPECT_EQ(error_of(replace(kSkewProfile, graph, "graph: [[0, 0], [6000, 600], [2000, 1000]]")),
            "p.yaml:9:35: collective_skew.all_reduce.graph[2].skew_ns = 2000 must exceed the "
            "previous point's 6000 (points sorted by skew_ns, distinct)");
  EXPECT_EQ(error_of(replace(kSkewProfile, graph, "graph: [[0, 0], [0, 600], [6000, 1000]]")),
            "p.yaml:9:22: collective_skew.all_reduce.graph[1].skew_ns = 0 must exceed the "
            "previous point's 0 (points sorted by skew_ns, distinct)");
  EXPECT_EQ(error_of(replace(kSkewProfile, graph, "graph: [[0, 0], [2000], [6000, 1000]]")),
            "p.yaml:9:21: collective_skew.all_reduce.graph[1] must be a point [skew_ns, "
            "extra_ns]");
  EXPECT_EQ(error_of(replace(kSkewProfile, graph, "graph: []")),
            "p.yaml:9:12: collective_skew.all_reduce.graph must be a non-empty list of "
            "[skew_ns, extra_ns] points");
  EXPECT_EQ(error_of(replace(kSkewProfile, "all_to_all: {graph:", "all_to_all: {pdl:")),
            "p.yaml:11:16: unknown field 'pdl' in collective_skew.all_to_all; known: eager, graph");
  EXPECT_EQ(error_of(replace(kSkewProfile, "all_to_all: {", "send_recv: {")),
            "p.yaml:11:3: unknown field 'send_recv' in collective_skew; known: ranks, "
            "all_reduce, all_gather, all_to_all");
  EXPECT_EQ(error_of(replace(kSkewProfile, "  ranks: 2\n", "")),
            "p.yaml:7:3: collective_skew is missing required field 'ranks'");
  EXPECT_EQ(error_of(replace(kSkewProfile, "ranks: 2", "ranks: 1")),
            "p.yaml:7:10: collective_skew.ranks = 1 is out of range [2, 1048576]");
}

// ---- the cost model -----------------------------------------------------------------------------

TEST(CollectiveSkew, LinearBetweenPointsClampedOutside) {
  const CostModel cost(skew_hw());
  const KernelDesc ar = collective(CollectiveKind::kAllReduce);
  auto extra = [&](int64_t skew_ns) { return cost.collective_skew_extra_ns(ar, true, skew_ns); };
  EXPECT_EQ(extra(0), 0);
  // First segment: 600 ns over 2000 ns of skew, 0.3 ns per ns.
  EXPECT_EQ(extra(1000), 300);
  EXPECT_EQ(extra(1), 0);  // 0.3 rounds down
  EXPECT_EQ(extra(5), 2);  // 1.5 rounds half up
  EXPECT_EQ(extra(2000), 600);
  // Second segment: 400 ns over 4000 ns, 0.1 ns per ns.
  EXPECT_EQ(extra(3000), 700);
  EXPECT_EQ(extra(5000), 900);
  EXPECT_EQ(extra(5999), 1000);  // 999.9
  EXPECT_EQ(extra(6000), 1000);
  EXPECT_EQ(extra(1'000'000), 1000);  // clamped above
  // One point: its extra at every skew, below it included.
  EXPECT_EQ(cost.collective_skew_extra_ns(ar, false, 0), 100);
  EXPECT_EQ(cost.collective_skew_extra_ns(ar, false, 1'000'000), 100);
  EXPECT_EQ(cost.collective_skew_extra_ns(collective(CollectiveKind::kAllToAll), true, 250), 500);
}

TEST(CollectiveSkew, NoExtraWithoutACurveOrForOtherGroups) {
  const CostModel cost(skew_hw());
  // No all-gather curve, no eager all-to-all curve.
  EXPECT_EQ(cost.collective_skew_extra_ns(collective(CollectiveKind::kAllGather), true, 3000), 0);
  EXPECT_EQ(cost.collective_skew_extra_ns(collective(CollectiveKind::kAllToAll), false, 3000), 0);
  // Four ranks: measured on two.
  EXPECT_EQ(cost.collective_skew_extra_ns(collective(CollectiveKind::kAllReduce, 4), true, 3000),
            0);
  // A send/recv has no rendezvous; a non-collective none.
  EXPECT_EQ(cost.collective_skew_extra_ns(collective(CollectiveKind::kSendRecv), true, 3000), 0);
  EXPECT_EQ(cost.collective_skew_extra_ns(collective(CollectiveKind::kNone), true, 3000), 0);
  // A datasheet preset has no curves.
  EXPECT_EQ(CostModel(hardware_preset("h200"))
                .collective_skew_extra_ns(collective(CollectiveKind::kAllReduce), true, 3000),
            0);
  // The extra is not part of the collective's own price.
  HardwareSpec plain = skew_hw();
  plain.collective_skew.clear();
  const KernelDesc ar = collective(CollectiveKind::kAllReduce);
  EXPECT_EQ(cost.collective_ns(ar), CostModel(plain).collective_ns(ar));
}

// ---- the simulator's rendezvous -----------------------------------------------------------------

// TP2 tiny-llama under lockstep on the ideal machine (every kernel 10 us, no gaps or launch
// costs): each step's hosts launch when the previous step has ended, together, except that
// rank 1's prepare_decode is `delay_ns` longer every 5th step (from step 3), so it launches that
// much later and reaches the step's first collective (the embedding all-reduce) delay_ns after
// rank 0; every later collective of the step is reached together.
struct SkewRun {
  RunRecord record;
  std::map<int64_t, std::vector<StepSample>> by_step;
};

SkewRun simulate_tp2(const HardwareSpec& hw, int64_t delay_ns, int64_t trace_steps = 0) {
  WorkloadSpec w;
  w.input_len = {64, 64};
  w.output_len = {30, 30};
  w.num_requests = 1;
  PolicySpec policy;
  policy.host_schedule = HostSchedule::kLockstep;
  HostCostSpec costs = testing::fixed_host_costs(20 * kUs, 30 * kUs, 20 * kUs);
  costs.spikes.push_back({.op = HostOp::kPrepareDecode,
                          .rank = 1,
                          .every_steps = 5,
                          .phase_step = 3,
                          .extra_ns = delay_ns});
  const std::vector<RequestSpec> requests = generate_requests(w);
  SkewRun run;
  RunRecord shadow;
  DecodeLoop rank0(policy, w, requests, &run.record);
  DecodeLoop rank1(policy, w, requests, &shadow);
  HostProgram* ranks[] = {&rank0, &rank1};
  HostCostModel host(costs, 1);
  SimOptions options;
  options.layout = parse_layout("TP2");
  options.trace_steps = trace_steps;
  SimBackend backend(model_preset("tiny-llama"), hw, host, requests, options);
  backend.run(ranks, run.record);
  for (const StepSample& s : run.record.steps) run.by_step[s.step].push_back(s);
  return run;
}

// The ideal machine with the all-reduce curve of kSkewProfile (graph: 0 -> 600 ns at 2 us ->
// 1000 ns at 6 us).
HardwareSpec ideal_with_skew() {
  HardwareSpec hw = testing::ideal_machine();
  const HardwareSpec s = skew_hw();
  hw.collective_skew_ranks = s.collective_skew_ranks;
  hw.collective_skew = s.collective_skew;
  return hw;
}

// The step's collectives at their cost: a decode step of one request on a TP2 rank.
int64_t decode_collectives_ns(const HardwareSpec& hw) {
  StepKernels k;
  step_kernels(model_preset("tiny-llama"), decode_shape(1, 1, 100), parse_layout("TP2"), 0, k);
  const CostModel cost(hw);
  int64_t ns = 0;
  for (const LayerRun& run : k.runs) {
    for (int32_t i = run.first; i < run.first + run.count; ++i) {
      const KernelDesc& d = k.kernels[size_t(i)];
      if (d.cls == KernelClass::kCollective) ns += run.repeat * cost.collective_ns(d, true);
    }
  }
  return ns;
}

TEST(CollectiveSkew, TheLateRanksCollectiveEndsAtLatestPlusCostPlusExtra) {
  const int64_t delay_ns = 3 * kUs;
  const int64_t extra_ns = 700;  // 600 + (3000 - 2000) · 400 / 4000, by hand from the curve
  const HardwareSpec hw = ideal_with_skew();
  const SkewRun with = simulate_tp2(hw, delay_ns);
  const SkewRun without = simulate_tp2(testing::ideal_machine(), delay_ns);
  const int64_t coll_ns = decode_collectives_ns(hw);
  int skewed = 0, even = 0;
  for (const auto& [step, samples] : with.by_step) {
    ASSERT_EQ(samples.size(), 2u);
    const StepSample& r0 = samples[0];
    const StepSample& r1 = samples[1];
    if (r0.batch != 1 || r0.prefills != 0) continue;  // decode steps
    const std::vector<StepSample>& base = without.by_step.at(step);
    for (const StepSample& s : samples) {
      EXPECT_EQ(s.gpu_busy_ns + s.idle_host_ns + s.idle_launch_ns + s.idle_dep_ns, s.dur_ns)
          << "step " << step << " rank " << s.rank;
    }
    const bool spiked = step >= 3 && (step - 3) % 5 == 0;
    if (!spiked) {
      // Zero skew everywhere: no extra, the same step as without the curve.
      EXPECT_EQ(r0.collective_wait_ns, 0) << step;
      EXPECT_EQ(r0.collective_ns, coll_ns) << step;
      EXPECT_EQ(r1.collective_ns, coll_ns) << step;
      EXPECT_EQ(r0.dur_ns, base[0].dur_ns) << step;
      EXPECT_EQ(r1.gpu_busy_ns, base[1].gpu_busy_ns) << step;
      ++even;
      continue;
    }
    // Rank 0 waits delay_ns for rank 1, then both spend cost + extra in the all-reduce; all of
    // it inside the launch, GPU busy (base[0] waited delay_ns too).
    EXPECT_EQ(r0.collective_wait_ns, delay_ns) << step;
    EXPECT_EQ(r1.collective_wait_ns, 0) << step;
    EXPECT_EQ(r0.idle_dep_ns, 0) << step;
    EXPECT_EQ(r0.collective_ns, coll_ns + delay_ns + extra_ns) << step;
    EXPECT_EQ(r1.collective_ns, coll_ns + extra_ns) << step;
    EXPECT_EQ(r1.gpu_busy_ns, base[1].gpu_busy_ns + extra_ns) << step;
    EXPECT_EQ(r0.gpu_busy_ns, base[0].gpu_busy_ns + extra_ns) << step;
    EXPECT_EQ(r0.dur_ns, base[0].dur_ns + extra_ns) << step;
    EXPECT_EQ(r1.dur_ns, base[1].dur_ns + extra_ns) << step;
    EXPECT_EQ(r0.end_ns, r1.end_ns) << step;
    ++skewed;
  }
  EXPECT_EQ(skewed, 6);  // steps 3, 8, ..., 28
  EXPECT_GE(even, 20);
}

TEST(CollectiveSkew, TheCollectiveSpansEndAtTheNewDoneTime) {
  const int64_t delay_ns = 3 * kUs;
  const HardwareSpec hw = ideal_with_skew();
  const SkewRun run = simulate_tp2(hw, delay_ns, /*trace_steps=*/1000);
  // The embedding all-reduce's cost (the first collective of a decode step).
  StepKernels k;
  step_kernels(model_preset("tiny-llama"), decode_shape(1, 1, 100), parse_layout("TP2"), 0, k);
  const KernelDesc* first = nullptr;
  for (const KernelDesc& d : k.kernels) {
    if (first == nullptr && d.cls == KernelClass::kCollective) first = &d;
  }
  ASSERT_NE(first, nullptr);
  ASSERT_EQ(first->coll, CollectiveKind::kAllReduce);
  const int64_t cost_ns = CostModel(hw).collective_ns(*first, true);
  for (const int64_t step : {int64_t(8), int64_t(9)}) {  // skewed, even
    const TimelineSpan* span[2] = {nullptr, nullptr};
    for (const TimelineSpan& s : run.record.timeline) {
      if (s.step == step && s.lane == Lane::kCompute && span[s.rank] == nullptr &&
          std::string(s.name) == first->name) {
        span[s.rank] = &s;
      }
    }
    ASSERT_TRUE(span[0] != nullptr && span[1] != nullptr) << step;
    const int64_t skew = step == 8 ? delay_ns : 0;
    const int64_t extra = step == 8 ? 700 : 0;
    // Rank 1 arrives skew later; both end at its arrival + cost + extra.
    EXPECT_EQ(span[1]->start_ns - span[0]->start_ns, skew) << step;
    const int64_t done = span[1]->start_ns + cost_ns + extra;
    EXPECT_EQ(span[0]->start_ns + span[0]->dur_ns, done) << step;
    EXPECT_EQ(span[1]->start_ns + span[1]->dur_ns, done) << step;
  }
}

}  // namespace
}  // namespace twinstep
