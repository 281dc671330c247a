#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/attention.h"
#include "kernels/attention_split.h"
#include "kernels/attention_tile.cuh"
#include "kernels/device.cuh"
#include "kernels/rope_math.cuh"
#include "kernels/tuning.h"

namespace twinstep::kernels {

namespace {

using namespace attn;

constexpr int kSplitThreads = kThreadsPerRowTile;  // per 16-row query tile
constexpr int kMaxRows = 64;                       // query rows per (request, kv head)
constexpr int kMaxSplits = 1024;                   // splits per (request, kv head)
constexpr size_t kTileBytes = 2 * size_t{kTileElems} * sizeof(bf16);  // one K + V stage, 32 KB

struct SplitParams {
  const bf16* q;
  KvCache cache;
  int layer;
  const int* ctx_lens;
  int q_len, num_q_heads, group, rows;  // rows = group * q_len
  // Split s covers tokens [s * split_tokens, (s + 1) * split_tokens) clipped to ctx + q_len, the
  // last split up to ctx + q_len; a split starting at or past ctx + q_len is empty.
  int split_tokens, num_splits;
  float scale_log2;  // softmax_scale * log2(e)
  // part_o [request][head][split][row][128], unnormalised, relative to part_ml.m;
  // part_ml [request][head][split][row] = (max in log2 units, sum of exp2).
  float* part_o;
  float2* part_ml;
  bool skip_math;             // benchmark diagnostic: stream K/V, skip the tile math
  bool full_ring;             // all 3 stages in the prologue (AttentionTuning::split_full_ring)
  unsigned long long* trace;  // benchmark only, read by the kTrace instantiations (attention.h)
  int prewait_tiles;          // benchmark only, kTrace instantiations: AttentionTuning's cap
};

// One block's benchmark timeline (attention.h's trace layout), written by thread 0; in the
// default instantiations (kTrace false) it is empty and generates no code.
template <bool kTrace>
struct BlockTrace {
  unsigned long long* slot = nullptr;
  __device__ __forceinline__ BlockTrace(unsigned long long* trace, int layer, int first_slot) {
    if constexpr (kTrace) {
      const int index =
          first_slot +
          static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
      slot = trace + (static_cast<size_t>(layer) * kAttentionTraceSlotsPerLayer + index) *
                         kAttentionTraceWords;
      if (threadIdx.x == 0) {
        slot[kTraceSm] = detail::sm_id();
        slot[kTraceEntry] = detail::global_timer_ns();
      }
    }
  }
  __device__ __forceinline__ void mark(AttentionTraceWord word) const {
    if constexpr (kTrace)
      if (threadIdx.x == 0) slot[word] = detail::global_timer_ns();
  }
};

// The split kernel's parameters in decode_attention_rope (q unused): the qkv projection's output
// and rope_kv_append's table. A separate type, so the other kernels' parameters stay as they were.
struct RopeSplitParams : SplitParams {
  const bf16* qkv;
  RopeTable rope;
};

// Q row `row` (= j * group + g) of kv head `head`.
__device__ __forceinline__ size_t q_offset(const SplitParams& p, int request, int head, int row) {
  const int j = row / p.group, g = row % p.group;
  return ((static_cast<size_t>(request) * p.q_len + j) * p.num_q_heads + head * p.group + g) *
         kHeadDim;
}

// A block's split: token range [t_begin, t_end) (clipped to ctx + q_len) and its head's K/V
// rows. Reads only ctx_lens and request_base, so it may run before the PDL wait.
struct SplitView {
  int ctx, t_begin, t_end, num_tiles;
  const bf16* k_base;
  const bf16* v_base;

  __device__ __forceinline__ SplitView(const SplitParams& p, int split, int head, int request) {
    ctx = p.ctx_lens[request];  // not written by the preceding kernel (contract)
    const int total = ctx + p.q_len;
    t_begin = split * p.split_tokens;
    // The last arm never runs (grid.x = num_splits). Kept: a two-arm form compiles to a different
    // schedule and register allocation, not measured on the GPU.
    t_end = split + 1 < p.num_splits ? min(t_begin + p.split_tokens, total)
            : split < p.num_splits   ? total
                                     : t_begin;
    num_tiles = t_end > t_begin ? (t_end - t_begin + kTileTokens - 1) / kTileTokens : 0;
    const bf16* base = p.cache.request_base[request];
    k_base = base + kv_offset(p.cache, p.layer, 0, head);
    v_base = base + kv_offset(p.cache, p.layer, 1, head);
  }
  // End of the keys visible to query row `row` (= j * group + g; padding rows act as the last
  // query): positions < ctx + j + 1, inside the split.
  __device__ __forceinline__ int key_limit(const SplitParams& p, int row) const {
    return min(ctx + min(row / p.group, p.q_len - 1) + 1, t_end);
  }
  // cp.async copies of tile `tile` of the split into a K + V stage (kThreads threads).
  template <int kThreads>
  __device__ __forceinline__ void issue_tile(bf16* stage, int tile) const {
    issue_kv_tile<kThreads>(stage, stage + kTileElems, k_base, v_base, t_begin + tile * kTileTokens,
                            t_end, t_begin);
  }
};

// ---------------------------------------------------------------------------------------------
// kernels: split + combine (the pair of 179ce97)

// Block = (split, kv head, request), 3-stage cp.async ring of 64-token tiles, the 4 sub-warps of
// each row tile merged in order; writes the split's partial to the workspace.
// p.full_ring (AttentionTuning::split_full_ring): the prologue issues all 3 stages (tiles made
// only of tokens older than ctx before the PDL wait), else 2 (179ce97); the steady state is the
// same (2 tiles in flight while one is consumed). kQSmem (split_q_smem): Q is staged in shared
// memory (rows padded to 16 with zeros) and re-read per tile instead of held in 32 registers per
// thread, which removes the 128-register spill of 8- and 16-warp blocks. Neither changes a bit
// of the result.
// kRope (decode_attention_rope, with kQSmem): Q rotated from p.qkv into shared memory, and the
// new tokens of this split (positions >= ctx) rotated / copied from p.qkv into the cache right
// after the dependency wait, before any tile holding them is issued (rope_kv_append's work).
// kTrace: the benchmark's timeline instantiation (AttentionTuning::trace).
template <int kRowTiles, bool kQSmem, bool kRope = false, bool kTrace = false>
__global__ void __launch_bounds__(kSplitThreads* kRowTiles, kRowTiles <= 2 ? 2 : 1)
    attention_split_kernel(const std::conditional_t<kRope, RopeSplitParams, SplitParams> p) {
  static_assert(!kRope || kQSmem, "the fused rope writes Q into shared memory");
  constexpr int kStages = 3;
  constexpr int kThreads = kSplitThreads * kRowTiles;
  constexpr int kRows = kRowTiles * 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);
  bf16* q_smem = smem + kStages * 2 * kTileElems;  // kQSmem: [kRows][128], swizzled like K

  const BlockTrace<kTrace> trace(p.trace, p.layer, 0);
  const int split = blockIdx.x, head = blockIdx.y, request = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tq = lane % 4;
  const SplitView view(p, split, head, request);
  if (view.num_tiles == 0) {  // nothing to attend in this split; the combine skips it
    detail::pdl_wait_and_trigger();
    trace.mark(kTraceExit);
    return;
  }
  const int ctx = view.ctx, t_begin = view.t_begin;
  const int num_tiles = view.num_tiles;
  auto issue_tile = [&](int tile) {
    view.issue_tile<kThreads>(smem + (tile % kStages) * 2 * kTileElems, tile);
  };

  // Prologue: `prologue` commit groups (tiles 0 .. prologue - 1; empty past the split). Tiles made
  // only of tokens older than this step go before the dependency wait (the preceding kernel
  // appends tokens >= ctx only).
  const bool full = p.full_ring;
  const int prologue = full ? kStages : kStages - 1;
  const int prewait = kTrace && p.prewait_tiles >= 0 ? min(prologue, p.prewait_tiles) : prologue;
  int issued = 0;
  while (issued < min(num_tiles, prewait) && t_begin + (issued + 1) * kTileTokens <= ctx) {
    issue_tile(issued++);
    detail::cp_async_commit();
  }
  trace.mark(kTraceIssued);
  detail::pdl_wait_and_trigger();
  trace.mark(kTraceWaited);
  if constexpr (kRope) {
    // rope_kv_append's work for this block, in items of P pairs (i, i + 64) spread over the
    // threads: the query rows of this KV head rotated into shared memory (padding rows zero), and
    // this split's new tokens (positions >= ctx): k rotated and v copied into the cache, which the
    // block's own cp.async copies of those rows read after the barrier. P = 2 where the rows give
    // under 4 pairs per thread (e.g. one query of group 4: the rotation's latency per thread is
    // what the step waits for), else 8 (16-byte loads and stores).
    const int qkv_stride = (p.num_q_heads + 2 * p.cache.num_kv_heads) * kHeadDim;
    const bf16* in_rows = p.qkv + static_cast<size_t>(request) * p.q_len * qkv_stride;
    const int first_new = max(ctx, t_begin), new_tokens = max(0, view.t_end - first_new);
    bf16* base = p.cache.request_base[request];
    bf16* k_dst = base + kv_offset(p.cache, p.layer, 0, head);
    bf16* v_dst = base + kv_offset(p.cache, p.layer, 1, head);
    auto rotate_all = [&](auto pairs) {
      constexpr int P = decltype(pairs)::value;
      using Vec = std::conditional_t<P == 8, uint4, unsigned>;
      static_assert(sizeof(Vec) == 2 * P);
      constexpr int kChunks = 64 / P;  // items per row
      const int q_items = p.rows * kChunks, k_items = new_tokens * kChunks;
      const int v_items = new_tokens * 16;
      for (int i = threadIdx.x; i < q_items + k_items + v_items; i += kThreads) {
        if (i < q_items + k_items) {
          const int pr = i % kChunks * P;
          const bf16* x;
          bf16* dst;
          int position;
          if (i < q_items) {
            const int row = i / kChunks, j = row / p.group, g = row % p.group;
            x = in_rows + j * qkv_stride + (head * p.group + g) * kHeadDim;
            dst = q_smem + smem_index(row, pr / 8) + pr % 8;
            position = ctx + j;
          } else {
            position = first_new + (i - q_items) / kChunks;
            if (position >= p.cache.capacity_tokens) continue;
            x = in_rows + (position - ctx) * qkv_stride + (p.num_q_heads + head) * kHeadDim;
            dst = k_dst + static_cast<size_t>(position) * kHeadDim + pr;
          }
          const Vec a = __ldg(reinterpret_cast<const Vec*>(x + pr));
          const Vec b = __ldg(reinterpret_cast<const Vec*>(x + pr + 64));
          Vec lo, hi;
          const bf16* x1 = reinterpret_cast<const bf16*>(&a);
          const bf16* x2 = reinterpret_cast<const bf16*>(&b);
#pragma unroll
          for (int e = 0; e < P; ++e)
            detail::rope_rotate_pair(__bfloat162float(x1[e]), __bfloat162float(x2[e]), position,
                                     p.rope.inv_freq[pr + e], reinterpret_cast<bf16*>(&lo) + e,
                                     reinterpret_cast<bf16*>(&hi) + e);
          // Dim pr + 64 is 64 elements on, in the cache row and in the swizzled Q row alike
          // (unit u + 8 sits at (u ^ swizzle) + 8: the swizzle leaves bit 3 alone).
          *reinterpret_cast<Vec*>(dst) = lo;
          *reinterpret_cast<Vec*>(dst + 64) = hi;
        } else {
          const int item = i - q_items - k_items, position = first_new + item / 16, u = item % 16;
          if (position >= p.cache.capacity_tokens) continue;
          *reinterpret_cast<uint4*>(v_dst + static_cast<size_t>(position) * kHeadDim + u * 8) =
              detail::load_16(in_rows + (position - ctx) * qkv_stride +
                              (p.num_q_heads + p.cache.num_kv_heads + head) * kHeadDim + u * 8);
        }
      }
    };
    if (p.rows * 64 >= 4 * kThreads)
      rotate_all(std::integral_constant<int, 8>{});
    else
      rotate_all(std::integral_constant<int, 2>{});
    for (int i = p.rows * 16 + threadIdx.x; i < kRows * 16; i += kThreads)
      *reinterpret_cast<uint4*>(q_smem + smem_index(i / 16, i % 16)) = make_uint4(0, 0, 0, 0);
    __threadfence_block();
    __syncthreads();
  }
  for (; issued < prologue; ++issued) {
    if (issued < num_tiles) issue_tile(issued);
    detail::cp_async_commit();
  }

  // Query fragments (k-permuted like gemv: lane holds 16 contiguous bytes of its row).
  const int row_tile = warp / kWarpsPerTile, sub = warp % kWarpsPerTile;
  const int row_a = row_tile * 16 + gid, row_b = row_a + 8;
  uint4 qa[4], qb[4];
  if constexpr (kRope) {
    // Q is in shared memory already (above).
  } else if constexpr (kQSmem) {
    // 16 bytes per thread and unit, every load issued before the first store (one L2 round trip
    // on the way to the first tile, not one per unit).
    constexpr int kQUnits = kRows * 16 / kThreads;
    static_assert(kRows * 16 % kThreads == 0);
    uint4 qv[kQUnits];
#pragma unroll
    for (int k = 0; k < kQUnits; ++k) {
      const int row = (threadIdx.x + k * kThreads) / 16, u = threadIdx.x % 16;
      qv[k] = row < p.rows ? detail::load_16(p.q + q_offset(p, request, head, row) + u * 8)
                           : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < kQUnits; ++k) {
      const int row = (threadIdx.x + k * kThreads) / 16, u = threadIdx.x % 16;
      *reinterpret_cast<uint4*>(q_smem + smem_index(row, u)) = qv[k];
    }
  } else {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      qa[c] = row_a < p.rows
                  ? detail::load_16(p.q + q_offset(p, request, head, row_a) + c * 32 + tq * 8)
                  : make_uint4(0, 0, 0, 0);
      qb[c] = row_b < p.rows
                  ? detail::load_16(p.q + q_offset(p, request, head, row_b) + c * 32 + tq * 8)
                  : make_uint4(0, 0, 0, 0);
    }
  }
  const int limit_a = view.key_limit(p, row_a), limit_b = view.key_limit(p, row_b);
  const int tok_base = sub * kWarpTokens;
  WarpAcc acc;
  warp_acc_init(acc);
  for (int tile = 0; tile < num_tiles; ++tile) {
    // Tile t is commit group t. 179ce97 ring: groups 0, 1 in the prologue, group t + 2 committed
    // at iteration t, so one group may stay pending. Full ring: groups 0 .. 2 in the prologue,
    // group t + 2 at iteration t >= 1, so two may stay pending at t = 0 and one after.
    if (full && tile == 0)
      detail::cp_async_wait<kStages - 1>();
    else
      detail::cp_async_wait<kStages - 2>();
    __syncthreads();  // tile visible to all warps; stage (tile - 1) % kStages consumed by all
    if (tile == 0) trace.mark(kTraceFirstTile);
    if (!full || tile > 0) {
      if (tile + kStages - 1 < num_tiles) issue_tile(tile + kStages - 1);
      detail::cp_async_commit();
    }
    if (p.skip_math) continue;
    if constexpr (kQSmem) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        qa[c] = *reinterpret_cast<const uint4*>(q_smem + smem_index(row_a, 4 * c + tq));
        qb[c] = *reinterpret_cast<const uint4*>(q_smem + smem_index(row_b, 4 * c + tq));
      }
    }
    const bf16* k_smem = smem + (tile % kStages) * 2 * kTileElems;
    attend_tile(acc, qa, qb, k_smem, k_smem + kTileElems, tok_base,
                t_begin + tile * kTileTokens + tok_base, limit_a, limit_b, p.scale_log2);
  }

  trace.mark(kTraceLastTile);
  // Combine the warps that share a row tile, in warp order, through shared memory.
  detail::cp_async_wait<0>();
  __syncthreads();
  float* o_smem = reinterpret_cast<float*>(smem_raw);  // [warp][16][kPartialStride]
  float2* ml_smem =
      reinterpret_cast<float2*>(o_smem + kRowTiles * kWarpsPerTile * 16 * kPartialStride);
  store_warp_partial(acc, o_smem, ml_smem);
  __syncthreads();
  // Thread (row0, d) merges rows row0, row0 + kRowTiles, ... (up to 16) in batches of
  // kMergeBatch independent merges, so their shared-memory loads and exp2s overlap instead of
  // running one row's dependent chain after another; a batch's rows past p.rows merge a valid
  // row again and are not stored. Each row's arithmetic is merge_warps' either way.
  constexpr int kMergeBatch = 4;
  const int d = threadIdx.x % kHeadDim;
  const size_t slot0 =
      ((static_cast<size_t>(request) * gridDim.y + head) * p.num_splits + split) * p.rows;
  for (int row0 = threadIdx.x / kHeadDim; row0 < p.rows; row0 += kMergeBatch * kRowTiles) {
    RowPartial r[kMergeBatch];
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i)
      r[i] = merge_warps(o_smem, ml_smem, min(row0 + i * kRowTiles, p.rows - 1), d);
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i) {
      const int row = row0 + i * kRowTiles;
      if (row >= p.rows) break;
      p.part_o[(slot0 + row) * kHeadDim + d] = r[i].o;
      if (d == 0) p.part_ml[slot0 + row] = make_float2(r[i].m, r[i].l);
    }
  }
  if constexpr (kTrace) {
    __syncthreads();
    trace.mark(kTraceExit);
  }
}

// Block = (row, kv head, request), thread = dimension: merges the splits in split order. All
// loads (split maxima/sums and the first kCombineBatch partial outputs) are issued before any is
// used; splits beyond those cost one dependent load each. Splits with no visible key are skipped,
// so trailing empty splits (other rows' causal tails) leave the result bit-identical. The form
// for launches of fewer than AttentionTuning::combine_parts_min_splits splits (and all of them with
// combine_parts off).
// kCtxEarly (AttentionTuning::combine_ctx_before_wait): the request's context length, which the
// preceding kernel does not write, is loaded before the dependency wait, so the partials' loads
// after it do not wait for that load first (same bits).
constexpr int kCombineBatch = 48;
template <bool kTrace = false, bool kCtxEarly = false>
__global__ void __launch_bounds__(kHeadDim)
    attention_combine_kernel(const SplitParams p, bf16* out, int trigger_mode) {
  __shared__ float2 ml[kMaxSplits];
  const BlockTrace<kTrace> trace(p.trace, p.layer, kAttentionTraceSplitSlots);
  int ctx_early = 0;
  if constexpr (kCtxEarly) ctx_early = p.ctx_lens[blockIdx.z];
  detail::pdl_small_wait(trigger_mode);
  trace.mark(kTraceWaited);
  const int row = blockIdx.x, head = blockIdx.y, request = blockIdx.z, d = threadIdx.x;
  const int total = (kCtxEarly ? ctx_early : p.ctx_lens[request]) + p.q_len;
  const int splits = min(p.num_splits, (total + p.split_tokens - 1) / p.split_tokens);
  const size_t slot0 =
      ((static_cast<size_t>(request) * gridDim.y + head) * p.num_splits) * p.rows + row;
  float ov[kCombineBatch];
#pragma unroll
  for (int s = 0; s < kCombineBatch; ++s)
    ov[s] = s < splits ? p.part_o[(slot0 + static_cast<size_t>(s) * p.rows) * kHeadDim + d] : 0.0f;
  for (int s = d; s < splits; s += kHeadDim)
    ml[s] = p.part_ml[slot0 + static_cast<size_t>(s) * p.rows];
  __syncthreads();
  float m_max = -INFINITY;
  for (int s = 0; s < splits; ++s) m_max = fmaxf(m_max, ml[s].x);
  float l_sum = 0.0f, o_sum = 0.0f;
#pragma unroll
  for (int s = 0; s < kCombineBatch; ++s) {
    if (s < splits && ml[s].x != -INFINITY) {
      const float scale = exp2f(ml[s].x - m_max);
      l_sum += ml[s].y * scale;
      o_sum += ov[s] * scale;
    }
  }
  for (int s = kCombineBatch; s < splits; ++s) {
    if (ml[s].x == -INFINITY) continue;
    const float scale = exp2f(ml[s].x - m_max);
    l_sum += ml[s].y * scale;
    o_sum += p.part_o[(slot0 + static_cast<size_t>(s) * p.rows) * kHeadDim + d] * scale;
  }
  const int j = row / p.group, g = row % p.group;
  out[((static_cast<size_t>(request) * p.q_len + j) * p.num_q_heads + head * p.group + g) *
          kHeadDim +
      d] = __float2bfloat16(o_sum / l_sum);
  trace.mark(kTraceExit);
}

// The combine of launches of many splits (AttentionTuning::combine_parts). Block = (row, kv head,
// request) of kCombineParts x 128 threads: thread (part, d) merges dimension d of the splits s =
// part, part + kCombineParts, ... (in that order, kCombineUnroll loads in flight), and the parts
// are added in part order. Each split's weight exp2(m_s - m_max) and its share of the softmax sum
// are computed once, by thread s % blockDim (m_max a block-wide max; the sum a per-thread sum in
// split order, then a fixed tree over the threads). So the per-split serial work is 1 /
// kCombineParts of the form above and no loop waits on shared memory per split. The order depends
// only on the split index, never on how many splits a row has: skipped splits (no visible key)
// contribute nothing, so trailing empty splits (other rows' causal tails) leave the result
// bit-identical, as above.
constexpr int kCombineParts = 4;
constexpr int kCombineThreads = kCombineParts * kHeadDim;
constexpr int kCombineUnroll = 8;
// kCtxEarly: as attention_combine_kernel's. (Loading 16 partials per thread ahead with it, every
// split of up to 64 in one batch, measured slower at 33 splits: round 23.)
template <bool kTrace = false, bool kCtxEarly = false>
__global__ void __launch_bounds__(kCombineThreads)
    attention_combine_parts_kernel(const SplitParams p, bf16* out, int trigger_mode) {
  __shared__ float weight[kMaxSplits];  // exp2(m_s - m_max); -1: split skipped
  __shared__ float reduce[kCombineThreads / 32];
  __shared__ float part_o[kCombineParts - 1][kHeadDim];
  const BlockTrace<kTrace> trace(p.trace, p.layer, kAttentionTraceSplitSlots);
  int ctx_early = 0;
  if constexpr (kCtxEarly) ctx_early = p.ctx_lens[blockIdx.z];
  detail::pdl_small_wait(trigger_mode);
  trace.mark(kTraceWaited);
  const int row = blockIdx.x, head = blockIdx.y, request = blockIdx.z, t = threadIdx.x;
  const int lane = t % 32, warp = t / 32;
  const int total = (kCtxEarly ? ctx_early : p.ctx_lens[request]) + p.q_len;
  const int splits = min(p.num_splits, (total + p.split_tokens - 1) / p.split_tokens);
  const size_t slot0 =
      ((static_cast<size_t>(request) * gridDim.y + head) * p.num_splits) * p.rows + row;
  constexpr int kPerThread = kMaxSplits / kCombineThreads;
  float2 ml[kPerThread];
  float m_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int s = t + i * kCombineThreads;
    ml[i] = s < splits ? p.part_ml[slot0 + static_cast<size_t>(s) * p.rows]
                       : make_float2(-INFINITY, 0.0f);
    m_max = fmaxf(m_max, ml[i].x);
  }
  // Partial outputs of this thread's first splits, loaded while the maximum is reduced.
  const int part = t / kHeadDim, d = t % kHeadDim;
  const float* o_col = p.part_o + slot0 * kHeadDim + d;
  const size_t o_stride = static_cast<size_t>(p.rows) * kHeadDim;  // between splits
  float ov[kCombineUnroll];
#pragma unroll
  for (int i = 0; i < kCombineUnroll; ++i) {
    const int s = part + i * kCombineParts;
    ov[i] = s < splits ? o_col[s * o_stride] : 0.0f;
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m_max = fmaxf(m_max, __shfl_xor_sync(~0u, m_max, off));
  if (lane == 0) reduce[warp] = m_max;
  __syncthreads();
  m_max = reduce[0];
#pragma unroll
  for (int w = 1; w < kCombineThreads / 32; ++w) m_max = fmaxf(m_max, reduce[w]);
  float l_part = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int s = t + i * kCombineThreads;
    if (s >= splits) continue;
    const bool skip = ml[i].x == -INFINITY;
    const float w = skip ? -1.0f : exp2f(ml[i].x - m_max);
    weight[s] = w;
    if (!skip) l_part += ml[i].y * w;
  }
  // The sum over threads: a fixed shuffle tree per warp, then the warps in order.
#pragma unroll
  for (int off = 16; off > 0; off /= 2) l_part += __shfl_xor_sync(~0u, l_part, off);
  __syncthreads();  // every thread has read reduce[] (the maximum) and written weight[]
  if (lane == 0) reduce[warp] = l_part;
  float o = 0.0f;
  for (int base = 0; base < splits; base += kCombineUnroll * kCombineParts) {
    float next[kCombineUnroll];
#pragma unroll
    for (int i = 0; i < kCombineUnroll; ++i) {
      const int s = base + kCombineUnroll * kCombineParts + part + i * kCombineParts;
      next[i] = s < splits ? o_col[s * o_stride] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kCombineUnroll; ++i) {
      const int s = base + part + i * kCombineParts;
      if (s < splits && weight[s] >= 0.0f) o += ov[i] * weight[s];
      ov[i] = next[i];
    }
  }
  if (part > 0) part_o[part - 1][d] = o;
  __syncthreads();
  if (part != 0) return;
  float l_sum = reduce[0];
#pragma unroll
  for (int w = 1; w < kCombineThreads / 32; ++w) l_sum += reduce[w];
#pragma unroll
  for (int q = 0; q < kCombineParts - 1; ++q) o += part_o[q][d];
  const int j = row / p.group, g = row % p.group;
  out[((static_cast<size_t>(request) * p.q_len + j) * p.num_q_heads + head * p.group + g) *
          kHeadDim +
      d] = __float2bfloat16(o / l_sum);
  trace.mark(kTraceExit);  // thread 0 is in part 0
}

int num_sms() {
  static const int count = [] {
    int device = 0, sms = 0;
    TS_CUDA_CHECK(cudaGetDevice(&device));
    TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return sms;
  }();
  return count;
}

// The split size (kernels/attention_split.h, the rule the simulator prices), with this device's SM
// count and the tuning's blocks per SM and rounding.
int split_tokens_for(const AttentionShape& shape, const KvCache& cache) {
  static_assert(kTileTokens == kAttentionTileTokens);
  const detail::AttentionTuning& tuning = detail::attention_tuning();
  return attention_partition(cache.capacity_tokens, shape.num_requests, cache.num_kv_heads,
                             num_sms(), tuning.ctas_per_sm, tuning.splits_within_one_wave)
      .split_tokens;
}

size_t round_up_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

size_t rows_of(const AttentionShape& shape, const KvCache& cache) {
  return static_cast<size_t>(shape.num_q_heads / std::max(cache.num_kv_heads, 1)) * shape.q_len;
}

// Workspace bytes: part_o, then part_ml at the next multiple of 256 bytes.
size_t partial_bytes(const AttentionShape& shape, const KvCache& cache) {
  const int split_tokens = split_tokens_for(shape, cache);
  const size_t splits = (cache.capacity_tokens + split_tokens - 1) / split_tokens;
  const size_t slots =
      static_cast<size_t>(shape.num_requests) * cache.num_kv_heads * splits * rows_of(shape, cache);
  return round_up_256(slots * kHeadDim * sizeof(float)) + slots * sizeof(float2);
}

// cudaLaunchKernelEx with PDL (optional) and, with AttentionTuning::carveout_max_shared and at
// most carveout_max_shared_rows token rows (requests x q_len), the largest shared-memory carveout:
// both attention kernels then run in the configuration the split kernel needs (~200 KB per SM), so
// the combine's blocks (and the next split's, under PDL) can be resident beside the previous
// kernel's instead of waiting for the SM to drain and switch its L1 / shared split. The row limit
// is for a chain whose next kernel needs L1 and never lets the SMs drain (see AttentionTuning).
template <typename... KernelArgs, typename... Args>
void launch_attention(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, bool pdl, int token_rows, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  int count = int(detail::add_carveout(attributes, 0));
  if (pdl) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  const detail::AttentionTuning& tuning = detail::attention_tuning();
  if (detail::kernel_tuning().carveout_percent < 0 && tuning.carveout_max_shared &&
      token_rows <= tuning.carveout_max_shared_rows) {
    attributes[count].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attributes[count++].val.sharedMemCarveout =
        static_cast<unsigned>(cudaSharedmemCarveoutMaxShared);
  }
  config.attrs = attributes;
  config.numAttrs = count;
  TS_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  TS_CUDA_CHECK(cudaGetLastError());
}

template <bool kQSmem, bool kRope = false, bool kTrace = false>
void run_split(const std::conditional_t<kRope, RopeSplitParams, SplitParams>& p, int row_tiles,
               dim3 grid, cudaStream_t stream, bool pdl) {
  const size_t ring =
      size_t{3} * kTileBytes + (kQSmem ? static_cast<size_t>(row_tiles) * 16 * kHeadDim * 2 : 0);
  const size_t smem = std::max(ring, warp_partials_bytes(row_tiles));
  static const bool configured = [] {
    for (auto kernel : {attention_split_kernel<1, kQSmem, kRope, kTrace>,
                        attention_split_kernel<2, kQSmem, kRope, kTrace>,
                        attention_split_kernel<3, kQSmem, kRope, kTrace>,
                        attention_split_kernel<4, kQSmem, kRope, kTrace>})
      TS_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024));
    return true;
  }();
  (void)configured;
  void (*kernels[4])(std::conditional_t<kRope, RopeSplitParams, SplitParams>) = {
      attention_split_kernel<1, kQSmem, kRope, kTrace>,
      attention_split_kernel<2, kQSmem, kRope, kTrace>,
      attention_split_kernel<3, kQSmem, kRope, kTrace>,
      attention_split_kernel<4, kQSmem, kRope, kTrace>};
  launch_attention(kernels[row_tiles - 1], grid, dim3(kSplitThreads * row_tiles), smem, stream, pdl,
                   static_cast<int>(grid.z) * p.q_len, p);
}

// rope: decode_attention_rope's split parameters (p and the rope fields), else null.
void run_two_launch(const SplitParams& p, const RopeSplitParams* rope, int row_tiles, dim3 grid,
                    bf16* out, cudaStream_t stream, bool pdl) {
  const detail::AttentionTuning& tuning = detail::attention_tuning();
  const bool traced = p.trace != nullptr;  // checked by the launcher: no rope, split_q_smem
  if (tuning.launch_split) {
    if (traced)
      run_split<true, false, true>(p, row_tiles, grid, stream, pdl);
    else if (rope != nullptr)
      run_split<true, true>(*rope, row_tiles, grid, stream, pdl);
    else if (tuning.split_q_smem)
      run_split<true>(p, row_tiles, grid, stream, pdl);
    else
      run_split<false>(p, row_tiles, grid, stream, pdl);
  }
  if (tuning.launch_combine) {
    const bool parts = tuning.combine_parts && p.num_splits >= tuning.combine_parts_min_splits;
    const bool early = tuning.combine_ctx_before_wait;
    auto* combine = traced ? (parts ? (early ? attention_combine_parts_kernel<true, true>
                                             : attention_combine_parts_kernel<true, false>)
                                    : (early ? attention_combine_kernel<true, true>
                                             : attention_combine_kernel<true, false>))
                           : (parts ? (early ? attention_combine_parts_kernel<false, true>
                                             : attention_combine_parts_kernel<false, false>)
                                    : (early ? attention_combine_kernel<false, true>
                                             : attention_combine_kernel<false, false>));
    launch_attention(
        combine, dim3(p.rows, grid.y, grid.z), dim3(parts ? kCombineThreads : kHeadDim), 0, stream,
        pdl, static_cast<int>(grid.z) * p.q_len, p, out, detail::small_kernel_trigger_mode());
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// launchers

size_t attention_workspace_bytes(const AttentionShape& shape, const KvCache& cache) {
  return partial_bytes(shape, cache);
}

int attention_num_splits(const AttentionShape& shape, const KvCache& cache) {
  TS_REQUIRE(shape.num_requests >= 1 && cache.num_kv_heads >= 1 && cache.capacity_tokens >= 1,
             "num_requests, num_kv_heads and capacity_tokens must be >= 1");
  const int split_tokens = split_tokens_for(shape, cache);
  return (cache.capacity_tokens + split_tokens - 1) / split_tokens;
}

namespace {

// decode_attention (q) or decode_attention_rope (qkv and rope; q null).
void launch_decode_attention(const char* launcher, const bf16* q, const bf16* qkv,
                             const RopeTable* rope, const KvCache& cache, int layer,
                             const int* ctx_lens, bf16* out, const AttentionShape& shape,
                             void* workspace, cudaStream_t stream, bool pdl) {
  auto require = [&](bool ok, const std::string& message) {
    if (!ok) throw_invalid_argument(launcher, message);
  };
  const bool fused = rope != nullptr;
  require((fused ? qkv : q) != nullptr && out != nullptr && ctx_lens != nullptr &&
              workspace != nullptr && cache.request_base != nullptr,
          std::string(fused ? "null qkv" : "null q") +
              ", out, ctx_lens, workspace or cache.request_base");
  require(!fused || detail::attention_tuning().split_q_smem,
          "needs AttentionTuning::split_q_smem (the fused rope writes Q into shared memory)");
  require(shape.num_requests >= 1, "num_requests must be >= 1");
  require(shape.q_len >= 1 && shape.q_len <= 16,
          "q_len = " + std::to_string(shape.q_len) + " outside [1, 16]");
  require(cache.num_kv_heads >= 1 && shape.num_q_heads % cache.num_kv_heads == 0,
          "num_q_heads = " + std::to_string(shape.num_q_heads) +
              " is not a multiple of num_kv_heads = " + std::to_string(cache.num_kv_heads));
  const int group = shape.num_q_heads / cache.num_kv_heads;
  require(group * shape.q_len <= kMaxRows,
          "group * q_len = " + std::to_string(group * shape.q_len) + " exceeds 64");
  require(layer >= 0 && layer < cache.num_layers, "layer out of range");
  require(cache.capacity_tokens >= shape.q_len, "capacity_tokens < q_len");
  const detail::AttentionTuning& tuning = detail::attention_tuning();
  require(
      split_tokens_for(shape, cache) * static_cast<int64_t>(kMaxSplits) >= cache.capacity_tokens,
      "capacity_tokens too large for 1024 splits");

  SplitParams p = {};
  p.q = q;
  p.cache = cache;
  p.layer = layer;
  p.ctx_lens = ctx_lens;
  p.q_len = shape.q_len;
  p.num_q_heads = shape.num_q_heads;
  p.group = group;
  p.rows = group * shape.q_len;
  p.scale_log2 = shape.softmax_scale * kLog2e;
  p.skip_math = tuning.skip_math;
  p.full_ring = tuning.split_full_ring;
  require(tuning.trace == nullptr || (!fused && tuning.split_q_smem),
          "AttentionTuning::trace needs decode_attention and split_q_smem");
  p.trace = tuning.trace;
  p.prewait_tiles = tuning.split_prewait_tiles;
  const int row_tiles = (p.rows + 15) / 16;
  unsigned char* partials = static_cast<unsigned char*>(workspace);
  p.part_o = reinterpret_cast<float*>(partials);
  p.split_tokens = split_tokens_for(shape, cache);
  p.num_splits = (cache.capacity_tokens + p.split_tokens - 1) / p.split_tokens;
  const size_t slots =
      static_cast<size_t>(shape.num_requests) * cache.num_kv_heads * p.num_splits * p.rows;
  p.part_ml = reinterpret_cast<float2*>(partials + round_up_256(slots * kHeadDim * 4));
  const int64_t split_blocks =
      static_cast<int64_t>(p.num_splits) * cache.num_kv_heads * shape.num_requests;
  require(p.trace == nullptr ||
              (split_blocks <= kAttentionTraceSplitSlots &&
               static_cast<int64_t>(p.rows) * cache.num_kv_heads * shape.num_requests <=
                   kAttentionTraceSlotsPerLayer - kAttentionTraceSplitSlots),
          "too many blocks for AttentionTuning::trace's layout");
  RopeSplitParams rp = {};
  if (fused) {
    static_cast<SplitParams&>(rp) = p;
    rp.qkv = qkv;
    rp.rope = *rope;
  }
  run_two_launch(p, fused ? &rp : nullptr, row_tiles,
                 dim3(p.num_splits, cache.num_kv_heads, shape.num_requests), out, stream, pdl);
}

}  // namespace

void decode_attention(const bf16* q, const KvCache& cache, int layer, const int* ctx_lens,
                      bf16* out, const AttentionShape& shape, void* workspace, cudaStream_t stream,
                      bool pdl) {
  launch_decode_attention(__func__, q, nullptr, nullptr, cache, layer, ctx_lens, out, shape,
                          workspace, stream, pdl);
}

void decode_attention_rope(const bf16* qkv, const KvCache& cache, int layer, const int* ctx_lens,
                           const RopeTable& rope, bf16* out, const AttentionShape& shape,
                           void* workspace, cudaStream_t stream, bool pdl) {
  launch_decode_attention(__func__, nullptr, qkv, &rope, cache, layer, ctx_lens, out, shape,
                          workspace, stream, pdl);
}

namespace detail {
AttentionTuning& attention_tuning() {
  static AttentionTuning tuning;
  return tuning;
}
}  // namespace detail

}  // namespace twinstep::kernels
