#include <stdexcept>
#include <string>

#include "kernels/common.h"
#include "kernels/tuning.h"

namespace twinstep::kernels {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr + ": " +
                           cudaGetErrorString(err));
}

void throw_invalid_argument(const char* launcher, const std::string& message) {
  throw std::invalid_argument(std::string("twinstep::kernels::") + launcher + ": " + message);
}

namespace detail {
KernelTuning& kernel_tuning() {
  static KernelTuning tuning;
  return tuning;
}
}  // namespace detail

}  // namespace twinstep::kernels
