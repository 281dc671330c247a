// The delay kernel of calibrate-nccl's skewed-arrival sweep (runtime/nccl_calibrate.h,
// NcclSkewPoint): one thread that returns once %globaltimer has advanced *delay_ns (<= 0: at
// once). The delay is read from device memory when the kernel runs, so a captured graph replays
// with whatever the buffer holds (one graph per message size serves every delay).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace twinstep {

// Enqueues the kernel on `stream` (capturable); returns the launch's error (cudaGetLastError).
cudaError_t launch_skew_spin(const int64_t* delay_ns, cudaStream_t stream);

}  // namespace twinstep
