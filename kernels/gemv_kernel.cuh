// The skinny-GEMM kernel behind gemv.h, lm_head.h and moe.h (nvcc only).
//
// Roles: one producer warp streams weight rows (and the m activation rows) into a ring of
// shared-memory stages with bulk copies (cp.async.bulk, completing on mbarriers); four consumer
// warps each own one tile of 16 weight rows per pass and run mma.m16n8k16 with the weights as
// the B operand (two n8 units per tile) and the activations as the A operand (m <= 16 rows), so
// the tensor-core work per weight byte is the same for any m. The stage ring decouples the bytes
// in flight from registers: ~100 KB per block, all issued before the PDL dependency wait.
//
// Determinism: each output is accumulated by one warp over k in order (stage by stage, 32-element
// chunk by chunk), so row results depend on k only, never on m, the grid or the pass layout.
#pragma once

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/device.cuh"
#include "kernels/gemv.h"
#include "kernels/gemv_split.h"
#include "kernels/philox.h"
#include "kernels/tuning.h"

namespace twinstep::kernels::detail {

constexpr int kGemvRowsPerBlock = 16;  // weight rows of one tile (lm_head partial granularity)
constexpr int kGemvConsumerWarps = 4;  // tiles per pass
constexpr int kGemvThreads = (kGemvConsumerWarps + 1) * 32;
constexpr int kGemvMaxStages = 8;
constexpr int kGemvMaxKc = 256;  // k elements per stage (<= 8 chunks of 32)

// kResidual, kStoreNormed, kSwigluNormed: the RMSNorm between two GEMVs carried by the GEMVs
// (gemv_norm.h; fill 3 only): the producer adds its rows into the residual stream and writes
// each 16-column tile's sum of squares, the consumer scales its sums by the row's 1 / rms.
enum class GemvEpilogue {
  kStore,
  kSwiglu,
  kLogits,
  kStoreF32,
  kMoeGateUp,
  kMoeDown,
  kResidual,
  kStoreNormed,
  kSwigluNormed
};

struct LogitPartial {
  float max_logit;
  int argmax;
  float sum_exp;  // sum over the tile of exp(logit - max_logit)
  float sample_score;
  int sample_index;
};

// Grouped mode (MoE): entries = the experts any token selected (expert_list[0 .. *expert_count)),
// then the shared expert if shared_w != null. Each entry is n / out_cols tiles (shared: shared_n).
struct GemvGroup {
  const int* expert_list = nullptr;  // device, ascending expert ids
  const int* expert_count = nullptr;
  const int8_t* slot_of = nullptr;  // [m][num_experts]: slot of expert e in token t's top-k, or -1
  size_t expert_stride = 0;         // elements between consecutive experts' weight matrices
  const bf16* shared_w = nullptr;
  int shared_n = 0, shared_k = 0;  // gate_up: (shared inter, hidden); down: (hidden, shared inter)
  int num_experts = 0, top_k = 0;
  bf16* act = nullptr;         // [m][top_k][inter]: gate_up output, down input
  bf16* act_shared = nullptr;  // [m][shared inter]
  float* y = nullptr;          // [m][top_k + 1][hidden] fp32: down output (slot top_k = shared)
};

struct GemvParams {
  const bf16* w;
  const bf16* x;
  int m, n, k;  // n = output columns (= gate rows for SwiGLU)
  bf16* out;
  float* out_f32;          // kStoreF32
  float* logits;           // kLogits, optional
  LogitPartial* partials;  // kLogits: [m][n / 16]
  float inv_temperature;   // kLogits: 0 = no sampling
  uint64_t seed;
  const uint64_t* step;
  GemvGroup group;
  // Layout chosen by the launcher.
  int kc;          // k elements per stage, multiple of 64, <= kGemvMaxKc
  int stages;      // ring depth, <= kGemvMaxStages
  int x_rows;      // 8 or 16 activation rows reserved per stage
  int stage_rows;  // x_rows + weight rows per pass (<= 64)
  int fill;        // 0: cp.async.bulk per row, 1: 16-byte cp.async (GemvTuning::fill)
  int split;       // fill 3: CTAs of a cluster splitting each tile's K range (1, 2, 4)
  // kResidual: out is the residual stream (read, added to, written); norm_sq_out receives
  // [m][n / 16] tile sums of squares. kStoreNormed / kSwigluNormed: norm_sq_in holds [m][k / 16]
  // such sums of x's rows (x is the residual stream), norm_eps the RMSNorm's epsilon.
  float* norm_sq_out;
  const float* norm_sq_in;
  float norm_eps;
};

template <GemvEpilogue kEpilogue>
__host__ __device__ __forceinline__ constexpr int out_cols_per_tile() {
  return (kEpilogue == GemvEpilogue::kSwiglu || kEpilogue == GemvEpilogue::kMoeGateUp ||
          kEpilogue == GemvEpilogue::kSwigluNormed)
             ? 8
             : 16;
}

// One pass: consecutive tiles [tile_begin, tile_end) of one entry (dense mode: entry 0).
struct GemvPass {
  int tile_begin, tile_end;
  int entry, entry_begin;  // entry index and its first tile
  int k;                   // reduction length of this entry
};

template <GemvEpilogue kEpilogue>
struct GemvWork {
  static constexpr bool kGrouped =
      kEpilogue == GemvEpilogue::kMoeGateUp || kEpilogue == GemvEpilogue::kMoeDown;
  const GemvParams& p;
  int count = 0;      // grouped: selected experts
  int tiles_per = 0;  // tiles per expert entry
  int total = 0;      // tiles in all

  __device__ explicit GemvWork(const GemvParams& params) : p(params) {
    constexpr int cols = out_cols_per_tile<kEpilogue>();
    tiles_per = p.n / cols;
    if constexpr (kGrouped) {
      count = *p.group.expert_count;
      const int shared_tiles =
          p.group.shared_w == nullptr
              ? 0
              : (kEpilogue == GemvEpilogue::kMoeGateUp ? p.group.shared_n / cols : tiles_per);
      total = count * tiles_per + shared_tiles;
    } else {
      total = tiles_per;
    }
  }
  __device__ GemvPass pass(int tile, int end) const {
    GemvPass ps;
    ps.tile_begin = tile;
    if constexpr (kGrouped) {
      ps.entry = min(tile / tiles_per, count);
      ps.entry_begin = ps.entry * tiles_per;
      const int entry_end = ps.entry < count ? ps.entry_begin + tiles_per : total;
      ps.tile_end = min(min(end, tile + kGemvConsumerWarps), entry_end);
      ps.k = (kEpilogue == GemvEpilogue::kMoeDown && ps.entry == count) ? p.group.shared_k : p.k;
    } else {
      ps.entry = 0;
      ps.entry_begin = 0;
      ps.tile_end = min(end, tile + kGemvConsumerWarps);
      ps.k = p.k;
    }
    return ps;
  }
  __device__ bool is_shared(const GemvPass& ps) const { return kGrouped && ps.entry == count; }
  __device__ int expert(const GemvPass& ps) const {
    return is_shared(ps) ? -1 : p.group.expert_list[ps.entry];
  }
  // Weight row r (0..15) of tile `tile`.
  __device__ const bf16* weight_row(const GemvPass& ps, int tile, int r) const {
    if constexpr (kEpilogue == GemvEpilogue::kSwiglu) {
      const int row = r < 8 ? tile * 8 + r : p.n + tile * 8 + r - 8;
      return p.w + static_cast<size_t>(row) * p.k;
    } else if constexpr (kEpilogue == GemvEpilogue::kMoeGateUp) {
      const int lt = tile - ps.entry_begin;
      const bool sh = is_shared(ps);
      const bf16* base = sh ? p.group.shared_w : p.w + p.group.expert_stride * expert(ps);
      const int n = sh ? p.group.shared_n : p.n;
      const int row = r < 8 ? lt * 8 + r : n + lt * 8 + r - 8;
      return base + static_cast<size_t>(row) * ps.k;
    } else if constexpr (kEpilogue == GemvEpilogue::kMoeDown) {
      const bf16* base =
          is_shared(ps) ? p.group.shared_w : p.w + p.group.expert_stride * expert(ps);
      return base + static_cast<size_t>((tile - ps.entry_begin) * 16 + r) * ps.k;
    } else {
      return p.w + static_cast<size_t>(tile * 16 + r) * p.k;
    }
  }
  // Activation row of token t (rows of tokens that did not pick this expert are computed and
  // dropped by the epilogue).
  __device__ const bf16* x_row(const GemvPass& ps, int t) const {
    if constexpr (kEpilogue == GemvEpilogue::kMoeDown) {
      if (is_shared(ps)) return p.group.act_shared + static_cast<size_t>(t) * ps.k;
      const int slot =
          max(0, static_cast<int>(p.group.slot_of[t * p.group.num_experts + expert(ps)]));
      return p.group.act + (static_cast<size_t>(t) * p.group.top_k + slot) * ps.k;
    } else {
      return p.x + static_cast<size_t>(t) * ps.k;
    }
  }
};

template <bool kM16, GemvEpilogue kEpilogue>
__global__ void __launch_bounds__(kGemvThreads, 2) gemv_kernel(const GemvParams p) {
  extern __shared__ __align__(128) unsigned char gemv_smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(gemv_smem);
  uint64_t* empty = full + kGemvMaxStages;
  unsigned char* ring = gemv_smem + 128;
  const int stride = p.kc * 2 + 16;  // 16-byte pad per row: ldmatrix rows hit distinct banks
  const int stage_bytes = p.stage_rows * stride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr bool kGrouped = GemvWork<kEpilogue>::kGrouped;

  // empty[s] counts every consumer thread: each releases its own ldmatrix reads of the stage
  // (mbarrier.try_wait's guarantee covers accesses made before an arrive by the arriving threads).
  // A __syncwarp + lane-0 arrive leans on bar.warp.sync to order the other lanes' reads, which
  // compute-sanitizer racecheck does not follow: it reported WAR hazards against the refill (bulk
  // copies and cp.async alike); see tests/kernels/bulk_ring_race_test.cu.
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      mbar_init(&full[s], p.fill == 0 ? 1 : 32);
      mbar_init(&empty[s], kGemvConsumerWarps * 32);
    }
    mbar_fence_init();
  }
  __syncthreads();
  if constexpr (kGrouped) pdl_wait_and_trigger();  // the expert list comes from the router

  const GemvWork<kEpilogue> work(p);
  const int begin = static_cast<int>(static_cast<int64_t>(blockIdx.x) * work.total / gridDim.x);
  const int end = static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * work.total / gridDim.x);

  if (warp == kGemvConsumerWarps) {
    // ---- producer warp ----
    bool waited = kGrouped;
    int pending_k0[kGemvMaxStages];
    int pending_bytes[kGemvMaxStages];
    GemvPass pending_pass[kGemvMaxStages];
    // fill 0: bulk copies completing transaction bytes; fill 1: each lane copies 16 bytes of
    // every row (a row of kc <= 256 elements is one instruction per lane) and arrives on the
    // stage barrier once its copies have landed.
    auto copy_row = [&](unsigned char* dst, const bf16* src, int bytes, int s) {
      if (p.fill == 0) {
        bulk_copy_g2s(dst, src, bytes, &full[s]);
      } else {
        for (int u = 0; u < bytes / 16; u += 32)
          if (u + lane < bytes / 16) cp_async_16(dst + (u + lane) * 16, src + (u + lane) * 8, 16);
      }
    };
    auto issue_x = [&](const GemvPass& ps, int s, int k0, int bytes) {
      unsigned char* dst = ring + s * stage_bytes;
      if (p.fill == 0) {
        for (int t = lane; t < p.m; t += 32)
          bulk_copy_g2s(dst + t * stride, work.x_row(ps, t) + k0, bytes, &full[s]);
      } else {
        for (int t = 0; t < p.m; ++t) copy_row(dst + t * stride, work.x_row(ps, t) + k0, bytes, s);
        cp_async_mbar_arrive(&full[s]);
      }
    };
    int it = 0;
    for (int tile = begin; tile < end;) {
      const GemvPass ps = work.pass(tile, end);
      const int rows = (ps.tile_end - ps.tile_begin) * 16;
      for (int k0 = 0; k0 < ps.k; k0 += p.kc, ++it) {
        const int s = it % p.stages;
        if (!waited && it >= p.stages) {  // ring full of weights: now the activations
          pdl_wait_and_trigger();
          for (int j = 0; j < p.stages; ++j)
            issue_x(pending_pass[j], j, pending_k0[j], pending_bytes[j]);
          waited = true;
        }
        if (it >= p.stages) {
          mbar_wait(&empty[s], ((it / p.stages) - 1) & 1);
          if (p.fill == 0) fence_proxy_async_shared();  // consumers' reads before the refill
        }
        const int bytes = min(p.kc, ps.k - k0) * 2;
        if (p.fill == 0) {
          if (lane == 0) mbar_arrive_expect_tx(&full[s], (rows + p.m) * bytes);
          __syncwarp();
        }
        unsigned char* dst = ring + s * stage_bytes + p.x_rows * stride;
        if (p.fill == 0) {
          for (int r = lane; r < rows; r += 32)
            copy_row(dst + r * stride, work.weight_row(ps, ps.tile_begin + r / 16, r % 16) + k0,
                     bytes, s);
        } else {
          for (int r = 0; r < rows; ++r)
            copy_row(dst + r * stride, work.weight_row(ps, ps.tile_begin + r / 16, r % 16) + k0,
                     bytes, s);
        }
        if (waited) {
          issue_x(ps, s, k0, bytes);
        } else {
          pending_pass[s] = ps;
          pending_k0[s] = k0;
          pending_bytes[s] = bytes;
        }
      }
      tile = ps.tile_end;
    }
    if (!waited) {
      pdl_wait_and_trigger();
      for (int j = 0; j < min(it, p.stages); ++j)
        issue_x(pending_pass[j], j, pending_k0[j], pending_bytes[j]);
    }
    if (p.fill != 0) cp_async_wait<0>();  // keep the warp until its copies have landed
    return;
  }

  // ---- consumer warps ----
  if constexpr (!kGrouped) pdl_wait_and_trigger();
  const int gid = lane / 4, tq = lane % 4;
  const uint32_t ring_addr = smem_addr(ring);
  const uint32_t lane_off = (lane % 8) * stride + (lane / 8) * 16;
  int it = 0;
  for (int tile = begin; tile < end;) {
    const GemvPass ps = work.pass(tile, end);
    const int my_tile = ps.tile_begin + warp;
    const bool active = my_tile < ps.tile_end;
    float acc[2][4] = {};
    for (int k0 = 0; k0 < ps.k; k0 += p.kc, ++it) {
      const int s = it % p.stages;
      mbar_wait(&full[s], (it / p.stages) & 1);
      if (active) {
        const int chunks = min(p.kc, ps.k - k0) / 32;
        const uint32_t st = ring_addr + s * stage_bytes + lane_off;
        const uint32_t wt = st + (p.x_rows + warp * 16) * stride;
#pragma unroll
        for (int c = 0; c < kGemvMaxKc / 32; ++c) {
          if (c < chunks) {
            uint32_t xl[4], xh[4] = {0, 0, 0, 0}, w0[4], w1[4];
            ldmatrix_x4(xl, st + c * 64);
            if constexpr (kM16) ldmatrix_x4(xh, st + 8 * stride + c * 64);
            ldmatrix_x4(w0, wt + c * 64);
            ldmatrix_x4(w1, wt + 8 * stride + c * 64);
            mma_16816(acc[0], xl[0], xh[0], xl[1], xh[1], w0[0], w0[1]);
            mma_16816(acc[1], xl[0], xh[0], xl[1], xh[1], w1[0], w1[1]);
            mma_16816(acc[0], xl[2], xh[2], xl[3], xh[3], w0[2], w0[3]);
            mma_16816(acc[1], xl[2], xh[2], xl[3], xh[3], w1[2], w1[3]);
          }
        }
      }
      mbar_arrive(&empty[s]);  // every lane (see the init above)
    }
    tile = ps.tile_end;
    if (!active) continue;

    // Epilogue. acc[u][2h + j] = output row (token) gid + 8h, weight row u * 8 + tq * 2 + j.
    if constexpr (kEpilogue == GemvEpilogue::kLogits) {
      const int tiles = p.n / 16;
#pragma unroll
      for (int h = 0; h < (kM16 ? 2 : 1); ++h) {
        const int mm = gid + 8 * h;
        float best = -INFINITY, score = -INFINITY;
        int best_index = 0x7fffffff, score_index = 0x7fffffff;
        const uint64_t step = (p.step != nullptr && p.inv_temperature > 0.0f) ? *p.step : 0;
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const float v = acc[u][2 * h + j];
            const int col = my_tile * 16 + u * 8 + tq * 2 + j;
            if (v > best) {  // columns ascend within a lane: ties keep the lower index
              best = v;
              best_index = col;
            }
            if (p.inv_temperature > 0.0f) {
              const float sc = v * p.inv_temperature + gumbel_noise(p.seed, step, mm, col);
              if (sc > score) {
                score = sc;
                score_index = col;
              }
            }
          }
        if (p.logits != nullptr && mm < p.m) {
#pragma unroll
          for (int u = 0; u < 2; ++u)
            *reinterpret_cast<float2*>(p.logits + static_cast<size_t>(mm) * p.n + my_tile * 16 +
                                       u * 8 + tq * 2) =
                make_float2(acc[u][2 * h], acc[u][2 * h + 1]);
        }
#pragma unroll
        for (int offset = 1; offset <= 2; offset *= 2) {
          const float ob = __shfl_xor_sync(0xffffffffu, best, offset);
          const int oi = __shfl_xor_sync(0xffffffffu, best_index, offset);
          if (ob > best || (ob == best && oi < best_index)) {
            best = ob;
            best_index = oi;
          }
          const float os = __shfl_xor_sync(0xffffffffu, score, offset);
          const int osi = __shfl_xor_sync(0xffffffffu, score_index, offset);
          if (os > score || (os == score && osi < score_index)) {
            score = os;
            score_index = osi;
          }
        }
        float e = (__expf(acc[0][2 * h] - best) + __expf(acc[0][2 * h + 1] - best)) +
                  (__expf(acc[1][2 * h] - best) + __expf(acc[1][2 * h + 1] - best));
        e += __shfl_xor_sync(0xffffffffu, e, 1);
        e += __shfl_xor_sync(0xffffffffu, e, 2);
        if (tq == 0 && mm < p.m)
          p.partials[static_cast<size_t>(mm) * tiles + my_tile] =
              LogitPartial{best, best_index, e, score, score_index};
      }
    } else {
#pragma unroll
      for (int h = 0; h < (kM16 ? 2 : 1); ++h) {
        const int mm = gid + 8 * h;
        if (mm >= p.m) continue;
        if constexpr (kEpilogue == GemvEpilogue::kStore) {
#pragma unroll
          for (int u = 0; u < 2; ++u)
            *reinterpret_cast<uint32_t*>(p.out + static_cast<size_t>(mm) * p.n + my_tile * 16 +
                                         u * 8 + tq * 2) =
                pack_bf16x2(acc[u][2 * h], acc[u][2 * h + 1]);
        } else if constexpr (kEpilogue == GemvEpilogue::kStoreF32) {
#pragma unroll
          for (int u = 0; u < 2; ++u)
            *reinterpret_cast<float2*>(p.out_f32 + static_cast<size_t>(mm) * p.n + my_tile * 16 +
                                       u * 8 + tq * 2) =
                make_float2(acc[u][2 * h], acc[u][2 * h + 1]);
        } else if constexpr (kEpilogue == GemvEpilogue::kSwiglu ||
                             kEpilogue == GemvEpilogue::kMoeGateUp) {
          float v[2];
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const float g = acc[0][2 * h + j], u = acc[1][2 * h + j];
            v[j] = g / (1.0f + __expf(-g)) * u;
          }
          bf16* dst;
          if constexpr (kEpilogue == GemvEpilogue::kSwiglu) {
            dst = p.out + static_cast<size_t>(mm) * p.n;
          } else if (work.is_shared(ps)) {
            dst = p.group.act_shared + static_cast<size_t>(mm) * p.group.shared_n;
          } else {
            const int slot = p.group.slot_of[mm * p.group.num_experts + work.expert(ps)];
            if (slot < 0) continue;
            dst = p.group.act + (static_cast<size_t>(mm) * p.group.top_k + slot) * p.n;
          }
          *reinterpret_cast<uint32_t*>(dst + (my_tile - ps.entry_begin) * 8 + tq * 2) =
              pack_bf16x2(v[0], v[1]);
        } else {  // kMoeDown
          int slot = p.group.top_k;
          if (!work.is_shared(ps)) {
            slot = p.group.slot_of[mm * p.group.num_experts + work.expert(ps)];
            if (slot < 0) continue;
          }
          float* dst = p.group.y + (static_cast<size_t>(mm) * (p.group.top_k + 1) + slot) * p.n +
                       (my_tile - ps.entry_begin) * 16 + tq * 2;
#pragma unroll
          for (int u = 0; u < 2; ++u)
            *reinterpret_cast<float2*>(dst + u * 8) = make_float2(acc[u][2 * h], acc[u][2 * h + 1]);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The register-pipelined kernel of commit 70e44e1 (GemvTuning::fill == 2), kept as the baseline
// the benchmark compares the stage ring against: 8 warps split K, weights in registers.
constexpr int kRegWarps = 8;
constexpr int kRegThreads = kRegWarps * 32;

// Persistent grid: block b handles row tiles b, b + gridDim.x, ... Each warp streams its K range
// of every tile through a two-deep register pipeline (the next batch of weight loads is in
// flight while the current batch feeds the tensor cores, across tile boundaries too).
// A tile is 16 weight rows; for SwiGLU it is 8 gate rows (fragment rows 0-7) and the matching 8
// up rows (fragment rows 8-15), so gate and up of one output meet in one thread.
template <int kNTiles, GemvEpilogue kEpilogue>
__global__ void __launch_bounds__(kRegThreads, 2) gemv_regpipe_kernel(const GemvParams p) {
  constexpr int kBatch = 4;  // 32-element chunks per pipeline stage
  constexpr bool kSwiglu = kEpilogue == GemvEpilogue::kSwiglu;
  constexpr int kOutCols = kSwiglu ? 8 : 16;  // output columns per tile
  __shared__ float partial[kRegWarps][kNTiles][4][32];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tq = lane % 4;
  const int tiles = p.n / kOutCols;
  const int chunks = p.k / 32;
  const int chunk_begin = warp * chunks / kRegWarps;
  const int chunk_end = (warp + 1) * chunks / kRegWarps;

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
      for (int w = 0; w < kRegWarps; ++w) sum += partial[w][(m / 8) % kNTiles][src_reg][src_lane];
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

// ---------------------------------------------------------------------------------------------
// Sum over a half-warp's 16 lanes by xor butterfly (offsets 8, 4, 2, 1; `mask` = the half-warp):
// every lane ends with the same bits, ((v0 + v8) + (v4 + v12)) + ... for lane 0.
__device__ __forceinline__ float half_warp_sum(float v, unsigned mask) {
#pragma unroll
  for (int offset = 8; offset > 0; offset /= 2) v += __shfl_xor_sync(mask, v, offset, 16);
  return v;
}

// 1 / rms of rows r0 and r1 (a whole warp; r1 < 0: none) from their `parts` tile sums of squares
// (k = 16 parts elements, `parts` apart): lane l sums parts l, l + 32, ... in order, then an xor
// butterfly over the warp (16, 8, 4, 2, 1). Both rows' loads are in flight together.
__device__ __forceinline__ float2 warp_inv_rms(const float* sq, int r0, int r1, int parts, int k,
                                               float eps) {
  const int lane = threadIdx.x % 32;
  float s0 = 0.0f, s1 = 0.0f;
#pragma unroll 8
  for (int j = lane; j < parts; j += 32) {
    s0 += sq[static_cast<size_t>(r0) * parts + j];
    if (r1 >= 0) s1 += sq[static_cast<size_t>(r1) * parts + j];
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    s0 += __shfl_xor_sync(0xFFFFFFFFu, s0, offset);
    s1 += __shfl_xor_sync(0xFFFFFFFFu, s1, offset);
  }
  return make_float2(rsqrtf(s0 / k + eps), rsqrtf(s1 / k + eps));
}

// fill 3: the register kernel generalised (GemvTuning::split, ::stages).
//  - split-K across the S CTAs of a thread-block cluster: CTA rank q, warp w owns K piece
//    q * 8 + w of 8 S equal pieces; the cluster's rank-0 CTA sums the pieces in order through
//    distributed shared memory (deterministic, independent of m and the grid), so the tile count
//    spreads over the SMs in full rounds (qkv: 384 tiles = 2.9 rounds of 132 clusters instead of
//    1.45 rounds of 264 blocks).
//  - kStages = 0: weights through registers (two batches, as fill 2); kStages > 0: each thread
//    streams its own 16-byte pieces into a private shared-memory ring with cp.async
//    (kStages - 1 batches in flight, no register cost), waits with cp.async.wait_group.
//    kStages = 2 refills a slot right after its batch is consumed (read into registers and used
//    by the mma), not one step later: 2 batches in flight at each wait from 64 KB per block, as
//    the ring of 3 has from 96 KB, leaving L1 for the activation rows of m > 8.
// With S = 1 and kStages = 0 the arithmetic and its order are exactly those of fill 2.
//
// Grouped mode (kMoeGateUp, kMoeDown; moe.h): the tiles are those of GemvGroup's entries (the
// selected experts in list order, then the shared expert), counted on the device; S = 1 (the
// launcher's); each tile's K pieces follow its own entry's k, so a (token, expert) row's result
// depends on k only, never on m or on which other experts were selected. Gate+up waits for the
// router before anything (the expert list is its predecessor's output); down reads the list
// (written two launches back) and issues its first weights before its wait.
// kWarpTiles (grouped only, GemvTuning::moe_warp_tiles): each warp owns whole tiles over the full
// k (tile w * gridDim.x + blockIdx.x, then every gridDim.x * 8), summed in k order by that warp
// alone and written from its registers: no block barrier, no cross-warp sum. Other bits than the
// 8-piece split's, again a function of k only.
template <int kNTiles, GemvEpilogue kEpilogue, int kStages, bool kWarpTiles = false>
__global__ void __launch_bounds__(kRegThreads, kStages >= 6 ? 1 : 2)
    gemv_split_kernel(const GemvParams p) {
  constexpr int kBatch = 4;
  constexpr bool kGrouped = GemvWork<kEpilogue>::kGrouped;
  constexpr bool kMoeDown = kEpilogue == GemvEpilogue::kMoeDown;
  constexpr bool kSwiglu = kEpilogue == GemvEpilogue::kSwiglu ||
                           kEpilogue == GemvEpilogue::kSwigluNormed ||
                           kEpilogue == GemvEpilogue::kMoeGateUp;
  constexpr bool kNormed =
      kEpilogue == GemvEpilogue::kStoreNormed || kEpilogue == GemvEpilogue::kSwigluNormed;
  constexpr bool kResidual = kEpilogue == GemvEpilogue::kResidual;
  constexpr int kOutCols = kSwiglu ? 8 : 16;
  __shared__ float partial[2][kRegWarps][kNTiles][4][32];
  extern __shared__ __align__(16) uint4 gemv_ring[];  // [kStages][kBatch][2][kRegThreads]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tq = lane % 4;
  const int split = kGrouped ? 1 : p.split;
  const int rank =
      split > 1 ? static_cast<int>(cooperative_groups::this_cluster().block_rank()) : 0;
  static_assert(!kWarpTiles || kGrouped, "warp-owned tiles: grouped mode only");
  // The first tile of this CTA (of this warp with kWarpTiles) and the stride between its tiles.
  const int first_tile = kWarpTiles ? warp * gridDim.x + blockIdx.x : blockIdx.x / split;
  const int tile_stride = kWarpTiles ? gridDim.x * kRegWarps : gridDim.x / split;
  if constexpr (kEpilogue == GemvEpilogue::kMoeGateUp) pdl_wait_and_trigger();
  // Grouped: `count` selected experts of `tiles_per` tiles each, then the shared expert's.
  [[maybe_unused]] const int count = kGrouped ? *p.group.expert_count : 0;
  [[maybe_unused]] const int tiles_per = p.n / kOutCols;
  const int tiles = [&] {
    if constexpr (kGrouped) {
      const int shared_tiles =
          p.group.shared_w == nullptr ? 0 : (kMoeDown ? tiles_per : p.group.shared_n / kOutCols);
      return count * tiles_per + shared_tiles;
    } else {
      return p.n / kOutCols;
    }
  }();
  const int chunks = p.k / 32;
  const int piece = kWarpTiles ? 0 : rank * kRegWarps + warp;
  const int pieces = kWarpTiles ? 1 : split * kRegWarps;
  const int chunk_begin = piece * chunks / pieces;
  const int chunk_end = (piece + 1) * chunks / pieces;

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

  // One step = one batch of <= kBatch chunks of one tile; a warp's steps walk its K piece of the
  // cluster's tiles in order (an empty piece is one step of count 0 per tile). Grouped steps
  // carry their tile's entry: this thread's two weight rows, its K piece, (down) its x rows.
  struct DenseStep {
    int tile, chunk, count;
  };
  struct GroupStep {
    int tile, chunk, count, chunk_end;
    int out_slot;  // the tile epilogue's slot for this thread's token row (shared: top_k)
    const bf16* w[2];
    const bf16* x[kNTiles];  // down only (gate+up reads x_row)
  };
  using Step = std::conditional_t<kGrouped, GroupStep, DenseStep>;
  // Grouped: entry index of a tile (count = the shared expert) and the tile's index within it.
  [[maybe_unused]] auto entry_of = [&](int tile) { return min(tile / tiles_per, count); };
  auto make_step = [&](int tile, int chunk) {
    if constexpr (kGrouped) {
      GroupStep s{tile, 0, 0, 0, 0, {p.w, p.w}, {}};
      if (tile >= tiles) return s;
      const int entry = entry_of(tile), local = tile - entry * tiles_per;
      const bool shared = entry == count;
      const int e = shared ? 0 : p.group.expert_list[entry];
      const bf16* base = shared ? p.group.shared_w : p.w + p.group.expert_stride * e;
      const int k = shared && kMoeDown ? p.group.shared_k : p.k;
      const int n = shared && !kMoeDown ? p.group.shared_n : p.n;
      // Read here, a step or more before the tile's epilogue needs it: a global load there
      // would hold every warp of the block at the next tile's barrier.
      const int t_out = min(static_cast<int>(threadIdx.x) / kOutCols, p.m - 1);
      s.out_slot = shared ? p.group.top_k : p.group.slot_of[t_out * p.group.num_experts + e];
      const int entry_chunks = k / 32;
      s.chunk = piece * entry_chunks / pieces;
      s.chunk_end = (piece + 1) * entry_chunks / pieces;
      s.count = min(kBatch, s.chunk_end - s.chunk);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = kSwiglu ? h * n + local * 8 + gid : local * 16 + h * 8 + gid;
        s.w[h] = base + static_cast<size_t>(row) * k + tq * 8;
      }
      if constexpr (kMoeDown) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          // A token that did not pick this expert reads slot 0's row; the epilogue drops it.
          const int t = x_valid[nt] ? nt * 8 + gid : 0;
          const int slot = shared ? 0 : max(0, int(p.group.slot_of[t * p.group.num_experts + e]));
          s.x[nt] = (shared ? p.group.act_shared + static_cast<size_t>(t) * k
                            : p.group.act + (static_cast<size_t>(t) * p.group.top_k + slot) * k) +
                    tq * 8;
        }
      }
      return s;
    } else {
      return DenseStep{tile, chunk, tile < tiles ? min(kBatch, chunk_end - chunk) : 0};
    }
  };
  auto next_step = [&](const Step& s) {
    const int c = s.chunk + s.count;
    if constexpr (kGrouped) {
      if (c >= s.chunk_end) return make_step(s.tile + tile_stride, 0);
      Step t = s;
      t.chunk = c;
      t.count = min(kBatch, s.chunk_end - c);
      return t;
    } else {
      return c >= chunk_end ? make_step(s.tile + tile_stride, chunk_begin) : make_step(s.tile, c);
    }
  };
  // This thread's weight row h (fragment rows 0-7 / 8-15) of the step's tile, at chunk 0.
  auto step_row = [&](const Step& s, int h) -> const bf16* {
    if constexpr (kGrouped)
      return s.w[h];
    else
      return weight_row(s.tile, h);
  };
  // This thread's activation row nt of the step's tile, at chunk 0.
  auto step_x = [&](const Step& s, int nt) -> const bf16* {
    if constexpr (kMoeDown)
      return s.x[nt];
    else
      return x_row[nt];
  };
  uint4 cur[kBatch][2], nxt[kBatch][2];
  auto load_regs = [&](uint4(&buf)[kBatch][2], const Step& s) {
    const bf16* r0 = step_row(s, 0) + s.chunk * 32;
    const bf16* r1 = step_row(s, 1) + s.chunk * 32;
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (u < s.count) {
        buf[u][0] = load_stream_16(r0 + u * 32);
        buf[u][1] = load_stream_16(r1 + u * 32);
      }
  };
  auto ring_at = [&](int slot, int u, int h) -> uint4* {
    return gemv_ring + ((slot * kBatch + u) * 2 + h) * kRegThreads + threadIdx.x;
  };
  auto issue_async = [&](const Step& s, int slot) {
    if (s.count > 0) {
      const bf16* r0 = step_row(s, 0) + s.chunk * 32;
      const bf16* r1 = step_row(s, 1) + s.chunk * 32;
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (u < s.count) {
          cp_async_16(ring_at(slot, u, 0), r0 + u * 32, 16);
          cp_async_16(ring_at(slot, u, 1), r1 + u * 32, 16);
        }
    }
    cp_async_commit();
  };

  Step step = make_step(first_tile, chunk_begin);
  Step ahead = step;  // kStages > 0: next step to issue
  if constexpr (kStages == 0) {
    if (step.count > 0) load_regs(cur, step);  // weights never depend on the previous kernel
  } else {
    constexpr int kPrologue = kStages == 2 ? 2 : kStages - 1;
#pragma unroll
    for (int j = 0; j < kPrologue; ++j) {
      issue_async(ahead, j);
      ahead = next_step(ahead);
    }
  }
  if constexpr (kEpilogue != GemvEpilogue::kMoeGateUp) pdl_wait_and_trigger();

  // The epilogue's thread: output row em, column ei of the tile (rank 0 only).
  const int em = threadIdx.x / kOutCols, ei = threadIdx.x % kOutCols;
  const bool epilogue_row = rank == 0 && em < p.m;
  // kNormed: each row's 1 / rms, computed once per launch by warps w (rows w, w + 8) and read by
  // the tile epilogues after their barrier. Where registers allow (m <= 8) inside the first step,
  // with its activation loads in flight; the 16-row path has none to spare there (it spilled):
  // before its loop.
  static_assert(kRegWarps * 2 >= kGemvMaxRows, "two rows per warp");
  [[maybe_unused]] __shared__ float inv_rms[kNormed ? kGemvMaxRows : 1];
  [[maybe_unused]] bool inv_rms_pending = kNormed && rank == 0 && warp < p.m;
  auto compute_inv_rms = [&] {
    const int r1 = warp + kRegWarps < p.m ? warp + kRegWarps : -1;
    const float2 inv = warp_inv_rms(p.norm_sq_in, warp, r1, p.k / 16, p.k, p.norm_eps);
    if (lane == 0) {
      inv_rms[warp] = inv.x;
      if (r1 >= 0) inv_rms[r1] = inv.y;
    }
    inv_rms_pending = false;
  };
  if constexpr (kNormed && kNTiles == 2)
    if (inv_rms_pending) compute_inv_rms();
  [[maybe_unused]] bf16 residual_in = bf16(0.0f);  // kResidual: residual[em][this tile's ei]

  float acc[kNTiles][4];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  int slot = 0, tile_iter = 0;
  while (step.tile < tiles) {
    uint4 xv[kBatch][kNTiles];
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (u < step.count)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
          xv[u][nt] = x_valid[nt] ? load_16(step_x(step, nt) + (step.chunk + u) * 32)
                                  : make_uint4(0, 0, 0, 0);
    // Read after the first activations are in flight, used by the tile epilogues.
    if constexpr (kNormed && kNTiles == 1)
      if (inv_rms_pending) compute_inv_rms();
    if constexpr (kResidual) {
      if (epilogue_row && step.chunk == chunk_begin)  // a tile's first step
        residual_in = p.out[static_cast<size_t>(em) * p.n + step.tile * kOutCols + ei];
    }
    const Step following = next_step(step);
    if constexpr (kStages == 0) {
      if (following.count > 0) load_regs(nxt, following);
    } else if constexpr (kStages == 2) {
      cp_async_wait<1>();  // this step's group has landed; the next one may be in flight
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (u < step.count) {
          cur[u][0] = *ring_at(slot, u, 0);
          cur[u][1] = *ring_at(slot, u, 1);
        }
    } else {
      cp_async_wait<kStages - 2>();  // this step's group has landed (own copies only)
      issue_async(ahead, slot == 0 ? kStages - 1 : slot - 1);
      ahead = next_step(ahead);
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (u < step.count) {
          cur[u][0] = *ring_at(slot, u, 0);
          cur[u][1] = *ring_at(slot, u, 1);
        }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (u < step.count)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          const uint4 lo = cur[u][0], hi = cur[u][1], b = xv[u][nt];
          mma_16816(acc[nt], lo.x, hi.x, lo.y, hi.y, b.x, b.y);
          mma_16816(acc[nt], lo.z, hi.z, lo.w, hi.w, b.z, b.w);
        }
    if constexpr (kStages == 0) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        cur[u][0] = nxt[u][0];
        cur[u][1] = nxt[u][1];
      }
    } else if constexpr (kStages == 2) {
      // The slot's batch is in registers and consumed by the mma above: refill it now.
      issue_async(ahead, slot);
      ahead = next_step(ahead);
      slot ^= 1;
    } else {
      slot = slot + 1 == kStages ? 0 : slot + 1;
    }
    const bool tile_done = following.tile != step.tile;
    const int tile = step.tile;
    [[maybe_unused]] int out_slot = 0;
    if constexpr (kGrouped) out_slot = step.out_slot;
    step = following;
    if (!tile_done) continue;

    if constexpr (kWarpTiles) {
      // acc[nt][j] / acc[nt][2 + j]: weight rows gid / gid + 8 of the tile (gate / up for
      // gate+up), token nt * 8 + 2 tq + j. The slot loads are this warp's alone to wait for.
      const int entry = entry_of(tile), local = tile - entry * tiles_per;
      const bool shared = entry == count;
      const int e = shared ? 0 : p.group.expert_list[entry];
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int t = nt * 8 + tq * 2 + j;
          if (t >= p.m) continue;
          const int slot = shared ? p.group.top_k : p.group.slot_of[t * p.group.num_experts + e];
          if constexpr (kMoeDown) {
            if (slot < 0) continue;
            float* y = p.group.y + (static_cast<size_t>(t) * (p.group.top_k + 1) + slot) * p.n +
                       local * 16 + gid;
            y[0] = acc[nt][j];
            y[8] = acc[nt][2 + j];
          } else {
            const float g = acc[nt][j], u = acc[nt][2 + j];
            const bf16 v = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
            if (shared)
              p.group.act_shared[static_cast<size_t>(t) * p.group.shared_n + local * 8 + gid] = v;
            else if (slot >= 0)
              p.group.act[(static_cast<size_t>(t) * p.group.top_k + slot) * p.n + local * 8 + gid] =
                  v;
          }
        }
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
      continue;
    }

    // ---- tile epilogue: partial sums of the S x 8 pieces, summed in piece order ----
    const int buf = tile_iter & 1;
    ++tile_iter;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        partial[buf][warp][nt][r][lane] = acc[nt][r];
        acc[nt][r] = 0.0f;
      }
    // One barrier per tile: partial is double-buffered, so buffer b is rewritten (tile t + 2)
    // only after every reader of tile t passed the barrier of tile t + 1.
    if (split > 1)
      cooperative_groups::this_cluster().sync();
    else
      __syncthreads();
    if (rank != 0) continue;
    auto reduced = [&](int r, int m) {
      const int src_lane = (r % 8) * 4 + (m % 8) / 2, src_reg = (r / 8) * 2 + (m % 2);
      float sum = 0.0f;
      for (int q = 0; q < split; ++q) {
        const float* src = &partial[buf][0][(m / 8) % kNTiles][src_reg][src_lane];
        if (split > 1) src = cooperative_groups::this_cluster().map_shared_rank(src, q);
#pragma unroll
        for (int w = 0; w < kRegWarps; ++w) sum += src[w * kNTiles * 4 * 32];
      }
      return sum;
    };
    const int m = em, i = ei;
    const int col = tile * kOutCols + i;
    if (m < p.m) {
      if constexpr (kEpilogue == GemvEpilogue::kStore) {
        p.out[static_cast<size_t>(m) * p.n + col] = __float2bfloat16(reduced(i, m));
      } else if constexpr (kEpilogue == GemvEpilogue::kStoreNormed) {
        p.out[static_cast<size_t>(m) * p.n + col] = __float2bfloat16(reduced(i, m) * inv_rms[m]);
      } else if constexpr (kGrouped) {
        // gemv_kernel's grouped epilogue: SwiGLU into the token's activation slot (gate+up), fp32
        // into its output slot (down; slot top_k = the shared expert); tokens that did not pick
        // the expert are dropped.
        const int entry = entry_of(tile), local = tile - entry * tiles_per;
        const bool shared = entry == count;
        const int slot = out_slot;
        if constexpr (kMoeDown) {
          if (slot >= 0)
            p.group
                .y[(static_cast<size_t>(m) * (p.group.top_k + 1) + slot) * p.n + local * 16 + i] =
                reduced(i, m);
        } else {
          const float g = reduced(i, m), u = reduced(i + 8, m);
          const bf16 v = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
          if (shared)
            p.group.act_shared[static_cast<size_t>(m) * p.group.shared_n + local * 8 + i] = v;
          else if (slot >= 0)
            p.group.act[(static_cast<size_t>(m) * p.group.top_k + slot) * p.n + local * 8 + i] = v;
        }
      } else if constexpr (kSwiglu) {
        float g = reduced(i, m), u = reduced(i + 8, m);
        if constexpr (kNormed) {
          g *= inv_rms[m];
          u *= inv_rms[m];
        }
        p.out[static_cast<size_t>(m) * p.n + col] = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
      } else if constexpr (kResidual) {
        // rmsnorm_residual's sum: the delta rounded to bf16, added to the residual, rounded.
        const float delta = __bfloat162float(__float2bfloat16(reduced(i, m)));
        const bf16 h = __float2bfloat16(__bfloat162float(residual_in) + delta);
        p.out[static_cast<size_t>(m) * p.n + col] = h;
        const float hf = __bfloat162float(h);
        const float sq = half_warp_sum(__fmul_rn(hf, hf), 0xFFFFu << (threadIdx.x & 16));
        if (i == 0) p.norm_sq_out[static_cast<size_t>(m) * tiles + tile] = sq;
      } else {
        const float logit = reduced(i, m);
        if (p.logits != nullptr) p.logits[static_cast<size_t>(m) * p.n + col] = logit;
        const unsigned mask = 0xFFFFu << (threadIdx.x & 16);
        float best = logit;
        int best_index = col;
        float score = -INFINITY;
        int score_index = col;
        if (p.inv_temperature > 0.0f) {
          const uint64_t st = p.step != nullptr ? *p.step : 0;
          score = logit * p.inv_temperature + gumbel_noise(p.seed, st, m, col);
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
        if (i == 0)
          p.partials[static_cast<size_t>(m) * tiles + tile] =
              LogitPartial{best, best_index, e, score, score_index};
      }
    }
  }
  if constexpr (kStages > 0) cp_async_wait<0>();
  // Rank 0 reads the other CTAs' shared memory until its last epilogue: keep them resident.
  if (split > 1) cooperative_groups::this_cluster().sync();
}

template <int kNTiles, GemvEpilogue kEpilogue>
int regpipe_resident_blocks() {
  static const int blocks = [] {
    int per_sm = 0, device = 0, sms = 0;
    TS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, gemv_regpipe_kernel<kNTiles, kEpilogue>, kRegThreads, 0));
    TS_CUDA_CHECK(cudaGetDevice(&device));
    TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return per_sm * sms;
  }();
  return blocks;
}

// Launches gemv_kernel with the activation-tile count that m needs, one resident wave at most.
template <GemvEpilogue kEpilogue>
void launch_gemv_regpipe(const GemvParams& p, cudaStream_t stream, bool pdl) {
  const int tiles = p.n / out_cols_per_tile<kEpilogue>();
  if (p.m <= 8)
    launch(gemv_regpipe_kernel<1, kEpilogue>,
           dim3(std::min(tiles, regpipe_resident_blocks<1, kEpilogue>())), dim3(kRegThreads), 0,
           stream, pdl, p);
  else
    launch(gemv_regpipe_kernel<2, kEpilogue>,
           dim3(std::min(tiles, regpipe_resident_blocks<2, kEpilogue>())), dim3(kRegThreads), 0,
           stream, pdl, p);
}

int num_sms();

// The split rule (kernels/gemv_split.h, shared with the simulator) on this device's SMs.
inline int choose_split(int tiles, int k, int forced) {
  return gemv_choose_split(tiles, k, num_sms(), forced);
}

template <int kNTiles, GemvEpilogue kEpilogue, int kStages, bool kWarpTiles = false>
void launch_gemv_split_t(const GemvParams& p, int tiles, cudaStream_t stream, bool pdl) {
  auto kernel = gemv_split_kernel<kNTiles, kEpilogue, kStages, kWarpTiles>;
  const size_t smem = static_cast<size_t>(kStages) * 32 * 1024;
  static const int per_sm = [&] {
    if (smem > 48 * 1024)
      TS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
    int blocks = 0;
    TS_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kRegThreads, smem));
    return blocks;
  }();
  // Clusters of p.split CTAs on one GPC: size the persistent grid by the resident clusters.
  const int clusters = std::max(1, std::min(tiles, per_sm * num_sms() / p.split));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(clusters * p.split);
  config.blockDim = dim3(kRegThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[3];
  const int large_m_percent = gemv_tuning().large_m_carveout_percent;
  int n_attr = int(kStages == 0 && kNTiles == 2 && large_m_percent >= 0
                       ? add_carveout(attribute, 0, large_m_percent)
                       : add_carveout(attribute, 0));
  if (p.split > 1) {
    attribute[n_attr].id = cudaLaunchAttributeClusterDimension;
    attribute[n_attr].val.clusterDim.x = p.split;
    attribute[n_attr].val.clusterDim.y = 1;
    attribute[n_attr].val.clusterDim.z = 1;
    ++n_attr;
    config.attrs = attribute;
    config.numAttrs = n_attr;
    static int cached[5] = {0, 0, 0, 0, 0};
    if (cached[p.split] == 0) {
      TS_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&cached[p.split], kernel, &config));
      cached[p.split] = std::max(1, cached[p.split]);
    }
    config.gridDim = dim3(std::min(clusters, cached[p.split]) * p.split);
  }
  if (pdl) {
    attribute[n_attr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[n_attr].val.programmaticStreamSerializationAllowed = 1;
    ++n_attr;
  }
  config.attrs = attribute;
  config.numAttrs = n_attr;
  TS_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p));
  TS_CUDA_CHECK(cudaGetLastError());
}

template <GemvEpilogue kEpilogue, int kStages>
void launch_gemv_split_s(GemvParams p, int split, cudaStream_t stream, bool pdl) {
  const int tiles = p.n / out_cols_per_tile<kEpilogue>();
  p.split = choose_split(tiles, p.k, split);
  if (p.m <= 8)
    launch_gemv_split_t<1, kEpilogue, kStages>(p, tiles, stream, pdl);
  else
    launch_gemv_split_t<2, kEpilogue, kStages>(p, tiles, stream, pdl);
}

// The split (kernels/gemv_split.h) first, then stages < 0 (auto): a split launch takes the ring
// of 3 (two blocks per SM), an S = 1 launch gemv_auto_stages' ring (6: one 8-warp block per SM,
// e.g. qkv's 384 tiles = 2.9 rounds of 132; else 3). m > 8 with `large_m_registers`: the
// register path with the same S (same bits), because the rings take the L1 that the 16
// activation rows are re-read from.
template <GemvEpilogue kEpilogue>
void launch_gemv_split(const GemvParams& p, const GemvTuning& t, cudaStream_t stream, bool pdl) {
  const int tiles = p.n / out_cols_per_tile<kEpilogue>();
  const int split = choose_split(tiles, p.k, t.split);  // never depends on m
  int stages = t.stages;
  if (stages < 0) stages = split > 1 ? 3 : gemv_auto_stages(tiles, num_sms());
  if (p.m > 8 && t.large_m_registers) stages = t.large_m_stages;
  if (stages >= 6)
    launch_gemv_split_s<kEpilogue, 6>(p, split, stream, pdl);
  else if (stages >= 3)
    launch_gemv_split_s<kEpilogue, 3>(p, split, stream, pdl);
  else if (stages == 2)
    launch_gemv_split_s<kEpilogue, 2>(p, split, stream, pdl);
  else
    launch_gemv_split_s<kEpilogue, 0>(p, split, stream, pdl);
}

// Grouped MoE GEMVs on gemv_split_kernel (GemvTuning::moe_fill 3): S = 1, the ring of
// `moe_stages` (m > 8: `moe_large_m_stages`; same bits either way), a persistent grid sized
// by the most tiles the launch can have (every token picking distinct experts of the range, plus
// the shared expert's); blocks past the device's tile count exit.
template <GemvEpilogue kEpilogue>
void launch_gemv_grouped(GemvParams p, const GemvTuning& t, cudaStream_t stream, bool pdl) {
  constexpr int cols = out_cols_per_tile<kEpilogue>();
  constexpr bool kDown = kEpilogue == GemvEpilogue::kMoeDown;
  const int entries = std::min(p.m * p.group.top_k, p.group.num_experts);
  const int shared_tiles =
      p.group.shared_w == nullptr ? 0 : (kDown ? p.n : p.group.shared_n) / cols;
  const int tiles = entries * (p.n / cols) + shared_tiles;
  p.split = 1;
  const int stages = p.m > 8 ? t.moe_large_m_stages : t.moe_stages;
  auto go = [&](auto n_tiles, auto warp_tiles) {
    constexpr int kN = decltype(n_tiles)::value;
    constexpr bool kW = decltype(warp_tiles)::value;
    if (stages >= 6)
      launch_gemv_split_t<kN, kEpilogue, 6, kW>(p, tiles, stream, pdl);
    else if (stages >= 3)
      launch_gemv_split_t<kN, kEpilogue, 3, kW>(p, tiles, stream, pdl);
    else if (stages == 2)
      launch_gemv_split_t<kN, kEpilogue, 2, kW>(p, tiles, stream, pdl);
    else
      launch_gemv_split_t<kN, kEpilogue, 0, kW>(p, tiles, stream, pdl);
  };
  auto rows = [&](auto warp_tiles) {
    if (p.m <= 8)
      go(std::integral_constant<int, 1>{}, warp_tiles);
    else
      go(std::integral_constant<int, 2>{}, warp_tiles);
  };
  if (t.moe_warp_tiles)
    rows(std::true_type{});
  else
    rows(std::false_type{});
}

// Launches gemv_kernel: one block per SM (at most one per tile; grouped mode: one per SM, the
// tile count is on the device), a stage ring sized from gemv_tuning().
template <GemvEpilogue kEpilogue>
void launch_gemv(GemvParams p, cudaStream_t stream, bool pdl) {
  const GemvTuning& tuning = gemv_tuning();
  constexpr bool kGrouped = GemvWork<kEpilogue>::kGrouped;
  if constexpr (kEpilogue == GemvEpilogue::kStore || kEpilogue == GemvEpilogue::kSwiglu ||
                kEpilogue == GemvEpilogue::kLogits) {
    if (tuning.fill == 2) return launch_gemv_regpipe<kEpilogue>(p, stream, pdl);
    if (tuning.fill == 3) return launch_gemv_split<kEpilogue>(p, tuning, stream, pdl);
  }
  if constexpr (kGrouped)
    if (tuning.moe_fill == 3) return launch_gemv_grouped<kEpilogue>(p, tuning, stream, pdl);
  const int cols =
      (kEpilogue == GemvEpilogue::kSwiglu || kEpilogue == GemvEpilogue::kMoeGateUp) ? 8 : 16;
  const int sms = num_sms();
  const int tiles = p.n / cols;
  const int grid = kGrouped ? sms : std::min(tiles, sms);
  const int per_block =
      kGrouped ? kGemvConsumerWarps : std::min(kGemvConsumerWarps, (tiles + grid - 1) / grid);
  p.kc = tuning.kc;
  p.fill = (kGrouped ? tuning.moe_fill : tuning.fill) == 1 ? 1 : 0;  // else the bulk ring
  p.x_rows = p.m > 8 ? 16 : 8;
  p.stage_rows = p.x_rows + per_block * 16;
  const int stage_bytes = p.stage_rows * (p.kc * 2 + 16);
  p.stages = std::clamp(tuning.smem_budget_bytes / stage_bytes, 2, kGemvMaxStages);
  const int smem = 128 + p.stages * stage_bytes;
  static const bool configured = [] {  // > 48 KB of dynamic shared memory needs an opt-in
    for (auto kernel : {gemv_kernel<false, kEpilogue>, gemv_kernel<true, kEpilogue>})
      TS_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    return true;
  }();
  (void)configured;
  launch(p.m > 8 ? gemv_kernel<true, kEpilogue> : gemv_kernel<false, kEpilogue>, dim3(grid),
         dim3(kGemvThreads), smem, stream, pdl, p);
}

}  // namespace twinstep::kernels::detail
