// Kernels of the calibration microbenchmarks (runtime/calibrate.cc): an empty kernel (launch
// and node-gap costs) and a PDL-aware empty kernel.
#include <cuda_runtime.h>

#include "kernels/common.h"

namespace twinstep::runtime {
namespace {

__global__ void empty_kernel() {}

// With programmatic stream serialization the next node may start once every block has
// triggered; triggering first and waiting on the predecessor is what the runtime's kernels do.
__global__ void empty_pdl_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
  cudaGridDependencySynchronize();
#endif
}

}  // namespace

// Declared where it is used (runtime/calibrate.cc): one block of 32 threads doing nothing; with
// `pdl`, launched with programmatic stream serialization. Checks the launch, never synchronises.
void launch_empty(cudaStream_t stream, bool pdl);

void launch_empty(cudaStream_t stream, bool pdl) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(32);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (pdl) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    TS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, empty_pdl_kernel));
  } else {
    TS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, empty_kernel));
  }
}

}  // namespace twinstep::runtime
