// The split-K rule of the runtime's dense GEMV (gemv_split_kernel, kernels/gemv_kernel.cuh), as
// pure host code: the launchers call it with the device's SM count, the simulator's step kernels
// and cost model with HardwareSpec::sm_count (so the price of a GEMV can follow its split).
// No CUDA: usable from policies/ and simulator/.
#pragma once

namespace twinstep::kernels {

// stages < 0 (auto) resolved for `tiles` output tiles of an S = 1 launch (like the split, fixed
// by the shape and never by m): the cp.async ring of 6 (one 8-warp block per SM) when the tiles fit
// one block per SM (tiles <= sms), or when two blocks per SM would leave the last round of tiles
// under 90% full and one block per SM would not; else the ring of 3 (two blocks per SM). A split
// launch (S > 1, few tiles) takes the ring of
// 3. Measured (results/h200/gemv_split_d6e1903.json, S = 1): Llama-3-8B qkv (384 tiles) 13.37 us
// with 6 vs 13.51 with 3; 1536 x 4096 (96 tiles) 4.96 vs 5.34; Qwen3 qkv (320) 7.50 vs 6.36.
inline int gemv_auto_stages(int tiles, int sms) {
  auto efficiency = [&](int blocks) {
    const int rounds = (tiles + blocks - 1) / blocks;
    return static_cast<double>(tiles) / (static_cast<double>(rounds) * blocks);
  };
  return tiles <= sms || (efficiency(2 * sms) < 0.9 && efficiency(sms) >= 0.9) ? 6 : 3;
}

// Split count: 1, unless the tiles would leave more than a quarter of the SMs idle even at one
// block per SM (4 · tiles <= 3 · sms) and each warp keeps >= 4 chunks of K at S = 2: then S = 2.
// Fixed by n, k and the tuning, never by m. The earlier rule (the smallest S in {1, 2, 4} whose
// full rounds of clusters waste < 3 % fewer tile slots than the best) split every shape whose
// tiles fill the slots of two blocks per SM poorly, and the clusters cost more than the idle
// slots: side by side on the H200 (d6e1903, graph + PDL, cold, m = 1 / 6 / 16), Llama-3.2-3B
// down_proj 3072 x 8192 at S = 4 15.93 / 19.21 / 30.06 us, at S = 1 13.83 / 14.47 / 16.25; the
// Llama-3-8B TP2 qkv 3072 x 4096 10.57 / 13.47 / 23.92 against 7.37 / 7.71 / 9.66; TP4 gate_up
// 7168 x 4096 20.97 / 25.58 / 48.51 against 14.37 / 15.47 / 19.04; Qwen3-30B-A3B qkv 5120 x 2048
// (S = 2) 7.68 / 8.91 / 14.03 against 6.36 / 6.71 / 10.03. Only 96 tiles (1536 x 4096) ran
// faster split at m = 1: 4.67 (S = 2) against 4.96 (S = 1, one block per SM).
inline int gemv_choose_split(int tiles, int k, int sms, int forced = 0) {
  if (forced > 0) return forced;
  return 4 * tiles <= 3 * sms && k / 32 / (8 * 2) >= 4 ? 2 : 1;
}

// The split the default tuning (fill 3, split 0, stages -1) picks for a GEMV whose weight has
// `weight_rows` output rows (SwiGLU: gate and up, 2 × intermediate; its 8-column tiles of the
// intermediate are 16 weight rows each, like the plain GEMV's 16-column tiles) and `k` columns.
// 0 where the shape is not one the GEMV takes (non-positive, or not a multiple of 16).
inline int gemv_default_split(long long weight_rows, long long k, int sms) {
  if (weight_rows <= 0 || k <= 0 || sms <= 0 || weight_rows % 16 != 0) return 0;
  const int tiles = static_cast<int>(weight_rows / 16);
  return gemv_choose_split(tiles, static_cast<int>(k), sms);
}

}  // namespace twinstep::kernels
