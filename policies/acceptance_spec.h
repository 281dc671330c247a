// How a draft agrees with its target, for the simulator (a real run measures it instead).
// Parametric: draft position i (1-based) is accepted, given every earlier one was, with
// probability p_i = accept_rate · decay^(i-1). The draft's confidence in position i is
// c_i = (1 − signal)·v + signal·[accepted], v ~ U(0, 1): signal 0 makes confidence noise,
// signal 1 makes it a perfect predictor; acceptance rates do not depend on it.
#pragma once

#include <cstdint>

namespace twinstep {

struct AcceptanceSpec {
  double accept_rate = 0.7;
  double decay = 1.0;
  double confidence_signal = 0.4;
};

// The mean tokens committed per verify of a chain of `draft` tokens with per-position rate a
// (decay 1): Σ_{i=0}^{draft} a^i.
double chain_accept_len(double accept_rate, int32_t draft);
// The inverse: the rate whose chain of `draft` tokens commits `accept_len` tokens per verify
// (1 <= accept_len <= draft + 1), by bisection.
double rate_for_chain_accept_len(double accept_len, int32_t draft);

}  // namespace twinstep
