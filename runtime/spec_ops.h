// The runtime's kernels of speculative decoding (runtime/engine_spec.cc): the draft module's input
// norm-and-concat, and the relay/acceptance kernels of the draft, verify and extend graphs. Every
// count that depends on acceptance stays on the device; the host sees it through output rows.
// Layout of the per-batch draft state (rows r < batch, in batch order):
//   dtok[r][0] the committed token (the relay's tokens[slot]), dtok[r][j] draft token j (1..L);
//   dconf[r][j - 1] draft token j's top-1 probability; dlen[r] tokens drafted (<= L).
// Launchers check their arguments and the launch; they never synchronise.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/device_ops.h"

namespace twinstep::runtime {

constexpr int kDraftStride = kMaxDraftTokens + 1;  // dtok row length

// out[r] = [rmsnorm(e[r]) * w_e ; rmsnorm(h[hr]) * w_h] (bf16, [rows][2 * hidden]); hr =
// h_index ? h_index[r] : r. The norms are computed in fp32 and rounded once, as rmsnorm_residual.
void launch_concat_norm(const __nv_bfloat16* e, const __nv_bfloat16* h, const int* h_index,
                        const __nv_bfloat16* w_e, const __nv_bfloat16* w_h, __nv_bfloat16* out,
                        int rows, int hidden, float eps, cudaStream_t stream);

// Start of a draft launch, row r < rows: slot s = batch_slots[r]; ctx_b[r] = ctx[s],
// base_b[r] = slot_base[s]; dtok[r][0] = in_tok[r] = tokens[s]; dlen[r] = 0; active[r] = 1;
// step_ctx[j][r] = max(ctx[s] - 1 + j, 0) for j < steps (draft step j writes that position).
void launch_draft_begin(int rows, int steps, const int* batch_slots, const int* tokens,
                        const int* ctx, __nv_bfloat16* const* slot_base, int* ctx_b,
                        __nv_bfloat16** base_b, int* dtok, int* in_tok, int* dlen, int* active,
                        int* step_ctx, int* h_index, cudaStream_t stream);

// After draft step j: dtok[r][j + 1] = in_tok[r] = argmax[r], dconf[r][j] = top1[r]; a row still
// active drafts this token (dlen[r] = j + 1) and, when device_stop, stops once j + 1 >= min_steps
// and top1 < threshold (policies/spec_rules.h device_draft_len).
void launch_draft_step_commit(int rows, int j, const int* argmax, const float* top1, int* dtok,
                              float* dconf, int* in_tok, int* dlen, int* active, bool device_stop,
                              float threshold, int min_steps, cudaStream_t stream);

// End of a draft launch: output row r of entry (*seq % kOutputRing) = {0, ctx_b[r], 0, dlen,
// conf_len, draft, confidence} for rows whose slot != pad_slot; then ++*seq.
void launch_draft_finish(int rows, const int* batch_slots, int pad_slot, const int* ctx_b,
                         const int* dtok, const float* dconf, const int* dlen, float threshold,
                         OutputRow* ring, int ring_rows, uint64_t* seq, cudaStream_t stream);

// Start of verify (width W): ctx_b/base_b as draft_begin; tok_v[r * W + j] = dtok[r][j] for
// j <= dlen[r], else dtok[r][0] (padding, never accepted); active[r * W + j] = j <= dlen[r] (the
// MoE layers route only active positions: kernels/moe.h active_rows).
void launch_verify_prepare(int rows, int width, const int* batch_slots, const int* ctx,
                           __nv_bfloat16* const* slot_base, int* ctx_b, __nv_bfloat16** base_b,
                           const int* dtok, const int* dlen, int* tok_v, int* active,
                           cudaStream_t stream);

// Greedy acceptance, request r (one block each): accepted = the longest prefix j < dlen[r] with
// dtok[r][j + 1] == argmax[r * W + j]; bonus = argmax[r * W + accepted]. Real rows commit:
// tokens[s] = bonus, ctx[s] = ctx_b[r] + accepted + 1, hid[s] = hidden[r * W + accepted] (the
// target's pre-norm hidden state of the last committed position), output row r (token = bonus);
// ext_tok[r * W + j] = j < accepted ? dtok[r][j + 1] : bonus (extend's inputs). Counters are not
// advanced here (launch_advance_counters).
void launch_verify_commit(int rows, int width, int hidden, const int* batch_slots, int pad_slot,
                          const int* argmax, const __nv_bfloat16* hidden_rows, const int* dtok,
                          const float* dconf, const int* dlen, float threshold, const int* ctx_b,
                          int* tokens, int* ctx, __nv_bfloat16* hid, int* ext_tok, OutputRow* ring,
                          int ring_rows, const uint64_t* seq, cudaStream_t stream);

// Sets conditional `handle` to 1 when any of the first `rows` active flags is set, else 0 (the
// IF node around a later draft step; one thread).
void launch_set_draft_condition(cudaGraphConditionalHandle handle, const int* active, int rows,
                                cudaStream_t stream);

// ++*seq, ++*sample_step (one thread).
void launch_advance_counters(uint64_t* seq, uint64_t* sample_step, cudaStream_t stream);

// dst[index[i]][:] = src[i][:] for i < n, hidden % 8 == 0.
void launch_scatter_rows(const __nv_bfloat16* src, const int* index, __nv_bfloat16* dst, int n,
                         int hidden, cudaStream_t stream);

}  // namespace twinstep::runtime
