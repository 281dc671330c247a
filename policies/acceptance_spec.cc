#include "policies/acceptance_spec.h"

#include <algorithm>
#include <cmath>

namespace twinstep {

double chain_accept_len(double a, int32_t draft) {
  double sum = 0, term = 1;
  for (int32_t i = 0; i <= draft; ++i, term *= a) sum += term;
  return sum;
}

double rate_for_chain_accept_len(double accept_len, int32_t draft) {
  double lo = 0, hi = 1;
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    (chain_accept_len(mid, draft) < accept_len ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double AcceptanceTable::chain_accept_len(int32_t draft) const {
  if (accepted.empty()) return 1.0;
  int64_t sum = 0;
  for (const int32_t a : accepted) sum += std::min(a, draft) + 1;
  return double(sum) / double(accepted.size());
}

}  // namespace twinstep
