#include <algorithm>
#include <string>

#include "kernels/attention.h"
#include "kernels/device.cuh"
#include "kernels/tuning.h"

namespace twinstep::kernels {

namespace {

constexpr int kTileTokens = 64;
constexpr int kStages = 3;
constexpr int kSplitThreads = 128;  // 4 warps
constexpr int kTileElems = kTileTokens * kHeadDim;
constexpr size_t kSplitSmemBytes = size_t{kStages} * 2 * kTileElems * sizeof(bf16);  // 96 KB
constexpr int kMaxRows = 64;      // query rows per (request, kv head): group * q_len
constexpr int kMaxSplits = 1024;  // splits per (request, kv head)
constexpr float kLog2e = 1.4426950408889634f;

struct SplitParams {
  const bf16* q;
  KvCache cache;
  int layer;
  const int* ctx_lens;
  int q_len, num_q_heads, group, rows;  // rows = group * q_len
  int split_tokens, num_splits;
  float scale_log2;  // softmax_scale * log2(e)
  float* part_o;     // [request][split][row][128], unnormalised, relative to part_ml.m
  float2* part_ml;   // [request][split][row] = (max in log2 units, sum of exp2)
};

// Shared-memory tiles are [token][16 units of 16 bytes]; unit u of token t sits at
// u ^ swizzle(t), so ldmatrix (8 tokens, one unit) and the k-permuted 16-byte reads
// (tokens 2i, 2i+1 x units 4c..4c+3) both hit 32 distinct banks.
__device__ __forceinline__ int swizzle(int token) {
  return ((token & 1) << 2) | ((token >> 1) & 3);
}

__device__ __forceinline__ int smem_index(int token, int unit) {
  return token * kHeadDim + ((unit ^ swizzle(token)) * 8);
}

// ---------------------------------------------------------------------------------------------
// kernels

// Block = (split, kv head, request), 4 warps per 16-row tile of query rows (row = j * group + g).
// Warp (rt, sub) handles rows [16 rt, 16 rt + 16) and tokens [16 sub, 16 sub + 16) of every
// 64-token tile. The token partition and the merge order are the same for every row count, so a
// row's result does not depend on group * q_len (spec-verify rows match plain decode bit for bit).
template <int kRowTiles>
__global__ void __launch_bounds__(kSplitThreads* kRowTiles, kRowTiles <= 2 ? 2 : 1)
    attention_split_kernel(const SplitParams p) {
  constexpr int kWarpsPerTile = 4;
  constexpr int kThreads = kSplitThreads * kRowTiles;
  constexpr int kWarpTokens = kTileTokens / kWarpsPerTile;
  constexpr int kTokTiles = kWarpTokens / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);

  const int split = blockIdx.x, head = blockIdx.y, request = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tq = lane % 4;
  const int ctx = p.ctx_lens[request];  // not written by the preceding kernel (contract)
  const int total = ctx + p.q_len;
  const int t_begin = split * p.split_tokens;
  if (t_begin >= total) {  // nothing to attend in this split; the combine skips it
    detail::pdl_wait_and_trigger();
    return;
  }
  const int t_end = min(t_begin + p.split_tokens, total);
  const int num_tiles = (t_end - t_begin + kTileTokens - 1) / kTileTokens;
  const bf16* base = p.cache.request_base[request];
  const bf16* k_base = base + kv_offset(p.cache, p.layer, 0, head);
  const bf16* v_base = base + kv_offset(p.cache, p.layer, 1, head);

  auto issue_tile = [&](int tile) {
    bf16* k_smem = smem + (tile % kStages) * 2 * kTileElems;
    bf16* v_smem = k_smem + kTileElems;
    const int tok0 = t_begin + tile * kTileTokens;
#pragma unroll
    for (int i = 0; i < kTileElems / 8 / kThreads; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      const int t = idx / 16, u = idx % 16;
      const bool valid = tok0 + t < t_end;
      const size_t src = static_cast<size_t>(valid ? tok0 + t : t_begin) * kHeadDim + u * 8;
      detail::cp_async_16(k_smem + smem_index(t, u), k_base + src, valid ? 16 : 0);
      detail::cp_async_16(v_smem + smem_index(t, u), v_base + src, valid ? 16 : 0);
    }
  };

  // Prologue: tiles made only of tokens older than this step are prefetched before the
  // dependency wait (the preceding kernel appends tokens >= ctx only).
  const int prologue_tiles = min(num_tiles, kStages - 1);
  const bool early = t_begin + prologue_tiles * kTileTokens <= ctx;
  auto issue_prologue = [&] {
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < num_tiles) issue_tile(s);
      detail::cp_async_commit();
    }
  };
  if (early) issue_prologue();
  detail::pdl_wait_and_trigger();
  if (!early) issue_prologue();

  // Query fragments (k-permuted like gemv: lane holds 16 contiguous bytes of its row).
  const int row_tile = warp / kWarpsPerTile, sub = warp % kWarpsPerTile;
  const int row_a = row_tile * 16 + gid, row_b = row_a + 8;
  auto q_row = [&](int row) {
    const int j = row / p.group, g = row % p.group;
    return p.q +
           ((static_cast<size_t>(request) * p.q_len + j) * p.num_q_heads + head * p.group + g) *
               kHeadDim;
  };
  uint4 qa[4], qb[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    qa[c] =
        row_a < p.rows ? detail::load_16(q_row(row_a) + c * 32 + tq * 8) : make_uint4(0, 0, 0, 0);
    qb[c] =
        row_b < p.rows ? detail::load_16(q_row(row_b) + c * 32 + tq * 8) : make_uint4(0, 0, 0, 0);
  }
  // Keys visible to a row: positions < ctx + j + 1 (and inside this split).
  const int limit_a = min(ctx + min(row_a / p.group, p.q_len - 1) + 1, t_end);
  const int limit_b = min(ctx + min(row_b / p.group, p.q_len - 1) + 1, t_end);

  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  float o[kHeadDim / 8][4];
#pragma unroll
  for (int d = 0; d < kHeadDim / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;

  for (int tile = 0; tile < num_tiles; ++tile) {
    detail::cp_async_wait<kStages - 2>();
    __syncthreads();
    if (tile + kStages - 1 < num_tiles) issue_tile(tile + kStages - 1);
    detail::cp_async_commit();
    const bf16* k_smem = smem + (tile % kStages) * 2 * kTileElems;
    const bf16* v_smem = k_smem + kTileElems;
    const int tok_base = sub * kWarpTokens;

    float s[kTokTiles][4];
#pragma unroll
    for (int n = 0; n < kTokTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int n = 0; n < kTokTiles; ++n) {
        const int tok = tok_base + n * 8 + gid;
        const uint4 kv = *reinterpret_cast<const uint4*>(k_smem + smem_index(tok, 4 * c + tq));
        detail::mma_16816(s[n], qa[c].x, qb[c].x, qa[c].y, qb[c].y, kv.x, kv.y);
        detail::mma_16816(s[n], qa[c].z, qb[c].z, qa[c].w, qb[c].w, kv.z, kv.w);
      }

    // Mask, scale, online softmax (row a in s[n][0..1], row b in s[n][2..3]).
    const int tok_abs = t_begin + tile * kTileTokens + tok_base;
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int n = 0; n < kTokTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = tok_abs + n * 8 + 2 * tq + (e & 1);
        const bool visible = t < (e < 2 ? limit_a : limit_b);
        s[n][e] = visible ? s[n][e] * p.scale_log2 : -INFINITY;
        if (e < 2)
          mx_a = fmaxf(mx_a, s[n][e]);
        else
          mx_b = fmaxf(mx_b, s[n][e]);
      }
#pragma unroll
    for (int offset = 1; offset <= 2; offset *= 2) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, offset));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, offset));
    }
    const float new_a = fmaxf(m_run[0], mx_a), new_b = fmaxf(m_run[1], mx_b);
    const float base_a = new_a == -INFINITY ? 0.0f : new_a;
    const float base_b = new_b == -INFINITY ? 0.0f : new_b;
    const float alpha_a = exp2f(m_run[0] - base_a), alpha_b = exp2f(m_run[1] - base_b);
    m_run[0] = new_a;
    m_run[1] = new_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int n = 0; n < kTokTiles; ++n) {
      s[n][0] = exp2f(s[n][0] - base_a);
      s[n][1] = exp2f(s[n][1] - base_a);
      s[n][2] = exp2f(s[n][2] - base_b);
      s[n][3] = exp2f(s[n][3] - base_b);
      sum_a += s[n][0] + s[n][1];
      sum_b += s[n][2] + s[n][3];
    }
    l_run[0] = l_run[0] * alpha_a + sum_a;
    l_run[1] = l_run[1] * alpha_b + sum_b;
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d) {
      o[d][0] *= alpha_a;
      o[d][1] *= alpha_a;
      o[d][2] *= alpha_b;
      o[d][3] *= alpha_b;
    }

    // O += P V: P straight from the S accumulators (A layout), V via ldmatrix.trans.
#pragma unroll
    for (int ks = 0; ks < kTokTiles / 2; ++ks) {
      const uint32_t a0 = detail::pack_bf16x2(s[2 * ks][0], s[2 * ks][1]);
      const uint32_t a1 = detail::pack_bf16x2(s[2 * ks][2], s[2 * ks][3]);
      const uint32_t a2 = detail::pack_bf16x2(s[2 * ks + 1][0], s[2 * ks + 1][1]);
      const uint32_t a3 = detail::pack_bf16x2(s[2 * ks + 1][2], s[2 * ks + 1][3]);
      const int tok = tok_base + ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        uint32_t b[4];
        detail::ldmatrix_x4_trans(b, v_smem + smem_index(tok, 2 * dp + (lane >> 4)));
        detail::mma_16816(o[2 * dp], a0, a1, a2, a3, b[0], b[1]);
        detail::mma_16816(o[2 * dp + 1], a0, a1, a2, a3, b[2], b[3]);
      }
    }
  }

  // Combine the warps that share a row tile, in warp order, through shared memory.
  detail::cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int offset = 1; offset <= 2; offset *= 2) {
    l_run[0] += __shfl_xor_sync(0xffffffffu, l_run[0], offset);
    l_run[1] += __shfl_xor_sync(0xffffffffu, l_run[1], offset);
  }
  float* o_smem = reinterpret_cast<float*>(smem_raw);  // [warp][16][128]
  float2* ml_smem = reinterpret_cast<float2*>(o_smem + kRowTiles * 4 * 16 * kHeadDim);
#pragma unroll
  for (int d = 0; d < kHeadDim / 8; ++d) {
    const int col = d * 8 + 2 * tq;
    float* ra = o_smem + (warp * 16 + gid) * kHeadDim + col;
    float* rb = o_smem + (warp * 16 + gid + 8) * kHeadDim + col;
    ra[0] = o[d][0];
    ra[1] = o[d][1];
    rb[0] = o[d][2];
    rb[1] = o[d][3];
  }
  if (tq == 0) {
    ml_smem[warp * 16 + gid] = make_float2(m_run[0], l_run[0]);
    ml_smem[warp * 16 + gid + 8] = make_float2(m_run[1], l_run[1]);
  }
  __syncthreads();
  const int d = threadIdx.x % kHeadDim;
  for (int row = threadIdx.x / kHeadDim; row < p.rows; row += kRowTiles) {
    const int rt = row / 16, r = row % 16;
    float m_max = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarpsPerTile; ++w)
      m_max = fmaxf(m_max, ml_smem[(rt * kWarpsPerTile + w) * 16 + r].x);
    float l_sum = 0.0f, o_sum = 0.0f;
    if (m_max != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarpsPerTile; ++w) {
        const int ww = rt * kWarpsPerTile + w;
        const float2 ml = ml_smem[ww * 16 + r];
        if (ml.x == -INFINITY) continue;  // a warp that saw no key adds nothing (not even +0)
        const float scale = exp2f(ml.x - m_max);
        l_sum += ml.y * scale;
        o_sum += o_smem[(ww * 16 + r) * kHeadDim + d] * scale;
      }
    }
    const size_t slot =
        ((static_cast<size_t>(request) * gridDim.y + head) * p.num_splits + split) * p.rows + row;
    p.part_o[slot * kHeadDim + d] = o_sum;
    if (d == 0) p.part_ml[slot] = make_float2(m_max, l_sum);
  }
}

// Block = (row, kv head, request), thread = dimension: merges the splits in split order. All
// loads (split maxima/sums and the first kCombineBatch partial outputs) are issued before any is
// used, so the kernel costs about one L2 round trip. Splits with no visible key are skipped, so
// trailing empty splits (other rows' causal tails) leave the result bit-identical.
constexpr int kCombineBatch = 48;
__global__ void __launch_bounds__(kHeadDim)
    attention_combine_kernel(const SplitParams p, bf16* out, bool early_trigger) {
  __shared__ float2 ml[kMaxSplits];
  if (early_trigger)
    detail::pdl_trigger_then_wait();
  else
    detail::pdl_wait_and_trigger();
  const int row = blockIdx.x, head = blockIdx.y, request = blockIdx.z, d = threadIdx.x;
  const int total = p.ctx_lens[request] + p.q_len;
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

// Split size: a multiple of 64 tokens chosen from the capacity, the request count and the KV head
// count (never from q_len or the live lengths), so that about ctas_per_sm blocks per SM run when
// the cache is full. Results depend on it at rounding level; for one cache and batch it is fixed,
// so a verify pass and plain decode steps split the context identically.
int split_tokens_for(const AttentionShape& shape, const KvCache& cache) {
  const int blocks_per_split = shape.num_requests * cache.num_kv_heads;
  const int target_blocks = detail::attention_tuning().ctas_per_sm * num_sms();
  const int target_splits = std::max(1, (target_blocks + blocks_per_split - 1) / blocks_per_split);
  const int tokens = (cache.capacity_tokens + target_splits - 1) / target_splits;
  return std::max(kTileTokens, (tokens + kTileTokens - 1) / kTileTokens * kTileTokens);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// launchers

size_t attention_workspace_bytes(const AttentionShape& shape, const KvCache& cache) {
  const int split_tokens = split_tokens_for(shape, cache);
  const size_t splits = (cache.capacity_tokens + split_tokens - 1) / split_tokens;
  const size_t rows =
      static_cast<size_t>(shape.num_q_heads / std::max(cache.num_kv_heads, 1)) * shape.q_len;
  const size_t slots = static_cast<size_t>(shape.num_requests) * cache.num_kv_heads * splits * rows;
  return slots * (kHeadDim * sizeof(float) + sizeof(float2));
}

void decode_attention(const bf16* q, const KvCache& cache, int layer, const int* ctx_lens,
                      bf16* out, const AttentionShape& shape, void* workspace, cudaStream_t stream,
                      bool pdl) {
  TS_REQUIRE(q != nullptr && out != nullptr && ctx_lens != nullptr && workspace != nullptr &&
                 cache.request_base != nullptr,
             "null q, out, ctx_lens, workspace or cache.request_base");
  TS_REQUIRE(shape.num_requests >= 1, "num_requests must be >= 1");
  TS_REQUIRE(shape.q_len >= 1 && shape.q_len <= 16,
             "q_len = " + std::to_string(shape.q_len) + " outside [1, 16]");
  TS_REQUIRE(cache.num_kv_heads >= 1 && shape.num_q_heads % cache.num_kv_heads == 0,
             "num_q_heads = " + std::to_string(shape.num_q_heads) +
                 " is not a multiple of num_kv_heads = " + std::to_string(cache.num_kv_heads));
  const int group = shape.num_q_heads / cache.num_kv_heads;
  TS_REQUIRE(group * shape.q_len <= kMaxRows,
             "group * q_len = " + std::to_string(group * shape.q_len) + " exceeds 64");
  TS_REQUIRE(layer >= 0 && layer < cache.num_layers, "layer out of range");
  TS_REQUIRE(cache.capacity_tokens >= shape.q_len, "capacity_tokens < q_len");
  TS_REQUIRE(
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
  p.split_tokens = split_tokens_for(shape, cache);
  p.num_splits = (cache.capacity_tokens + p.split_tokens - 1) / p.split_tokens;
  p.scale_log2 = shape.softmax_scale * kLog2e;
  const size_t slots =
      static_cast<size_t>(shape.num_requests) * cache.num_kv_heads * p.num_splits * p.rows;
  p.part_o = static_cast<float*>(workspace);
  p.part_ml = reinterpret_cast<float2*>(p.part_o + slots * kHeadDim);

  const dim3 grid(p.num_splits, cache.num_kv_heads, shape.num_requests);
  const int row_tiles = (p.rows + 15) / 16;
  const size_t merge_bytes = static_cast<size_t>(row_tiles) * 4 * 16 * (kHeadDim * 4 + 8);
  const size_t smem = std::max(kSplitSmemBytes, merge_bytes);
  static const bool configured = [] {  // > 48 KB of dynamic shared memory needs an opt-in
    for (auto kernel : {attention_split_kernel<1>, attention_split_kernel<2>,
                        attention_split_kernel<3>, attention_split_kernel<4>})
      TS_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024));
    return true;
  }();
  (void)configured;
  const detail::AttentionTuning& tuning = detail::attention_tuning();
  auto run = [&](void (*kernel)(SplitParams), int tiles) {
    detail::launch(kernel, grid, dim3(kSplitThreads * tiles), smem, stream, pdl, p);
  };
  if (tuning.launch_split) {
    switch (row_tiles) {
      case 1:
        run(attention_split_kernel<1>, 1);
        break;
      case 2:
        run(attention_split_kernel<2>, 2);
        break;
      case 3:
        run(attention_split_kernel<3>, 3);
        break;
      default:
        run(attention_split_kernel<4>, 4);
        break;
    }
  }
  if (tuning.launch_combine)
    detail::launch(attention_combine_kernel, dim3(p.rows, cache.num_kv_heads, shape.num_requests),
                   dim3(kHeadDim), 0, stream, pdl, p, out, detail::kernel_tuning().early_trigger);
}

namespace detail {
AttentionTuning& attention_tuning() {
  static AttentionTuning tuning;
  return tuning;
}
}  // namespace detail

}  // namespace twinstep::kernels
