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
#include <utility>
#include <vector>

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
  // Draft position `position` (1-based) of verify round `round` of `request`, which begins
  // `text_offset` tokens into the request's output (the tokens its earlier rounds committed).
  // Calibrated: position <= max_position(); with AcceptanceSource::align_position the round
  // replays the source round covering that offset (same request), else the next in order.
  Draw draw(int32_t request, int64_t round, int32_t position, int32_t text_offset = 0);
  // The longest draft the model can answer for (calibrated: the measured draft length; else
  // unbounded).
  int32_t max_position() const;

 private:
  AcceptanceSpec spec_;
  uint64_t seed_;
  // Calibrated: per (request, round) seen, the replayed row (in order; aligned: the source row
  // covering the round's first token) and, aligned by position, the round's output offset.
  struct Replay {
    bool aligned = false;
    uint64_t row = 0;
    int32_t offset = 0;
  };
  std::unordered_map<uint64_t, Replay> rows_;
  uint64_t cursor_ = 0;
  // align_position: per source request, its rounds' (start, row) in start order.
  std::unordered_map<int32_t, std::vector<std::pair<int32_t, uint64_t>>> by_request_;
  // The row covering `text_offset` of `request`, or -1 (no such request, or past its text).
  int64_t aligned_row(int32_t request, int32_t text_offset) const;
  // Calibrated: [q] = the table's P(accepted >= q | accepted >= q - 1), q = 1 .. draft_len: how
  // an aligned round decides a token no source round drafted (a fully accepted round's bonus)
  // where no source round follows it.
  std::vector<double> agree_at_depth_;
};

}  // namespace twinstep
