#include "policies/moe_routing.h"

#include <algorithm>
#include <cassert>

namespace twinstep {

void add_moe_routing(MoeRoutingStats& s, int32_t layer, std::span<const int32_t> ids, int32_t top_k,
                     int32_t num_experts, int32_t ep) {
  assert(top_k > 0 && num_experts > 0 && ep >= 1 && ep <= num_experts && layer >= 0);
  assert(ids.size() % size_t(top_k) == 0);
  assert(s.num_experts == 0 || (s.num_experts == num_experts && s.ep == ep));
  (void)top_k;  // checked above only
  s.num_experts = num_experts;
  s.ep = ep;
  const size_t need = size_t(layer + 1) * size_t(num_experts);
  if (s.picks.size() < need) s.picks.resize(need, 0);
  int64_t* layer_picks = s.picks.data() + size_t(layer) * size_t(num_experts);
  std::vector<char> hit(size_t(num_experts), 0);
  for (const int32_t e : ids) {
    assert(e >= 0 && e < num_experts);
    ++layer_picks[e];
    hit[size_t(e)] = 1;
  }
  int64_t most = 0;
  for (int32_t r = 0; r < ep; ++r) {
    // The same blocks as layout.h's layer_shard / expert_share (balanced_share's boundaries).
    const int64_t first = int64_t(num_experts) * r / ep, last = int64_t(num_experts) * (r + 1) / ep;
    int64_t distinct = 0;
    for (int64_t e = first; e < last; ++e) distinct += hit[size_t(e)];
    s.rank_experts += distinct;
    most = std::max(most, distinct);
  }
  s.rank_experts_max += most;
  ++s.passes;
}

MoeRoutingFigures moe_routing_figures(const MoeRoutingStats& s) {
  MoeRoutingFigures f;
  if (s.passes <= 0 || s.num_experts <= 0) return f;
  f.rank_experts_mean = double(s.rank_experts) / double(s.passes * s.ep);
  f.rank_experts_max_mean = double(s.rank_experts_max) / double(s.passes);
  const size_t E = size_t(s.num_experts);
  double share_sum = 0;
  int64_t layers = 0;
  for (size_t first = 0; first + E <= s.picks.size(); first += E) {
    int64_t total = 0, most = 0;
    for (size_t e = first; e < first + E; ++e) {
      total += s.picks[e];
      most = std::max(most, s.picks[e]);
    }
    if (total == 0) continue;
    share_sum += double(most) / double(total);
    ++layers;
  }
  if (layers > 0) f.expert_share_max = share_sum / double(layers);
  return f;
}

}  // namespace twinstep
