// Engine internals shared by engine.cc (target forward, prefill, plain decode) and
// engine_spec.cc (speculative draft / verify / extend): device buffers and the speculative state.
// Not part of the runtime's interface.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/common.h"
#include "runtime/engine.h"
#include "runtime/memory_plan.h"

namespace twinstep::runtime {

using kernels::bf16;

// One decoder layer's weights. Fused: qkv rows [q; k; v], gate_up rows [gate; up]. An MoE layer
// (kernels/moe.h layouts): w_gu holds every held expert's gate_up [E][2 EI][H] (expert J's gate
// rows, then its up rows), w_down every held expert's down [E][H][EI]; router [E][H]; shared_gu
// [2 S][H] and shared_down [H][S] with a shared expert (else null). Dense: router and shared null.
struct LayerWeights {
  bf16 *in_norm = nullptr, *w_qkv = nullptr, *w_o = nullptr, *post_norm = nullptr, *w_gu = nullptr,
       *w_down = nullptr;
  bf16 *router = nullptr, *shared_gu = nullptr, *shared_down = nullptr;
};

// The draft module's weights (checkpoint.h draft_weight_list), in the same weight allocation: its
// input (enorm, hnorm, eh_proj) and one layer laid out as a model layer (an MoE layer for an MoE
// model, the simulator's nextn draft).
struct DraftWeights {
  bf16 *enorm = nullptr, *hnorm = nullptr, *eh_proj = nullptr;
  LayerWeights layer;
};

struct Engine::Buffers {
  std::vector<void*> device_allocs;
  std::vector<void*> host_allocs;
  // Weights (one allocation, 256-byte aligned tensors).
  bf16* embed = nullptr;
  bf16* final_norm = nullptr;
  bf16* lm_head = nullptr;
  std::vector<LayerWeights> layer;  // the config's layers (a pipeline stage's: its own)
  std::map<std::string, std::pair<bf16*, int64_t>> by_name;
  DraftWeights draft;  // options.draft only
  // Relay and KV cache (slot max_slots is the padding slot).
  int* tokens = nullptr;
  int* ctx = nullptr;
  bf16** slot_base = nullptr;
  std::vector<bf16*> slot_base_host;
  // Decode batch.
  int* batch_slots = nullptr;
  int* tok_in = nullptr;
  int* ctx_b = nullptr;
  bf16** base_b = nullptr;
  // Activations, rows_max rows. gu is 2 * max(intermediate, hidden) wide with a draft (its input
  // concatenation [embedding; hidden] goes there), 2 * intermediate without.
  bf16 *residual = nullptr, *xn = nullptr, *qkv = nullptr, *q = nullptr, *attn = nullptr,
       *o = nullptr, *gu = nullptr, *act = nullptr, *mlp = nullptr;
  bf16 *last_res = nullptr, *last_mlp = nullptr;
  // EngineOptions::fused_norms: the residual rows' tile sums of squares [rows][hidden / 16] (decode
  // and verify rows) and a unit norm weight [hidden].
  float* norm_sq = nullptr;
  bf16* unit_norm = nullptr;
  // Sampling.
  int *argmax = nullptr, *sampled = nullptr;
  float* top1 = nullptr;
  char* lm_ws = nullptr;
  size_t lm_ws_chunk = 0;
  void* attn_ws = nullptr;
  // MoE: the larger of moe_forward's workspace of kGemvMaxRows rows and moe_prefill's of
  // moe_prefill_rows rows (min(kMoePrefillRowsPerCall, max_prefill_tokens)).
  void* moe_ws = nullptr;
  int moe_prefill_rows = 0;
  // EngineOptions::record_routing: kTsRing entries of [layers][max bucket rows][top_k] expert ids,
  // entry (*seq % kTsRing) written by decode launch seq.
  int* routing = nullptr;
  size_t routing_entry = 0;  // ints per entry
  int routing_rows = 0;      // rows per layer in an entry
  // Outputs and counters.
  OutputRow* out_ring = nullptr;
  OutputRow* host_ring = nullptr;
  int ring_rows = 0;
  uint64_t* seq = nullptr;
  uint64_t* sample_step = nullptr;
  uint64_t* ts = nullptr;
  int ts_nodes = 0;
  // Prefill metadata: device mirror of one staging entry.
  char* meta = nullptr;
  char* staging = nullptr;  // pinned, kStagingRing entries
  size_t meta_bytes = 0;
  size_t off_chunk_ctx = 0, off_last = 0, off_slots = 0, off_lens = 0, off_base = 0;
  std::vector<cudaEvent_t> staging_done;
  int64_t staging_next = 0;
  cublasHandle_t cublas = nullptr;
  void* cublas_ws = nullptr;
  cudaStream_t aux = nullptr;
  int rows_max = 0;
  int chunk = 16;  // prefill query chunk (pseudo-request length)
  int chunks_max = 0;

  // Freed here rather than in ~Engine, so a constructor that throws halfway leaves nothing.
  ~Buffers() {
    for (void* p : device_allocs) cudaFree(p);
    for (void* p : host_allocs) cudaFreeHost(p);
  }

  // A device allocation of `count` T; out of memory throws OutOfMemoryError naming `what` and
  // the size (memory_plan.h checked the total first, so this is fragmentation or another
  // process taking memory meanwhile).
  template <typename T>
  T* dev(size_t count, const char* what = "an engine buffer") {
    void* p = nullptr;
    const size_t bytes = std::max<size_t>(count * sizeof(T), 16);
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      (void)cudaMemGetInfo(&free_bytes, &total_bytes);
      throw OutOfMemoryError("cudaMalloc of " + describe_bytes(bytes) + " for " + what +
                             " failed: out of memory (" + describe_bytes(free_bytes) + " free of " +
                             describe_bytes(total_bytes) + ")");
    }
    TS_CUDA_CHECK(err);
    device_allocs.push_back(p);
    return static_cast<T*>(p);
  }
};

// Speculative state (options.draft). The draft layer's KV lives in each slot's KV buffer as layer
// index config.layers (one more layer than the target's), so the target's slot bases serve both.
struct Engine::Spec {
  // Per slot (max_slots + 1): the target's pre-norm hidden state of the slot's last processed
  // position (ctx - 1), the draft's "h" input of its first step.
  bf16* hid = nullptr;
  // Per batch row (max bucket rows; kDraftStride per row where noted).
  int *ctx_b = nullptr, *h_index = nullptr, *in_tok = nullptr, *dlen = nullptr, *active = nullptr;
  bf16** base_b = nullptr;
  int* dtok = nullptr;      // [row][kDraftStride]
  float* dconf = nullptr;   // [row][kDraftStride]
  int* step_ctx = nullptr;  // [kMaxDraftTokens][rows]
  // Verify rows (bucket * width).
  int *tok_v = nullptr, *ext_tok = nullptr, *argmax = nullptr, *sampled = nullptr;
  int* routed = nullptr;  // verify rows that are drafts (or the committed token), not padding
  float* top1 = nullptr;
  char* lm_ws = nullptr;
  size_t lm_ws_chunk = 0;
  void* attn_ws = nullptr;
  cudaStream_t side = nullptr;  // captures conditional bodies (draft early exit)
  // Captured graphs: (phase, bucket, steps or width, threshold, min_steps, device_stop).
  using Key = std::tuple<int, int, int, float, int, bool>;
  std::map<Key, cudaGraphExec_t> graphs;
};

}  // namespace twinstep::runtime
