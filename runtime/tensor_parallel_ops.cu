// Tensor parallelism's device side (runtime/tensor_parallel.h): a shard of a synthetic tensor
// generated in place, element for element the bits of the full tensor's init. Compiled as
// C++17 (nvcc), so it takes plain arguments; tensor_parallel.cc declares and wraps it.
#include <algorithm>

#include "kernels/common.h"
#include "runtime/synthetic.h"

namespace twinstep::runtime {
namespace {

__global__ void init_synthetic_slice_kernel(uint16_t* dst, int64_t rows, int64_t cols, int64_t row0,
                                            int64_t col0, int64_t full_cols, uint64_t seed,
                                            uint64_t stream, float scale) {
  const uint64_t n = uint64_t(rows) * uint64_t(cols);
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = i / uint64_t(cols), c = i % uint64_t(cols);
    const uint64_t full = (uint64_t(row0) + r) * uint64_t(full_cols) + uint64_t(col0) + c;
    dst[i] = scale == 0.0f ? uint16_t{0x3f80} : synthetic::element_bits(seed, stream, full, scale);
  }
}

}  // namespace

void launch_init_synthetic_slice_raw(uint16_t* dst, int64_t rows, int64_t cols, int64_t row0,
                                     int64_t col0, int64_t full_cols, uint64_t seed,
                                     uint64_t stream_id, float scale, cudaStream_t stream) {
  TS_REQUIRE(dst != nullptr, "null dst");
  TS_REQUIRE(rows >= 0 && cols >= 0 && col0 + cols <= full_cols, "slice outside the tensor");
  const uint64_t n = uint64_t(rows) * uint64_t(cols);
  if (n == 0) return;
  const int blocks = int(std::min<uint64_t>((n + 255) / 256, 132 * 16));
  init_synthetic_slice_kernel<<<std::max(blocks, 1), 256, 0, stream>>>(
      dst, rows, cols, row0, col0, full_cols, seed, stream_id, scale);
  TS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace twinstep::runtime
