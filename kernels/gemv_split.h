// The split-K rule of the runtime's dense GEMV (gemv_split_kernel, kernels/gemv_kernel.cuh), as
// pure host code: the launchers call it with the device's SM count, the simulator's step kernels
// and cost model with HardwareSpec::sm_count (so the price of a GEMV can follow its split).
// No CUDA: usable from policies/ and simulator/.
#pragma once

namespace twinstep::kernels {

// Blocks of gemv_split_kernel resident per SM for a ring of `stages` (the same for every m, so
// the split choice, and with it the bits of every row, never depends on m).
inline int gemv_split_blocks_per_sm(int stages) { return stages >= 6 ? 1 : 2; }

// stages < 0 (auto) resolved for `tiles` output tiles: the cp.async ring of 6 (one 8-warp block
// per SM, S = 1) when two blocks per SM would leave the last round of tiles under 90% full and
// one block per SM would not, else the ring of 3 (two blocks per SM).
inline int gemv_auto_stages(int tiles, int sms) {
  auto efficiency = [&](int blocks) {
    const int rounds = (tiles + blocks - 1) / blocks;
    return static_cast<double>(tiles) / (static_cast<double>(rounds) * blocks);
  };
  return efficiency(2 * sms) < 0.9 && efficiency(sms) >= 0.9 ? 6 : 3;
}

// Split count: the smallest S in {1, 2, 4} whose full rounds of clusters waste < 3% more tile
// slots than the best (each warp keeps >= 4 chunks of K); fixed by n, k, stages and the tuning.
inline int gemv_choose_split(int tiles, int k, int stages, int sms, int forced = 0) {
  if (forced > 0) return forced;
  const int blocks = gemv_split_blocks_per_sm(stages) * sms;
  auto efficiency = [&](int s) {
    const int clusters = blocks / s;
    const int rounds = (tiles + clusters - 1) / clusters;
    return static_cast<double>(tiles) / (static_cast<double>(rounds) * clusters);
  };
  int best = 1;
  for (const int s : {2, 4})
    if (k / 32 / (8 * s) >= 4 && efficiency(s) > efficiency(best) + 0.03) best = s;
  return best;
}

// The split the default tuning (fill 3, split 0, stages -1) picks for a GEMV whose weight has
// `weight_rows` output rows (SwiGLU: gate and up, 2 × intermediate; its 8-column tiles of the
// intermediate are 16 weight rows each, like the plain GEMV's 16-column tiles) and `k` columns.
// 0 where the shape is not one the GEMV takes (non-positive, or not a multiple of 16).
inline int gemv_default_split(long long weight_rows, long long k, int sms) {
  if (weight_rows <= 0 || k <= 0 || sms <= 0 || weight_rows % 16 != 0) return 0;
  const int tiles = static_cast<int>(weight_rows / 16);
  return gemv_choose_split(tiles, static_cast<int>(k), gemv_auto_stages(tiles, sms), sms);
}

}  // namespace twinstep::kernels
