// Synthetic weights: a pure function of (seed, tensor name, element index), identical on the host
// (checkpoint writer, CPU reference) and the device (in-memory init of an 8B model in
// milliseconds). Integer arithmetic plus one float multiply and an explicit round-to-nearest-even
// to bf16, so host and device give the same bits.
//
// Value = scale · (s − 131070), s the sum of the four 16-bit fields of a 64-bit hash: an
// Irwin–Hall(4) variable, mean 0, std 65536/√3, so scale = std·√3/65536 gives the requested
// standard deviation (close to normal; bounded at ±√12 std, which keeps activations finite).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__CUDACC__)
#define TS_SYNTH_HD __host__ __device__
#else
#define TS_SYNTH_HD
#endif

namespace twinstep::synthetic {

TS_SYNTH_HD inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Round-to-nearest-even float -> bf16 bits (NaN kept quiet).
TS_SYNTH_HD inline uint16_t float_to_bf16_bits(float f) {
  uint32_t bits;
#if defined(__CUDA_ARCH__)
  bits = __float_as_uint(f);
#else
  std::memcpy(&bits, &f, 4);
#endif
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

TS_SYNTH_HD inline float bf16_bits_to_float(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

// One element; scale from scale_for_std(). stream identifies the tensor (tensor_stream(name)).
TS_SYNTH_HD inline uint16_t element_bits(uint64_t seed, uint64_t stream, uint64_t index,
                                         float scale) {
  const uint64_t h = mix64(mix64(seed ^ mix64(stream)) ^ index);
  const uint32_t s = uint32_t(h & 0xffff) + uint32_t((h >> 16) & 0xffff) +
                     uint32_t((h >> 32) & 0xffff) + uint32_t(h >> 48);
  const float u = static_cast<float>(static_cast<int32_t>(s) - 131070);  // exact
  return float_to_bf16_bits(u * scale);
}

inline float scale_for_std(double std_dev) {
  return static_cast<float>(std_dev * 1.7320508075688772 / 65536.0);
}

// FNV-1a of the tensor name.
inline uint64_t tensor_stream(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace twinstep::synthetic
