// CostModel: kernel durations from a HardwareSpec. A kernel with a calibrated fit for its name
// (HardwareSpec::kernel_name_fits) or else its class (HardwareSpec::kernel_fits, both from
// `twinstep calibrate`) costs base + per-byte + per-flop terms;
// any other class the roofline: the larger of bytes / (stream_read_tbps · mem_efficiency) and
// flops / (bf16_tflops · flop_efficiency), at least kernel_floor_ns (a fit's base_ns is its
// own measured floor). Rounded half up.
// kernel_ns depends on the KernelDesc alone, so callers may cache sums of it (sim_backend.cc).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "policies/hardware_spec.h"
#include "policies/step_kernels.h"

namespace twinstep {

struct GraphCost {
  int64_t busy_ns = 0;     // Σ kernel durations
  int64_t nodes = 0;       // kernel count
  int64_t bytes_read = 0;  // Σ bytes read
};

class CostModel {
 public:
  explicit CostModel(const HardwareSpec& hw);
  int64_t kernel_ns(const KernelDesc& k) const;
  GraphCost graph_cost(const StepKernels& step) const;
  // Device-to-host copy of `bytes`, issue to completion.
  int64_t copy_d2h_ns(int64_t bytes) const;
  // A collective kernel (KernelClass::kCollective) once every rank has arrived.
  int64_t collective_ns(const KernelDesc& k) const;

 private:
  struct LinearFit {
    bool on = false;
    double base_ns = 0;
    double ns_per_byte = 0;
    double ns_per_flop = 0;
    double split_intensity = 0;  // > 0: flops > split · bytes uses the wide coefficients
    double split_bytes = 0;      // > 0: bytes > split_bytes uses the wide coefficients
    double wide_base_ns = 0;
    double wide_ns_per_byte = 0;
    double wide_ns_per_flop = 0;
  };
  static double price(const LinearFit& f, const KernelDesc& k);
  std::array<LinearFit, size_t(KernelClass::kCount)> fits_{};
  // Per-kernel-name fits (HardwareSpec::kernel_name_fits), looked up by name; few entries.
  std::vector<std::pair<std::string, LinearFit>> name_fits_;
  double ns_per_byte_;
  double ns_per_flop_;
  int64_t floor_ns_;
  int64_t d2h_latency_ns_;
  double d2h_ns_per_byte_;
  double link_ns_per_byte_;
  int64_t allreduce_alpha_ns_;
  int64_t alltoall_alpha_ns_;
  int64_t p2p_alpha_ns_;
};

}  // namespace twinstep
