#include "policies/workload.h"

#include <algorithm>
#include <cmath>

#include "policies/rng.h"

namespace twinstep {
namespace {

enum Stream : uint64_t { kInput = 1, kOutput = 2, kArrival = 3 };

int32_t draw_length(const LengthDist& d, uint64_t seed, uint64_t stream, uint64_t i) {
  if (d.hi <= d.lo) return d.lo;
  const double u = rng_uniform(seed, stream, i);
  const auto span = static_cast<int64_t>(d.hi) - d.lo + 1;
  return d.lo + static_cast<int32_t>(std::min<int64_t>(span - 1, int64_t(u * double(span))));
}

}  // namespace

std::vector<RequestSpec> generate_requests(const WorkloadSpec& spec) {
  std::vector<RequestSpec> out;
  out.reserve(static_cast<size_t>(spec.num_requests));
  double t_s = 0;
  for (int32_t i = 0; i < spec.num_requests; ++i) {
    int64_t arrival_ns = 0;
    if (spec.arrival_rate_per_s > 0) {
      // Exponential inter-arrival gaps; the first request arrives at 0.
      if (i > 0)
        t_s += -std::log(rng_uniform(spec.seed, kArrival, uint64_t(i))) / spec.arrival_rate_per_s;
      arrival_ns = std::llround(t_s * 1e9);
    }
    out.push_back({i, arrival_ns, draw_length(spec.input_len, spec.seed, kInput, uint64_t(i)),
                   draw_length(spec.output_len, spec.seed, kOutput, uint64_t(i))});
  }
  return out;
}

int64_t step_capacity_hint(const WorkloadSpec& spec, const std::vector<RequestSpec>& requests) {
  if (requests.empty()) return 0;
  int64_t tokens = 0;
  for (const RequestSpec& r : requests) tokens += int64_t{r.output_len} + 1;
  const int64_t c = std::clamp<int64_t>(spec.max_concurrency, 1, int64_t(requests.size()));
  return (tokens + c - 1) / c + int64_t(requests.size()) + 64;
}

}  // namespace twinstep
