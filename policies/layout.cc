#include "policies/layout.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

#include "policies/error.h"
#include "policies/rng.h"

namespace twinstep {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ⌊n·i/parts⌋ without overflow.
int64_t cumulative(int64_t n, int64_t i, int64_t parts) {
  return static_cast<int64_t>(static_cast<__int128>(n) * i / parts);
}

std::string to_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string weights_label(const ModelSpec& m, const LayoutSpec& l) {
  const std::string base =
      l.weight_dtype ? dtype_name(*l.weight_dtype)
                     : (m.weight_bytes == 2 ? std::string("bf16")
                                            : std::to_string(m.weight_bytes) + " B/param");
  std::string s = base;
  if (l.expert_dtype && (!l.weight_dtype || *l.expert_dtype != *l.weight_dtype))
    s += std::string(", experts ") + dtype_name(*l.expert_dtype);
  if (l.expert_act_dtype && *l.expert_act_dtype != Dtype::kBf16)
    s += std::string(" (") + dtype_name(*l.expert_act_dtype) + " act)";
  return s;
}

std::string kv_label(const ModelSpec& m, const LayoutSpec& l) {
  std::string s = l.kv_dtype ? dtype_name(*l.kv_dtype)
                             : (m.kv_bytes == 2 ? std::string("bf16")
                                                : std::to_string(m.kv_bytes) + " B/value");
  if (l.kv_compression != 1.0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, " /%.4g", l.kv_compression);
    s += buf;
  }
  return s;
}

}  // namespace

const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::kBf16:
      return "bf16";
    case Dtype::kFp8:
      return "fp8";
    case Dtype::kMxfp4:
      return "mxfp4";
  }
  return "?";
}

Dtype parse_dtype(const std::string& name) {
  if (name == "bf16") return Dtype::kBf16;
  if (name == "fp8") return Dtype::kFp8;
  if (name == "mxfp4") return Dtype::kMxfp4;
  throw ConfigError("", "unknown dtype '" + name + "'; known: bf16, fp8, mxfp4");
}

int64_t weight_storage_bytes(Dtype d, int64_t values) {
  switch (d) {
    case Dtype::kBf16:
      return 2 * values;
    case Dtype::kFp8:
      return values + 4 * ceil_div(values, 128 * 128);
    case Dtype::kMxfp4:
      return ceil_div(values, 2) + ceil_div(values, 32);
  }
  return 0;
}

int64_t activation_storage_bytes(Dtype d, int64_t values) {
  switch (d) {
    case Dtype::kBf16:
      return 2 * values;
    case Dtype::kFp8:
      return values + 4 * ceil_div(values, 128);
    case Dtype::kMxfp4:
      return ceil_div(values, 2) + ceil_div(values, 32);
  }
  return 0;
}

int64_t weight_bytes_in(const std::optional<Dtype>& d, int32_t model_bytes, int64_t values) {
  return d ? weight_storage_bytes(*d, values) : values * model_bytes;
}

int32_t kv_value_bytes(const ModelSpec& m, const LayoutSpec& l) {
  if (!l.kv_dtype) return m.kv_bytes;
  return *l.kv_dtype == Dtype::kFp8 ? 1 : 2;
}

int64_t compressed_kv_bytes(const LayoutSpec& l, int64_t raw_bytes) {
  if (l.kv_compression == 1.0) return raw_bytes;
  return std::llround(double(raw_bytes) / l.kv_compression);
}

int32_t LayoutSpec::width() const { return std::max({tp, dp, cp, ep}); }

LayoutSpec parse_layout(const std::string& name) {
  LayoutSpec l;
  const std::string up = to_upper(name);
  bool seen[5] = {};
  size_t pos = 0;
  while (pos <= up.size()) {
    const size_t dash = std::min(up.find('-', pos), up.size());
    const std::string part = up.substr(pos, dash - pos);
    static const char* kKeys[5] = {"TP", "PP", "DP", "EP", "CP"};
    int32_t* fields[5] = {&l.tp, &l.pp, &l.dp, &l.ep, &l.cp};
    int k = 0;
    while (k < 5 && part.rfind(kKeys[k], 0) != 0) ++k;
    const std::string digits = k < 5 ? part.substr(2) : "";
    const bool numeric = !digits.empty() && digits.size() <= 6 &&
                         std::all_of(digits.begin(), digits.end(), [](char c) {
                           return std::isdigit(static_cast<unsigned char>(c));
                         });
    if (k == 5 || !numeric || seen[k] || std::stoi(digits) < 1)
      throw ConfigError("", "bad layout '" + name +
                                "': expected parts like TP8, PP2, DP16, EP16, CP8 joined by '-', "
                                "each at most once, degrees >= 1");
    seen[k] = true;
    *fields[k] = std::stoi(digits);
    pos = dash + 1;
  }
  return l;
}

std::string layout_name(const LayoutSpec& l) {
  std::string s;
  auto add = [&](const char* key, int32_t v) {
    if (v <= 1) return;
    s += (s.empty() ? "" : "-") + std::string(key) + std::to_string(v);
  };
  add("PP", l.pp);
  add("CP", l.cp);
  add("DP", l.dp);
  add("TP", l.tp);
  add("EP", l.ep);
  return s.empty() ? "TP1" : s;
}

void validate_layout(const ModelSpec& m, const LayoutSpec& l) {
  auto fail = [&](const std::string& why) {
    throw ConfigError("", "layout " + layout_name(l) + " for " + m.name + ": " + why);
  };
  if (l.tp < 1 || l.pp < 1 || l.dp < 1 || l.ep < 1 || l.cp < 1) fail("degrees must be >= 1");
  const int32_t w = l.width();
  for (int32_t d : {l.tp, l.dp, l.ep, l.cp})
    if (d > 1 && d != w)
      fail("every degree > 1 within a stage must equal the stage width " + std::to_string(w));
  if (std::max({l.tp, l.dp, l.cp}) != w)
    fail("attention must be spread over the stage: give TP, DP or CP equal to EP");
  if (l.dp > 1 && l.cp > 1) fail("DP and CP attention together are not modelled");
  if (l.dp > 1 && l.tp > 1)
    fail("DP attention with TP MLP/MoE (token gather/scatter) is not modelled; use DPn-EPn");
  if (l.pp > static_cast<int32_t>(m.layers.size()))
    fail("more pipeline stages than layers (" + std::to_string(m.layers.size()) + ")");
  if (l.ep > 1 && !m.has_moe()) fail("EP needs MoE layers");
  if (!(l.kv_compression > 0)) fail("kv_compression must be > 0");
  if (!(l.hbm_usable_fraction > 0 && l.hbm_usable_fraction <= 1))
    fail("hbm_usable_fraction must be in (0, 1]");
  if (l.runtime_buffer_bytes < 0) fail("runtime_buffer_bytes must be >= 0");
  if (l.kv_dtype && *l.kv_dtype == Dtype::kMxfp4) fail("KV in mxfp4 is not modelled");
  if (l.microbatches < 0 || l.prefill_chunk_tokens < 0)
    fail("microbatches and prefill_chunk_tokens must be >= 0");
  if (l.pp == 1 && (l.microbatches > 1 || l.prefill_chunk_tokens > 0))
    fail("microbatches and prefill_chunk_tokens apply to pipeline stages only (pp > 1)");
  const ExpertLoad& load = l.expert_load;
  if (load.kind == ExpertLoad::Kind::kZipf && !(load.zipf_s >= 0)) fail("zipf s must be >= 0");
  if (load.kind == ExpertLoad::Kind::kHot && !(load.hot_fraction >= 0 && load.hot_fraction <= 1))
    fail("hot_fraction must be in [0, 1]");
  const bool tp_attn = attention_sharding(l) == AttnSharding::kTp;
  for (const LayerSpec& layer : m.layers) {
    if (tp_attn && layer.attn.num_q_heads < w)
      fail("TP " + std::to_string(w) + " exceeds the " + std::to_string(layer.attn.num_q_heads) +
           " attention heads of a layer");
    if (layer.mlp.kind != MlpKind::kMoe) continue;
    if (layer.mlp.num_experts < l.ep)
      fail("EP " + std::to_string(l.ep) + " exceeds the " + std::to_string(layer.mlp.num_experts) +
           " experts of a layer");
    if (load.kind == ExpertLoad::Kind::kHot &&
        (load.hot_experts < 1 || load.hot_experts >= layer.mlp.num_experts))
      fail("hot_experts must be in [1, experts)");
  }
}

AttnSharding attention_sharding(const LayoutSpec& l) {
  if (l.cp > 1) return AttnSharding::kCp;
  if (l.dp > 1) return AttnSharding::kDp;
  return AttnSharding::kTp;
}

MoeSharding moe_sharding(const LayoutSpec& l) {
  if (l.ep > 1) return MoeSharding::kEp;
  return mlp_split(l) ? MoeSharding::kSplit : MoeSharding::kReplicated;
}

bool mlp_split(const LayoutSpec& l) { return attention_sharding(l) != AttnSharding::kDp; }

StageLayers stage_layers(int32_t num_layers, int32_t pp, int32_t stage) {
  const int32_t base = num_layers / pp;
  const int32_t extra = num_layers % pp;
  StageLayers s;
  s.count = base + (stage < extra ? 1 : 0);
  s.first = stage * base + std::min(stage, extra);
  return s;
}

int64_t balanced_share(int64_t n, int32_t parts, int32_t i) {
  return cumulative(n, i + 1, parts) - cumulative(n, i, parts);
}

LayerShard layer_shard(const LayerSpec& layer, const LayoutSpec& l, int32_t index) {
  const int32_t w = l.width();
  const AttentionSpec& a = layer.attn;
  const MlpSpec& p = layer.mlp;
  LayerShard s;
  if (attention_sharding(l) == AttnSharding::kTp) {
    s.heads = static_cast<int32_t>(balanced_share(a.num_q_heads, w, index));
    s.kv_heads = a.num_kv_heads >= w
                     ? static_cast<int32_t>(balanced_share(a.num_kv_heads, w, index))
                     : std::min(a.num_kv_heads, 1);
  } else {
    s.heads = a.num_q_heads;
    s.kv_heads = a.num_kv_heads;
  }
  const bool split = mlp_split(l);
  s.intermediate = split ? balanced_share(p.intermediate, w, index) : p.intermediate;
  s.shared_intermediate =
      split ? balanced_share(p.shared_intermediate, w, index) : p.shared_intermediate;
  const MoeSharding moe = moe_sharding(l);
  s.expert_intermediate = moe == MoeSharding::kSplit
                              ? balanced_share(p.expert_intermediate, w, index)
                              : p.expert_intermediate;
  if (moe == MoeSharding::kEp) {
    s.expert_first = static_cast<int32_t>(cumulative(p.num_experts, index, l.ep));
    s.experts = static_cast<int32_t>(balanced_share(p.num_experts, l.ep, index));
  } else {
    s.expert_first = 0;
    s.experts = p.num_experts;
  }
  return s;
}

std::vector<double> expert_probabilities(const ExpertLoad& load, int32_t experts, int32_t top_k) {
  std::vector<double> p(static_cast<size_t>(experts), 1.0 / experts);
  if (load.kind == ExpertLoad::Kind::kZipf) {
    double sum = 0;
    for (int32_t e = 0; e < experts; ++e) sum += p[size_t(e)] = std::pow(e + 1.0, -load.zipf_s);
    for (double& x : p) x /= sum;
  } else if (load.kind == ExpertLoad::Kind::kHot) {
    const int32_t k = load.hot_experts;
    for (int32_t e = 0; e < experts; ++e)
      p[size_t(e)] = e < k ? load.hot_fraction / k : (1.0 - load.hot_fraction) / (experts - k);
  }
  // Water-fill: no expert takes more than one copy per token.
  const double cap = 1.0 / top_k;
  std::vector<bool> capped(p.size(), false);
  for (;;) {
    double free_mass = 1.0, uncapped_sum = 0;
    int32_t uncapped = 0;
    bool over = false;
    for (size_t e = 0; e < p.size(); ++e) {
      if (!capped[e] && p[e] > cap * (1 + 1e-12)) capped[e] = over = true;
      if (capped[e]) {
        free_mass -= cap;
      } else {
        uncapped_sum += p[e];
        ++uncapped;
      }
    }
    if (!over) break;
    for (size_t e = 0; e < p.size(); ++e) {
      if (capped[e])
        p[e] = cap;
      else
        p[e] = uncapped_sum > 0 ? p[e] * free_mass / uncapped_sum : free_mass / uncapped;
    }
  }
  return p;
}

std::vector<double> placed_expert_probabilities(const ExpertLoad& load, int32_t experts,
                                                int32_t top_k, uint64_t pass_key, int32_t layer) {
  if (load.kind == ExpertLoad::Kind::kUniform) return expert_probabilities(load, experts, top_k);
  // The ranked shares depend on the load alone; simulators ask for them once per layer, rank
  // and pass, so the last ones are kept (per thread).
  thread_local ExpertLoad cached_load;
  thread_local int32_t cached_experts = -1, cached_top_k = -1;
  thread_local std::vector<double> by_rank;
  if (cached_experts != experts || cached_top_k != top_k || cached_load.kind != load.kind ||
      cached_load.zipf_s != load.zipf_s || cached_load.hot_experts != load.hot_experts ||
      cached_load.hot_fraction != load.hot_fraction) {
    by_rank = expert_probabilities(load, experts, top_k);
    cached_load = load;
    cached_experts = experts;
    cached_top_k = top_k;
  }
  std::vector<int32_t> slot(static_cast<size_t>(experts));
  for (int32_t e = 0; e < experts; ++e) slot[size_t(e)] = e;
  const uint64_t stream = splitmix64(pass_key) ^ uint64_t(uint32_t(layer));
  for (int32_t i = experts - 1; i > 0; --i) {
    const uint64_t x = rng_key(load.seed, stream, uint64_t(i));
    const auto j =
        static_cast<int32_t>((static_cast<unsigned __int128>(x) * uint64_t(i + 1)) >> 64);
    std::swap(slot[size_t(i)], slot[size_t(j)]);
  }
  std::vector<double> p(static_cast<size_t>(experts));
  for (int32_t j = 0; j < experts; ++j) p[size_t(slot[size_t(j)])] = by_rank[size_t(j)];
  return p;
}

namespace {
// EP rank `index` of `ep` holds experts [first, last).
struct ExpertBlock {
  int64_t first, last;
};
ExpertBlock expert_block(const MlpSpec& mlp, int32_t ep, int32_t index) {
  return {cumulative(mlp.num_experts, index, ep), cumulative(mlp.num_experts, index + 1, ep)};
}
}  // namespace

ExpertShare expert_share(const ExpertLoad& load, const MlpSpec& mlp, int64_t tokens, int32_t ep,
                         int32_t index) {
  if (load.kind != ExpertLoad::Kind::kUniform) {
    return expert_share(expert_probabilities(load, mlp.num_experts, mlp.top_k), mlp, tokens, ep,
                        index);
  }
  const int32_t experts = mlp.num_experts;
  const auto [first, last] = expert_block(mlp, ep, index);
  const int64_t routed = tokens * mlp.top_k;
  ExpertShare s;
  s.experts = static_cast<int32_t>(last - first);
  s.routed_tokens = cumulative(routed, last, experts) - cumulative(routed, first, experts);
  // The same expression as the single-GPU kernel list: E·(1 − (1 − k/E)^T).
  const double miss = std::pow(1.0 - double(mlp.top_k) / double(experts), double(tokens));
  s.distinct_experts = static_cast<int64_t>(std::llround(double(s.experts) * (1.0 - miss)));
  return s;
}

ExpertShare expert_share(const std::vector<double>& p, const MlpSpec& mlp, int64_t tokens,
                         int32_t ep, int32_t index) {
  const int32_t experts = mlp.num_experts;
  const auto [first, last] = expert_block(mlp, ep, index);
  const int64_t routed = tokens * mlp.top_k;
  ExpertShare s;
  s.experts = static_cast<int32_t>(last - first);
  double before = 0, mine = 0, distinct = 0;
  for (int64_t e = 0; e < last; ++e) {
    if (e < first) {
      before += p[size_t(e)];
      continue;
    }
    mine += p[size_t(e)];
    distinct += 1.0 - std::pow(std::max(0.0, 1.0 - mlp.top_k * p[size_t(e)]), double(tokens));
  }
  auto boundary = [&](double cum, int64_t e) {
    if (e == 0) return int64_t{0};
    if (e == experts) return routed;
    return std::min(routed, static_cast<int64_t>(std::llround(double(routed) * cum)));
  };
  s.routed_tokens = boundary(before + mine, last) - boundary(before, first);
  s.distinct_experts = static_cast<int64_t>(std::llround(distinct));
  return s;
}

void sampled_routing(const std::vector<double>& p, const MlpSpec& mlp, int64_t tokens,
                     uint64_t seed, uint64_t pass_key, int32_t layer, std::vector<int32_t>& ids) {
  const int32_t experts = mlp.num_experts;
  const int32_t k = std::min(mlp.top_k, experts);
  ids.clear();
  ids.reserve(size_t(tokens) * size_t(k));
  // Cumulative shares for inverse-CDF draws (p sums to 1 up to rounding: scaled by the total).
  thread_local std::vector<double> cdf;
  cdf.resize(size_t(experts));
  double total = 0;
  for (int32_t e = 0; e < experts; ++e) cdf[size_t(e)] = total += p[size_t(e)];
  const uint64_t stream = splitmix64(splitmix64(pass_key) ^ uint64_t(uint32_t(layer)));
  for (int64_t t = 0; t < tokens; ++t) {
    const size_t first = ids.size();
    auto picked = [&](int32_t e) {
      return std::find(ids.begin() + first, ids.end(), e) != ids.end();
    };
    // 64 draws per token: a repeat is drawn again; far more than top_k distinct experts need
    // unless a few experts hold nearly every share (then the remaining picks take the next
    // experts in id order, so a token still has top_k of them).
    for (uint64_t d = 0; d < 64 && int32_t(ids.size() - first) < k; ++d) {
      const double u = rng_uniform(seed, stream, uint64_t(t) * 64 + d) * total;
      const auto e = int32_t(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
      const int32_t pick = std::min(e, experts - 1);
      if (!picked(pick)) ids.push_back(pick);
    }
    for (int32_t e = 0; int32_t(ids.size() - first) < k; ++e)
      if (!picked(e)) ids.push_back(e);
  }
}

ExpertShare routed_expert_share(const MlpSpec& mlp, std::span<const int32_t> ids, int32_t ep,
                                int32_t index) {
  const auto [first, last] = expert_block(mlp, ep, index);
  ExpertShare s;
  s.experts = static_cast<int32_t>(last - first);
  thread_local std::vector<char> hit;  // distinct hits of this rank's experts
  hit.assign(size_t(last - first), 0);
  for (const int32_t e : ids) {
    if (e < first || e >= last) continue;
    ++s.routed_tokens;
    char& h = hit[size_t(e - first)];
    if (!h) {
      h = 1;
      ++s.distinct_experts;
    }
  }
  return s;
}

ExpertShare sampled_expert_share(const std::vector<double>& p, const MlpSpec& mlp, int64_t tokens,
                                 int32_t ep, int32_t index, uint64_t seed, uint64_t pass_key,
                                 int32_t layer) {
  thread_local std::vector<int32_t> ids;
  sampled_routing(p, mlp, tokens, seed, pass_key, layer, ids);
  return routed_expert_share(mlp, ids, ep, index);
}

int32_t decode_microbatches(const LayoutSpec& l, int32_t requests) {
  if (l.pp <= 1) return 1;
  const int32_t want = l.microbatches > 0 ? l.microbatches : l.pp;
  return std::max(1, std::min(want, requests));
}

int64_t prefill_chunk_tokens(const LayoutSpec& l, int64_t tokens) {
  if (l.pp <= 1 || tokens <= 0) return std::max<int64_t>(tokens, 1);
  if (l.prefill_chunk_tokens > 0) return l.prefill_chunk_tokens;
  return ceil_div(tokens, l.microbatches > 0 ? l.microbatches : l.pp);
}

RankMemory rank_memory(const ModelSpec& m, const HardwareSpec& hw, const LayoutSpec& l,
                       int32_t rank) {
  validate_layout(m, l);
  if (rank < 0 || rank >= l.world())
    throw ConfigError("", "rank " + std::to_string(rank) + " outside layout " + layout_name(l));
  const int32_t w = l.width();
  const int32_t index = rank % w;
  const int64_t h = m.hidden;
  const int32_t mb = m.weight_bytes;
  const int32_t kvb = kv_value_bytes(m, l);
  const bool tp_attn = attention_sharding(l) == AttnSharding::kTp && w > 1;
  const bool split = mlp_split(l) && w > 1;
  auto wgt = [&](int64_t values) { return weight_bytes_in(l.weight_dtype, mb, values); };
  const std::optional<Dtype> expert_fmt = l.expert_dtype ? l.expert_dtype : l.weight_dtype;

  RankMemory r;
  r.rank = rank;
  r.stage = rank / w;
  r.layers = stage_layers(static_cast<int32_t>(m.layers.size()), l.pp, r.stage);
  const bool first_stage = r.stage == 0;
  const bool last_stage = r.stage == l.pp - 1;
  const int64_t vocab_rows = l.vocab_parallel ? balanced_share(m.vocab, w, index) : m.vocab;
  // Bytes every rank of the stage holds alike, when the stage has more than one rank.
  int64_t replicated = 0;
  auto add_repl = [&](int64_t& role, int64_t bytes, bool is_replicated) {
    role += bytes;
    if (is_replicated && w > 1) replicated += bytes;
  };

  if (first_stage) {
    add_repl(r.embedding_bytes, vocab_rows * h * mb, !l.vocab_parallel);
    if (m.mtp_input_proj) {
      add_repl(r.embedding_bytes, 2 * h * mb + wgt(2 * h * h), true);  // enorm, hnorm, eh_proj
    }
  }
  if (last_stage) {
    add_repl(r.norm_bytes, h * mb, true);  // final norm
    if (!m.tie_embeddings || l.pp > 1)
      add_repl(r.lm_head_bytes, vocab_rows * h * mb, !l.vocab_parallel);
  }

  int64_t kv_raw = 0;
  for (int32_t i = r.layers.first; i < r.layers.first + r.layers.count; ++i) {
    const LayerSpec& layer = m.layers[size_t(i)];
    const AttentionSpec& a = layer.attn;
    const MlpSpec& p = layer.mlp;
    const LayerShard s = layer_shard(layer, l, index);
    const bool attn_repl = !tp_attn;  // DP/CP (or width 1): the whole attention on every rank
    add_repl(r.norm_bytes, 2 * h * mb, true);
    switch (a.kind) {
      case AttentionKind::kGqa: {
        const int64_t q = int64_t{s.heads} * a.head_dim;
        const int64_t kv = int64_t{s.kv_heads} * a.head_dim;
        // KV heads shared by w / num_kv_heads ranks when fewer than w are not in
        // replicated_bytes (not every rank holds the same ones).
        add_repl(r.attention_bytes, wgt(h * (q + 2 * kv)) + wgt(q * h), attn_repl);
        kv_raw += 2 * kv * kvb;
        break;
      }
      case AttentionKind::kMla: {
        const int64_t heads = s.heads;
        const int64_t qk_head = int64_t{a.qk_nope_head_dim} + a.qk_rope_head_dim;
        // q_a / kv_a projections and their norms are replicated under TP (they produce the
        // shared latent); q_b, kv_b, o_proj split by heads.
        int64_t shared =
            wgt(h * (int64_t{a.kv_lora_rank} + a.qk_rope_head_dim)) + int64_t{a.kv_lora_rank} * mb;
        int64_t per_head =
            wgt(int64_t{a.kv_lora_rank} * heads * (int64_t{a.qk_nope_head_dim} + a.v_head_dim)) +
            wgt(heads * a.v_head_dim * h);
        if (a.q_lora_rank > 0) {
          shared += wgt(h * a.q_lora_rank) + int64_t{a.q_lora_rank} * mb;
          per_head += wgt(int64_t{a.q_lora_rank} * heads * qk_head);
        } else {
          per_head += wgt(h * heads * qk_head);
        }
        add_repl(r.attention_bytes, shared, true);
        add_repl(r.attention_bytes, per_head, attn_repl);
        kv_raw += (int64_t{a.kv_lora_rank} + a.qk_rope_head_dim) * kvb;
        break;
      }
      case AttentionKind::kLinear: {
        const int64_t heads = s.heads;
        const int64_t d = heads * a.head_dim;
        // Split by heads except the low-rank decay down-projection (hidden → head_dim).
        add_repl(r.attention_bytes, wgt(h * a.head_dim), true);
        add_repl(r.attention_bytes,
                 wgt(4 * h * d) + wgt(int64_t{a.head_dim} * d) + wgt(h * heads) +
                     wgt(3 * d * a.conv_width) + wgt(d * h) + d * mb,
                 attn_repl);
        r.state_bytes_per_request +=
            heads * a.head_dim * a.head_dim * 4 + 3 * d * (a.conv_width - 1) * kvb;
        break;
      }
    }
    if (p.kind == MlpKind::kDense) {
      add_repl(r.mlp_bytes, wgt(3 * h * s.intermediate), !split);
      continue;
    }
    add_repl(r.router_bytes, h * p.num_experts * mb, true);
    add_repl(r.mlp_bytes, int64_t{p.num_shared_experts} * wgt(3 * h * s.shared_intermediate),
             !split);
    const int64_t expert_values = int64_t{s.experts} * 3 * h * s.expert_intermediate;
    add_repl(r.expert_bytes, weight_bytes_in(expert_fmt, mb, expert_values),
             moe_sharding(l) == MoeSharding::kReplicated);
  }
  r.kv_bytes_per_token = compressed_kv_bytes(l, kv_raw);
  r.replicated_bytes = replicated;
  r.weight_bytes = r.embedding_bytes + r.attention_bytes + r.mlp_bytes + r.expert_bytes +
                   r.router_bytes + r.norm_bytes + r.lm_head_bytes;
  r.runtime_buffer_bytes = l.runtime_buffer_bytes;
  r.usable_hbm_bytes = static_cast<int64_t>(double(hw.hbm_bytes) * l.hbm_usable_fraction);
  r.free_bytes = r.usable_hbm_bytes - r.weight_bytes - r.runtime_buffer_bytes;
  r.kv_capacity_tokens =
      r.kv_bytes_per_token > 0 ? std::max<int64_t>(0, r.free_bytes) / r.kv_bytes_per_token : -1;
  return r;
}

std::vector<CapacityCell> CapacityTable::cells(size_t row) const {
  const CapacityRow& c = rows.at(row);
  const RankMemory& b = c.binding;
  return {c.layout,
          c.weights,
          c.kv,
          int64_t{c.world},
          int64_t{b.rank},
          int64_t{b.layers.count},
          double(b.weight_bytes) / 1e9,
          double(b.expert_bytes) / 1e9,
          double(b.runtime_buffer_bytes) / 1e9,
          double(b.free_bytes) / 1e9,
          b.kv_bytes_per_token,
          b.kv_capacity_tokens,
          c.replica_kv_tokens,
          c.ratio};
}

CapacityTable capacity_table(const ModelSpec& m, const HardwareSpec& hw,
                             const std::vector<LayoutSpec>& layouts) {
  CapacityTable t;
  t.columns = {"layout",
               "weights",
               "kv",
               "world",
               "binding_rank",
               "layers",
               "weights_gb",
               "expert_weights_gb",
               "buffers_gb",
               "free_gb",
               "kv_bytes_per_token",
               "kv_tokens_per_rank",
               "kv_tokens_per_replica",
               "ratio"};
  for (size_t i = 0; i < layouts.size(); ++i) {
    const LayoutSpec& l = layouts[i];
    validate_layout(m, l);
    const int32_t w = l.width();
    const bool spread = attention_sharding(l) != AttnSharding::kTp;
    CapacityRow row;
    row.layout = layout_name(l);
    row.weights = weights_label(m, l);
    row.kv = kv_label(m, l);
    row.world = l.world();
    row.replica_kv_tokens = -1;
    bool have_binding = false;
    for (int32_t stage = 0; stage < l.pp; ++stage) {
      int64_t stage_min = -1;
      for (int32_t idx = 0; idx < w; ++idx) {
        const RankMemory r = rank_memory(m, hw, l, stage * w + idx);
        if (r.kv_capacity_tokens < 0) continue;
        if (stage_min < 0 || r.kv_capacity_tokens < stage_min) stage_min = r.kv_capacity_tokens;
        if (!have_binding || r.kv_capacity_tokens < row.binding.kv_capacity_tokens) {
          row.binding = r;
          have_binding = true;
        }
      }
      if (stage_min < 0) continue;
      const int64_t stage_tokens = spread ? stage_min * w : stage_min;
      if (row.replica_kv_tokens < 0 || stage_tokens < row.replica_kv_tokens)
        row.replica_kv_tokens = stage_tokens;
    }
    if (!have_binding) row.binding = rank_memory(m, hw, l, 0);
    for (size_t j = 0; j < i; ++j) {
      const LayoutSpec& o = layouts[j];
      if (o.tp == l.tp && o.pp == l.pp && o.dp == l.dp && o.ep == l.ep && o.cp == l.cp) {
        const int64_t base = t.rows[j].binding.kv_capacity_tokens;
        row.ratio = base > 0 ? double(row.binding.kv_capacity_tokens) / double(base)
                             : std::numeric_limits<double>::quiet_NaN();
        break;
      }
    }
    t.rows.push_back(std::move(row));
  }
  return t;
}

std::vector<LayoutSpec> seed004_capacity_layouts(const std::vector<std::string>& layout_names) {
  // Seed 004's factor for "compact KV state" (stated there, not derived here).
  constexpr double kCompactKv = 2.268;
  std::vector<LayoutSpec> out;
  for (const std::string& name : layout_names) {
    LayoutSpec base = parse_layout(name);
    base.weight_dtype = Dtype::kFp8;
    base.kv_dtype = Dtype::kBf16;
    LayoutSpec small = base;
    small.expert_dtype = Dtype::kMxfp4;
    small.expert_act_dtype = Dtype::kFp8;
    LayoutSpec compact = base;
    compact.kv_compression = kCompactKv;
    LayoutSpec both = small;
    both.kv_compression = kCompactKv;
    out.insert(out.end(), {base, small, compact, both});
  }
  return out;
}

}  // namespace twinstep
