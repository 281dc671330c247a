#include "results/stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace twinstep {
namespace {

// Expected values are numpy.percentile(x, p) (default method='linear'), worked by hand:
// h = (n - 1) * p / 100, result = x[floor(h)] + frac(h) * (x[floor(h) + 1] - x[floor(h)]).
struct PercentileCase {
  std::vector<double> x;
  double p;
  double numpy;
};

TEST(Stats, PercentileMatchesNumpyLinear) {
  const PercentileCase cases[] = {
      {{1, 2, 3, 4}, 90, 3.7},        // h = 2.7: 3 + 0.7 * 1
      {{1, 2, 3, 4}, 50, 2.5},        // h = 1.5
      {{10, 20, 30}, 99, 29.8},       // h = 1.98: 20 + 0.98 * 10
      {{5}, 90, 5.0},                 // one sample
      {{3, 1, 2}, 0, 1.0},            // unsorted input, minimum
      {{3, 1, 2}, 100, 3.0},          // maximum
      {{1, 2, 4, 8, 16}, 90, 12.8},   // h = 3.6: 8 + 0.6 * 8
      {{0, 10}, 25, 2.5},             // h = 0.25
      {{7, 1, 3, 9, 5, 2}, 75, 6.5},  // sorted 1 2 3 5 7 9, h = 3.75: 5 + 0.75 * 2
      {{-4, -2, 0, 2}, 10, -3.4},     // h = 0.3: -4 + 0.3 * 2
      {{2, 2, 2, 2}, 99, 2.0},        // constant
  };
  for (const auto& c : cases) {
    EXPECT_NEAR(percentile(c.x, c.p), c.numpy, 1e-12) << "p=" << c.p;
  }
}

TEST(Stats, MeanMedianStdMatchNumpy) {
  const std::vector<double> a = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(mean(a), 2.5);
  EXPECT_DOUBLE_EQ(median(a), 2.5);
  // numpy.std (ddof=0): squared deviations 2.25 0.25 0.25 2.25, mean 1.25.
  EXPECT_DOUBLE_EQ(stddev(a), std::sqrt(1.25));
  // The textbook example: mean 5, squared deviations sum to 32 over 8 samples -> std 2.
  const std::vector<double> b = {2, 4, 4, 4, 5, 5, 7, 9};
  EXPECT_DOUBLE_EQ(stddev(b), 2.0);
  EXPECT_DOUBLE_EQ(median(b), 4.5);
  EXPECT_DOUBLE_EQ(median(std::vector<double>{3, 1, 2}), 2.0);
  EXPECT_DOUBLE_EQ(stddev(std::vector<double>{7}), 0.0);
}

TEST(Stats, SummarizeAgreesWithSingleFunctions) {
  const std::vector<double> x = {9, 1, 8, 2, 7, 3, 6, 4, 5, 100};
  const Summary s = summarize(x);
  EXPECT_DOUBLE_EQ(s.mean, 14.5);  // 145 / 10
  EXPECT_DOUBLE_EQ(s.median, 5.5);
  EXPECT_DOUBLE_EQ(s.p50, 5.5);
  // sorted 1..9, 100: p90 h = 8.1 -> 9 + 0.1 * 91 = 18.1; p99 h = 8.91 -> 9 + 0.91 * 91 = 91.81.
  EXPECT_NEAR(s.p90, 18.1, 1e-12);
  EXPECT_NEAR(s.p99, 91.81, 1e-12);
  EXPECT_DOUBLE_EQ(s.std, stddev(x));
}

}  // namespace
}  // namespace twinstep
