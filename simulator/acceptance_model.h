// The simulated device's draft/target agreement (AcceptanceSpec): for each request, round and
// draft position, the draft's confidence and whether the target agrees. A pure function of
// (seed, request, round, position), so runs are reproducible whatever the batch order.
#pragma once

#include <cstdint>

#include "policies/acceptance_spec.h"

namespace twinstep {

class AcceptanceModel {
 public:
  AcceptanceModel(const AcceptanceSpec& spec, uint64_t seed) : spec_(spec), seed_(seed) {}

  struct Draw {
    float confidence;
    bool agrees;
  };
  // Draft position `position` (1-based) of verify round `round` of `request`.
  Draw draw(int32_t request, int64_t round, int32_t position) const;

 private:
  AcceptanceSpec spec_;
  uint64_t seed_;
};

}  // namespace twinstep
