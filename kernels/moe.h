// Mixture-of-experts FFN: router logits, top-k selection with renormalised weights, SwiGLU experts
// run grouped over the selected experts only, an optional shared expert, and the weighted sum.
// moe_forward serves decode and verify (1..16 tokens) in five launches: router gemv (fp32
// logits), top-k/routing, grouped gate+up (one launch over every selected expert, each expert's
// weights read once for all tokens that picked it), grouped down, weighted combine (fixed slot
// order: deterministic). moe_prefill serves many rows (below).
//
// Layouts (bf16, row-major): x [m][hidden]; router [num_experts][hidden]; gate_up
// [num_experts][2 * expert_inter][hidden] (each expert's gate rows, then its up rows); down
// [num_experts][hidden][expert_inter]; shared_gate_up [2 * shared_inter][hidden]; shared_down
// [hidden][shared_inter]; out [m][hidden] = sum_j w_j * expert_j(x) + shared(x), one bf16 rounding.
// Routing: p = softmax(router logits) in fp32; the top_k experts by logit (ties: lower id);
// renormalize: w_j = p_j / sum of the selected p (= softmax over the selected logits), else p_j.
// Expert range (expert parallelism): a call may compute only experts [expert_begin, expert_end).
// Routing is still over all num_experts (same ids and weights as the full call); a slot whose
// expert lies outside the range contributes nothing, so a token that selected none of them gets
// only the shared expert's part (0 without one). gate_up and down then hold just the range's
// experts, expert e at index e - expert_begin. The full range is the unsharded computation, and
// the outputs of disjoint ranges covering every expert sum to it up to each output's bf16
// rounding.
//
// Prefill (moe_prefill, any m >= 1, meant for m > 16): the same contract computed as grouped
// tensor-core GEMMs, so each selected expert's weights are read once per tile of 64 or 128 of its
// rows instead of once per 16 tokens. Seven launches (nine with a shared expert): router GEMM
// (fp32 logits), routing with per-block expert counts, one-block scan (each expert's rows and row
// tiles), scatter of the (token, slot) pairs into expert-contiguous rows (ascending token within
// an expert), grouped gate+up with SwiGLU fused, grouped down into fp32 partials, the shared
// expert's two dense GEMMs, and moe_forward's combine. Row counts never leave the device (grids
// sized by their upper bound, surplus blocks exit), so it enqueues without host synchronisation
// and can be graph-captured. Deterministic; each row's output is independent of the other rows.
// It matches moe_forward within bf16 rounding (other fp32 summation orders), not bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common.h"

namespace twinstep::kernels {

struct MoeShape {
  int num_experts = 128;   // <= 256
  int top_k = 8;           // 1 .. min(16, num_experts)
  int hidden = 2048;       // % 64 == 0
  int expert_inter = 768;  // % 64 == 0
  int shared_inter = 0;    // 0: no shared expert; else % 64 == 0
  bool renormalize = true;
  int expert_begin = 0;  // experts computed: [expert_begin, range_end()), 0 <= begin < end
  int expert_end = 0;    // 0: num_experts
  int range_end() const { return expert_end > 0 ? expert_end : num_experts; }
};

struct MoeWeights {
  const bf16* router = nullptr;   // all num_experts rows
  const bf16* gate_up = nullptr;  // the range's experts only
  const bf16* down = nullptr;
  const bf16* shared_gate_up = nullptr;  // required iff shared_inter > 0
  const bf16* shared_down = nullptr;
};

// Optional copies of the routing decision: [m][top_k] expert ids (descending weight) and weights,
// over all experts whatever the range. With `entry` (moe_forward only), they go to entry
// (*entry % entries) of a ring, entry_stride elements apart from the pointers above, *entry read
// on the device when the routing kernel runs: a captured graph fills a new entry each launch
// (the runtime's launch counter). Costs the routing kernel top_k stores per row, no launch.
struct MoeRouting {
  int* topk_ids = nullptr;
  float* topk_weights = nullptr;
  const uint64_t* entry = nullptr;
  int entries = 1;
  size_t entry_stride = 0;
};

// Device scratch the caller owns (router logits, routing tables, expert activations, partial sums).
size_t moe_workspace_bytes(int m, const MoeShape& shape);

// active_rows (optional, device, m ints): a row whose entry is 0 selects no expert (routing ids
// -1, weights 0), so no expert's weights are read for it and its output is the shared expert's
// part alone (0 without one); every other row's output is unchanged, bit for bit (rows are
// independent). The runtime's speculative verify passes its padded positions as inactive.
void moe_forward(const bf16* x, const MoeWeights& weights, int m, const MoeShape& shape,
                 void* workspace, bf16* out, cudaStream_t stream, bool pdl = false,
                 const MoeRouting& routing = {}, const int* active_rows = nullptr);

// Device scratch of moe_prefill for m rows: ~ m * (4 * (top_k + 1) * hidden + 2 * top_k *
// expert_inter) bytes (fp32 partial sums and expert activations); callers bound m by chunking.
size_t moe_prefill_workspace_bytes(int m, const MoeShape& shape);

// m >= 1 rows, m * top_k <= 2^22 (grid limits); shape limits as moe_forward. No PDL: prefill
// kernels wait for their predecessors in stream order.
void moe_prefill(const bf16* x, const MoeWeights& weights, int m, const MoeShape& shape,
                 void* workspace, bf16* out, cudaStream_t stream, const MoeRouting& routing = {});

}  // namespace twinstep::kernels
