// The simulated device's draft/target agreement (AcceptanceSpec): for each request, round and
// draft position, the draft's confidence and whether the target agrees.
// Parametric: a pure function of (seed, request, round, position), whatever the batch order.
// Calibrated: each (request, round) gets the next measured round of the table, in the order
// rounds first ask (from a seeded starting row), so a run uses every measured round equally
// often and its mean converges to the table's without sampling noise. Deterministic for a seed
// because the simulator's execution order is.
#pragma once

#include <cstdint>
#include <unordered_map>

#include "policies/acceptance_spec.h"

namespace twinstep {

class AcceptanceModel {
 public:
  // Throws Error when `spec` names a calibration source that was never resolved into a table.
  AcceptanceModel(const AcceptanceSpec& spec, uint64_t seed);

  struct Draw {
    float confidence;
    bool agrees;
  };
  // Draft position `position` (1-based) of verify round `round` of `request`. Calibrated:
  // position <= max_position().
  Draw draw(int32_t request, int64_t round, int32_t position);
  // The longest draft the model can answer for (calibrated: the measured draft length; else
  // unbounded).
  int32_t max_position() const;

 private:
  AcceptanceSpec spec_;
  uint64_t seed_;
  // Calibrated: the table row of each (request, round) seen, and the next row to hand out.
  std::unordered_map<uint64_t, uint64_t> rows_;
  uint64_t cursor_ = 0;
};

}  // namespace twinstep
