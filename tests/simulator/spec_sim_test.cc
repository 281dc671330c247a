#include <gtest/gtest.h>

#include "policies/acceptance_spec.h"
#include "policies/decode_loop.h"
#include "simulator/sim_backend.h"
#include "tests/support/sim_fixtures.h"

namespace twinstep {
namespace {

using testing::kFloorNs;
using testing::kUs;

struct Result {
  RunRecord record;
  double accept_len = 0;  // committed tokens per verify, from the step samples
  double step_ns = 0;     // mean step duration over steps with a verify
  double idle_host_ns = 0;
};

Result simulate(const SpecSpec& spec, const AcceptanceSpec& acc, HostSchedule schedule,
                const HardwareSpec& hw, const HostCostSpec& costs, int32_t requests = 40,
                int32_t output_len = 400) {
  PolicySpec policy;
  policy.host_schedule = schedule;
  policy.spec = spec;
  WorkloadSpec w;
  w.input_len = {64, 64};
  w.output_len = {output_len, output_len};
  w.num_requests = requests;
  const std::vector<RequestSpec> reqs = generate_requests(w);
  Result r;
  DecodeLoop loop(policy, w, reqs, &r.record);
  HostCostModel host(costs, 1);
  SimOptions options;
  options.spec = spec;
  options.acceptance = acc;
  options.acceptance_seed = 99;
  SimBackend backend(model_preset("tiny-llama"), hw, host, reqs, options);
  HostProgram* ranks[] = {&loop};
  backend.run(ranks, r.record);
  int64_t tokens = 0, batch = 0, dur = 0, idle = 0, n = 0;
  for (const StepSample& s : r.record.steps) {
    if (s.batch == 0) continue;
    tokens += s.tokens;
    batch += s.batch;
    dur += s.dur_ns;
    idle += s.idle_host_ns;
    ++n;
  }
  r.accept_len = double(tokens) / double(batch);
  r.step_ns = double(dur) / double(n);
  r.idle_host_ns = double(idle) / double(n);
  return r;
}

SpecSpec chain(int32_t steps) {
  SpecSpec s;
  s.method = SpecMethod::kChain;
  s.steps = steps;
  s.draft_tokens = steps + 1;
  return s;
}

SpecSpec confidence(DraftMode mode, int32_t max_steps, double threshold) {
  SpecSpec s;
  s.method = SpecMethod::kConfidence;
  s.mode = mode;
  s.max_steps = max_steps;
  s.threshold = threshold;
  return s;
}

TEST(SpecSim, ChainCommitsEverythingOrNothing) {
  const HostCostSpec none = testing::fixed_host_costs(0, 0, 0);
  EXPECT_DOUBLE_EQ(simulate(chain(5), {.accept_rate = 1.0}, HostSchedule::kRunahead,
                            testing::ideal_machine(), none)
                       .accept_len,
                   6.0);
  EXPECT_DOUBLE_EQ(simulate(chain(5), {.accept_rate = 0.0}, HostSchedule::kRunahead,
                            testing::ideal_machine(), none)
                       .accept_len,
                   1.0);
}

// Property: the mean committed tokens per verify of a chain matches Σ_{i=0}^{d} a^i.
TEST(SpecSim, ChainAcceptLengthMatchesAnalytic) {
  const HostCostSpec none = testing::fixed_host_costs(0, 0, 0);
  for (double a : {0.3, 0.6, 0.85}) {
    const Result r = simulate(chain(5), {.accept_rate = a}, HostSchedule::kRunahead,
                              testing::ideal_machine(), none, 60, 600);
    EXPECT_NEAR(r.accept_len, chain_accept_len(a, 5), 0.02 * chain_accept_len(a, 5)) << a;
  }
}

// With a perfectly informative confidence (signal 1) and threshold 0.5 the device stops at the
// first token the target will reject, so it commits what a chain of max_steps would, while
// drafting no further than needed.
TEST(SpecSim, DeviceModeWithPerfectConfidence) {
  const HostCostSpec none = testing::fixed_host_costs(0, 0, 0);
  const AcceptanceSpec acc{.accept_rate = 0.8, .decay = 1.0, .confidence_signal = 1.0};
  const Result dev = simulate(confidence(DraftMode::kDevice, 8, 0.5), acc, HostSchedule::kRunahead,
                              testing::ideal_machine(), none, 60, 600);
  EXPECT_NEAR(dev.accept_len, chain_accept_len(0.8, 8), 0.02 * chain_accept_len(0.8, 8));
  const Result ch =
      simulate(chain(8), acc, HostSchedule::kRunahead, testing::ideal_machine(), none, 60, 600);
  EXPECT_NEAR(dev.accept_len, ch.accept_len, 0.05 * ch.accept_len);
  EXPECT_LT(dev.step_ns, ch.step_ns);  // fewer draft forwards on average
}

// host_blocking: after the draft the host reads lengths, then schedules and prepares the verify;
// on the ideal machine the GPU idles exactly schedule + prepare per step, host-bound.
TEST(SpecSim, HostBlockingIdlesTheGpuForTheHostRoundTrip) {
  const HostCostSpec costs = testing::fixed_host_costs(30 * kUs, 40 * kUs, 20 * kUs);
  const AcceptanceSpec acc{.accept_rate = 0.7};
  const Result blocking = simulate(confidence(DraftMode::kHostBlocking, 6, 0.5), acc,
                                   HostSchedule::kRunahead, testing::ideal_machine(), costs);
  EXPECT_NEAR(blocking.idle_host_ns, 70.0 * kUs, 1.0 * kUs);
  const Result device = simulate(confidence(DraftMode::kDevice, 6, 0.5), acc,
                                 HostSchedule::kRunahead, testing::ideal_machine(), costs);
  EXPECT_NEAR(device.accept_len, blocking.accept_len, 1e-9);  // same drafts, same acceptance
  EXPECT_LT(device.idle_host_ns, 1.0 * kUs);
  EXPECT_NEAR(blocking.step_ns - device.step_ns, 70.0 * kUs, 2.0 * kUs);
}

// A draft round on the ideal machine: the NEXTN module is 1 + 3 prologue kernels (embedding,
// enorm, hnorm, eh_proj), one layer (10) and 2 epilogue kernels = 16 nodes per forward. A chain
// of 5 drafts runs 4 draft forwards, one verify (23 nodes) and one extend (16 nodes).
TEST(SpecSim, ChainStepCostCountsForwards) {
  const HostCostSpec none = testing::fixed_host_costs(0, 0, 0);
  const Result r = simulate(chain(5), {.accept_rate = 0.5}, HostSchedule::kRunahead,
                            testing::ideal_machine(), none, 4, 200);
  EXPECT_NEAR(r.step_ns, double((4 * 16 + 23 + 16) * kFloorNs), 1.0);
}

}  // namespace
}  // namespace twinstep
