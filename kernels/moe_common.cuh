// Pieces shared by moe_forward (moe.cu, decode) and moe_prefill (moe_prefill.cu) (nvcc only):
// the shape check, the per-token routing rule and the weighted combine, so both entry points
// route and sum by one piece of code (kernels/moe.h's contract).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "kernels/device.cuh"
#include "kernels/moe.h"

namespace twinstep::kernels::detail {

constexpr int kMoeMaxExperts = 256;
constexpr int kMoeMaxTopK = 16;
constexpr int kMoeCombineThreads = 256;

inline size_t moe_align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Bump allocator over a caller's workspace; base == nullptr only sizes it.
struct MoeCarver {
  void* base;
  size_t off = 0;
  template <typename T>
  T* take(size_t count) {
    T* p = reinterpret_cast<T*>(static_cast<char*>(base) + off);
    off += moe_align256(sizeof(T) * count);
    return p;
  }
};

// Shape, range and weight preconditions of both launchers (rows checked by the caller); throws
// std::invalid_argument naming `launcher`.
inline void check_moe_shape(const char* launcher, const MoeShape& s, const MoeWeights& w) {
  auto require = [&](bool ok, const std::string& message) {
    if (!ok) throw_invalid_argument(launcher, message);
  };
  require(
      s.num_experts >= 1 && s.num_experts <= kMoeMaxExperts && s.num_experts % 16 == 0,
      "num_experts = " + std::to_string(s.num_experts) + " must be a multiple of 16 in [16, 256]");
  require(s.top_k >= 1 && s.top_k <= kMoeMaxTopK && s.top_k <= s.num_experts,
          "top_k = " + std::to_string(s.top_k) + " outside [1, min(16, num_experts)]");
  require(s.hidden > 0 && s.hidden % 64 == 0,
          "hidden = " + std::to_string(s.hidden) + " is not a positive multiple of 64");
  require(s.expert_inter > 0 && s.expert_inter % 64 == 0,
          "expert_inter = " + std::to_string(s.expert_inter) + " is not a positive multiple of 64");
  require(s.shared_inter >= 0 && s.shared_inter % 64 == 0,
          "shared_inter = " + std::to_string(s.shared_inter) + " is not a multiple of 64");
  require(s.expert_begin >= 0 && s.expert_begin < s.range_end() && s.range_end() <= s.num_experts,
          "expert range [" + std::to_string(s.expert_begin) + ", " + std::to_string(s.range_end()) +
              ") is not a non-empty range of the " + std::to_string(s.num_experts) + " experts");
  require(w.router != nullptr && w.gate_up != nullptr && w.down != nullptr,
          "null router, gate_up or down weights");
  require(s.shared_inter == 0 || (w.shared_gate_up != nullptr && w.shared_down != nullptr),
          "shared_inter > 0 needs shared_gate_up and shared_down");
}

// One warp routes one token (kernels/moe.h): top_k rounds of a warp argmax over its fp32 logits
// (ties: lower id; a taken id stays out of later rounds), then the softmax weights over the
// selected logits (renormalize) or over all experts. Every lane returns the same top_id[0, top_k)
// (descending logit) and top_w[0, top_k). Both launchers call this, so decode and prefill route
// a token the same way given the same logits.
__device__ __forceinline__ void moe_route_token(const float* logits, int num_experts, int top_k,
                                                bool renormalize, int lane,
                                                int (&top_id)[kMoeMaxTopK],
                                                float (&top_w)[kMoeMaxTopK]) {
  constexpr int kPerLane = kMoeMaxExperts / 32;
  float v[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < num_experts ? logits[e] : -INFINITY;
  }
  float top_logit[kMoeMaxTopK];
#pragma unroll
  for (int j = 0; j < kMoeMaxTopK; ++j) {
    if (j >= top_k) break;
    float best = -INFINITY;
    int best_id = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < num_experts && (v[i] > best || (v[i] == best && e < best_id))) {
        best = v[i];
        best_id = e;
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, offset);
      const int oi = __shfl_xor_sync(0xffffffffu, best_id, offset);
      if (ob > best || (ob == best && oi < best_id)) {
        best = ob;
        best_id = oi;
      }
    }
    top_logit[j] = best;
    top_id[j] = best_id;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (lane + 32 * i == best_id) v[i] = -INFINITY;
  }
  const float mx = top_logit[0];
  float denom = 0.0f;
  if (renormalize) {
#pragma unroll
    for (int j = 0; j < kMoeMaxTopK; ++j) {
      if (j >= top_k) break;
      denom += __expf(top_logit[j] - mx);
    }
  } else {
    float part = 0.0f;
    for (int e = lane; e < num_experts; e += 32) part += __expf(logits[e] - mx);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
      part += __shfl_xor_sync(0xffffffffu, part, offset);
    denom = part;
  }
#pragma unroll
  for (int j = 0; j < kMoeMaxTopK; ++j) {
    if (j >= top_k) break;
    top_w[j] = __expf(top_logit[j] - mx) / denom;
  }
}

// out[t][h] = sum over slots j (in order) whose expert lies in [range_begin, range_end) of
// w[t][j] * y[t][j][h], plus y[t][top_k][h] (shared). Slots outside the range are skipped, not
// weighted by 0: their y rows were never written. y: [m][top_k + 1][hidden] fp32; one block per
// token. (Unnamed namespace: without relocatable device code each .cu needs its own copy.)
namespace {
__global__ void __launch_bounds__(kMoeCombineThreads)
    moe_combine_kernel(const float* y, const int* ids, const float* weights, int top_k,
                       int range_begin, int range_end, bool shared, int hidden, bf16* out) {
  __shared__ float slot_w[kMoeMaxTopK];
  __shared__ int slot_on[kMoeMaxTopK];
  pdl_wait_and_trigger();
  const int t = blockIdx.x;
  if (threadIdx.x < top_k) {
    const int id = ids[t * top_k + threadIdx.x];
    slot_w[threadIdx.x] = weights[t * top_k + threadIdx.x];
    slot_on[threadIdx.x] = id >= range_begin && id < range_end;
  }
  __syncthreads();
  const float* yt = y + static_cast<size_t>(t) * (top_k + 1) * hidden;
  for (int h = threadIdx.x; h < hidden; h += kMoeCombineThreads) {
    float acc = 0.0f;
    for (int j = 0; j < top_k; ++j)
      if (slot_on[j]) acc += slot_w[j] * yt[j * hidden + h];
    if (shared) acc += yt[top_k * hidden + h];
    out[static_cast<size_t>(t) * hidden + h] = __float2bfloat16(acc);
  }
}
}  // namespace

}  // namespace twinstep::kernels::detail
