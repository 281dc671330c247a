// The RMSNorm carried by the GEMVs (kernels/gemv_norm.h): the producer's residual sum bit for bit
// against rmsnorm_residual's arithmetic, its tile sums of squares bit for bit against a host
// butterfly, the consumers against a double-precision CPU reference of add + RMSNorm + GEMV, and
// rows that do not depend on m.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/gemv.h"
#include "kernels/gemv_norm.h"
#include "kernels/tuning.h"
#include "tests/kernels/test_util.h"

namespace twinstep::kernels {
namespace {

using test::Bf16Host;
using test::DeviceBuffer;

constexpr float kEps = 1e-5f;

// The device butterfly over 16 lanes (offsets 8, 4, 2, 1), written out: lane 0's value.
float host_tile_sum_sq(const float* v) {
  float a[16];
  for (int i = 0; i < 16; ++i) a[i] = v[i] * v[i];
  for (int offset = 8; offset > 0; offset /= 2) {
    float b[16];
    for (int i = 0; i < 16; ++i) b[i] = a[i] + a[i ^ offset];
    std::copy(b, b + 16, a);
  }
  return a[0];
}

std::vector<float> host_sq(const std::vector<float>& rows, int m, int width) {
  std::vector<float> sq(static_cast<size_t>(m) * width / 16);
  for (int r = 0; r < m; ++r)
    for (int t = 0; t < width / 16; ++t)
      sq[static_cast<size_t>(r) * (width / 16) + t] =
          host_tile_sum_sq(&rows[static_cast<size_t>(r) * width + t * 16]);
  return sq;
}

// The model's arithmetic in double: y[r][j] = sum_i w[j][i] * gamma[i] * h[r][i] / rms(h[r]).
std::vector<double> reference_normed(const Bf16Host& w, const Bf16Host& gamma, const Bf16Host& h,
                                     int m, int n, int k) {
  std::vector<double> out(static_cast<size_t>(m) * n);
  for (int r = 0; r < m; ++r) {
    const float* row = &h.values[static_cast<size_t>(r) * k];
    double ss = 0;
    for (int i = 0; i < k; ++i) ss += static_cast<double>(row[i]) * row[i];
    const double inv_rms = 1.0 / std::sqrt(ss / k + kEps);
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int i = 0; i < k; ++i)
        acc += static_cast<double>(w.values[static_cast<size_t>(j) * k + i]) * gamma.values[i] *
               row[i];
      out[static_cast<size_t>(r) * n + j] = acc * inv_rms;
    }
  }
  return out;
}

// Tunings of the split kernel: {split, stages, large_m_stages} (the default first).
std::vector<std::array<int, 3>> split_variants() {
  const detail::GemvTuning& t = detail::gemv_tuning();
  return {{t.split, t.stages, t.large_m_stages}, {1, 0, 0}, {2, 3, 2}, {4, 6, 0}, {1, 2, 2}};
}

void set_variant(const std::array<int, 3>& v) {
  detail::gemv_tuning().fill = 3;
  detail::gemv_tuning().split = v[0];
  detail::gemv_tuning().stages = v[1];
  detail::gemv_tuning().large_m_stages = v[2];
}

TEST(GemvNorm, ResidualSumAndTileSquaresAreBitExact) {
  TS_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const detail::GemvTuning saved = detail::gemv_tuning();
  for (const auto& [m, n, k] :
       {std::array{1, 512, 1344}, std::array{6, 4096, 4096}, std::array{16, 1024, 4096}}) {
    const Bf16Host w = test::random_bf16(static_cast<size_t>(n) * k, rng, 0.05f);
    const Bf16Host x = test::random_bf16(static_cast<size_t>(m) * k, rng);
    const Bf16Host residual = test::random_bf16(static_cast<size_t>(m) * n, rng, 2.0f);
    auto dw = test::to_device(w);
    auto dx = test::to_device(x);
    DeviceBuffer<bf16> delta(static_cast<size_t>(m) * n), stream_rows(static_cast<size_t>(m) * n);
    DeviceBuffer<float> sq(static_cast<size_t>(m) * n / 16), sq_again(sq.size());
    for (const auto& v : split_variants()) {
      SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) +
                   " k=" + std::to_string(k) + " split=" + std::to_string(v[0]) +
                   " stages=" + std::to_string(v[1]) + " large_m_stages=" + std::to_string(v[2]));
      set_variant(v);
      delta.poison();
      gemv(dw.get(), dx.get(), delta.get(), m, n, k, nullptr);
      stream_rows.upload(residual.bits);
      sq.poison();
      gemv_residual(dw.get(), dx.get(), stream_rows.get(), sq.get(), m, n, k, nullptr);
      // rmsnorm_residual's sum: residual + the delta rounded to bf16, rounded to bf16.
      const auto d = test::bf16_to_float(delta.download<uint16_t>());
      const auto got = stream_rows.download<uint16_t>();
      std::vector<float> want(got.size());
      size_t mismatches = 0;
      for (size_t e = 0; e < got.size(); ++e) {
        want[e] = test::round_bf16(residual.values[e] + d[e]);
        mismatches += got[e] != test::to_bf16_bits(want[e]);
      }
      EXPECT_EQ(mismatches, 0u);
      EXPECT_EQ(sq.download<float>(), host_sq(want, m, n));
      // rms_sq_partials of the same rows: the same bits.
      sq_again.poison();
      rms_sq_partials(stream_rows.get(), sq_again.get(), m, n, nullptr);
      EXPECT_EQ(sq_again.download<float>(), sq.download<float>());
    }
  }
  detail::gemv_tuning() = saved;
}

TEST(GemvNorm, NormedConsumersMatchCpuReference) {
  TS_SKIP_WITHOUT_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const detail::GemvTuning saved = detail::gemv_tuning();
  for (const auto& [m, n, k] :
       {std::array{1, 192, 1344}, std::array{6, 512, 4096}, std::array{16, 1024, 4096}}) {
    const Bf16Host w = test::random_bf16(static_cast<size_t>(2 * n) * k, rng, 0.05f);
    Bf16Host gamma(k);
    std::uniform_real_distribution<float> g(0.5f, 1.5f);
    for (int i = 0; i < k; ++i) gamma.set(i, g(rng));
    const Bf16Host h = test::random_bf16(static_cast<size_t>(m) * k, rng, 3.0f);
    auto dw = test::to_device(w);
    auto dgamma = test::to_device(gamma);
    auto dh = test::to_device(h);
    DeviceBuffer<bf16> folded(w.size());
    fold_norm_weight(dw.get(), dgamma.get(), folded.get(), 2 * n, k, nullptr);
    const auto folded_bits = folded.download<uint16_t>();
    size_t fold_mismatches = 0;
    for (size_t e = 0; e < folded_bits.size(); ++e)
      fold_mismatches += folded_bits[e] != test::to_bf16_bits(w.values[e] * gamma.values[e % k]);
    EXPECT_EQ(fold_mismatches, 0u) << "fold_norm_weight";
    DeviceBuffer<float> sq(static_cast<size_t>(m) * k / 16);
    rms_sq_partials(dh.get(), sq.get(), m, k, nullptr);

    const auto ref = reference_normed(w, gamma, h, m, 2 * n, k);
    std::vector<double> ref_swiglu(static_cast<size_t>(m) * n);
    for (int r = 0; r < m; ++r)
      for (int c = 0; c < n; ++c) {
        const double gv = ref[static_cast<size_t>(r) * 2 * n + c],
                     uv = ref[static_cast<size_t>(r) * 2 * n + n + c];
        ref_swiglu[static_cast<size_t>(r) * n + c] = gv / (1.0 + std::exp(-gv)) * uv;
      }
    DeviceBuffer<bf16> out(static_cast<size_t>(m) * 2 * n), act(static_cast<size_t>(m) * n);
    for (const auto& v : split_variants()) {
      SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) +
                   " k=" + std::to_string(k) + " split=" + std::to_string(v[0]) +
                   " stages=" + std::to_string(v[1]));
      set_variant(v);
      out.poison();
      gemv_normed(folded.get(), dh.get(), sq.get(), kEps, out.get(), m, 2 * n, k, nullptr);
      EXPECT_LT(test::rel_error(test::bf16_to_float(out.download<uint16_t>()), ref),
                test::kBf16RelTol);
      act.poison();
      gemv_swiglu_normed(folded.get(), dh.get(), sq.get(), kEps, act.get(), m, n, k, nullptr);
      EXPECT_LT(test::rel_error(test::bf16_to_float(act.download<uint16_t>()), ref_swiglu),
                test::kBf16RelTol);
    }
  }
  detail::gemv_tuning() = saved;
}

// A row's outputs, residual sum and tile sums are bit-identical computed alone (m = 1), among 6
// or among 16 rows.
TEST(GemvNorm, RowResultsDoNotDependOnM) {
  TS_SKIP_WITHOUT_GPU();
  const int n = 512, k = 4096;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Bf16Host w = test::random_bf16(static_cast<size_t>(2 * n) * k, rng, 0.05f);
  const Bf16Host x = test::random_bf16(static_cast<size_t>(16) * k, rng);
  const Bf16Host residual = test::random_bf16(static_cast<size_t>(16) * 2 * n, rng, 2.0f);
  auto dw = test::to_device(w);
  auto dx = test::to_device(x);
  DeviceBuffer<float> sq_x(static_cast<size_t>(16) * k / 16);
  rms_sq_partials(dx.get(), sq_x.get(), 16, k, nullptr);
  const detail::GemvTuning saved = detail::gemv_tuning();
  for (const auto& v : split_variants()) {
    set_variant(v);
    std::vector<uint16_t> first_normed, first_swiglu, first_residual;
    std::vector<float> first_sq;
    for (const int m : {1, 6, 16}) {
      SCOPED_TRACE("m=" + std::to_string(m) + " split=" + std::to_string(v[0]) +
                   " stages=" + std::to_string(v[1]));
      DeviceBuffer<bf16> out(static_cast<size_t>(m) * 2 * n), act(static_cast<size_t>(m) * n),
          stream_rows(static_cast<size_t>(m) * 2 * n);
      DeviceBuffer<float> sq(static_cast<size_t>(m) * 2 * n / 16);
      gemv_normed(dw.get(), dx.get(), sq_x.get(), kEps, out.get(), m, 2 * n, k, nullptr);
      gemv_swiglu_normed(dw.get(), dx.get(), sq_x.get(), kEps, act.get(), m, n, k, nullptr);
      stream_rows.upload(
          std::vector<uint16_t>(residual.bits.begin(), residual.bits.begin() + stream_rows.size()));
      gemv_residual(dw.get(), dx.get(), stream_rows.get(), sq.get(), m, 2 * n, k, nullptr);
      // Row 0 of each (the first 2n, n, 2n, 2n / 16 values).
      const auto normed = out.download<uint16_t>();
      const auto swiglu = act.download<uint16_t>();
      const auto res = stream_rows.download<uint16_t>();
      const auto sums = sq.download<float>();
      const std::vector<uint16_t> row_normed(normed.begin(), normed.begin() + 2 * n),
          row_swiglu(swiglu.begin(), swiglu.begin() + n), row_res(res.begin(), res.begin() + 2 * n);
      const std::vector<float> row_sq(sums.begin(), sums.begin() + 2 * n / 16);
      if (m == 1) {
        first_normed = row_normed;
        first_swiglu = row_swiglu;
        first_residual = row_res;
        first_sq = row_sq;
      } else {
        EXPECT_EQ(row_normed, first_normed);
        EXPECT_EQ(row_swiglu, first_swiglu);
        EXPECT_EQ(row_res, first_residual);
        EXPECT_EQ(row_sq, first_sq);
      }
    }
  }
  detail::gemv_tuning() = saved;
}

TEST(GemvNorm, RejectsInvalidArguments) {
  // Validation happens before any CUDA call: runs with or without a GPU.
  const bf16* p = reinterpret_cast<const bf16*>(0x100);
  bf16* o = reinterpret_cast<bf16*>(0x100);
  float* sq = reinterpret_cast<float*>(0x100);
  EXPECT_THROW(gemv_residual(p, p, o, nullptr, 1, 64, 64, nullptr), std::invalid_argument);
  EXPECT_THROW(gemv_residual(p, p, o, sq, 17, 64, 64, nullptr), std::invalid_argument);
  EXPECT_THROW(gemv_normed(p, p, sq, 0.0f, o, 1, 64, 64, nullptr), std::invalid_argument);
  EXPECT_THROW(gemv_normed(p, p, nullptr, kEps, o, 1, 64, 64, nullptr), std::invalid_argument);
  EXPECT_THROW(gemv_swiglu_normed(p, p, sq, kEps, o, 1, 64, 96, nullptr), std::invalid_argument);
  EXPECT_THROW(rms_sq_partials(p, sq, 1, 48, nullptr), std::invalid_argument);
  EXPECT_THROW(fold_norm_weight(p, nullptr, o, 1, 64, nullptr), std::invalid_argument);
  EXPECT_THROW(fold_norm_weight(p, p, o, 1, 12, nullptr), std::invalid_argument);
  try {
    gemv_normed(p, p, sq, -1.0f, o, 1, 64, 64, nullptr);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "twinstep::kernels::gemv_normed: eps must be > 0");
  }
}

}  // namespace
}  // namespace twinstep::kernels
