// CPU reference of the runtime's Llama forward: fp32 arithmetic with bf16 rounding at the same
// points as the GPU kernels (each kernel's output; the residual stream; the KV cache; SwiGLU
// fused at decode, unfused — gate and up rounded first — at prefill). MoE layers follow
// kernels/moe.h at decode and prefill alike (moe_forward serves both): fp32 router logits,
// top-k by logit (ties: lower id), fp32 softmax weights, each expert's SwiGLU activation rounded
// to bf16, its down projection kept in fp32, the weighted sum in slot order plus the shared
// expert, one bf16 rounding. Synthetic weights from runtime/synthetic.h, so it needs no GPU and
// no checkpoint.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/checkpoint.h"
#include "runtime/synthetic.h"

namespace twinstep::testing {

inline float bf16_round(float x) {
  return synthetic::bf16_bits_to_float(synthetic::float_to_bf16_bits(x));
}

class CpuLlama {
 public:
  // draft_fidelity >= 0: the target of synthetic_weight_list(c, false, draft_fidelity).
  CpuLlama(const LlamaConfig& c, uint64_t seed, double draft_fidelity = -1) : c_(c) {
    for (const WeightDesc& w : synthetic_weight_list(c, false, draft_fidelity)) {
      uint64_t n = 1;
      for (int64_t d : w.shape) n *= uint64_t(d);
      std::vector<uint16_t> bits(n);
      synthetic_tensor_bits(w, seed, 0, n, bits.data());
      std::vector<float>& f = weights_[w.name];
      f.resize(n);
      for (uint64_t i = 0; i < n; ++i) f[i] = synthetic::bf16_bits_to_float(bits[i]);
    }
    // RoPE inverse frequencies as the GPU table (float), Llama-3 rule with factor from config.
    const double pi = 3.14159265358979323846;
    for (int i = 0; i < 64; ++i) {
      const double inv = 1.0 / std::pow(c.rope_theta, 2.0 * i / 128);
      const double wavelen = 2 * pi / inv;
      const double lo = c.rope_original_context / c.rope_low_freq_factor;
      const double hi = c.rope_original_context / c.rope_high_freq_factor;
      double s = wavelen > lo ? inv / c.rope_factor : inv;
      if (wavelen >= hi && wavelen <= lo) {
        const double sm = (c.rope_original_context / wavelen - c.rope_low_freq_factor) /
                          (c.rope_high_freq_factor - c.rope_low_freq_factor);
        s = (1 - sm) * inv / c.rope_factor + sm * inv;
      }
      inv_freq_[i] = float(s);
    }
    k_.assign(size_t(c.layers), {});
    v_.assign(size_t(c.layers), {});
  }

  // Logits after prefilling `prompt` (the cache is reset first).
  std::vector<float> prefill(const std::vector<int32_t>& prompt) {
    for (auto& k : k_) k.clear();
    for (auto& v : v_) v.clear();
    return forward(prompt, /*prefill=*/true);
  }
  // Logits after decoding one more token.
  std::vector<float> decode(int32_t token) { return forward({token}, /*prefill=*/false); }

  // Greedy: prefill `prompt`, then decode; returns n tokens (the first from the prefill).
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int n) {
    for (auto& k : k_) k.clear();
    for (auto& v : v_) v.clear();
    std::vector<int32_t> out;
    min_gap_ = INFINITY;
    std::vector<float> logits = forward(prompt, /*prefill=*/true);
    out.push_back(argmax(logits));
    while (int(out.size()) < n) {
      logits = forward({out.back()}, /*prefill=*/false);
      out.push_back(argmax(logits));
    }
    return out;
  }
  // The MoE FFN of layer `layer` on one row of normed input x (tests of the reference itself).
  std::vector<float> moe_layer(int layer, const std::vector<float>& x) const {
    return moe_ffn("model.layers." + std::to_string(layer) + ".", x, 1);
  }
  // MoE models: the routing of the last forward (prefill or decode), per layer: row t's top_k
  // expert ids at [t * top_k ...], by descending logit (ties: lower id), as kernels/moe.h's
  // MoeRouting copies them.
  const std::vector<std::vector<int>>& last_routing() const { return routing_; }
  // Smallest gap between the two largest logits over the last generate() (diagnostics: how
  // close the reference came to a tie).
  float min_gap() const { return min_gap_; }

  int32_t argmax(const std::vector<float>& l) {
    int32_t best = 0;
    float second = -INFINITY;
    for (int32_t i = 1; i < int32_t(l.size()); ++i) {
      if (l[size_t(i)] > l[size_t(best)]) {
        second = l[size_t(best)];
        best = i;
      } else if (l[size_t(i)] > second) {
        second = l[size_t(i)];
      }
    }
    min_gap_ = std::min(min_gap_, l[size_t(best)] - second);
    return best;
  }

 private:
  const std::vector<float>& w(const std::string& n) const { return weights_.at(n); }

  static std::vector<float> matmul(const std::vector<float>& x, int rows,
                                   const std::vector<float>& wt, int n,
                                   int k) {  // out[r][j] = Σ x[r][i] w[j][i], fp32
    std::vector<float> out(size_t(rows) * n);
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < n; ++j) {
        float s = 0;
        const float* a = &x[size_t(r) * k];
        const float* b = &wt[size_t(j) * k];
        for (int i = 0; i < k; ++i) s += a[i] * b[i];
        out[size_t(r) * n + j] = s;
      }
    return out;
  }
  static void round_all(std::vector<float>& v) {
    for (float& x : v) x = bf16_round(x);
  }
  void rmsnorm(const std::vector<float>* delta, std::vector<float>& res,
               const std::vector<float>& g, std::vector<float>& out, int rows) const {
    const int H = int(c_.hidden);
    out.resize(res.size());
    for (int r = 0; r < rows; ++r) {
      float* x = &res[size_t(r) * H];
      if (delta) {
        for (int i = 0; i < H; ++i) x[i] = bf16_round(x[i] + (*delta)[size_t(r) * H + i]);
      }
      float ss = 0;
      for (int i = 0; i < H; ++i) ss += x[i] * x[i];
      const float inv = 1.0f / std::sqrt(ss / float(H) + float(c_.rms_eps));
      for (int i = 0; i < H; ++i) out[size_t(r) * H + i] = bf16_round(x[i] * inv * g[size_t(i)]);
    }
  }

  // One SwiGLU FFN (weights under prefix f, width inter) on one row, as moe_forward computes an
  // expert: fp32 gate and up, the activation rounded to bf16, the down projection left in fp32.
  std::vector<float> expert(const std::string& f, const float* x, int inter) const {
    const int H = int(c_.hidden);
    const std::vector<float> xr(x, x + H);
    const std::vector<float> g = matmul(xr, 1, w(f + "gate_proj.weight"), inter, H);
    const std::vector<float> u = matmul(xr, 1, w(f + "up_proj.weight"), inter, H);
    std::vector<float> act(static_cast<size_t>(inter));
    for (size_t i = 0; i < act.size(); ++i)
      act[i] = bf16_round(g[i] / (1.0f + std::exp(-g[i])) * u[i]);
    return matmul(act, 1, w(f + "down_proj.weight"), H, inter);
  }

  // The MoE FFN of layer prefix p over T rows of xn (kernels/moe.h's contract).
  std::vector<float> moe_ffn(const std::string& p, const std::vector<float>& xn, int T,
                             std::vector<int>* routing = nullptr) const {
    const int H = int(c_.hidden), E = c_.num_experts, K = c_.top_k;
    const std::vector<float> logits = matmul(xn, T, w(p + "mlp.gate.weight"), E, H);
    std::vector<float> out(size_t(T) * H);
    for (int t = 0; t < T; ++t) {
      const float* l = &logits[size_t(t) * E];
      std::vector<int> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
      const float mx = l[order[0]];
      float denom = 0;
      for (int e = 0; e < (c_.norm_topk_prob ? K : E); ++e)
        denom += std::exp(l[order[size_t(e)]] - mx);
      const float* x = &xn[size_t(t) * H];
      std::vector<std::vector<float>> y;
      std::vector<float> weight;
      for (int j = 0; j < K; ++j) {
        const int e = order[size_t(j)];
        if (routing != nullptr) routing->push_back(e);
        weight.push_back(std::exp(l[e] - mx) / denom);
        y.push_back(
            expert(p + "mlp.experts." + std::to_string(e) + ".", x, int(c_.expert_intermediate)));
      }
      std::vector<float> shared;
      if (c_.shared_intermediate > 0)
        shared = expert(p + "mlp.shared_expert.", x, int(c_.shared_intermediate));
      for (int h = 0; h < H; ++h) {
        float acc = 0;
        for (int j = 0; j < K; ++j) acc += weight[size_t(j)] * y[size_t(j)][size_t(h)];
        if (!shared.empty()) acc += shared[size_t(h)];
        out[size_t(t) * H + h] = bf16_round(acc);
      }
    }
    return out;
  }

  std::vector<float> forward(const std::vector<int32_t>& toks, bool prefill) {
    const int T = int(toks.size()), H = int(c_.hidden), I = int(c_.intermediate);
    const int qh = c_.q_heads, kvh = c_.kv_heads, D = 128, group = qh / kvh;
    const int qd = int(c_.q_dim()), kvd = int(c_.kv_dim()), qkvd = int(c_.qkv_dim());
    const int pos0 = int(k_[0].size()) / kvd;
    std::vector<float> res(size_t(T) * H), xn, mlp;
    const std::vector<float>& emb = w("model.embed_tokens.weight");
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < H; ++i) res[size_t(t) * H + i] = emb[size_t(toks[size_t(t)]) * H + i];
    for (int l = 0; l < c_.layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      rmsnorm(l == 0 ? nullptr : &mlp, res, w(p + "input_layernorm.weight"), xn, T);
      std::vector<float> wqkv = w(p + "self_attn.q_proj.weight");
      wqkv.insert(wqkv.end(), w(p + "self_attn.k_proj.weight").begin(),
                  w(p + "self_attn.k_proj.weight").end());
      wqkv.insert(wqkv.end(), w(p + "self_attn.v_proj.weight").begin(),
                  w(p + "self_attn.v_proj.weight").end());
      std::vector<float> qkv = matmul(xn, T, wqkv, qkvd, H);
      round_all(qkv);
      // RoPE (rotate-half) on q and k; append k, v to the cache.
      std::vector<float> q(size_t(T) * qd);
      for (int t = 0; t < T; ++t) {
        const int pos = pos0 + t;
        float* row = &qkv[size_t(t) * qkvd];
        for (int h = 0; h < qh + kvh; ++h) {
          float* x = row + h * D;
          float y[128];
          for (int i = 0; i < 64; ++i) {
            const double angle = double(pos) * double(inv_freq_[i]);
            const double two_pi = 6.283185307179586;
            const float a = float(angle - std::floor(angle / two_pi) * two_pi);
            const float s = std::sin(a), co = std::cos(a);
            y[i] = bf16_round(x[i] * co - x[i + 64] * s);
            y[i + 64] = bf16_round(x[i + 64] * co + x[i] * s);
          }
          if (h < qh)
            for (int i = 0; i < D; ++i) q[size_t(t) * qd + h * D + i] = y[i];
          else
            for (int i = 0; i < D; ++i) k_[size_t(l)].push_back(y[i]);
        }
        for (int i = 0; i < kvd; ++i) v_[size_t(l)].push_back(row[qd + kvd + i]);
      }
      // Attention: query t sees positions 0 .. pos0 + t.
      std::vector<float> attn(size_t(T) * qd);
      const float scale = 0.08838834764831845f;
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < qh; ++h) {
          const int kh = h / group, n = pos0 + t + 1;
          std::vector<float> sc(static_cast<size_t>(n));
          float mx = -INFINITY;
          for (int j = 0; j < n; ++j) {
            float s = 0;
            for (int i = 0; i < D; ++i)
              s += q[size_t(t) * qd + h * D + i] * k_[size_t(l)][size_t(j) * kvd + kh * D + i];
            sc[size_t(j)] = s * scale;
            mx = std::max(mx, sc[size_t(j)]);
          }
          float sum = 0;
          for (float& s : sc) sum += (s = std::exp(s - mx));
          for (int i = 0; i < D; ++i) {
            float o = 0;
            for (int j = 0; j < n; ++j)
              o += sc[size_t(j)] * v_[size_t(l)][size_t(j) * kvd + kh * D + i];
            attn[size_t(t) * qd + h * D + i] = bf16_round(o / sum);
          }
        }
      std::vector<float> o = matmul(attn, T, w(p + "self_attn.o_proj.weight"), H, qd);
      round_all(o);
      rmsnorm(&o, res, w(p + "post_attention_layernorm.weight"), xn, T);
      if (c_.moe()) {
        routing_.resize(size_t(c_.layers));
        routing_[size_t(l)].clear();
        mlp = moe_ffn(p, xn, T, &routing_[size_t(l)]);
        continue;
      }
      std::vector<float> g = matmul(xn, T, w(p + "mlp.gate_proj.weight"), I, H);
      std::vector<float> u = matmul(xn, T, w(p + "mlp.up_proj.weight"), I, H);
      if (prefill) {  // cuBLAS/gemv outputs rounded, then the swiglu kernel
        round_all(g);
        round_all(u);
      }
      std::vector<float> act(g.size());
      for (size_t i = 0; i < g.size(); ++i)
        act[i] = bf16_round(g[i] / (1.0f + std::exp(-g[i])) * u[i]);
      mlp = matmul(act, T, w(p + "mlp.down_proj.weight"), H, I);
      round_all(mlp);
    }
    // Last row only: final norm and the LM head (fp32 logits).
    std::vector<float> last_res(res.end() - H, res.end()), last_mlp(mlp.end() - H, mlp.end());
    std::vector<float> xf;
    rmsnorm(&last_mlp, last_res, w("model.norm.weight"), xf, 1);
    const std::vector<float>& lm =
        c_.tie_embeddings ? w("model.embed_tokens.weight") : w("lm_head.weight");
    return matmul(xf, 1, lm, int(c_.vocab), H);
  }

  LlamaConfig c_;
  std::map<std::string, std::vector<float>> weights_;
  float inv_freq_[64];
  std::vector<std::vector<float>> k_, v_;  // per layer: [pos][kv_dim], bf16 values
  std::vector<std::vector<int>> routing_;  // last_routing()
  float min_gap_ = 0;
};

}  // namespace twinstep::testing
