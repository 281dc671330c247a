#include "results/stats.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

namespace twinstep {
namespace {

// Percentile of already sorted data; numpy's _lerp, including its t >= 0.5 branch, so results
// agree with numpy to the last bit in the common cases.
double sorted_percentile(const std::vector<double>& s, double p) {
  assert(!s.empty());
  assert(p >= 0 && p <= 100);
  const double h = static_cast<double>(s.size() - 1) * (p / 100.0);
  const size_t lo = static_cast<size_t>(std::floor(h));
  if (lo + 1 >= s.size()) return s.back();
  const double t = h - static_cast<double>(lo);
  const double a = s[lo];
  const double b = s[lo + 1];
  const double diff = b - a;
  return t >= 0.5 ? b - diff * (1.0 - t) : a + diff * t;
}

std::vector<double> sorted_copy(std::span<const double> x) {
  std::vector<double> s(x.begin(), x.end());
  std::sort(s.begin(), s.end());
  return s;
}

}  // namespace

double percentile(std::span<const double> x, double p) {
  return sorted_percentile(sorted_copy(x), p);
}

double mean(std::span<const double> x) {
  assert(!x.empty());
  double sum = 0;
  for (double v : x) sum += v;
  return sum / static_cast<double>(x.size());
}

double median(std::span<const double> x) { return percentile(x, 50); }

double stddev(std::span<const double> x) {
  const double m = mean(x);
  double sq = 0;
  for (double v : x) sq += (v - m) * (v - m);
  return std::sqrt(sq / static_cast<double>(x.size()));
}

Summary summarize(std::span<const double> x) {
  const std::vector<double> s = sorted_copy(x);
  Summary out{};
  out.mean = mean(x);
  out.std = stddev(x);
  out.p50 = sorted_percentile(s, 50);
  out.median = out.p50;
  out.p90 = sorted_percentile(s, 90);
  out.p99 = sorted_percentile(s, 99);
  return out;
}

}  // namespace twinstep
