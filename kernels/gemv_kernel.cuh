// The skinny-GEMM kernel behind gemv.h and lm_head.h (nvcc only).
//
// Tile = 16 weight rows (one m16 tensor-core tile), worked on by the 8 warps of a block.
// The 8 warps split K into 8 contiguous ranges of 32-element chunks and reduce through shared
// memory in warp order; the split depends on k alone, never on m, so row results do not depend
// on m. Each lane loads 16 contiguous bytes of weight row (lane/4) and (lane/4 + 8) per chunk and
// the same 16 bytes of activation row (lane/4): the reduction over k is order-free inside an
// mma, so A and B fragments may use one shared permutation of k, which turns every fragment into
// a single 16-byte load (no shared-memory staging, no shuffles).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/device.cuh"
#include "kernels/philox.h"

namespace twinstep::kernels::detail {

constexpr int kGemvWarps = 8;
constexpr int kGemvThreads = kGemvWarps * 32;
constexpr int kGemvRowsPerBlock = 16;

enum class GemvEpilogue { kStore, kSwiglu, kLogits };

struct LogitPartial {
  float max_logit;
  int argmax;
  float sum_exp;  // sum over the block of exp(logit - max_logit)
  float sample_score;
  int sample_index;
};

struct GemvParams {
  const bf16* w;
  const bf16* x;
  int m, n, k;  // n = output columns (= gate rows for SwiGLU)
  bf16* out;
  float* logits;           // kLogits, optional
  LogitPartial* partials;  // kLogits: [m][gridDim.x]
  float inv_temperature;   // kLogits: 0 = no sampling
  uint64_t seed;
  const uint64_t* step;
};

// Persistent grid: block b handles row tiles b, b + gridDim.x, ... Each warp streams its K range
// of every tile through a two-deep register pipeline (the next batch of weight loads is in
// flight while the current batch feeds the tensor cores, across tile boundaries too).
// A tile is 16 weight rows; for SwiGLU it is 8 gate rows (fragment rows 0-7) and the matching 8
// up rows (fragment rows 8-15), so gate and up of one output meet in one thread.
template <int kNTiles, GemvEpilogue kEpilogue>
__global__ void __launch_bounds__(kGemvThreads, 2) gemv_kernel(const GemvParams p) {
  constexpr int kBatch = 4;  // 32-element chunks per pipeline stage
  constexpr bool kSwiglu = kEpilogue == GemvEpilogue::kSwiglu;
  constexpr int kOutCols = kSwiglu ? 8 : 16;  // output columns per tile
  __shared__ float partial[kGemvWarps][kNTiles][4][32];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tq = lane % 4;
  const int tiles = p.n / kOutCols;
  const int chunks = p.k / 32;
  const int chunk_begin = warp * chunks / kGemvWarps;
  const int chunk_end = (warp + 1) * chunks / kGemvWarps;

  // Fragment row h (0: rows 0-7, 1: rows 8-15) of a tile -> weight row.
  auto weight_row = [&](int tile, int h) -> const bf16* {
    const int row = kSwiglu ? h * p.n + tile * 8 + gid : tile * 16 + h * 8 + gid;
    return p.w + static_cast<size_t>(row) * p.k + tq * 8;
  };
  const bf16* x_row[kNTiles];
  bool x_valid[kNTiles];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    const int m = nt * 8 + gid;
    x_valid[nt] = m < p.m;
    x_row[nt] = p.x + static_cast<size_t>(x_valid[nt] ? m : 0) * p.k + tq * 8;
  }

  uint4 cur[kBatch][2], nxt[kBatch][2];
  auto load_weights = [&](uint4(&buf)[kBatch][2], int tile, int chunk, int count) {
    const bf16* r0 = weight_row(tile, 0) + chunk * 32;
    const bf16* r1 = weight_row(tile, 1) + chunk * 32;
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (u < count) {
        buf[u][0] = load_stream_16(r0 + u * 32);
        buf[u][1] = load_stream_16(r1 + u * 32);
      }
  };

  int tile = blockIdx.x;
  int chunk = chunk_begin;
  int count = tile < tiles ? min(kBatch, chunk_end - chunk) : 0;
  if (count > 0)
    load_weights(cur, tile, chunk, count);  // weights never depend on the previous kernel
  pdl_wait_and_trigger();

  for (; tile < tiles; tile += gridDim.x) {
    float acc[kNTiles][4];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    bool tile_done = false;
    while (!tile_done) {
      uint4 xv[kBatch][kNTiles];
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (u < count)
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
            xv[u][nt] =
                x_valid[nt] ? load_16(x_row[nt] + (chunk + u) * 32) : make_uint4(0, 0, 0, 0);
      // Next stage: the rest of this tile's K range, else the start of the next tile.
      int next_tile = tile, next_chunk = chunk + count;
      tile_done = next_chunk >= chunk_end;
      if (tile_done) {
        next_tile = tile + gridDim.x;
        next_chunk = chunk_begin;
      }
      const int next_count = next_tile < tiles ? min(kBatch, chunk_end - next_chunk) : 0;
      if (next_count > 0) load_weights(nxt, next_tile, next_chunk, next_count);
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (u < count)
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            const uint4 lo = cur[u][0], hi = cur[u][1], b = xv[u][nt];
            mma_16816(acc[nt], lo.x, hi.x, lo.y, hi.y, b.x, b.y);
            mma_16816(acc[nt], lo.z, hi.z, lo.w, hi.w, b.z, b.w);
          }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        cur[u][0] = nxt[u][0];
        cur[u][1] = nxt[u][1];
      }
      chunk = next_chunk;
      count = next_count;
    }

#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) partial[warp][nt][r][lane] = acc[nt][r];
    __syncthreads();
    // Fragment element (row r, activation m) sits in lane (r % 8) * 4 + (m % 8) / 2, register
    // (r / 8) * 2 + m % 2 of activation tile m / 8. Warps are summed in order.
    auto reduced = [&](int r, int m) {
      const int src_lane = (r % 8) * 4 + (m % 8) / 2, src_reg = (r / 8) * 2 + (m % 2);
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kGemvWarps; ++w) sum += partial[w][(m / 8) % kNTiles][src_reg][src_lane];
      return sum;
    };
    // One thread per (activation row m, output column i); a half-warp (or 8 lanes) shares m.
    const int m = threadIdx.x / kOutCols, i = threadIdx.x % kOutCols;
    const int col = tile * kOutCols + i;
    if (m < p.m) {
      if constexpr (kEpilogue == GemvEpilogue::kStore) {
        p.out[static_cast<size_t>(m) * p.n + col] = __float2bfloat16(reduced(i, m));
      } else if constexpr (kSwiglu) {
        const float g = reduced(i, m), u = reduced(i + 8, m);
        p.out[static_cast<size_t>(m) * p.n + col] = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
      } else {
        const float logit = reduced(i, m);
        if (p.logits != nullptr) p.logits[static_cast<size_t>(m) * p.n + col] = logit;
        const unsigned mask = 0xFFFFu << (threadIdx.x & 16);
        float best = logit;
        int best_index = col;
        float score = -INFINITY;
        int score_index = col;
        if (p.inv_temperature > 0.0f) {
          const uint64_t step = p.step != nullptr ? *p.step : 0;
          score = logit * p.inv_temperature + gumbel_noise(p.seed, step, m, col);
        }
#pragma unroll
        for (int offset = 8; offset > 0; offset /= 2) {
          const float other = __shfl_xor_sync(mask, best, offset, 16);
          const int other_index = __shfl_xor_sync(mask, best_index, offset, 16);
          if (other > best || (other == best && other_index < best_index)) {
            best = other;
            best_index = other_index;
          }
          const float other_score = __shfl_xor_sync(mask, score, offset, 16);
          const int other_score_index = __shfl_xor_sync(mask, score_index, offset, 16);
          if (other_score > score || (other_score == score && other_score_index < score_index)) {
            score = other_score;
            score_index = other_score_index;
          }
        }
        float e = __expf(logit - best);
#pragma unroll
        for (int offset = 8; offset > 0; offset /= 2) e += __shfl_xor_sync(mask, e, offset, 16);
        if (i == 0) {
          p.partials[static_cast<size_t>(m) * tiles + tile] =
              LogitPartial{best, best_index, e, score, score_index};
        }
      }
    }
    __syncthreads();  // partial[] is rewritten by the next tile
  }
}

template <int kNTiles, GemvEpilogue kEpilogue>
int gemv_resident_blocks() {
  static const int blocks = [] {
    int per_sm = 0, device = 0, sms = 0;
    TS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, gemv_kernel<kNTiles, kEpilogue>, kGemvThreads, 0));
    TS_CUDA_CHECK(cudaGetDevice(&device));
    TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return per_sm * sms;
  }();
  return blocks;
}

// Launches gemv_kernel with the activation-tile count that m needs, one resident wave at most.
template <GemvEpilogue kEpilogue>
void launch_gemv(const GemvParams& p, cudaStream_t stream, bool pdl) {
  const int tiles = p.n / (kEpilogue == GemvEpilogue::kSwiglu ? 8 : 16);
  if (p.m <= 8)
    launch(gemv_kernel<1, kEpilogue>, dim3(std::min(tiles, gemv_resident_blocks<1, kEpilogue>())),
           dim3(kGemvThreads), 0, stream, pdl, p);
  else
    launch(gemv_kernel<2, kEpilogue>, dim3(std::min(tiles, gemv_resident_blocks<2, kEpilogue>())),
           dim3(kGemvThreads), 0, stream, pdl, p);
}

}  // namespace twinstep::kernels::detail
