// Engine: a Llama-family model resident on one GPU — weights, a KV cache slot per request, the
// GPU-resident relay (each slot's next input token and cached length), prefill and decode
// forward passes, and the decode CUDA graphs (one per batch-size bucket, mode and sampling).
//
// Relay contract: a slot's token and length live only on the device. Prefill of slot s writes
// the first sampled token to tokens[s] and the prompt length to ctx[s]; each decode launch reads
// tokens[s] / ctx[s] of its batch slots, appends one position to the KV cache, and writes the
// next token and ctx[s] + 1 back, so step k+1's graph reads what step k's graph wrote and the
// host handles only slot indices. Every launch also writes one output row {token, ctx} per
// request into an output ring entry indexed by its launch sequence number, which a side-stream
// copy brings to pinned host memory.
//
// KV capacity: each slot owns capacity_tokens positions of every layer's K and V
// (kernels/kv_cache.h layout): capacity_tokens * layers * 2 * kv_heads * 128 * 2 bytes per slot
// (128 KiB per token for Llama-3-8B), plus one padding slot that absorbs the padded rows of a
// batch bucket. A request needs prompt + output tokens (+ prefill padding to 16) <= capacity.
//
// Threading: one host thread drives an Engine; everything is enqueued on compute_stream().
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/common.h"
#include "kernels/rope.h"
#include "policies/policy_spec.h"
#include "runtime/checkpoint.h"
#include "runtime/device_ops.h"

#define TS_CUBLAS_CHECK(expr)                                                     \
  do {                                                                            \
    cublasStatus_t ts_st_ = (expr);                                               \
    if (ts_st_ != CUBLAS_STATUS_SUCCESS)                                          \
      ::twinstep::runtime::throw_cublas_error(ts_st_, #expr, __FILE__, __LINE__); \
  } while (0)

namespace twinstep::runtime {

[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* expr, const char* file,
                                     int line);

struct Sampling {
  float temperature = 0.0f;  // <= 0: greedy
  uint64_t seed = 0;
  bool operator<(const Sampling& o) const {
    return std::tie(temperature, seed) < std::tie(o.temperature, o.seed);
  }
};

struct EngineOptions {
  int32_t max_slots = 1;               // requests resident at once
  int32_t capacity_tokens = 0;         // KV positions per slot
  int32_t max_prefill_tokens = 16384;  // tokens per prefill pass (more are split into passes)
  bool profile_nodes = false;          // decode graphs/launches write a GPU timestamp per kernel
};

class Engine {
 public:
  static std::unique_ptr<Engine> create_synthetic(const LlamaConfig& config, uint64_t seed,
                                                  const EngineOptions& options);
  static std::unique_ptr<Engine> create_from_checkpoint(const Checkpoint& checkpoint,
                                                        const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const LlamaConfig& config() const { return config_; }
  const EngineOptions& options() const { return options_; }
  cudaStream_t compute_stream() const { return compute_; }
  cudaStream_t copy_stream() const { return copy_; }
  static int bucket_for(int batch);  // 1, 2, 4, ..., the smallest power of two >= batch

  // Sampling of subsequent launches (graphs are captured per sampling, so this is cheap once
  // prepared).
  void set_sampling(const Sampling& s) { sampling_ = s; }
  // Captures the decode graphs of every bucket up to bucket_for(max_batch) for `mode` and the
  // current sampling (no-op for eager or when already captured). Not timed work: call before a
  // run.
  void prepare(GraphMode mode, int max_batch);

  // Enqueues the prefill of `slots` (their prompts; the slot's previous contents are dropped).
  // Returns the launch sequence number of its output entry (rows in `slots` order).
  int64_t enqueue_prefill(std::span<const int32_t> slots,
                          std::span<const std::vector<int32_t>> prompts);
  // Enqueues one decode step of `slots` (1..max_slots distinct slots) in `mode`.
  int64_t enqueue_decode(std::span<const int32_t> slots, GraphMode mode);
  // Copies the first `rows` rows of output entry `seq` to pinned host memory on `stream`.
  void enqueue_output_copy(int64_t seq, int32_t rows, cudaStream_t stream);
  // Pinned host rows of entry `seq`; valid once the copy completed and until kOutputRing more
  // launches were issued.
  const OutputRow* host_outputs(int64_t seq) const;

  // Kernel names of one decode launch of `batch` rows in node order (profile_nodes timestamps
  // bracket them: timestamp j is taken just before kernel j, the last one after the last kernel).
  const std::vector<const char*>& decode_node_names(int batch) const;
  // Copies the timestamps (GPU globaltimer ns) of the most recent launches back:
  // result[seq] = timestamps, for seqs still in the timestamp ring. Synchronises.
  std::map<int64_t, std::vector<uint64_t>> node_timestamps(int64_t first_seq, int64_t last_seq);

  // Device weight bits of a Hugging Face tensor (tests). Synchronises.
  std::vector<uint16_t> download_weight(const std::string& name) const;
  int64_t weight_bytes() const { return weight_bytes_; }

 private:
  struct Buffers;
  struct GraphKey {
    int bucket;
    GraphMode mode;
    Sampling sampling;
    bool operator<(const GraphKey& o) const {
      return std::tie(bucket, mode, sampling) < std::tie(o.bucket, o.mode, o.sampling);
    }
  };

  Engine(const LlamaConfig& config, const EngineOptions& options);
  void allocate();
  void init_synthetic(uint64_t seed);
  void upload(const Checkpoint& checkpoint);
  // The decode forward of bucket B on compute_ (eager or under capture). commit = false runs
  // the forward without touching the relay or the counters (warm-up before capture).
  void decode_forward(int bucket, bool pdl, bool commit);
  void prefill_pass(std::span<const int32_t> slots, std::span<const std::vector<int32_t>> prompts,
                    int row_offset, bool last_pass);
  void proj(const kernels::bf16* w, const kernels::bf16* x, kernels::bf16* out, int m, int n, int k,
            bool pdl);
  void node(const char* name);
  void upload_batch(std::span<const int32_t> slots, int bucket);
  void* staging(int64_t seq);

  LlamaConfig config_;
  EngineOptions options_;
  Sampling sampling_;
  kernels::RopeTable rope_{};
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<Buffers> b_;
  int64_t weight_bytes_ = 0;
  int64_t next_seq_ = 0;  // host mirror of the device launch counter
  int max_bucket_ = 1;
  std::map<GraphKey, cudaGraphExec_t> graphs_;
  std::vector<int32_t> uploaded_slots_;  // batch slot list currently on the device
  // Node naming while a forward is enqueued.
  std::vector<const char*>* names_ = nullptr;
  bool timestamps_ = false;
  int node_index_ = 0;
  mutable std::map<int, std::vector<const char*>> node_names_;
};

}  // namespace twinstep::runtime
