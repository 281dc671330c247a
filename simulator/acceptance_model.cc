#include "simulator/acceptance_model.h"

#include <cmath>

#include "policies/rng.h"

namespace twinstep {

AcceptanceModel::Draw AcceptanceModel::draw(int32_t request, int64_t round,
                                            int32_t position) const {
  const uint64_t stream = (uint64_t(uint32_t(request)) << 8) | uint64_t(position & 0xff);
  const uint64_t counter = uint64_t(round);
  const double p = spec_.accept_rate * std::pow(spec_.decay, double(position - 1));
  const bool agrees = rng_uniform(seed_, stream, 2 * counter) < p;
  const double v = rng_uniform(seed_, stream, 2 * counter + 1);
  const double s = spec_.confidence_signal;
  return {float((1.0 - s) * v + s * (agrees ? 1.0 : 0.0)), agrees};
}

}  // namespace twinstep
