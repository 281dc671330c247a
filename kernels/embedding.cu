#include <string>

#include "kernels/device.cuh"
#include "kernels/embedding.h"

namespace twinstep::kernels {

namespace {

constexpr int kEmbeddingThreads = 256;

// ---------------------------------------------------------------------------------------------
// kernels

__global__ void __launch_bounds__(kEmbeddingThreads)
    embedding_gather_kernel(const bf16* table, const int* tokens, bf16* out, int vocab,
                            int hidden) {
  detail::pdl_wait_and_trigger();
  const int token = tokens[blockIdx.x];
  const bool valid = token >= 0 && token < vocab;
  const uint4* src =
      reinterpret_cast<const uint4*>(table + static_cast<size_t>(valid ? token : 0) * hidden);
  uint4* dst = reinterpret_cast<uint4*>(out + static_cast<size_t>(blockIdx.x) * hidden);
  for (int u = threadIdx.x; u < hidden / 8; u += kEmbeddingThreads)
    dst[u] = valid ? src[u] : make_uint4(0, 0, 0, 0);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// launchers

void embedding_gather(const bf16* table, const int* tokens, bf16* out, int num_tokens, int vocab,
                      int hidden, cudaStream_t stream, bool pdl) {
  TS_REQUIRE(table != nullptr && tokens != nullptr && out != nullptr, "null table, tokens or out");
  TS_REQUIRE(num_tokens >= 1 && vocab >= 1, "num_tokens and vocab must be >= 1");
  TS_REQUIRE(hidden > 0 && hidden % 8 == 0,
             "hidden = " + std::to_string(hidden) + " is not a positive multiple of 8");
  detail::launch(embedding_gather_kernel, dim3(num_tokens), dim3(kEmbeddingThreads), 0, stream, pdl,
                 table, tokens, out, vocab, hidden);
}

}  // namespace twinstep::kernels
