// moe_prefill (kernels/moe.h): the MoE FFN over many rows as grouped tensor-core GEMMs.
//
// Pipeline (all on `stream`, no host synchronisation):
//   router GEMM     x [m][H] . router^T -> logits [m][E] fp32
//   route           a warp per token: moe_route_token (the rule moe_forward uses); per block of
//                   kRouteRows tokens, how many of its pairs chose each expert of the range
//   scan            one block: each expert's row count and first row (exclusive prefix sum),
//                   each route block's first row per expert, and the tile table (expert,
//                   row_begin, row_end) of every kBM-row tile of every expert
//   scatter         each in-range (token, slot) pair gets its expert-contiguous row p, ascending
//                   token within an expert: perm_token[p], perm_out[p] = token * (top_k+1) + slot
//   gate_up GEMM    grouped over the tile table: x rows gathered by perm_token, SwiGLU fused
//                   (gate and up tiles of the same columns in one block) -> act [p][EI] bf16
//   shared gate_up  dense, the same kernel over all m rows -> act_shared [m][SI] bf16
//   down GEMM       grouped: act [p] -> y[perm_out[p]] fp32 (y as moe_forward: [m][top_k+1][H])
//   shared down     dense: act_shared -> y[t][top_k]
//   combine         moe_forward's kernel: weighted sum in slot order, one bf16 rounding
//
// The GEMM: C[p][n] = sum_k A[p][k] W[n][k], both operands k-contiguous (bf16), fp32 accumulate
// with mma.sync m16n8k16. Block tile kBM x 128 x 64 (kBM = 64 or 128 rows), (kBM / 32) x 2 warps
// of 32 x 64, a 3-stage cp.async ring in XOR-swizzled shared memory (conflict-free ldmatrix).
// Each output element is accumulated by one thread over k in order, so results do not depend on
// a row's position in its tile or on the other rows. Grids are 1-D: block b = tile b / n_tiles,
// column tile b % n_tiles (consecutive blocks share an A tile and one expert's weights, which
// stay in L2 for the expert's next row tile).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "kernels/device.cuh"
#include "kernels/moe.h"
#include "kernels/moe_common.cuh"

namespace twinstep::kernels {

namespace {

using detail::kMoeMaxExperts;
using detail::kMoeMaxTopK;

constexpr int kRouteRows = 32;  // tokens per route block (one count row per block)
constexpr int kRouteThreads = 256;
constexpr int kScanThreads = kMoeMaxExperts;
constexpr int kScatterThreads = kRouteRows * kMoeMaxTopK;
constexpr int kMinTileRows = 64;  // the smaller kBM: sizes the tile table

constexpr int kBN = 128;  // weight rows per block tile (SwiGLU: 64 gate + 64 up)
constexpr int kBK = 64;   // k per stage: one 128-byte shared-memory row per tile row
constexpr int kStages = 3;

__host__ __device__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------------------------------------
// workspace

struct PrefillWorkspace {
  float* logits;     // [m][E]
  int* ids;          // [m][top_k]
  float* weights;    // [m][top_k]
  int* counts;       // [route blocks][E]: pairs of the block per range expert, then (scan) the
                     // block's first row per expert
  int4* tiles;       // [ceil(m top_k / 64) + E]: (range expert, row_begin, row_end, 0)
  int* tile_count;   // [1]
  int* perm_token;   // [m top_k]: token of expert-contiguous row p
  int* perm_out;     // [m top_k]: its y row, token * (top_k + 1) + slot
  bf16* act;         // [m top_k][expert_inter]
  bf16* act_shared;  // [m][shared_inter]
  float* y;          // [m][top_k + 1][hidden]
  size_t bytes;
};

PrefillWorkspace carve(void* base, int m, const MoeShape& s) {
  detail::MoeCarver c{base};
  const size_t pairs = static_cast<size_t>(m) * s.top_k;
  PrefillWorkspace w = {};
  w.logits = c.take<float>(static_cast<size_t>(m) * s.num_experts);
  w.ids = c.take<int>(pairs);
  w.weights = c.take<float>(pairs);
  w.counts = c.take<int>(static_cast<size_t>(ceil_div(m, kRouteRows)) * s.num_experts);
  w.tiles = c.take<int4>((pairs + kMinTileRows - 1) / kMinTileRows + s.num_experts);
  w.tile_count = c.take<int>(1);
  w.perm_token = c.take<int>(pairs);
  w.perm_out = c.take<int>(pairs);
  w.act = c.take<bf16>(pairs * s.expert_inter);
  w.act_shared = c.take<bf16>(static_cast<size_t>(m) * std::max(s.shared_inter, 1));
  w.y = c.take<float>(static_cast<size_t>(m) * (s.top_k + 1) * s.hidden);
  w.bytes = c.off;
  return w;
}

// Row tile of the grouped GEMMs: 64 rows while experts average fewer than 128 rows (the 1k-token
// prefill of a 128-expert top-8 model: 64), else 128 (more math per shared-memory byte).
int tile_rows(int m, const MoeShape& s) {
  return static_cast<long long>(m) * s.top_k >= 128LL * s.num_experts ? 128 : 64;
}

// ---------------------------------------------------------------------------------------------
// routing kernels

// Block b routes tokens [b kRouteRows, (b + 1) kRouteRows), a warp per token; counts[b][e] = how
// many of its pairs chose range expert e (integer shared-memory atomics: order-free).
__global__ void __launch_bounds__(kRouteThreads)
    moe_prefill_route_kernel(const float* logits, int m, int num_experts, int top_k,
                             bool renormalize, int range_begin, int range, int* ids, float* weights,
                             int* counts, int* ids_out, float* weights_out) {
  __shared__ int count[kMoeMaxExperts];
  for (int e = threadIdx.x; e < range; e += blockDim.x) count[e] = 0;
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < kRouteRows; r += kRouteThreads / 32) {
    const int t = blockIdx.x * kRouteRows + r;
    if (t >= m) break;
    int top_id[kMoeMaxTopK];
    float top_w[kMoeMaxTopK];
    detail::moe_route_token(logits + static_cast<size_t>(t) * num_experts, num_experts, top_k,
                            renormalize, lane, top_id, top_w);
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < kMoeMaxTopK; ++j) {
        if (j >= top_k) break;
        const size_t at = static_cast<size_t>(t) * top_k + j;
        ids[at] = top_id[j];
        weights[at] = top_w[j];
        if (ids_out != nullptr) ids_out[at] = top_id[j];
        if (weights_out != nullptr) weights_out[at] = top_w[j];
        const int local = top_id[j] - range_begin;
        if (local >= 0 && local < range) atomicAdd(&count[local], 1);
      }
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < range; e += blockDim.x)
    counts[static_cast<size_t>(blockIdx.x) * range + e] = count[e];
}

// Exclusive prefix sum over the block's threads (kScanThreads) of (a, b); returns the totals.
__device__ int2 block_exclusive_scan(int& a, int& b) {
  __shared__ int2 partial[kScanThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int sa = a, sb = b;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int na = __shfl_up_sync(0xffffffffu, sa, o), nb = __shfl_up_sync(0xffffffffu, sb, o);
    if (lane >= o) {
      sa += na;
      sb += nb;
    }
  }
  if (lane == 31) partial[warp] = make_int2(sa, sb);
  __syncthreads();
  int2 before = make_int2(0, 0), total = make_int2(0, 0);
  for (int w = 0; w < kScanThreads / 32; ++w) {
    if (w < warp) before = make_int2(before.x + partial[w].x, before.y + partial[w].y);
    total = make_int2(total.x + partial[w].x, total.y + partial[w].y);
  }
  a = before.x + sa - a;
  b = before.y + sb - b;
  return total;
}

// One block, thread e = range expert e: its row count over all route blocks, its first row and
// first tile (exclusive scans), each route block's first row for it (in place of the counts), and
// its tile-table entries. tile_count = the tiles of every expert (<= ceil(pairs / kBM) + range).
__global__ void __launch_bounds__(kScanThreads)
    moe_prefill_scan_kernel(int* counts, int blocks, int range, int tile, int4* tiles,
                            int* tile_count) {
  const int e = threadIdx.x;
  int rows = 0;
  if (e < range)
    for (int b = 0; b < blocks; ++b) rows += counts[static_cast<size_t>(b) * range + e];
  const int expert_rows = rows;
  int first_row = rows, first_tile = ceil_div(rows, tile);
  const int2 total = block_exclusive_scan(first_row, first_tile);
  if (e < range) {
    int row = first_row;
    for (int b = 0; b < blocks; ++b) {
      int& c = counts[static_cast<size_t>(b) * range + e];
      const int n = c;
      c = row;
      row += n;
    }
    for (int i = 0; i * tile < expert_rows; ++i)
      tiles[first_tile + i] =
          make_int4(e, first_row + i * tile, first_row + min(expert_rows, (i + 1) * tile), 0);
  }
  if (threadIdx.x == 0) *tile_count = total.y;
}

// Block b: its tokens' in-range pairs, in (token, slot) order, each to row
// first_row[b][expert] + (earlier pairs of the block with the same expert).
__global__ void __launch_bounds__(kScatterThreads)
    moe_prefill_scatter_kernel(const int* ids, int m, int top_k, int range_begin, int range,
                               const int* first_row, int* perm_token, int* perm_out) {
  __shared__ int local[kScatterThreads];
  const int t0 = blockIdx.x * kRouteRows;
  const int pairs = min(kRouteRows, m - t0) * top_k;
  const int i = threadIdx.x;
  if (i < pairs) local[i] = ids[static_cast<size_t>(t0) * top_k + i] - range_begin;
  __syncthreads();
  if (i >= pairs) return;
  const int e = local[i];
  if (e < 0 || e >= range) return;
  int rank = 0;
  for (int q = 0; q < i; ++q) rank += local[q] == e;
  const int p = first_row[static_cast<size_t>(blockIdx.x) * range + e] + rank;
  const int t = t0 + i / top_k;
  perm_token[p] = t;
  perm_out[p] = t * (top_k + 1) + i % top_k;
}

// ---------------------------------------------------------------------------------------------
// grouped GEMM

enum class GemmEpilogue {
  kStoreF32,  // out_f32[out row of p][col] = acc
  kSwiglu,    // out_bf16[p][col] = silu(gate) * up: weight rows [0, n) gate, [n, 2n) up
};

struct GroupedGemmParams {
  const bf16* a;       // A rows of k elements
  const int* a_index;  // A row of GEMM row p: a_index[p] (gather), or p when null
  const bf16* w;       // group g's weights: w + g * w_stride, row-major [rows][k]
  size_t w_stride;
  int n, k;           // output columns (kSwiglu: per half), reduction length (% 64 == 0)
  int n_tiles;        // column tiles: kSwiglu n / 64, else ceil(n / 128)
  const int4* tiles;  // grouped: (group, row_begin, row_end, -), *tile_count valid entries
  const int* tile_count;
  int rows;  // dense (tiles == null): one group of `rows` rows
  float* out_f32;
  bf16* out_bf16;
  const int* out_index;  // kStoreF32: output row of p = out_index[p], or p * out_mul + out_add
  int out_mul, out_add;
  int ldo;  // output row stride, elements
};

int column_tiles(int n, GemmEpilogue epi) {
  return epi == GemmEpilogue::kSwiglu ? n / (kBN / 2) : ceil_div(n, kBN);
}

template <int kBM>
constexpr size_t gemm_smem_bytes() {
  return static_cast<size_t>(kStages) * (kBM + kBN) * kBK * sizeof(bf16);
}

// Element offset of 16-byte chunk `chunk` (0..7) of row `row` in a [rows][64] bf16 tile: chunk
// XOR (row % 8), so the 8 rows an ldmatrix phase reads fall in 8 different bank groups.
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * kBK + ((chunk ^ (row & 7)) << 3);
}

template <int kBM, GemmEpilogue kEpi>
__global__ void __launch_bounds__(kBM * 2, kBM == 128 ? 2 : 3)
    grouped_gemm_kernel(const GroupedGemmParams p) {
  constexpr int kThreads = kBM * 2;
  constexpr int kRowsPerPass = kThreads / 8;  // rows one pass of 16-byte chunks covers
  constexpr int kAPasses = kBM / kRowsPerPass;
  constexpr int kBPasses = kBN / kRowsPerPass;
  constexpr bool kSwiglu = kEpi == GemmEpilogue::kSwiglu;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* smem_a = reinterpret_cast<bf16*>(smem_raw);  // [kStages][kBM][kBK]
  bf16* smem_b = smem_a + kStages * kBM * kBK;       // [kStages][kBN][kBK]

  const int tile = blockIdx.x / p.n_tiles, col_tile = blockIdx.x % p.n_tiles;
  int group = 0, row0, row1;
  if (p.tiles != nullptr) {
    if (tile >= *p.tile_count) return;  // beyond this call's tiles (grid = upper bound)
    const int4 t = p.tiles[tile];
    group = t.x;
    row0 = t.y;
    row1 = t.z;
  } else {
    row0 = tile * kBM;
    row1 = min(p.rows, row0 + kBM);
  }
  const bf16* w = p.w + static_cast<size_t>(group) * p.w_stride;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int warp_m = warp / 2, warp_n = warp % 2;

  // This thread's copies: chunk tid % 8 of tile rows tid / 8 + i * kRowsPerPass. Invalid rows
  // (past the group's rows, or past n) copy 0 bytes: zeros. Registers are the limit here, so the
  // A source rows sit in shared memory (-1: none) and B keeps one base pointer (regular rows).
  __shared__ int a_rows[kBM];
  const int chunk = tid % 8;
  if (tid < kBM) {
    const int gp = row0 + tid;
    a_rows[tid] = gp < row1 ? (p.a_index != nullptr ? p.a_index[gp] : gp) : -1;
  }
  __syncthreads();
  // SwiGLU: tile rows [0, 64) are gate rows col_tile 64 + r, [64, 128) up rows n + col_tile 64 +
  // r - 64; else tile row r is weight row col_tile 128 + r.
  const int b_first = (kSwiglu ? col_tile * (kBN / 2) : col_tile * kBN) + tid / 8;
  const bf16* b_src = w + static_cast<size_t>(b_first) * p.k + chunk * 8;
  unsigned b_ok = 0;  // n % 64 == 0 for SwiGLU: every row valid
#pragma unroll
  for (int i = 0; i < kBPasses; ++i)
    b_ok |= kSwiglu || b_first + i * kRowsPerPass < p.n ? 1u << i : 0u;
  auto load_stage = [&](int stage, int kt) {
    bf16* sa = smem_a + stage * kBM * kBK;
    bf16* sb = smem_b + stage * kBN * kBK;
    const int k0 = kt * kBK + chunk * 8;
#pragma unroll
    for (int i = 0; i < kAPasses; ++i) {
      const int r = tid / 8 + i * kRowsPerPass, row = a_rows[r];
      detail::cp_async_16(sa + swizzle(r, chunk), p.a + static_cast<size_t>(max(row, 0)) * p.k + k0,
                          row >= 0 ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < kBPasses; ++i) {
      const int r = tid / 8 + i * kRowsPerPass;
      const bool up = kSwiglu && i * kRowsPerPass >= kBN / 2;  // compile-time per i
      const int skip = up ? p.n - kBN / 2 : 0;
      const bool ok = b_ok >> i & 1u;
      const bf16* src = ok ? b_src + static_cast<size_t>(i * kRowsPerPass + skip) * p.k : w;
      detail::cp_async_16(sb + swizzle(r, chunk), src + kt * kBK, ok ? 16 : 0);
    }
  };

  // Warp tile 32 rows x 8 n8 column fragments. SwiGLU: fragments 0-3 gate columns
  // [warp_n 32, +32) of the 64, 4-7 the up rows of the same columns; else columns [warp_n 64, +64).
  // b_row(q): first tile row of fragment pair q (fragments 2q, 2q + 1: 16 consecutive rows).
  auto b_row = [&](int q) {
    return kSwiglu ? (q < 2 ? 0 : kBN / 2) + warp_n * 32 + (q % 2) * 16 : warp_n * 64 + q * 16;
  };
  float acc[2][8][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int f = 0; f < 8; ++f)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mi][f][c] = 0.0f;

  // ldmatrix addresses (shared-state space, bytes): every row a lane addresses is = lane (mod 8),
  // so its swizzle is chunk ^ (lane % 8) for all of them.
  const uint32_t stage_a0 = detail::smem_addr(smem_a), stage_b0 = detail::smem_addr(smem_b);
  const uint32_t a_ld = (warp_m * 32 + lane % 16) * kBK * 2;
  const uint32_t b_ld = (b_row(0) + lane % 8 + (lane / 16) * 8) * kBK * 2;
  const int a_chunk = lane / 16, b_chunk = (lane / 8) % 2, xor_row = lane % 8;

  const int k_tiles = p.k / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    detail::cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    detail::cp_async_wait<kStages - 2>();  // stage kt landed (this thread's copies)
    __syncthreads();  // everyone's copies landed; everyone finished reading stage kt - 1
    const int next = kt + kStages - 1;
    if (next < k_tiles) load_stage(next % kStages, next);
    detail::cp_async_commit();
    const uint32_t sa = stage_a0 + (kt % kStages) * (kBM * kBK * 2) + a_ld;
    const uint32_t sb = stage_b0 + (kt % kStages) * (kBN * kBK * 2) + b_ld;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[2][4], bf[4][4];
      const uint32_t a_col = ((kk * 2 + a_chunk) ^ xor_row) * 16;
      const uint32_t b_col = ((kk * 2 + b_chunk) ^ xor_row) * 16;
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)  // matrices: rows 0-7, 8-15 at k 0-7, then at k 8-15
        detail::ldmatrix_x4(af[mi], sa + mi * 16 * kBK * 2 + a_col);
#pragma unroll
      for (int q = 0; q < 4; ++q)  // matrices: n rows 0-7 at k 0-7, 8-15; n rows 8-15 likewise
        detail::ldmatrix_x4(bf[q], sb + (b_row(q) - b_row(0)) * kBK * 2 + b_col);
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int f = 0; f < 8; ++f)
          detail::mma_16816(acc[mi][f], af[mi][0], af[mi][1], af[mi][2], af[mi][3],
                            bf[f / 2][(f % 2) * 2], bf[f / 2][(f % 2) * 2 + 1]);
    }
  }
  detail::cp_async_wait<0>();

  // Fragment element c of acc[mi][f]: row lane / 4 (+ 8 for c >= 2), column 2 (lane % 4) + c % 2.
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int gp = row0 + warp_m * 32 + mi * 16 + lane / 4 + h * 8;
      if (gp >= row1) continue;
      if constexpr (kSwiglu) {
        bf16* out = p.out_bf16 + static_cast<size_t>(gp) * p.ldo;
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          const int col = col_tile * (kBN / 2) + warp_n * 32 + f * 8 + (lane % 4) * 2;
          const float g0 = acc[mi][f][2 * h], g1 = acc[mi][f][2 * h + 1];
          const float u0 = acc[mi][f + 4][2 * h], u1 = acc[mi][f + 4][2 * h + 1];
          *reinterpret_cast<uint32_t*>(out + col) =
              detail::pack_bf16x2(g0 / (1.0f + __expf(-g0)) * u0, g1 / (1.0f + __expf(-g1)) * u1);
        }
      } else {
        const int orow = p.out_index != nullptr ? p.out_index[gp] : gp * p.out_mul + p.out_add;
        float* out = p.out_f32 + static_cast<size_t>(orow) * p.ldo;
#pragma unroll
        for (int f = 0; f < 8; ++f) {
          const int col = col_tile * kBN + warp_n * 64 + f * 8 + (lane % 4) * 2;
          if (col < p.n)
            *reinterpret_cast<float2*>(out + col) =
                make_float2(acc[mi][f][2 * h], acc[mi][f][2 * h + 1]);
        }
      }
    }
  }
}

// Launches over `max_tiles` row tiles (grouped: an upper bound, the surplus exits at once).
template <int kBM, GemmEpilogue kEpi>
void launch_gemm(GroupedGemmParams p, int max_tiles, cudaStream_t stream) {
  // > 48 KB of dynamic shared memory needs an opt-in, per device (tensor-parallel engines of one
  // process use several): once for each device this instantiation meets. The largest carveout
  // keeps 2 (kBM 128) or 3 (kBM 64) blocks resident per SM; the kernel needs little L1.
  static std::atomic<uint64_t> configured{0};
  int device = 0;
  TS_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = uint64_t{1} << (device % 64);
  if ((configured.load() & bit) == 0) {
    TS_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_kernel<kBM, kEpi>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(gemm_smem_bytes<kBM>())));
    TS_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_kernel<kBM, kEpi>,
                                       cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
    configured.fetch_or(bit);
  }
  p.n_tiles = column_tiles(p.n, kEpi);
  if (max_tiles <= 0) return;
  detail::launch(grouped_gemm_kernel<kBM, kEpi>, dim3(max_tiles * p.n_tiles), dim3(kBM * 2),
                 gemm_smem_bytes<kBM>(), stream, false, p);
}

// Dense GEMM of m rows: 128-row tiles once they still give two blocks per SM of an H200 (132
// SMs), else 64 (more blocks for the SMs).
int dense_tile_rows(int m, int n, GemmEpilogue epi) {
  return (m / 128) * column_tiles(n, epi) >= 2 * 132 ? 128 : 64;
}

template <GemmEpilogue kEpi>
void launch_gemm(const GroupedGemmParams& p, int bm, int max_tiles, cudaStream_t stream) {
  if (bm == 128)
    launch_gemm<128, kEpi>(p, max_tiles, stream);
  else
    launch_gemm<64, kEpi>(p, max_tiles, stream);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// launcher

size_t moe_prefill_workspace_bytes(int m, const MoeShape& shape) {
  return carve(nullptr, m, shape).bytes;
}

void moe_prefill(const bf16* x, const MoeWeights& weights, int m, const MoeShape& shape,
                 void* workspace, bf16* out, cudaStream_t stream, const MoeRouting& routing) {
  TS_REQUIRE(x != nullptr && workspace != nullptr && out != nullptr, "null x, workspace or out");
  TS_REQUIRE(m >= 1, "m = " + std::to_string(m) + " < 1");
  detail::check_moe_shape("moe_prefill", shape, weights);
  TS_REQUIRE(routing.entry == nullptr, "moe_prefill takes no MoeRouting ring (moe_forward does)");
  TS_REQUIRE(static_cast<long long>(m) * shape.top_k <= (1LL << 22),
             "m * top_k = " + std::to_string(static_cast<long long>(m) * shape.top_k) +
                 " above 2^22: call in chunks of rows");
  const PrefillWorkspace ws = carve(workspace, m, shape);
  const bool shared = shape.shared_inter > 0;
  const int E = shape.num_experts, K = shape.top_k, H = shape.hidden;
  const int EI = shape.expert_inter, SI = shape.shared_inter;
  const int range_begin = shape.expert_begin, range_end = shape.range_end();
  const int range = range_end - range_begin;
  const int route_blocks = ceil_div(m, kRouteRows);
  const int bm = tile_rows(m, shape);
  const int pairs = m * K;
  const int max_expert_tiles = ceil_div(pairs, bm) + std::min(range, pairs);

  GroupedGemmParams router = {};
  router.a = x;
  router.w = weights.router;
  router.n = E;
  router.k = H;
  router.rows = m;
  router.out_f32 = ws.logits;
  router.out_mul = 1;
  router.ldo = E;
  launch_gemm<64, GemmEpilogue::kStoreF32>(router, ceil_div(m, 64), stream);

  detail::launch(moe_prefill_route_kernel, dim3(route_blocks), dim3(kRouteThreads), 0, stream,
                 false, static_cast<const float*>(ws.logits), m, E, K, shape.renormalize,
                 range_begin, range, ws.ids, ws.weights, ws.counts, routing.topk_ids,
                 routing.topk_weights);
  detail::launch(moe_prefill_scan_kernel, dim3(1), dim3(kScanThreads), 0, stream, false, ws.counts,
                 route_blocks, range, bm, ws.tiles, ws.tile_count);
  detail::launch(moe_prefill_scatter_kernel, dim3(route_blocks), dim3(kScatterThreads), 0, stream,
                 false, static_cast<const int*>(ws.ids), m, K, range_begin, range,
                 static_cast<const int*>(ws.counts), ws.perm_token, ws.perm_out);

  GroupedGemmParams up = {};
  up.a = x;
  up.a_index = ws.perm_token;
  up.w = weights.gate_up;
  up.w_stride = static_cast<size_t>(2) * EI * H;
  up.n = EI;
  up.k = H;
  up.tiles = ws.tiles;
  up.tile_count = ws.tile_count;
  up.out_bf16 = ws.act;
  up.ldo = EI;
  launch_gemm<GemmEpilogue::kSwiglu>(up, bm, max_expert_tiles, stream);

  GroupedGemmParams down = {};
  down.a = ws.act;
  down.w = weights.down;
  down.w_stride = static_cast<size_t>(H) * EI;
  down.n = H;
  down.k = EI;
  down.tiles = ws.tiles;
  down.tile_count = ws.tile_count;
  down.out_f32 = ws.y;
  down.out_index = ws.perm_out;
  down.ldo = H;
  launch_gemm<GemmEpilogue::kStoreF32>(down, bm, max_expert_tiles, stream);

  if (shared) {
    GroupedGemmParams sup = {};
    sup.a = x;
    sup.w = weights.shared_gate_up;
    sup.n = SI;
    sup.k = H;
    sup.rows = m;
    sup.out_bf16 = ws.act_shared;
    sup.ldo = SI;
    const int sup_bm = dense_tile_rows(m, SI, GemmEpilogue::kSwiglu);
    launch_gemm<GemmEpilogue::kSwiglu>(sup, sup_bm, ceil_div(m, sup_bm), stream);
    GroupedGemmParams sdown = {};
    sdown.a = ws.act_shared;
    sdown.w = weights.shared_down;
    sdown.n = H;
    sdown.k = SI;
    sdown.rows = m;
    sdown.out_f32 = ws.y;
    sdown.out_mul = K + 1;
    sdown.out_add = K;
    sdown.ldo = H;
    const int sdown_bm = dense_tile_rows(m, H, GemmEpilogue::kStoreF32);
    launch_gemm<GemmEpilogue::kStoreF32>(sdown, sdown_bm, ceil_div(m, sdown_bm), stream);
  }

  detail::launch(detail::moe_combine_kernel, dim3(m), dim3(detail::kMoeCombineThreads), 0, stream,
                 false, static_cast<const float*>(ws.y), static_cast<const int*>(ws.ids),
                 static_cast<const float*>(ws.weights), K, range_begin, range_end, shared, H, out);
}

}  // namespace twinstep::kernels
