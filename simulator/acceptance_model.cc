#include "simulator/acceptance_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "policies/error.h"
#include "policies/rng.h"

namespace twinstep {

AcceptanceModel::AcceptanceModel(const AcceptanceSpec& spec, uint64_t seed)
    : spec_(spec), seed_(seed) {
  if (spec_.calibrated_from && !spec_.calibrated) {
    throw Error("simulator: calibrated acceptance (" + spec_.calibrated_from->where +
                ") was not loaded from the results database");
  }
  if (spec_.calibrated && spec_.calibrated->rounds() == 0) {
    throw Error("simulator: calibrated acceptance from " + spec_.calibrated->source +
                " holds no verify rounds");
  }
  if (spec_.calibrated && spec_.calibrated_from && spec_.calibrated_from->align_position) {
    const AcceptanceTable& t = *spec_.calibrated;
    if (t.request.size() != t.rounds() || t.start.size() != t.rounds()) {
      throw Error("simulator: calibrated acceptance from " + t.source +
                  " has no per-round request and start (needed by align: position)");
    }
    for (uint64_t row = 0; row < t.rounds(); ++row)
      by_request_[t.request[row]].emplace_back(t.start[row], row);
    for (auto& [request, rows] : by_request_) std::sort(rows.begin(), rows.end());
  }
  if (spec_.calibrated) {
    // h[q] = P(accepted >= q | accepted >= q - 1) over the table's rounds.
    const AcceptanceTable& t = *spec_.calibrated;
    agree_at_depth_.assign(size_t(t.draft_len) + 1, 0.0);
    for (int32_t q = 1; q <= t.draft_len; ++q) {
      int64_t reached = 0, agreed = 0;
      for (const int32_t a : t.accepted) {
        reached += a >= q - 1;
        agreed += a >= q;
      }
      agree_at_depth_[size_t(q)] = reached > 0 ? double(agreed) / double(reached) : 0.0;
    }
  }
}

int64_t AcceptanceModel::aligned_row(int32_t request, int32_t text_offset) const {
  const auto it = by_request_.find(request);
  if (it == by_request_.end()) return -1;
  const std::vector<std::pair<int32_t, uint64_t>>& rows = it->second;
  // The last round starting at or before the offset; it covers the offset when the offset is
  // within the tokens it committed (accepted + 1).
  auto next = std::upper_bound(rows.begin(), rows.end(),
                               std::pair<int32_t, uint64_t>{text_offset, UINT64_MAX});
  if (next == rows.begin()) return -1;
  const auto [start, row] = *(next - 1);
  if (text_offset > start + spec_.calibrated->accepted[row]) return -1;
  return int64_t(row);
}

int32_t AcceptanceModel::max_position() const {
  return spec_.calibrated ? spec_.calibrated->draft_len : std::numeric_limits<int32_t>::max();
}

AcceptanceModel::Draw AcceptanceModel::draw(int32_t request, int64_t round, int32_t position,
                                            int32_t text_offset) {
  if (const AcceptanceTable* t = spec_.calibrated.get()) {
    const uint64_t key = (uint64_t(uint32_t(request)) << 32) ^ uint64_t(round);
    auto [it, added] = rows_.try_emplace(key, Replay{});
    Replay& r = it->second;
    if (added) {
      // Aligned when the source covers where this round begins; else the next row in order.
      const int64_t covering = by_request_.empty() ? -1 : aligned_row(request, text_offset);
      r.aligned = covering >= 0;
      r.offset = text_offset;
      r.row = r.aligned ? uint64_t(covering)
                        : (rng_key(seed_, 0xacce97ull, 0) + cursor_++) % t->rounds();
    }
    if (!r.aligned) {
      const float c = t->confidence[r.row * size_t(t->draft_len) + size_t(position - 1)];
      return {c, position <= t->accepted[r.row]};
    }
    // Aligned: draft position p predicts output token x = offset + p - 1. The source round
    // covering the round's first token (start s, accepted a) drafted x as its position q = x - s
    // + 1, from the same state when it began there too (measured on the speculative suite: a real
    // round that starts where its source round started draws every confidence equal). Up to q =
    // a + 1 (its miss) it drafted the text; past the miss the draft went on from its own wrong
    // token, as this round does past the same miss, so those confidences are that round's too
    // (not the next source round's, which drafted the right text). A source round accepted whole
    // hands on to the text: its bonus token (q = a + 1 with a its draft length) was never
    // drafted (see below for what stands in); the tokens after it are the next source round's.
    // Past the source's text: no agreement.
    const size_t row0 = r.row;
    const int32_t q0 = r.offset + position - t->start[row0];
    const int32_t a0 = t->accepted[row0];
    const size_t base0 = row0 * size_t(t->draft_len);
    if (q0 <= t->draft_len) return {t->confidence[base0 + size_t(q0 - 1)], q0 <= a0};
    if (a0 < t->draft_len) {
      // Past the source's draft after its miss: nothing measured drafted this far from the wrong
      // token; its last confidence stands in.
      return {t->confidence[base0 + size_t(t->draft_len - 1)], false};
    }
    const int32_t x = r.offset + position - 1;
    const int64_t row = aligned_row(request, x);
    if (row < 0) return {0.0f, false};
    const int32_t q = x + 1 - t->start[size_t(row)];
    const int32_t a = t->accepted[size_t(row)];
    const size_t base = size_t(row) * size_t(t->draft_len);
    if (q > t->draft_len) {
      // The bonus token: measured where a second calibration run drafted it (bonus_from); else
      // the text's next drafted token (the first of the source round that starts after it)
      // stands in, its agreement and confidence: a round accepted whole sits in an easy
      // stretch (scripts/spec_replay_check.py on h200_spec: the round after one agreed
      // at its first draft in 18 of 18 at fidelity 0.55 and 422 of 428 at 0.87; the real rounds
      // that drafted those bonus tokens agreed in 38 of 38 and 347 of 357, their confidence
      // there near the stand-in's, far from the source round's last at 0.55: 0.71-0.79 against
      // 0.59-0.79 and 0.19-0.30). At the end of the text: the table's rate at this round's own
      // depth (a seeded draw), the source round's last confidence.
      const auto d = t->drafted.find(AcceptanceTable::drafted_key(request, x));
      if (d != t->drafted.end()) return {d->second.confidence, d->second.agrees};
      const int64_t next = aligned_row(request, x + 1);
      if (next >= 0 && t->start[size_t(next)] == x + 1) {
        return {t->confidence[size_t(next) * size_t(t->draft_len)], t->accepted[size_t(next)] >= 1};
      }
      const uint64_t stream =
          (uint64_t{0xb0} << 56) | (uint64_t(uint32_t(request)) << 8) | uint64_t(position & 0xff);
      const bool agrees = rng_uniform(seed_, stream, uint64_t(round)) <
                          agree_at_depth_[size_t(std::min(position, t->draft_len))];
      return {t->confidence[base + size_t(t->draft_len - 1)], agrees};
    }
    return {t->confidence[base + size_t(q - 1)], q <= a};
  }
  const uint64_t stream = (uint64_t(uint32_t(request)) << 8) | uint64_t(position & 0xff);
  const uint64_t counter = uint64_t(round);
  const double p = spec_.accept_rate * std::pow(spec_.decay, double(position - 1));
  const bool agrees = rng_uniform(seed_, stream, 2 * counter) < p;
  const double v = rng_uniform(seed_, stream, 2 * counter + 1);
  const double s = spec_.confidence_signal;
  return {float((1.0 - s) * v + s * (agrees ? 1.0 : 0.0)), agrees};
}

}  // namespace twinstep
