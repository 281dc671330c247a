#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/gemv.h"
#include "kernels/tuning.h"
#include "tests/kernels/test_util.h"

namespace twinstep::kernels {
namespace {

using test::Bf16Host;
using test::DeviceBuffer;

std::vector<double> reference_gemv(const Bf16Host& w, const Bf16Host& x, int m, int n, int k) {
  std::vector<double> out(static_cast<size_t>(m) * n);
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < n; ++c) {
      double acc = 0;
      for (int i = 0; i < k; ++i)
        acc += static_cast<double>(w.values[static_cast<size_t>(c) * k + i]) *
               x.values[static_cast<size_t>(r) * k + i];
      out[static_cast<size_t>(r) * n + c] = acc;
    }
  return out;
}

class GemvShapes : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(GemvShapes, MatchesCpuReference) {
  TS_SKIP_WITHOUT_GPU();
  const auto [m, n, k] = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Bf16Host w = test::random_bf16(static_cast<size_t>(n) * k, rng);
  const Bf16Host x = test::random_bf16(static_cast<size_t>(m) * k, rng);
  auto dw = test::to_device(w);
  auto dx = test::to_device(x);
  DeviceBuffer<bf16> out(static_cast<size_t>(m) * n);
  const auto ref = reference_gemv(w, x, m, n, k);
  // Every stage-fill mode of the kernel (bulk copies, cp.async, the register-pipelined baseline).
  const detail::GemvTuning saved = detail::gemv_tuning();
  // fill 3: split-K clusters (split 1, 2, 4) x weights in registers / cp.async rings (2, 3, 6);
  // the last value is the m > 8 path's (large_m_stages: registers or the 2-slot ring).
  const std::vector<std::array<int, 4>> variants = {
      {0, 0, 0, 0}, {1, 0, 0, 0}, {2, 0, 0, 0}, {3, 1, 0, 0}, {3, 2, 0, 0},
      {3, 4, 0, 0}, {3, 1, 3, 0}, {3, 2, 3, 0}, {3, 4, 6, 0}, {3, 0, 6, 0},
      {3, 0, 0, 0}, {3, 1, 2, 2}, {3, 2, 2, 2}, {3, 4, 3, 2}, {3, 0, -1, 2}};
  for (const auto& [fill, split, stages, large_m_stages] : variants) {
    detail::gemv_tuning().fill = fill;
    detail::gemv_tuning().split = split;
    detail::gemv_tuning().stages = stages;
    detail::gemv_tuning().large_m_stages = large_m_stages;
    out.poison();
    gemv(dw.get(), dx.get(), out.get(), m, n, k, nullptr);
    const auto got = test::bf16_to_float(out.download<uint16_t>());
    EXPECT_LT(test::rel_error(got, ref), test::kBf16RelTol)
        << "fill=" << fill << " split=" << split << " stages=" << stages
        << " large_m_stages=" << large_m_stages << " m=" << m << " n=" << n << " k=" << k;
  }
  detail::gemv_tuning() = saved;
}

TEST_P(GemvShapes, SwigluMatchesCpuReference) {
  TS_SKIP_WITHOUT_GPU();
  const auto [m, n, k] = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Bf16Host w = test::random_bf16(static_cast<size_t>(2 * n) * k, rng);
  const Bf16Host x = test::random_bf16(static_cast<size_t>(m) * k, rng);
  auto dw = test::to_device(w);
  auto dx = test::to_device(x);
  DeviceBuffer<bf16> out(static_cast<size_t>(m) * n);
  out.poison();
  gemv_swiglu(dw.get(), dx.get(), out.get(), m, n, k, nullptr);
  const auto gu = reference_gemv(w, x, m, 2 * n, k);
  std::vector<double> ref(static_cast<size_t>(m) * n);
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < n; ++c) {
      const double g = gu[static_cast<size_t>(r) * 2 * n + c],
                   u = gu[static_cast<size_t>(r) * 2 * n + n + c];
      ref[static_cast<size_t>(r) * n + c] = g / (1.0 + std::exp(-g)) * u;
    }
  const double err = test::rel_error(test::bf16_to_float(out.download<uint16_t>()), ref);
  EXPECT_LT(err, test::kBf16RelTol) << "m=" << m << " n=" << n << " k=" << k;
}

// k = 1344 gives 42 chunks of 32: an uneven split over the 8 warps.
INSTANTIATE_TEST_SUITE_P(Shapes, GemvShapes,
                         ::testing::Values(std::make_tuple(1, 64, 64), std::make_tuple(3, 128, 64),
                                           std::make_tuple(6, 256, 1344),
                                           std::make_tuple(8, 192, 512),
                                           std::make_tuple(9, 512, 4096),
                                           std::make_tuple(16, 1024, 4096)));

// Row i must be bit-identical whether it is computed alone (m = 1), among 6 or among 16 rows.
TEST(Gemv, RowResultsDoNotDependOnM) {
  TS_SKIP_WITHOUT_GPU();
  const int n = 512, k = 4096;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Bf16Host w = test::random_bf16(static_cast<size_t>(2 * n) * k, rng);
  const Bf16Host x = test::random_bf16(static_cast<size_t>(16) * k, rng);
  auto dw = test::to_device(w);
  auto dx = test::to_device(x);
  const detail::GemvTuning saved = detail::gemv_tuning();
  // The default, then fill 3 (split-K clusters, register or cp.async rings) forced; the last
  // value is the m > 8 path's large_m_stages (registers or the 2-slot ring).
  const std::vector<std::array<int, 4>> variants = {
      {saved.fill, saved.split, saved.stages, saved.large_m_stages},
      {3, 2, 0, 0},
      {3, 4, 3, 0},
      {3, 2, 6, 0},
      {3, 0, -1, 2},
      {3, 2, 2, 2},
      {3, 1, 6, 2}};
  for (const auto& [fill, split, stages, large_m_stages] : variants)
    for (const bool fused : {false, true}) {
      detail::gemv_tuning().fill = fill;
      detail::gemv_tuning().split = split;
      detail::gemv_tuning().stages = stages;
      detail::gemv_tuning().large_m_stages = large_m_stages;
      SCOPED_TRACE("fill " + std::to_string(fill) + " split " + std::to_string(split) + " stages " +
                   std::to_string(stages) + " large_m_stages " + std::to_string(large_m_stages));
      DeviceBuffer<bf16> all(static_cast<size_t>(16) * n), six(static_cast<size_t>(6) * n), one(n);
      auto run = [&](const bf16* xin, bf16* out, int m) {
        if (fused)
          gemv_swiglu(dw.get(), xin, out, m, n, k, nullptr);
        else
          gemv(dw.get(), xin, out, m, n, k, nullptr);
      };
      run(dx.get(), all.get(), 16);
      run(dx.get(), six.get(), 6);
      const auto all_bits = all.download<uint16_t>();
      const auto six_bits = six.download<uint16_t>();
      for (int r = 0; r < 6; ++r)
        for (int c = 0; c < n; ++c)
          ASSERT_EQ(six_bits[r * n + c], all_bits[r * n + c])
              << "m=6 row " << r << " fused " << fused;
      for (int r = 0; r < 16; ++r) {
        run(dx.get() + static_cast<size_t>(r) * k, one.get(), 1);
        const auto one_bits = one.download<uint16_t>();
        for (int c = 0; c < n; ++c)
          ASSERT_EQ(one_bits[c], all_bits[r * n + c])
              << "m=1 row " << r << " col " << c << " fused " << fused;
      }
    }
  detail::gemv_tuning() = saved;
}

// Split-K clusters over several rounds of tiles (the persistent grid walks 3-6 tiles per
// cluster, so the double-buffered partials are reused; the other GEMV tests fit one round):
// the CPU reference's values, and row 0 the same bits at m = 1, 6 and 16. Forced splits (the
// rule splits only shapes of <= 99 tiles, kernels/gemv_split.h), and the rule's own choice.
TEST(Gemv, SplitKOverSeveralRoundsMatchesCpuReference) {
  TS_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const detail::GemvTuning saved = detail::gemv_tuning();
  struct Case {
    int n, k, split, stages;
  };
  for (const Case c : {Case{3072, 8192, 4, 3}, Case{5120, 3072, 2, 3}, Case{3072, 4096, 4, 6},
                       Case{1536, 4096, 0, -1}}) {
    const Bf16Host w = test::random_bf16(static_cast<size_t>(c.n) * c.k, rng);
    const Bf16Host x = test::random_bf16(static_cast<size_t>(16) * c.k, rng);
    auto dw = test::to_device(w);
    auto dx = test::to_device(x);
    const auto ref = reference_gemv(w, x, 16, c.n, c.k);
    detail::gemv_tuning() = saved;
    detail::gemv_tuning().split = c.split;
    detail::gemv_tuning().stages = c.stages;
    std::vector<uint16_t> row0;
    for (const int m : {1, 6, 16}) {
      SCOPED_TRACE("n " + std::to_string(c.n) + " k " + std::to_string(c.k) + " split " +
                   std::to_string(c.split) + " stages " + std::to_string(c.stages) + " m " +
                   std::to_string(m));
      DeviceBuffer<bf16> out(static_cast<size_t>(m) * c.n);
      out.poison();
      gemv(dw.get(), dx.get(), out.get(), m, c.n, c.k, nullptr);
      const std::vector<uint16_t> bits = out.download<uint16_t>();
      const std::vector<double> ref_m(ref.begin(), ref.begin() + static_cast<size_t>(m) * c.n);
      EXPECT_LT(test::rel_error(test::bf16_to_float(bits), ref_m), test::kBf16RelTol);
      const std::vector<uint16_t> first(bits.begin(), bits.begin() + c.n);
      if (row0.empty()) row0 = first;
      ASSERT_EQ(first, row0);
    }
  }
  detail::gemv_tuning() = saved;
}

TEST(Gemv, RejectsInvalidShapes) {
  // Validation happens before any CUDA call: runs with or without a GPU.
  const bf16* p = reinterpret_cast<const bf16*>(0x100);
  bf16* o = reinterpret_cast<bf16*>(0x100);
  EXPECT_THROW(gemv(p, p, o, 0, 64, 64, nullptr), std::invalid_argument);
  EXPECT_THROW(gemv(p, p, o, 17, 64, 64, nullptr), std::invalid_argument);
  EXPECT_THROW(gemv(p, p, o, 1, 100, 64, nullptr), std::invalid_argument);
  EXPECT_THROW(gemv(p, p, o, 1, 64, 96, nullptr), std::invalid_argument);
  EXPECT_THROW(gemv(nullptr, p, o, 1, 64, 64, nullptr), std::invalid_argument);
  EXPECT_THROW(gemv_swiglu(p, p, o, 1, 64, 32, nullptr), std::invalid_argument);
  try {
    gemv(p, p, o, 1, 64, 100, nullptr);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("k = 100"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace twinstep::kernels
