// Host-side costs of the scheduling loop: a duration distribution per host operation plus
// periodic or random spikes (a GC pause, a gloo broadcast). Draws are counter-based on
// (seed, op, step), so both backends and any call order get the same durations.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace twinstep {

// The named pieces of host work a policy issues. Order is the database/trace order.
enum class HostOp : uint8_t {
  kSchedule,        // pick the batch: admit arrivals, retire finished requests
  kPreparePrefill,  // build prefill inputs for newly admitted requests
  kPrepareDecode,   // build the step's metadata (attention indices, positions)
  kProcessOutputs,  // read copied results: stop checks, detokenise, stream to clients
  kCount
};
const char* host_op_name(HostOp op);
constexpr int kHostOpCount = static_cast<int>(HostOp::kCount);

enum class DistKind : uint8_t { kFixed, kNormal, kLognormal, kUniform };

// Normal is truncated at zero; lognormal has the given mean and standard deviation;
// uniform spans [lo_ns, hi_ns].
struct DurationDist {
  DistKind kind = DistKind::kFixed;
  int64_t mean_ns = 0;
  int64_t std_ns = 0;
  int64_t lo_ns = 0;
  int64_t hi_ns = 0;
};

// Adds extra_ns to `op` on steps where (step - phase_step) % every_steps == 0 (every_steps > 0),
// or with probability `probability` per step (every_steps == 0); on one rank's host only when
// rank >= 0.
struct HostSpike {
  HostOp op = HostOp::kProcessOutputs;
  int32_t rank = -1;
  int64_t every_steps = 0;
  int64_t phase_step = 0;
  double probability = 0;
  int64_t extra_ns = 0;
};

struct HostCostSpec {
  std::array<DurationDist, kHostOpCount> ops{};
  std::vector<HostSpike> spikes;
};

class HostCostModel {
 public:
  HostCostModel(const HostCostSpec& spec, uint64_t seed) : spec_(spec), seed_(seed) {}
  // Duration of `op` at `step` (>= 0), in nanoseconds. Pure function of (spec, seed, op, step).
  int64_t sample_ns(HostOp op, int64_t step) const;
  // The same costs for another rank's host: independent draws (rank 0 is this model).
  HostCostModel for_rank(int32_t rank) const;

 private:
  HostCostSpec spec_;
  uint64_t seed_;
  int32_t rank_ = 0;
};

}  // namespace twinstep
