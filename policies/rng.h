// Counter-based random numbers: a draw is a pure function of (seed, stream, counter), so both
// backends, any call order and any number of MPI ranks see the same values.
#pragma once

#include <cmath>
#include <cstdint>

namespace twinstep {

constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr uint64_t rng_key(uint64_t seed, uint64_t stream, uint64_t counter) {
  return splitmix64(splitmix64(seed ^ splitmix64(stream)) ^ counter);
}

// Uniform in (0, 1): never 0, so log() is safe.
inline double rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
  return (double(rng_key(seed, stream, counter) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal by Box-Muller over two independent uniforms.
inline double rng_normal(uint64_t seed, uint64_t stream, uint64_t counter) {
  const double u1 = rng_uniform(seed, stream, 2 * counter);
  const double u2 = rng_uniform(seed, stream, 2 * counter + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace twinstep
