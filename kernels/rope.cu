#include <cmath>
#include <string>

#include "kernels/device.cuh"
#include "kernels/rope.h"
#include "kernels/rope_math.cuh"
#include "kernels/tuning.h"

namespace twinstep::kernels {

namespace {

constexpr int kHalf = kHeadDim / 2;

// ---------------------------------------------------------------------------------------------
// kernels

// Block = (token (r, j), head): heads 0 .. num_q_heads + num_kv_heads - 1 rotate one q or k
// head (one thread per pair); the last block row copies the token's v heads into the cache.
__global__ void __launch_bounds__(kHalf)
    rope_kv_append_kernel(const bf16* qkv, const int* ctx_lens, KvCache cache, int layer,
                          bf16* q_out, int q_len, int num_q_heads, RopeTable rope,
                          int trigger_mode) {
  detail::pdl_small_wait(trigger_mode);
  const int token = blockIdx.x, head = blockIdx.y, request = token / q_len, j = token % q_len;
  const int position = ctx_lens[request] + j;
  const bool in_cache = position < cache.capacity_tokens;
  const int num_kv_heads = cache.num_kv_heads;
  const bf16* in = qkv + static_cast<size_t>(token) * (num_q_heads + 2 * num_kv_heads) * kHeadDim;
  bf16* base = cache.request_base[request];

  if (head == num_q_heads + num_kv_heads) {  // v: 16-byte copies
    if (!in_cache) return;
    for (int idx = threadIdx.x; idx < num_kv_heads * kHeadDim / 8; idx += kHalf) {
      const int h = idx / (kHeadDim / 8), u = idx % (kHeadDim / 8);
      const uint4 v =
          *reinterpret_cast<const uint4*>(in + (num_q_heads + num_kv_heads + h) * kHeadDim + u * 8);
      *reinterpret_cast<uint4*>(base + kv_offset(cache, layer, 1, h) +
                                static_cast<size_t>(position) * kHeadDim + u * 8) = v;
    }
    return;
  }
  const int i = threadIdx.x;
  bf16 y1, y2;
  detail::rope_rotate_pair(__bfloat162float(in[head * kHeadDim + i]),
                           __bfloat162float(in[head * kHeadDim + i + kHalf]), position,
                           rope.inv_freq[i], &y1, &y2);
  bf16* dst;
  if (head < num_q_heads) {
    dst = q_out + (static_cast<size_t>(token) * num_q_heads + head) * kHeadDim;
  } else {
    if (!in_cache) return;
    dst = base + kv_offset(cache, layer, 0, head - num_q_heads) +
          static_cast<size_t>(position) * kHeadDim;
  }
  dst[i] = y1;
  dst[i + kHalf] = y2;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// launchers

RopeTable llama3_rope_table(double theta, double factor, double low_freq_factor,
                            double high_freq_factor, double original_context) {
  // Same rule as Hugging Face's _compute_llama3_parameters (rope_type "llama3").
  const double pi = 3.14159265358979323846;
  const double low_freq_wavelen = original_context / low_freq_factor;
  const double high_freq_wavelen = original_context / high_freq_factor;
  RopeTable table;
  for (int i = 0; i < kHalf; ++i) {
    const double inv_freq = 1.0 / std::pow(theta, 2.0 * i / kHeadDim);
    const double wavelen = 2.0 * pi / inv_freq;
    double scaled = wavelen > low_freq_wavelen ? inv_freq / factor : inv_freq;
    if (wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen) {
      const double smooth =
          (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      scaled = (1.0 - smooth) * inv_freq / factor + smooth * inv_freq;
    }
    table.inv_freq[i] = static_cast<float>(scaled);
  }
  return table;
}

void rope_kv_append(const bf16* qkv, const int* ctx_lens, const KvCache& cache, int layer,
                    bf16* q_out, int num_requests, int q_len, int num_q_heads,
                    const RopeTable& rope, cudaStream_t stream, bool pdl) {
  TS_REQUIRE(
      qkv != nullptr && ctx_lens != nullptr && q_out != nullptr && cache.request_base != nullptr,
      "null qkv, ctx_lens, q_out or cache.request_base");
  TS_REQUIRE(
      num_requests >= 1 && q_len >= 1 && q_len <= 16,
      "num_requests must be >= 1 and q_len in [1, 16], got q_len = " + std::to_string(q_len));
  TS_REQUIRE(num_q_heads >= 1 && cache.num_kv_heads >= 1 && num_q_heads % cache.num_kv_heads == 0,
             "num_q_heads must be a positive multiple of num_kv_heads");
  TS_REQUIRE(layer >= 0 && layer < cache.num_layers, "layer out of range");
  detail::launch(rope_kv_append_kernel,
                 dim3(num_requests * q_len, num_q_heads + cache.num_kv_heads + 1), dim3(kHalf), 0,
                 stream, pdl, qkv, ctx_lens, cache, layer, q_out, q_len, num_q_heads, rope,
                 detail::small_kernel_trigger_mode());
}

}  // namespace twinstep::kernels
