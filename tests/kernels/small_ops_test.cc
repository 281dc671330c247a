#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/embedding.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "tests/kernels/test_util.h"

namespace twinstep::kernels {
namespace {

using test::Bf16Host;
using test::DeviceBuffer;

TEST(RmsNorm, MatchesCpuReferenceWithAndWithoutResidual) {
  TS_SKIP_WITHOUT_GPU();
  for (const int hidden : {40, 4096}) {
    for (const bool with_delta : {false, true}) {
      const int m = 5;
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE("seed " + std::to_string(seed) + " hidden " + std::to_string(hidden));
      std::mt19937_64 rng(seed);
      const size_t n = static_cast<size_t>(m) * hidden;
      const Bf16Host delta = test::random_bf16(n, rng), residual = test::random_bf16(n, rng, 3.0f),
                     weight = test::random_bf16(hidden, rng);
      auto dd = test::to_device(delta);
      auto dr = test::to_device(residual);
      auto dw = test::to_device(weight);
      DeviceBuffer<bf16> out(n);
      out.poison();
      rmsnorm_residual(with_delta ? dd.get() : nullptr, dr.get(), dw.get(), out.get(), m, hidden,
                       1e-5f, nullptr);
      std::vector<double> ref(n), ref_res(n);
      for (int r = 0; r < m; ++r) {
        double ss = 0;
        for (int i = 0; i < hidden; ++i) {
          const size_t e = static_cast<size_t>(r) * hidden + i;
          ref_res[e] = with_delta ? test::round_bf16(residual.values[e] + delta.values[e])
                                  : residual.values[e];
          ss += ref_res[e] * ref_res[e];
        }
        const double inv = 1.0 / std::sqrt(ss / hidden + 1e-5);
        for (int i = 0; i < hidden; ++i) {
          const size_t e = static_cast<size_t>(r) * hidden + i;
          ref[e] = ref_res[e] * inv * weight.values[i];
        }
      }
      EXPECT_LT(test::rel_error(test::bf16_to_float(out.download<uint16_t>()), ref),
                test::kBf16RelTol);
      EXPECT_LT(test::rel_error(test::bf16_to_float(dr.download<uint16_t>()), ref_res), 1e-6);
    }
  }
  EXPECT_THROW(
      rmsnorm_residual(nullptr, reinterpret_cast<bf16*>(0x100), reinterpret_cast<bf16*>(0x100),
                       reinterpret_cast<bf16*>(0x100), 1, 12, 1e-5f, nullptr),
      std::invalid_argument);
}

// Hugging Face's llama3 rule, written out again independently in double precision.
double llama3_inv_freq(int i) {
  const double inv = 1.0 / std::pow(500000.0, 2.0 * i / 128.0);
  const double wavelen = 2.0 * M_PI / inv;
  if (wavelen < 8192.0 / 4.0) return inv;
  if (wavelen > 8192.0 / 1.0) return inv / 8.0;
  const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
  return (1.0 - smooth) * inv / 8.0 + smooth * inv;
}

TEST(Rope, Llama3TableMatchesFormula) {
  const RopeTable table = llama3_rope_table();
  EXPECT_FLOAT_EQ(table.inv_freq[0], 1.0f);
  EXPECT_FLOAT_EQ(table.inv_freq[63], static_cast<float>(std::pow(500000.0, -126.0 / 128.0) / 8.0));
  for (int i = 0; i < 64; ++i)
    EXPECT_NEAR(table.inv_freq[i], llama3_inv_freq(i), 1e-7 * llama3_inv_freq(i) + 1e-12) << i;
}

TEST(Rope, RotatesQkAndAppendsKv) {
  TS_SKIP_WITHOUT_GPU();
  const int num_q_heads = 32, num_kv_heads = 8, q_len = 3, num_layers = 2, layer = 1;
  const std::vector<int> ctx_lens = {0, 8190};
  const int num_requests = 2, capacity = 8200;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int width = (num_q_heads + 2 * num_kv_heads) * kHeadDim;
  const Bf16Host qkv = test::random_bf16(static_cast<size_t>(num_requests) * q_len * width, rng);
  KvCache cache;
  cache.num_layers = num_layers;
  cache.num_kv_heads = num_kv_heads;
  cache.capacity_tokens = capacity;
  const size_t per_request = kv_cache_bytes_per_request(cache) / sizeof(bf16);
  std::vector<Bf16Host> before;
  std::vector<DeviceBuffer<bf16>*> dev;
  std::vector<bf16*> bases;
  for (int r = 0; r < num_requests; ++r) {
    before.push_back(test::random_bf16(per_request, rng));
    dev.push_back(new DeviceBuffer<bf16>(per_request));
    dev.back()->upload(before.back().bits);
    bases.push_back(dev.back()->get());
  }
  DeviceBuffer<bf16*> dbases(num_requests);
  dbases.upload(bases);
  cache.request_base = dbases.get();
  DeviceBuffer<int> dctx(num_requests);
  dctx.upload(ctx_lens);
  auto dqkv = test::to_device(qkv);
  DeviceBuffer<bf16> q_out(static_cast<size_t>(num_requests) * q_len * num_q_heads * kHeadDim);
  q_out.poison();
  rope_kv_append(dqkv.get(), dctx.get(), cache, layer, q_out.get(), num_requests, q_len,
                 num_q_heads, llama3_rope_table(), nullptr);

  std::vector<double> ref_q(q_out.size()), ref_k, got_k_ref;
  std::vector<float> got_k;
  auto rotate = [&](const float* x, int i, int pos, double* y1, double* y2) {
    const double a = pos * llama3_inv_freq(i);
    *y1 = x[i] * std::cos(a) - x[i + 64] * std::sin(a);
    *y2 = x[i + 64] * std::cos(a) + x[i] * std::sin(a);
  };
  const auto q_got = test::bf16_to_float(q_out.download<uint16_t>());
  for (int r = 0; r < num_requests; ++r) {
    const auto after = test::bf16_to_float(dev[r]->download<uint16_t>());
    std::vector<bool> written(per_request, false);
    std::vector<double> ref_kv;
    std::vector<float> got_kv;
    for (int j = 0; j < q_len; ++j) {
      const int token = r * q_len + j, pos = ctx_lens[r] + j;
      const float* in = &qkv.values[static_cast<size_t>(token) * width];
      for (int h = 0; h < num_q_heads + num_kv_heads; ++h)
        for (int i = 0; i < 64; ++i) {
          double y1, y2;
          rotate(in + h * kHeadDim, i, pos, &y1, &y2);
          if (h < num_q_heads) {
            const size_t o = (static_cast<size_t>(token) * num_q_heads + h) * kHeadDim;
            ref_q[o + i] = y1;
            ref_q[o + i + 64] = y2;
          } else {
            const size_t o =
                kv_offset(cache, layer, 0, h - num_q_heads) + static_cast<size_t>(pos) * kHeadDim;
            ref_kv.push_back(y1);
            got_kv.push_back(after[o + i]);
            ref_kv.push_back(y2);
            got_kv.push_back(after[o + i + 64]);
            written[o + i] = written[o + i + 64] = true;
          }
        }
      for (int h = 0; h < num_kv_heads; ++h)
        for (int d = 0; d < kHeadDim; ++d) {
          const size_t o = kv_offset(cache, layer, 1, h) + static_cast<size_t>(pos) * kHeadDim + d;
          ASSERT_EQ(after[o], in[(num_q_heads + num_kv_heads + h) * kHeadDim + d]) << "v copy";
          written[o] = true;
        }
    }
    EXPECT_LT(test::rel_error(got_kv, ref_kv), test::kBf16RelTol) << "k of request " << r;
    for (size_t e = 0; e < per_request; ++e)
      if (!written[e])
        ASSERT_EQ(after[e], before[r].values[e]) << "cache element " << e << " changed";
  }
  EXPECT_LT(test::rel_error(q_got, ref_q), test::kBf16RelTol);
  for (auto* d : dev) delete d;
}

TEST(Embedding, GathersRowsAndZeroesOutOfRange) {
  TS_SKIP_WITHOUT_GPU();
  const int vocab = 1000, hidden = 4096;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Bf16Host table = test::random_bf16(static_cast<size_t>(vocab) * hidden, rng);
  const std::vector<int> tokens = {17, 999, 0, static_cast<int>(rng() % vocab), 1000, -3};
  auto dtable = test::to_device(table);
  DeviceBuffer<int> dtok(tokens.size());
  dtok.upload(tokens);
  DeviceBuffer<bf16> out(tokens.size() * hidden);
  out.poison();
  embedding_gather(dtable.get(), dtok.get(), out.get(), static_cast<int>(tokens.size()), vocab,
                   hidden, nullptr);
  const auto got = out.download<uint16_t>();
  for (size_t t = 0; t < tokens.size(); ++t)
    for (int i = 0; i < hidden; ++i) {
      const bool valid = tokens[t] >= 0 && tokens[t] < vocab;
      ASSERT_EQ(got[t * hidden + i],
                valid ? table.bits[static_cast<size_t>(tokens[t]) * hidden + i] : 0)
          << t;
    }
  EXPECT_THROW(embedding_gather(dtable.get(), dtok.get(), out.get(), 1, vocab, 12, nullptr),
               std::invalid_argument);
}

TEST(Swiglu, MatchesCpuReference) {
  TS_SKIP_WITHOUT_GPU();
  const int m = 3, n = 14336;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Bf16Host gu = test::random_bf16(static_cast<size_t>(m) * 2 * n, rng, 4.0f);
  auto dgu = test::to_device(gu);
  DeviceBuffer<bf16> out(static_cast<size_t>(m) * n);
  out.poison();
  swiglu(dgu.get(), out.get(), m, n, nullptr);
  std::vector<double> ref(out.size());
  for (int r = 0; r < m; ++r)
    for (int i = 0; i < n; ++i) {
      const double g = gu.values[static_cast<size_t>(r) * 2 * n + i],
                   u = gu.values[static_cast<size_t>(r) * 2 * n + n + i];
      ref[static_cast<size_t>(r) * n + i] = g / (1.0 + std::exp(-g)) * u;
    }
  EXPECT_LT(test::rel_error(test::bf16_to_float(out.download<uint16_t>()), ref), test::kBf16RelTol);
  EXPECT_THROW(swiglu(dgu.get(), out.get(), m, 12, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace twinstep::kernels
