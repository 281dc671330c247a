#include <algorithm>
#include <string>

#include "kernels/gemv.h"

#include "kernels/gemv_kernel.cuh"
#include "kernels/moe.h"
#include "kernels/moe_common.cuh"

namespace twinstep::kernels {

namespace {

using detail::kMoeCombineThreads;
using detail::kMoeMaxExperts;
using detail::kMoeMaxTopK;
using detail::moe_combine_kernel;

// Workspace carve-up, in order.
struct MoeWorkspace {
  float* logits;     // [m][E]
  int* ids;          // [m][top_k]
  float* weights;    // [m][top_k]
  int* list;         // [<= E] ascending range indices (id - expert_begin) any token selected
  int* count;        // [1]
  int8_t* slot_of;   // [m][range size]: slot of range index e in token t's top-k, or -1
  bf16* act;         // [m][top_k][inter]
  bf16* act_shared;  // [m][shared_inter]
  float* y;          // [m][top_k + 1][hidden]
  size_t bytes;
};

MoeWorkspace carve(void* base, int m, const MoeShape& s) {
  MoeWorkspace w = {};
  size_t off = 0;
  auto take = [&](size_t bytes) {
    void* p = static_cast<char*>(base) + off;
    off += detail::moe_align256(bytes);
    return p;
  };
  w.logits = static_cast<float*>(take(sizeof(float) * m * s.num_experts));
  w.ids = static_cast<int*>(take(sizeof(int) * m * s.top_k));
  w.weights = static_cast<float*>(take(sizeof(float) * m * s.top_k));
  w.list = static_cast<int*>(take(sizeof(int) * s.num_experts));
  w.count = static_cast<int*>(take(sizeof(int)));
  w.slot_of = static_cast<int8_t*>(take(static_cast<size_t>(m) * s.num_experts));
  w.act = static_cast<bf16*>(take(sizeof(bf16) * m * s.top_k * s.expert_inter));
  w.act_shared = static_cast<bf16*>(take(sizeof(bf16) * m * std::max(s.shared_inter, 1)));
  w.y = static_cast<float*>(take(sizeof(float) * m * (s.top_k + 1) * s.hidden));
  w.bytes = off;
  return w;
}

// ---------------------------------------------------------------------------------------------
// kernels

// One block, warp t = token t: moe_route_token (top-k by logit, ties: lower id; softmax
// weights), then the union of the selected experts inside [range_begin, range_begin + range)
// (ascending range indices) and slot_of, both indexed by range index.
__global__ void __launch_bounds__(512)
    moe_route_kernel(const float* logits, int m, int num_experts, int top_k, bool renormalize,
                     int range_begin, int range, int* ids, float* weights, int* list, int* count,
                     int8_t* slot_of, int* ids_out, float* weights_out, const uint64_t* out_entry,
                     int out_entries, size_t out_stride, const int* active) {
  __shared__ int selected[kMoeMaxExperts];
  detail::pdl_wait_and_trigger();
  if (out_entry != nullptr) {  // MoeRouting's ring: this launch's entry
    const size_t at =
        static_cast<size_t>(*out_entry % static_cast<uint64_t>(out_entries)) * out_stride;
    if (ids_out != nullptr) ids_out += at;
    if (weights_out != nullptr) weights_out += at;
  }
  for (int i = threadIdx.x; i < m * range; i += blockDim.x) slot_of[i] = -1;
  for (int e = threadIdx.x; e < range; e += blockDim.x) selected[e] = 0;
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp < m && active != nullptr && active[warp] == 0) {
    // An inactive row selects nothing: id -1 (outside every range), weight 0.
    for (int j = lane; j < top_k; j += 32) {
      ids[warp * top_k + j] = -1;
      weights[warp * top_k + j] = 0.0f;
      if (ids_out != nullptr) ids_out[warp * top_k + j] = -1;
      if (weights_out != nullptr) weights_out[warp * top_k + j] = 0.0f;
    }
  } else if (warp < m) {
    int top_id[kMoeMaxTopK];
    float top_w[kMoeMaxTopK];
    detail::moe_route_token(logits + warp * num_experts, num_experts, top_k, renormalize, lane,
                            top_id, top_w);
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < kMoeMaxTopK; ++j) {
        if (j >= top_k) break;
        const float w = top_w[j];
        ids[warp * top_k + j] = top_id[j];
        weights[warp * top_k + j] = w;
        if (ids_out != nullptr) ids_out[warp * top_k + j] = top_id[j];
        if (weights_out != nullptr) weights_out[warp * top_k + j] = w;
        const int local = top_id[j] - range_begin;
        if (local >= 0 && local < range) {
          slot_of[warp * range + local] = static_cast<int8_t>(j);
          selected[local] = 1;
        }
      }
    }
  }
  __syncthreads();
  if (warp == 0) {
    int base = 0;
    for (int e0 = 0; e0 < range; e0 += 32) {
      const int e = e0 + lane;
      const bool on = e < range && selected[e] != 0;
      const unsigned mask = __ballot_sync(0xffffffffu, on);
      if (on) list[base + __popc(mask & ((1u << lane) - 1))] = e;
      base += __popc(mask);
    }
    if (lane == 0) *count = base;
  }
}

void check_shape(int m, const MoeShape& s, const MoeWeights& w) {
  TS_REQUIRE(m >= 1 && m <= kGemvMaxRows, "m = " + std::to_string(m) + " outside [1, 16]");
  detail::check_moe_shape("moe_forward", s, w);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// launchers

size_t moe_workspace_bytes(int m, const MoeShape& shape) { return carve(nullptr, m, shape).bytes; }

void moe_forward(const bf16* x, const MoeWeights& weights, int m, const MoeShape& shape,
                 void* workspace, bf16* out, cudaStream_t stream, bool pdl,
                 const MoeRouting& routing, const int* active_rows) {
  TS_REQUIRE(x != nullptr && workspace != nullptr && out != nullptr, "null x, workspace or out");
  check_shape(m, shape, weights);
  TS_REQUIRE(routing.entry == nullptr || routing.entries >= 1,
             "MoeRouting ring of " + std::to_string(routing.entries) + " entries");
  const MoeWorkspace ws = carve(workspace, m, shape);
  const bool shared = shape.shared_inter > 0;
  const int range_begin = shape.expert_begin, range_end = shape.range_end();
  const int range = range_end - range_begin;

  detail::GemvParams router = {};
  router.w = weights.router;
  router.x = x;
  router.m = m;
  router.n = shape.num_experts;
  router.k = shape.hidden;
  router.out_f32 = ws.logits;
  detail::launch_gemv<detail::GemvEpilogue::kStoreF32>(router, stream, pdl);

  detail::launch(moe_route_kernel, dim3(1), dim3(512), 0, stream, pdl,
                 static_cast<const float*>(ws.logits), m, shape.num_experts, shape.top_k,
                 shape.renormalize, range_begin, range, ws.ids, ws.weights, ws.list, ws.count,
                 ws.slot_of, routing.topk_ids, routing.topk_weights, routing.entry, routing.entries,
                 routing.entry_stride, active_rows);

  detail::GemvParams g = {};
  g.group.expert_list = ws.list;
  g.group.expert_count = ws.count;
  g.group.slot_of = ws.slot_of;
  g.group.num_experts = range;  // the grouped GEMVs see range indices only
  g.group.top_k = shape.top_k;
  g.group.act = ws.act;
  g.group.act_shared = ws.act_shared;
  g.group.y = ws.y;
  g.m = m;

  detail::GemvParams up = g;
  up.w = weights.gate_up;
  up.x = x;
  up.n = shape.expert_inter;
  up.k = shape.hidden;
  up.group.expert_stride = static_cast<size_t>(2) * shape.expert_inter * shape.hidden;
  up.group.shared_w = shared ? weights.shared_gate_up : nullptr;
  up.group.shared_n = shape.shared_inter;
  up.group.shared_k = shape.hidden;
  detail::launch_gemv<detail::GemvEpilogue::kMoeGateUp>(up, stream, pdl);

  detail::GemvParams down = g;
  down.w = weights.down;
  down.n = shape.hidden;
  down.k = shape.expert_inter;
  down.group.expert_stride = static_cast<size_t>(shape.hidden) * shape.expert_inter;
  down.group.shared_w = shared ? weights.shared_down : nullptr;
  down.group.shared_n = shape.hidden;
  down.group.shared_k = shape.shared_inter;
  detail::launch_gemv<detail::GemvEpilogue::kMoeDown>(down, stream, pdl);

  detail::launch(moe_combine_kernel, dim3(m), dim3(kMoeCombineThreads), 0, stream, pdl,
                 static_cast<const float*>(ws.y), static_cast<const int*>(ws.ids),
                 static_cast<const float*>(ws.weights), shape.top_k, range_begin, range_end, shared,
                 shape.hidden, out);
}

}  // namespace twinstep::kernels
