// The KV capacity of the real backend's engine (runtime/real_factory.cc sizes it, and the
// simulator reads it: the attention's context partition follows it, kernels/attention_split.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "policies/policy_spec.h"
#include "policies/workload.h"

namespace twinstep {

// KV positions past a request's prompt and output that speculation needs: verify writes up to
// its width past the context, and a run-ahead host launches a round or two more before it learns
// that a request finished. 0 without speculation.
inline int32_t spec_kv_margin(const SpecSpec& spec) {
  return spec.method == SpecMethod::kNone ? 0 : 3 * (spec.max_draft() + 1);
}

// KV positions one request needs: its prompt padded to 16, its output and the margin above.
inline int64_t request_kv_tokens(const RequestSpec& r, const SpecSpec& spec) {
  return (int64_t(r.input_len) + 15) / 16 * 16 + r.output_len + spec_kv_margin(spec);
}

// Tokens per slot of the engine serving `requests`: the most any of them needs (at least 16),
// rounded up to 64.
inline int32_t engine_kv_capacity_tokens(std::span<const RequestSpec> requests,
                                         const SpecSpec& spec) {
  int64_t need = 16;
  for (const RequestSpec& r : requests) need = std::max(need, request_kv_tokens(r, spec));
  return int32_t((need + 63) / 64 * 64);
}

// The widest verify calibrate measures (runtime kMaxDraftTokens + 1).
inline constexpr int32_t kSpecCalibrationMaxWidth = 16;
// A model's widest verify: 16 positions, at most 64 query rows per KV head (decode_attention).
inline int32_t spec_calibration_max_width(int32_t q_heads, int32_t kv_heads) {
  return std::min(kSpecCalibrationMaxWidth, 64 / std::max(1, q_heads / std::max(1, kv_heads)));
}

// The capacity `twinstep calibrate` measures a model's speculative graphs at, context `ctx`
// (runtime/calibrate.cc spec_graphs): the context padded to 16, one round of the widest verify
// (`max_width` positions) and 16 more, rounded up to 64 (8256 at ctx 8192, width 8 or 16).
inline int32_t spec_calibration_capacity_tokens(int64_t ctx, int32_t max_width) {
  return int32_t(((ctx + 15) / 16 * 16 + max_width + 16 + 63) / 64 * 64);
}

}  // namespace twinstep
