// Experiment: a validated YAML experiment, its sweep expanded into variants. Loading never
// touches the database; every error carries file:line:column and the allowed values.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "policies/acceptance_spec.h"
#include "policies/hardware_spec.h"
#include "policies/host_costs.h"
#include "policies/layout.h"
#include "policies/model_spec.h"
#include "policies/policy_spec.h"
#include "policies/workload.h"

namespace twinstep {

enum class BackendKind : uint8_t { kSim, kReal };
const char* backend_kind_name(BackendKind b);

// Which steps keep a node-level timeline (for `twinstep trace`): [first, first + count).
struct TraceSpec {
  int64_t first_step = 0;
  int64_t step_count = 0;  // 0: no timeline
  // Real runs: a GPU timestamp per kernel in the traced steps (profiled graphs), so the measured
  // timeline has the simulated one's operations. Inflates those steps by the profiling overhead
  // (metric trace_inflation_pct); off by default, since the traced steps count in every metric.
  bool nodes = false;
};

struct Variant {
  int32_t index = 0;
  std::string label;  // "policies.host_schedule=lockstep, ..." ("base" without a sweep)
  std::vector<std::pair<std::string, std::string>> params;  // swept key -> value (as written)
  ModelSpec model;
  HardwareSpec hardware;
  WorkloadSpec workload;
  PolicySpec policy;
  HostCostSpec host_costs;
  AcceptanceSpec acceptance;  // simulator only: how the draft agrees with the target
  LayoutSpec layout;          // ranks and sharding (default: one GPU)
  TraceSpec trace;
  uint64_t seed = 0;
};

struct Experiment {
  std::string name;
  std::string description;
  std::string source_path;
  std::string yaml_text;  // the file as read, stored with every run
  std::vector<BackendKind> backends;
  std::vector<Variant> variants;
};

// Parses and validates; throws ConfigError ("file:line:column: message") on the first problem.
Experiment load_experiment_file(const std::string& path);
Experiment load_experiment_text(const std::string& yaml_text, const std::string& source_name);

}  // namespace twinstep
