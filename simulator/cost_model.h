// CostModel: kernel durations from a HardwareSpec. Roofline per kernel: the larger of
// bytes / (stream_read_tbps · mem_efficiency) and flops / (bf16_tflops · flop_efficiency), at
// least kernel_floor_ns. A calibrated profile replaces the figures, not this interface.
#pragma once

#include <cstdint>

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
