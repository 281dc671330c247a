// MoeRoutingStats: what the routing decisions of MoE layers did over a run's traced decode steps,
// accumulated from expert ids alike on both backends (the simulator from the routing it draws
// under ExpertLoad::sampled, the real runtime from the ids its router kernel wrote), so the
// moe_* metrics (results/metrics.h, docs/layouts.md "Routing metrics") line up sim against real.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace twinstep {

struct MoeRoutingStats {
  int32_t num_experts = 0;   // 0 until the first add
  int32_t ep = 1;            // EP ranks: rank i holds experts [⌊E·i/ep⌋, ⌊E·(i+1)/ep⌋)
  int64_t passes = 0;        // (launch, MoE layer) pairs added
  int64_t rank_experts = 0;  // Σ over passes and ranks of the distinct experts a rank got
  int64_t rank_experts_max = 0;  // Σ over passes of the most distinct experts of one rank
  // picks[layer * num_experts + e]: routed copies (token, slot) expert e of `layer` received.
  std::vector<int64_t> picks;
};

// Adds one pass of MoE layer `layer`: ids[t * top_k + j] is token t's j-th expert, tokens =
// ids.size() / top_k (ids.size() % top_k == 0; ids in [0, num_experts), distinct per token).
// num_experts and ep must be the same on every call (asserted).
void add_moe_routing(MoeRoutingStats& s, int32_t layer, std::span<const int32_t> ids, int32_t top_k,
                     int32_t num_experts, int32_t ep);

// The figures the metrics report, from `s` (passes > 0):
//   rank_experts_mean      rank_experts / (passes · ep)
//   rank_experts_max_mean  rank_experts_max / passes
//   expert_share_max       mean over the layers with picks of max_e picks / Σ_e picks
struct MoeRoutingFigures {
  double rank_experts_mean = 0;
  double rank_experts_max_mean = 0;
  double expert_share_max = 0;
};
MoeRoutingFigures moe_routing_figures(const MoeRoutingStats& s);

}  // namespace twinstep
