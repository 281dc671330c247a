#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/lm_head.h"
#include "kernels/philox.h"
#include "tests/kernels/test_util.h"

namespace twinstep::kernels {
namespace {

using test::Bf16Host;
using test::DeviceBuffer;

TEST(LmHead, LogitsArgmaxTop1AndSeededSampling) {
  TS_SKIP_WITHOUT_GPU();
  const int m = 3, vocab = 4096 + 64, k = 512;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Bf16Host w = test::random_bf16(static_cast<size_t>(vocab) * k, rng);
  const Bf16Host x = test::random_bf16(static_cast<size_t>(m) * k, rng);
  auto dw = test::to_device(w);
  auto dx = test::to_device(x);
  DeviceBuffer<float> logits(static_cast<size_t>(m) * vocab);
  DeviceBuffer<int> argmax(m), sampled(m);
  DeviceBuffer<float> top1(m);
  DeviceBuffer<unsigned char> ws(lm_head_workspace_bytes(m, vocab));
  DeviceBuffer<uint64_t> step(1);
  const uint64_t step_value = 41;
  step.upload(std::vector<uint64_t>{step_value});
  const float temperature = 0.8f;
  const uint64_t sample_seed = rng();
  auto run = [&] {
    logits.poison();
    argmax.poison();
    sampled.poison();
    top1.poison();
    lm_head(dw.get(), dx.get(), m, vocab, k, SamplingParams{temperature, sample_seed, step.get()},
            ws.get(), LmHeadOutputs{argmax.get(), top1.get(), sampled.get(), logits.get()},
            nullptr);
  };
  run();
  const auto got_logits = logits.download();
  const auto got_argmax = argmax.download();
  const auto got_sampled = sampled.download();
  const auto got_top1 = top1.download();

  std::vector<double> ref(got_logits.size());
  for (int r = 0; r < m; ++r)
    for (int v = 0; v < vocab; ++v) {
      double acc = 0;
      for (int i = 0; i < k; ++i)
        acc += static_cast<double>(w.values[static_cast<size_t>(v) * k + i]) *
               x.values[static_cast<size_t>(r) * k + i];
      ref[static_cast<size_t>(r) * vocab + v] = acc;
    }
  EXPECT_LT(test::rel_error(got_logits, ref), 1e-4);  // fp32 logits, no bf16 output rounding

  for (int r = 0; r < m; ++r) {
    const float* l = &got_logits[static_cast<size_t>(r) * vocab];
    int best = 0;
    double best_score = -INFINITY, sample_score = -INFINITY;
    int sample = 0;
    for (int v = 0; v < vocab; ++v) {
      if (l[v] > l[best]) best = v;
      const double s = l[v] / temperature + gumbel_noise(sample_seed, step_value, r, v);
      if (s > best_score) {
        best_score = s;
        sample = v;
      }
    }
    EXPECT_EQ(got_argmax[r], best) << "row " << r;
    double sum = 0;
    for (int v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(l[v]) - l[best]);
    EXPECT_NEAR(got_top1[r], 1.0 / sum, 1e-3 / sum) << "row " << r;
    // The GPU's pick must score within rounding of the host's best Gumbel-max score.
    ASSERT_GE(got_sampled[r], 0);
    ASSERT_LT(got_sampled[r], vocab);
    sample_score =
        l[got_sampled[r]] / temperature + gumbel_noise(sample_seed, step_value, r, got_sampled[r]);
    EXPECT_GE(sample_score, best_score - 1e-4) << "row " << r << " host pick " << sample;
  }
  // Same (seed, step, row): same draw.
  run();
  EXPECT_EQ(sampled.download(), got_sampled);
}

TEST(LmHead, GreedyWhenTemperatureZero) {
  TS_SKIP_WITHOUT_GPU();
  const int m = 2, vocab = 1024, k = 64;
  std::mt19937_64 rng(test::fresh_seed());
  const Bf16Host w = test::random_bf16(static_cast<size_t>(vocab) * k, rng);
  const Bf16Host x = test::random_bf16(static_cast<size_t>(m) * k, rng);
  auto dw = test::to_device(w);
  auto dx = test::to_device(x);
  DeviceBuffer<int> argmax(m), sampled(m);
  DeviceBuffer<float> top1(m);
  DeviceBuffer<unsigned char> ws(lm_head_workspace_bytes(m, vocab));
  sampled.poison();
  lm_head(dw.get(), dx.get(), m, vocab, k, SamplingParams{}, ws.get(),
          LmHeadOutputs{argmax.get(), top1.get(), sampled.get(), nullptr}, nullptr);
  EXPECT_EQ(sampled.download(), argmax.download());
}

void expect_topk_matches_reference(int vocab, bool tied_pairs) {
  const int m = 6, k = 256;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Bf16Host w = test::random_bf16(static_cast<size_t>(vocab) * k, rng);
  if (tied_pairs) {
    for (size_t v = 0; v + 1 < static_cast<size_t>(vocab); v += 2)
      for (size_t c = 0; c < static_cast<size_t>(k); ++c)
        w.set((v + 1) * k + c, w.values[v * k + c]);
  }
  const Bf16Host x = test::random_bf16(static_cast<size_t>(m) * k, rng);
  auto dw = test::to_device(w);
  auto dx = test::to_device(x);
  for (const int topk : {1, 5, 16}) {
    DeviceBuffer<int> argmax(m), sampled(m), tokens(static_cast<size_t>(m) * topk);
    DeviceBuffer<float> top1(m), probs(static_cast<size_t>(m) * topk),
        logits(static_cast<size_t>(m) * vocab);
    DeviceBuffer<unsigned char> ws(lm_head_workspace_bytes(m, vocab, topk));
    tokens.poison();
    probs.poison();
    LmHeadOutputs out{argmax.get(), top1.get(), sampled.get(), logits.get()};
    out.topk = topk;
    out.topk_tokens = tokens.get();
    out.topk_probs = probs.get();
    lm_head(dw.get(), dx.get(), m, vocab, k, SamplingParams{}, ws.get(), out, nullptr);
    const auto l = logits.download();
    const auto got_tokens = tokens.download();
    const auto got_probs = probs.download();
    const auto got_argmax = argmax.download();
    if (tied_pairs) {  // identical weight rows give identical logits: the ties are real
      int tied = 0;
      for (int v = 0; v + 1 < vocab; v += 2) tied += l[size_t(v)] == l[size_t(v) + 1];
      ASSERT_EQ(tied, vocab / 2);
    }
    for (int r = 0; r < m; ++r) {
      std::vector<int> order(vocab);
      for (int v = 0; v < vocab; ++v) order[v] = v;
      const float* lr = &l[static_cast<size_t>(r) * vocab];
      std::partial_sort(order.begin(), order.begin() + topk, order.end(),
                        [&](int a, int b) { return lr[a] > lr[b] || (lr[a] == lr[b] && a < b); });
      double sum = 0;
      for (int v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(lr[v]) - lr[order[0]]);
      EXPECT_EQ(got_tokens[r * topk], got_argmax[r]) << "row " << r;
      for (int j = 0; j < topk; ++j) {
        EXPECT_EQ(got_tokens[r * topk + j], order[j]) << "row " << r << " rank " << j;
        const double ref = std::exp(static_cast<double>(lr[order[j]]) - lr[order[0]]) / sum;
        EXPECT_NEAR(got_probs[r * topk + j], ref, 1e-3 * ref + 1e-7)
            << "row " << r << " rank " << j;
      }
    }
  }
}

// Top-k tokens and probabilities against a CPU reference computed from the GPU's own fp32 logits
// (the ranking of near-ties is then exact); the logits themselves are checked above. Vocabularies:
// 8192 (4 chunks of the first pass), Llama-3's 128256 (63 chunks, the last one partial) with every
// weight row duplicated in pairs (tokens 2i and 2i + 1 tie exactly: lower id first), and 4160 (a
// last chunk of 64 tokens).
TEST(LmHead, TopkTokensAndProbabilities) {
  TS_SKIP_WITHOUT_GPU();
  for (const auto& [vocab, pairs] :
       {std::pair{128 * 64, false}, std::pair{128256, true}, std::pair{4160, false}}) {
    SCOPED_TRACE("vocab " + std::to_string(vocab) + (pairs ? ", tied pairs" : ""));
    expect_topk_matches_reference(vocab, pairs);
  }
}

TEST(LmHead, RejectsInvalidShapes) {
  const bf16* p = reinterpret_cast<const bf16*>(0x100);
  LmHeadOutputs out{reinterpret_cast<int*>(0x100), reinterpret_cast<float*>(0x100),
                    reinterpret_cast<int*>(0x100), nullptr};
  void* ws = reinterpret_cast<void*>(0x100);
  EXPECT_THROW(lm_head(p, p, 1, 128256 + 1, 4096, SamplingParams{}, ws, out, nullptr),
               std::invalid_argument);
  EXPECT_THROW(lm_head(p, p, 17, 1024, 4096, SamplingParams{}, ws, out, nullptr),
               std::invalid_argument);
  EXPECT_THROW(lm_head(p, p, 1, 1024, 4096, SamplingParams{NAN, 0, nullptr}, ws, out, nullptr),
               std::invalid_argument);
  LmHeadOutputs too_many = out;
  too_many.topk = 17;
  too_many.topk_tokens = reinterpret_cast<int*>(0x100);
  too_many.topk_probs = reinterpret_cast<float*>(0x100);
  EXPECT_THROW(lm_head(p, p, 1, 1024, 4096, SamplingParams{}, ws, too_many, nullptr),
               std::invalid_argument);
  too_many.topk = 4;
  too_many.topk_probs = nullptr;
  EXPECT_THROW(lm_head(p, p, 1, 1024, 4096, SamplingParams{}, ws, too_many, nullptr),
               std::invalid_argument);
}

}  // namespace
}  // namespace twinstep::kernels
