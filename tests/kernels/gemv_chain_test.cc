// The persistent GEMV chain (kernels/gemv_chain.h): a decode layer's o + residual, gate+up SwiGLU
// normed, down + residual and the next qkv normed in one launch, against a double-precision CPU
// reference of the same stages (bf16 roundings where the stages store); rows that do not depend
// on m, ring sizes and repeated / graph-captured PDL launches that give the same bits, and shapes
// the launcher rejects.
#include "kernels/gemv_chain.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "tests/kernels/test_util.h"

namespace twinstep::kernels {
namespace {

using test::Bf16Host;
using test::DeviceBuffer;
using test::round_bf16;

constexpr float kEps = 1e-5f;

struct Dims {
  int hidden, inter, qkv_n;
};

// Host inputs of one layer's chain: weights (norm weights folded in already: the chain takes
// folded ones), the attention output and the residual stream.
struct HostLayer {
  Bf16Host w_o, w_gu, w_down, w_qkv, attn, residual;
  HostLayer(const Dims& d, int m, std::mt19937_64& rng)
      : w_o(test::random_bf16(size_t{1} * d.hidden * d.hidden, rng, 0.05f)),
        w_gu(test::random_bf16(size_t{2} * d.inter * d.hidden, rng, 0.05f)),
        w_down(test::random_bf16(size_t{1} * d.hidden * d.inter, rng, 0.05f)),
        w_qkv(test::random_bf16(size_t{1} * d.qkv_n * d.hidden, rng, 0.05f)),
        attn(test::random_bf16(size_t{1} * m * d.hidden, rng, 1.0f)),
        residual(test::random_bf16(size_t{1} * m * d.hidden, rng, 1.0f)) {}
};

// What the chain stores, in double with the chain's bf16 roundings at the stores.
struct Reference {
  std::vector<double> residual, act, qkv;
};

double dot(const float* w, const std::vector<double>& x, size_t x_off, int k) {
  double acc = 0;
  for (int i = 0; i < k; ++i) acc += static_cast<double>(w[i]) * x[x_off + i];
  return acc;
}
double inv_rms(const std::vector<double>& x, size_t off, int k) {
  double ss = 0;
  for (int i = 0; i < k; ++i) ss += x[off + i] * x[off + i];
  return 1.0 / std::sqrt(ss / k + kEps);
}
double bf(double v) { return round_bf16(static_cast<float>(v)); }

Reference reference(const HostLayer& h, const Dims& d, int m) {
  Reference ref;
  const int H = d.hidden, I = d.inter;
  std::vector<double> attn(h.attn.values.begin(), h.attn.values.end());
  ref.residual.assign(h.residual.values.begin(), h.residual.values.end());
  for (int r = 0; r < m; ++r)  // o + residual
    for (int j = 0; j < H; ++j) {
      const size_t at = static_cast<size_t>(r) * H + j;
      ref.residual[at] = bf(ref.residual[at] + bf(dot(&h.w_o.values[static_cast<size_t>(j) * H],
                                                      attn, size_t{1} * r * H, H)));
    }
  ref.act.resize(static_cast<size_t>(m) * I);
  for (int r = 0; r < m; ++r) {  // gate+up, normed, SwiGLU
    const double s = inv_rms(ref.residual, static_cast<size_t>(r) * H, H);
    for (int j = 0; j < I; ++j) {
      const double g = s * dot(&h.w_gu.values[static_cast<size_t>(j) * H], ref.residual,
                               static_cast<size_t>(r) * H, H);
      const double u = s * dot(&h.w_gu.values[static_cast<size_t>(I + j) * H], ref.residual,
                               static_cast<size_t>(r) * H, H);
      ref.act[static_cast<size_t>(r) * I + j] = bf(g / (1.0 + std::exp(-g)) * u);
    }
  }
  std::vector<double> residual1 = ref.residual;
  for (int r = 0; r < m; ++r)  // down + residual
    for (int j = 0; j < H; ++j) {
      const size_t at = static_cast<size_t>(r) * H + j;
      ref.residual[at] = bf(residual1[at] + bf(dot(&h.w_down.values[static_cast<size_t>(j) * I],
                                                   ref.act, static_cast<size_t>(r) * I, I)));
    }
  ref.qkv.resize(static_cast<size_t>(m) * d.qkv_n);
  for (int r = 0; r < m; ++r) {  // next layer's qkv, normed
    const double s = inv_rms(ref.residual, static_cast<size_t>(r) * H, H);
    for (int j = 0; j < d.qkv_n; ++j)
      ref.qkv[static_cast<size_t>(r) * d.qkv_n + j] =
          bf(s * dot(&h.w_qkv.values[static_cast<size_t>(j) * H], ref.residual,
                     static_cast<size_t>(r) * H, H));
  }
  return ref;
}

// Device copies of a layer and the chain over them.
struct DeviceLayer {
  DeviceBuffer<bf16> w_o, w_gu, w_down, w_qkv, attn, residual, act, qkv;
  DeviceBuffer<unsigned char> workspace;
  DeviceLayer(const HostLayer& h, const Dims& d, int m)
      : w_o(test::to_device(h.w_o)),
        w_gu(test::to_device(h.w_gu)),
        w_down(test::to_device(h.w_down)),
        w_qkv(test::to_device(h.w_qkv)),
        attn(test::to_device(h.attn)),
        residual(test::to_device(h.residual)),
        act(static_cast<size_t>(m) * d.inter),
        qkv(static_cast<size_t>(m) * d.qkv_n),
        workspace(gemv_chain_workspace_bytes()) {
    gemv_chain_workspace_init(workspace.get(), nullptr);
  }
  GemvChain chain(const Dims& d, int m) const {
    GemvChain c;
    c.m = m;
    c.eps = kEps;
    c.num_stages = 4;
    c.stage[0] = {w_o.get(), attn.get(), residual.get(),
                  d.hidden,  d.hidden,   GemvChainEpilogue::kResidual};
    c.stage[1] = {w_gu.get(), residual.get(), act.get(),
                  d.inter,    d.hidden,       GemvChainEpilogue::kSwigluNormed};
    c.stage[2] = {w_down.get(), act.get(), residual.get(),
                  d.hidden,     d.inter,   GemvChainEpilogue::kResidual};
    c.stage[3] = {w_qkv.get(), residual.get(), qkv.get(),
                  d.qkv_n,     d.hidden,       GemvChainEpilogue::kNormed};
    return c;
  }
  void reset(const HostLayer& h) {
    residual.upload(h.residual.bits);
    act.poison();
    qkv.poison();
  }
};

struct Outputs {
  std::vector<uint16_t> residual, act, qkv;
};
Outputs download(const DeviceLayer& dev) {
  return {dev.residual.download<uint16_t>(), dev.act.download<uint16_t>(),
          dev.qkv.download<uint16_t>()};
}

void expect_matches(const Outputs& out, const Reference& ref) {
  EXPECT_LT(test::rel_error(test::bf16_to_float(out.residual), ref.residual), test::kBf16RelTol);
  EXPECT_LT(test::rel_error(test::bf16_to_float(out.act), ref.act), test::kBf16RelTol);
  EXPECT_LT(test::rel_error(test::bf16_to_float(out.qkv), ref.qkv), test::kBf16RelTol);
  // Element-wise as well: no output more than a few bf16 steps from the reference (scaled by the
  // tensor's RMS, for outputs near zero).
  auto check = [](const std::vector<uint16_t>& bits, const std::vector<double>& r,
                  const char* what) {
    double ss = 0;
    for (double v : r) ss += v * v;
    const double rms = std::sqrt(ss / r.size());
    int bad = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      const double v = test::from_bf16_bits(bits[i]);
      if (!(std::fabs(v - r[i]) <= 0.03 * std::fabs(r[i]) + 0.01 * rms)) ++bad;
    }
    EXPECT_EQ(bad, 0) << what;
  };
  check(out.residual, ref.residual, "residual");
  check(out.act, ref.act, "act");
  check(out.qkv, ref.qkv, "qkv");
}

void run_against_reference(const Dims& d, int m, bool fma_consumer = false) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", m " + std::to_string(m) +
               (fma_consumer ? ", FMA consumer" : ""));
  std::mt19937_64 rng(seed);
  const HostLayer h(d, m, rng);
  DeviceLayer dev(h, d, m);
  dev.reset(h);
  GemvChain chain = dev.chain(d, m);
  chain.fma_consumer = fma_consumer;
  gemv_chain(chain, dev.workspace.get(), nullptr);
  TS_CUDA_CHECK(cudaDeviceSynchronize());
  expect_matches(download(dev), reference(h, d, m));
}

constexpr Dims kSmall{1024, 1536, 1536};
constexpr Dims kLlama3{4096, 14336, 6144};

TEST(GemvChain, LayerStagesMatchTheCpuReference) {
  TS_SKIP_WITHOUT_GPU();
  for (int m = 1; m <= kGemvChainMaxRows; ++m) {
    run_against_reference(kSmall, m);
    run_against_reference(kSmall, m, true);
  }
}

TEST(GemvChain, Llama3ShapesMatchTheCpuReference) {
  TS_SKIP_WITHOUT_GPU();
  run_against_reference(kLlama3, 1);
  run_against_reference(kLlama3, 1, true);
  run_against_reference(kLlama3, 2);
}

// Row 0 of an m-row chain is bit-identical to the 1-row chain over row 0 alone; every ring size
// gives those bits; so do repeated launches (the barrier counter carries on) and a captured graph
// of PDL launches replayed.
TEST(GemvChain, RowsRingsAndRepeatsGiveTheSameBits) {
  TS_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Dims d = kSmall;
  const int m = 4;
  const HostLayer h(d, m, rng);
  DeviceLayer dev(h, d, m);
  dev.reset(h);
  gemv_chain(dev.chain(d, m), dev.workspace.get(), nullptr);
  const Outputs full = download(dev);

  HostLayer h1 = h;  // row 0 alone
  h1.attn.bits.resize(d.hidden);
  h1.attn.values.resize(d.hidden);
  h1.residual.bits.resize(d.hidden);
  h1.residual.values.resize(d.hidden);
  DeviceLayer one(h1, d, 1);
  auto expect_row0 = [&](const Outputs& o, const char* what) {
    SCOPED_TRACE(what);
    EXPECT_TRUE(std::equal(o.residual.begin(), o.residual.end(), full.residual.begin()));
    EXPECT_TRUE(std::equal(o.act.begin(), o.act.end(), full.act.begin()));
    EXPECT_TRUE(std::equal(o.qkv.begin(), o.qkv.end(), full.qkv.begin()));
  };
  for (int ring : {6, 8, 12}) {
    one.reset(h1);
    gemv_chain(one.chain(d, 1), one.workspace.get(), nullptr, false, ring);
    expect_row0(download(one), ("ring " + std::to_string(ring)).c_str());
  }
  for (int repeat = 0; repeat < 3; ++repeat) {
    one.reset(h1);
    gemv_chain(one.chain(d, 1), one.workspace.get(), nullptr, true);
    expect_row0(download(one), "eager repeat");
  }

  // Two PDL launches back to back in a graph, replayed twice: the second launch of a replay
  // recomputes from the first's residual, so compare against an eager pair.
  cudaStream_t stream;
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  one.reset(h1);
  gemv_chain(one.chain(d, 1), one.workspace.get(), stream, false);
  gemv_chain(one.chain(d, 1), one.workspace.get(), stream, false);
  TS_CUDA_CHECK(cudaStreamSynchronize(stream));
  const Outputs eager_pair = download(one);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TS_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  gemv_chain(one.chain(d, 1), one.workspace.get(), stream, true);
  gemv_chain(one.chain(d, 1), one.workspace.get(), stream, true);
  TS_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    one.reset(h1);
    TS_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TS_CUDA_CHECK(cudaStreamSynchronize(stream));
    const Outputs o = download(one);
    EXPECT_EQ(o.residual, eager_pair.residual) << "replay " << replay;
    EXPECT_EQ(o.act, eager_pair.act) << "replay " << replay;
    EXPECT_EQ(o.qkv, eager_pair.qkv) << "replay " << replay;
  }
  TS_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TS_CUDA_CHECK(cudaGraphDestroy(graph));
  TS_CUDA_CHECK(cudaStreamDestroy(stream));
  // The counter is a whole number of generations: (4 - 1) barriers per launch, 132 (the SM
  // count) arrivals each.
  int device = 0, sms = 0;
  TS_CUDA_CHECK(cudaGetDevice(&device));
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  unsigned long long counter = 0;
  TS_CUDA_CHECK(cudaMemcpy(&counter, one.workspace.get(), sizeof(counter), cudaMemcpyDeviceToHost));
  const unsigned long long launches = 3 + 3 + 2 + 2 * 2;
  EXPECT_EQ(counter, launches * 3 * static_cast<unsigned long long>(sms));
}

// Shape and argument errors are thrown before any CUDA call (no GPU needed), except the ring
// size, which needs the device's shared-memory size.
TEST(GemvChain, RejectsBadShapesAndArguments) {
  // Fake device addresses, never dereferenced: 64 KB apart, so only the alias case overlaps.
  alignas(16) static unsigned char arena[4 * 65536];
  unsigned char* w = arena;
  unsigned char* x = arena + 65536;
  unsigned char* out = arena + 2 * 65536;
  unsigned char* ws = arena + 3 * 65536;
  auto valid = [&] {
    GemvChain c;
    c.num_stages = 1;
    c.m = 1;
    c.stage[0] = {reinterpret_cast<const bf16*>(w),
                  reinterpret_cast<const bf16*>(x),
                  reinterpret_cast<bf16*>(out),
                  16,
                  512,
                  GemvChainEpilogue::kNormed};
    return c;
  };
  auto rejects = [&](GemvChain c, const char* what, bool null_workspace = false) {
    EXPECT_THROW(gemv_chain(c, null_workspace ? nullptr : ws, nullptr), std::invalid_argument)
        << what;
  };
  GemvChain c = valid();
  c.num_stages = 0;
  rejects(c, "no stage");
  c = valid();
  c.num_stages = kGemvChainMaxStages + 1;
  rejects(c, "too many stages");
  c = valid();
  c.m = 0;
  rejects(c, "m = 0");
  c = valid();
  c.m = kGemvChainMaxRows + 1;
  rejects(c, "m = 5");
  c = valid();
  c.stage[0].k = 1000;
  rejects(c, "k not a multiple of 512");
  c = valid();
  c.stage[0].k = kGemvChainMaxK + 512;
  rejects(c, "k too large");
  c = valid();
  c.stage[0].n = 24;
  rejects(c, "n not a multiple of 16");
  c = valid();
  c.stage[0].epilogue = GemvChainEpilogue::kSwigluNormed;
  c.stage[0].n = 12;
  rejects(c, "SwiGLU n not a multiple of 8");
  c = valid();
  c.stage[0].x = nullptr;
  rejects(c, "null x");
  c = valid();
  c.stage[0].out = reinterpret_cast<bf16*>(x) + 8;
  rejects(c, "out overlapping x");
  c = valid();
  c.stage[0].w = reinterpret_cast<const bf16*>(w + 2);
  rejects(c, "unaligned w");
  c = valid();
  c.eps = 0.0f;
  rejects(c, "eps = 0");
  rejects(valid(), "null workspace", true);
}

TEST(GemvChain, RejectsARingThatDoesNotFit) {
  TS_SKIP_WITHOUT_GPU();
  DeviceBuffer<bf16> w(size_t{16} * kGemvChainMaxK), x(size_t{4} * kGemvChainMaxK), out(64);
  DeviceBuffer<unsigned char> ws(gemv_chain_workspace_bytes());
  gemv_chain_workspace_init(ws.get(), nullptr);
  GemvChain c;
  c.num_stages = 1;
  c.m = 4;
  c.stage[0] = {w.get(), x.get(), out.get(), 16, kGemvChainMaxK, GemvChainEpilogue::kNormed};
  EXPECT_THROW(gemv_chain(c, ws.get(), nullptr, false, 12), std::invalid_argument);
  EXPECT_THROW(gemv_chain(c, ws.get(), nullptr, false, 7), std::invalid_argument);
  gemv_chain(c, ws.get(), nullptr, false, 6);  // 96 KB of ring beside 112 KB of rows: fits
  TS_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace twinstep::kernels
