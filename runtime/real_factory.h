// The runner's entry point to the real backend: a Backend for one experiment variant.
#pragma once

#include <memory>
#include <vector>

#include "experiments/experiment.h"
#include "policies/backend.h"
#include "policies/workload.h"
#include "runtime/real_backend.h"

namespace twinstep {

// A real backend for `v`: an engine holding v.model with synthetic weights (seed v.seed, the
// values `twinstep make-checkpoint --seed` writes), one KV slot per concurrent request sized for
// the longest request, decode graphs of v.policy.graph_mode captured before the run, host costs
// drawn from v.host_costs with seed v.seed (as simulate_variant does), prompts from
// v.workload.seed, greedy sampling. With speculation (v.policy.spec), the engine holds a synthetic
// draft module built at fidelity v.acceptance.draft_fidelity (checkpoint.h
// synthetic_weight_list; the target's weights then follow that construction too). `requests`
// must outlive the backend. Throws ConfigError when the model is outside the runtime's scope
// (GQA, head_dim 128; dense or Qwen3-MoE-like) and Error when it does not fit the GPU's memory.

std::unique_ptr<Backend> make_real_backend(const Variant& v,
                                           const std::vector<RequestSpec>& requests);

}  // namespace twinstep
