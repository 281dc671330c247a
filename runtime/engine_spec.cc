// Speculative decoding in the Engine: the draft module (NEXTN/MTP style), the draft / verify /
// extend forwards and their captured graphs (engine.h; docs/runtime.md "Speculative decoding").
//
// Positions. Draft position i holds the pair (target hidden H_i, embedding of token i + 1), so the
// draft's KV length equals the target's ctx. Before a round of a slot with ctx = c: the draft KV
// holds 0 .. c - 2, tokens[slot] = t_c (committed, not yet processed), hid[slot] = H_{c-1}.
//   draft step j (0 .. L-1) writes draft position c - 1 + j: step 0 the true pair (hid, t_c),
//     step j > 0 the draft's own (g_{j-1}, d_j); it proposes d_{j+1} with its top-1 probability.
//   verify runs the target over t_c, d_1 .. d_L at positions c .. c + L (padded to the graph's
//     width), accepts A drafts, commits d_1 .. d_A and the bonus a_A; ctx = c + A + 1.
//   extend rewrites draft positions c .. c + A - 1 with the true pairs (H_{c+j}, d_{j+1}) from the
//     verify's hidden states (only the KV: one layer's KV depends on its input alone), so the next
//     round's draft attends over target-quality pairs. Later positions are overwritten by the
//     next round before they are read.
#include <algorithm>
#include <cassert>
#include <stdexcept>
#include <string>

#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/gemv.h"
#include "kernels/kv_cache.h"
#include "kernels/lm_head.h"
#include "kernels/norm.h"
#include "policies/error.h"
#include "runtime/engine.h"
#include "runtime/engine_internal.h"
#include "runtime/spec_ops.h"

namespace twinstep::runtime {

namespace {

constexpr float kSoftmaxScale = 0.08838834764831845f;  // 1 / sqrt(128)

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

}  // namespace

DraftControl draft_control(const SpecSpec& spec, int32_t steps) {
  DraftControl ctl;
  ctl.steps = steps;
  ctl.device_stop = spec.method == SpecMethod::kConfidence &&
                    (spec.mode == DraftMode::kDevice || spec.mode == DraftMode::kHostBlocking);
  ctl.threshold = float(spec.threshold);
  ctl.min_steps = spec.min_steps;
  return ctl;
}

void Engine::allocate_spec() {
  const LlamaConfig& c = config_;
  Buffers& b = *b_;
  spec_ = std::make_unique<Spec>();
  Spec& sp = *spec_;
  const int H = int(c.hidden), V = int(c.vocab);
  const int slots = options_.max_slots + 1;
  const size_t R = size_t(max_bucket_);
  const size_t VR = R * kDraftStride;
  sp.hid = b.dev<bf16>(size_t(slots) * H);
  TS_CUDA_CHECK(cudaMemset(sp.hid, 0, size_t(slots) * H * sizeof(bf16)));
  sp.ctx_b = b.dev<int>(R);
  sp.h_index = b.dev<int>(R);
  sp.in_tok = b.dev<int>(R);
  sp.dlen = b.dev<int>(R);
  sp.active = b.dev<int>(R);
  sp.base_b = b.dev<bf16*>(R);
  sp.dtok = b.dev<int>(VR);
  sp.dconf = b.dev<float>(VR);
  sp.step_ctx = b.dev<int>(size_t(kMaxDraftTokens) * R);
  sp.tok_v = b.dev<int>(VR);
  sp.routed = b.dev<int>(VR);
  sp.ext_tok = b.dev<int>(VR);
  sp.argmax = b.dev<int>(VR);
  sp.sampled = b.dev<int>(VR);
  sp.top1 = b.dev<float>(VR);
  for (int* p : {sp.ctx_b, sp.h_index, sp.in_tok, sp.dlen, sp.active})
    TS_CUDA_CHECK(cudaMemset(p, 0, R * sizeof(int)));
  for (int* p : {sp.dtok, sp.tok_v, sp.routed, sp.ext_tok, sp.argmax, sp.sampled})
    TS_CUDA_CHECK(cudaMemset(p, 0, VR * sizeof(int)));
  TS_CUDA_CHECK(cudaMemset(sp.dconf, 0, VR * sizeof(float)));
  TS_CUDA_CHECK(cudaMemset(sp.step_ctx, 0, size_t(kMaxDraftTokens) * R * sizeof(int)));
  // Every row points at the padding slot until a launch gathers real ones (an extend captured
  // before any verify then writes only the padding slot).
  const std::vector<bf16*> pad_bases(R, b.slot_base_host[size_t(options_.max_slots)]);
  TS_CUDA_CHECK(cudaMemcpy(sp.base_b, pad_bases.data(), R * sizeof(bf16*), cudaMemcpyHostToDevice));
  sp.lm_ws_chunk = round_up(kernels::lm_head_workspace_bytes(kernels::kGemvMaxRows, V), 256);
  sp.lm_ws = b.dev<char>(sp.lm_ws_chunk * R);  // VR / 16 = R chunks of 16 rows
  size_t ws = 0;
  const kernels::KvCache cache{nullptr, c.layers + 1, c.kv_heads, options_.capacity_tokens};
  for (int bucket = 1; bucket <= max_bucket_; bucket *= 2)
    for (int q_len : {1, kDraftStride})
      ws = std::max(
          ws, kernels::attention_workspace_bytes({bucket, q_len, c.q_heads, kSoftmaxScale}, cache));
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&sp.side, cudaStreamNonBlocking));
  sp.attn_ws = b.dev<char>(ws);
}

void Engine::proj_rows(const bf16* w, const bf16* x, bf16* out, int m, int n, int k,
                       cudaStream_t s) {
  for (int r0 = 0; r0 < m; r0 += kernels::kGemvMaxRows)
    kernels::gemv(w, x + size_t(r0) * k, out + size_t(r0) * n,
                  std::min(kernels::kGemvMaxRows, m - r0), n, k, s, false);
}

void Engine::project_rows(const bf16* w, const bf16* x, bf16* out, int m, int n, int k,
                          bool row_exact, bool pdl) {
  if (row_exact)
    proj_rows(w, x, out, m, n, k, compute_);
  else
    proj(w, x, out, m, n, k, pdl);
}

// Greedy LM head over `rows` rows of xn in 16-row chunks into the spec's argmax/top1.
static void spec_lm_head(const bf16* w, const bf16* xn, int rows, int vocab, int hidden, char* ws,
                         size_t ws_chunk, int* argmax, float* top1, int* sampled, cudaStream_t s) {
  for (int r0 = 0, chunk = 0; r0 < rows; r0 += kernels::kGemvMaxRows, ++chunk) {
    const int m = std::min(kernels::kGemvMaxRows, rows - r0);
    kernels::lm_head(w, xn + size_t(r0) * hidden, m, vocab, hidden, {0.0f, 0, nullptr},
                     ws + ws_chunk * chunk, {argmax + r0, top1 + r0, sampled + r0, nullptr}, s);
  }
}

void Engine::draft_kv(const int* tok, const bf16* h, int rows, const int* ctx_lens,
                      bf16* const* bases, int requests, int q_len, bool row_exact) {
  const LlamaConfig& c = config_;
  Buffers& b = *b_;
  const DraftWeights& dw = b.draft;
  const int H = int(c.hidden), V = int(c.vocab);
  const float eps = float(c.rms_eps);
  cudaStream_t s = compute_;
  auto project = [&](const bf16* w, const bf16* x, bf16* out, int m, int n, int k) {
    project_rows(w, x, out, m, n, k, row_exact, false);
  };
  kernels::embedding_gather(b.embed, tok, b.o, rows, V, H, s);
  launch_concat_norm(b.o, h, nullptr, dw.enorm, dw.hnorm, b.gu, rows, H, eps, s);
  project(dw.eh_proj, b.gu, b.mlp, rows, H, 2 * H);
  kernels::rmsnorm_residual(nullptr, b.mlp, dw.layer.in_norm, b.xn, rows, H, eps, s);
  project(dw.layer.w_qkv, b.xn, b.qkv, rows, int(c.qkv_dim()), H);
  const kernels::KvCache dcache{bases, c.layers + 1, c.kv_heads, options_.capacity_tokens};
  kernels::rope_kv_append(b.qkv, ctx_lens, dcache, c.layers, b.q, requests, q_len, c.q_heads, rope_,
                          s);
}

void Engine::draft_prefill(int tokens, int chunks, int chunk, const int* d_tok,
                           const int* d_chunk_ctx, bf16* const* d_bases) {
  // Pairs (H_i, token i + 1): the shifted prompt is d_tok + 1. The last real row of each prompt
  // (and padding) gets an arbitrary token; those positions are rewritten by the first round's
  // draft step 0 (position ctx - 1) or lie beyond ctx. d_tok[tokens] is read (the staging
  // entry continues), never used.
  draft_kv(d_tok + 1, b_->residual, tokens, d_chunk_ctx, d_bases, chunks, chunk,
           /*row_exact=*/false);
}

void Engine::draft_step(int B, int j, const DraftControl& ctl, cudaStream_t s) {
  const LlamaConfig& c = config_;
  Buffers& b = *b_;
  Spec& sp = *spec_;
  const DraftWeights& dw = b.draft;
  const int H = int(c.hidden), I = int(c.intermediate), V = int(c.vocab);
  const float eps = float(c.rms_eps);
  const kernels::KvCache dcache{sp.base_b, c.layers + 1, c.kv_heads, options_.capacity_tokens};
  const kernels::AttentionShape shape{B, 1, c.q_heads, kSoftmaxScale};
  const int* step_ctx = sp.step_ctx + size_t(j) * B;
  // Tensor parallelism sums the layer's row-parallel outputs over the ranks on the compute stream
  // (tp_all_reduce); drafts run there under TP (no early exit: create_synthetic_tp).
  assert(!options_.tp.active() || s == compute_);
  kernels::embedding_gather(b.embed, sp.in_tok, b.o, B, V, H, s);
  // Step 0 reads the target's hidden state of the slot; later steps the draft's own output g.
  launch_concat_norm(b.o, j == 0 ? sp.hid : b.residual, j == 0 ? sp.h_index : nullptr, dw.enorm,
                     dw.hnorm, b.gu, B, H, eps, s);
  proj_rows(dw.eh_proj, b.gu, b.residual, B, H, 2 * H, s);
  kernels::rmsnorm_residual(nullptr, b.residual, dw.layer.in_norm, b.xn, B, H, eps, s);
  proj_rows(dw.layer.w_qkv, b.xn, b.qkv, B, int(c.qkv_dim()), H, s);
  kernels::rope_kv_append(b.qkv, step_ctx, dcache, c.layers, b.q, B, 1, c.q_heads, rope_, s);
  kernels::decode_attention(b.q, dcache, c.layers, step_ctx, b.attn, shape, sp.attn_ws, s);
  proj_rows(dw.layer.w_o, b.attn, b.o, B, H, int(c.q_dim()), s);
  tp_all_reduce(b.o, B, nullptr);
  kernels::rmsnorm_residual(b.o, b.residual, dw.layer.post_norm, b.xn, B, H, eps, s);
  if (c.moe()) {  // the nextn draft of an MoE model: an MoE layer (its experts, under EP a block)
    moe_ffn(c.layers, B, /*pdl=*/false, s);
  } else {
    for (int r0 = 0; r0 < B; r0 += kernels::kGemvMaxRows)
      kernels::gemv_swiglu(dw.layer.w_gu, b.xn + size_t(r0) * H, b.act + size_t(r0) * I,
                           std::min(kernels::kGemvMaxRows, B - r0), I, H, s);
    proj_rows(dw.layer.w_down, b.act, b.mlp, B, H, I, s);
  }
  tp_all_reduce(b.mlp, B, nullptr);
  // g_j = residual + mlp (kept in residual for the next step), normed by the target's norm.
  kernels::rmsnorm_residual(b.mlp, b.residual, b.final_norm, b.xn, B, H, eps, s);
  spec_lm_head(b.lm_head, b.xn, B, V, H, sp.lm_ws, sp.lm_ws_chunk, sp.argmax, sp.top1, sp.sampled,
               s);
  launch_draft_step_commit(B, j, sp.argmax, sp.top1, sp.dtok, sp.dconf, sp.in_tok, sp.dlen,
                           sp.active, ctl.device_stop, ctl.threshold, ctl.min_steps, s);
}

void Engine::draft_forward(int B, const DraftControl& ctl, bool commit) {
  Buffers& b = *b_;
  Spec& sp = *spec_;
  cudaStream_t s = compute_;
  launch_draft_begin(B, ctl.steps, b.batch_slots, b.tokens, b.ctx, b.slot_base, sp.ctx_b, sp.base_b,
                     sp.dtok, sp.in_tok, sp.dlen, sp.active, sp.step_ctx, sp.h_index, s);
  // Early exit (options_.draft_early_exit, graphs only): step j >= max(min_steps, 1) sits in a
  // conditional IF node whose condition a one-thread kernel sets from the rows' active flags, so
  // once every row stopped, the remaining steps' kernels are not launched at all.
  const bool early_exit = capturing_spec_ && ctl.device_stop && options_.draft_early_exit;
  for (int j = 0; j < ctl.steps; ++j) {
    if (!early_exit || j < std::max(ctl.min_steps, 1)) {
      draft_step(B, j, ctl, s);
      continue;
    }
    cudaStreamCaptureStatus status;
    cudaGraph_t graph = nullptr;
    const cudaGraphNode_t* deps = nullptr;
    size_t num_deps = 0;
    TS_CUDA_CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, &graph, &deps, nullptr, &num_deps));
    cudaGraphConditionalHandle handle = 0;
    TS_CUDA_CHECK(cudaGraphConditionalHandleCreate(&handle, graph, 0, cudaGraphCondAssignDefault));
    launch_set_draft_condition(handle, sp.active, B, s);
    TS_CUDA_CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, &graph, &deps, nullptr, &num_deps));
    cudaGraphNodeParams params = {};
    params.type = cudaGraphNodeTypeConditional;
    params.conditional.handle = handle;
    params.conditional.type = cudaGraphCondTypeIf;
    params.conditional.size = 1;
    cudaGraphNode_t node = nullptr;
    TS_CUDA_CHECK(cudaGraphAddNode(&node, graph, deps, nullptr, num_deps, &params));
    TS_CUDA_CHECK(cudaStreamUpdateCaptureDependencies(s, &node, nullptr, 1,
                                                      cudaStreamSetCaptureDependencies));
    TS_CUDA_CHECK(cudaStreamBeginCaptureToGraph(sp.side, params.conditional.phGraph_out[0], nullptr,
                                                nullptr, 0, cudaStreamCaptureModeThreadLocal));
    draft_step(B, j, ctl, sp.side);
    cudaGraph_t body = nullptr;
    TS_CUDA_CHECK(cudaStreamEndCapture(sp.side, &body));
  }
  if (commit)
    launch_draft_finish(B, b.batch_slots, options_.max_slots, sp.ctx_b, sp.dtok, sp.dconf, sp.dlen,
                        ctl.threshold, b.out_ring, b.ring_rows, b.seq, s);
}

void Engine::verify_forward(int B, int W, float threshold, bool commit) {
  const LlamaConfig& c = config_;
  Buffers& b = *b_;
  Spec& sp = *spec_;
  const int H = int(c.hidden), V = int(c.vocab);
  const int rows = B * W;
  cudaStream_t s = compute_;
  launch_verify_prepare(B, W, b.batch_slots, b.ctx, b.slot_base, sp.ctx_b, sp.base_b, sp.dtok,
                        sp.dlen, sp.tok_v, sp.routed, s);
  kernels::embedding_gather(b.embed, sp.tok_v, b.residual, rows, V, H, s);
  // Padded positions (past a request's draft) route through no expert (kernels/moe.h); a
  // committing launch records its routing (EngineOptions::record_routing; padded rows -1).
  routing_ = commit && b.routing != nullptr;
  target_layers(B, W, sp.ctx_b, sp.base_b, sp.attn_ws, /*row_exact=*/true, /*pdl=*/false,
                sp.routed);
  routing_ = false;
  kernels::rmsnorm_residual(carries_norms(rows, true) ? nullptr : b.mlp, b.residual, b.final_norm,
                            b.xn, rows, H, float(c.rms_eps), s);
  spec_lm_head(b.lm_head, b.xn, rows, V, H, sp.lm_ws, sp.lm_ws_chunk, sp.argmax, sp.top1,
               sp.sampled, s);
  if (commit) {
    launch_verify_commit(B, W, H, b.batch_slots, options_.max_slots, sp.argmax, b.residual, sp.dtok,
                         sp.dconf, sp.dlen, threshold, sp.ctx_b, b.tokens, b.ctx, sp.hid,
                         sp.ext_tok, b.out_ring, b.ring_rows, b.seq, s);
    launch_advance_counters(b.seq, b.sample_step, s);
  }
}

void Engine::extend_forward(int B, int W) {
  // The verify's hidden rows are still in residual; ext_tok and ctx_b are the verify's.
  draft_kv(spec_->ext_tok, b_->residual, B * W, spec_->ctx_b, spec_->base_b, B, W,
           /*row_exact=*/true);
}

void Engine::run_spec_forward(SpecPhase phase, int bucket, int n, const DraftControl& ctl,
                              bool commit) {
  switch (phase) {
    case SpecPhase::kDraft:
      draft_forward(bucket, ctl, commit);
      break;
    case SpecPhase::kVerify:
      verify_forward(bucket, n, ctl.threshold, commit);
      break;
    case SpecPhase::kExtend:
      extend_forward(bucket, n);
      break;
  }
}

int64_t Engine::spec_launch(SpecPhase phase, std::span<const int32_t> slots, int n,
                            const DraftControl& ctl, GraphMode mode) {
  const char* what = phase == SpecPhase::kDraft    ? "draft"
                     : phase == SpecPhase::kVerify ? "verify"
                                                   : "extend";
  if (!spec_)
    throw Error(std::string("engine: ") + what +
                " launch without a draft module (EngineOptions::draft)");
  if (sampling_.temperature > 0)
    throw Error("engine: speculative decoding runs greedy sampling only (temperature " +
                std::to_string(sampling_.temperature) + ")");
  const int count = int(slots.size());
  if (count < 1 || count > options_.max_slots)
    throw Error(std::string("engine: ") + what + " batch of " + std::to_string(count) +
                " outside [1, " + std::to_string(options_.max_slots) + "]");
  check_spec_shape(phase, n);
  const int B = bucket_for(count);
  if (mode == GraphMode::kEager) {
    upload_batch(slots, B);
    run_spec_forward(phase, B, n, ctl, /*commit=*/true);
  } else {
    cudaGraphExec_t exec = spec_graph(phase, B, n, ctl);
    upload_batch(slots, B);
    TS_CUDA_CHECK(cudaGraphLaunch(exec, compute_));
  }
  return phase == SpecPhase::kExtend ? -1 : next_seq_++;
}

void Engine::check_spec_shape(SpecPhase phase, int n) const {
  if (phase == SpecPhase::kDraft) {
    if (n < 1 || n > kMaxDraftTokens)
      throw Error("engine: draft of " + std::to_string(n) + " steps outside [1, " +
                  std::to_string(kMaxDraftTokens) + "]");
    return;
  }
  const int max = max_verify_width(config_);
  if (n < 2 || n > max)
    throw Error(std::string("engine: ") + (phase == SpecPhase::kVerify ? "verify" : "extend") +
                " width " + std::to_string(n) + " outside [2, " + std::to_string(max) +
                "] (16 rows of gemv; 64 query rows of decode_attention at GQA group " +
                std::to_string(config_.q_heads / config_.kv_heads) + ")");
}

int max_verify_width(const LlamaConfig& c) {
  return std::min(kDraftStride, 64 / std::max<int32_t>(1, c.q_heads / std::max(c.kv_heads, 1)));
}

cudaGraphExec_t Engine::spec_graph(SpecPhase phase, int B, int n, const DraftControl& ctl) {
  check_spec_shape(phase, n);
  const Spec::Key key{int(phase),
                      B,
                      n,
                      phase == SpecPhase::kExtend ? 0.0f : ctl.threshold,
                      phase == SpecPhase::kDraft ? ctl.min_steps : 0,
                      phase == SpecPhase::kDraft && ctl.device_stop};
  auto it = spec_->graphs.find(key);
  if (it != spec_->graphs.end()) return it->second;
  // Warm-up outside capture on padding slots only (kernel attributes; nothing committed), then
  // capture. Draft and verify scratch is overwritten, so capture happens before a run (or, for
  // a shape first met mid-run, before its draft: prepare_spec captures every shape a policy uses).
  upload_batch({}, B);
  run_spec_forward(phase, B, n, ctl, /*commit=*/false);
  TS_CUDA_CHECK(cudaStreamSynchronize(compute_));
  cudaGraph_t graph = nullptr;
  TS_CUDA_CHECK(cudaStreamBeginCapture(compute_, cudaStreamCaptureModeThreadLocal));
  capturing_spec_ = true;
  try {
    run_spec_forward(phase, B, n, ctl, /*commit=*/true);
  } catch (...) {
    capturing_spec_ = false;
    cudaStreamEndCapture(compute_, &graph);  // abandon the capture; the error propagates
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  capturing_spec_ = false;
  TS_CUDA_CHECK(cudaStreamEndCapture(compute_, &graph));
  cudaGraphExec_t exec = nullptr;
  TS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  TS_CUDA_CHECK(cudaGraphDestroy(graph));
  TS_CUDA_CHECK(cudaGraphUpload(exec, compute_));
  spec_->graphs.emplace(key, exec);
  return exec;
}

int64_t Engine::enqueue_draft(std::span<const int32_t> slots, const DraftControl& ctl,
                              GraphMode mode) {
  return spec_launch(SpecPhase::kDraft, slots, ctl.steps, ctl, mode);
}

int64_t Engine::enqueue_verify(std::span<const int32_t> slots, int32_t width, float threshold,
                               GraphMode mode) {
  DraftControl ctl;
  ctl.threshold = threshold;
  return spec_launch(SpecPhase::kVerify, slots, width, ctl, mode);
}

void Engine::enqueue_extend(std::span<const int32_t> slots, int32_t width, GraphMode mode) {
  spec_launch(SpecPhase::kExtend, slots, width, DraftControl{}, mode);
}

void Engine::prepare_spec(GraphMode mode, int max_batch, const SpecSpec& spec) {
  warm_prefill_gemms();
  if (mode == GraphMode::kEager || spec.method == SpecMethod::kNone || !spec_) return;
  const int top = bucket_for(std::min(max_batch, options_.max_slots));
  const int32_t max_draft = spec.max_draft();
  std::vector<int32_t> drafts, widths;
  if (spec.method == SpecMethod::kChain) {
    drafts = {max_draft};
    widths = {max_draft + 1};
  } else if (spec.mode == DraftMode::kDevice) {
    drafts = {max_draft};
    widths = {max_draft + 1};
  } else if (spec.mode == DraftMode::kHostLate) {
    for (int32_t l = spec.min_steps; l <= max_draft; ++l) {
      drafts.push_back(l);
      widths.push_back(l + 1);
    }
  } else {
    drafts = {max_draft};
    for (int32_t l = spec.min_steps; l <= max_draft; ++l) widths.push_back(l + 1);
  }
  const float thr = float(spec.threshold);
  for (int B = 1; B <= top; B *= 2) {
    for (int32_t l : drafts) spec_graph(SpecPhase::kDraft, B, l, draft_control(spec, l));
    for (int32_t w : widths) {
      DraftControl v;
      v.threshold = thr;
      spec_graph(SpecPhase::kVerify, B, w, v);
      spec_graph(SpecPhase::kExtend, B, w, DraftControl{});
    }
  }
  TS_CUDA_CHECK(cudaStreamSynchronize(compute_));
}

}  // namespace twinstep::runtime
