// Helpers for the kernel suites: GPU skip, host bf16 conversion, device buffers, fresh random
// inputs, relative error. Every GPU test starts with TS_SKIP_WITHOUT_GPU().
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/common.h"

#define TS_SKIP_WITHOUT_GPU()                                                  \
  do {                                                                         \
    int ts_devices_ = 0;                                                       \
    if (cudaGetDeviceCount(&ts_devices_) != cudaSuccess || ts_devices_ == 0) { \
      cudaGetLastError();                                                      \
      GTEST_SKIP() << "no CUDA device";                                        \
    }                                                                          \
  } while (0)

namespace twinstep::kernels::test {

inline uint16_t to_bf16_bits(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16_bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float round_bf16(float f) { return from_bf16_bits(to_bf16_bits(f)); }

// Host mirror of a bf16 tensor: bits for the device, float values for references.
struct Bf16Host {
  std::vector<uint16_t> bits;
  std::vector<float> values;
  explicit Bf16Host(size_t n = 0) : bits(n), values(n) {}
  size_t size() const { return bits.size(); }
  void set(size_t i, float v) {
    bits[i] = to_bf16_bits(v);
    values[i] = from_bf16_bits(bits[i]);
  }
};

// Fresh seed per test run (printed on failure through SCOPED_TRACE at the call site).
inline uint64_t fresh_seed() {
  return (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
}

inline Bf16Host random_bf16(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  Bf16Host h(n);
  for (size_t i = 0; i < n; ++i) {
    float v = dist(rng);
    if (v == 0.0f) v = scale * 0.5f;  // never zeros
    h.set(i, v);
  }
  return h;
}

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    TS_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(count, 1) * sizeof(T)));
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), count_(other.count_) {
    other.ptr_ = nullptr;
  }
  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  void poison() { TS_CUDA_CHECK(cudaMemset(ptr_, 0xFF, count_ * sizeof(T))); }  // NaN / -1
  template <typename U>
  void upload(const std::vector<U>& host) {
    static_assert(sizeof(U) == sizeof(T));
    TS_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  template <typename U = T>
  std::vector<U> download() const {
    static_assert(sizeof(U) == sizeof(T));
    std::vector<U> host(count_);
    TS_CUDA_CHECK(cudaDeviceSynchronize());
    TS_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t count_;
};

inline DeviceBuffer<bf16> to_device(const Bf16Host& h) {
  DeviceBuffer<bf16> d(h.size());
  d.upload(h.bits);
  return d;
}

inline std::vector<float> bf16_to_float(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = from_bf16_bits(bits[i]);
  return out;
}

// ||out - ref|| / ||ref||; +inf when out holds a NaN/inf (an unwritten poisoned element).
inline double rel_error(const std::vector<float>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// bf16 operands with fp32 accumulation and one bf16 output rounding land near 3e-3.
constexpr double kBf16RelTol = 1e-2;

}  // namespace twinstep::kernels::test
