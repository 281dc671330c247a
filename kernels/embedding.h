// Embedding gather: out[t][:] = table[tokens[t]][:].
// table row-major [vocab][hidden] bf16, tokens device int32 [num_tokens], out [num_tokens][hidden].
// hidden % 8 == 0. A token id outside [0, vocab) yields a zero row (never a wild read).
#pragma once

#include "kernels/common.h"

namespace twinstep::kernels {

void embedding_gather(const bf16* table, const int* tokens, bf16* out, int num_tokens, int vocab,
                      int hidden, cudaStream_t stream, bool pdl = false);

}  // namespace twinstep::kernels
