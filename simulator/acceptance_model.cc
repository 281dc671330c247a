#include "simulator/acceptance_model.h"

#include <cmath>
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
}

int32_t AcceptanceModel::max_position() const {
  return spec_.calibrated ? spec_.calibrated->draft_len : std::numeric_limits<int32_t>::max();
}

AcceptanceModel::Draw AcceptanceModel::draw(int32_t request, int64_t round, int32_t position) {
  if (const AcceptanceTable* t = spec_.calibrated.get()) {
    const uint64_t key = (uint64_t(uint32_t(request)) << 32) ^ uint64_t(round);
    auto [it, added] = rows_.try_emplace(key, 0);
    if (added) it->second = (rng_key(seed_, 0xacce97ull, 0) + cursor_++) % t->rounds();
    const uint64_t row = it->second;
    const float c = t->confidence[row * size_t(t->draft_len) + size_t(position - 1)];
    return {c, position <= t->accepted[row]};
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
