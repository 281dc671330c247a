// Engine: a Llama-family model (dense, or MoE in every layer like Qwen3-MoE: checkpoint.h
// LlamaConfig) resident on one GPU — weights, a KV cache slot per request, the GPU-resident relay
// (each slot's next input token and cached length), prefill and decode forward passes, and the
// decode CUDA graphs (one per batch-size bucket, mode and sampling). MoE layers run moe_forward
// (kernels/moe.h) in place of the dense FFN at decode, 16 rows per call, and moe_prefill (grouped
// GEMMs) at prefill passes of more than 16 rows.
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
#include <utility>
#include <vector>

#include "kernels/common.h"
#include "kernels/moe.h"
#include "kernels/rope.h"
#include "policies/layout.h"
#include "policies/model_spec.h"
#include "policies/policy_spec.h"
#include "runtime/checkpoint.h"
#include "runtime/device_ops.h"
#include "runtime/pipeline_parallel.h"
#include "runtime/tensor_parallel.h"

#define TS_CUBLAS_CHECK(expr)                                                     \
  do {                                                                            \
    cublasStatus_t ts_st_ = (expr);                                               \
    if (ts_st_ != CUBLAS_STATUS_SUCCESS)                                          \
      ::twinstep::runtime::throw_cublas_error(ts_st_, #expr, __FILE__, __LINE__); \
  } while (0)

namespace twinstep::runtime {

// Engine::warm_up's launch count before timed decode (the experiment runner's one-GPU real runs
// and `twinstep calibrate`'s grid engines): about 0.4 s of batch-1 decode of the Llama-3-8B
// shape, ten times the ~40 ms slow start measured after a heavy run (docs/calibration.md
// "Warm-up before timed decode").
inline constexpr int kDecodeWarmupLaunches = 96;

// Brings this process's GPU into the state every engine created after another one meets
// (docs/calibration.md "Two states of the GPU"): the first engine of a process runs its
// plain-graph decode steps ~80 us faster (Llama-3-8B, batch 1, ~290 kernel boundaries) than the
// engines created after it, a state no input of an experiment decides. Two throwaway engines
// of `config` cut to its first kSettleLayers layers (one slot, 64 tokens), created and destroyed
// in turn, so that calibrate and the runner's timed engines all meet the same state. Once per
// process and device: later calls return at once. Call it before the timed engine is created.
inline constexpr int kSettleLayers = 2;
void settle_gpu_state(const LlamaConfig& config);

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
  // Profiled decode launches on request (enqueue_decode's `profiled`): a second set of decode
  // graphs, captured with a timestamp per kernel, beside the unprofiled ones.
  bool node_trace = false;
  // MoE models: every plain decode and verify launch (eager or graph, every bucket) writes each
  // MoE layer's routing, the top_k expert ids of each row over all experts (-1 for a verify's
  // padded positions), into a device ring entry of its launch sequence number (kTsRing launches
  // kept), which decode_routing reads back. Costs the
  // routing kernels top_k 4-byte stores per row (no extra node, copy or synchronisation).
  bool record_routing = false;
  bool draft = false;  // hold the draft module and run speculative decoding (engine_spec.cc)
  // Confidence/device drafts in graphs: each step past min_steps behind a conditional IF node
  // (skipped once every request stopped drafting). Off: every step runs, stopped rows padded.
  bool draft_early_exit = false;
  // Decode graphs under PDL: the o projection of more than 8 rows launches without PDL, so the
  // SMs drain out of the attention's shared-memory configuration before the GEMVs that re-read
  // their activation rows from L1 (docs/kernels.md, round 8). A measured option for batches of
  // 9-16 rows together with kernels' GemvTuning::pdl_max_rows = 16 (the other GEMVs keep PDL);
  // off: the kernels' rule alone (GEMVs of more than 8 rows without PDL).
  bool pdl_drain_after_attention = false;
  // The target model's decode and verify layers run rope_kv_append inside the attention's split
  // kernel (kernels' decode_attention_rope; docs/kernels.md round 19): one node fewer per layer,
  // the same tokens and cache bits. Experiments set it with policies.fusion.rope (the simulator
  // then drops the rope and KV-append kernels, ModelSpec::fusion). Off by default: the calibrated
  // profile's node gaps were measured with the separate rope (docs/calibration.md "Kernel fusion").
  bool fused_rope = false;
  // The target's RMSNorms carried by the GEMVs around them (kernels' gemv_norm.h; docs/kernels.md
  // round 21): o and down add into the residual stream and write its tile sums of squares, qkv
  // and gate+up scale by 1 / rms, their weights holding the norm weights (folded at load: the
  // engine's w_qkv / w_gu, and download_weight's, are the folded ones; every other pass normalises
  // with a unit weight before them). Decode batches of at most 16 rows and verify passes; larger
  // batches and prefill run the separate norms. Two norm nodes fewer per layer; tokens equal to
  // bf16 accuracy, not bit for bit (the roundings move). Dense models on one GPU (no tp, pp or
  // MoE). Experiments set it with policies.fusion.norms (the simulator drops the carried norms,
  // ModelSpec::fusion); off by default until a profile is measured with it.
  bool fused_norms = false;
  // Tensor parallelism (runtime/tensor_parallel.h): with a communicator, create_synthetic builds
  // this rank's shard of the model it is given and the forwards all-reduce after o_proj and
  // down_proj (MoE: expert parallelism, one all-reduce after the MoE FFN). With a draft: its
  // input projection replicated, its layer (dense or MoE) sharded like a model layer with the
  // same two all-reduces; no early exit (draft_early_exit refused). Checkpoints are not sharded
  // yet.
  TensorParallel tp;
  // A shard measured alone (tp.size > 1, no communicator): an empty kernel without PDL
  // (launch_collective_stub) at each all-reduce position, the break each collective makes in the
  // PDL chain of the real TP graphs (calibrate's collective_break samples).
  bool collective_stubs = false;
  // Pipeline parallelism (runtime/pipeline_parallel.h): with a communicator, create_synthetic
  // builds this stage of the model it is given (pp_stage_config) and the forwards hand the hidden
  // state to the next stage and the sampled ids back to stage 0 (NCCL send/recv, in prefill and
  // inside the decode graphs). Plain decode only (no draft, no tp), synthetic weights only.
  PipelineParallel pp;
};

// The layout and rank whose kernels an engine built with `options` runs, as the simulator lays a
// rank out (what a step's bytes_read counts): a tensor-parallel rank's shard (calibration_layout:
// MoE expert parallel with ep = tp, the whole vocabulary on every rank), a pipeline stage (one
// microbatch), else the whole model on one GPU (LayoutSpec{}, rank 0).
std::pair<LayoutSpec, int32_t> engine_shard(const EngineOptions& options, const ModelSpec& model);

// One draft launch: `steps` autoregressive draft forwards (1..kMaxDraftTokens). device_stop: a
// request stops drafting once it drafted min_steps tokens and a token's top-1 probability fell
// below threshold (policies/spec_rules.h); the stopped request's later positions are computed and
// ignored (padding). threshold also defines conf_len in the output rows.
struct DraftControl {
  int32_t steps = 1;
  bool device_stop = false;
  float threshold = 0.0f;
  int32_t min_steps = 1;
};
// The control of a draft of `steps` tokens under `spec` (device_stop for confidence device and
// host_blocking, whose draft lengths the device decides).
DraftControl draft_control(const SpecSpec& spec, int32_t steps);
// The widest verify (and extend) launch the engine runs for `config`: draft tokens + 1 <=
// kMaxDraftTokens + 1 (16 rows of gemv) and q_heads / kv_heads * width <= 64 (decode_attention's
// query rows per KV head): 16 for Llama-3 (group 4), 8 for Qwen3-30B-A3B (group 8).
int max_verify_width(const LlamaConfig& config);

class Engine {
 public:
  // draft_fidelity: synthetic_weight_list (checkpoint.h); < 0 plain random weights.
  static std::unique_ptr<Engine> create_synthetic(const LlamaConfig& config, uint64_t seed,
                                                  const EngineOptions& options,
                                                  double draft_fidelity = -1);
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
  // current sampling (no-op for eager or when already captured), and (every mode, once) runs
  // each prefill projection through cuBLAS once, so that a run's first prefill does not pay
  // cuBLAS's first-call costs (the suspected part of the 80-110 ms a process's first prefill
  // measured on the H200 above later ones; not yet confirmed). Not timed work: call before a
  // run.
  void prepare(GraphMode mode, int max_batch);

  // Untimed warm-up, synchronised: a 16-token prefill of slot 0, then `launches` batch-1 decode
  // launches of it in `mode` (fewer where the KV capacity is short). Slot 0's contents are
  // garbage after it: prefill it before use. Brings the GPU to its decode state before timed
  // work (docs/calibration.md "Warm-up before timed decode"). Collective under TP / PP: every
  // rank calls it with the same arguments.
  void warm_up(GraphMode mode, int launches);

  // Enqueues the prefill of `slots` (their prompts; the slot's previous contents are dropped).
  // Returns the launch sequence number of its output entry (rows in `slots` order).
  int64_t enqueue_prefill(std::span<const int32_t> slots,
                          std::span<const std::vector<int32_t>> prompts);
  // Enqueues one decode step of `slots` (1..max_slots distinct slots) in `mode`. profiled (needs
  // options().node_trace): the launch writes a GPU timestamp per kernel (node_timestamps);
  // options().profile_nodes profiles every launch.
  int64_t enqueue_decode(std::span<const int32_t> slots, GraphMode mode, bool profiled = false);
  // Speculative decoding (options().draft, greedy sampling; docs/runtime.md). With a draft, a
  // prefill also seeds the slot's draft state. One round of `slots` is enqueue_draft, then
  // enqueue_verify, then enqueue_extend, with the same slots in the same order, nothing else of
  // these slots in between (host_blocking may read the draft's output entry before verify).
  // Graph modes: eager or a captured graph per (bucket, steps or width); kCudaGraphPdl runs as
  // kCudaGraph (no programmatic dependent launch in these graphs).
  //   draft:  each request drafts ctl.steps tokens (fewer with device_stop); writes an output
  //           entry (draft_len, conf_len, draft tokens, confidences) and returns its sequence.
  //   verify: the target over the committed token and the drafts, `width` positions per request
  //           (2..16, >= the draft length + 1), greedy acceptance on the device; commits
  //           accepted + 1 tokens per request (the KV keeps the accepted prefix, ctx advances by
  //           accepted + 1) and writes an output entry, whose sequence it returns.
  //   extend: rewrites the draft's KV of the accepted positions from the target's hidden states
  //           (same width as verify). Writes no output entry.
  // Capacity: a request needs ctx + width <= capacity_tokens before each verify.
  int64_t enqueue_draft(std::span<const int32_t> slots, const DraftControl& ctl, GraphMode mode);
  int64_t enqueue_verify(std::span<const int32_t> slots, int32_t width, float threshold,
                         GraphMode mode);
  void enqueue_extend(std::span<const int32_t> slots, int32_t width, GraphMode mode);
  // Sets the context length of each of `slots` to `ctx` on the compute stream, after the work
  // already issued: the next launch decodes from there (the KV cache past it stays and is
  // overwritten). Calibration only (runtime/calibrate.cc): speculative rounds timed again and
  // again from one context, so the engine's capacity (which sets the attention's partition) can
  // be the context's plus one round. Throws Error for a slot outside [0, max_slots) or ctx
  // outside [1, capacity_tokens].
  void rewind_context(std::span<const int32_t> slots, int32_t ctx);
  // Captures the speculative graphs `spec` can use for every bucket up to max_batch (no-op for
  // eager). Not timed work: call before a run.
  void prepare_spec(GraphMode mode, int max_batch, const SpecSpec& spec);

  // Copies the first `rows` rows of output entry `seq` to pinned host memory on `stream`.
  void enqueue_output_copy(int64_t seq, int32_t rows, cudaStream_t stream);
  // Pinned host rows of entry `seq`; valid once the copy completed and until kOutputRing more
  // launches were issued.
  const OutputRow* host_outputs(int64_t seq) const;

  // Kernel names of one decode launch of `batch` rows in node order (a profiled launch's
  // timestamps bracket them: timestamp j is taken just before kernel j, the last one after the
  // last kernel).
  const std::vector<const char*>& decode_node_names(int batch) const;
  // Copies the timestamps (GPU globaltimer ns) of the most recent launches back:
  // result[seq] = timestamps, for seqs still in the timestamp ring (meaningful for profiled
  // launches only; empty without profile_nodes or node_trace). Synchronises.
  std::map<int64_t, std::vector<uint64_t>> node_timestamps(int64_t first_seq, int64_t last_seq);

  // The routing of decode or verify launch `seq` (options().record_routing, MoE): ids[(layer *
  // rows + row) * top_k + j], expert j of row `row` of MoE layer `layer` (this engine's layers),
  // for the launch's first `rows` rows (<= its bucket; a verify's row r * W + j is request r's
  // position j, -1 where padded). Valid once the launch completed and while
  // seq is within the last kTsRing launches; throws Error otherwise or without record_routing.
  // Synchronises a side stream (host time only).
  std::vector<int32_t> decode_routing(int64_t seq, int32_t rows);

  // Device weight bits of a Hugging Face tensor (tests). Synchronises.
  std::vector<uint16_t> download_weight(const std::string& name) const;
  int64_t weight_bytes() const { return weight_bytes_; }

 private:
  struct Buffers;
  struct Spec;
  enum class SpecPhase { kDraft, kVerify, kExtend };
  struct GraphKey {
    int bucket;
    GraphMode mode;
    Sampling sampling;
    bool profiled;  // a timestamp per kernel
    bool operator<(const GraphKey& o) const {
      return std::tie(bucket, mode, sampling, profiled) <
             std::tie(o.bucket, o.mode, o.sampling, o.profiled);
    }
  };

  Engine(const LlamaConfig& config, const EngineOptions& options);
  void allocate();
  void init_synthetic(uint64_t seed, double draft_fidelity);
  void upload(const Checkpoint& checkpoint);
  // tensor_parallel.cc: the shard of `full` (options.tp), its sliced synthetic init, and the
  // all-reduce (bf16 sum, in place, rows x hidden) after a row-parallel projection (a named trace
  // node unless name is null: the draft's, whose kernels are not traced one by one).
  static std::unique_ptr<Engine> create_synthetic_tp(const LlamaConfig& full, uint64_t seed,
                                                     const EngineOptions& options,
                                                     double draft_fidelity);
  void init_synthetic_tp(const LlamaConfig& full, uint64_t seed, double draft_fidelity);
  void tp_all_reduce(kernels::bf16* x, int rows, const char* name);
  // tensor_parallel.cc, pipeline parallelism: the stage of `full` (options.pp) and its synthetic
  // init (the one-GPU engine's values of the tensors it holds); the hand-offs of `rows` rows
  // between stages, on compute_ (no-ops without options.pp): pp_send_hidden / pp_recv_hidden
  // carry the residual stream and the last layer's MLP output (not yet added) to the next stage,
  // pp_ids the sampled ids of `rows` rows from the last stage to stage 0 (sampled on both).
  static std::unique_ptr<Engine> create_synthetic_pp(const LlamaConfig& full, uint64_t seed,
                                                     const EngineOptions& options,
                                                     double draft_fidelity);
  void init_synthetic_pp(const LlamaConfig& full, uint64_t seed, double draft_fidelity);
  void pp_send_hidden(int rows);
  void pp_recv_hidden(int rows);
  void pp_ids(int rows);
  // The decode forward of bucket B on compute_ (eager or under capture). commit = false runs
  // the forward without touching the relay or the counters (warm-up before capture); profiled
  // (with commit) writes a timestamp before each kernel and after the last.
  void decode_forward(int bucket, bool pdl, bool commit, bool profiled);
  // The target's layers over requests * q_len embedded rows of the residual stream (decode:
  // q_len 1; verify: the draft width). Leaves the last layer's MLP output in mlp (not yet added).
  // moe_routed (device, one int per row, optional): MoE layers route only rows with a nonzero
  // entry (moe_ffn).
  // With EngineOptions::fused_norms and carries_norms(rows, row_exact), the MLP output is added
  // already (the residual stream is complete, mlp unused).
  void target_layers(int requests, int q_len, const int* ctx_lens, kernels::bf16* const* bases,
                     void* attn_ws, bool row_exact, bool pdl, const int* moe_routed = nullptr);
  // Whether target_layers over `rows` rows carries the norms in its GEMVs (fused_norms).
  bool carries_norms(int rows, bool row_exact) const;
  // A layer norm's weight for a pass that normalises separately: a unit weight where fused_norms
  // folded it into the next GEMV's weights.
  const kernels::bf16* norm_weight(const kernels::bf16* weight) const;
  // fused_norms: the layers' norm weights folded into w_qkv and w_gu (after the weights load).
  void fold_norm_weights();
  // The FFN of MoE layer `layer` (config.layers: the draft's layer): moe_forward over `rows` rows
  // of xn into mlp on stream s, in calls of at most kGemvMaxRows rows (the kernels' limit; each
  // row is routed on its own, so the chunking changes no result). Under expert parallelism, this
  // rank's experts and shared-expert slice only: a partial sum the caller all-reduces. Records
  // routing (EngineOptions::record_routing) in a decode or verify launch only (routing_).
  // routed (device, `rows` ints, optional): a row with 0 selects no expert (kernels/moe.h
  // active_rows: a verify's padded positions).
  void moe_ffn(int layer, int rows, bool pdl, cudaStream_t s, const int* routed = nullptr);
  // The same FFN for a prefill pass of rows > kGemvMaxRows: moe_prefill in calls of at most
  // Buffers::moe_prefill_rows rows (kMoePrefillRowsPerCall, memory_plan.h), no PDL.
  void moe_ffn_prefill(int layer, int rows);
  // Layer `layer`'s router and experts (config.layers: the draft's layer).
  kernels::MoeWeights moe_weights(int layer) const;
  void prefill_pass(std::span<const int32_t> slots, std::span<const std::vector<int32_t>> prompts,
                    int row_offset, bool last_pass);
  void proj(const kernels::bf16* w, const kernels::bf16* x, kernels::bf16* out, int m, int n, int k,
            bool pdl);
  void node(const char* name);
  void upload_batch(std::span<const int32_t> slots, int bucket);
  // engine_spec.cc
  void allocate_spec();
  void draft_forward(int bucket, const DraftControl& ctl, bool commit);
  void draft_step(int bucket, int j, const DraftControl& ctl, cudaStream_t s);
  void verify_forward(int bucket, int width, float threshold, bool commit);
  void extend_forward(int bucket, int width);
  void draft_prefill(int tokens, int chunks, int chunk, const int* d_tok, const int* d_chunk_ctx,
                     kernels::bf16* const* d_bases);
  void draft_kv(const int* tok, const kernels::bf16* h, int rows, const int* ctx_lens,
                kernels::bf16* const* bases, int requests, int q_len, bool row_exact);
  void proj_rows(const kernels::bf16* w, const kernels::bf16* x, kernels::bf16* out, int m, int n,
                 int k, cudaStream_t s);
  // row_exact: 16-row gemv chunks, each row bit-identical to plain decode's; else proj().
  void project_rows(const kernels::bf16* w, const kernels::bf16* x, kernels::bf16* out, int m,
                    int n, int k, bool row_exact, bool pdl);
  int64_t spec_launch(SpecPhase phase, std::span<const int32_t> slots, int n,
                      const DraftControl& ctl, GraphMode mode);
  void run_spec_forward(SpecPhase phase, int bucket, int n, const DraftControl& ctl, bool commit);
  // Throws Error for a draft of n steps outside [1, kMaxDraftTokens] or a verify / extend width
  // outside [2, max_verify_width].
  void check_spec_shape(SpecPhase phase, int n) const;
  cudaGraphExec_t spec_graph(SpecPhase phase, int bucket, int n, const DraftControl& ctl);
  void* staging(int64_t seq);

  LlamaConfig config_;
  EngineOptions options_;
  Sampling sampling_;
  kernels::RopeTable rope_{};
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  bool prefill_gemm_gemv_ = false;   // TWINSTEP_PREFILL_GEMM=gemv (engine.cc prefill_gemm_is_gemv)
  bool prefill_gemms_warm_ = false;  // warm_prefill_gemms ran
  // The prefill projections (qkv, o and the dense MLP's) over min(max_prefill_tokens, 256) zero
  // rows of layer 0 into the scratch buffers, once per engine (prepare, prepare_spec).
  void warm_prefill_gemms();
  std::unique_ptr<Buffers> b_;
  std::unique_ptr<Spec> spec_;
  bool capturing_spec_ = false;  // a speculative graph is being captured (spec_graph)
  int64_t weight_bytes_ = 0;
  int64_t next_seq_ = 0;  // host mirror of the device launch counter
  int max_bucket_ = 1;
  std::map<GraphKey, cudaGraphExec_t> graphs_;
  std::vector<int32_t> uploaded_slots_;  // batch slot list currently on the device
  // Node naming while a forward is enqueued.
  std::vector<const char*>* names_ = nullptr;
  bool timestamps_ = false;
  bool routing_ = false;  // the forward being enqueued writes the routing ring (decode, verify)
  int node_index_ = 0;
  mutable std::map<int, std::vector<const char*>> node_names_;
};

}  // namespace twinstep::runtime
