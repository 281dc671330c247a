// Where a graph node starts on the GPU timeline given its predecessor and the node gap
// (docs/calibration.md, "GPU busy inside a graph"; the PDL gap may be negative: an overlap).
#pragma once

#include <algorithm>
#include <cstdint>

namespace twinstep {

// The start of a node whose predecessor ended at `begin_ns` and started at `prev_start_ns`
// (when has_prev), with node gap `gap_ns` and the overlap carried so far (`carry_ns`, <= 0):
// begin + gap + carry, but not before the predecessor's start (a PDL launch cannot overtake its
// primary; the fitted overlap, -592 ns on the H200, is longer than a 186 ns kv_append). What
// could not be taken stays in carry_ns for the next node; a caller takes the rest before a
// collective and at the launch's end, so those times are the plain sums' (begin + gap per node).
inline int64_t place_node(int64_t begin_ns, int64_t gap_ns, int64_t& carry_ns, bool has_prev,
                          int64_t prev_start_ns) {
  int64_t gap = gap_ns + carry_ns;
  if (has_prev) gap = std::max(gap, prev_start_ns - begin_ns);
  carry_ns = gap_ns + carry_ns - gap;
  return begin_ns + gap;
}

}  // namespace twinstep
