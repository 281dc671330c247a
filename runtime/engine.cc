#include "runtime/engine.h"

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>

#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/gemv.h"
#include "kernels/gemv_norm.h"
#include "kernels/kv_cache.h"
#include "kernels/lm_head.h"
#include "kernels/moe.h"
#include "kernels/norm.h"
#include "kernels/swiglu.h"
#include "policies/error.h"
#include "policies/step_kernels.h"
#include "runtime/cublas_loader.h"
#include "runtime/engine_internal.h"
#include "runtime/memory_plan.h"
#include "runtime/spec_ops.h"
#include "runtime/synthetic.h"

namespace twinstep::runtime {

using kernels::bf16;

void throw_cublas_error(cublasStatus_t st, const char* expr, const char* file, int line) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr +
                           ": cuBLAS status " + std::to_string(static_cast<int>(st)) + " (" +
                           cublas_api().status_string(st) + ")");
}

namespace {

constexpr int kStagingRing = 64;  // pinned host staging entries for host-to-device inputs
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
// EngineOptions::pdl_drain_after_attention applies above this many rows: the batches whose
// GEMVs keep their activation rows in L1 (the 16-row register path and ring; docs/kernels.md).
constexpr int kDrainAfterAttentionRows = 8;

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// How projections over more than kernels::kGemvMaxRows rows (prefill, verify) are computed:
// cuBLAS (the default), or, with TWINSTEP_PREFILL_GEMM=gemv, the decode GEMV kernel over
// kGemvMaxRows-row slices. The second is a diagnostic path for compute-sanitizer initcheck, which
// does not see the stores of cuBLAS's sm_90 GEMM kernels
// (tests/reliability/cublas_initcheck_probe.cu shows it), so every byte the engine reads is
// written by a kernel the tool tracks; it is slower and rounds like the decode path. Any other
// value is an error.
bool prefill_gemm_is_gemv() {
  const char* v = std::getenv("TWINSTEP_PREFILL_GEMM");
  if (v == nullptr || *v == '\0' || std::string(v) == "cublas") return false;
  if (std::string(v) == "gemv") return true;
  throw Error(std::string("TWINSTEP_PREFILL_GEMM=") + v + ": expected cublas or gemv");
}

kernels::MoeShape moe_shape(const LlamaConfig& c) {
  kernels::MoeShape s;
  s.num_experts = c.num_experts;
  s.top_k = c.top_k;
  s.hidden = int(c.hidden);
  s.expert_inter = int(c.expert_intermediate);
  s.shared_inter = int(c.shared_intermediate);
  s.renormalize = c.norm_topk_prob;
  s.expert_begin = c.expert_begin;  // an expert-parallel rank: its block only
  s.expert_end = c.expert_begin + c.local_experts();
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// buffers

Engine::Engine(const LlamaConfig& config, const EngineOptions& options)
    : config_(config), options_(options), b_(std::make_unique<Buffers>()) {
  const LlamaConfig& c = config_;
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw ConfigError("", "real runtime: " + what);
  };
  need(c.head_dim == kernels::kHeadDim,
       "head_dim must be 128 (decode_attention), got " + std::to_string(c.head_dim));
  need(c.hidden % 64 == 0 && c.intermediate % 64 == 0 && c.vocab % 64 == 0,
       "hidden, intermediate and vocab must be multiples of 64");
  if (c.moe()) {  // kernels/moe.h's limits
    need(c.num_experts >= 16 && c.num_experts <= 256 && c.num_experts % 16 == 0,
         "num_experts must be a multiple of 16 in [16, 256] (kernels/moe.h), got " +
             std::to_string(c.num_experts));
    need(c.top_k >= 1 && c.top_k <= std::min(16, c.num_experts),
         "top_k must be in [1, min(16, num_experts)] (kernels/moe.h), got " +
             std::to_string(c.top_k));
    need(c.expert_intermediate > 0 && c.expert_intermediate % 64 == 0 &&
             c.shared_intermediate >= 0 && c.shared_intermediate % 64 == 0,
         "expert and shared-expert intermediate sizes must be multiples of 64, got " +
             std::to_string(c.expert_intermediate) + " and " +
             std::to_string(c.shared_intermediate));
    // Tensor parallelism of MoE layers: expert parallelism with ep = tp only, the rank's config
    // holding its block of experts (tp_shard_config); a block without its group computes a
    // partial FFN that nothing sums.
    const int32_t ranks = options.tp.size;  // > 1 without a communicator: a shard measured alone
    need(c.expert_begin >= 0 && c.local_experts() >= 1 &&
             c.expert_begin + c.local_experts() <= c.num_experts,
         "expert block [" + std::to_string(c.expert_begin) + ", " +
             std::to_string(c.expert_begin + c.local_experts()) + ") outside the " +
             std::to_string(c.num_experts) + " experts");
    need(int64_t{c.local_experts()} * ranks == c.num_experts,
         "an MoE rank must hold num_experts / tp experts (expert parallelism with ep = tp, "
         "tp_shard_config), got " +
             std::to_string(c.local_experts()) + " of " + std::to_string(c.num_experts) +
             " experts at tp " + std::to_string(ranks));
  } else {
    need(c.intermediate > 0, "a dense model needs intermediate > 0");
  }
  need(c.q_heads % c.kv_heads == 0 && c.q_heads / c.kv_heads <= 64,
       "q heads must be a multiple of KV heads, group <= 64");
  // Pipeline parallelism: the config is this stage's (pp_stage_config), the stage needs its
  // communicator, and the other parallelisms and the draft are not combined with it.
  const PipelineParallel& pp = options.pp;
  need(pp.stages >= 1 && pp.stage >= 0 && pp.stage < pp.stages,
       "pipeline stage " + std::to_string(pp.stage) + " outside [0, " + std::to_string(pp.stages) +
           ")");
  need(c.holds_embedding == pp.first() && c.holds_head == pp.last(),
       "the config is not stage " + std::to_string(pp.stage) + " of " + std::to_string(pp.stages) +
           "'s (runtime/pipeline_parallel.h pp_stage_config)");
  if (pp.stages > 1) {
    need(pp.active(), "a pipeline stage needs its communicator (EngineOptions::pp.comm)");
    need(!options.tp.active() && options.tp.size == 1,
         "pipeline and tensor parallelism together are not implemented");
    need(!options.draft, "speculative decoding with pipeline parallelism is not implemented");
  }
  need(!options.collective_stubs || (options.tp.size > 1 && !options.tp.active()),
       "collective_stubs is for a tensor-parallel shard measured alone (tp.size > 1, no "
       "communicator)");
  need(!options.fused_norms || (!c.moe() && options.tp.size == 1 && pp.stages == 1),
       "fused_norms needs a dense model on one GPU (no MoE, tensor or pipeline parallelism)");
  need(options.max_slots >= 1 && options.max_slots <= 1024, "max_slots outside [1, 1024]");
  need(options.capacity_tokens >= 16 && options.capacity_tokens % 16 == 0,
       "capacity_tokens must be a positive multiple of 16");
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) throw Error("real runtime: no CUDA device");
  // Spin rather than yield in event waits: the host loop is latency-critical.
  if (cudaSetDeviceFlags(cudaDeviceScheduleSpin) != cudaSuccess) (void)cudaGetLastError();
  // Refuse a model that does not fit before creating or allocating anything (memory_plan.h).
  size_t free_bytes = 0, total_bytes = 0;
  TS_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  require_fits(plan_engine_memory(c, options.max_slots, options.capacity_tokens,
                                  options.max_prefill_tokens, options.draft),
               c, "", dev, free_bytes, total_bytes);
  rope_ = kernels::llama3_rope_table(c.rope_theta, c.rope_factor, c.rope_low_freq_factor,
                                     c.rope_high_freq_factor, c.rope_original_context);
  const CublasApi& blas = cublas_api();  // before any resource: a missing library leaks nothing
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&b_->aux, cudaStreamNonBlocking));
  TS_CUBLAS_CHECK(blas.create(&cublas_));
  b_->cublas = cublas_;
  TS_CUBLAS_CHECK(blas.set_stream(cublas_, compute_));
  TS_CUBLAS_CHECK(blas.set_math_mode(
      cublas_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                         CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  prefill_gemm_gemv_ = prefill_gemm_is_gemv();
  max_bucket_ = bucket_for(options.max_slots);
  allocate();
}

Engine::~Engine() {
  for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g);
  if (spec_) {
    for (auto& [k, g] : spec_->graphs) cudaGraphExecDestroy(g);
    if (spec_->side) cudaStreamDestroy(spec_->side);
  }
  if (compute_) cudaStreamSynchronize(compute_);
  if (copy_) cudaStreamSynchronize(copy_);
  for (cudaEvent_t e : b_->staging_done) cudaEventDestroy(e);
  if (cublas_) cublas_api().destroy(cublas_);
  if (b_->aux) cudaStreamDestroy(b_->aux);
  if (compute_) cudaStreamDestroy(compute_);
  if (copy_) cudaStreamDestroy(copy_);
}

// The one bucket rule the simulator prices too (policies/step_kernels.h).
int Engine::bucket_for(int batch) { return batch_bucket(batch); }

void Engine::allocate() {
  const LlamaConfig& c = config_;
  Buffers& b = *b_;
  const int64_t H = c.hidden, I = c.intermediate, V = c.vocab;
  // Weights: one allocation, 256-byte aligned tensors.
  int64_t elems = 0;
  auto reserve = [&](int64_t n) {
    const int64_t at = elems;
    elems += (n + 127) / 128 * 128;
    return at;
  };
  // MoE: every expert's gate_up in one [E][2 EI][H] tensor and down in one [E][H][EI], so each
  // Hugging Face expert tensor is a contiguous slice (kernels/moe.h layouts).
  // Expert parallelism: only the rank's experts (E_local), the router over all E.
  const int64_t E = c.num_experts, E_local = c.local_experts(), EI = c.expert_intermediate,
                SI = c.shared_intermediate;
  // A layer's tensors as offsets into the allocation (-1: absent), memory_plan.cc's order.
  struct LayerAt {
    int64_t in = -1, qkv = -1, o = -1, post = -1, gu = -1, down = -1, router = -1, sgu = -1,
            sdown = -1;
  };
  auto reserve_layer = [&] {
    LayerAt at;
    at.in = reserve(H);
    at.qkv = reserve(c.qkv_dim() * H);
    at.o = reserve(H * c.q_dim());
    at.post = reserve(H);
    if (c.moe()) {
      at.router = reserve(E * H);
      at.gu = reserve(E_local * 2 * EI * H);
      at.down = reserve(E_local * H * EI);
      if (SI > 0) {
        at.sgu = reserve(2 * SI * H);
        at.sdown = reserve(H * SI);
      }
    } else {
      at.gu = reserve(2 * I * H);
      at.down = reserve(H * I);
    }
    return at;
  };
  // A pipeline stage (pipeline_parallel.h) holds the embedding on the first stage, the final norm
  // and lm_head on the last (a tied lm_head is the embedding matrix); -1: not held.
  const bool embed_held = c.holds_embedding || (c.holds_head && c.tie_embeddings);
  const int64_t at_embed = embed_held ? reserve(V * H) : -1;
  std::vector<LayerAt> at_layer;
  for (int l = 0; l < c.layers; ++l) at_layer.push_back(reserve_layer());
  const int64_t at_norm = c.holds_head ? reserve(H) : -1;
  const int64_t at_lm = !c.holds_head ? -1 : c.tie_embeddings ? at_embed : reserve(V * H);
  // The draft module: its input tensors, then one layer laid out as a model layer.
  int64_t at_enorm = -1, at_hnorm = -1, at_eh = -1;
  LayerAt at_draft;
  if (options_.draft) {
    at_enorm = reserve(H);
    at_hnorm = reserve(H);
    at_eh = reserve(H * 2 * H);
    at_draft = reserve_layer();
  }
  bf16* w = b.dev<bf16>(size_t(elems), "weights");
  weight_bytes_ = elems * 2;
  auto ptr = [&](int64_t at) { return at < 0 ? nullptr : w + at; };
  auto layer_ptrs = [&](const LayerAt& at) {
    return LayerWeights{ptr(at.in),   ptr(at.qkv),    ptr(at.o),   ptr(at.post), ptr(at.gu),
                        ptr(at.down), ptr(at.router), ptr(at.sgu), ptr(at.sdown)};
  };
  b.embed = ptr(at_embed);
  b.final_norm = ptr(at_norm);
  b.lm_head = ptr(at_lm);
  for (const LayerAt& at : at_layer) b.layer.push_back(layer_ptrs(at));
  if (options_.draft) b.draft = {ptr(at_enorm), ptr(at_hnorm), ptr(at_eh), layer_ptrs(at_draft)};

  // Every checkpoint tensor's place: `rest` is the name after the layer prefix.
  auto in_layer = [&](const LayerWeights& L, const std::string& rest) -> bf16* {
    if (rest == "input_layernorm.weight") return L.in_norm;
    if (rest == "post_attention_layernorm.weight") return L.post_norm;
    if (rest == "self_attn.q_proj.weight") return L.w_qkv;
    if (rest == "self_attn.k_proj.weight") return L.w_qkv + c.q_dim() * H;
    if (rest == "self_attn.v_proj.weight") return L.w_qkv + (c.q_dim() + c.kv_dim()) * H;
    if (rest == "self_attn.o_proj.weight") return L.w_o;
    if (rest == "mlp.gate_proj.weight") return L.w_gu;
    if (rest == "mlp.up_proj.weight") return L.w_gu + I * H;
    if (rest == "mlp.down_proj.weight") return L.w_down;
    if (rest == "mlp.gate.weight") return L.router;
    if (rest.rfind("mlp.experts.", 0) == 0) {  // mlp.experts.J.<proj>.weight
      const size_t at = std::strlen("mlp.experts."), end = rest.find('.', at);
      const int64_t j = std::stoll(rest.substr(at, end - at)) - c.expert_begin;  // local
      assert(j >= 0 && j < E_local);
      const std::string proj = rest.substr(end + 1);
      if (proj == "gate_proj.weight") return L.w_gu + j * 2 * EI * H;
      if (proj == "up_proj.weight") return L.w_gu + (j * 2 + 1) * EI * H;
      if (proj == "down_proj.weight") return L.w_down + j * H * EI;
      return nullptr;
    }
    if (rest == "mlp.shared_expert.gate_proj.weight") return L.shared_gu;
    if (rest == "mlp.shared_expert.up_proj.weight") return L.shared_gu + SI * H;
    if (rest == "mlp.shared_expert.down_proj.weight") return L.shared_down;
    return nullptr;
  };
  std::vector<WeightDesc> names = llama_weight_list(c);
  if (options_.draft) {
    const std::vector<WeightDesc> d = draft_weight_list(c);
    names.insert(names.end(), d.begin(), d.end());
  }
  const std::string model_prefix = "model.layers.", draft_prefix = "mtp.layer.";
  for (const WeightDesc& d : names) {
    int64_t n = 1;
    for (int64_t s : d.shape) n *= s;
    const std::string& nm = d.name;
    bf16* p = nullptr;
    if (nm == "model.embed_tokens.weight")
      p = b.embed;
    else if (nm == "model.norm.weight")
      p = b.final_norm;
    else if (nm == "lm_head.weight")
      p = b.lm_head;
    else if (nm == "mtp.enorm.weight")
      p = b.draft.enorm;
    else if (nm == "mtp.hnorm.weight")
      p = b.draft.hnorm;
    else if (nm == "mtp.eh_proj.weight")
      p = b.draft.eh_proj;
    else if (nm.rfind(draft_prefix, 0) == 0)
      p = in_layer(b.draft.layer, nm.substr(draft_prefix.size()));
    else if (nm.rfind(model_prefix, 0) == 0) {
      const size_t dot = nm.find('.', model_prefix.size());
      const int l = std::stoi(nm.substr(model_prefix.size(), dot - model_prefix.size())) -
                    c.first_layer;  // the stage's index
      assert(l >= 0 && l < c.layers);
      p = in_layer(b.layer[size_t(l)], nm.substr(dot + 1));
    }
    if (p == nullptr) throw Error("engine: no place for checkpoint tensor " + nm);
    b.by_name[nm] = {p, n};
  }

  // KV cache and relay.
  const int slots = options_.max_slots + 1;
  // With a draft, each slot holds one more layer: the draft layer's KV (engine_internal.h).
  kernels::KvCache shape{nullptr, c.layers + (options_.draft ? 1 : 0), c.kv_heads,
                         options_.capacity_tokens};
  const size_t per_slot = kernels::kv_cache_bytes_per_request(shape) / sizeof(bf16);
  bf16* pool = b.dev<bf16>(per_slot * slots, "KV cache");
  for (int s = 0; s < slots; ++s) b.slot_base_host.push_back(pool + per_slot * s);
  b.slot_base = b.dev<bf16*>(slots);
  TS_CUDA_CHECK(cudaMemcpy(b.slot_base, b.slot_base_host.data(), sizeof(bf16*) * slots,
                           cudaMemcpyHostToDevice));
  b.tokens = b.dev<int>(slots);
  b.ctx = b.dev<int>(slots);
  TS_CUDA_CHECK(cudaMemset(b.tokens, 0, sizeof(int) * slots));
  TS_CUDA_CHECK(cudaMemset(b.ctx, 0, sizeof(int) * slots));

  // Prefill chunking: pseudo-requests of `chunk` queries, group * chunk <= 64 rows (the rule the
  // simulator prices prefill attention by, policies/step_kernels.h).
  b.chunk = prefill_attention_chunk(int32_t(c.q_heads), int32_t(c.kv_heads));
  options_.max_prefill_tokens = int32_t(align_up(
      size_t(std::max(options_.max_prefill_tokens, options_.capacity_tokens)), size_t(b.chunk)));
  b.chunks_max = options_.max_prefill_tokens / b.chunk;
  b.rows_max = std::max(options_.max_prefill_tokens,
                        max_bucket_ * (options_.draft ? kMaxDraftTokens + 1 : 1));
  const size_t R = size_t(b.rows_max);
  b.batch_slots = b.dev<int>(max_bucket_);
  b.tok_in = b.dev<int>(max_bucket_);
  b.ctx_b = b.dev<int>(max_bucket_);
  b.base_b = b.dev<bf16*>(max_bucket_);
  b.residual = b.dev<bf16>(R * H);
  b.xn = b.dev<bf16>(R * H);
  b.qkv = b.dev<bf16>(R * c.qkv_dim());
  b.q = b.dev<bf16>(R * c.q_dim());
  b.attn = b.dev<bf16>(R * c.q_dim());
  b.o = b.dev<bf16>(R * H);
  // With a draft, gu also holds the draft's input concatenation [embedding; hidden] (2 H a row).
  b.gu = b.dev<bf16>(R * 2 * std::max(I, options_.draft ? H : 0));
  b.act = b.dev<bf16>(R * I);
  b.mlp = b.dev<bf16>(R * H);
  if (options_.fused_norms) {  // within memory_plan's allowance (rows x hidden / 4 bytes)
    const size_t carried_rows = size_t(max_bucket_) * (options_.draft ? kMaxDraftTokens + 1 : 1);
    b.norm_sq = b.dev<float>(carried_rows * size_t(H) / 16, "fused norms' sums of squares");
    b.unit_norm = b.dev<bf16>(size_t(H), "unit norm weight");
    const std::vector<uint16_t> ones(size_t(H), 0x3F80);  // bf16 1.0
    TS_CUDA_CHECK(cudaMemcpy(b.unit_norm, ones.data(), ones.size() * 2, cudaMemcpyHostToDevice));
  }
  const int out_rows = std::max(max_bucket_, options_.max_slots);
  b.last_res = b.dev<bf16>(size_t(out_rows) * H);
  b.last_mlp = b.dev<bf16>(size_t(out_rows) * H);
  const int lm_chunks = (out_rows + kernels::kGemvMaxRows - 1) / kernels::kGemvMaxRows;
  b.lm_ws_chunk = align_up(kernels::lm_head_workspace_bytes(kernels::kGemvMaxRows, int(V)), 256);
  b.lm_ws = b.dev<char>(b.lm_ws_chunk * lm_chunks);
  b.argmax = b.dev<int>(out_rows);
  b.sampled = b.dev<int>(out_rows);
  b.top1 = b.dev<float>(out_rows);

  // Attention workspace: the largest of every decode bucket and every prefill chunk count.
  size_t ws = 0;
  kernels::KvCache cache{nullptr, c.layers, c.kv_heads, options_.capacity_tokens};
  for (int bucket = 1; bucket <= max_bucket_; bucket *= 2)
    ws = std::max(ws, kernels::attention_workspace_bytes(
                          {bucket, 1, c.q_heads, 0.08838834764831845f}, cache));
  for (int n = 1; n <= b.chunks_max; ++n)
    ws = std::max(ws, kernels::attention_workspace_bytes(
                          {n, b.chunk, c.q_heads, 0.08838834764831845f}, cache));
  b.attn_ws = b.dev<char>(ws, "attention workspace");
  if (c.moe()) {
    // One workspace for moe_forward's widest call (kGemvMaxRows rows: decode, short prefills)
    // and moe_prefill's (moe_prefill_rows rows per call): both run on compute_, in stream order.
    const kernels::MoeShape shape = moe_shape(c);
    const size_t decode_ws = kernels::moe_workspace_bytes(kernels::kGemvMaxRows, shape);
    assert(int64_t(decode_ws) == plan_moe_workspace_bytes(c, kernels::kGemvMaxRows));
    b.moe_prefill_rows = std::min(kMoePrefillRowsPerCall, options_.max_prefill_tokens);
    size_t prefill_ws = 0;
    if (b.moe_prefill_rows > kernels::kGemvMaxRows) {
      prefill_ws = kernels::moe_prefill_workspace_bytes(b.moe_prefill_rows, shape);
      assert(int64_t(prefill_ws) == plan_moe_prefill_workspace_bytes(c, b.moe_prefill_rows));
    }
    b.moe_ws = b.dev<char>(std::max(decode_ws, prefill_ws), "MoE workspace");
    if (options_.record_routing) {
      // Not in memory_plan's totals: kTsRing * layers * rows * top_k * 4 B (6.3 MB for
      // Qwen3-30B-A3B at 16 rows), within its allowance. Rows: a decode launch's bucket, or with a
      // draft module a verify's bucket x its widest verify (Qwen3-30B-A3B at one slot: 8 rows).
      b.routing_rows = max_bucket_ * (options_.draft ? max_verify_width(c) : 1);
      b.routing_entry = size_t(c.layers) * size_t(b.routing_rows) * size_t(c.top_k);
      b.routing = b.dev<int>(size_t(kTsRing) * b.routing_entry, "MoE routing ring");
      TS_CUDA_CHECK(cudaMemset(b.routing, 0xff, size_t(kTsRing) * b.routing_entry * sizeof(int)));
    }
  }

  b.ring_rows = out_rows;
  b.out_ring = b.dev<OutputRow>(size_t(kOutputRing) * out_rows);
  TS_CUDA_CHECK(cudaMallocHost(&b.host_ring, sizeof(OutputRow) * kOutputRing * out_rows));
  b.host_allocs.push_back(b.host_ring);
  std::fill_n(b.host_ring, size_t(kOutputRing) * out_rows, OutputRow{});
  b.seq = b.dev<uint64_t>(1);
  b.sample_step = b.dev<uint64_t>(1);
  TS_CUDA_CHECK(cudaMemset(b.seq, 0, 8));
  TS_CUDA_CHECK(cudaMemset(b.sample_step, 0, 8));
  b.ts_nodes = 16 * c.layers + 16 + lm_chunks;
  if (options_.profile_nodes || options_.node_trace) {
    // Zeroed: a launch writes its nodes' entries only, and node_timestamps copies whole rows (0 =
    // no node there; compute-sanitizer initcheck found the unwritten tail being read).
    b.ts = b.dev<uint64_t>(size_t(kTsRing) * b.ts_nodes);
    TS_CUDA_CHECK(cudaMemset(b.ts, 0, size_t(kTsRing) * b.ts_nodes * sizeof(uint64_t)));
  }

  // Host-to-device staging: [tokens T][chunk ctx C][last rows S][slots S][lens S][chunk base C].
  const size_t T = size_t(options_.max_prefill_tokens), C = size_t(b.chunks_max);
  const size_t S = size_t(std::max(out_rows, options_.max_slots));
  b.off_chunk_ctx = 4 * T;
  b.off_last = b.off_chunk_ctx + 4 * C;
  b.off_slots = b.off_last + 4 * S;
  b.off_lens = b.off_slots + 4 * S;
  b.off_base = align_up(b.off_lens + 4 * S, 16);
  b.meta_bytes = align_up(b.off_base + 8 * C, 256);
  b.meta = b.dev<char>(b.meta_bytes);
  TS_CUDA_CHECK(cudaMallocHost(&b.staging, b.meta_bytes * kStagingRing));
  b.host_allocs.push_back(b.staging);
  b.staging_done.resize(kStagingRing);
  for (cudaEvent_t& e : b.staging_done) {
    TS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    TS_CUDA_CHECK(cudaEventRecord(e, compute_));
  }
  TS_CUDA_CHECK(cudaMalloc(&b.cublas_ws, kCublasWorkspaceBytes));
  b.device_allocs.push_back(b.cublas_ws);
  TS_CUBLAS_CHECK(cublas_api().set_workspace(cublas_, b.cublas_ws, kCublasWorkspaceBytes));
  if (options_.draft) allocate_spec();
  TS_CUDA_CHECK(cudaDeviceSynchronize());
}

void Engine::init_synthetic(uint64_t seed, double draft_fidelity) {
  for (const WeightDesc& d : synthetic_weight_list(config_, options_.draft, draft_fidelity)) {
    const auto& [p, n] = b_->by_name.at(d.name);
    if (d.eye) {  // a structured tensor: made on the host (synthetic_tensor_bits), uploaded
      std::vector<uint16_t> bits(static_cast<size_t>(n));
      synthetic_tensor_bits(d, seed, 0, uint64_t(n), bits.data());
      TS_CUDA_CHECK(cudaMemcpy(p, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
      continue;
    }
    const float scale = d.init_std == 0 ? 0.0f : synthetic::scale_for_std(d.init_std);
    launch_init_synthetic(reinterpret_cast<uint16_t*>(p), uint64_t(n), seed,
                          synthetic::tensor_stream(d.name), scale, compute_);
  }
  TS_CUDA_CHECK(cudaStreamSynchronize(compute_));
}

void Engine::upload(const Checkpoint& ck) {
  std::vector<WeightDesc> list = llama_weight_list(config_);
  if (options_.draft) {
    if (!ck.has_draft())
      throw CheckpointError(ck.file_of("model.norm.weight") +
                            ": speculative decoding needs the draft module (mtp.* tensors; "
                            "twinstep make-checkpoint --draft-fidelity F writes them)");
    const std::vector<WeightDesc> d = draft_weight_list(config_);
    list.insert(list.end(), d.begin(), d.end());
  }
  for (const WeightDesc& d : list) {
    const auto& [p, n] = b_->by_name.at(d.name);
    const std::span<const std::byte> src = ck.tensor(d.name);
    if (int64_t(src.size()) != n * 2)
      throw CheckpointError(ck.file_of(d.name) + ": tensor " + d.name + " has the wrong size");
    TS_CUDA_CHECK(cudaMemcpy(p, src.data(), src.size(), cudaMemcpyHostToDevice));
  }
}

std::unique_ptr<Engine> Engine::create_synthetic(const LlamaConfig& config, uint64_t seed,
                                                 const EngineOptions& options,
                                                 double draft_fidelity) {
  if (options.pp.active()) return create_synthetic_pp(config, seed, options, draft_fidelity);
  if (options.tp.active()) return create_synthetic_tp(config, seed, options, draft_fidelity);
  std::unique_ptr<Engine> e(new Engine(config, options));
  e->init_synthetic(seed, draft_fidelity);
  e->fold_norm_weights();
  return e;
}

std::unique_ptr<Engine> Engine::create_from_checkpoint(const Checkpoint& ck,
                                                       const EngineOptions& options) {
  if (options.tp.active())
    throw ConfigError("", "tensor parallelism: checkpoints are not sharded yet (synthetic only)");
  if (options.pp.active())
    throw ConfigError("",
                      "pipeline parallelism: checkpoints are not split into stages yet "
                      "(synthetic only)");
  std::unique_ptr<Engine> e(new Engine(ck.config(), options));
  e->upload(ck);
  e->fold_norm_weights();
  return e;
}

std::vector<uint16_t> Engine::download_weight(const std::string& name) const {
  auto it = b_->by_name.find(name);
  if (it == b_->by_name.end()) throw Error("engine has no weight " + name);
  std::vector<uint16_t> out(size_t(it->second.second));
  TS_CUDA_CHECK(cudaStreamSynchronize(compute_));
  TS_CUDA_CHECK(cudaMemcpy(out.data(), it->second.first, out.size() * 2, cudaMemcpyDeviceToHost));
  return out;
}

void Engine::fold_norm_weights() {
  if (!options_.fused_norms) return;
  const LlamaConfig& c = config_;
  for (const LayerWeights& L : b_->layer) {
    kernels::fold_norm_weight(L.w_qkv, L.in_norm, L.w_qkv, int(c.qkv_dim()), int(c.hidden),
                              compute_);
    kernels::fold_norm_weight(L.w_gu, L.post_norm, L.w_gu, int(2 * c.intermediate), int(c.hidden),
                              compute_);
  }
  TS_CUDA_CHECK(cudaStreamSynchronize(compute_));
}

// ---------------------------------------------------------------------------------------------
// forward passes

bool Engine::carries_norms(int rows, bool row_exact) const {
  static_assert(kGemvRowsPerLaunch == kernels::kGemvMaxRows);
  return twinstep::carries_norms(options_.fused_norms, rows, row_exact);  // the simulator's rule
}

const bf16* Engine::norm_weight(const bf16* weight) const {
  return options_.fused_norms ? b_->unit_norm : weight;
}

void Engine::proj(const bf16* w, const bf16* x, bf16* out, int m, int n, int k, bool pdl) {
  if (m <= kernels::kGemvMaxRows) {
    kernels::gemv(w, x, out, m, n, k, compute_, pdl);
    return;
  }
  if (prefill_gemm_gemv_) {
    for (int r = 0; r < m; r += kernels::kGemvMaxRows)
      kernels::gemv(w, x + size_t(r) * k, out + size_t(r) * n,
                    std::min(kernels::kGemvMaxRows, m - r), n, k, compute_, false);
    return;
  }
  // out[m][n] = x[m][k] · w[n][k]^T: column-major C(n×m) = W^T(n×k) · X(k×m).
  const float alpha = 1.0f, beta = 0.0f;
  TS_CUBLAS_CHECK(cublas_api().gemm_ex(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w,
                                       CUDA_R_16BF, k, x, CUDA_R_16BF, k, &beta, out, CUDA_R_16BF,
                                       n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void Engine::node(const char* name) {
  if (names_ != nullptr) names_->push_back(name);
  if (timestamps_) {
    if (node_index_ >= b_->ts_nodes)
      throw Error("node timestamps: launch has more than " + std::to_string(b_->ts_nodes) +
                  " nodes");
    launch_timestamp(b_->ts, b_->seq, node_index_, b_->ts_nodes, compute_);
  }
  ++node_index_;
}

void Engine::target_layers(int requests, int q_len, const int* ctx_lens, bf16* const* bases,
                           void* attn_ws, bool row_exact, bool pdl, const int* moe_routed) {
  const LlamaConfig& c = config_;
  Buffers& b = *b_;
  const int H = int(c.hidden), I = int(c.intermediate);
  const int B = requests * q_len;  // rows
  const float eps = float(c.rms_eps);
  cudaStream_t s = compute_;
  auto project = [&](const bf16* w, const bf16* x, bf16* out, int m, int n, int k) {
    project_rows(w, x, out, m, n, k, row_exact, pdl);
  };
  const kernels::KvCache cache{bases, c.layers, c.kv_heads, options_.capacity_tokens};
  const kernels::AttentionShape shape{requests, q_len, c.q_heads, 0.08838834764831845f};
  // A later pipeline stage's first layer adds the previous stage's last MLP output (received).
  const bool model_first = options_.pp.first();
  // fused_norms: each GEMV in chunks of at most 16 rows (a decode bucket's one launch, or a
  // verify's row-exact chunks), the residual rows' tile sums of squares at the same offsets.
  const bool carry = carries_norms(B, row_exact);
  const size_t sq_row = size_t(H) / 16;
  auto chunks = [&](auto launch) {
    for (int r0 = 0; r0 < B; r0 += kernels::kGemvMaxRows)
      launch(r0, std::min(kernels::kGemvMaxRows, B - r0), pdl && B <= kernels::kGemvMaxRows);
  };
  for (int l = 0; l < c.layers; ++l) {
    const LayerWeights& L = b.layer[size_t(l)];
    if (carry) {
      if (l == 0) {  // the embedded rows' sums of squares; later layers' come from down_proj
        node("attn_norm");
        kernels::rms_sq_partials(b.residual, b.norm_sq, B, H, s, pdl);
      }
      node("qkv_proj");
      const int N = int(c.qkv_dim());
      chunks([&](int r0, int m, bool p) {
        kernels::gemv_normed(L.w_qkv, b.residual + size_t(r0) * H, b.norm_sq + r0 * sq_row, eps,
                             b.qkv + size_t(r0) * N, m, N, H, s, p);
      });
    } else {
      node("attn_norm");
      kernels::rmsnorm_residual(l == 0 && model_first ? nullptr : b.mlp, b.residual,
                                norm_weight(L.in_norm), b.xn, B, H, eps, s, pdl);
      node("qkv_proj");
      project(L.w_qkv, b.xn, b.qkv, B, int(c.qkv_dim()), H);
    }
    if (options_.fused_rope) {
      node("attention");
      kernels::decode_attention_rope(b.qkv, cache, l, ctx_lens, rope_, b.attn, shape, attn_ws, s,
                                     pdl);
    } else {
      node("rope_kv_append");
      kernels::rope_kv_append(b.qkv, ctx_lens, cache, l, b.q, requests, q_len, c.q_heads, rope_, s,
                              pdl);
      node("attention");
      kernels::decode_attention(b.q, cache, l, ctx_lens, b.attn, shape, attn_ws, s, pdl);
    }
    node("o_proj");
    const bool o_pdl = pdl && !(options_.pdl_drain_after_attention && B > kDrainAfterAttentionRows);
    if (carry) {
      const int Q = int(c.q_dim());
      chunks([&](int r0, int m, bool p) {
        kernels::gemv_residual(L.w_o, b.attn + size_t(r0) * Q, b.residual + size_t(r0) * H,
                               b.norm_sq + r0 * sq_row, m, H, Q, s, p && o_pdl);
      });
      node("gate_up_swiglu");
      chunks([&](int r0, int m, bool p) {
        kernels::gemv_swiglu_normed(L.w_gu, b.residual + size_t(r0) * H, b.norm_sq + r0 * sq_row,
                                    eps, b.act + size_t(r0) * I, m, I, H, s, p);
      });
      node("down_proj");
      chunks([&](int r0, int m, bool p) {
        kernels::gemv_residual(L.w_down, b.act + size_t(r0) * I, b.residual + size_t(r0) * H,
                               b.norm_sq + r0 * sq_row, m, H, I, s, p);
      });
      continue;
    }
    project_rows(L.w_o, b.attn, b.o, B, H, int(c.q_dim()), row_exact, o_pdl);
    tp_all_reduce(b.o, B, "attn_all_reduce");
    node("mlp_norm");
    kernels::rmsnorm_residual(b.o, b.residual, norm_weight(L.post_norm), b.xn, B, H, eps, s, pdl);
    if (c.moe()) {
      node("moe");
      moe_ffn(l, B, pdl, s, moe_routed);
      tp_all_reduce(b.mlp, B, "moe_all_reduce");  // expert parallelism: routed + shared partials
      continue;
    }
    if (B <= kernels::kGemvMaxRows || row_exact) {
      node("gate_up_swiglu");
      for (int r0 = 0; r0 < B; r0 += kernels::kGemvMaxRows)
        kernels::gemv_swiglu(L.w_gu, b.xn + size_t(r0) * H, b.act + size_t(r0) * I,
                             std::min(kernels::kGemvMaxRows, B - r0), I, H, s, pdl);
    } else {
      node("gate_up_proj");
      proj(L.w_gu, b.xn, b.gu, B, 2 * I, H, pdl);
      node("swiglu");
      kernels::swiglu(b.gu, b.act, B, I, s, pdl);
    }
    node("down_proj");
    project(L.w_down, b.act, b.mlp, B, H, I);
    tp_all_reduce(b.mlp, B, "mlp_all_reduce");
  }
}

kernels::MoeWeights Engine::moe_weights(int l) const {
  const Buffers& b = *b_;
  const LayerWeights& L = l == config_.layers ? b.draft.layer : b.layer[size_t(l)];
  return {L.router, L.w_gu, L.w_down, L.shared_gu, L.shared_down};
}

void Engine::moe_ffn(int l, int rows, bool pdl, cudaStream_t s, const int* routed) {
  const LlamaConfig& c = config_;
  Buffers& b = *b_;
  const kernels::MoeWeights w = moe_weights(l);
  const kernels::MoeShape shape = moe_shape(c);
  const size_t H = size_t(c.hidden);
  // One workspace for every chunk: stream order (and under PDL, each kernel's wait for its
  // predecessor before touching memory) keeps a chunk from overwriting one still being read.
  for (int r0 = 0; r0 < rows; r0 += kernels::kGemvMaxRows) {
    kernels::MoeRouting routing;
    if (routing_) {  // decode or verify: this launch's ring entry, layer l, rows from r0
      assert(rows <= b.routing_rows && l < c.layers);
      routing.topk_ids = b.routing + (size_t(l) * size_t(b.routing_rows) + size_t(r0)) * c.top_k;
      routing.entry = b.seq;
      routing.entries = kTsRing;
      routing.entry_stride = b.routing_entry;
    }
    kernels::moe_forward(b.xn + size_t(r0) * H, w, std::min(kernels::kGemvMaxRows, rows - r0),
                         shape, b.moe_ws, b.mlp + size_t(r0) * H, s, pdl, routing,
                         routed != nullptr ? routed + r0 : nullptr);
  }
}

void Engine::moe_ffn_prefill(int l, int rows) {
  const LlamaConfig& c = config_;
  Buffers& b = *b_;
  const kernels::MoeWeights w = moe_weights(l);
  const size_t H = size_t(c.hidden);
  for (int r0 = 0; r0 < rows; r0 += b.moe_prefill_rows)
    kernels::moe_prefill(b.xn + size_t(r0) * H, w, std::min(b.moe_prefill_rows, rows - r0),
                         moe_shape(c), b.moe_ws, b.mlp + size_t(r0) * H, compute_);
}

void Engine::decode_forward(int B, bool pdl, bool commit, bool profiled) {
  const LlamaConfig& c = config_;
  Buffers& b = *b_;
  const int H = int(c.hidden), V = int(c.vocab);
  const float eps = float(c.rms_eps);
  cudaStream_t s = compute_;
  std::vector<const char*> names;
  names_ = &names;
  timestamps_ = profiled && commit;
  // Committing launches only: the warm-up's entry would be the next launch's.
  routing_ = commit && b.routing != nullptr;
  node_index_ = 0;

  node("gather");
  launch_gather_batch(B, b.batch_slots, b.tokens, b.ctx, b.slot_base, b.tok_in, b.ctx_b, b.base_b,
                      s);
  // Pipeline (pipeline_parallel.h): stage 0 embeds, a later stage receives the hidden state; a
  // stage before the last sends it on, the last samples; the sampled ids then go back, so every
  // stage commits the same tokens. The hand-offs run whether or not the launch commits (warm-up
  // included), so the stages' NCCL calls always pair.
  if (options_.pp.first()) {
    node("embedding");
    kernels::embedding_gather(b.embed, b.tok_in, b.residual, B, V, H, s, pdl);
  } else {
    pp_recv_hidden(B);
  }
  target_layers(B, 1, b.ctx_b, b.base_b, b.attn_ws, /*row_exact=*/false, pdl);
  if (!options_.pp.last()) {
    pp_send_hidden(B);
  } else {
    node("final_norm");
    kernels::rmsnorm_residual(carries_norms(B, false) ? nullptr : b.mlp, b.residual, b.final_norm,
                              b.xn, B, H, eps, s, pdl);
    for (int r0 = 0, chunk = 0; r0 < B; r0 += kernels::kGemvMaxRows, ++chunk) {
      const int m = std::min(kernels::kGemvMaxRows, B - r0);
      node("lm_head");
      kernels::lm_head(b.lm_head, b.xn + size_t(r0) * H, m, V, H,
                       {sampling_.temperature, sampling_.seed, b.sample_step},
                       b.lm_ws + b.lm_ws_chunk * chunk,
                       {b.argmax + r0, b.top1 + r0, b.sampled + r0, nullptr}, s, pdl);
    }
  }
  pp_ids(B);
  if (commit) {
    node("commit");
    launch_decode_commit(B, b.batch_slots, options_.max_slots, b.sampled, b.ctx_b, b.tokens, b.ctx,
                         b.out_ring, b.ring_rows, b.seq, b.sample_step, s);
  }
  names_ = nullptr;
  timestamps_ = false;
  routing_ = false;
  node_names_[B] = names;
}

const std::vector<const char*>& Engine::decode_node_names(int batch) const {
  static const std::vector<const char*> empty;
  auto it = node_names_.find(bucket_for(batch));
  return it == node_names_.end() ? empty : it->second;
}

void* Engine::staging(int64_t) {
  const int e = int(b_->staging_next++ % kStagingRing);
  // The entry's previous copy must have executed before the host overwrites it.
  TS_CUDA_CHECK(cudaEventSynchronize(b_->staging_done[size_t(e)]));
  return b_->staging + size_t(e) * b_->meta_bytes;
}

void Engine::upload_batch(std::span<const int32_t> slots, int bucket) {
  std::vector<int32_t> list(slots.begin(), slots.end());
  list.resize(size_t(bucket), options_.max_slots);
  if (list == uploaded_slots_) return;
  const int e = int(b_->staging_next % kStagingRing);
  void* host = staging(0);
  std::memcpy(host, list.data(), list.size() * 4);
  TS_CUDA_CHECK(
      cudaMemcpyAsync(b_->batch_slots, host, list.size() * 4, cudaMemcpyHostToDevice, compute_));
  TS_CUDA_CHECK(cudaEventRecord(b_->staging_done[size_t(e)], compute_));
  uploaded_slots_ = std::move(list);
}

void Engine::rewind_context(std::span<const int32_t> slots, int32_t ctx) {
  if (ctx < 1 || ctx > options_.capacity_tokens)
    throw Error("engine: rewind to context " + std::to_string(ctx) + " outside [1, " +
                std::to_string(options_.capacity_tokens) + "]");
  if (slots.size() * sizeof(int32_t) > b_->meta_bytes)
    throw Error("engine: rewind of " + std::to_string(slots.size()) + " slots");
  for (const int32_t slot : slots) {
    if (slot < 0 || slot >= options_.max_slots)
      throw Error("engine: rewind of slot " + std::to_string(slot) + " outside [0, " +
                  std::to_string(options_.max_slots) + ")");
  }
  const int e = int(b_->staging_next % kStagingRing);
  int32_t* host = static_cast<int32_t*>(staging(0));
  for (size_t i = 0; i < slots.size(); ++i) {
    host[i] = ctx;
    TS_CUDA_CHECK(cudaMemcpyAsync(b_->ctx + slots[i], host + i, sizeof(int32_t),
                                  cudaMemcpyHostToDevice, compute_));
  }
  TS_CUDA_CHECK(cudaEventRecord(b_->staging_done[size_t(e)], compute_));
}

void Engine::warm_prefill_gemms() {
  if (prefill_gemms_warm_ || prefill_gemm_gemv_) return;
  prefill_gemms_warm_ = true;
  const int m = std::min(options_.max_prefill_tokens, 256);
  if (m <= kernels::kGemvMaxRows) return;  // every projection of this engine is a GEMV
  const LlamaConfig& c = config_;
  Buffers& b = *b_;
  const int H = int(c.hidden), I = int(c.intermediate);
  // Zeroed inputs (the products are thrown away; nothing reads unwritten memory).
  const LayerWeights& L0 = b.layer[0];
  TS_CUDA_CHECK(cudaMemsetAsync(b.xn, 0, size_t(m) * H * sizeof(bf16), compute_));
  TS_CUDA_CHECK(cudaMemsetAsync(b.attn, 0, size_t(m) * c.q_dim() * sizeof(bf16), compute_));
  proj(L0.w_qkv, b.xn, b.qkv, m, int(c.qkv_dim()), H, false);
  proj(L0.w_o, b.attn, b.o, m, H, int(c.q_dim()), false);
  if (!c.moe()) {  // the dense MLP; a MoE model's experts run its own prefill kernel
    TS_CUDA_CHECK(cudaMemsetAsync(b.act, 0, size_t(m) * I * sizeof(bf16), compute_));
    proj(L0.w_gu, b.xn, b.gu, m, 2 * I, H, false);
    proj(L0.w_down, b.act, b.mlp, m, H, I, false);
  }
  TS_CUDA_CHECK(cudaStreamSynchronize(compute_));
}

void Engine::prepare(GraphMode mode, int max_batch) {
  warm_prefill_gemms();
  if (mode == GraphMode::kEager) return;
  const int top = bucket_for(std::min(max_batch, options_.max_slots));
  // profile_nodes: every launch profiled; node_trace: both sets, profiled on request.
  std::vector<bool> variants = {options_.profile_nodes};
  if (options_.node_trace && !options_.profile_nodes) variants.push_back(true);
  for (int B = 1; B <= top; B *= 2) {
    for (const bool profiled : variants) {
      const GraphKey key{B, mode, sampling_, profiled};
      if (graphs_.count(key)) continue;
      const bool pdl = mode == GraphMode::kCudaGraphPdl;
      // Warm-up outside capture (cuBLAS heuristics, kernel attributes), relay untouched.
      std::vector<int32_t> pad;
      upload_batch(pad, B);
      decode_forward(B, pdl, /*commit=*/false, profiled);
      TS_CUDA_CHECK(cudaStreamSynchronize(compute_));
      cudaGraph_t graph = nullptr;
      TS_CUDA_CHECK(cudaStreamBeginCapture(compute_, cudaStreamCaptureModeThreadLocal));
      decode_forward(B, pdl, /*commit=*/true, profiled);
      TS_CUDA_CHECK(cudaStreamEndCapture(compute_, &graph));
      cudaGraphExec_t exec = nullptr;
      TS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      TS_CUDA_CHECK(cudaGraphDestroy(graph));
      TS_CUDA_CHECK(cudaGraphUpload(exec, compute_));
      graphs_[key] = exec;
    }
  }
  TS_CUDA_CHECK(cudaStreamSynchronize(compute_));
}

void settle_gpu_state(const LlamaConfig& config) {
  static std::mutex mutex;
  static std::set<int> settled;  // devices
  int device = 0;
  TS_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  if (settled.count(device) != 0) return;
  LlamaConfig cut = config;
  cut.layers = std::min(config.layers, kSettleLayers);
  cut.first_layer = 0;
  EngineOptions eo;
  eo.max_slots = 1;
  eo.capacity_tokens = 64;
  for (int i = 0; i < 2; ++i) {
    std::unique_ptr<Engine> throwaway = Engine::create_synthetic(cut, uint64_t(i + 1), eo);
    TS_CUDA_CHECK(cudaStreamSynchronize(throwaway->compute_stream()));
  }
  settled.insert(device);
}

void Engine::warm_up(GraphMode mode, int launches) {
  const int prompt_len = 16;
  launches = std::min(launches, options_.capacity_tokens - prompt_len - 1);
  if (launches <= 0) return;
  const int32_t slot = 0;
  std::vector<std::vector<int32_t>> prompt(1, std::vector<int32_t>(size_t(prompt_len)));
  for (int t = 0; t < prompt_len; ++t) prompt[0][size_t(t)] = t + 1;
  enqueue_prefill({&slot, 1}, prompt);
  for (int i = 0; i < launches; ++i) enqueue_decode({&slot, 1}, mode);
  TS_CUDA_CHECK(cudaStreamSynchronize(compute_));
}

int64_t Engine::enqueue_decode(std::span<const int32_t> slots, GraphMode mode, bool profiled) {
  const int n = int(slots.size());
  if (n < 1 || n > options_.max_slots)
    throw Error("decode batch of " + std::to_string(n) + " outside [1, " +
                std::to_string(options_.max_slots) + "]");
  if (profiled && !options_.node_trace && !options_.profile_nodes)
    throw Error("a profiled decode launch needs an engine created with node_trace");
  profiled = profiled || options_.profile_nodes;
  const int B = bucket_for(n);
  if (mode == GraphMode::kEager) {
    upload_batch(slots, B);
    decode_forward(B, /*pdl=*/false, /*commit=*/true, profiled);
  } else {
    const GraphKey key{B, mode, sampling_, profiled};
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      prepare(mode, n);
      it = graphs_.find(key);
    }
    upload_batch(slots, B);
    TS_CUDA_CHECK(cudaGraphLaunch(it->second, compute_));
  }
  return next_seq_++;
}

void Engine::prefill_pass(std::span<const int32_t> slots,
                          std::span<const std::vector<int32_t>> prompts, int row_offset,
                          bool last_pass) {
  const LlamaConfig& c = config_;
  Buffers& b = *b_;
  const int H = int(c.hidden), I = int(c.intermediate), V = int(c.vocab);
  const float eps = float(c.rms_eps);
  cudaStream_t s = compute_;
  const int n = int(slots.size());
  const int e = int(b.staging_next % kStagingRing);
  char* host = static_cast<char*>(staging(0));
  int* tok = reinterpret_cast<int*>(host);
  int* chunk_ctx = reinterpret_cast<int*>(host + b.off_chunk_ctx);
  int* last = reinterpret_cast<int*>(host + b.off_last);
  int* slot_ids = reinterpret_cast<int*>(host + b.off_slots);
  int* lens = reinterpret_cast<int*>(host + b.off_lens);
  bf16** bases = reinterpret_cast<bf16**>(host + b.off_base);
  int T = 0, C = 0;
  for (int i = 0; i < n; ++i) {
    const auto& p = prompts[size_t(i)];
    const int L = int(p.size());
    const int padded = int(align_up(size_t(L), size_t(b.chunk)));
    for (int t = 0; t < padded; ++t) tok[T + t] = t < L ? p[size_t(t)] : 0;
    for (int k = 0; k < padded / b.chunk; ++k) {
      chunk_ctx[C] = k * b.chunk;
      bases[C] = b.slot_base_host[size_t(slots[size_t(i)])];
      ++C;
    }
    last[i] = T + L - 1;
    slot_ids[i] = slots[size_t(i)];
    lens[i] = L;
    T += padded;
  }
  TS_CUDA_CHECK(cudaMemcpyAsync(b.meta, host, b.meta_bytes, cudaMemcpyHostToDevice, s));
  TS_CUDA_CHECK(cudaEventRecord(b.staging_done[size_t(e)], s));
  const int* d_tok = reinterpret_cast<const int*>(b.meta);
  const int* d_chunk_ctx = reinterpret_cast<const int*>(b.meta + b.off_chunk_ctx);
  const int* d_last = reinterpret_cast<const int*>(b.meta + b.off_last);
  const int* d_slots = reinterpret_cast<const int*>(b.meta + b.off_slots);
  const int* d_lens = reinterpret_cast<const int*>(b.meta + b.off_lens);
  bf16* const* d_bases = reinterpret_cast<bf16* const*>(b.meta + b.off_base);

  // Causal attention over the prompt: each `chunk`-token piece is a pseudo-request of
  // decode_attention (ctx = its start, q_len = chunk) over its own request's cache. No PDL here:
  // rope_kv_append writes every position of the prompt, which the attention prologue may read.
  const kernels::KvCache cache{d_bases, c.layers, c.kv_heads, options_.capacity_tokens};
  const kernels::AttentionShape shape{C, b.chunk, c.q_heads, 0.08838834764831845f};
  // Pipeline: stage 0 embeds, a later stage receives the residual stream and the last MLP output
  // (added by its first layer's norm, as on one GPU).
  const bool model_first = options_.pp.first();
  if (model_first)
    kernels::embedding_gather(b.embed, d_tok, b.residual, T, V, H, s);
  else
    pp_recv_hidden(T);
  for (int l = 0; l < c.layers; ++l) {
    const LayerWeights& L = b.layer[size_t(l)];
    kernels::rmsnorm_residual(l == 0 && model_first ? nullptr : b.mlp, b.residual,
                              norm_weight(L.in_norm), b.xn, T, H, eps, s);
    proj(L.w_qkv, b.xn, b.qkv, T, int(c.qkv_dim()), H, false);
    kernels::rope_kv_append(b.qkv, d_chunk_ctx, cache, l, b.q, C, b.chunk, c.q_heads, rope_, s);
    kernels::decode_attention(b.q, cache, l, d_chunk_ctx, b.attn, shape, b.attn_ws, s);
    proj(L.w_o, b.attn, b.o, T, H, int(c.q_dim()), false);
    tp_all_reduce(b.o, T, "attn_all_reduce");
    kernels::rmsnorm_residual(b.o, b.residual, norm_weight(L.post_norm), b.xn, T, H, eps, s);
    if (c.moe()) {
      if (T > kernels::kGemvMaxRows)
        moe_ffn_prefill(l, T);
      else
        moe_ffn(l, T, /*pdl=*/false, s);
      tp_all_reduce(b.mlp, T, "moe_all_reduce");
      continue;
    }
    proj(L.w_gu, b.xn, b.gu, T, 2 * I, H, false);
    kernels::swiglu(b.gu, b.act, T, I, s);
    proj(L.w_down, b.act, b.mlp, T, H, I, false);
    tp_all_reduce(b.mlp, T, "mlp_all_reduce");
  }
  if (!options_.pp.last()) {
    pp_send_hidden(T);  // every row: the next stage's attention needs the whole prompt's KV
  } else if (options_.draft) {
    // The draft needs every position's pre-norm hidden state: complete the residual stream of
    // all rows (the same bf16 sum as the last-row path below), then norm the last rows.
    kernels::rmsnorm_residual(b.mlp, b.residual, b.final_norm, b.xn, T, H, eps, s);
    launch_gather_rows(b.residual, d_last, b.last_res, n, H, s);
    kernels::rmsnorm_residual(nullptr, b.last_res, b.final_norm, b.xn, n, H, eps, s);
  } else {
    launch_gather_rows(b.residual, d_last, b.last_res, n, H, s);
    launch_gather_rows(b.mlp, d_last, b.last_mlp, n, H, s);
    kernels::rmsnorm_residual(b.last_mlp, b.last_res, b.final_norm, b.xn, n, H, eps, s);
  }
  for (int r0 = 0, chunk = 0; options_.pp.last() && r0 < n; r0 += kernels::kGemvMaxRows, ++chunk) {
    const int m = std::min(kernels::kGemvMaxRows, n - r0);
    kernels::lm_head(b.lm_head, b.xn + size_t(r0) * H, m, V, H,
                     {sampling_.temperature, sampling_.seed, b.sample_step},
                     b.lm_ws + b.lm_ws_chunk * chunk,
                     {b.argmax + r0, b.top1 + r0, b.sampled + r0, nullptr}, s);
  }
  pp_ids(n);  // pipeline: the last stage's sampled ids to the earlier stages
  launch_prefill_commit(n, d_slots, d_lens, b.sampled, row_offset, b.tokens, b.ctx, b.out_ring,
                        b.ring_rows, b.seq, b.sample_step, last_pass, s);
  if (options_.draft) {
    launch_scatter_rows(b.last_res, d_slots, spec_->hid, n, H, s);
    draft_prefill(T, C, b.chunk, d_tok, d_chunk_ctx, d_bases);
  }
}

int64_t Engine::enqueue_prefill(std::span<const int32_t> slots,
                                std::span<const std::vector<int32_t>> prompts) {
  const int n = int(slots.size());
  if (n < 1 || n > options_.max_slots || prompts.size() != slots.size())
    throw Error("prefill of " + std::to_string(n) + " requests outside [1, max_slots]");
  const int chunk = b_->chunk;
  int begin = 0;
  while (begin < n) {
    int end = begin, T = 0;
    while (end < n) {
      const auto& p = prompts[size_t(end)];
      if (p.empty()) throw Error("prefill of an empty prompt");
      const int padded = int(align_up(p.size(), size_t(chunk)));
      if (padded > options_.capacity_tokens)
        throw Error("prompt of " + std::to_string(p.size()) + " tokens exceeds the KV capacity " +
                    std::to_string(options_.capacity_tokens));
      for (int32_t t : p)
        if (t < 0 || t >= config_.vocab) throw Error("prompt token outside the vocabulary");
      if (T + padded > options_.max_prefill_tokens) break;
      T += padded;
      ++end;
    }
    prefill_pass(slots.subspan(size_t(begin), size_t(end - begin)),
                 prompts.subspan(size_t(begin), size_t(end - begin)), begin, end == n);
    begin = end;
  }
  uploaded_slots_.clear();  // conservative: nothing of prefill touches batch_slots, but cheap
  return next_seq_++;
}

void Engine::enqueue_output_copy(int64_t seq, int32_t rows, cudaStream_t stream) {
  assert(rows >= 0 && rows <= b_->ring_rows);
  const size_t at = size_t(seq % kOutputRing) * b_->ring_rows;
  TS_CUDA_CHECK(cudaMemcpyAsync(b_->host_ring + at, b_->out_ring + at, sizeof(OutputRow) * rows,
                                cudaMemcpyDeviceToHost, stream));
}

const OutputRow* Engine::host_outputs(int64_t seq) const {
  return b_->host_ring + size_t(seq % kOutputRing) * b_->ring_rows;
}

std::vector<int32_t> Engine::decode_routing(int64_t seq, int32_t rows) {
  const Buffers& b = *b_;
  if (b.routing == nullptr)
    throw Error("decode_routing needs an MoE engine created with record_routing");
  if (seq < 0 || seq >= next_seq_ || seq < next_seq_ - kTsRing)
    throw Error("decode_routing: launch " + std::to_string(seq) + " outside the last " +
                std::to_string(kTsRing) + " launches (next " + std::to_string(next_seq_) + ")");
  if (rows < 1 || rows > b.routing_rows)
    throw Error("decode_routing: " + std::to_string(rows) + " rows outside [1, " +
                std::to_string(b.routing_rows) + "]");
  const int K = config_.top_k, L = config_.layers;
  std::vector<int32_t> ids(size_t(L) * size_t(rows) * size_t(K));
  const int* entry = b.routing + size_t(seq % kTsRing) * b.routing_entry;
  // One 2-D copy: `rows` rows of each layer's max-bucket block.
  TS_CUDA_CHECK(cudaMemcpy2DAsync(
      ids.data(), size_t(rows) * K * sizeof(int), entry, size_t(b.routing_rows) * K * sizeof(int),
      size_t(rows) * K * sizeof(int), size_t(L), cudaMemcpyDeviceToHost, b.aux));
  TS_CUDA_CHECK(cudaStreamSynchronize(b.aux));
  return ids;
}

std::map<int64_t, std::vector<uint64_t>> Engine::node_timestamps(int64_t first_seq,
                                                                 int64_t last_seq) {
  std::map<int64_t, std::vector<uint64_t>> out;
  if (!options_.profile_nodes && !options_.node_trace) return out;
  first_seq = std::max(first_seq, next_seq_ - kTsRing);
  for (int64_t q = first_seq; q <= last_seq && q < next_seq_; ++q) {
    std::vector<uint64_t> ts(size_t(b_->ts_nodes));
    TS_CUDA_CHECK(cudaMemcpyAsync(ts.data(), b_->ts + size_t(q % kTsRing) * b_->ts_nodes,
                                  ts.size() * 8, cudaMemcpyDeviceToHost, b_->aux));
    TS_CUDA_CHECK(cudaStreamSynchronize(b_->aux));
    out[q] = std::move(ts);
  }
  return out;
}

}  // namespace twinstep::runtime
