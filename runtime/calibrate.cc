#include "runtime/calibrate.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <span>
#include <string_view>

#include "kernels/attention.h"
#include "kernels/attention_split.h"
#include "policies/calibration_model.h"
#include "policies/decode_loop.h"
#include "policies/error.h"
#include "policies/host_costs.h"
#include "policies/kv_capacity.h"
#include "policies/model_spec.h"
#include "policies/step_kernels.h"
#include "policies/workload.h"
#include "runtime/checkpoint.h"
#include "runtime/device_ops.h"
#include "runtime/engine.h"
#include "runtime/real_backend.h"
#include "runtime/tensor_parallel.h"

namespace twinstep::runtime {

void launch_empty(cudaStream_t stream, bool pdl);  // runtime/calibrate.cu

namespace {

using Clock = std::chrono::steady_clock;

double ns_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::nano>(b - a).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

class Events {
 public:
  explicit Events(size_t n) : e_(n) {
    for (cudaEvent_t& e : e_) TS_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~Events() {
    for (cudaEvent_t e : e_) cudaEventDestroy(e);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  cudaEvent_t operator[](size_t i) const { return e_[i]; }
  double elapsed_ns(size_t a, size_t b) const {
    float ms = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&ms, e_[a], e_[b]));
    return double(ms) * 1e6;
  }

 private:
  std::vector<cudaEvent_t> e_;
};

class Stream {
 public:
  Stream() { TS_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

template <typename T>
struct DeviceFree {
  void operator()(T* p) const { cudaFree(p); }
};
template <typename T>
std::unique_ptr<T, DeviceFree<T>> device_alloc(size_t bytes) {
  void* p = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&p, bytes));
  return std::unique_ptr<T, DeviceFree<T>>(static_cast<T*>(p));
}

// SMs of the current device (the attention partition's and the stream read's grid).
int device_sms() {
  int device = 0, sms = 0;
  TS_CUDA_CHECK(cudaGetDevice(&device));
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

CalibrationSample sample(const char* kind, double ns) {
  CalibrationSample s;
  s.kind = kind;
  s.value_ns = ns;
  return s;
}

// ---- microbenchmarks ---------------------------------------------------------------------------

// Host cost of one eager launch: batches of 200 empty-kernel launches, host time / 200.
void eager_launches(int reps, std::vector<CalibrationSample>& out) {
  Stream s;
  constexpr int kBatch = 200;
  for (int rep = -3; rep < reps; ++rep) {  // three warm-up batches
    const auto t0 = Clock::now();
    for (int i = 0; i < kBatch; ++i) launch_empty(s, false);
    const auto t1 = Clock::now();
    TS_CUDA_CHECK(cudaStreamSynchronize(s));
    if (rep >= 0) out.push_back(sample("eager_launch", ns_between(t0, t1) / kBatch));
  }
}

// A captured graph of `nodes` empty kernels, with or without PDL edges.
cudaGraphExec_t empty_graph(cudaStream_t s, int nodes, bool pdl) {
  cudaGraph_t g = nullptr;
  TS_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < nodes; ++i) launch_empty(s, pdl && i > 0);
  TS_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec = nullptr;
  TS_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  TS_CUDA_CHECK(cudaGraphDestroy(g));
  return exec;
}

// GPU time per node of empty-kernel graphs: (T(N) − T(1)) / (N − 1) from event-timed launches,
// so the launch's own head and tail cancel. Also the host cost of cudaGraphLaunch vs N.
void graph_costs(int reps, std::vector<CalibrationSample>& out) {
  Stream s;
  Events ev(2);
  constexpr int kSizes[] = {1, 32, 128, 256};
  for (const bool pdl : {false, true}) {
    std::map<int, std::vector<double>> gpu_ns;
    for (const int n : kSizes) {
      cudaGraphExec_t g = empty_graph(s, n, pdl);
      for (int rep = -3; rep < reps; ++rep) {
        TS_CUDA_CHECK(cudaEventRecord(ev[0], s));
        const auto t0 = Clock::now();
        TS_CUDA_CHECK(cudaGraphLaunch(g, s));
        const auto t1 = Clock::now();
        TS_CUDA_CHECK(cudaEventRecord(ev[1], s));
        TS_CUDA_CHECK(cudaEventSynchronize(ev[1]));
        if (rep < 0) continue;
        gpu_ns[n].push_back(ev.elapsed_ns(0, 1));
        if (!pdl) {
          CalibrationSample x = sample("graph_launch", ns_between(t0, t1));
          x.name = "empty";
          x.nodes = n;
          out.push_back(x);
        }
      }
      TS_CUDA_CHECK(cudaGraphExecDestroy(g));
    }
    const int big = kSizes[std::size(kSizes) - 1];
    const double one = median(gpu_ns[1]);
    for (double t : gpu_ns[big]) {
      CalibrationSample x = sample("node_gap", (t - one) / (big - 1));
      x.mode = pdl ? "pdl_empty" : "graph";
      x.nodes = big;
      out.push_back(x);
    }
  }
}

// cudaEventRecord + cudaEventSynchronize on an idle stream: what a host wait adds beyond the
// GPU work (an upper bound on the wake-up, as it includes the record's own trip).
void event_round_trips(int reps, std::vector<CalibrationSample>& out) {
  Stream s;
  Events ev(1);
  for (int rep = -10; rep < reps; ++rep) {
    const auto t0 = Clock::now();
    TS_CUDA_CHECK(cudaEventRecord(ev[0], s));
    TS_CUDA_CHECK(cudaEventSynchronize(ev[0]));
    const auto t1 = Clock::now();
    if (rep >= 0) out.push_back(sample("event_sync", ns_between(t0, t1)));
  }
}

// Device → pinned host copies, host time from issue to the completion event observed by polling.
void d2h_copies(int reps, std::vector<CalibrationSample>& out) {
  constexpr size_t kMax = size_t{64} << 20;
  Stream s;
  Events ev(1);
  auto dev = device_alloc<char>(kMax);
  TS_CUDA_CHECK(cudaMemset(dev.get(), 1, kMax));
  void* host = nullptr;
  TS_CUDA_CHECK(cudaMallocHost(&host, kMax));
  for (const size_t bytes :
       {size_t{16}, size_t{4096}, size_t{65536}, size_t{1} << 20, size_t{16} << 20, kMax}) {
    for (int rep = -3; rep < reps; ++rep) {
      const auto t0 = Clock::now();
      TS_CUDA_CHECK(cudaMemcpyAsync(host, dev.get(), bytes, cudaMemcpyDeviceToHost, s));
      TS_CUDA_CHECK(cudaEventRecord(ev[0], s));
      cudaError_t st;
      while ((st = cudaEventQuery(ev[0])) == cudaErrorNotReady) {
      }
      TS_CUDA_CHECK(st);
      const auto t1 = Clock::now();
      if (rep < 0) continue;
      CalibrationSample x = sample("d2h", ns_between(t0, t1));
      x.bytes = int64_t(bytes);
      out.push_back(x);
    }
  }
  TS_CUDA_CHECK(cudaFreeHost(host));
}

// Streaming reads of a buffer far larger than L2 (cold), the bandwidth the roofline uses for
// classes never fitted.
void stream_reads(bool quick, int reps, std::vector<CalibrationSample>& out) {
  const size_t bytes = quick ? size_t{1} << 30 : size_t{4} << 30;
  auto buf = device_alloc<char>(bytes);
  auto sink = device_alloc<unsigned long long>(8);
  TS_CUDA_CHECK(cudaMemset(buf.get(), 1, bytes));
  Stream s;
  Events ev(2);
  const int sms = device_sms();
  for (const int blocks_per_sm : {4, 8, 16}) {
    for (int rep = -1; rep < reps; ++rep) {
      TS_CUDA_CHECK(cudaEventRecord(ev[0], s));
      launch_stream_read(buf.get(), bytes / 16, sink.get(), sms * blocks_per_sm, s);
      TS_CUDA_CHECK(cudaEventRecord(ev[1], s));
      TS_CUDA_CHECK(cudaEventSynchronize(ev[1]));
      if (rep < 0) continue;
      CalibrationSample x = sample("stream_read", ev.elapsed_ns(0, 1));
      x.bytes = int64_t(bytes);
      x.name = "blocks_per_sm_" + std::to_string(blocks_per_sm);
      out.push_back(x);
    }
  }
}

// ---- decode graphs in situ ---------------------------------------------------------------------

// Runtime nodes and step_kernels() kernels line up group by group (docs/calibration.md): a
// runtime node may fuse several step kernels (rope_kv_append = rope + kv_append, gate_up_swiglu
// = gate_up_proj + swiglu, moe = one moe_forward call against step_kernels' router, expert,
// shared-expert and combine kernels) and the runtime's relay nodes (gather, commit) belong to the
// neighbouring group. Returns the group of a node or kernel name; throws for an unknown name.
std::string group_of(const std::string& name) {
  static const std::map<std::string, std::string> kGroups = {
      {"gather", "embedding"},   {"embedding", "embedding"},    {"attn_norm", "attn_norm"},
      {"qkv_proj", "qkv_proj"},  {"rope_kv_append", "rope_kv"}, {"rope", "rope_kv"},
      {"kv_append", "rope_kv"},  {"attention", "attention"},    {"o_proj", "o_proj"},
      {"mlp_norm", "mlp_norm"},  {"gate_up_swiglu", "gate_up"}, {"gate_up_proj", "gate_up"},
      {"swiglu", "gate_up"},     {"down_proj", "down_proj"},    {"final_norm", "final_norm"},
      {"lm_head", "lm_head"},    {"commit", "lm_head"},         {"moe", "moe"},
      {"moe_router", "moe"},     {"moe_gate_up", "moe"},        {"moe_down", "moe"},
      {"shared_gate_up", "moe"}, {"shared_down", "moe"},        {"moe_combine", "moe"},
  };
  auto it = kGroups.find(name);
  if (it == kGroups.end()) {
    throw Error("calibrate: node or kernel '" + name +
                "' has no calibration group (runtime/calibrate.cc group_of)");
  }
  return it->second;
}

// Consecutive entries of one group form an instance; returns the [first, end) index ranges.
template <typename Name>
std::vector<std::pair<size_t, size_t>> instances(size_t n, Name name_of,
                                                 std::vector<std::string>* groups) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i < n;) {
    const std::string g = group_of(name_of(i));
    size_t j = i + 1;
    while (j < n && group_of(name_of(j)) == g) ++j;
    out.emplace_back(i, j);
    groups->push_back(g);
    i = j;
  }
  return out;
}

struct GridPoint {
  int batch;
  double step_graph_ns = 0;  // unprofiled medians
  double step_pdl_ns = 0;
  double step_eager_ns = 0;
  double eager_host_ns = 0;  // median host time of the eager launch loop (enqueue_decode)
  int64_t ctx_sum = 0;       // Σ ctx of the batch at the profiled launches' middle
};

class InSitu {
 public:
  InSitu(const CalibrateOptions& o, double node_gap_ns, std::vector<CalibrationSample>& out)
      : o_(o), gap_ns_(node_gap_ns), out_(out) {}

  void model(const std::string& name) {
    const ModelSpec& spec = model_preset(name);
    label_ = calibration_model_label(name, o_.tp, o_.fusion);
    const LlamaConfig full = llama_config_from_spec(spec);
    const LlamaConfig config = o_.tp > 1 ? tp_shard_config(full, 0, o_.tp) : full;
    const std::vector<int> contexts = !o_.contexts.empty() ? o_.contexts
                                      : o_.quick           ? std::vector<int>{128, 2048}
                                                           : std::vector<int>{128, 512, 2048, 8192};
    for (const int ctx : contexts) {
      std::vector<int> batches = !o_.batches.empty() ? o_.batches
                                 : o_.quick          ? std::vector<int>{1, 4, 16, 64}
                                                     : std::vector<int>{1, 2, 4, 8, 16, 32, 64};
      // Long contexts: the prefill of every slot and the KV of 64 slots cost more than the
      // points add (batches up to 32 cover the validation shapes at 8K: the suite's 8K x 32,
      // priced 2 % high while 16 was the largest batch measured there). A given grid is kept.
      if (ctx > 4096 && o_.batches.empty())
        batches.erase(std::remove_if(batches.begin(), batches.end(), [](int b) { return b > 32; }),
                      batches.end());
      std::map<int, GridPoint> points;
      if (!o_.breaks_only) {
        for (const bool profiled : {false, true}) {
          run_context(config, ctx, batches, profiled, points);
        }
      }
      // A shard alone: its steps with and without an empty non-PDL kernel at each collective
      // position.
      if (o_.tp > 1) {
        collective_breaks(config, ctx, batches, BreakVariant::kPlain);
        collective_breaks(o_.in_situ ? full : config, ctx, batches,
                          o_.in_situ ? BreakVariant::kInSitu : BreakVariant::kStubbed);
      }
    }
  }

 private:
  int reps() const { return o_.quick ? 6 : 16; }

  // An engine of the grid at context `ctx` (eo: the caller's options; this sets slots, capacity,
  // the shard and routing records), warmed up as a real run starts (RealOptions::warmup_launches:
  // decode, then the prefill of every slot's prompt, then the timed launches; docs/calibration.md
  // "Warm-up before timed decode": capturing the graphs before the warm-up, or timing PDL before
  // plain graphs, was measured and changed nothing), its graph and PDL graphs captured. Every
  // engine built here for one context reaches each grid point at the same contexts.
  struct GridEngine {
    std::unique_ptr<Engine> engine;
    std::vector<int32_t> slots;  // 0 .. max batch - 1
  };
  GridEngine grid_engine(const LlamaConfig& config, int ctx, const std::vector<int>& batches,
                         EngineOptions eo, const char* what) {
    const int max_batch = batches.back();
    // Per slot, worst case: every batch in three modes (graph, PDL, eager), in both passes.
    const int launches = 3 * int(batches.size()) * (reps() + 2);
    eo.max_slots = max_batch;
    // As the real backend sizes it (real_factory.cc): the KV capacity sets the attention split.
    eo.capacity_tokens = ((ctx + 15) / 16 * 16 + launches + 63) / 64 * 64;
    // A shard measured alone (no communicator, no collectives: rank 0's shard) unless the caller
    // gave the world communicator (collective_breaks' in-situ engine: this rank's shard).
    if (!eo.tp.active()) eo.tp.size = o_.tp;
    eo.fused_norms = o_.fusion.norms;  // the label's fusions (CalibrateOptions::fusion)
    eo.fused_rope = o_.fusion.rope;
    // MoE: each launch's routing, for its kernel samples (kernel_samples). Every pass alike, so
    // that the step times pair; a ring of kTsRing launches x layers x bucket rows x top_k ids
    // (Qwen3-30B-A3B, 64 rows: 25 MB), top_k 4-byte stores per row and layer in the router.
    eo.record_routing = config.moe();
    std::fprintf(o_.log, "calibrate: %s ctx %d, %d slots, %s\n", label_.c_str(), ctx, max_batch,
                 what);
    GridEngine g{Engine::create_synthetic(config, 1, eo), {}};
    g.engine->warm_up(GraphMode::kCudaGraph, kDecodeWarmupLaunches);
    const size_t slot_count = static_cast<size_t>(max_batch);
    std::vector<std::vector<int32_t>> prompts(slot_count);
    for (int i = 0; i < max_batch; ++i) {
      g.slots.push_back(i);
      prompts[size_t(i)].resize(size_t(ctx));
      for (int t = 0; t < ctx; ++t) prompts[size_t(i)][size_t(t)] = (i * 7919 + t * 31) % 32000;
    }
    g.engine->enqueue_prefill(g.slots, prompts);
    TS_CUDA_CHECK(cudaStreamSynchronize(g.engine->compute_stream()));
    for (const GraphMode mode : {GraphMode::kCudaGraph, GraphMode::kCudaGraphPdl}) {
      g.engine->prepare(mode, max_batch);
    }
    return g;
  }

  // One grid point's launches of `mode`: 2 untimed, then reps() timed back to back, each between
  // two events of `ev` (host time of its launch call measured too); every caller issues the same
  // sequence, so engines built alike reach each grid point at the same contexts. `slot_ctx`
  // advances by the launches; ctx_mid is the batch's summed context before the middle launch.
  struct TimedLaunches {
    std::vector<double> step_ns, host_ns;
    std::vector<int64_t> seqs;
    int64_t ctx_mid = 0;
  };
  TimedLaunches timed_launches(Engine& engine, std::span<const int32_t> batch_slots, GraphMode mode,
                               std::vector<int64_t>& slot_ctx, Events& ev) {
    const size_t batch = batch_slots.size();
    TimedLaunches t;
    for (int w = 0; w < 2; ++w) engine.enqueue_decode(batch_slots, mode);  // warm-up
    for (size_t i = 0; i < batch; ++i) slot_ctx[i] += 2;
    for (int r = 0; r < reps(); ++r) {
      if (r == reps() / 2) {
        for (size_t i = 0; i < batch; ++i) t.ctx_mid += slot_ctx[i];
      }
      TS_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * r)], engine.compute_stream()));
      const auto t0 = Clock::now();
      t.seqs.push_back(engine.enqueue_decode(batch_slots, mode));
      const auto t1 = Clock::now();
      TS_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * r + 1)], engine.compute_stream()));
      t.host_ns.push_back(ns_between(t0, t1));
      for (size_t i = 0; i < batch; ++i) ++slot_ctx[i];
    }
    TS_CUDA_CHECK(cudaStreamSynchronize(engine.compute_stream()));
    for (int r = 0; r < reps(); ++r) {
      t.step_ns.push_back(ev.elapsed_ns(size_t(2 * r), size_t(2 * r + 1)));
    }
    return t;
  }

  void run_context(const LlamaConfig& config, int ctx, const std::vector<int>& batches,
                   bool profiled, std::map<int, GridPoint>& points) {
    EngineOptions eo;
    eo.profile_nodes = profiled;
    GridEngine g = grid_engine(config, ctx, batches, eo, profiled ? "profiled" : "unprofiled");
    Engine* engine = g.engine.get();
    const std::vector<int32_t>& slots = g.slots;
    std::vector<int64_t> slot_ctx(slots.size(), ctx);
    Events ev(size_t(2 * reps()));
    for (const int batch : batches) {
      const std::span<const int32_t> batch_slots(slots.data(), size_t(batch));
      GridPoint& point = points[batch];
      point.batch = batch;
      // Eager's gap comes from unprofiled step times, never from node timestamps; the profiled
      // pass runs its launches too, unrecorded, so that both passes reach every grid point at
      // the same contexts (the kernel samples and the graph steps pair up by context).
      for (const GraphMode mode :
           {GraphMode::kCudaGraph, GraphMode::kCudaGraphPdl, GraphMode::kEager}) {
        const bool eager = mode == GraphMode::kEager;
        const char* mode_name = eager ? "eager" : mode == GraphMode::kCudaGraph ? "graph" : "pdl";
        const TimedLaunches t = timed_launches(*engine, batch_slots, mode, slot_ctx, ev);
        const std::vector<double>& host_ns = t.host_ns;
        const std::vector<double>& step_ns = t.step_ns;
        const int64_t ctx_mid = t.ctx_mid;
        if (profiled && eager) continue;
        const int64_t nodes = int64_t(engine->decode_node_names(batch).size());
        for (int r = 0; r < reps(); ++r) {
          CalibrationSample x = sample(profiled ? "step_profiled" : "step", step_ns[size_t(r)]);
          x.model = label_;
          x.mode = mode_name;
          x.batch = batch;
          x.ctx_tokens = ctx_mid / batch;
          x.nodes = nodes;
          out_.push_back(x);
          if (!profiled && !eager) {
            CalibrationSample h = sample("graph_launch", host_ns[size_t(r)]);
            h.name = "decode";
            h.model = label_;
            h.mode = mode_name;
            h.batch = batch;
            h.nodes = nodes;
            out_.push_back(h);
          }
        }
        if (!profiled) {
          (eager                           ? point.step_eager_ns
           : mode == GraphMode::kCudaGraph ? point.step_graph_ns
                                           : point.step_pdl_ns) = median(step_ns);
          if (eager) point.eager_host_ns = median(host_ns);
          if (mode == GraphMode::kCudaGraph) point.ctx_sum = ctx_mid;
        } else if (mode == GraphMode::kCudaGraph) {
          kernel_samples(*engine, point, median(step_ns), t.seqs, ctx_mid);
        }
      }
      if (!profiled) {
        pdl_gap_sample(point, ctx);
        eager_gap_sample(point, ctx);
      }
    }
  }

  // collective_break samples (policies/calibration_profile.h): the shard's unprofiled graph and
  // PDL steps in an engine built as run_context builds the unprofiled one (same capacity, prompts
  // and launch sequence), named "plain"; with EngineOptions::collective_stubs, "stubbed"; or this
  // rank's shard of `config` (the full model) with its real collectives over the world
  // communicator, "in_situ" (CalibrateOptions::in_situ). The passes reach every grid point at the
  // same contexts, so their steps pair. The difference is what a real TP graph pays at each
  // all-reduce: the PDL chain broken on both sides, and in situ the collective itself
  // (simulator: HardwareSpec::*_break_gap_by_rows).
  enum class BreakVariant { kPlain, kStubbed, kInSitu };
  void collective_breaks(const LlamaConfig& config, int ctx, const std::vector<int>& batches,
                         BreakVariant variant) {
    EngineOptions eo;
    eo.collective_stubs = variant == BreakVariant::kStubbed;
    if (variant == BreakVariant::kInSitu) eo.tp = tp_world(o_.tp);
    // Per variant: the samples' name, the progress line's words.
    static constexpr const char* kSampleNames[] = {"plain", "stubbed", "in_situ"};
    static constexpr const char* kWhat[] = {"no collective stubs", "collective stubs",
                                            "collectives in situ"};
    const char* sample_name = kSampleNames[int(variant)];
    GridEngine g = grid_engine(config, ctx, batches, eo, kWhat[int(variant)]);
    Engine* engine = g.engine.get();
    const std::vector<int32_t>& slots = g.slots;
    std::vector<int64_t> slot_ctx(slots.size(), ctx);
    Events ev(size_t(2 * reps()));
    for (const int batch : batches) {
      const std::span<const int32_t> batch_slots(slots.data(), size_t(batch));
      // The collective positions: named in the stubbed or in-situ engine's graph (the plain
      // shard's graph names none: it has no collectives).
      int64_t stubs = 0;
      for (const char* name : engine->decode_node_names(batch)) {
        stubs += group_collective_name(name) ? 1 : 0;
      }
      // The same launch sequence as run_context (graph, PDL, eager), so the contexts match.
      for (const GraphMode mode :
           {GraphMode::kCudaGraph, GraphMode::kCudaGraphPdl, GraphMode::kEager}) {
        const TimedLaunches t = timed_launches(*engine, batch_slots, mode, slot_ctx, ev);
        if (mode == GraphMode::kEager) continue;
        for (int r = 0; r < reps(); ++r) {
          CalibrationSample x = sample("collective_break", t.step_ns[size_t(r)]);
          x.name = sample_name;
          x.model = label_;
          x.mode = mode == GraphMode::kCudaGraph ? "graph" : "pdl";
          x.batch = batch;
          x.ctx_tokens = t.ctx_mid / batch;
          x.nodes = stubs;
          out_.push_back(x);
        }
      }
    }
  }

  // The eager node gap the same way: g_eager = g + (T_eager − T_graph) / nodes, the GPU time
  // between eagerly launched kernels that were already queued. Only where the host's launch
  // loop (median) is shorter than the GPU step: otherwise kernels waited for their launches and
  // the step measures the host, which the simulator prices apart (eager_launch_ns per kernel).
  // The first kernels may still wait for the host (the GPU starts as the loop does); that is a
  // few microseconds per step, a few ns per node.
  void eager_gap_sample(const GridPoint& p, int ctx) {
    if (p.step_eager_ns <= 0 || p.eager_host_ns >= p.step_eager_ns) return;
    gap_sample(p, ctx, p.step_eager_ns, "eager");
  }

  // The PDL node gap that makes Σ kernels + nodes · gap reproduce the measured PDL step, given
  // the graph step and gap: g_pdl = g + (T_pdl − T_graph) / nodes (step_kernels' node count).
  void pdl_gap_sample(const GridPoint& p, int ctx) { gap_sample(p, ctx, p.step_pdl_ns, "pdl"); }

  // One node_gap sample of `mode` from its step time against the graph step's.
  void gap_sample(const GridPoint& p, int ctx, double step_ns, const char* mode) {
    StepKernels sk;
    calibration_step_kernels(label_, decode_shape(p.batch, 1, p.ctx_sum), sk);
    const double nodes = double(sk.node_count());
    CalibrationSample x =
        sample("node_gap", std::max(0.0, gap_ns_ + (step_ns - p.step_graph_ns) / nodes));
    x.mode = mode;
    x.model = label_;
    x.batch = p.batch;
    x.ctx_tokens = ctx;
    x.nodes = int64_t(nodes);
    out_.push_back(x);
  }

  // Kernel samples of one grid point from the profiled launches (docs/calibration.md): node j's
  // interval d_j between timestamps, less the per-node profiling overhead
  // δ = (T_profiled − T_unprofiled) / nodes, median over launches, less one node gap per step
  // kernel, so that Σ kernels + nodes · gap reproduces the unprofiled step. MoE layers where the
  // engine records routing: one sample per launch instead, its kernels priced for the experts
  // that launch routed to the rank in that layer (moe_launch_samples).
  void kernel_samples(Engine& engine, const GridPoint& p, double profiled_step_ns,
                      const std::vector<int64_t>& seqs, int64_t ctx_mid) {
    const std::vector<const char*>& names = engine.decode_node_names(p.batch);
    const size_t n = names.size();
    const double delta = (profiled_step_ns - p.step_graph_ns) / double(n);
    std::vector<std::string> real_groups;
    const auto real = instances(
        n, [&](size_t i) { return std::string(names[i]); }, &real_groups);

    StepKernels sk;
    calibration_step_kernels(label_, decode_shape(p.batch, 1, ctx_mid), sk);
    std::vector<const KernelDesc*> flat;
    for (const LayerRun& run : sk.runs) {
      for (int32_t r = 0; r < run.repeat; ++r) {
        for (int32_t i = run.first; i < run.first + run.count; ++i) {
          flat.push_back(&sk.kernels[size_t(i)]);
        }
      }
    }
    std::vector<std::string> sim_groups;
    const auto sim = instances(
        flat.size(), [&](size_t i) { return std::string(flat[i]->name); }, &sim_groups);
    if (real_groups != sim_groups) {
      throw Error("calibrate: " + label_ + " batch " + std::to_string(p.batch) + ": the " +
                  std::to_string(real_groups.size()) + " runtime node groups do not line up with " +
                  "the " + std::to_string(sim_groups.size()) + " step_kernels groups");
    }
    // Per instance and real member: its cost (d_j − δ) in every profiled launch.
    std::vector<std::vector<std::vector<double>>> cost(real.size());
    for (size_t k = 0; k < real.size(); ++k) cost[k].resize(real[k].second - real[k].first);
    const auto stamps = engine.node_timestamps(seqs.front(), seqs.back());
    std::vector<int64_t> launches;  // the profiled launches, in the order of the costs
    for (const auto& [seq, ts] : stamps) {
      if (ts.size() < n + 1) throw Error("calibrate: fewer timestamps than nodes");
      launches.push_back(seq);
      for (size_t k = 0; k < real.size(); ++k) {
        for (size_t j = real[k].first; j < real[k].second; ++j) {
          cost[k][j - real[k].first].push_back(double(int64_t(ts[j + 1]) - int64_t(ts[j])) - delta);
        }
      }
    }
    const bool routed = engine.options().record_routing;
    const MoeLaunches moe =
        routed ? moe_launches(engine, p, launches, occurrences(sim_groups, "moe")) : MoeLaunches{};
    size_t moe_instance = 0;
    for (size_t k = 0; k < sim.size(); ++k) {
      const std::span<const KernelDesc* const> kernels(flat.data() + sim[k].first,
                                                       sim[k].second - sim[k].first);
      if (routed && sim_groups[k] == "moe") {
        moe_launch_samples(moe, moe_instance++, kernels, cost[k], p, ctx_mid);
        continue;
      }
      std::vector<double> node_ns;
      for (const std::vector<double>& c : cost[k]) node_ns.push_back(median(c));
      instance_samples(kernels, node_ns, p, ctx_mid, 0);
    }
    if (dropped_ > 0) {
      std::fprintf(o_.log, "calibrate: %lld kernel samples at or below one node gap dropped\n",
                   static_cast<long long>(dropped_));
    }
  }

  static size_t occurrences(const std::vector<std::string>& v, const char* x) {
    return size_t(std::count(v.begin(), v.end(), x));
  }

  // The routing of the profiled launches of a grid point: per launch, Engine::decode_routing's
  // ids for the point's rows; the model's MoE layers in order (the step kernels' "moe" instances).
  struct MoeLaunches {
    std::vector<std::vector<int32_t>> ids;  // per launch: ids[(layer * rows + row) * top_k + j]
    std::vector<int32_t> layers;            // the model's MoE layer indices
    size_t per_layer = 0;                   // rows * top_k
  };

  MoeLaunches moe_launches(Engine& engine, const GridPoint& p, const std::vector<int64_t>& launches,
                           size_t instances) {
    const LlamaConfig& c = engine.config();
    const ModelSpec& spec = model_preset(parse_calibration_model(label_).preset);
    MoeLaunches m;
    for (size_t l = 0; l < spec.layers.size(); ++l) {
      if (spec.layers[l].mlp.kind == MlpKind::kMoe) m.layers.push_back(int32_t(l));
    }
    if (m.layers.size() != instances || int64_t(spec.layers.size()) != c.layers)
      throw Error("calibrate: " + label_ + ": " + std::to_string(instances) +
                  " MoE node groups against " + std::to_string(m.layers.size()) + " MoE layers");
    m.per_layer = size_t(p.batch) * size_t(c.top_k);
    for (const int64_t seq : launches) {
      m.ids.push_back(engine.decode_routing(seq, p.batch));
      for (const int32_t e : m.ids.back()) {
        // The ring starts at -1: an entry the launch did not write.
        if (e < 0 || e >= c.num_experts)
          throw Error("calibrate: " + label_ + " launch " + std::to_string(seq) +
                      " recorded expert " + std::to_string(e) + " outside [0, " +
                      std::to_string(c.num_experts) + ")");
      }
    }
    return m;
  }

  // One MoE layer's samples, one per profiled launch: the node costs of that launch, split over
  // the layer's moe kernels built for the launch's routing of the layer on this rank (distinct
  // experts and routed copies in rank 0's block; calibration_expert_share). Each sample carries
  // nodes = the launches, so that per grid point they count 1 / launches (residual_kernel_samples).
  void moe_launch_samples(const MoeLaunches& m, size_t instance,
                          std::span<const KernelDesc* const> expected,
                          const std::vector<std::vector<double>>& node_costs, const GridPoint& p,
                          int64_t ctx_mid) {
    const int32_t layer = m.layers[instance];
    std::vector<KernelDesc> layer_list;
    std::vector<const KernelDesc*> kernels;
    std::vector<double> node_ns(node_costs.size());
    for (size_t launch = 0; launch < m.ids.size(); ++launch) {
      const std::span<const int32_t> ids(m.ids[launch].data() + size_t(layer) * m.per_layer,
                                         m.per_layer);
      calibration_layer_kernels(label_, decode_shape(p.batch, 1, ctx_mid), layer,
                                calibration_expert_share(label_, layer, ids), layer_list);
      kernels.clear();
      for (const KernelDesc& d : layer_list) {
        if (group_of(d.name) == "moe") kernels.push_back(&d);
      }
      if (kernels.size() != expected.size())
        throw Error("calibrate: " + label_ + " layer " + std::to_string(layer) + ": " +
                    std::to_string(kernels.size()) + " moe kernels under the launch's routing, " +
                    std::to_string(expected.size()) + " in the step");
      for (size_t i = 0; i < kernels.size(); ++i) {
        if (std::string_view(kernels[i]->name) != expected[i]->name)
          throw Error("calibrate: " + label_ + ": moe kernel " + kernels[i]->name +
                      " where the step has " + expected[i]->name);
      }
      for (size_t j = 0; j < node_costs.size(); ++j) node_ns[j] = node_costs[j][launch];
      instance_samples(kernels, node_ns, p, ctx_mid, int64_t(m.ids.size()));
    }
  }

  // Samples of one instance's step kernels from its runtime nodes' costs `node_ns` (d_j − δ, in
  // node order). One runtime node per step kernel: each kernel gets its own node's time less
  // one gap. Otherwise (fused or relay nodes) the step kernels share the instance's total less
  // one gap each, in proportion to their bytes. `launches`: CalibrationSample::nodes.
  void instance_samples(std::span<const KernelDesc* const> kernels,
                        const std::vector<double>& node_ns, const GridPoint& p, int64_t ctx_mid,
                        int64_t launches) {
    const size_t members = kernels.size();
    const bool paired = node_ns.size() == members;
    double total = 0;
    for (const double c : node_ns) total += c;
    double bytes_sum = 0;
    for (const KernelDesc* d : kernels) bytes_sum += double(d->bytes_read + d->bytes_written);
    for (size_t i = 0; i < members; ++i) {
      const KernelDesc& d = *kernels[i];
      const double share = bytes_sum > 0 ? double(d.bytes_read + d.bytes_written) / bytes_sum
                                         : 1.0 / double(members);
      const double ns = paired ? node_ns[i] - gap_ns_ : (total - double(members) * gap_ns_) * share;
      if (ns <= 0) {
        ++dropped_;
        continue;
      }
      CalibrationSample x = sample("kernel", ns);
      x.name = d.name;
      x.cls = kernel_class_name(d.cls);
      x.model = label_;
      x.mode = "graph";
      x.batch = p.batch;
      x.ctx_tokens = ctx_mid / p.batch;
      x.nodes = launches;
      x.bytes = d.bytes_read + d.bytes_written;
      x.flops = d.flops;
      out_.push_back(x);
    }
  }

  const CalibrateOptions& o_;
  double gap_ns_;
  std::vector<CalibrationSample>& out_;
  int64_t dropped_ = 0;
  std::string label_;  // the model being measured (calibration_model_label)
};

// ---- attention partition ---------------------------------------------------------------------

// The decode attention of `name` (its TP shard's heads for tp > 1) at one context and several KV
// capacities that partition it differently (docs/calibration.md "Attention partition"): the
// split size follows the capacity (kernels/attention_split.h), so the same launch costs more or
// less in engines of different capacities. Per requests (1, 4; quick: 1), query rows per request
// (1, half and all of the widest verify's) and context (2048, 8192; quick: 8192): from the
// capacity calibrate measures the speculative graphs at (spec_calibration_capacity_tokens), the
// first capacity of each of the next split sizes, four partitions in all (quick: three); each a
// graph of 32 launches over 32 layers of KV with PDL, as in situ, 2 untimed and 20 timed
// replays (quick: 6). Samples attention_partition: batch = requests, ctx_tokens, nodes = query
// rows per request, bytes = the KV capacity, flops = the split size in tokens (for reading),
// value_ns = the median launch (replay / 32). Zeroed KV and queries (the time does not depend on
// the values).
void attention_partition(const CalibrateOptions& o, const std::string& name,
                         std::vector<CalibrationSample>& out) {
  const LlamaConfig full = llama_config_from_spec(model_preset(name));
  const LlamaConfig config = o.tp > 1 ? tp_shard_config(full, 0, o.tp) : full;
  const std::string label = calibration_model_label(name, o.tp);
  constexpr int kLayers = 32;
  const int kv_heads = config.kv_heads, q_heads = config.q_heads;
  const int max_width = spec_calibration_max_width(q_heads, kv_heads);
  const int sms = device_sms();
  const std::vector<int> requests_list = o.quick ? std::vector<int>{1} : std::vector<int>{1, 4};
  const std::vector<int> contexts = o.quick ? std::vector<int>{8192} : std::vector<int>{2048, 8192};
  const std::vector<int> rows_list = {1, std::max(1, max_width / 2), max_width};
  const size_t partitions = o.quick ? 3 : 4;
  const int reps = o.quick ? 6 : 20;
  Stream stream;
  Events ev(2);
  for (const int requests : requests_list) {
    for (const int ctx : contexts) {
      // The capacities: calibrate's speculative one, then the first of each larger split size.
      std::vector<int> capacities;
      int last_split = 0;
      for (int cap = spec_calibration_capacity_tokens(ctx, max_width);
           capacities.size() < partitions && cap <= 8 * ctx; cap += 64) {
        const int split = kernels::attention_partition(cap, requests, kv_heads, sms).split_tokens;
        if (split != last_split) capacities.push_back(cap);
        last_split = split;
      }
      for (const int capacity : capacities) {
        // The cache: one buffer per request of kLayers x (K, V) x heads x capacity x 128 bf16.
        const size_t per_request =
            size_t(kLayers) * 2 * size_t(kv_heads) * size_t(capacity) * kernels::kHeadDim;
        auto kv =
            device_alloc<kernels::bf16>(size_t(requests) * per_request * sizeof(kernels::bf16));
        TS_CUDA_CHECK(
            cudaMemset(kv.get(), 0, size_t(requests) * per_request * sizeof(kernels::bf16)));
        std::vector<kernels::bf16*> bases(static_cast<size_t>(requests));
        for (int r = 0; r < requests; ++r) bases[size_t(r)] = kv.get() + size_t(r) * per_request;
        auto base_dev = device_alloc<kernels::bf16*>(bases.size() * sizeof(kernels::bf16*));
        TS_CUDA_CHECK(cudaMemcpy(base_dev.get(), bases.data(), bases.size() * sizeof(bases[0]),
                                 cudaMemcpyHostToDevice));
        const std::vector<int> ctx_host(size_t(requests), ctx);
        auto ctx_dev = device_alloc<int>(ctx_host.size() * sizeof(int));
        TS_CUDA_CHECK(cudaMemcpy(ctx_dev.get(), ctx_host.data(), ctx_host.size() * sizeof(int),
                                 cudaMemcpyHostToDevice));
        kernels::KvCache cache;
        cache.request_base = base_dev.get();
        cache.num_layers = kLayers;
        cache.num_kv_heads = kv_heads;
        cache.capacity_tokens = capacity;
        for (const int rows : rows_list) {
          kernels::AttentionShape shape;
          shape.num_requests = requests;
          shape.q_len = rows;
          shape.num_q_heads = q_heads;
          const size_t q_elems = size_t(requests) * rows * q_heads * kernels::kHeadDim;
          auto q = device_alloc<kernels::bf16>(q_elems * sizeof(kernels::bf16));
          auto o_buf = device_alloc<kernels::bf16>(q_elems * sizeof(kernels::bf16));
          TS_CUDA_CHECK(cudaMemset(q.get(), 0, q_elems * sizeof(kernels::bf16)));
          auto ws = device_alloc<char>(kernels::attention_workspace_bytes(shape, cache));
          cudaGraph_t g = nullptr;
          TS_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
          for (int l = 0; l < kLayers; ++l) {
            kernels::decode_attention(q.get(), cache, l, ctx_dev.get(), o_buf.get(), shape,
                                      ws.get(), stream, /*pdl=*/l > 0);
          }
          TS_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
          cudaGraphExec_t exec = nullptr;
          TS_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
          TS_CUDA_CHECK(cudaGraphDestroy(g));
          std::vector<double> ns;
          for (int rep = -2; rep < reps; ++rep) {
            TS_CUDA_CHECK(cudaEventRecord(ev[0], stream));
            TS_CUDA_CHECK(cudaGraphLaunch(exec, stream));
            TS_CUDA_CHECK(cudaEventRecord(ev[1], stream));
            TS_CUDA_CHECK(cudaEventSynchronize(ev[1]));
            if (rep >= 0) ns.push_back(ev.elapsed_ns(0, 1) / kLayers);
          }
          TS_CUDA_CHECK(cudaGraphExecDestroy(exec));
          const kernels::AttentionPartition part =
              kernels::attention_partition(capacity, requests, kv_heads, sms);
          CalibrationSample x = sample("attention_partition", median(ns));
          x.name = "attention";
          x.model = label;
          x.mode = "pdl";
          x.batch = requests;
          x.ctx_tokens = ctx;
          x.nodes = rows;
          x.bytes = capacity;
          x.flops = part.split_tokens;
          std::fprintf(o.log,
                       "calibrate: %s attention partition: %d requests, ctx %d, %2d rows, "
                       "capacity %5d: %3d-token splits (%2d filled) %7.2f us\n",
                       label.c_str(), requests, ctx, rows, capacity, part.split_tokens,
                       kernels::attention_active_splits(part, ctx + rows), x.value_ns / 1e3);
          out.push_back(x);
        }
      }
    }
  }
}

// ---- speculative graphs in situ ----------------------------------------------------------------

// The speculative graphs of `name` (docs/calibration.md "Speculative graphs"): at the smallest
// and largest context of the decode grid, per batch and verify width W, rounds of draft(W − 1),
// verify(W), extend(W) as a policy launches them, each graph bracketed by its own event pair;
// then draft(W − 1) alone with device stops and early exit (conditional IF nodes), threshold 0 so
// that no row stops and every step runs. Two untimed rounds first (they capture the graphs).
// Every round starts from the prompt's context (Engine::rewind_context), so the engine's capacity
// is the context's plus one round, as a run's is its prompt's plus its output: the attention's
// partition follows the capacity (split_tokens_for, kernels/attention.cu), and a capacity grown
// by every round of every width priced a batch-8 verify at 8K up to 3 % high. The verify output
// entries are checked to start there (verify commits a device-decided count; draft and extend
// commit nothing).
void spec_graphs(const CalibrateOptions& o, const std::string& name,
                 std::vector<CalibrationSample>& out) {
  const LlamaConfig full = llama_config_from_spec(model_preset(name));
  // tp > 1: rank 0's shard alone, as the decode grid measures it (no collectives), without the
  // early-exit draft (tensor parallelism runs drafts without early exit: create_synthetic_tp).
  const LlamaConfig config = o.tp > 1 ? tp_shard_config(full, 0, o.tp) : full;
  const std::string label = calibration_model_label(name, o.tp, o.fusion);
  const bool early_exit = o.tp == 1;
  std::vector<int> contexts = o.quick ? std::vector<int>{128, 2048} : std::vector<int>{128, 8192};
  if (!o.contexts.empty()) {
    const auto [lo, hi] = std::minmax_element(o.contexts.begin(), o.contexts.end());
    contexts = *lo == *hi ? std::vector<int>{*lo} : std::vector<int>{*lo, *hi};
  }
  std::vector<int> batches = o.quick ? std::vector<int>{1} : std::vector<int>{1, 4};
  if (!o.spec_batches.empty()) {
    batches = o.spec_batches;
  } else if (!o.batches.empty()) {
    batches.clear();
    for (const int b : o.batches) {
      if (b <= 4) batches.push_back(b);
    }
    if (batches.empty()) batches.push_back(o.batches.front());
  }
  // The engine's verify widths: 16 rows of GEMV, 64 query rows of decode_attention per KV head.
  static_assert(kMaxDraftTokens + 1 == kSpecCalibrationMaxWidth);
  const int max_width = spec_calibration_max_width(config.q_heads, config.kv_heads);
  std::vector<int> widths;
  for (const int w : o.quick ? std::vector<int>{2, 6, 16} : std::vector<int>{2, 4, 6, 8, 12, 16}) {
    if (w <= max_width) widths.push_back(w);
  }
  // Early-exit drafts that stop after one token, in graphs of these many steps (draft lengths
  // up to the widest verify's).
  std::vector<int> skip_steps;
  for (const int steps : o.quick ? std::vector<int>{15} : std::vector<int>{3, 7, 15}) {
    if (steps <= max_width - 1) skip_steps.push_back(steps);
  }
  // Verify entries are read after a width's rounds: 2 launches per round within kOutputRing.
  constexpr int kWarm = 2;
  const int reps = o.quick ? 6 : 20;
  static_assert(2 * (kWarm + 20) <= kOutputRing);
  int32_t capacity = 0;  // the engine's KV capacity at the context being measured
  const auto sample_of = [&](const char* graph, double ns, int batch, int64_t ctx, int positions) {
    CalibrationSample x = sample("spec_graph", ns);
    x.name = graph;
    x.model = label;
    x.mode = "graph";
    x.batch = batch;
    x.ctx_tokens = ctx;
    x.nodes = positions;
    x.bytes = capacity;  // spec_graph samples: the KV capacity (CalibrationSample::bytes)
    out.push_back(x);
  };
  // The engines: per context, the capacity of one round past it (or --spec-capacity-tokens);
  // at the largest context also the first capacities of the next spec_partitions − 1 split sizes
  // of the smallest batch (kernels/attention_split.h): runs hold their whole output, so their
  // partition is often another than one round's (docs/calibration.md "Attention partition").
  const int sms = device_sms();
  const int min_batch = *std::min_element(batches.begin(), batches.end());
  std::vector<std::pair<int, int32_t>> engines;  // (ctx, capacity)
  for (const int ctx : contexts) {
    // One round's tokens past the prompt (every draft accepted) and a verify's width of margin.
    const int32_t round_capacity = spec_calibration_capacity_tokens(ctx, max_width);
    if (o.spec_capacity_tokens > 0 && o.spec_capacity_tokens < round_capacity)
      throw Error("calibrate: --spec-capacity-tokens " + std::to_string(o.spec_capacity_tokens) +
                  " holds less than context " + std::to_string(ctx) +
                  " plus one round of the widest verify (" + std::to_string(round_capacity) +
                  " tokens)");
    if (o.spec_capacity_tokens > 0) {
      engines.emplace_back(ctx, o.spec_capacity_tokens);
      continue;
    }
    engines.emplace_back(ctx, round_capacity);
    if (ctx != contexts.back()) continue;
    int last =
        kernels::attention_partition(round_capacity, min_batch, config.kv_heads, sms).split_tokens;
    int added = 1;
    for (int32_t cap = round_capacity + 64; added < o.spec_partitions && cap <= 4 * ctx + 4096;
         cap += 64) {
      const int split =
          kernels::attention_partition(cap, min_batch, config.kv_heads, sms).split_tokens;
      if (split == last) continue;
      engines.emplace_back(ctx, cap);
      last = split;
      ++added;
    }
  }
  for (const auto& [ctx, engine_capacity] : engines) {
    const int max_batch = *std::max_element(batches.begin(), batches.end());
    EngineOptions eo;
    eo.max_slots = max_batch;
    eo.capacity_tokens = engine_capacity;
    capacity = eo.capacity_tokens;
    eo.draft = true;
    eo.draft_early_exit = early_exit;  // used by drafts with device stops only
    eo.tp.size = o.tp;                 // a shard measured alone: no communicator
    eo.fused_norms = o.fusion.norms;   // the target's fusions (the draft never fuses)
    eo.fused_rope = o.fusion.rope;
    std::fprintf(o.log, "calibrate: %s speculative graphs, ctx %d, %d slots, KV capacity %d\n",
                 label.c_str(), ctx, max_batch, capacity);
    auto engine = Engine::create_synthetic(config, 1, eo, /*draft_fidelity=*/0.5);
    engine->warm_up(GraphMode::kCudaGraph, kDecodeWarmupLaunches);  // as the grid's engines
    const cudaStream_t stream = engine->compute_stream();
    const size_t slot_count = static_cast<size_t>(max_batch);
    std::vector<int32_t> slots(slot_count);
    std::vector<std::vector<int32_t>> prompts(slot_count);
    for (int i = 0; i < max_batch; ++i) {
      slots[size_t(i)] = i;
      prompts[size_t(i)].resize(size_t(ctx));
      for (int t = 0; t < ctx; ++t) prompts[size_t(i)][size_t(t)] = (i * 7919 + t * 31) % 32000;
    }
    engine->enqueue_prefill(slots, prompts);
    TS_CUDA_CHECK(cudaStreamSynchronize(stream));
    Events ev(size_t(6 * reps));
    for (const int batch : batches) {
      const std::span<const int32_t> batch_slots(slots.data(), size_t(batch));
      for (const int width : widths) {
        DraftControl plain;
        plain.steps = width - 1;
        plain.threshold = 0.0f;
        DraftControl early = plain;
        early.device_stop = true;  // threshold 0: no row stops, every step runs
        std::vector<int64_t> verify_seqs;
        for (int r = -kWarm; r < reps; ++r) {
          const bool timed = r >= 0;
          auto mark = [&](int k) {
            if (timed) TS_CUDA_CHECK(cudaEventRecord(ev[size_t(6 * r + k)], stream));
          };
          engine->rewind_context(batch_slots, ctx);
          mark(0);
          engine->enqueue_draft(batch_slots, plain, GraphMode::kCudaGraph);
          mark(1);
          mark(2);
          const int64_t seq =
              engine->enqueue_verify(batch_slots, width, plain.threshold, GraphMode::kCudaGraph);
          mark(3);
          mark(4);
          engine->enqueue_extend(batch_slots, width, GraphMode::kCudaGraph);
          mark(5);
          engine->enqueue_output_copy(seq, batch, stream);  // after the extend's end event
          if (timed) verify_seqs.push_back(seq);
        }
        TS_CUDA_CHECK(cudaStreamSynchronize(stream));
        // Every timed round started at the prompt's context: the verify committed accepted + 1
        // tokens past it.
        for (const int64_t seq : verify_seqs) {
          const OutputRow* rows = engine->host_outputs(seq);
          for (int i = 0; i < batch; ++i) {
            if (rows[i].accepted < 0 || rows[i].accepted > width - 1 ||
                rows[i].ctx != ctx + rows[i].accepted + 1) {
              throw Error("calibrate: verify output entry " + std::to_string(seq) + " row " +
                          std::to_string(i) + " has ctx " + std::to_string(rows[i].ctx) +
                          ", accepted " + std::to_string(rows[i].accepted) + " (width " +
                          std::to_string(width) + ", rounds from context " + std::to_string(ctx) +
                          ")");
            }
          }
        }
        const int64_t ctx_mid = ctx;
        std::vector<double> draft_ns, verify_ns, extend_ns, early_ns;
        for (int r = 0; r < reps; ++r) {
          draft_ns.push_back(ev.elapsed_ns(size_t(6 * r), size_t(6 * r + 1)));
          verify_ns.push_back(ev.elapsed_ns(size_t(6 * r + 2), size_t(6 * r + 3)));
          extend_ns.push_back(ev.elapsed_ns(size_t(6 * r + 4), size_t(6 * r + 5)));
          sample_of("draft", draft_ns.back(), batch, ctx_mid, width - 1);
          sample_of("verify", verify_ns.back(), batch, ctx_mid, width);
          sample_of("extend", extend_ns.back(), batch, ctx_mid, width);
        }
        // The early-exit draft from the prompt's context with the last round's draft state
        // (drafts commit nothing).
        engine->rewind_context(batch_slots, ctx);
        for (int r = -kWarm; early_exit && r < reps; ++r) {
          if (r >= 0) TS_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * r)], stream));
          engine->enqueue_draft(batch_slots, early, GraphMode::kCudaGraph);
          if (r >= 0) TS_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * r + 1)], stream));
        }
        TS_CUDA_CHECK(cudaStreamSynchronize(stream));
        for (int r = 0; early_exit && r < reps; ++r) {
          early_ns.push_back(ev.elapsed_ns(size_t(2 * r), size_t(2 * r + 1)));
          sample_of("draft_early_exit", early_ns.back(), batch, ctx, width - 1);
        }
        const std::string early_text =
            early_exit ? ", with early exit " + std::to_string(median(early_ns) / 1e6) + " ms"
                       : std::string();
        std::fprintf(o.log,
                     "calibrate: %s batch %d ctx %lld W %d: draft(%d) %.3f ms%s, verify %.3f ms, "
                     "extend %.3f ms (medians)\n",
                     label.c_str(), batch, static_cast<long long>(ctx_mid), width, width - 1,
                     median(draft_ns) / 1e6, early_text.c_str(), median(verify_ns) / 1e6,
                     median(extend_ns) / 1e6);
      }
      // Early-exit drafts of `steps` steps that stop after their first token (a threshold above
      // every confidence): steps − 1 conditional steps skipped, each still paying its condition
      // kernel and conditional node. A confidence round's draft graph has max_steps steps and
      // stops at the device's length, so it pays this for every step past that length.
      for (const int steps : skip_steps) {
        if (!early_exit) break;
        DraftControl stop;
        stop.steps = steps;
        stop.device_stop = true;
        stop.threshold = 2.0f;  // above every top-1 probability: the draft stops at min_steps 1
        for (int r = -kWarm; r < reps; ++r) {
          if (r >= 0) TS_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * r)], stream));
          engine->enqueue_draft(batch_slots, stop, GraphMode::kCudaGraph);
          if (r >= 0) TS_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * r + 1)], stream));
        }
        TS_CUDA_CHECK(cudaStreamSynchronize(stream));
        std::vector<double> skip_ns;
        for (int r = 0; r < reps; ++r) {
          skip_ns.push_back(ev.elapsed_ns(size_t(2 * r), size_t(2 * r + 1)));
          sample_of(kEarlyExitSkipSample, skip_ns.back(), batch, ctx, steps);
        }
        std::fprintf(o.log,
                     "calibrate: %s batch %d: early-exit draft of %d steps stopping after 1: %.3f "
                     "ms (median)\n",
                     label.c_str(), batch, steps, median(skip_ns) / 1e6);
      }
    }
  }
}

// ---- prefill in situ ---------------------------------------------------------------------------

// The runtime's prefill of one prompt per length (docs/calibration.md "Prefill"): one engine sized
// for the longest (one slot; the KV capacity as the real backend sizes it), each pass re-prefills
// slot 0 from position 0. Two untimed passes per length (cuBLAS heuristics, lazy module loading),
// then timed ones, each bracketed by an event pair on the compute stream: the GPU time of the
// eager launch sequence, the prompt upload included. The host enqueues ~10 kernels per layer
// (~4 us each) against >= 1 ms of GPU work per layer at 1024 tokens, so the GPU is the bound.
void prefill_passes(const CalibrateOptions& o, const std::string& name,
                    std::vector<CalibrationSample>& out) {
  const ModelSpec& spec = model_preset(name);
  const std::string label = calibration_model_label(name, o.tp);
  const LlamaConfig full = llama_config_from_spec(spec);
  const LlamaConfig config = o.tp > 1 ? tp_shard_config(full, 0, o.tp) : full;
  const std::vector<int> lengths = !o.prefill_tokens.empty() ? o.prefill_tokens
                                   : o.quick                 ? std::vector<int>{1024, 4096}
                                             : std::vector<int>{1024, 2048, 4096, 8192};
  const int longest = *std::max_element(lengths.begin(), lengths.end());
  constexpr int kWarm = 2;
  const int reps = o.quick ? 3 : 5;
  EngineOptions eo;
  eo.max_slots = 1;
  eo.capacity_tokens = ((longest + 15) / 16 * 16 + 63) / 64 * 64;
  eo.tp.size = o.tp;  // a shard measured alone: no communicator, no collectives
  std::fprintf(o.log, "calibrate: %s prefill, prompts of %d .. %d tokens\n", label.c_str(),
               *std::min_element(lengths.begin(), lengths.end()), longest);
  auto engine = Engine::create_synthetic(config, 1, eo);
  const cudaStream_t stream = engine->compute_stream();
  const std::vector<int32_t> slots = {0};
  Events ev(size_t(2 * reps));
  for (const int len : lengths) {
    std::vector<std::vector<int32_t>> prompts(1, std::vector<int32_t>(size_t(len)));
    for (int t = 0; t < len; ++t) prompts[0][size_t(t)] = (t * 31 + 7) % 32000;
    for (int r = -kWarm; r < reps; ++r) {
      if (r >= 0) TS_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * r)], stream));
      engine->enqueue_prefill(slots, prompts);
      if (r >= 0) TS_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * r + 1)], stream));
      TS_CUDA_CHECK(cudaStreamSynchronize(stream));  // one pass at a time, nothing queued behind
    }
    std::vector<double> ns;
    for (int r = 0; r < reps; ++r) {
      ns.push_back(ev.elapsed_ns(size_t(2 * r), size_t(2 * r + 1)));
      CalibrationSample x = sample("prefill", ns.back());
      x.name = "prefill";
      x.model = label;
      x.mode = "eager";
      x.batch = 1;
      x.ctx_tokens = len;
      out.push_back(x);
    }
    std::fprintf(o.log, "calibrate: %s prefill of %d tokens: %.3f ms (median of %d)\n",
                 label.c_str(), len, median(ns) / 1e6, reps);
  }
}

// The real backend's host operations with no injected cost (only their real work), run-ahead,
// CUDA graphs, 8 concurrent requests: per step and op, one sample.
void host_ops(const std::string& model_name, bool quick, std::vector<CalibrationSample>& out) {
  const ModelSpec& spec = model_preset(model_name);
  WorkloadSpec w;
  w.input_len = {128, 128};
  w.output_len = {quick ? 33 : 129, quick ? 33 : 129};
  w.num_requests = 16;
  w.max_concurrency = 8;
  const std::vector<RequestSpec> requests = generate_requests(w);
  EngineOptions eo;
  eo.max_slots = w.max_concurrency;
  eo.capacity_tokens = (128 + w.output_len.hi + 63) / 64 * 64;
  auto engine = Engine::create_synthetic(llama_config_from_spec(spec), 1, eo);
  HostCostModel host(HostCostSpec{}, 1);
  RealOptions ro;
  ro.prepare_mode = GraphMode::kCudaGraph;
  ro.prepare_max_batch = eo.max_slots;
  RealBackend backend(*engine, spec, host, requests, ro);
  PolicySpec policy;
  policy.host_schedule = HostSchedule::kRunahead;
  policy.graph_mode = GraphMode::kCudaGraph;
  RunRecord record;
  DecodeLoop loop(policy, w, requests, &record);
  HostProgram* ranks[] = {&loop};
  backend.run(ranks, record);
  for (const StepSample& st : record.steps) {
    for (int op = 0; op < kHostOpCount; ++op) {
      if (st.host_ns[size_t(op)] <= 0) continue;
      CalibrationSample x = sample("host_op", double(st.host_ns[size_t(op)]));
      x.name = host_op_name(HostOp(op));
      x.model = model_name;
      x.batch = st.batch;
      out.push_back(x);
    }
    for (const auto& [name, ns] : {std::pair{"launch_calls", st.host_launch_ns},
                                   std::pair{"event_waits", st.host_wait_ns}}) {
      CalibrationSample x = sample("host_op", double(ns));
      x.name = name;
      x.model = model_name;
      x.batch = st.batch;
      out.push_back(x);
    }
  }
}

}  // namespace

CalibrationRun run_calibration(const CalibrateOptions& o) {
  if (o.fusion.any() && (o.prefill_only || o.breaks_only))
    throw Error(
        "calibrate: a fused session measures the decode grid and the speculative graphs "
        "(prefill and collective breaks run unfused): no prefill_only or breaks_only");
  if (const std::string e = fused_calibration_error(o.fusion, o.models, o.tp); !e.empty())
    throw Error("calibrate: " + e);
  std::string why;
  if (!real_backend_available(&why)) throw Error("calibrate needs a CUDA GPU: " + why);
  if (o.tp < 1 || o.tp > 64)
    throw Error("calibrate: --tp " + std::to_string(o.tp) + " outside [1, 64]");
  if (o.spec_only && !o.spec)
    throw Error("calibrate: --spec-only measures the speculative graphs; drop --no-spec");
  if (o.prefill_only && !o.prefill)
    throw Error("calibrate: --prefill-only measures the prefill passes; drop --no-prefill");
  for (const int len : o.prefill_tokens) {
    if (len < 16 || len > 131072)
      throw Error("calibrate: prefill prompt of " + std::to_string(len) +
                  " tokens outside [16, 131072]");
  }
  for (const std::string& m : o.models) {
    // Throws for a model the runtime cannot run, or one whose heads/experts do not split tp ways.
    const LlamaConfig full = llama_config_from_spec(model_preset(m));
    if (o.tp > 1) tp_shard_config(full, 0, o.tp);
  }
  for (const int ctx : o.contexts) {
    if (ctx < 16 || ctx > 131072)
      throw Error("calibrate: context " + std::to_string(ctx) + " outside [16, 131072] tokens");
  }
  for (size_t i = 0; i < o.batches.size(); ++i) {
    if (o.batches[i] < 1 || o.batches[i] > 64)
      throw Error("calibrate: batch " + std::to_string(o.batches[i]) + " outside [1, 64]");
    if (i > 0 && o.batches[i] <= o.batches[i - 1])
      throw Error("calibrate: --batches must be increasing (the largest sizes the engine)");
  }
  for (size_t i = 0; i < o.spec_batches.size(); ++i) {
    if (o.spec_batches[i] < 1 || o.spec_batches[i] > 64)
      throw Error("calibrate: speculative batch " + std::to_string(o.spec_batches[i]) +
                  " outside [1, 64]");
    if (i > 0 && o.spec_batches[i] <= o.spec_batches[i - 1])
      throw Error("calibrate: --spec-batches must be increasing");
  }
  if (o.spec_partitions < 1 || o.spec_partitions > 8)
    throw Error("calibrate: --spec-partitions " + std::to_string(o.spec_partitions) +
                " outside [1, 8]");
  if (o.spec_capacity_tokens < 0 || o.spec_capacity_tokens > 262144)
    throw Error("calibrate: --spec-capacity-tokens " + std::to_string(o.spec_capacity_tokens) +
                " outside [0, 262144]");
  if (o.partition_only && o.breaks_only)
    throw Error(
        "calibrate: --partition-only and --breaks-only each measure only their own samples");
  if (!o.spec && o.spec_capacity_tokens > 0)
    throw Error(
        "calibrate: --spec-capacity-tokens sizes the speculative graphs' engine; drop --no-spec");
  if (!o.spec && !o.spec_batches.empty())
    throw Error("calibrate: --spec-batches sets the speculative graphs' batches; drop --no-spec");
  if (o.in_situ) {
    if (!o.breaks_only || o.tp < 2)
      throw Error(
          "calibrate: --in-situ measures a TP shard's steps with its collectives: give "
          "--breaks-only --tp N under mpirun -np N");
    // Collective: every rank creates the world communicator here, which also selects this rank's
    // GPU before anything below allocates; throws unless the job has exactly tp ranks.
    (void)tp_world(o.tp);
  }
  // The GPU state the runner's timed engines meet too (runtime/engine.h): without it the first
  // grid engine of a process ran its plain-graph steps in the other one.
  if (!o.models.empty()) settle_gpu_state(llama_config_from_spec(model_preset(o.models.front())));
  CalibrationRun run;
  cudaDeviceProp prop{};
  TS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  run.gpu_name = prop.name;
  int driver = 0;
  TS_CUDA_CHECK(cudaDriverGetVersion(&driver));
  run.driver =
      "CUDA driver API " + std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10);

  const int reps = o.quick ? 10 : 50;
  std::vector<CalibrationSample>& out = run.samples;
  if (o.breaks_only) {
    if (o.tp < 2) throw Error("calibrate: --breaks-only measures a TP shard's steps; give --tp N");
    InSitu in_situ(o, 0, out);
    for (const std::string& m : o.models) in_situ.model(m);
    return run;
  }
  if (o.spec_only || o.prefill_only || o.partition_only) {
    if (o.spec_only) {
      for (const std::string& m : o.models) spec_graphs(o, m, out);
    }
    if (o.prefill_only) {
      for (const std::string& m : o.models) prefill_passes(o, m, out);
    }
    if (o.partition_only) {
      for (const std::string& m : o.models) attention_partition(o, m, out);
    }
    return run;
  }
  // A fused session (CalibrateOptions::fusion) stores its label's decode grid and speculative
  // graphs only: the graph node gap the grid's kernel samples subtract is measured, not stored.
  const bool fused = o.fusion.any();
  std::vector<CalibrationSample> scratch;
  std::vector<CalibrationSample>& micro = fused ? scratch : out;
  std::fprintf(o.log, "calibrate: launch, gap, event and copy microbenchmarks%s\n",
               fused ? " (the graph node gap only, not stored)" : "");
  if (!fused) eager_launches(reps, out);
  graph_costs(reps, micro);
  if (!fused) {
    event_round_trips(reps * 4, out);
    d2h_copies(reps, out);
    stream_reads(o.quick, o.quick ? 2 : 5, out);
  }
  std::vector<double> gaps;
  for (const CalibrationSample& s : micro) {
    if (s.kind == "node_gap" && s.mode == "graph") gaps.push_back(s.value_ns);
  }
  const double gap_ns = median(gaps);
  std::fprintf(o.log, "calibrate: graph node gap %.0f ns (empty kernels)\n", gap_ns);

  InSitu in_situ(o, gap_ns, out);
  for (const std::string& m : o.models) in_situ.model(m);
  if (o.spec) {
    for (const std::string& m : o.models) spec_graphs(o, m, out);
  }
  if (fused) return run;
  if (o.prefill) {
    for (const std::string& m : o.models) prefill_passes(o, m, out);
  }
  std::fprintf(o.log, "calibrate: real backend host operations\n");
  host_ops(o.models.front(), o.quick, out);
  return run;
}

}  // namespace twinstep::runtime
