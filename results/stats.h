// Summary statistics over samples, matching numpy's defaults so numbers computed here agree with
// a pandas/numpy analysis of the raw samples in the results database.
#pragma once

#include <span>

namespace twinstep {

// numpy.percentile(x, p) with the default 'linear' method: sort, h = (n - 1) * p / 100,
// interpolate between the neighbours of h. p in [0, 100]; x non-empty (asserted).
double percentile(std::span<const double> x, double p);

// numpy.mean / numpy.median / numpy.std (population, ddof = 0). x non-empty (asserted).
double mean(std::span<const double> x);
double median(std::span<const double> x);
double stddev(std::span<const double> x);

struct Summary {
  double mean;
  double median;
  double std;
  double p50;
  double p90;
  double p99;
};

// All of the above at once (one sort). x non-empty (asserted).
Summary summarize(std::span<const double> x);

}  // namespace twinstep
