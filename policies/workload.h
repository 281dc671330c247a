// The workload: which requests arrive when, with which input and output lengths. Generated
// deterministically from the seed, identically for both backends.
#pragma once

#include <cstdint>
#include <vector>

namespace twinstep {

// A length: fixed when lo == hi, else uniform over [lo, hi] inclusive.
struct LengthDist {
  int32_t lo = 0;
  int32_t hi = 0;
};

struct WorkloadSpec {
  LengthDist input_len{8192, 8192};
  LengthDist output_len{1024, 1024};
  int32_t num_requests = 1;
  int32_t max_concurrency = 1;    // closed loop when arrival_rate_per_s == 0
  double arrival_rate_per_s = 0;  // > 0: Poisson arrivals, still capped by max_concurrency
  uint64_t seed = 0;
};

struct RequestSpec {
  int32_t id;
  int64_t arrival_ns;  // 0 for every request of a closed loop
  int32_t input_len;
  int32_t output_len;
};

std::vector<RequestSpec> generate_requests(const WorkloadSpec& spec);

// A capacity hint for one rank's step samples of a run of `requests` (RunRecord::steps): a step
// commits at least one token for each running request, so a closed loop at concurrency c takes
// about sum(output_len + 1) / c steps; the hint adds one step per request and a margin (speculative
// runs take fewer steps, open loops below c running may take more). Reserved before a run, it
// spares the record's vector its doublings, each a copy into fresh pages (bench-sim: ~40 % of the
// simulator's wall time on this project's machines).
int64_t step_capacity_hint(const WorkloadSpec& spec, const std::vector<RequestSpec>& requests);

}  // namespace twinstep
