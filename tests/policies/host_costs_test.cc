#include "policies/host_costs.h"

#include <gtest/gtest.h>

#include <cmath>

namespace twinstep {
namespace {

TEST(HostCosts, FixedAndPeriodicSpike) {
  HostCostSpec spec;
  spec.ops[size_t(HostOp::kSchedule)] = {DistKind::kFixed, 100'000};
  spec.spikes.push_back(
      {.op = HostOp::kSchedule, .every_steps = 10, .phase_step = 3, .extra_ns = 5'000});
  HostCostModel m(spec, 1);
  EXPECT_EQ(m.sample_ns(HostOp::kSchedule, 0), 100'000);
  EXPECT_EQ(m.sample_ns(HostOp::kSchedule, 3), 105'000);
  EXPECT_EQ(m.sample_ns(HostOp::kSchedule, 13), 105'000);
  EXPECT_EQ(m.sample_ns(HostOp::kSchedule, 14), 100'000);
  EXPECT_EQ(m.sample_ns(HostOp::kProcessOutputs, 3), 0);  // spike is per op
}

TEST(HostCosts, DrawsArePureFunctionsOfSeedOpStep) {
  HostCostSpec spec;
  spec.ops[size_t(HostOp::kPrepareDecode)] = {DistKind::kNormal, 300'000, 30'000};
  HostCostModel a(spec, 7), b(spec, 7), c(spec, 8);
  EXPECT_EQ(a.sample_ns(HostOp::kPrepareDecode, 41), b.sample_ns(HostOp::kPrepareDecode, 41));
  // Call order does not matter.
  const int64_t later = a.sample_ns(HostOp::kPrepareDecode, 900);
  EXPECT_EQ(b.sample_ns(HostOp::kPrepareDecode, 900), later);
  int differ = 0;
  for (int s = 0; s < 100; ++s)
    differ += a.sample_ns(HostOp::kPrepareDecode, s) != c.sample_ns(HostOp::kPrepareDecode, s);
  EXPECT_GT(differ, 90);
}

// Property: sample moments of each distribution match the requested mean and std.
TEST(HostCosts, DistributionMoments) {
  const struct {
    DistKind kind;
    double mean, std, lo, hi;
  } cases[] = {{DistKind::kNormal, 300e3, 30e3, 0, 0},
               {DistKind::kLognormal, 200e3, 50e3, 0, 0},
               {DistKind::kUniform, 150e3, 0, 100e3, 200e3}};
  for (const auto& c : cases) {
    HostCostSpec spec;
    spec.ops[0] = {c.kind, int64_t(c.mean), int64_t(c.std), int64_t(c.lo), int64_t(c.hi)};
    HostCostModel m(spec, 3);
    const int n = 200'000;
    double sum = 0, sq = 0;
    for (int s = 0; s < n; ++s) {
      const double x = double(m.sample_ns(HostOp::kSchedule, s));
      sum += x;
      sq += x * x;
    }
    const double mean = sum / n;
    const double sd = std::sqrt(sq / n - mean * mean);
    // Uniform [100, 200] µs: std = 100/√12 = 28.87 µs.
    const double want_sd = c.kind == DistKind::kUniform ? 100e3 / std::sqrt(12.0) : c.std;
    EXPECT_NEAR(mean, c.mean, 0.01 * c.mean) << int(c.kind);
    EXPECT_NEAR(sd, want_sd, 0.02 * want_sd) << int(c.kind);
  }
}

TEST(HostCosts, RandomSpikeRate) {
  HostCostSpec spec;
  spec.spikes.push_back({.op = HostOp::kSchedule, .probability = 0.05, .extra_ns = 1000});
  HostCostModel m(spec, 11);
  int hits = 0;
  for (int s = 0; s < 100'000; ++s) hits += m.sample_ns(HostOp::kSchedule, s) == 1000;
  EXPECT_NEAR(hits, 5000, 300);  // binomial std ≈ 69
}

}  // namespace
}  // namespace twinstep
