// The runtime's own small kernels (nvcc-compiled, C++17 launchers callable from host C++20):
// synthetic weight init, the relay gather/commit of a decode batch, the prefill commit, row
// gathers, per-node GPU timestamps, and a streaming-read probe for the bandwidth floor.
// Launchers take the stream and check the launch; they never synchronise.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace twinstep::runtime {

// Draft tokens one speculative round proposes at most: verify runs draft + 1 positions per
// request, within gemv's 16 rows and decode_attention's 16 query positions.
constexpr int kMaxDraftTokens = 15;

// One request's result of a launch. Decode and prefill fill token and ctx (accepted 0). A verify
// launch commits accepted + 1 tokens: draft[0 .. accepted) and then `token` (the bonus). A draft
// launch reports draft_len / conf_len / draft / confidence only (token 0, accepted 0).
struct OutputRow {
  int32_t token;
  int32_t ctx;            // tokens cached after this launch (the next decode writes position ctx)
  int32_t accepted = 0;   // draft tokens the target agreed with (verify)
  int32_t draft_len = 0;  // draft tokens proposed this round (<= kMaxDraftTokens)
  int32_t conf_len = 0;   // leading drafted tokens whose top-1 probability met the threshold
  int32_t pad_ = 0;
  int32_t draft[kMaxDraftTokens] = {};
  float confidence[kMaxDraftTokens] = {};  // draft token i's top-1 probability
};

constexpr int kOutputRing = 64;  // output entries (one per launch), indexed by seq % ring
constexpr int kTsRing = 256;     // launches whose node timestamps are kept

// dst[i] = synthetic::element_bits(seed, stream_id, i, scale), or bf16 1.0 when scale == 0.
void launch_init_synthetic(uint16_t* dst, uint64_t n, uint64_t seed, uint64_t stream_id,
                           float scale, cudaStream_t stream);

// Row i < rows: tok_in/ctx_b/base_b[i] = tokens/ctx/slot_base[batch_slots[i]].
void launch_gather_batch(int rows, const int* batch_slots, const int* tokens, const int* ctx,
                         __nv_bfloat16* const* slot_base, int* tok_in, int* ctx_b,
                         __nv_bfloat16** base_b, cudaStream_t stream);

// Rows whose slot != pad_slot: tokens[slot] = sampled[i], ctx[slot] = ctx_b[i] + 1, output row i
// of entry (*seq % kOutputRing); then ++*seq, ++*sample_step.
void launch_decode_commit(int rows, const int* batch_slots, int pad_slot, const int* sampled,
                          const int* ctx_b, int* tokens, int* ctx, OutputRow* ring, int ring_rows,
                          uint64_t* seq, uint64_t* sample_step, cudaStream_t stream);

// tokens[slots[i]] = sampled[i], ctx[slots[i]] = lens[i], output row row_offset + i; counters
// advance only when `advance` (the last pass of a prefill launch).
void launch_prefill_commit(int n, const int* slots, const int* lens, const int* sampled,
                           int row_offset, int* tokens, int* ctx, OutputRow* ring, int ring_rows,
                           uint64_t* seq, uint64_t* sample_step, bool advance, cudaStream_t stream);

// dst[i][:] = src[rows[i]][:], hidden % 8 == 0.
void launch_gather_rows(const __nv_bfloat16* src, const int* rows, __nv_bfloat16* dst, int n,
                        int hidden, cudaStream_t stream);

// ts[(*seq % kTsRing) * max_nodes + node] = %globaltimer (ns).
void launch_timestamp(uint64_t* ts, const uint64_t* seq, int node, int max_nodes,
                      cudaStream_t stream);

// An empty kernel, launched without the programmatic-dependent-launch attribute: the break an
// NCCL kernel makes in a PDL chain (it waits for its predecessor to finish and never triggers its
// successor early). EngineOptions::collective_stubs puts one at each collective position of a
// shard measured alone.
void launch_collective_stub(cudaStream_t stream);

// Reads n 16-byte words once (non-caching loads); the bandwidth probe of the floor.
void launch_stream_read(const void* p, size_t n16, unsigned long long* sink, int blocks,
                        cudaStream_t stream);

}  // namespace twinstep::runtime
