#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/moe.h"
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

struct MoeCase {
  int m, num_experts, top_k, hidden, inter, shared_inter;
  bool renormalize;
};

class MoeCases : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeCases, MatchesCpuReference) {
  TS_SKIP_WITHOUT_GPU();
  const MoeCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  MoeShape shape;
  shape.num_experts = c.num_experts;
  shape.top_k = c.top_k;
  shape.hidden = c.hidden;
  shape.expert_inter = c.inter;
  shape.shared_inter = c.shared_inter;
  shape.renormalize = c.renormalize;
  const float ws = 1.0f / std::sqrt(static_cast<float>(c.hidden));
  const Bf16Host x = test::random_bf16(static_cast<size_t>(c.m) * c.hidden, rng);
  const Bf16Host router = test::random_bf16(static_cast<size_t>(c.num_experts) * c.hidden, rng, ws);
  const Bf16Host gate_up =
      test::random_bf16(static_cast<size_t>(c.num_experts) * 2 * c.inter * c.hidden, rng, ws);
  const Bf16Host down =
      test::random_bf16(static_cast<size_t>(c.num_experts) * c.hidden * c.inter, rng, ws);
  const Bf16Host sgu =
      test::random_bf16(static_cast<size_t>(2 * c.shared_inter + 1) * c.hidden, rng, ws);
  const Bf16Host sdown =
      test::random_bf16(static_cast<size_t>(c.hidden) * c.shared_inter + 1, rng, ws);
  auto dx = test::to_device(x);
  auto drouter = test::to_device(router);
  auto dgu = test::to_device(gate_up);
  auto ddown = test::to_device(down);
  auto dsgu = test::to_device(sgu);
  auto dsdown = test::to_device(sdown);
  MoeWeights weights{drouter.get(), dgu.get(), ddown.get(),
                     c.shared_inter > 0 ? dsgu.get() : nullptr,
                     c.shared_inter > 0 ? dsdown.get() : nullptr};
  DeviceBuffer<unsigned char> workspace(moe_workspace_bytes(c.m, shape));
  workspace.poison();
  DeviceBuffer<bf16> out(static_cast<size_t>(c.m) * c.hidden);
  DeviceBuffer<int> ids(static_cast<size_t>(c.m) * c.top_k);
  DeviceBuffer<float> wts(static_cast<size_t>(c.m) * c.top_k);
  out.poison();
  ids.poison();
  wts.poison();
  moe_forward(dx.get(), weights, c.m, shape, workspace.get(), out.get(), nullptr, false,
              MoeRouting{ids.get(), wts.get()});
  const auto got = test::bf16_to_float(out.download<uint16_t>());
  const auto got_ids = ids.download();
  const auto got_w = wts.download();

  std::vector<double> ref(static_cast<size_t>(c.m) * c.hidden, 0.0);
  for (int t = 0; t < c.m; ++t) {
    const float* xt = &x.values[static_cast<size_t>(t) * c.hidden];
    std::vector<double> logit(c.num_experts);
    for (int e = 0; e < c.num_experts; ++e)
      logit[e] = dot(&router.values[static_cast<size_t>(e) * c.hidden], xt, c.hidden);
    std::vector<int> order(c.num_experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logit[a] > logit[b]; });
    // The GPU ranks fp32 logits: accept its pick where the reference logits nearly tie.
    for (int j = 0; j < c.top_k; ++j) {
      const int gpu = got_ids[t * c.top_k + j];
      ASSERT_GE(gpu, 0);
      ASSERT_LT(gpu, c.num_experts);
      EXPECT_NEAR(logit[gpu], logit[order[j]], 1e-4) << "token " << t << " rank " << j;
    }
    double denom = 0;
    const double mx = logit[order[0]];
    if (c.renormalize)
      for (int j = 0; j < c.top_k; ++j) denom += std::exp(logit[got_ids[t * c.top_k + j]] - mx);
    else
      for (int e = 0; e < c.num_experts; ++e) denom += std::exp(logit[e] - mx);
    for (int j = 0; j < c.top_k; ++j) {
      const int e = got_ids[t * c.top_k + j];
      const double w = std::exp(logit[e] - mx) / denom;
      EXPECT_NEAR(got_w[t * c.top_k + j], w, 1e-3 * w + 1e-6) << "token " << t << " rank " << j;
      const auto y =
          ffn(xt, &gate_up.values[static_cast<size_t>(e) * 2 * c.inter * c.hidden],
              &down.values[static_cast<size_t>(e) * c.hidden * c.inter], c.hidden, c.inter);
      for (int h = 0; h < c.hidden; ++h) ref[static_cast<size_t>(t) * c.hidden + h] += w * y[h];
    }
    if (c.shared_inter > 0) {
      const auto y = ffn(xt, sgu.values.data(), sdown.values.data(), c.hidden, c.shared_inter);
      for (int h = 0; h < c.hidden; ++h) ref[static_cast<size_t>(t) * c.hidden + h] += y[h];
    }
  }
  EXPECT_LT(test::rel_error(got, ref), test::kBf16RelTol);
}

INSTANTIATE_TEST_SUITE_P(Cases, MoeCases,
                         ::testing::Values(MoeCase{1, 32, 4, 256, 128, 0, true},
                                           MoeCase{5, 64, 8, 512, 192, 0, true},
                                           MoeCase{3, 16, 2, 256, 64, 320, false},
                                           MoeCase{16, 128, 8, 256, 128, 128, true}));

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
