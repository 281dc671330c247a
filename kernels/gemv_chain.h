// A decode layer's GEMVs as one persistent launch: stages (e.g. o + residual, gate+up SwiGLU
// normed, down + residual, the next layer's qkv normed) separated by grid-wide barriers instead
// of kernel boundaries. One block per SM streams each stage's weights through a cp.async ring
// that runs ahead across the barriers, so an SM that finished its share of a stage is already
// fetching its share of the next while the slowest SM finishes (docs/kernels.md, round 27).
//
// Arithmetic per stage (x = the stage's input rows [m][k], acc = sum_k x[m][k] w[j][k] in fp32):
//   kResidual:     out[m][j] = bf16(out[m][j] + bf16(acc))            (out is the residual stream)
//   kNormed:       out[m][j] = bf16(inv_rms[m] * acc)                  (w has gamma folded in)
//   kSwigluNormed: out[m][j] = bf16(silu(g) * u), g / u = inv_rms[m] * acc of rows j / n + j
//                  (w [2n][k]: the n gate rows, then the n up rows, gamma folded in)
// inv_rms[m] = rsqrt(sum_k x[m][k]^2 / k + eps), summed in a fixed order by every block.
// Reduction order: warp w of 8 owns k piece [w k / 8, (w + 1) k / 8) of a 16-row tile and sums it
// on the tensor cores (mma m16n8k16, the activation rows as A padded to 16 with zeros): four
// accumulators, one per 16-element k step of each 64-element batch, each in k order, added in
// step order at the tile's end; then the 8 warps' sums are added in order: a row's result depends
// on k only, never on m or the grid. Not bit-identical with gemv / gemv_norm.h (other orders and
// inv_rms from the rows, not from the producers' tile sums): equal to bf16 accuracy.
//
// Contracts: 1 <= m <= kGemvChainMaxRows; n % 16 == 0 (kSwigluNormed: n % 8 == 0), k % 512 == 0,
// k <= kGemvChainMaxK; out must not alias w or any stage's x except as the residual a later stage
// reads (stages see each other's outputs only across the barrier). The grid is one block per SM,
// all resident at once: the launch needs the whole GPU (no kernel that waits on this one may hold
// an SM's shared memory), and one workspace per stream (its barrier counter; zeroed once by
// gemv_chain_workspace_init, never again: every launch leaves it a multiple of the grid size).
// pdl: the stage-0 weight prologue runs before the dependency wait (only weights are read there).
#pragma once

#include <cstddef>

#include "kernels/common.h"

namespace twinstep::kernels {

constexpr int kGemvChainMaxRows = 4;
constexpr int kGemvChainMaxStages = 8;
constexpr int kGemvChainMaxK = 14336;

enum class GemvChainEpilogue : int { kResidual = 0, kNormed = 1, kSwigluNormed = 2 };

struct GemvChainStage {
  const bf16* w = nullptr;  // [n][k], kSwigluNormed [2n][k]
  const bf16* x = nullptr;  // [m][k]
  bf16* out = nullptr;      // [m][n]
  int n = 0, k = 0;
  GemvChainEpilogue epilogue = GemvChainEpilogue::kNormed;
};

// Benchmark only: words per (stage, block) of GemvChain::trace.
constexpr int kGemvChainTraceWords = 4;

struct GemvChain {
  GemvChainStage stage[kGemvChainMaxStages];
  int num_stages = 0;
  int m = 1;
  float eps = 1e-5f;
  // Benchmark only (null: none): [num_stages][SM count][kGemvChainTraceWords] per block and
  // stage, written by each launch: global-timer ns of 0 its arrival at the stage's barrier (stage
  // 0: its prologue issued, before the dependency wait), 1 past the barrier (stage 0: past the
  // wait), 2 its input rows staged; word 3 of stage 0: the block's SM.
  unsigned long long* trace = nullptr;
  // Benchmark only: the stage sums by fp32 FMAs on each thread's own copies instead of the
  // tensor cores (other bits, the same contracts).
  bool fma_consumer = false;
};

size_t gemv_chain_workspace_bytes();
void gemv_chain_workspace_init(void* workspace, cudaStream_t stream);

// ring_stages: 0 = the largest ring that fits beside the stages' input rows (at most 12 slots of
// 16 KB), else 6, 8 or 12 (benchmark sweeps; rejected when it does not fit).
// Whether a ring of `ring_stages` slots fits in this device's shared memory beside m rows of k_max.
bool gemv_chain_ring_fits(int m, int ring_stages, int k_max);

void gemv_chain(const GemvChain& chain, void* workspace, cudaStream_t stream, bool pdl = false,
                int ring_stages = 0);

}  // namespace twinstep::kernels
