#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/moe.h"
#include "kernels/tuning.h"
#include "tests/kernels/test_util.h"

namespace twinstep::kernels {
namespace {

using test::Bf16Host;
using test::DeviceBuffer;

double dot(const float* a, const float* b, int n) {
  double acc = 0;
  for (int i = 0; i < n; ++i) acc += static_cast<double>(a[i]) * b[i];
  return acc;
}

// SwiGLU FFN on one token in double, the activation rounded to bf16 as the kernels store it.
std::vector<double> ffn(const float* x, const float* gate_up, const float* down, int hidden,
                        int inter) {
  std::vector<float> act(inter);
  for (int i = 0; i < inter; ++i) {
    const double g = dot(gate_up + static_cast<size_t>(i) * hidden, x, hidden);
    const double u = dot(gate_up + static_cast<size_t>(inter + i) * hidden, x, hidden);
    act[i] = test::round_bf16(static_cast<float>(g / (1.0 + std::exp(-g)) * u));
  }
  std::vector<double> y(hidden);
  for (int h = 0; h < hidden; ++h)
    y[h] = dot(down + static_cast<size_t>(h) * inter, act.data(), inter);
  return y;
}

// The grouped expert GEMVs moe_forward can run on (GemvTuning::moe_fill / moe_stages): the
// split kernel's grouped mode (the default: ring of 3) with its other weight paths, and the
// bulk-copy stage ring it replaced. A test body run under each restores the tuning after.
struct MoeKernel {
  int fill, stages;
  bool warp_tiles;
  const char* name;
};
constexpr MoeKernel kMoeKernels[] = {
    {3, 3, false, "split, ring of 3 (default)"}, {3, 0, false, "split, registers"},
    {3, 2, false, "split, refilled ring of 2"},  {3, 6, false, "split, ring of 6"},
    {3, 3, true, "warp-owned tiles, ring of 3"}, {3, 0, true, "warp-owned tiles, registers"},
    {0, 0, false, "bulk-copy stage ring"}};
struct SavedGemvTuning {
  const detail::GemvTuning saved = detail::gemv_tuning();
  ~SavedGemvTuning() { detail::gemv_tuning() = saved; }
};
template <typename F>
void for_each_moe_kernel(F&& body) {
  for (const MoeKernel& k : kMoeKernels) {
    SCOPED_TRACE(k.name);
    const SavedGemvTuning restore;
    detail::gemv_tuning().moe_fill = k.fill;
    detail::gemv_tuning().moe_stages = k.stages;
    detail::gemv_tuning().moe_large_m_stages = k.stages;
    detail::gemv_tuning().moe_warp_tiles = k.warp_tiles;
    body();
    if (::testing::Test::HasFatalFailure()) return;
  }
}

struct MoeCase {
  int m, num_experts, top_k, hidden, inter, shared_inter;
  bool renormalize;
  bool prefill = false;  // moe_prefill (grouped GEMMs) instead of moe_forward
};

// Host weights of one MoE FFN (all experts) and its input.
struct MoeHost {
  Bf16Host x, router, gate_up, down, sgu, sdown;
};

MoeHost random_moe(const MoeCase& c, std::mt19937_64& rng) {
  const float ws = 1.0f / std::sqrt(static_cast<float>(c.hidden));
  MoeHost h;
  h.x = test::random_bf16(static_cast<size_t>(c.m) * c.hidden, rng);
  h.router = test::random_bf16(static_cast<size_t>(c.num_experts) * c.hidden, rng, ws);
  h.gate_up =
      test::random_bf16(static_cast<size_t>(c.num_experts) * 2 * c.inter * c.hidden, rng, ws);
  h.down = test::random_bf16(static_cast<size_t>(c.num_experts) * c.hidden * c.inter, rng, ws);
  h.sgu = test::random_bf16(static_cast<size_t>(2 * c.shared_inter + 1) * c.hidden, rng, ws);
  h.sdown = test::random_bf16(static_cast<size_t>(c.hidden) * c.shared_inter + 1, rng, ws);
  return h;
}

MoeShape shape_of(const MoeCase& c) {
  MoeShape shape;
  shape.num_experts = c.num_experts;
  shape.top_k = c.top_k;
  shape.hidden = c.hidden;
  shape.expert_inter = c.inter;
  shape.shared_inter = c.shared_inter;
  shape.renormalize = c.renormalize;
  return shape;
}

// CPU reference of the MoE FFN restricted to experts [begin, end) (kernels/moe.h): routing over
// all experts from fp64 logits, checked against the GPU's picks `ids` and weights `w` (the GPU
// ranks fp32 logits: its pick is accepted where the reference logits nearly tie), then the
// weighted sum over the slots whose expert lies in the range, plus the shared expert when
// `shared`. Returns [m][hidden] in double.
std::vector<double> moe_reference(const MoeCase& c, const MoeHost& h, const std::vector<int>& ids,
                                  const std::vector<float>& w, int begin, int end, bool shared) {
  std::vector<double> ref(static_cast<size_t>(c.m) * c.hidden, 0.0);
  for (int t = 0; t < c.m; ++t) {
    const float* xt = &h.x.values[static_cast<size_t>(t) * c.hidden];
    std::vector<double> logit(c.num_experts);
    for (int e = 0; e < c.num_experts; ++e)
      logit[e] = dot(&h.router.values[static_cast<size_t>(e) * c.hidden], xt, c.hidden);
    std::vector<int> order(c.num_experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logit[a] > logit[b]; });
    for (int j = 0; j < c.top_k; ++j) {
      const int gpu = ids[t * c.top_k + j];
      EXPECT_TRUE(gpu >= 0 && gpu < c.num_experts) << "token " << t << " rank " << j;
      if (gpu < 0 || gpu >= c.num_experts) return ref;
      EXPECT_NEAR(logit[gpu], logit[order[j]], 1e-4) << "token " << t << " rank " << j;
    }
    double denom = 0;
    const double mx = logit[order[0]];
    if (c.renormalize)
      for (int j = 0; j < c.top_k; ++j) denom += std::exp(logit[ids[t * c.top_k + j]] - mx);
    else
      for (int e = 0; e < c.num_experts; ++e) denom += std::exp(logit[e] - mx);
    for (int j = 0; j < c.top_k; ++j) {
      const int e = ids[t * c.top_k + j];
      const double wt = std::exp(logit[e] - mx) / denom;
      EXPECT_NEAR(w[t * c.top_k + j], wt, 1e-3 * wt + 1e-6) << "token " << t << " rank " << j;
      if (e < begin || e >= end) continue;
      const auto y =
          ffn(xt, &h.gate_up.values[static_cast<size_t>(e) * 2 * c.inter * c.hidden],
              &h.down.values[static_cast<size_t>(e) * c.hidden * c.inter], c.hidden, c.inter);
      for (int k = 0; k < c.hidden; ++k) ref[static_cast<size_t>(t) * c.hidden + k] += wt * y[k];
    }
    if (shared && c.shared_inter > 0) {
      const auto y = ffn(xt, h.sgu.values.data(), h.sdown.values.data(), c.hidden, c.shared_inter);
      for (int k = 0; k < c.hidden; ++k) ref[static_cast<size_t>(t) * c.hidden + k] += y[k];
    }
  }
  return ref;
}

// Experts [begin, end) of a host tensor of per-expert blocks of `per` elements.
Bf16Host expert_block(const Bf16Host& all, size_t per, int begin, int end) {
  Bf16Host out(per * static_cast<size_t>(end - begin));
  std::copy(all.bits.begin() + per * begin, all.bits.begin() + per * end, out.bits.begin());
  std::copy(all.values.begin() + per * begin, all.values.begin() + per * end, out.values.begin());
  return out;
}

// One moe_forward call (moe_prefill when c.prefill) on fresh device copies, experts [begin, end)
// only (their weights alone on the device, as an EP rank holds them), with or without the shared
// expert; workspace and outputs poisoned first (an unwritten element stays NaN). Returns out as
// floats; ids / w receive the routing.
std::vector<float> run_moe(const MoeCase& c, const MoeHost& h, int begin, int end, bool shared,
                           std::vector<int>* ids = nullptr, std::vector<float>* w = nullptr,
                           const std::vector<int>* active = nullptr) {
  MoeShape shape = shape_of(c);
  shape.expert_begin = begin;
  shape.expert_end = end;
  if (!shared) shape.shared_inter = 0;
  const size_t gu_per = static_cast<size_t>(2) * c.inter * c.hidden;
  const size_t down_per = static_cast<size_t>(c.hidden) * c.inter;
  auto dx = test::to_device(h.x);
  auto drouter = test::to_device(h.router);
  auto dgu = test::to_device(expert_block(h.gate_up, gu_per, begin, end));
  auto ddown = test::to_device(expert_block(h.down, down_per, begin, end));
  auto dsgu = test::to_device(h.sgu);
  auto dsdown = test::to_device(h.sdown);
  const bool with_shared = shape.shared_inter > 0;
  MoeWeights weights{drouter.get(), dgu.get(), ddown.get(), with_shared ? dsgu.get() : nullptr,
                     with_shared ? dsdown.get() : nullptr};
  DeviceBuffer<unsigned char> workspace(c.prefill ? moe_prefill_workspace_bytes(c.m, shape)
                                                  : moe_workspace_bytes(c.m, shape));
  workspace.poison();
  DeviceBuffer<bf16> out(static_cast<size_t>(c.m) * c.hidden);
  DeviceBuffer<int> did(static_cast<size_t>(c.m) * c.top_k);
  DeviceBuffer<float> dw(static_cast<size_t>(c.m) * c.top_k);
  out.poison();
  did.poison();
  dw.poison();
  DeviceBuffer<int> dactive(active != nullptr ? active->size() : 0);
  if (active != nullptr) dactive.upload(*active);
  if (c.prefill)
    moe_prefill(dx.get(), weights, c.m, shape, workspace.get(), out.get(), nullptr,
                MoeRouting{did.get(), dw.get()});
  else
    moe_forward(dx.get(), weights, c.m, shape, workspace.get(), out.get(), nullptr, false,
                MoeRouting{did.get(), dw.get()}, active != nullptr ? dactive.get() : nullptr);
  if (ids != nullptr) *ids = did.download();
  if (w != nullptr) *w = dw.download();
  return test::bf16_to_float(out.download<uint16_t>());
}

// got against a reference: relative error under kBf16RelTol, or exactly +0 everywhere where the
// reference is all zero (a range no token selected, no shared expert).
void expect_matches(const std::vector<float>& got, const std::vector<double>& ref,
                    const char* what) {
  if (std::all_of(ref.begin(), ref.end(), [](double v) { return v == 0.0; })) {
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(test::to_bf16_bits(got[i]), 0u) << what << ": element " << i << " not +0";
    return;
  }
  EXPECT_LT(test::rel_error(got, ref), test::kBf16RelTol) << what;
}

class MoeCases : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeCases, MatchesCpuReference) {
  TS_SKIP_WITHOUT_GPU();
  const MoeCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const MoeHost h = random_moe(c, rng);
  auto check = [&] {
    std::vector<int> ids;
    std::vector<float> w;
    const auto got = run_moe(c, h, 0, c.num_experts, true, &ids, &w);
    const auto ref = moe_reference(c, h, ids, w, 0, c.num_experts, true);
    expect_matches(got, ref, "full range");
  };
  if (c.prefill)
    check();
  else
    for_each_moe_kernel(check);
}

// Expert ranges (expert parallelism): two half ranges, each holding only its experts' weights,
// the first with the shared expert, sum to the full call; each matches the CPU reference of its
// range; a range that no token selected (and no shared expert) is exactly zero.
class MoeRanges : public ::testing::TestWithParam<MoeCase> {};
void check_ranges(const MoeCase& c, const MoeHost& h);

TEST_P(MoeRanges, HalvesSumToFullAndUnselectedIsZero) {
  TS_SKIP_WITHOUT_GPU();
  const MoeCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", m " + std::to_string(c.m));
  std::mt19937_64 rng(seed);
  const MoeHost h = random_moe(c, rng);
  if (c.prefill)
    check_ranges(c, h);
  else
    for_each_moe_kernel([&] { check_ranges(c, h); });
}

void check_ranges(const MoeCase& c, const MoeHost& h) {
  const int E = c.num_experts, half = E / 2;
  std::vector<int> ids, ids_lo, ids_hi;
  std::vector<float> w, w_lo, w_hi;
  const auto full = run_moe(c, h, 0, E, true, &ids, &w);
  const auto lo = run_moe(c, h, 0, half, true, &ids_lo, &w_lo);
  const auto hi = run_moe(c, h, half, E, false, &ids_hi, &w_hi);
  // Routing is over all experts whatever the range: the same ids and weights, bit for bit.
  EXPECT_EQ(ids_lo, ids);
  EXPECT_EQ(ids_hi, ids);
  EXPECT_EQ(w_lo, w);
  EXPECT_EQ(w_hi, w);
  for (int id : ids) ASSERT_TRUE(id >= 0 && id < E) << "routed to expert " << id;
  expect_matches(full, moe_reference(c, h, ids, w, 0, E, true), "full range");
  expect_matches(lo, moe_reference(c, h, ids, w, 0, half, true), "lower half + shared");
  expect_matches(hi, moe_reference(c, h, ids, w, half, E, false), "upper half");
  // lo + hi against full: the three outputs are fp32 sums each rounded to bf16 once; a rounding
  // moves a value by at most half an ulp, <= 2^-8 of the rounded magnitude (8 significant bits),
  // so |lo + hi - full| <= 2^-8 (|lo| + |hi| + |full|). The fp32 sums differ only in the order
  // of adding the same expert outputs (relative 2^-24 per add, top_k adds): 1e-5 of the largest
  // output covers that.
  float scale = 0.0f;
  for (float v : full) scale = std::max(scale, std::fabs(v));
  int worst = -1;
  double worst_excess = 0.0;
  for (size_t i = 0; i < full.size(); ++i) {
    ASSERT_TRUE(std::isfinite(lo[i]) && std::isfinite(hi[i]) && std::isfinite(full[i])) << i;
    const double err = std::fabs(double(lo[i]) + double(hi[i]) - double(full[i]));
    const double tol =
        std::ldexp(std::fabs(lo[i]) + std::fabs(hi[i]) + std::fabs(full[i]), -8) + 1e-5 * scale;
    if (err - tol > worst_excess) {
      worst_excess = err - tol;
      worst = int(i);
    }
  }
  EXPECT_LT(worst, 0) << "element " << worst << ": lo " << lo[size_t(std::max(worst, 0))]
                      << " + hi " << hi[size_t(std::max(worst, 0))] << " vs full "
                      << full[size_t(std::max(worst, 0))] << " (excess " << worst_excess << ")";
  // An expert no token selected, computed alone without the shared expert: exactly +0 (the
  // combine adds nothing). Exists whenever m * top_k < num_experts.
  std::vector<bool> picked(E, false);
  for (int id : ids) picked[size_t(id)] = true;
  const auto none = std::find(picked.begin(), picked.end(), false);
  if (c.m * c.top_k < E) {
    ASSERT_NE(none, picked.end());
  }
  if (none != picked.end()) {
    const int e = int(none - picked.begin());
    const auto zero = run_moe(c, h, e, e + 1, false);
    for (size_t i = 0; i < zero.size(); ++i)
      ASSERT_EQ(test::to_bf16_bits(zero[i]), 0u) << "expert " << e << ", element " << i;
  }
}

// MoeRouting's ring (the runtime's per-launch routing record): with the device counter at 7 and
// 3 entries of stride m * top_k + 5, the ids and weights land in entry 1 exactly as a plain
// routing copy has them (a half range: routing is over all experts), the rest stays poisoned.
TEST(MoeRouting, RingEntryFollowsTheDeviceCounter) {
  TS_SKIP_WITHOUT_GPU();
  const MoeCase c{5, 32, 4, 256, 128, 0, true};
  std::mt19937_64 rng(test::fresh_seed());
  const MoeHost h = random_moe(c, rng);
  std::vector<int> ids;
  std::vector<float> w;
  run_moe(c, h, 0, c.num_experts, false, &ids, &w);
  MoeShape shape = shape_of(c);
  shape.expert_begin = 0;
  shape.expert_end = c.num_experts / 2;
  const size_t per = static_cast<size_t>(c.m) * c.top_k, stride = per + 5;
  auto dx = test::to_device(h.x);
  auto drouter = test::to_device(h.router);
  const size_t gu_per = static_cast<size_t>(2) * c.inter * c.hidden;
  const size_t down_per = static_cast<size_t>(c.hidden) * c.inter;
  auto dgu = test::to_device(expert_block(h.gate_up, gu_per, 0, c.num_experts / 2));
  auto ddown = test::to_device(expert_block(h.down, down_per, 0, c.num_experts / 2));
  const MoeWeights weights{drouter.get(), dgu.get(), ddown.get(), nullptr, nullptr};
  DeviceBuffer<unsigned char> workspace(moe_workspace_bytes(c.m, shape));
  DeviceBuffer<bf16> out(static_cast<size_t>(c.m) * c.hidden);
  DeviceBuffer<int> ring_ids(3 * stride);
  DeviceBuffer<float> ring_w(3 * stride);
  DeviceBuffer<uint64_t> counter(1);
  ring_ids.poison();
  ring_w.poison();
  counter.upload(std::vector<uint64_t>{7});
  MoeRouting routing{ring_ids.get(), ring_w.get()};
  routing.entry = counter.get();
  routing.entries = 3;
  routing.entry_stride = stride;
  moe_forward(dx.get(), weights, c.m, shape, workspace.get(), out.get(), nullptr, false, routing);
  const std::vector<int> got_ids = ring_ids.download();
  const std::vector<float> got_w = ring_w.download();
  for (size_t i = 0; i < 3 * stride; ++i) {
    if (i >= stride && i < stride + per) {
      EXPECT_EQ(got_ids[i], ids[i - stride]) << i;
      EXPECT_EQ(got_w[i], w[i - stride]) << i;
    } else {
      EXPECT_EQ(got_ids[i], -1) << "written outside the entry at " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranges, MoeRanges,
                         ::testing::Values(MoeCase{1, 32, 4, 256, 128, 128, true},
                                           MoeCase{6, 32, 4, 256, 128, 0, true},
                                           MoeCase{6, 32, 4, 256, 128, 128, false},
                                           MoeCase{16, 32, 4, 256, 128, 128, true}));

INSTANTIATE_TEST_SUITE_P(Cases, MoeCases,
                         ::testing::Values(MoeCase{1, 32, 4, 256, 128, 0, true},
                                           MoeCase{5, 64, 8, 512, 192, 0, true},
                                           MoeCase{3, 16, 2, 256, 64, 320, false},
                                           MoeCase{16, 128, 8, 256, 128, 128, true}));

// Prefill: m beyond 16 rows, not multiples of the 64 / 128-row tiles; 64-row tiles (experts
// average < 128 rows) and 128-row tiles (the last two); hidden 192 leaves the second 128-column
// tile of the down GEMM half empty; 16 experts fill an eighth of the router GEMM's columns.
INSTANTIATE_TEST_SUITE_P(PrefillCases, MoeCases,
                         ::testing::Values(MoeCase{17, 32, 4, 256, 128, 0, true, true},
                                           MoeCase{100, 64, 8, 512, 192, 128, true, true},
                                           MoeCase{333, 16, 2, 256, 64, 320, false, true},
                                           MoeCase{1000, 128, 8, 256, 128, 0, true, true},
                                           MoeCase{600, 16, 4, 192, 64, 128, true, true},
                                           MoeCase{130, 16, 16, 128, 64, 0, true, true}));

// Prefill ranges: the halves sum to the full call; 20 rows x top_k 1 of 32 experts leaves an
// expert with no token (exactly zero alone).
INSTANTIATE_TEST_SUITE_P(PrefillRanges, MoeRanges,
                         ::testing::Values(MoeCase{20, 32, 1, 256, 128, 128, true, true},
                                           MoeCase{77, 32, 4, 256, 128, 0, true, true},
                                           MoeCase{300, 32, 4, 256, 128, 128, false, true},
                                           MoeCase{520, 16, 8, 128, 64, 64, true, true}));

// Skewed routing: every token's inputs lean one way (+0.5 on every element) and expert 5's
// router row points that way (logit 3.8 +- 0.3, others below ~2), expert 9's away (~ -3.8): every
// token picks expert 5, none picks expert 9. The full range, expert 5 alone (one expert with
// every token: several row tiles) and expert 9 alone (no rows at all: exactly zero) each match
// the CPU reference.
TEST(MoePrefill, SkewedRoutingAndEmptyExpert) {
  TS_SKIP_WITHOUT_GPU();
  const MoeCase c{300, 32, 4, 256, 128, 128, true, true};
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  MoeHost h = random_moe(c, rng);
  for (size_t i = 0; i < h.x.size(); ++i) h.x.set(i, h.x.values[i] + 0.5f);
  for (int k = 0; k < c.hidden; ++k) {
    h.router.set(static_cast<size_t>(5) * c.hidden + k, 0.03f);
    h.router.set(static_cast<size_t>(9) * c.hidden + k, -0.03f);
  }
  std::vector<int> ids;
  std::vector<float> w;
  const auto full = run_moe(c, h, 0, c.num_experts, true, &ids, &w);
  int picked5 = 0, picked9 = 0;
  for (int id : ids) {
    picked5 += id == 5;
    picked9 += id == 9;
  }
  EXPECT_EQ(picked5, c.m);
  EXPECT_EQ(picked9, 0);
  expect_matches(full, moe_reference(c, h, ids, w, 0, c.num_experts, true), "full range");
  const auto only5 = run_moe(c, h, 5, 6, false);
  expect_matches(only5, moe_reference(c, h, ids, w, 5, 6, false), "expert 5 alone");
  const auto only9 = run_moe(c, h, 9, 10, false);
  for (size_t i = 0; i < only9.size(); ++i)
    ASSERT_EQ(test::to_bf16_bits(only9[i]), 0u) << "expert 9, element " << i;
  const auto lower = run_moe(c, h, 0, 16, true);
  expect_matches(lower, moe_reference(c, h, ids, w, 0, 16, true), "experts [0, 16) + shared");
}

// Determinism and row independence: the same call twice gives the same bits, and the first 40
// rows computed alone (64-row tiles, other tile table) give the bits the 600-row call (128-row
// tiles) gave them.
TEST(MoePrefill, DeterministicAndRowIndependent) {
  TS_SKIP_WITHOUT_GPU();
  MoeCase c{600, 16, 4, 192, 64, 128, true, true};
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const MoeHost h = random_moe(c, rng);
  const auto a = run_moe(c, h, 0, c.num_experts, true);
  const auto b = run_moe(c, h, 0, c.num_experts, true);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(test::to_bf16_bits(a[i]), test::to_bf16_bits(b[i])) << "element " << i;
  c.m = 40;
  const auto head = run_moe(c, h, 0, c.num_experts, true);  // x's first 40 rows
  for (size_t i = 0; i < head.size(); ++i)
    ASSERT_EQ(test::to_bf16_bits(head[i]), test::to_bf16_bits(a[i])) << "element " << i;
}

// moe_forward's rows are independent of the rows beside them, bit for bit (speculative verify
// runs up to 16 rows where plain decode runs 1, and must commit the same tokens): each row of a
// 16-row call equals the same row computed alone (m = 1) and inside a 6-row call, with the
// Qwen3-30B-A3B routing (128 experts, top-8) and a shared expert; an expert picked by several
// rows reads its weights once for all of them, by one row alone for one.
TEST(Moe, RowsIndependentOfTheirBatch) {
  TS_SKIP_WITHOUT_GPU();
  MoeCase c{16, 128, 8, 512, 128, 256, true};
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const MoeHost all = random_moe(c, rng);
  auto rows_of = [&](int first, int m) {
    MoeCase sub = c;
    sub.m = m;
    MoeHost h = all;
    h.x = Bf16Host(static_cast<size_t>(m) * c.hidden);
    const size_t at = static_cast<size_t>(first) * c.hidden;
    std::copy(all.x.bits.begin() + at, all.x.bits.begin() + at + h.x.bits.size(), h.x.bits.begin());
    std::copy(all.x.values.begin() + at, all.x.values.begin() + at + h.x.values.size(),
              h.x.values.begin());
    return run_moe(sub, h, 0, c.num_experts, true);
  };
  for_each_moe_kernel([&] {
    const auto full = run_moe(c, all, 0, c.num_experts, true);
    for (const auto& [first, m] :
         {std::pair{0, 1}, std::pair{7, 1}, std::pair{15, 1}, std::pair{3, 6}, std::pair{10, 6}}) {
      const auto part = rows_of(first, m);
      const size_t at = static_cast<size_t>(first) * c.hidden;
      for (size_t i = 0; i < part.size(); ++i)
        ASSERT_EQ(test::to_bf16_bits(part[i]), test::to_bf16_bits(full[at + i]))
            << "rows [" << first << ", " << first + m << "), element " << i;
    }
  });
}

// The split kernel's weight paths (registers, the rings of 2, 3 and 6; for up to 8 rows
// moe_stages, for 16 moe_large_m_stages) give the same bits, with the 8-piece split and with
// warp-owned tiles (each its own bits): each output is the
// same sum over the same 8 K pieces, whatever carries the weights. The bulk ring's sums are in
// another order (checked against the CPU reference above, not here).
TEST(Moe, SplitKernelWeightPathsGiveTheSameBits) {
  TS_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const int m : {1, 6, 16}) {
    const MoeCase c{m, 64, 8, 512, 192, 320, true};
    SCOPED_TRACE("m " + std::to_string(m));
    const MoeHost h = random_moe(c, rng);
    const SavedGemvTuning restore;
    detail::gemv_tuning().moe_fill = 3;
    for (const bool warp_tiles : {false, true}) {
      detail::gemv_tuning().moe_warp_tiles = warp_tiles;
      std::vector<float> first;
      for (const auto& [stages, large] :
           {std::pair{3, 2}, std::pair{0, 0}, std::pair{2, 3}, std::pair{6, 6}}) {
        detail::gemv_tuning().moe_stages = stages;
        detail::gemv_tuning().moe_large_m_stages = large;
        const auto got = run_moe(c, h, 0, c.num_experts, true);
        if (first.empty()) first = got;
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(test::to_bf16_bits(got[i]), test::to_bf16_bits(first[i]))
              << (warp_tiles ? "warp-owned tiles" : "split") << ", moe_stages " << stages
              << ", moe_large_m_stages " << large << ", element " << i;
      }
    }
  }
}

// Inactive rows (the runtime's padded verify positions) select no expert: routing ids -1 and
// weights 0, output exactly +0 without a shared expert and the shared expert's part alone with
// one (a call over no expert's range: the full call's rows with every routed slot outside it);
// every active row equals the unmasked call's bit for bit.
void check_inactive_rows();
TEST(Moe, InactiveRowsSelectNoExpert) {
  TS_SKIP_WITHOUT_GPU();
  for_each_moe_kernel([] { check_inactive_rows(); });
}

void check_inactive_rows() {
  for (const int shared_inter : {0, 256}) {
    const MoeCase c{16, 128, 8, 512, 128, shared_inter, true};
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + ", shared " + std::to_string(shared_inter));
    std::mt19937_64 rng(seed);
    const MoeHost h = random_moe(c, rng);
    std::vector<int> active(16, 1);
    for (const int t : {2, 5, 11, 15}) active[size_t(t)] = 0;
    std::vector<int> ids;
    std::vector<float> w;
    const auto full = run_moe(c, h, 0, c.num_experts, true);
    const auto masked = run_moe(c, h, 0, c.num_experts, true, &ids, &w, &active);
    // Experts [0, 1) alone with the shared expert: a row that did not pick expert 0 gets the
    // shared part only, the value an inactive row must have.
    std::vector<int> ids0;
    const auto shared_only = run_moe(c, h, 0, 1, true, &ids0);
    for (int t = 0; t < c.m; ++t) {
      bool picked0 = false;
      for (int j = 0; j < c.top_k; ++j) picked0 = picked0 || ids0[size_t(t * c.top_k + j)] == 0;
      for (int j = 0; j < c.top_k; ++j) {
        if (active[size_t(t)] != 0) continue;
        EXPECT_EQ(ids[size_t(t * c.top_k + j)], -1) << "row " << t;
        EXPECT_EQ(w[size_t(t * c.top_k + j)], 0.0f) << "row " << t;
      }
      for (int k = 0; k < c.hidden; ++k) {
        const size_t i = size_t(t) * c.hidden + k;
        const uint32_t got = test::to_bf16_bits(masked[i]);
        if (active[size_t(t)] != 0) {
          ASSERT_EQ(got, test::to_bf16_bits(full[i])) << "active row " << t << ", element " << k;
        } else if (shared_inter == 0) {
          ASSERT_EQ(got, 0u) << "inactive row " << t << ", element " << k;
        } else if (!picked0) {
          ASSERT_EQ(got, test::to_bf16_bits(shared_only[i]))
              << "inactive row " << t << ", element " << k;
        }
      }
    }
  }
}

TEST(MoePrefill, RejectsInvalidShapes) {
  const bf16* p = reinterpret_cast<const bf16*>(0x100);
  bf16* o = reinterpret_cast<bf16*>(0x100);
  void* ws = reinterpret_cast<void*>(0x100);
  MoeWeights w{p, p, p, nullptr, nullptr};
  MoeShape s;
  EXPECT_THROW(moe_prefill(p, w, 0, s, ws, o, nullptr), std::invalid_argument);
  EXPECT_THROW(moe_prefill(p, w, (1 << 22) / 8 + 1, s, ws, o, nullptr), std::invalid_argument);
  s.top_k = 17;
  EXPECT_THROW(moe_prefill(p, w, 64, s, ws, o, nullptr), std::invalid_argument);
  s.top_k = 8;
  s.hidden = 100;
  EXPECT_THROW(moe_prefill(p, w, 64, s, ws, o, nullptr), std::invalid_argument);
  s.hidden = 2048;
  s.shared_inter = 128;  // no shared weights given
  EXPECT_THROW(moe_prefill(p, w, 64, s, ws, o, nullptr), std::invalid_argument);
  s.shared_inter = 0;
  s.expert_begin = 64;
  s.expert_end = 64;  // empty range
  try {
    moe_prefill(p, w, 64, s, ws, o, nullptr);
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("moe_prefill: expert range [64, 64)"), std::string::npos)
        << e.what();
  }
}

TEST(Moe, RejectsInvalidShapes) {
  const bf16* p = reinterpret_cast<const bf16*>(0x100);
  bf16* o = reinterpret_cast<bf16*>(0x100);
  void* ws = reinterpret_cast<void*>(0x100);
  MoeWeights w{p, p, p, nullptr, nullptr};
  MoeShape s;
  EXPECT_THROW(moe_forward(p, w, 17, s, ws, o, nullptr), std::invalid_argument);
  s.top_k = 17;
  EXPECT_THROW(moe_forward(p, w, 1, s, ws, o, nullptr), std::invalid_argument);
  s.top_k = 8;
  s.expert_inter = 100;
  EXPECT_THROW(moe_forward(p, w, 1, s, ws, o, nullptr), std::invalid_argument);
  s.expert_inter = 768;
  s.shared_inter = 128;  // no shared weights given
  EXPECT_THROW(moe_forward(p, w, 1, s, ws, o, nullptr), std::invalid_argument);
  s.shared_inter = 0;
  s.expert_begin = 64;
  s.expert_end = 64;  // empty range
  EXPECT_THROW(moe_forward(p, w, 1, s, ws, o, nullptr), std::invalid_argument);
  s.expert_end = 129;  // beyond num_experts
  EXPECT_THROW(moe_forward(p, w, 1, s, ws, o, nullptr), std::invalid_argument);
  s.expert_begin = -1;
  s.expert_end = 0;
  EXPECT_THROW(moe_forward(p, w, 1, s, ws, o, nullptr), std::invalid_argument);
  s.expert_begin = 0;
  s.num_experts = 300;
  try {
    moe_forward(p, w, 1, s, ws, o, nullptr);
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("num_experts = 300"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace twinstep::kernels
