#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_split.h"
#include "kernels/tuning.h"
#include "tests/kernels/test_util.h"

namespace twinstep::kernels {
namespace {

using test::Bf16Host;
using test::DeviceBuffer;

// Split-kernel options under test (detail::attention_tuning()); every test runs against each.
struct Variant {
  const char* name;
  int ctas_per_sm;
  bool split_full_ring = false, split_q_smem = false;
  bool splits_within_one_wave = true;
};
const Variant kVariants[] = {
    {"two_launch", 2},  // the 179ce97 pair: Q in registers, 2-tile prologue
    {"two_launch_full_ring_q_smem", 2, true, true},
    {"two_launch_q_smem", 2, false, true},  // the shipped default
    // The split count rounded up (before the one-wave rule): more splits at 2-32 requests.
    {"two_launch_q_smem_round_up", 2, false, true, false},
};

// Sets the tuning for one test, restores the defaults after.
class TuningScope {
 public:
  explicit TuningScope(const Variant& v) : saved_(detail::attention_tuning()) {
    auto& t = detail::attention_tuning();
    t.ctas_per_sm = v.ctas_per_sm;
    t.split_full_ring = v.split_full_ring;
    t.split_q_smem = v.split_q_smem;
    t.splits_within_one_wave = v.splits_within_one_wave;
  }
  ~TuningScope() { detail::attention_tuning() = saved_; }

 private:
  detail::AttentionTuning saved_;
};

// Workspace for every shape in `shapes`, poisoned (NaN floats): the header asks for no
// initialisation, so a launch reading a partial it did not write gives NaN outputs.
DeviceBuffer<unsigned char> make_workspace(const std::vector<AttentionShape>& shapes,
                                           const KvCache& cache) {
  size_t bytes = 0;
  for (const auto& s : shapes) bytes = std::max(bytes, attention_workspace_bytes(s, cache));
  DeviceBuffer<unsigned char> ws(bytes);
  ws.poison();
  return ws;
}

AttentionShape shape_of(int num_requests, int q_len, int num_q_heads) {
  AttentionShape shape;
  shape.num_requests = num_requests;
  shape.q_len = q_len;
  shape.num_q_heads = num_q_heads;
  return shape;
}

// One request's KV buffer: valid tokens [0, valid) random; every other element (other layers,
// tokens past the window) NaN, so a stray read poisons the result.
struct RequestKv {
  Bf16Host host;
  std::unique_ptr<DeviceBuffer<bf16>> device;
};
RequestKv make_request_kv(const KvCache& cache, int layer, int valid, std::mt19937_64& rng) {
  const size_t elems = kv_cache_bytes_per_request(cache) / sizeof(bf16);
  RequestKv kv{Bf16Host(elems), nullptr};
  std::fill(kv.host.bits.begin(), kv.host.bits.end(), uint16_t{0x7fc0});
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int part = 0; part < 2; ++part)
    for (int h = 0; h < cache.num_kv_heads; ++h) {
      const size_t off = kv_offset(cache, layer, part, h);
      for (size_t i = 0; i < static_cast<size_t>(valid) * kHeadDim; ++i)
        kv.host.set(off + i, dist(rng));
    }
  kv.device = std::make_unique<DeviceBuffer<bf16>>(elems);
  kv.device->upload(kv.host.bits);
  return kv;
}

// A batch on the device: each request's KV buffer (make_request_kv: ctx + new_tokens valid tokens
// in `layer`; with copy_layer0, layer 0's copied into every other layer, so launches over any
// layer read the same), the buffers' bases (the cache points at them) and the context lengths.
struct DeviceRequests {
  std::vector<RequestKv> kvs;
  DeviceBuffer<bf16*> bases;
  DeviceBuffer<int> ctx;
};
DeviceRequests upload_requests(KvCache& cache, const std::vector<int>& ctx_lens, int new_tokens,
                               int layer, std::mt19937_64& rng, bool copy_layer0 = false) {
  const int n = static_cast<int>(ctx_lens.size());
  DeviceRequests batch{{}, DeviceBuffer<bf16*>(n), DeviceBuffer<int>(n)};
  std::vector<bf16*> bases;
  for (const int ctx : ctx_lens) {
    RequestKv kv = make_request_kv(cache, layer, ctx + new_tokens, rng);
    if (copy_layer0) {
      const size_t layer_elems = kv_offset(cache, 1, 0, 0);
      for (int l = 1; l < cache.num_layers; ++l)
        std::copy(kv.host.bits.begin(), kv.host.bits.begin() + layer_elems,
                  kv.host.bits.begin() + l * layer_elems);
      kv.device->upload(kv.host.bits);
    }
    bases.push_back(kv.device->get());
    batch.kvs.push_back(std::move(kv));
  }
  batch.bases.upload(bases);
  cache.request_base = batch.bases.get();
  batch.ctx.upload(ctx_lens);
  return batch;
}

// fp64 reference: softmax(q k^T * scale) v over keys 0 .. ctx + j.
std::vector<double> reference(const std::vector<RequestKv>& kvs, const KvCache& cache, int layer,
                              const std::vector<int>& ctx_lens, const Bf16Host& q,
                              const AttentionShape& shape) {
  const int group = shape.num_q_heads / cache.num_kv_heads;
  std::vector<double> ref(q.size());
  for (int r = 0; r < shape.num_requests; ++r)
    for (int j = 0; j < shape.q_len; ++j)
      for (int h = 0; h < shape.num_q_heads; ++h) {
        const int kvh = h / group, keys = ctx_lens[r] + j + 1;
        const size_t qo =
            ((static_cast<size_t>(r) * shape.q_len + j) * shape.num_q_heads + h) * kHeadDim;
        const float* kp = &kvs[r].host.values[kv_offset(cache, layer, 0, kvh)];
        const float* vp = &kvs[r].host.values[kv_offset(cache, layer, 1, kvh)];
        std::vector<double> s(keys);
        double mx = -INFINITY;
        for (int t = 0; t < keys; ++t) {
          double dot = 0;
          for (int d = 0; d < kHeadDim; ++d)
            dot +=
                static_cast<double>(q.values[qo + d]) * kp[static_cast<size_t>(t) * kHeadDim + d];
          s[t] = dot * shape.softmax_scale;
          mx = std::max(mx, s[t]);
        }
        double sum = 0;
        for (int t = 0; t < keys; ++t) sum += (s[t] = std::exp(s[t] - mx));
        for (int d = 0; d < kHeadDim; ++d) {
          double acc = 0;
          for (int t = 0; t < keys; ++t) acc += s[t] * vp[static_cast<size_t>(t) * kHeadDim + d];
          ref[qo + d] = acc / sum;
        }
      }
  return ref;
}

size_t mismatches(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  size_t n = 0;
  for (size_t i = 0; i < want.size(); ++i) n += got[i] != want[i];
  return n;
}

// For a failure message: the first mismatch and how many outputs still hold the poison (0xFFFF,
// DeviceBuffer::poison), i.e. were never written.
std::string describe_mismatches(const std::vector<uint16_t>& got,
                                const std::vector<uint16_t>& want) {
  size_t poisoned = 0, first = want.size();
  for (size_t i = 0; i < want.size(); ++i) {
    poisoned += got[i] == 0xFFFF;
    if (got[i] != want[i] && first == want.size()) first = i;
  }
  if (first == want.size()) return "no mismatch";
  char text[160];
  std::snprintf(text, sizeof text,
                "first mismatch at %zu: got 0x%04x, want 0x%04x; %zu of %zu poisoned", first,
                got[first], want[first], poisoned, want.size());
  return text;
}

struct Case {
  int num_q_heads, num_kv_heads, q_len;
  std::vector<int> ctx_lens;
};

class AttentionCases : public ::testing::TestWithParam<std::tuple<Case, Variant>> {};

TEST_P(AttentionCases, MatchesCpuReference) {
  TS_SKIP_WITHOUT_GPU();
  const auto& [c, variant] = GetParam();
  TuningScope tuning(variant);
  const int num_requests = static_cast<int>(c.ctx_lens.size());
  const int layer = 1;
  int capacity = 0;
  for (int ctx : c.ctx_lens) capacity = std::max(capacity, ctx + c.q_len);
  capacity += 37;  // slack that must never be read
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", variant " + variant.name);
  std::mt19937_64 rng(seed);

  KvCache cache;
  cache.num_layers = 2;
  cache.num_kv_heads = c.num_kv_heads;
  cache.capacity_tokens = capacity;
  DeviceRequests batch = upload_requests(cache, c.ctx_lens, c.q_len, layer, rng);
  const std::vector<RequestKv>& kvs = batch.kvs;
  DeviceBuffer<int>& dctx = batch.ctx;

  const AttentionShape shape = shape_of(num_requests, c.q_len, c.num_q_heads);
  const size_t q_elems = static_cast<size_t>(num_requests) * c.q_len * c.num_q_heads * kHeadDim;
  const Bf16Host q = test::random_bf16(q_elems, rng);
  auto dq = test::to_device(q);
  DeviceBuffer<bf16> out(q_elems);
  auto workspace = make_workspace({shape}, cache);
  const std::vector<double> ref = reference(kvs, cache, layer, c.ctx_lens, q, shape);
  for (int launch = 0; launch < 2; ++launch) {  // the second launch reuses the workspace
    out.poison();
    decode_attention(dq.get(), cache, layer, dctx.get(), out.get(), shape, workspace.get(),
                     nullptr);
    const double err = test::rel_error(test::bf16_to_float(out.download<uint16_t>()), ref);
    EXPECT_LT(err, test::kBf16RelTol) << "q_len " << c.q_len << ", launch " << launch;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionCases,
    ::testing::Combine(
        ::testing::Values(Case{8, 2, 1, {0, 5, 1000}},   // ctx 0; ctx not a tile multiple
                          Case{8, 2, 3, {63, 64, 700}},  // tile edges
                          Case{32, 8, 6, {1, 517}},      // Llama heads, verify width
                          Case{8, 2, 16, {300, 2}},      // q_len 16: 64 rows
                          Case{32, 8, 2, {1200}},        //
                          // Requests x KV heads not dividing 2 x SMs: the two rounding rules
                          // give different split counts (8 x 8 heads: 4 or 5 splits on 132 SMs;
                          // 5 x 8: 6 or 7), requests of very different lengths in one launch.
                          Case{32, 8, 1, {900, 1, 64, 1500, 2000, 17, 700, 1300}},
                          Case{24, 8, 3, {40, 1000, 511, 2, 777}},  // Llama-3.2-3B heads
                          Case{4, 4, 16, {129}},                    // group 1
                          Case{8, 2, 12, {70, 1500, 333}},  // 48 rows: 3 row tiles (384 threads)
                          Case{16, 2, 5, {2100}},           // group 8: 40 rows
                          // One KV head (Qwen3-30B-A3B at TP4): 129 and 111 splits of 64
                          // tokens, the combine of 4 parts (combine_parts_min_splits 66).
                          Case{8, 1, 1, {8192}},       //
                          Case{8, 1, 8, {6000, 100}},  // 95 splits, 64 rows, a short request
                          // Two KV heads (Qwen3-30B-A3B at TP2), one request at 9000: 71
                          // splits of 128 tokens, the 4-part combine; 48 rows.
                          Case{16, 2, 6, {9000}}),
        ::testing::ValuesIn(kVariants)),
    [](const auto& info) {
      const Case& c = std::get<0>(info.param);
      return std::string(std::get<1>(info.param).name) + "_q" + std::to_string(c.num_q_heads) +
             "_kv" + std::to_string(c.num_kv_heads) + "_len" + std::to_string(c.q_len) + "_" +
             std::to_string(info.index);
    });

class AttentionVariants : public ::testing::TestWithParam<Variant> {};

// Speculative verify must match plain decode bit for bit: row j of a 6-query pass at context ctx
// equals a 1-query pass at context ctx + j over the same cache (Llama-3-8B heads: 33 splits;
// one KV head of 8 q heads: 128 splits, the combine of 4 parts). One workspace serves both shapes
// (launches of different shapes share it serially).
TEST_P(AttentionVariants, VerifyRowsMatchPlainDecodeBitForBit) {
  TS_SKIP_WITHOUT_GPU();
  TuningScope tuning(GetParam());
  const int q_len = 6;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", variant " + GetParam().name);
  std::mt19937_64 rng(seed);
  for (const auto& [num_q_heads, num_kv_heads, ctx] :
       {std::tuple{32, 8, 1}, std::tuple{32, 8, 700}, std::tuple{32, 8, 5000},
        std::tuple{8, 1, 700}, std::tuple{8, 1, 8000}}) {
    KvCache cache;
    cache.num_layers = 1;
    cache.num_kv_heads = num_kv_heads;
    cache.capacity_tokens = 8192;
    RequestKv kv = make_request_kv(cache, 0, ctx + q_len, rng);
    DeviceBuffer<bf16*> dbases(1);
    dbases.upload(std::vector<bf16*>{kv.device->get()});
    cache.request_base = dbases.get();
    const size_t row_elems = static_cast<size_t>(num_q_heads) * kHeadDim;
    const Bf16Host q = test::random_bf16(q_len * row_elems, rng);
    auto dq = test::to_device(q);

    AttentionShape verify, plain;
    verify.q_len = q_len;
    verify.num_q_heads = plain.num_q_heads = num_q_heads;
    auto ws = make_workspace({verify, plain}, cache);
    DeviceBuffer<int> dctx(1);
    dctx.upload(std::vector<int>{ctx});
    DeviceBuffer<bf16> out6(q_len * row_elems);
    out6.poison();
    decode_attention(dq.get(), cache, 0, dctx.get(), out6.get(), verify, ws.get(), nullptr);
    const auto bits6 = out6.download<uint16_t>();

    DeviceBuffer<bf16> out1(row_elems);
    for (int j = 0; j < q_len; ++j) {
      dctx.upload(std::vector<int>{ctx + j});
      out1.poison();
      decode_attention(dq.get() + j * row_elems, cache, 0, dctx.get(), out1.get(), plain, ws.get(),
                       nullptr);
      const auto bits1 = out1.download<uint16_t>();
      for (size_t i = 0; i < row_elems; ++i)
        ASSERT_EQ(bits1[i], bits6[j * row_elems + i])
            << "ctx " << ctx << " row " << j << " element " << i;
    }
  }
}

// A captured graph of back-to-back launches (PDL on, one workspace) replayed several times gives
// the same bits as an eager launch every time.
TEST_P(AttentionVariants, GraphReplaysAreBitIdentical) {
  TS_SKIP_WITHOUT_GPU();
  TuningScope tuning(GetParam());
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", variant " + GetParam().name);
  std::mt19937_64 rng(seed);
  KvCache cache;
  cache.num_layers = 2;
  cache.num_kv_heads = 8;
  cache.capacity_tokens = 4100;
  // Layer 1 gets the same tokens as layer 0 (the graph reads both).
  DeviceRequests batch = upload_requests(cache, {4000, 1234}, 6, 0, rng, /*copy_layer0=*/true);
  DeviceBuffer<int>& dctx = batch.ctx;
  const AttentionShape shape = shape_of(2, 6, 32);
  const size_t elems = 2 * 6 * 32 * kHeadDim;
  auto dq = test::to_device(test::random_bf16(elems, rng));
  auto ws = make_workspace({shape}, cache);
  DeviceBuffer<bf16> eager(elems), out0(elems), out1(elems);
  eager.poison();
  decode_attention(dq.get(), cache, 0, dctx.get(), eager.get(), shape, ws.get(), nullptr);
  const auto want = eager.download<uint16_t>();

  cudaStream_t stream;
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TS_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  decode_attention(dq.get(), cache, 0, dctx.get(), out0.get(), shape, ws.get(), stream, true);
  decode_attention(dq.get(), cache, 1, dctx.get(), out1.get(), shape, ws.get(), stream, true);
  TS_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    out0.poison();
    out1.poison();
    TS_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TS_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto got0 = out0.download<uint16_t>(), got1 = out1.download<uint16_t>();
    EXPECT_EQ(mismatches(got0, want), 0u)
        << "replay " << replay << ", layer 0: " << describe_mismatches(got0, want);
    EXPECT_EQ(mismatches(got1, want), 0u)
        << "replay " << replay << ", layer 1: " << describe_mismatches(got1, want);
  }
  TS_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TS_CUDA_CHECK(cudaGraphDestroy(graph));
  TS_CUDA_CHECK(cudaStreamDestroy(stream));
}

// The benchmark's traced instantiations (AttentionTuning::trace) give the default kernels' bits,
// and every block writes a timeline in attention.h's layout, in order: entry <= prologue issued
// <= past the wait <= first tile <= last tile <= exit for each split block that attends, entry <=
// past the wait <= exit for each combine block; empty splits (past a request's context) write
// only entry, wait-free exit and SM. Two requests (the second's tail splits empty), q_len 3, a
// graph of two PDL layers.
TEST(Attention, TracedLaunchesGiveTheSameBitsAndOrderedTimelines) {
  TS_SKIP_WITHOUT_GPU();
  const detail::AttentionTuning saved = detail::attention_tuning();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  KvCache cache;
  cache.num_layers = 2;
  cache.num_kv_heads = 8;
  cache.capacity_tokens = 4100;
  DeviceRequests batch = upload_requests(cache, {4000, 700}, 3, 0, rng, /*copy_layer0=*/true);
  const AttentionShape shape = shape_of(2, 3, 32);
  const size_t elems = 2 * 3 * 32 * kHeadDim;
  auto dq = test::to_device(test::random_bf16(elems, rng));
  auto ws = make_workspace({shape}, cache);
  const int splits = attention_num_splits(shape, cache);
  const int split_blocks = splits * 8 * 2, combine_blocks = 4 * 3 * 8 * 2;
  const size_t words = size_t{2} * kAttentionTraceSlotsPerLayer * kAttentionTraceWords;
  DeviceBuffer<unsigned long long> trace(words);
  TS_CUDA_CHECK(cudaMemset(trace.get(), 0, words * sizeof(unsigned long long)));

  cudaStream_t stream;
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<std::vector<uint16_t>> bits;
  for (const bool traced : {false, true}) {
    detail::attention_tuning().trace = traced ? trace.get() : nullptr;
    DeviceBuffer<bf16> out0(elems), out1(elems);
    out0.poison();
    out1.poison();
    decode_attention(dq.get(), cache, 0, batch.ctx.get(), out0.get(), shape, ws.get(), stream,
                     true);
    decode_attention(dq.get(), cache, 1, batch.ctx.get(), out1.get(), shape, ws.get(), stream,
                     true);
    TS_CUDA_CHECK(cudaStreamSynchronize(stream));
    bits.push_back(out0.download<uint16_t>());
    bits.push_back(out1.download<uint16_t>());
  }
  detail::attention_tuning() = saved;
  TS_CUDA_CHECK(cudaStreamDestroy(stream));
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(mismatches(bits[2 + i], bits[i]), 0u)
        << "layer " << i << ": " << describe_mismatches(bits[2 + i], bits[i]);

  const std::vector<unsigned long long> h = trace.download<unsigned long long>();
  for (int layer = 0; layer < 2; ++layer) {
    auto word = [&](int slot, int w) {
      return h[(static_cast<size_t>(layer) * kAttentionTraceSlotsPerLayer + slot) *
                   kAttentionTraceWords +
               w];
    };
    // Attending splits per (request, KV head): a prefix of the splits, shorter for request 1.
    std::vector<int> attending(16, 0);
    for (int b = 0; b < split_blocks; ++b) {
      const int split = b % splits, pair = b / splits;  // pair = request * 8 + head
      SCOPED_TRACE("layer " + std::to_string(layer) + " split block " + std::to_string(b));
      ASSERT_NE(word(b, kTraceEntry), 0u);
      ASSERT_NE(word(b, kTraceExit), 0u);
      EXPECT_LE(word(b, kTraceEntry), word(b, kTraceExit));
      if (word(b, kTraceFirstTile) == 0) continue;  // empty split: entry and exit only
      EXPECT_EQ(attending[pair], split) << "attending splits are not a prefix";
      attending[pair] = split + 1;
      for (int w = kTraceEntry; w < kTraceExit; ++w) {
        ASSERT_NE(word(b, w + 1), 0u) << "word " << w + 1;
        EXPECT_LE(word(b, w), word(b, w + 1)) << "word " << w;
      }
    }
    for (int head = 0; head < 8; ++head) {
      EXPECT_GE(attending[8 + head], 1);
      EXPECT_GT(attending[head], attending[8 + head]) << "4003 tokens against 703";
      EXPECT_LT(attending[8 + head], splits) << "request 1 (703 tokens) leaves splits empty";
    }
    for (int c = 0; c < combine_blocks; ++c) {
      const int slot = kAttentionTraceSplitSlots + c;
      SCOPED_TRACE("layer " + std::to_string(layer) + " combine block " + std::to_string(c));
      ASSERT_NE(word(slot, kTraceEntry), 0u);
      EXPECT_LE(word(slot, kTraceEntry), word(slot, kTraceWaited));
      EXPECT_LE(word(slot, kTraceWaited), word(slot, kTraceExit));
    }
    EXPECT_EQ(word(kAttentionTraceSplitSlots + combine_blocks, kTraceEntry), 0u);
    EXPECT_EQ(word(split_blocks, kTraceEntry), 0u);
  }
}

// The combine kernel's two forms (4 parts of 128 threads, the default, and one thread per
// dimension over every split) agree to bf16 rounding (their sums run in different orders), and
// each writes every output: one KV head at ctx 8192 (129 splits) and 3000 (47), q_len 1 and 8,
// over a cache with a shorter second request. (Both forms are checked against the CPU reference
// through AttentionCases' one-KV-head cases for the default; this ties the other to it.)
TEST_P(AttentionVariants, CombineFormsAgree) {
  TS_SKIP_WITHOUT_GPU();
  TuningScope tuning(GetParam());
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", variant " + GetParam().name);
  std::mt19937_64 rng(seed);
  for (const int ctx : {8192, 3000}) {
    KvCache cache;
    cache.num_layers = 1;
    cache.num_kv_heads = 1;
    cache.capacity_tokens = ctx + 16;
    DeviceRequests batch = upload_requests(cache, {ctx, ctx / 3}, 8, 0, rng);
    DeviceBuffer<int>& dctx = batch.ctx;
    for (const int q_len : {1, 8}) {
      const AttentionShape shape = shape_of(2, q_len, 8);
      const size_t elems = size_t{2} * q_len * 8 * kHeadDim;
      auto dq = test::to_device(test::random_bf16(elems, rng));
      auto ws = make_workspace({shape}, cache);
      std::vector<std::vector<uint16_t>> bits;
      for (const bool parts : {true, false}) {
        detail::attention_tuning().combine_parts = parts;
        detail::attention_tuning().combine_parts_min_splits = 0;
        DeviceBuffer<bf16> out(elems);
        out.poison();
        decode_attention(dq.get(), cache, 0, dctx.get(), out.get(), shape, ws.get(), nullptr);
        bits.push_back(out.download<uint16_t>());
        EXPECT_EQ(std::count(bits.back().begin(), bits.back().end(), uint16_t{0xFFFF}), 0)
            << "unwritten outputs, parts " << parts;
      }
      const std::vector<float> a = test::bf16_to_float(bits[0]), b = test::bf16_to_float(bits[1]);
      EXPECT_LT(test::rel_error(a, std::vector<double>(b.begin(), b.end())), test::kBf16RelTol)
          << "ctx " << ctx << " q_len " << q_len;
    }
  }
}

// AttentionTuning::combine_ctx_before_wait (the context length loaded before the combine's
// dependency wait) gives the same bits as loading it after the wait, in both combine forms, eagerly
// and in a PDL chain: one KV head at ctx 8192 (129 splits) and 3000, and eight KV heads at 8192
// (the split count of Llama-3-8B's heads), q_len 1 and 8, two requests of different lengths.
TEST(Attention, CombineContextBeforeWaitGivesTheSameBits) {
  TS_SKIP_WITHOUT_GPU();
  const detail::AttentionTuning saved = detail::attention_tuning();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  cudaStream_t stream;
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const auto [kv_heads, ctx] : {std::pair{1, 8192}, std::pair{1, 3000}, std::pair{8, 8192}}) {
    KvCache cache;
    cache.num_layers = 1;
    cache.num_kv_heads = kv_heads;
    cache.capacity_tokens = ctx + 16;
    DeviceRequests batch = upload_requests(cache, {ctx, ctx / 3}, 8, 0, rng);
    for (const int q_len : {1, 8}) {
      const int q_heads = kv_heads * 4;
      const AttentionShape shape = shape_of(2, q_len, q_heads);
      const size_t elems = size_t{2} * q_len * q_heads * kHeadDim;
      auto dq = test::to_device(test::random_bf16(elems, rng));
      auto ws = make_workspace({shape}, cache);
      for (const bool parts : {false, true}) {
        std::vector<std::vector<uint16_t>> bits;
        for (const bool early : {false, true}) {
          detail::attention_tuning() = saved;
          detail::attention_tuning().combine_parts = parts;
          detail::attention_tuning().combine_parts_min_splits = 0;
          detail::attention_tuning().combine_ctx_before_wait = early;
          for (const bool pdl : {false, true}) {
            DeviceBuffer<bf16> out(elems);
            out.poison();
            decode_attention(dq.get(), cache, 0, batch.ctx.get(), out.get(), shape, ws.get(),
                             stream, pdl);
            TS_CUDA_CHECK(cudaStreamSynchronize(stream));
            bits.push_back(out.download<uint16_t>());
          }
        }
        for (size_t i = 1; i < bits.size(); ++i)
          EXPECT_EQ(mismatches(bits[i], bits[0]), 0u)
              << "kv heads " << kv_heads << ", ctx " << ctx << ", q_len " << q_len << ", parts "
              << parts << ", run " << i << ": " << describe_mismatches(bits[i], bits[0]);
      }
    }
  }
  detail::attention_tuning() = saved;
  TS_CUDA_CHECK(cudaStreamDestroy(stream));
}

INSTANTIATE_TEST_SUITE_P(Variants, AttentionVariants, ::testing::ValuesIn(kVariants),
                         [](const auto& info) { return std::string(info.param.name); });

// decode_attention_rope against rope_kv_append then decode_attention on a copy of the same cache:
// out and the whole cache bit for bit. Cases: one query at a long context, new tokens straddling a
// split boundary (splits are 64 tokens for one request of 8 KV heads at capacity 1024, 128 for
// three requests; 256 for two requests of 2 KV heads), group 8, 16 queries ending at capacity.
TEST(Attention, FusedRopeMatchesRopeThenAttentionBitForBit) {
  TS_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  struct FusedCase {
    int num_q_heads, num_kv_heads, q_len;
    std::vector<int> ctx_lens;
  };
  const RopeTable rope = llama3_rope_table();
  for (const FusedCase& c :
       {FusedCase{32, 8, 1, {1000}}, FusedCase{32, 8, 8, {60}}, FusedCase{32, 8, 6, {0, 125, 700}},
        FusedCase{16, 2, 8, {250, 5}}, FusedCase{32, 8, 16, {1008}}}) {
    SCOPED_TRACE("heads " + std::to_string(c.num_q_heads) + "/" + std::to_string(c.num_kv_heads) +
                 " q_len " + std::to_string(c.q_len) + " requests " +
                 std::to_string(c.ctx_lens.size()));
    const int requests = static_cast<int>(c.ctx_lens.size()), layer = 1;
    KvCache cache;
    cache.num_layers = 2;
    cache.num_kv_heads = c.num_kv_heads;
    cache.capacity_tokens = 1024;
    const size_t per_request = kv_cache_bytes_per_request(cache) / sizeof(bf16);
    std::vector<std::unique_ptr<DeviceBuffer<bf16>>> kv[2];
    std::vector<bf16*> bases[2];
    for (int r = 0; r < requests; ++r) {
      const Bf16Host contents = test::random_bf16(per_request, rng);
      for (int path = 0; path < 2; ++path) {
        kv[path].push_back(std::make_unique<DeviceBuffer<bf16>>(per_request));
        kv[path].back()->upload(contents.bits);
        bases[path].push_back(kv[path].back()->get());
      }
    }
    const int width = (c.num_q_heads + 2 * c.num_kv_heads) * kHeadDim;
    const Bf16Host qkv = test::random_bf16(static_cast<size_t>(requests) * c.q_len * width, rng);
    auto dqkv = test::to_device(qkv);
    DeviceBuffer<int> dctx(requests);
    dctx.upload(c.ctx_lens);
    const AttentionShape shape = shape_of(requests, c.q_len, c.num_q_heads);
    const size_t out_elems = static_cast<size_t>(requests) * c.q_len * c.num_q_heads * kHeadDim;
    DeviceBuffer<bf16> q_out(out_elems),
        out[2] = {DeviceBuffer<bf16>(out_elems), DeviceBuffer<bf16>(out_elems)};
    auto ws = make_workspace({shape}, cache);
    KvCache caches[2] = {cache, cache};
    DeviceBuffer<bf16*> dbases[2] = {DeviceBuffer<bf16*>(requests), DeviceBuffer<bf16*>(requests)};
    for (int path = 0; path < 2; ++path) {
      dbases[path].upload(bases[path]);
      caches[path].request_base = dbases[path].get();
      out[path].poison();
    }
    cudaStream_t stream;  // PDL launches, as the runtime's chain makes them
    TS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    rope_kv_append(dqkv.get(), dctx.get(), caches[0], layer, q_out.get(), requests, c.q_len,
                   c.num_q_heads, rope, stream, true);
    decode_attention(q_out.get(), caches[0], layer, dctx.get(), out[0].get(), shape, ws.get(),
                     stream, true);
    decode_attention_rope(dqkv.get(), caches[1], layer, dctx.get(), rope, out[1].get(), shape,
                          ws.get(), stream, true);
    TS_CUDA_CHECK(cudaStreamSynchronize(stream));
    TS_CUDA_CHECK(cudaStreamDestroy(stream));
    const auto want = out[0].download<uint16_t>(), got = out[1].download<uint16_t>();
    ASSERT_EQ(std::count(want.begin(), want.end(), uint16_t{0xFFFF}), 0);
    EXPECT_EQ(mismatches(got, want), 0u) << describe_mismatches(got, want);
    for (int r = 0; r < requests; ++r)
      EXPECT_EQ(kv[1][r]->download<uint16_t>(), kv[0][r]->download<uint16_t>())
          << "cache of request " << r;
  }
}

// Placeholder device pointers for launches that must throw before any CUDA call (validation
// first): they run with or without a GPU.
struct UnlaunchedArgs {
  KvCache cache;
  const bf16* in = reinterpret_cast<const bf16*>(0x100);
  bf16* out = reinterpret_cast<bf16*>(0x100);
  const int* ctx = reinterpret_cast<const int*>(0x100);
  void* ws = reinterpret_cast<void*>(0x100);
  explicit UnlaunchedArgs(int num_kv_heads) {
    cache.request_base = reinterpret_cast<bf16* const*>(0x100);
    cache.num_layers = 1;
    cache.num_kv_heads = num_kv_heads;
    cache.capacity_tokens = 128;
  }
};

TEST(Attention, FusedRopeRejectsWhatItCannotDo) {
  UnlaunchedArgs a(8);
  const KvCache& cache = a.cache;
  const bf16* qkv = a.in;
  bf16* out = a.out;
  const int* ctx = a.ctx;
  void* ws = a.ws;
  const RopeTable rope = llama3_rope_table();
  AttentionShape shape;
  try {
    decode_attention_rope(nullptr, cache, 0, ctx, rope, out, shape, ws, nullptr);
    ADD_FAILURE() << "a null qkv was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("decode_attention_rope: null qkv"), std::string::npos)
        << e.what();
  }
  Variant registers = kVariants[0];  // Q in registers
  TuningScope scope(registers);
  try {
    decode_attention_rope(qkv, cache, 0, ctx, rope, out, shape, ws, nullptr);
    ADD_FAILURE() << "accepted without split_q_smem";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("split_q_smem"), std::string::npos) << e.what();
  }
}

// The launcher's partition is the shared rule the simulator prices (kernels/attention_split.h):
// attention_num_splits against attention_partition with this device's SMs, over random
// capacities, requests and KV heads; and the workspace holds every split's partials.
TEST(Attention, PartitionIsTheSharedRule) {
  TS_SKIP_WITHOUT_GPU();
  int device = 0, sms = 0;
  TS_CUDA_CHECK(cudaGetDevice(&device));
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 500; ++trial) {
    KvCache cache;
    cache.num_layers = 1;
    cache.num_kv_heads = 1 << std::uniform_int_distribution<int>(0, 3)(rng);  // 1..8
    cache.capacity_tokens = std::uniform_int_distribution<int>(16, 40000)(rng);
    AttentionShape shape;
    shape.num_requests = std::uniform_int_distribution<int>(1, 64)(rng);
    shape.num_q_heads = 4 * cache.num_kv_heads;
    shape.q_len = std::uniform_int_distribution<int>(1, 16)(rng);
    const AttentionPartition p =
        attention_partition(cache.capacity_tokens, shape.num_requests, cache.num_kv_heads, sms);
    ASSERT_EQ(attention_num_splits(shape, cache), p.splits)
        << "capacity " << cache.capacity_tokens << ", " << shape.num_requests << " requests, "
        << cache.num_kv_heads << " KV heads";
    EXPECT_EQ(p.split_tokens % kAttentionTileTokens, 0);
    EXPECT_GE(p.split_tokens * p.splits, cache.capacity_tokens);
    EXPECT_LT(p.split_tokens * (p.splits - 1), cache.capacity_tokens);
  }
}

TEST(Attention, RejectsInvalidShapes) {
  UnlaunchedArgs a(4);
  KvCache& cache = a.cache;
  const bf16* q = a.in;
  bf16* out = a.out;
  const int* ctx = a.ctx;
  void* ws = a.ws;
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
  cache.capacity_tokens = 0;  // < q_len
  EXPECT_THROW(decode_attention(q, cache, 0, ctx, out, shape, ws, nullptr), std::invalid_argument);
  try {  // checked before any CUDA call; the message names the function once
    attention_num_splits(shape, cache);
    ADD_FAILURE() << "a zero capacity was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "twinstep::kernels::attention_num_splits: num_requests, num_kv_heads and "
                 "capacity_tokens must be >= 1");
  }
}

}  // namespace
}  // namespace twinstep::kernels
