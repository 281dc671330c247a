#include "runtime/nccl_calibrate_spin.h"

namespace twinstep {
namespace {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Busy-waits on the timer: the rank's stream, not the host, is late (what a rank with more
// expert work looks like to the collective after it).
__global__ void skew_spin_kernel(const int64_t* delay_ns) {
  const int64_t d = *delay_ns;
  if (d <= 0) return;
  const uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < uint64_t(d)) {
  }
}

}  // namespace

cudaError_t launch_skew_spin(const int64_t* delay_ns, cudaStream_t stream) {
  skew_spin_kernel<<<1, 1, 0, stream>>>(delay_ns);
  return cudaGetLastError();
}

}  // namespace twinstep
