#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention.h"
#include "tests/kernels/test_util.h"

namespace twinstep::kernels {
namespace {

using test::Bf16Host;
using test::DeviceBuffer;

struct Case {
  int num_q_heads, num_kv_heads, q_len;
  std::vector<int> ctx_lens;
};

class AttentionCases : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionCases, MatchesCpuReference) {
  TS_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const int num_requests = static_cast<int>(c.ctx_lens.size());
  const int group = c.num_q_heads / c.num_kv_heads;
  const int num_layers = 2, layer = 1;
  int capacity = 0;
  for (int ctx : c.ctx_lens) capacity = std::max(capacity, ctx + c.q_len);
  capacity += 37;  // slack that must never be read
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);

  KvCache cache;
  cache.num_layers = num_layers;
  cache.num_kv_heads = c.num_kv_heads;
  cache.capacity_tokens = capacity;
  const size_t per_request = kv_cache_bytes_per_request(cache) / sizeof(bf16);
  // Valid tokens random; everything else (other layer, slack) NaN to catch stray reads.
  std::vector<Bf16Host> caches;
  std::vector<DeviceBuffer<bf16>*> device_caches;
  std::vector<bf16*> bases;
  for (int r = 0; r < num_requests; ++r) {
    Bf16Host h = test::random_bf16(per_request, rng);
    for (int kv = 0; kv < 2; ++kv)
      for (int hd = 0; hd < c.num_kv_heads; ++hd)
        for (int t = c.ctx_lens[r] + c.q_len; t < capacity; ++t)
          for (int d = 0; d < kHeadDim; ++d)
            h.bits[kv_offset(cache, layer, kv, hd) + t * kHeadDim + d] = 0x7fc0;
    auto* dcache = new DeviceBuffer<bf16>(per_request);
    dcache->upload(h.bits);
    caches.push_back(std::move(h));
    device_caches.push_back(dcache);
    bases.push_back(dcache->get());
  }
  DeviceBuffer<bf16*> dbases(num_requests);
  dbases.upload(bases);
  cache.request_base = dbases.get();
  DeviceBuffer<int> dctx(num_requests);
  dctx.upload(c.ctx_lens);

  const size_t q_elems = static_cast<size_t>(num_requests) * c.q_len * c.num_q_heads * kHeadDim;
  const Bf16Host q = test::random_bf16(q_elems, rng);
  auto dq = test::to_device(q);
  DeviceBuffer<bf16> out(q_elems);
  out.poison();
  AttentionShape shape;
  shape.num_requests = num_requests;
  shape.q_len = c.q_len;
  shape.num_q_heads = c.num_q_heads;
  DeviceBuffer<unsigned char> workspace(attention_workspace_bytes(shape, cache));
  decode_attention(dq.get(), cache, layer, dctx.get(), out.get(), shape, workspace.get(), nullptr);
  const auto got = test::bf16_to_float(out.download<uint16_t>());

  std::vector<double> ref(q_elems);
  for (int r = 0; r < num_requests; ++r)
    for (int j = 0; j < c.q_len; ++j)
      for (int h = 0; h < c.num_q_heads; ++h) {
        const int kvh = h / group, keys = c.ctx_lens[r] + j + 1;
        const size_t qo = ((static_cast<size_t>(r) * c.q_len + j) * c.num_q_heads + h) * kHeadDim;
        const float* kp = &caches[r].values[kv_offset(cache, layer, 0, kvh)];
        const float* vp = &caches[r].values[kv_offset(cache, layer, 1, kvh)];
        std::vector<double> s(keys);
        double mx = -INFINITY;
        for (int t = 0; t < keys; ++t) {
          double dot = 0;
          for (int d = 0; d < kHeadDim; ++d)
            dot += static_cast<double>(q.values[qo + d]) * kp[t * kHeadDim + d];
          s[t] = dot * shape.softmax_scale;
          mx = std::max(mx, s[t]);
        }
        double sum = 0;
        for (int t = 0; t < keys; ++t) sum += (s[t] = std::exp(s[t] - mx));
        for (int d = 0; d < kHeadDim; ++d) {
          double acc = 0;
          for (int t = 0; t < keys; ++t) acc += s[t] * vp[t * kHeadDim + d];
          ref[qo + d] = acc / sum;
        }
      }
  const double err = test::rel_error(got, ref);
  EXPECT_LT(err, test::kBf16RelTol) << "q_len " << c.q_len;
  for (auto* d : device_caches) delete d;
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionCases,
                         ::testing::Values(Case{8, 2, 1, {0, 5, 1000}},
                                           Case{8, 2, 3, {63, 64, 700}}, Case{32, 8, 6, {1, 517}},
                                           Case{8, 2, 16, {300, 2}}, Case{32, 8, 2, {1200}},
                                           Case{4, 4, 16, {129}}));

// Speculative verify must match plain decode bit for bit: row j of a 6-query pass at context ctx
// equals a 1-query pass at context ctx + j over the same cache (Llama-3-8B heads, several splits).
TEST(Attention, VerifyRowsMatchPlainDecodeBitForBit) {
  TS_SKIP_WITHOUT_GPU();
  const int num_q_heads = 32, num_kv_heads = 8, q_len = 6;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const int ctx : {1, 700, 5000}) {
    KvCache cache;
    cache.num_layers = 1;
    cache.num_kv_heads = num_kv_heads;
    cache.capacity_tokens = 8192;
    const size_t elems = kv_cache_bytes_per_request(cache) / sizeof(bf16);
    Bf16Host h = test::random_bf16(elems, rng);
    for (int kv = 0; kv < 2; ++kv)  // tokens past the verify window are NaN: never read
      for (int hd = 0; hd < num_kv_heads; ++hd)
        for (int t = ctx + q_len; t < cache.capacity_tokens; ++t)
          for (int d = 0; d < kHeadDim; ++d)
            h.bits[kv_offset(cache, 0, kv, hd) + static_cast<size_t>(t) * kHeadDim + d] = 0x7fc0;
    auto dcache = test::to_device(h);
    DeviceBuffer<bf16*> dbases(1);
    dbases.upload(std::vector<bf16*>{dcache.get()});
    cache.request_base = dbases.get();
    const size_t row_elems = static_cast<size_t>(num_q_heads) * kHeadDim;
    const Bf16Host q = test::random_bf16(q_len * row_elems, rng);
    auto dq = test::to_device(q);

    AttentionShape verify;
    verify.q_len = q_len;
    verify.num_q_heads = num_q_heads;
    DeviceBuffer<int> dctx(1);
    dctx.upload(std::vector<int>{ctx});
    DeviceBuffer<bf16> out6(q_len * row_elems);
    out6.poison();
    DeviceBuffer<unsigned char> ws6(attention_workspace_bytes(verify, cache));
    decode_attention(dq.get(), cache, 0, dctx.get(), out6.get(), verify, ws6.get(), nullptr);
    const auto bits6 = out6.download<uint16_t>();

    AttentionShape plain;
    plain.num_q_heads = num_q_heads;
    DeviceBuffer<unsigned char> ws1(attention_workspace_bytes(plain, cache));
    DeviceBuffer<bf16> out1(row_elems);
    for (int j = 0; j < q_len; ++j) {
      dctx.upload(std::vector<int>{ctx + j});
      out1.poison();
      decode_attention(dq.get() + j * row_elems, cache, 0, dctx.get(), out1.get(), plain, ws1.get(),
                       nullptr);
      const auto bits1 = out1.download<uint16_t>();
      for (size_t i = 0; i < row_elems; ++i)
        ASSERT_EQ(bits1[i], bits6[j * row_elems + i])
            << "ctx " << ctx << " row " << j << " element " << i;
    }
  }
}

TEST(Attention, RejectsInvalidShapes) {
  KvCache cache;
  cache.request_base = reinterpret_cast<bf16* const*>(0x100);
  cache.num_layers = 1;
  cache.num_kv_heads = 4;
  cache.capacity_tokens = 128;
  const bf16* q = reinterpret_cast<const bf16*>(0x100);
  bf16* out = reinterpret_cast<bf16*>(0x100);
  const int* ctx = reinterpret_cast<const int*>(0x100);
  void* ws = reinterpret_cast<void*>(0x100);
  AttentionShape shape;
  shape.num_q_heads = 32;
  shape.q_len = 16;  // group 8 * 16 = 128 rows > 64
  EXPECT_THROW(decode_attention(q, cache, 0, ctx, out, shape, ws, nullptr), std::invalid_argument);
  shape.q_len = 17;
  EXPECT_THROW(decode_attention(q, cache, 0, ctx, out, shape, ws, nullptr), std::invalid_argument);
  shape.q_len = 1;
  shape.num_q_heads = 30;  // not a multiple of 4
  EXPECT_THROW(decode_attention(q, cache, 0, ctx, out, shape, ws, nullptr), std::invalid_argument);
  shape.num_q_heads = 32;
  EXPECT_THROW(decode_attention(q, cache, 1, ctx, out, shape, ws, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace twinstep::kernels
