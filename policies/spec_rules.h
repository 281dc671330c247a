// The device-side half of the speculative policies: what the GPU decides inside its graphs
// without the host. The simulator's device model calls these; the runtime's kernels implement
// the same rules (tests hold them equal).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "policies/policy_spec.h"

namespace twinstep {

// Draft tokens a confidence-scheduled draft proposes, given the confidences of the tokens it
// would draft (confidence[i] for draft token i+1) and the most it may draft: it keeps drafting
// while a token's confidence is >= threshold, and always drafts min_steps. The token whose
// confidence fell below the threshold is still proposed.
inline int32_t device_draft_len(const SpecSpec& spec, std::span<const float> confidence,
                                int32_t max_len) {
  int32_t len = 0;
  while (len < max_len) {
    const float c = confidence[size_t(len)];
    ++len;
    if (len >= spec.min_steps && c < spec.threshold) break;
  }
  return len;
}

// Leading drafted tokens whose confidence met the threshold.
inline int32_t confident_prefix(const SpecSpec& spec, std::span<const float> confidence,
                                int32_t draft_len) {
  int32_t n = 0;
  while (n < draft_len && confidence[size_t(n)] >= spec.threshold) ++n;
  return n;
}

// Forwards of the draft module in a draft launch of width `q_tokens` whose longest request drafts
// `longest` tokens. NEXTN: the first draft token comes from the previous round's extend, so L
// tokens take L - 1 forwards. Confidence-scheduled drafts decided on the device (not host_late)
// stop past the longest only with early exit in a graph; otherwise they run every step of the
// width, padded. Chains and host-chosen lengths run their longest.
inline int32_t draft_passes(const SpecSpec& spec, GraphMode mode, int32_t longest,
                            int32_t q_tokens) {
  const bool device_decides =
      spec.method == SpecMethod::kConfidence && spec.mode != DraftMode::kHostLate;
  const bool skips = !device_decides || (spec.early_exit && mode != GraphMode::kEager);
  return std::max(0, (skips ? longest : q_tokens) - 1);
}

// Greedy verification: draft tokens accepted = the leading run the target agrees with.
inline int32_t accepted_prefix(std::span<const bool> agrees, int32_t draft_len) {
  int32_t n = 0;
  while (n < draft_len && agrees[size_t(n)]) ++n;
  return n;
}

}  // namespace twinstep
