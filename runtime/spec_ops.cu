#include "runtime/spec_ops.h"

#include <string>

#include "kernels/common.h"

namespace twinstep::runtime {

using kernels::bf16;

namespace {

constexpr int kNormThreads = 256;

// ---------------------------------------------------------------------------------------------
// kernels

// Block = one output row; the two halves are normalised one after the other.
__device__ void norm_into(const bf16* x, const bf16* w, bf16* out, int hidden, float eps,
                          float* warp_sums) {
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += kNormThreads) {
    const float v = __bfloat162float(x[i]);
    sum_sq += v * v;
  }
  for (int offset = 16; offset > 0; offset /= 2)
    sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum_sq;
  __syncthreads();
  float total = 0.0f;
  for (int k = 0; k < kNormThreads / 32; ++k) total += warp_sums[k];
  __syncthreads();  // warp_sums is reused by the next call
  const float inv_rms = rsqrtf(total / hidden + eps);
  for (int i = threadIdx.x; i < hidden; i += kNormThreads)
    out[i] = __float2bfloat16(__bfloat162float(x[i]) * inv_rms * __bfloat162float(w[i]));
}

__global__ void __launch_bounds__(kNormThreads)
    concat_norm_kernel(const bf16* e, const bf16* h, const int* h_index, const bf16* w_e,
                       const bf16* w_h, bf16* out, int hidden, float eps) {
  __shared__ float warp_sums[kNormThreads / 32];
  const size_t r = blockIdx.x;
  const size_t hr = h_index != nullptr ? size_t(h_index[r]) : r;
  bf16* o = out + r * 2 * hidden;
  norm_into(e + r * hidden, w_e, o, hidden, eps, warp_sums);
  norm_into(h + hr * hidden, w_h, o + hidden, hidden, eps, warp_sums);
}

__global__ void draft_begin_kernel(int rows, int steps, const int* batch_slots, const int* tokens,
                                   const int* ctx, bf16* const* slot_base, int* ctx_b,
                                   bf16** base_b, int* dtok, int* in_tok, int* dlen, int* active,
                                   int* step_ctx, int* h_index) {
  const int r = threadIdx.x;
  if (r >= rows) return;
  const int s = batch_slots[r];
  const int c = ctx[s];
  ctx_b[r] = c;
  base_b[r] = slot_base[s];
  dtok[r * kDraftStride] = tokens[s];
  in_tok[r] = tokens[s];
  dlen[r] = 0;
  active[r] = 1;
  h_index[r] = s;
  for (int j = 0; j < steps; ++j) step_ctx[j * rows + r] = max(c - 1 + j, 0);
}

__global__ void draft_step_commit_kernel(int rows, int j, const int* argmax, const float* top1,
                                         int* dtok, float* dconf, int* in_tok, int* dlen,
                                         int* active, bool device_stop, float threshold,
                                         int min_steps) {
  const int r = threadIdx.x;
  if (r >= rows) return;
  const int t = argmax[r];
  const float p = top1[r];
  dtok[r * kDraftStride + j + 1] = t;
  dconf[r * kDraftStride + j] = p;
  in_tok[r] = t;
  if (active[r]) {
    dlen[r] = j + 1;
    if (device_stop && j + 1 >= min_steps && p < threshold) active[r] = 0;
  }
}

__device__ int conf_prefix(const float* conf, int len, float threshold) {
  int n = 0;
  while (n < len && conf[n] >= threshold) ++n;
  return n;
}

__device__ void fill_draft(OutputRow& row, const int* dtok, const float* dconf, int len,
                           float threshold) {
  row.draft_len = len;
  row.conf_len = conf_prefix(dconf, len, threshold);
  for (int j = 0; j < kMaxDraftTokens; ++j) {
    row.draft[j] = j < len ? dtok[j + 1] : 0;
    row.confidence[j] = j < len ? dconf[j] : 0.0f;
  }
}

__global__ void draft_finish_kernel(int rows, const int* batch_slots, int pad_slot,
                                    const int* ctx_b, const int* dtok, const float* dconf,
                                    const int* dlen, float threshold, OutputRow* ring,
                                    int ring_rows, uint64_t* seq) {
  const uint64_t entry = *seq % kOutputRing;
  const int r = threadIdx.x;
  if (r < rows && batch_slots[r] != pad_slot) {
    OutputRow row{0, ctx_b[r]};
    fill_draft(row, dtok + r * kDraftStride, dconf + r * kDraftStride, dlen[r], threshold);
    ring[entry * ring_rows + r] = row;
  }
  __syncthreads();
  if (threadIdx.x == 0) *seq += 1;
}

__global__ void verify_prepare_kernel(int rows, int width, const int* batch_slots, const int* ctx,
                                      bf16* const* slot_base, int* ctx_b, bf16** base_b,
                                      const int* dtok, const int* dlen, int* tok_v, int* active) {
  const int r = threadIdx.x;
  if (r >= rows) return;
  const int s = batch_slots[r];
  ctx_b[r] = ctx[s];
  base_b[r] = slot_base[s];
  const int* d = dtok + r * kDraftStride;
  for (int j = 0; j < width; ++j) {
    tok_v[r * width + j] = j <= dlen[r] ? d[j] : d[0];
    active[r * width + j] = j <= dlen[r];
  }
}

__global__ void verify_commit_kernel(int width, int hidden, const int* batch_slots, int pad_slot,
                                     const int* argmax, const bf16* hidden_rows, const int* dtok,
                                     const float* dconf, const int* dlen, float threshold,
                                     const int* ctx_b, int* tokens, int* ctx, bf16* hid,
                                     int* ext_tok, OutputRow* ring, int ring_rows,
                                     const uint64_t* seq) {
  __shared__ int accepted_s;
  const int r = blockIdx.x;
  const int s = batch_slots[r];
  const int* d = dtok + r * kDraftStride;
  const int* a = argmax + r * width;
  if (threadIdx.x == 0) {
    const int len = min(dlen[r], width - 1);
    int acc = 0;
    while (acc < len && d[acc + 1] == a[acc]) ++acc;
    accepted_s = acc;
    const int bonus = a[acc];
    for (int j = 0; j < width; ++j) ext_tok[r * width + j] = j < acc ? d[j + 1] : bonus;
    if (s != pad_slot) {
      const int c = ctx_b[r] + acc + 1;
      tokens[s] = bonus;
      ctx[s] = c;
      OutputRow row{bonus, c};
      row.accepted = acc;
      fill_draft(row, d, dconf + r * kDraftStride, len, threshold);
      ring[(*seq % kOutputRing) * ring_rows + r] = row;
    }
  }
  __syncthreads();
  if (s == pad_slot) return;
  const bf16* src = hidden_rows + (size_t(r) * width + accepted_s) * hidden;
  bf16* dst = hid + size_t(s) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}

__global__ void set_draft_condition_kernel(cudaGraphConditionalHandle handle, const int* active,
                                           int rows) {
  int any = 0;
  for (int r = 0; r < rows; ++r) any |= active[r];
  cudaGraphSetConditional(handle, any ? 1u : 0u);
}

__global__ void advance_counters_kernel(uint64_t* seq, uint64_t* sample_step) {
  *seq += 1;
  *sample_step += 1;
}

__global__ void scatter_rows_kernel(const bf16* src, const int* index, bf16* dst, int hidden) {
  const uint4* s = reinterpret_cast<const uint4*>(src + size_t(blockIdx.x) * hidden);
  uint4* d = reinterpret_cast<uint4*>(dst + size_t(index[blockIdx.x]) * hidden);
  for (int u = threadIdx.x; u < hidden / 8; u += blockDim.x) d[u] = s[u];
}

int block_for(int rows) { return (rows + 31) / 32 * 32; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// launchers

void launch_concat_norm(const bf16* e, const bf16* h, const int* h_index, const bf16* w_e,
                        const bf16* w_h, bf16* out, int rows, int hidden, float eps,
                        cudaStream_t stream) {
  TS_REQUIRE(rows >= 1 && hidden >= 1, "rows and hidden must be positive");
  TS_REQUIRE(e != nullptr && h != nullptr && w_e != nullptr && w_h != nullptr && out != nullptr,
             "null input or output");
  concat_norm_kernel<<<rows, kNormThreads, 0, stream>>>(e, h, h_index, w_e, w_h, out, hidden, eps);
  TS_CUDA_CHECK(cudaGetLastError());
}

void launch_draft_begin(int rows, int steps, const int* batch_slots, const int* tokens,
                        const int* ctx, bf16* const* slot_base, int* ctx_b, bf16** base_b,
                        int* dtok, int* in_tok, int* dlen, int* active, int* step_ctx, int* h_index,
                        cudaStream_t stream) {
  TS_REQUIRE(rows >= 1 && rows <= 1024, "rows outside [1, 1024]");
  TS_REQUIRE(steps >= 1 && steps <= kMaxDraftTokens, "draft steps outside [1, 15]");
  draft_begin_kernel<<<1, block_for(rows), 0, stream>>>(rows, steps, batch_slots, tokens, ctx,
                                                        slot_base, ctx_b, base_b, dtok, in_tok,
                                                        dlen, active, step_ctx, h_index);
  TS_CUDA_CHECK(cudaGetLastError());
}

void launch_draft_step_commit(int rows, int j, const int* argmax, const float* top1, int* dtok,
                              float* dconf, int* in_tok, int* dlen, int* active, bool device_stop,
                              float threshold, int min_steps, cudaStream_t stream) {
  TS_REQUIRE(rows >= 1 && rows <= 1024, "rows outside [1, 1024]");
  TS_REQUIRE(j >= 0 && j < kMaxDraftTokens, "draft step outside [0, 15)");
  draft_step_commit_kernel<<<1, block_for(rows), 0, stream>>>(
      rows, j, argmax, top1, dtok, dconf, in_tok, dlen, active, device_stop, threshold, min_steps);
  TS_CUDA_CHECK(cudaGetLastError());
}

void launch_draft_finish(int rows, const int* batch_slots, int pad_slot, const int* ctx_b,
                         const int* dtok, const float* dconf, const int* dlen, float threshold,
                         OutputRow* ring, int ring_rows, uint64_t* seq, cudaStream_t stream) {
  TS_REQUIRE(rows >= 1 && rows <= 1024 && rows <= ring_rows, "rows outside [1, ring_rows]");
  draft_finish_kernel<<<1, block_for(rows), 0, stream>>>(
      rows, batch_slots, pad_slot, ctx_b, dtok, dconf, dlen, threshold, ring, ring_rows, seq);
  TS_CUDA_CHECK(cudaGetLastError());
}

void launch_verify_prepare(int rows, int width, const int* batch_slots, const int* ctx,
                           bf16* const* slot_base, int* ctx_b, bf16** base_b, const int* dtok,
                           const int* dlen, int* tok_v, int* active, cudaStream_t stream) {
  TS_REQUIRE(rows >= 1 && rows <= 1024, "rows outside [1, 1024]");
  TS_REQUIRE(width >= 1 && width <= kDraftStride, "verify width outside [1, 16]");
  verify_prepare_kernel<<<1, block_for(rows), 0, stream>>>(
      rows, width, batch_slots, ctx, slot_base, ctx_b, base_b, dtok, dlen, tok_v, active);
  TS_CUDA_CHECK(cudaGetLastError());
}

void launch_verify_commit(int rows, int width, int hidden, const int* batch_slots, int pad_slot,
                          const int* argmax, const bf16* hidden_rows, const int* dtok,
                          const float* dconf, const int* dlen, float threshold, const int* ctx_b,
                          int* tokens, int* ctx, bf16* hid, int* ext_tok, OutputRow* ring,
                          int ring_rows, const uint64_t* seq, cudaStream_t stream) {
  TS_REQUIRE(rows >= 1 && rows <= ring_rows, "rows outside [1, ring_rows]");
  TS_REQUIRE(width >= 1 && width <= kDraftStride, "verify width outside [1, 16]");
  verify_commit_kernel<<<rows, 128, 0, stream>>>(width, hidden, batch_slots, pad_slot, argmax,
                                                 hidden_rows, dtok, dconf, dlen, threshold, ctx_b,
                                                 tokens, ctx, hid, ext_tok, ring, ring_rows, seq);
  TS_CUDA_CHECK(cudaGetLastError());
}

void launch_set_draft_condition(cudaGraphConditionalHandle handle, const int* active, int rows,
                                cudaStream_t stream) {
  TS_REQUIRE(rows >= 1 && rows <= 1024, "rows outside [1, 1024]");
  set_draft_condition_kernel<<<1, 1, 0, stream>>>(handle, active, rows);
  TS_CUDA_CHECK(cudaGetLastError());
}

void launch_advance_counters(uint64_t* seq, uint64_t* sample_step, cudaStream_t stream) {
  advance_counters_kernel<<<1, 1, 0, stream>>>(seq, sample_step);
  TS_CUDA_CHECK(cudaGetLastError());
}

void launch_scatter_rows(const bf16* src, const int* index, bf16* dst, int n, int hidden,
                         cudaStream_t stream) {
  TS_REQUIRE(n >= 1 && hidden % 8 == 0, "n >= 1 and hidden % 8 == 0 required");
  scatter_rows_kernel<<<n, 128, 0, stream>>>(src, index, dst, hidden);
  TS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace twinstep::runtime
