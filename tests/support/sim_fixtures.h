// Fixtures for simulator tests: a machine whose step times are exact sums, and fixed host costs.
#pragma once

#include "policies/hardware_spec.h"
#include "policies/host_costs.h"

namespace twinstep::testing {

constexpr int64_t kUs = 1000;
constexpr int64_t kFloorNs = 10 * kUs;

// Every host-device overhead zero and every kernel at the floor (unbounded bandwidth and
// FLOPs), so a forward pass costs nodes × kFloorNs exactly.
inline HardwareSpec ideal_machine() {
  HardwareSpec hw = hardware_preset("h200");
  hw.stream_read_tbps = 1e9;
  hw.bf16_tflops = 1e12;
  hw.kernel_floor_ns = kFloorNs;
  hw.eager_launch_ns = hw.graph_launch_ns = hw.graph_node_gap_ns = hw.pdl_node_gap_ns = 0;
  hw.eager_node_gap_ns = 0;
  hw.d2h_latency_ns = hw.host_wake_ns = 0;
  hw.d2h_gbps = 1e12;
  return hw;
}

inline HostCostSpec fixed_host_costs(int64_t schedule_ns, int64_t prepare_ns, int64_t process_ns) {
  HostCostSpec c;
  c.ops[size_t(HostOp::kSchedule)] = {DistKind::kFixed, schedule_ns};
  c.ops[size_t(HostOp::kPrepareDecode)] = {DistKind::kFixed, prepare_ns};
  c.ops[size_t(HostOp::kProcessOutputs)] = {DistKind::kFixed, process_ns};
  return c;
}

}  // namespace twinstep::testing
