// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011) shared by device kernels and
// host references: the draw for (seed, step, row, column) is the same everywhere, every time.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define TS_HOST_DEVICE __host__ __device__
#else
#define TS_HOST_DEVICE
#endif

namespace twinstep::kernels {

TS_HOST_DEVICE inline uint32_t mulhi32(uint32_t a, uint32_t b) {
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
}

// Returns the first 32-bit word of Philox4x32-10(counter = {column, row, step lo, step hi},
// key = {seed lo, seed hi}).
TS_HOST_DEVICE inline uint32_t philox_u32(uint64_t seed, uint64_t step, uint32_t row,
                                          uint32_t column) {
  uint32_t c0 = column, c1 = row, c2 = static_cast<uint32_t>(step),
           c3 = static_cast<uint32_t>(step >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = mulhi32(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = mulhi32(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c0;
}

// Standard Gumbel noise -log(-log(u)), u uniform in (0, 1) from 24 random bits.
TS_HOST_DEVICE inline float gumbel_noise(uint64_t seed, uint64_t step, uint32_t row,
                                         uint32_t column) {
  const float u =
      static_cast<float>(philox_u32(seed, step, row, column) >> 8) * 0x1p-24f + 0x1p-25f;
  return -logf(-logf(u));
}

}  // namespace twinstep::kernels
