// Decode benchmark of the real runtime (Llama-3-8B shape, synthetic bf16 weights):
//   1. streaming-read and device-to-device copy bandwidth of this GPU (the floor's denominator);
//   2. batch-1 decode, 256 tokens, prompts 128 and 8192: run-ahead with graphs (+PDL), lockstep,
//      eager — TPOT beside the floor (bytes per step / streaming-read bandwidth, same run) and
//      GPU busy / host-bound idle / launch-bound idle from the step samples, side by side;
//   3. concurrency sweep 1..64: output throughput, TPOT, achieved bandwidth;
//   4. profiled (a GPU timestamp node between kernels) vs unprofiled step time, and a per-kernel
//      breakdown and a real timeline of a few steps.
// Writes OUT/decode.json, decode_sweep.json, decode_profile.json, decode_trace.json
// (results/<gpu>/ format: command, commit, gpu, date, rows with unit keys).
//   twinstep_decode_bench --out DIR [--commit SHA] [--quick] [--probe-NAME]
// (--probe-NAME: sizing, carveout, engines, thermal, graphs, alloc, streams, create, cycle or
// settle, each described at its function below, instead of the benchmark; scripts/gpu_probe.sh
// with TWINSTEP_PROBE=NAME).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/tuning.h"
#include "policies/decode_loop.h"
#include "runtime/checkpoint.h"
#include "runtime/cublas_loader.h"
#include "runtime/device_ops.h"
#include "runtime/engine.h"
#include "runtime/real_backend.h"

using namespace twinstep;
using runtime::Engine;
using runtime::EngineOptions;

namespace {

struct Bandwidth {
  double read_tbps = 0;
  double copy_tbps = 0;
};

Bandwidth measure_bandwidth() {
  const size_t bytes = size_t{4} << 30;
  void *a = nullptr, *b = nullptr;
  unsigned long long* sink = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&a, bytes));
  TS_CUDA_CHECK(cudaMalloc(&b, bytes));
  TS_CUDA_CHECK(cudaMalloc(&sink, 8));
  TS_CUDA_CHECK(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  TS_CUDA_CHECK(cudaEventCreate(&e0));
  TS_CUDA_CHECK(cudaEventCreate(&e1));
  int sms = 0;
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Bandwidth bw;
  for (int blocks_per_sm : {4, 8, 16}) {
    for (int rep = 0; rep < 5; ++rep) {
      TS_CUDA_CHECK(cudaEventRecord(e0));
      runtime::launch_stream_read(a, bytes / 16, sink, sms * blocks_per_sm, nullptr);
      TS_CUDA_CHECK(cudaEventRecord(e1));
      TS_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      TS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      bw.read_tbps = std::max(bw.read_tbps, double(bytes) / (ms * 1e-3) / 1e12);
    }
  }
  for (int rep = 0; rep < 5; ++rep) {
    TS_CUDA_CHECK(cudaEventRecord(e0));
    TS_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    TS_CUDA_CHECK(cudaEventRecord(e1));
    TS_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    bw.copy_tbps = std::max(bw.copy_tbps, 2.0 * double(bytes) / (ms * 1e-3) / 1e12);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  cudaFree(sink);
  return bw;
}

struct Summary {
  double tpot_ms = 0;  // mean over requests of (E2E - TTFT) / (out - 1)
  double ttft_ms = 0;
  double step_ms = 0;  // mean GPU interval of steady decode steps
  double busy_pct = 0;
  double idle_host_us = 0;  // per steady step
  double idle_launch_us = 0;
  double host_wait_us = 0;
  double host_loop_us = 0;  // host work + launch per step
  double bytes_per_step = 0;
  double throughput_tok_s = 0;
  int steady_steps = 0;
};

Summary summarize(const RunRecord& r) {
  Summary s;
  double tpot = 0, ttft = 0;
  int n = 0;
  int64_t first_start = INT64_MAX, last_end = 0, tokens = 0;
  for (const RequestSample& q : r.requests) {
    first_start = std::min(first_start, q.start_ns);
    last_end = std::max(last_end, q.end_ns);
    tokens += q.output_len;
    if (q.output_len < 2 || q.end_ns < 0) continue;
    tpot += double(q.end_ns - q.first_token_ns) / (q.output_len - 1) / 1e6;
    ttft += double(q.first_token_ns - q.start_ns) / 1e6;
    ++n;
  }
  s.tpot_ms = n ? tpot / n : 0;
  s.ttft_ms = n ? ttft / n : 0;
  s.throughput_tok_s = double(tokens) / (double(last_end - first_start) / 1e9);
  // Steady decode: decode-only steps, skipping the first 8 and the last 2 of the run.
  std::vector<const StepSample*> steady;
  for (const StepSample& st : r.steps)
    if (st.batch > 0 && st.prefills == 0) steady.push_back(&st);
  const size_t lo = std::min<size_t>(8, steady.size()),
               hi = steady.size() > 10 ? steady.size() - 2 : steady.size();
  double dur = 0, busy = 0, ih = 0, il = 0, wait = 0, loop = 0, bytes = 0;
  for (size_t i = lo; i < hi; ++i) {
    const StepSample& st = *steady[i];
    dur += double(st.dur_ns);
    busy += double(st.gpu_busy_ns);
    ih += double(st.idle_host_ns);
    il += double(st.idle_launch_ns);
    wait += double(st.host_wait_ns);
    double h = double(st.host_launch_ns);
    for (int64_t x : st.host_ns) h += double(x);
    loop += h;
    bytes += double(st.bytes_read);
  }
  s.steady_steps = int(hi - lo);
  if (s.steady_steps > 0) {
    const double k = s.steady_steps;
    s.step_ms = dur / k / 1e6;
    s.busy_pct = 100.0 * busy / dur;
    s.idle_host_us = ih / k / 1e3;
    s.idle_launch_us = il / k / 1e3;
    s.host_wait_us = wait / k / 1e3;
    s.host_loop_us = loop / k / 1e3;
    s.bytes_per_step = bytes / k;
  }
  return s;
}

RunRecord run_once(Engine& engine, const ModelSpec& model, const WorkloadSpec& w,
                   const PolicySpec& p, const HostCostSpec& hc, RealOptions ro,
                   std::vector<int32_t>* tokens0 = nullptr) {
  const std::vector<RequestSpec> requests = generate_requests(w);
  RunRecord record;
  DecodeLoop loop(p, w, requests, &record);
  const HostCostModel host(hc, 1);
  ro.prepare_mode = p.graph_mode;
  ro.prepare_max_batch = w.max_concurrency;
  RealBackend backend(engine, model, host, requests, ro);
  HostProgram* ranks[] = {&loop};
  backend.run(ranks, record);
  if (tokens0) *tokens0 = backend.output_tokens(0);
  return record;
}

std::string fmt(double v, int prec = 4) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", prec, v);
  return buf;
}

struct Json {
  std::vector<std::string> rows;
  void row(const std::vector<std::pair<std::string, std::string>>& kv) {
    std::string r = "    {";
    for (size_t i = 0; i < kv.size(); ++i)
      r += (i ? ", " : "") + ("\"" + kv[i].first + "\": " + kv[i].second);
    rows.push_back(r + "}");
  }
  void write(const std::string& path, const std::string& header) const {
    std::ofstream out(path);
    out << "{\n" << header << "  \"rows\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) out << rows[i] << (i + 1 < rows.size() ? ",\n" : "\n");
    out << "  ]\n}\n";
  }
};

std::string q(const std::string& s) { return "\"" + s + "\""; }

}  // namespace

// --probe-sizing: batch-1 graph and PDL decode at context 128 on engines sized as the runner
// sizes them (1 slot, KV capacity 384 for 128 + 256 tokens) and as `twinstep calibrate` sizes its
// grid engine (64 slots, capacity 512), each cold (prefill, graph capture, timed launches) and
// in the runner's order (capture, Engine::warm_up, prefill, timed launches); per engine the modes
// in the order graph, PDL, graph again; each launch timed alone between two events (calibrate's
// method) and 64 launches back to back (the runner's rhythm). Why: calibrate's plain-graph step at
// batch 1, context 138 measured 4487 us against the runner's 4389 us in one call (586882a) while
// PDL agreed within 0.5 %. Two passes in opposite order expose drift. Writes
// OUT/decode_sizing_probe.json.
void probe_sizing(const std::string& out_dir, const std::string& header) {
  const ModelSpec& model = model_preset("llama-3-8b");
  const LlamaConfig config = llama_config_from_spec(model);
  struct Sizing {
    const char* label;
    int slots, capacity;
    bool warm;
  };
  const std::vector<Sizing> sizings = {{"runner_1x384", 1, 384, false},
                                       {"calibrate_64x512", 64, 512, false},
                                       {"runner_1x384_warm", 1, 384, true},
                                       {"calibrate_64x512_warm", 64, 512, true}};
  Json json;
  std::printf(
      "\nsizing probe, batch 1, context 128 (+ launches), median of 16 event-timed "
      "launches and mean of 64 back-to-back launches, us\n");
  std::printf("%-22s %5s %-12s %12s %12s\n", "sizing", "pass", "mode", "timed_alone",
              "back_to_back");
  cudaEvent_t e0, e1;
  TS_CUDA_CHECK(cudaEventCreate(&e0));
  TS_CUDA_CHECK(cudaEventCreate(&e1));
  auto elapsed_us = [&] {
    TS_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return double(ms) * 1e3;
  };
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < sizings.size(); ++i) {
      const Sizing& z = sizings[pass == 0 ? i : sizings.size() - 1 - i];
      EngineOptions eo;
      eo.max_slots = z.slots;
      eo.capacity_tokens = z.capacity;
      auto engine = Engine::create_synthetic(config, 1, eo);
      // Warm: the runner's order (graphs captured, then the warm-up, then the prefill); cold:
      // the prefill, then the capture, then the timed launches.
      auto capture = [&] {
        for (const GraphMode m : {GraphMode::kCudaGraph, GraphMode::kCudaGraphPdl})
          engine->prepare(m, z.slots);
      };
      if (z.warm) {
        capture();
        engine->warm_up(GraphMode::kCudaGraph, runtime::kDecodeWarmupLaunches);
      }
      std::vector<int32_t> slots(size_t(z.slots));
      std::vector<std::vector<int32_t>> prompts(size_t(z.slots), std::vector<int32_t>(128));
      for (int s = 0; s < z.slots; ++s) {
        slots[size_t(s)] = s;
        for (int t = 0; t < 128; ++t) prompts[size_t(s)][size_t(t)] = (s * 7919 + t * 31) % 32000;
      }
      engine->enqueue_prefill(slots, prompts);
      if (!z.warm) capture();
      TS_CUDA_CHECK(cudaStreamSynchronize(engine->compute_stream()));
      const int32_t slot0 = 0;
      const std::span<const int32_t> one(&slot0, 1);
      cudaStream_t st = engine->compute_stream();
      int order = 0;
      for (const GraphMode m :
           {GraphMode::kCudaGraph, GraphMode::kCudaGraphPdl, GraphMode::kCudaGraph}) {
        for (int w = 0; w < 2; ++w) engine->enqueue_decode(one, m);
        std::vector<double> alone;
        for (int r = 0; r < 16; ++r) {
          TS_CUDA_CHECK(cudaEventRecord(e0, st));
          engine->enqueue_decode(one, m);
          TS_CUDA_CHECK(cudaEventRecord(e1, st));
          alone.push_back(elapsed_us());
        }
        std::sort(alone.begin(), alone.end());
        const double median_us = (alone[7] + alone[8]) / 2;
        TS_CUDA_CHECK(cudaEventRecord(e0, st));
        for (int r = 0; r < 64; ++r) engine->enqueue_decode(one, m);
        TS_CUDA_CHECK(cudaEventRecord(e1, st));
        const double mean_us = elapsed_us() / 64;
        const std::string label = std::string(m == GraphMode::kCudaGraph ? "graph" : "pdl") +
                                  (order == 2 ? "_again" : "");
        std::printf("%-22s %5d %-12s %12.1f %12.1f\n", z.label, pass, label.c_str(), median_us,
                    mean_us);
        json.row({{"sizing", q(z.label)},
                  {"max_slots", std::to_string(z.slots)},
                  {"capacity_tokens", std::to_string(z.capacity)},
                  {"warm_up_launches", std::to_string(z.warm ? runtime::kDecodeWarmupLaunches : 0)},
                  {"pass", std::to_string(pass)},
                  {"order", std::to_string(order)},
                  {"graph_mode", q(graph_mode_name(m))},
                  {"batch", "1"},
                  {"ctx_tokens_start", "128"},
                  {"step_us_timed_alone_median", fmt(median_us, 6)},
                  {"step_us_back_to_back_mean", fmt(mean_us, 6)}});
        ++order;
      }
      TS_CUDA_CHECK(cudaStreamSynchronize(engine->compute_stream()));
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  json.write(out_dir + "/decode_sizing_probe.json", header);
}

// --probe-carveout: the same batch-1 decode at prompt 128 with the kernels' shared-memory
// carveout left to the driver (-1) and pinned to the maximum (100), in the order -1, 100, 100, -1,
// a fresh engine each (runner sizing, the runner's warm-up): the four runner configurations of
// decode.json (one 256-token run each) and the probe's event-timed graph, PDL, graph-again
// launches. Why: the plain-graph step at prompt 128 is bimodal across engines and schedules
// (run-ahead 4421 us, lockstep 4531 us in one validation call, 321e4f2; calibrate 4519 us) while
// PDL and context 8192 are not; the driver's per-launch carveout choice depends on the SMs'
// current L1 / shared split, a state that outlives a launch. Writes
// OUT/decode_carveout_probe.json.
void probe_carveout(const std::string& out_dir, const std::string& header) {
  const ModelSpec& model = model_preset("llama-3-8b");
  const LlamaConfig config = llama_config_from_spec(model);
  HostCostSpec hc;  // decode.json's fixed host loop
  hc.ops[size_t(HostOp::kSchedule)] = {DistKind::kFixed, 50'000, 0, 0, 0};
  hc.ops[size_t(HostOp::kPrepareDecode)] = {DistKind::kFixed, 150'000, 0, 0, 0};
  hc.ops[size_t(HostOp::kProcessOutputs)] = {DistKind::kFixed, 100'000, 0, 0, 0};
  struct Config {
    const char* label;
    HostSchedule schedule;
    GraphMode mode;
  };
  const std::vector<Config> configs = {
      {"runahead_graph", HostSchedule::kRunahead, GraphMode::kCudaGraph},
      {"lockstep_graph", HostSchedule::kLockstep, GraphMode::kCudaGraph},
      {"runahead_graph_pdl", HostSchedule::kRunahead, GraphMode::kCudaGraphPdl},
      {"runahead_eager", HostSchedule::kRunahead, GraphMode::kEager},
      {"runahead_graph_again", HostSchedule::kRunahead, GraphMode::kCudaGraph},
      {"lockstep_graph_again", HostSchedule::kLockstep, GraphMode::kCudaGraph},
  };
  Json json;
  std::printf("\ncarveout probe, batch 1, prompt 128, 256 decode tokens: GPU step (us), busy %%\n");
  cudaEvent_t e0, e1;
  TS_CUDA_CHECK(cudaEventCreate(&e0));
  TS_CUDA_CHECK(cudaEventCreate(&e1));
  const int out_tokens = 257;
  const int settings[] = {-1, 100, 100, -1};
  for (int pass = 0; pass < 4; ++pass) {
    const int carveout = settings[pass];
    kernels::detail::kernel_tuning().carveout_percent = carveout;
    EngineOptions eo;
    eo.max_slots = 1;
    eo.capacity_tokens = (128 + 16 + out_tokens + 63) / 64 * 64;
    auto engine = Engine::create_synthetic(config, 1, eo);
    for (const Config& c : configs) {
      WorkloadSpec w;
      w.input_len = {128, 128};
      w.output_len = {out_tokens, out_tokens};
      PolicySpec p;
      p.host_schedule = c.schedule;
      p.graph_mode = c.mode;
      RealOptions ro;
      ro.prompt_seed = 1;
      ro.warmup_launches = runtime::kDecodeWarmupLaunches;  // as make_real_backend
      const Summary s = summarize(run_once(*engine, model, w, p, hc, ro));
      const double busy_step_us = s.step_ms * 1e3 * s.busy_pct / 100;
      std::printf(
          "carveout %4d pass %d %-22s tpot %8.3f ms  step %8.1f us  busy %6.2f%%  "
          "busy/step %8.1f us\n",
          carveout, pass, c.label, s.tpot_ms, s.step_ms * 1e3, s.busy_pct, busy_step_us);
      json.row({{"carveout_percent", std::to_string(carveout)},
                {"pass", std::to_string(pass)},
                {"what", q("runner")},
                {"config", q(c.label)},
                {"host_schedule", q(host_schedule_name(c.schedule))},
                {"graph_mode", q(graph_mode_name(c.mode))},
                {"tpot_ms", fmt(s.tpot_ms, 6)},
                {"step_us", fmt(s.step_ms * 1e3, 6)},
                {"gpu_busy_pct", fmt(s.busy_pct, 5)},
                {"busy_us_per_step", fmt(busy_step_us, 6)}});
    }
    // Event-timed launches on slot 0 after the runs (calibrate's method).
    const int32_t slot0 = 0;
    const std::span<const int32_t> one(&slot0, 1);
    cudaStream_t st = engine->compute_stream();
    int order = 0;
    for (const GraphMode m :
         {GraphMode::kCudaGraph, GraphMode::kCudaGraphPdl, GraphMode::kCudaGraph}) {
      for (int w = 0; w < 2; ++w) engine->enqueue_decode(one, m);
      std::vector<double> alone;
      for (int r = 0; r < 16; ++r) {
        TS_CUDA_CHECK(cudaEventRecord(e0, st));
        engine->enqueue_decode(one, m);
        TS_CUDA_CHECK(cudaEventRecord(e1, st));
        TS_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        TS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        alone.push_back(double(ms) * 1e3);
      }
      std::sort(alone.begin(), alone.end());
      const double median_us = (alone[7] + alone[8]) / 2;
      const std::string label =
          std::string(m == GraphMode::kCudaGraph ? "graph" : "pdl") + (order == 2 ? "_again" : "");
      std::printf("carveout %4d pass %d timed alone %-12s %8.1f us\n", carveout, pass,
                  label.c_str(), median_us);
      json.row({{"carveout_percent", std::to_string(carveout)},
                {"pass", std::to_string(pass)},
                {"what", q("timed_alone")},
                {"config", q(label)},
                {"graph_mode", q(graph_mode_name(m))},
                {"step_us", fmt(median_us, 6)}});
      ++order;
    }
    TS_CUDA_CHECK(cudaStreamSynchronize(st));
  }
  kernels::detail::kernel_tuning().carveout_percent = -1;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  json.write(out_dir + "/decode_carveout_probe.json", header);
}

// One probe window on slot 0 of `engine`: re-prefill `prompt` (so the context stays short), one
// untimed plain-graph launch, then `launches` plain-graph and `launches` PDL launches back to
// back, each set between two of `ev`'s events. Returns the mean step of each, us.
struct GraphPdlWindow {
  double graph_us = 0, pdl_us = 0;
};
struct WindowEvents {  // the three events of a window, owned
  cudaEvent_t ev[3] = {};
  WindowEvents() {
    for (cudaEvent_t& e : ev) TS_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~WindowEvents() {
    for (cudaEvent_t& e : ev) cudaEventDestroy(e);
  }
  WindowEvents(const WindowEvents&) = delete;
  WindowEvents& operator=(const WindowEvents&) = delete;
};
GraphPdlWindow time_graph_pdl_window(Engine& engine, const std::vector<int32_t>& prompt,
                                     int launches, WindowEvents& events) {
  cudaEvent_t(&ev)[3] = events.ev;
  const int32_t slot0 = 0;
  const std::span<const int32_t> one(&slot0, 1);
  const std::vector<std::vector<int32_t>> prompts = {prompt};
  cudaStream_t st = engine.compute_stream();
  engine.enqueue_prefill(one, prompts);
  engine.enqueue_decode(one, GraphMode::kCudaGraph);  // untimed: the first after a prefill
  TS_CUDA_CHECK(cudaEventRecord(ev[0], st));
  for (int i = 0; i < launches; ++i) engine.enqueue_decode(one, GraphMode::kCudaGraph);
  TS_CUDA_CHECK(cudaEventRecord(ev[1], st));
  for (int i = 0; i < launches; ++i) engine.enqueue_decode(one, GraphMode::kCudaGraphPdl);
  TS_CUDA_CHECK(cudaEventRecord(ev[2], st));
  TS_CUDA_CHECK(cudaEventSynchronize(ev[2]));
  float graph_ms = 0, pdl_ms = 0;
  TS_CUDA_CHECK(cudaEventElapsedTime(&graph_ms, ev[0], ev[1]));
  TS_CUDA_CHECK(cudaEventElapsedTime(&pdl_ms, ev[1], ev[2]));
  return {double(graph_ms) * 1e3 / launches, double(pdl_ms) * 1e3 / launches};
}

// Appends one window's row: `keys`, then the seconds since `t_start` and since the epoch (to set
// beside an nvidia-smi trace) and the two steps. Returns the seconds since `t_start`.
double add_window_row(Json& json, std::vector<std::pair<std::string, std::string>> keys,
                      std::chrono::system_clock::time_point t_start, const GraphPdlWindow& w) {
  const auto now = std::chrono::system_clock::now();
  const double t_s = std::chrono::duration<double>(now - t_start).count();
  keys.push_back({"t_s", fmt(t_s, 6)});
  keys.push_back(
      {"unix_s", fmt(std::chrono::duration<double>(now.time_since_epoch()).count(), 14)});
  keys.push_back({"graph_step_us", fmt(w.graph_us, 6)});
  keys.push_back({"pdl_step_us", fmt(w.pdl_us, 6)});
  json.row(keys);
  return t_s;
}

// One phase of a probe: `windows` windows on `engine`, a row each (`keys` + "window"); returns
// the mean steps.
GraphPdlWindow time_phase(Engine& engine, const std::vector<int32_t>& prompt, int windows,
                          int launches, WindowEvents& ev, Json& json,
                          const std::vector<std::pair<std::string, std::string>>& keys,
                          std::chrono::system_clock::time_point t_start) {
  GraphPdlWindow mean;
  for (int i = 0; i < windows; ++i) {
    const GraphPdlWindow w = time_graph_pdl_window(engine, prompt, launches, ev);
    mean.graph_us += w.graph_us / windows;
    mean.pdl_us += w.pdl_us / windows;
    auto row = keys;
    row.push_back({"window", std::to_string(i)});
    add_window_row(json, row, t_start, w);
  }
  return mean;
}

// A probe engine as the runner's: one slot, its graph and PDL graphs captured, warmed up.
// A probe engine's options: `slots` slots of 384 tokens (prompt 128 and the probe's launches).
EngineOptions probe_options(int slots) {
  EngineOptions eo;
  eo.max_slots = slots;
  eo.capacity_tokens = 384;
  return eo;
}

// The value of environment variable `name`, "unset" where it is unset or empty.
std::string env_or_unset(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : "unset";
}

std::unique_ptr<Engine> probe_engine(const LlamaConfig& config, int slots) {
  auto e = Engine::create_synthetic(config, 1, probe_options(slots));
  for (const GraphMode m : {GraphMode::kCudaGraph, GraphMode::kCudaGraphPdl}) e->prepare(m, slots);
  e->warm_up(GraphMode::kCudaGraph, runtime::kDecodeWarmupLaunches);
  return e;
}

std::vector<int32_t> probe_prompt() {
  std::vector<int32_t> prompt(128);
  for (int t = 0; t < 128; ++t) prompt[size_t(t)] = (t * 31 + 7) % 32000;
  return prompt;
}

// What every engine-A probe starts from: the Llama-3-8B config, engine A (1 slot, its graph and
// PDL graphs captured, warmed up: probe_engine), the prompt it re-prefills, the window events,
// the record's rows and the clock its rows' seconds count from.
struct ProbeBench {
  LlamaConfig config = llama_config_from_spec(model_preset("llama-3-8b"));
  std::unique_ptr<Engine> a = probe_engine(config, 1);
  std::vector<int32_t> prompt = probe_prompt();
  WindowEvents ev;
  Json json;
  std::chrono::system_clock::time_point t_start = std::chrono::system_clock::now();
};

// The end of one phase of a creation probe (its action has run): the device synchronised, engine
// A timed in `windows` windows (time_phase; rows keyed by `keys` and "phase"), and its means
// printed as a table row: phase, graph, PDL, graph - PDL (us).
void time_after_phase(ProbeBench& pb, int windows, int launches,
                      std::vector<std::pair<std::string, std::string>> keys,
                      const std::string& phase) {
  TS_CUDA_CHECK(cudaDeviceSynchronize());
  keys.push_back({"phase", q(phase)});
  const GraphPdlWindow m =
      time_phase(*pb.a, pb.prompt, windows, launches, pb.ev, pb.json, keys, pb.t_start);
  std::printf("%-24s %10.1f %10.1f %10.1f\n", phase.c_str(), m.graph_us, m.pdl_us,
              m.graph_us - m.pdl_us);
  std::fflush(stdout);
}

// --probe-engines: is the plain-graph step's bimodality (4360-4370 vs 4458-4477 us at prompt 128
// across engines of one process, decode_carveout_probe.json at 4f63cb0) a property of an engine
// (its allocations) or of the moment (the GPU's state)? Three engines alive at once (runner
// sizing), each round re-prefills slot 0 with 128 tokens and times 32 back-to-back plain-graph
// launches then 32 PDL launches on each engine in turn, for 40 rounds, with the wall-clock
// second of each row (to set beside an nvidia-smi trace). Writes OUT/decode_engines_probe.json.
void probe_engines(const std::string& out_dir, const std::string& header) {
  constexpr int rounds = 40;
  const LlamaConfig config = llama_config_from_spec(model_preset("llama-3-8b"));
  constexpr int kEngines = 3, kLaunches = 32;
  std::vector<std::unique_ptr<Engine>> engines;
  for (int e = 0; e < kEngines; ++e) engines.push_back(probe_engine(config, 1));
  const std::vector<int32_t> prompt = probe_prompt();
  WindowEvents ev;
  Json json;
  const auto t_start = std::chrono::system_clock::now();
  std::printf(
      "\nengines probe: %d engines alive, per round and engine the mean of %d "
      "back-to-back launches at context 128..%d, us\n%6s %8s %6s %10s %10s\n",
      kEngines, kLaunches, 128 + 2 * kLaunches + 2, "round", "t_s", "engine", "graph", "pdl");
  for (int r = 0; r < rounds; ++r) {
    for (int e = 0; e < kEngines; ++e) {
      const GraphPdlWindow w = time_graph_pdl_window(*engines[size_t(e)], prompt, kLaunches, ev);
      const double t_s = add_window_row(
          json, {{"round", std::to_string(r)}, {"engine", std::to_string(e)}}, t_start, w);
      std::printf("%6d %8.2f %6d %10.1f %10.1f\n", r, t_s, e, w.graph_us, w.pdl_us);
    }
  }
  std::fflush(stdout);
  json.write(out_dir + "/decode_engines_probe.json", header);
}

// --probe-thermal: the plain-graph step against the GPU's recent load. After an idle spell of
// 20, 8 and 3 s (the GPU cools), 40 windows (about 6 s, the GPU heats): slot 0 re-prefilled with
// 128 tokens, 16 back-to-back plain-graph launches, 16 PDL launches, each set timed by events;
// each row carries its wall-clock second, to set beside an nvidia-smi trace of the memory
// temperature (TWINSTEP_SMI_MS). Why: the plain-graph step at prompt 128 takes two values,
// 4330-4370 us (graph - PDL ~ 370 us) or 4415-4480 us (~ 450 us), the first only early in a
// process or after the GPU idled (decode_engines_probe.json, decode_carveout_probe.json).
// Writes OUT/decode_thermal_probe.json.
void probe_thermal(const std::string& out_dir, const std::string& header) {
  ProbeBench pb;
  constexpr int kWindows = 40, kLaunches = 16;
  std::printf(
      "\nthermal probe: per window %d plain-graph then %d PDL launches at context "
      "128..%d, us\n%6s %6s %8s %10s %10s %10s\n",
      kLaunches, kLaunches, 128 + 2 * kLaunches + 2, "idle_s", "window", "t_s", "graph", "pdl",
      "graph-pdl");
  for (const int idle_s : {20, 8, 3}) {
    TS_CUDA_CHECK(cudaStreamSynchronize(pb.a->compute_stream()));
    std::this_thread::sleep_for(std::chrono::seconds(idle_s));
    for (int i = 0; i < kWindows; ++i) {
      const GraphPdlWindow w = time_graph_pdl_window(*pb.a, pb.prompt, kLaunches, pb.ev);
      const double t_s = add_window_row(
          pb.json, {{"idle_s_before", std::to_string(idle_s)}, {"window", std::to_string(i)}},
          pb.t_start, w);
      std::printf("%6d %6d %8.2f %10.1f %10.1f %10.1f\n", idle_s, i, t_s, w.graph_us, w.pdl_us,
                  w.graph_us - w.pdl_us);
    }
  }
  std::fflush(stdout);
  pb.json.write(out_dir + "/decode_thermal_probe.json", header);
}

// --probe-graphs: the plain-graph step of one engine (1 slot, its graph and PDL graphs of bucket
// 1) while another engine's graphs are alive or not: A alone; B created (64 slots: the graph and
// PDL graphs of buckets 1..64, idle); B destroyed; C created (1 slot, 2 graphs); C destroyed.
// 10 windows per phase (slot 0 re-prefilled, 16 plain-graph then 16 PDL launches). Why: in
// earlier probes the step took ~370 us over PDL in processes holding few decode graphs and ~450
// us where several engines' graphs were alive (calibrate, decode_engines_probe.json). Writes
// OUT/decode_graphs_probe.json.
void probe_graphs(const std::string& out_dir, const std::string& header) {
  ProbeBench pb;
  constexpr int kWindows = 10, kLaunches = 16;
  std::unique_ptr<Engine> other;
  std::printf(
      "\ngraphs probe: engine A (1 slot) timed while other engines' graphs live, mean of %d "
      "windows, us\n%-24s %10s %10s %10s\n",
      kWindows, "phase", "graph", "pdl", "graph-pdl");
  const std::vector<std::pair<const char*, int>> phases = {
      {"A_alone", 0},        {"B_64_slots_alive", 64}, {"B_destroyed", 0},
      {"C_1_slot_alive", 1}, {"C_destroyed", 0},       {"A_alone_end", 0}};
  for (const auto& [phase, slots] : phases) {
    if (slots > 0)
      other = probe_engine(pb.config, slots);
    else
      other.reset();
    time_after_phase(pb, kWindows, kLaunches, {{"other_engine_slots", std::to_string(slots)}},
                     phase);
  }
  pb.json.write(out_dir + "/decode_graphs_probe.json", header);
}

// --probe-alloc: which part of an engine's creation switches the plain-graph step from ~370 to
// ~450 us over PDL (decode_graphs_probe_7facbdd.json: the third engine's creation)? Engine A (1
// slot) timed in 10 windows after each phase: the host-side pieces of an engine's creation
// (device flags, streams, a cuBLAS handle, pinned memory and events), 16 GiB allocated raw, then
// written, then freed, allocated and written again, freed; then engines created and destroyed
// one after another. (At 55a01a0 engine A's buffers under 2 MiB were carved from one block, an
// engine option since removed: the switch came at engine B's allocation all the same.)
// Writes OUT/decode_alloc_probe.json.
void probe_alloc(const std::string& out_dir, const std::string& header) {
  ProbeBench pb;
  constexpr int kWindows = 10, kLaunches = 16;
  constexpr size_t kBytes = size_t{16} << 30;
  std::printf(
      "\nalloc probe: engine A (1 slot) after each phase, mean of %d windows, us\n"
      "%-24s %10s %10s %10s\n",
      kWindows, "phase", "graph", "pdl", "graph-pdl");
  void* raw = nullptr;
  void* pinned = nullptr;
  std::unique_ptr<Engine> other;
  cudaStream_t streams[3] = {};
  std::vector<cudaEvent_t> events(64);
  cublasHandle_t blas = nullptr;
  std::vector<void*> small(40, nullptr);
  // What an engine's creation does besides its device allocations (Engine::Engine, allocate),
  // one piece at a time, each kept alive to the end.
  const std::vector<std::pair<const char*, std::function<void()>>> phases = {
      {"A_alone", [] {}},
      {"set_flags_spin",
       [] {
         if (cudaSetDeviceFlags(cudaDeviceScheduleSpin) != cudaSuccess) (void)cudaGetLastError();
       }},
      {"three_streams",
       [&] {
         for (cudaStream_t& x : streams)
           TS_CUDA_CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
       }},
      {"cublas_handle",
       [&] {
         TS_CUBLAS_CHECK(runtime::cublas_api().create(&blas));
         TS_CUBLAS_CHECK(runtime::cublas_api().set_stream(blas, streams[0]));
       }},
      {"pinned_64MiB_and_events",
       [&] {
         TS_CUDA_CHECK(cudaMallocHost(&pinned, size_t{64} << 20));
         for (cudaEvent_t& e : events)
           TS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
       }},
      {"malloc_16GiB", [&] { TS_CUDA_CHECK(cudaMalloc(&raw, kBytes)); }},
      {"memset_16GiB", [&] { TS_CUDA_CHECK(cudaMemset(raw, 1, kBytes)); }},
      {"free_16GiB", [&] { TS_CUDA_CHECK(cudaFree(raw)); }},
      {"malloc_memset_again",
       [&] {
         TS_CUDA_CHECK(cudaMalloc(&raw, kBytes));
         TS_CUDA_CHECK(cudaMemset(raw, 1, kBytes));
       }},
      {"free_again", [&] { TS_CUDA_CHECK(cudaFree(raw)); }},
      {"malloc_16GiB_synthetic_fill",  // the engine's weight initialisation on a raw buffer
       [&] {
         TS_CUDA_CHECK(cudaMalloc(&raw, kBytes));
         runtime::launch_init_synthetic(static_cast<uint16_t*>(raw), kBytes / 2, 7, 0, 0.02f,
                                        nullptr);
       }},
      {"free_synthetic", [&] { TS_CUDA_CHECK(cudaFree(raw)); }},
      {"small_mallocs_40x256KiB",  // an engine's small buffers, another owner's
       [&] {
         for (void*& x : small) TS_CUDA_CHECK(cudaMalloc(&x, size_t{256} << 10));
       }},
      {"engine_B_allocated",  // Engine::create_synthetic: allocations, synthetic weights
       [&] { other = Engine::create_synthetic(pb.config, 1, probe_options(1)); }},
      {"engine_B_graph_captured", [&] { other->prepare(GraphMode::kCudaGraph, 1); }},
      {"engine_B_pdl_captured", [&] { other->prepare(GraphMode::kCudaGraphPdl, 1); }},
      {"engine_B_warmed_up",
       [&] { other->warm_up(GraphMode::kCudaGraph, runtime::kDecodeWarmupLaunches); }},
      {"engine_B_destroyed", [&] { other.reset(); }},
      {"engine_C_created", [&] { other = probe_engine(pb.config, 1); }},
      {"engine_C_destroyed", [&] { other.reset(); }},
      {"engine_D_created", [&] { other = probe_engine(pb.config, 1); }},
      {"engine_D_destroyed", [&] { other.reset(); }},
  };
  for (const auto& [phase, action] : phases) {
    action();
    time_after_phase(pb, kWindows, kLaunches, {}, phase);
  }
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  for (void* x : small) cudaFree(x);
  if (blas) runtime::cublas_api().destroy(blas);
  for (cudaStream_t x : streams) cudaStreamDestroy(x);
  if (pinned) cudaFreeHost(pinned);
  pb.json.write(out_dir + "/decode_alloc_probe.json", header);
}

// --probe-streams: is the switch a count of created streams? Engine A (1 slot: its compute, copy
// and aux streams are the process's first three) timed in 10 windows, then after each of 12 more
// streams is created (each kept alive, none used). Why: in decode_alloc_probe_00206c0.json and
// decode_graphs_probe_7facbdd.json the step switched from ~370 to ~450 us over PDL when the
// process's seventh to ninth stream was created (the third engine's three; three raw streams
// before it did not), and stayed after that engine was destroyed; CUDA maps streams onto
// CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 unless set) in creation order. Run it with the
// variable unset, 32 and 1 (the record's "connections" field). Writes
// OUT/decode_streams_probe.json.
void probe_streams(const std::string& out_dir, const std::string& header) {
  ProbeBench pb;
  constexpr int kWindows = 10, kLaunches = 16, kStreams = 12;
  const std::string connections = env_or_unset("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf(
      "\nstreams probe (CUDA_DEVICE_MAX_CONNECTIONS %s): engine A (1 slot, streams 1-3) after "
      "each stream created, mean of %d windows, us\n%-10s %10s %10s %10s\n",
      connections.c_str(), kWindows, "streams", "graph", "pdl", "graph-pdl");
  std::vector<cudaStream_t> streams;
  for (int n = 3; n <= 3 + kStreams; ++n) {
    if (n > 3) {
      streams.emplace_back();
      TS_CUDA_CHECK(cudaStreamCreateWithFlags(&streams.back(), cudaStreamNonBlocking));
    }
    TS_CUDA_CHECK(cudaDeviceSynchronize());
    const GraphPdlWindow m = time_phase(
        *pb.a, pb.prompt, kWindows, kLaunches, pb.ev, pb.json,
        {{"connections", q(connections)}, {"streams_created", std::to_string(n)}}, pb.t_start);
    std::printf("%-10d %10.1f %10.1f %10.1f\n", n, m.graph_us, m.pdl_us, m.graph_us - m.pdl_us);
    std::fflush(stdout);
  }
  for (cudaStream_t x : streams) cudaStreamDestroy(x);
  pb.json.write(out_dir + "/decode_streams_probe.json", header);
}

// --probe-create: which engines' creation switches engine A (decode_alloc_probe_00206c0.json: the
// first engine created after any 16 GiB free; decode_graphs_probe_7facbdd.json: an engine created
// after none stayed fast)? Engine A (1 slot) timed in 10 windows after each phase: a 2-layer
// engine (the same shapes, 2.3 GB) created, destroyed, a second created and destroyed; then
// full engines created and destroyed. Run under CUDA_MODULE_LOADING unset (lazy) and EAGER (the
// record's "module_loading" field): were it code loaded at an engine's creation, eager loading
// would move it to the start. Writes OUT/decode_create_probe.json.
void probe_create(const std::string& out_dir, const std::string& header) {
  ProbeBench pb;
  LlamaConfig tiny = pb.config;
  tiny.layers = 2;
  constexpr int kWindows = 10, kLaunches = 16;
  const std::string loading = env_or_unset("CUDA_MODULE_LOADING");
  std::printf(
      "\ncreate probe (CUDA_MODULE_LOADING %s): engine A (1 slot) after each phase, mean of %d "
      "windows, us\n%-24s %10s %10s %10s\n",
      loading.c_str(), kWindows, "phase", "graph", "pdl", "graph-pdl");
  std::unique_ptr<Engine> other;
  const EngineOptions eo = probe_options(1);
  const std::vector<std::pair<const char*, std::function<void()>>> phases = {
      {"A_alone", [] {}},
      {"tiny_B_created", [&] { other = Engine::create_synthetic(tiny, 1, eo); }},
      {"tiny_B_destroyed", [&] { other.reset(); }},
      {"tiny_C_created", [&] { other = Engine::create_synthetic(tiny, 1, eo); }},
      {"tiny_C_destroyed", [&] { other.reset(); }},
      {"full_D_created", [&] { other = Engine::create_synthetic(pb.config, 1, eo); }},
      {"full_D_destroyed", [&] { other.reset(); }},
      {"full_E_created", [&] { other = Engine::create_synthetic(pb.config, 1, eo); }},
      {"full_E_destroyed", [&] { other.reset(); }},
  };
  for (const auto& [phase, action] : phases) {
    action();
    time_after_phase(pb, kWindows, kLaunches, {{"module_loading", q(loading)}}, phase);
  }
  pb.json.write(out_dir + "/decode_create_probe.json", header);
}

// --probe-cycle: which creation after which release switches engine A? (decode_create_probe: a
// 2-layer engine created beside A leaves it fast, the next one, created after the first was
// destroyed, switches it; decode_alloc_probe: raw 16 GiB malloc / free / malloc of the same size
// and 40 small mallocs after a free leave it fast, an engine created after a 16 GiB free
// switches it.) Engine A (1 slot) timed in 10 windows after each phase, in the order of
// TWINSTEP_PROBE_PHASES (comma-separated; default every phase below in its listed order). Each
// phase keeps what it creates to the end. Writes OUT/decode_cycle_probe.json (rows name the
// order).
void probe_cycle(const std::string& out_dir, const std::string& header) {
  ProbeBench pb;
  LlamaConfig tiny = pb.config;
  tiny.layers = 2;
  constexpr int kWindows = 10, kLaunches = 16;
  constexpr size_t kGiB = size_t{1} << 30;
  std::vector<void*> device, host;
  std::vector<cudaStream_t> streams;
  std::vector<cudaEvent_t> events;
  std::vector<cublasHandle_t> handles;
  std::vector<std::unique_ptr<Engine>> engines;
  const EngineOptions eo = probe_options(1);
  auto malloc_kept = [&](size_t bytes) {
    device.emplace_back();
    TS_CUDA_CHECK(cudaMalloc(&device.back(), bytes));
  };
  auto make_streams = [&] {
    for (int i = 0; i < 3; ++i) {
      streams.emplace_back();
      TS_CUDA_CHECK(cudaStreamCreateWithFlags(&streams.back(), cudaStreamNonBlocking));
    }
  };
  auto make_events = [&] {
    for (int i = 0; i < 64; ++i) {
      events.emplace_back();
      TS_CUDA_CHECK(cudaEventCreateWithFlags(&events.back(), cudaEventDisableTiming));
      TS_CUDA_CHECK(cudaEventRecord(events.back(), pb.a->compute_stream()));
    }
  };
  auto make_pinned = [&] {
    host.emplace_back();
    TS_CUDA_CHECK(cudaMallocHost(&host.back(), size_t{64} << 20));
  };
  auto make_cublas = [&] {  // as an engine sets its handle up
    handles.emplace_back();
    TS_CUBLAS_CHECK(runtime::cublas_api().create(&handles.back()));
    TS_CUBLAS_CHECK(runtime::cublas_api().set_stream(handles.back(), pb.a->compute_stream()));
    malloc_kept(size_t{32} << 20);
    TS_CUBLAS_CHECK(
        runtime::cublas_api().set_workspace(handles.back(), device.back(), size_t{32} << 20));
  };
  // 16 GiB kept, written by 290 init launches on `st` (an engine's tensors' count).
  auto init_many = [&](cudaStream_t st) {
    malloc_kept(16 * kGiB);
    const uint64_t n = 16 * kGiB / 2 / 290 / 128 * 128;
    for (uint64_t t = 0; t < 290; ++t)
      runtime::launch_init_synthetic(static_cast<uint16_t*>(device.back()) + t * n, n, 1, t, 0.02f,
                                     st);
    TS_CUDA_CHECK(cudaDeviceSynchronize());
  };
  auto drop_last = [](auto& v, auto destroy) {
    destroy(v.back());
    v.pop_back();
  };
  const std::map<std::string, std::function<void()>> actions = {
      {"stream_cycle",  // 3 streams created, destroyed, created again
       [&] {
         make_streams();
         for (int i = 0; i < 3; ++i) drop_last(streams, cudaStreamDestroy);
         make_streams();
       }},
      {"event_cycle",
       [&] {
         make_events();
         for (int i = 0; i < 64; ++i) drop_last(events, cudaEventDestroy);
         make_events();
       }},
      {"pinned_cycle",
       [&] {
         make_pinned();
         drop_last(host, cudaFreeHost);
         make_pinned();
       }},
      {"cublas_cycle",
       [&] {
         make_cublas();
         drop_last(handles, runtime::cublas_api().destroy);
         drop_last(device, cudaFree);
         make_cublas();
       }},
      {"small_malloc_cycle",  // 40 x 256 KiB
       [&] {
         for (int i = 0; i < 40; ++i) malloc_kept(size_t{256} << 10);
         for (int i = 0; i < 40; ++i) drop_last(device, cudaFree);
         for (int i = 0; i < 40; ++i) malloc_kept(size_t{256} << 10);
       }},
      {"big_free",  // 16 GiB allocated, written, freed
       [&] {
         malloc_kept(16 * kGiB);
         TS_CUDA_CHECK(cudaMemset(device.back(), 1, 16 * kGiB));
         TS_CUDA_CHECK(cudaDeviceSynchronize());
         drop_last(device, cudaFree);
       }},
      {"streams", make_streams},
      {"events", make_events},
      {"pinned", make_pinned},
      {"cublas", make_cublas},
      {"partial_reuse",  // 10 GiB and 4 GiB, kept
       [&] {
         malloc_kept(10 * kGiB);
         malloc_kept(4 * kGiB);
       }},
      {"larger_malloc", [&] { malloc_kept(17 * kGiB); }},
      {"set_flags",  // Engine::Engine's first call
       [] {
         if (cudaSetDeviceFlags(cudaDeviceScheduleSpin) != cudaSuccess) (void)cudaGetLastError();
       }},
      {"mem_get_info",
       [] {
         size_t free_bytes = 0, total_bytes = 0;
         TS_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
       }},
      {"memcpy_pageable",  // Engine::allocate's slot table: 16 bytes from pageable memory
       [&] {
         malloc_kept(256);
         const uint64_t bits[2] = {1, 2};
         TS_CUDA_CHECK(cudaMemcpy(device.back(), bits, sizeof bits, cudaMemcpyHostToDevice));
         TS_CUDA_CHECK(cudaMemset(device.back(), 0, 16));
       }},
      {"init_many",  // 16 GiB kept, written by 290 init launches on 3 new streams' last
       [&] {
         make_streams();
         init_many(streams.back());
       }},
      {"init_many_same_stream", [&] { init_many(streams.at(streams.size() - 1)); }},
      {"init_many_null", [&] { init_many(nullptr); }},
      {"init_one_null",  // 16 GiB kept, one launch on the legacy stream
       [&] {
         malloc_kept(16 * kGiB);
         runtime::launch_init_synthetic(static_cast<uint16_t*>(device.back()), 8 * kGiB, 1, 0,
                                        0.02f, nullptr);
         TS_CUDA_CHECK(cudaDeviceSynchronize());
       }},
      {"streams_used",  // 3 new streams, one 256-byte init launch on each
       [&] {
         make_streams();
         malloc_kept(256);
         for (size_t i = streams.size() - 3; i < streams.size(); ++i)
           runtime::launch_init_synthetic(static_cast<uint16_t*>(device.back()), 128, 1, 0, 0.02f,
                                          streams[i]);
         TS_CUDA_CHECK(cudaDeviceSynchronize());
       }},
      {"tiny_engine", [&] { engines.push_back(Engine::create_synthetic(tiny, 1, eo)); }},
      {"engine", [&] { engines.push_back(Engine::create_synthetic(pb.config, 1, eo)); }},
      {"destroy_engine", [&] { engines.pop_back(); }},
  };
  std::string order =
      "stream_cycle,event_cycle,pinned_cycle,cublas_cycle,small_malloc_cycle,"
      "big_free,streams,events,pinned,cublas,partial_reuse,larger_malloc,engine";
  if (const char* env = std::getenv("TWINSTEP_PROBE_PHASES"); env != nullptr && *env != '\0')
    order = env;
  std::vector<std::string> phases = {"A_alone"};
  for (size_t at = 0; at <= order.size();) {
    const size_t comma = std::min(order.find(',', at), order.size());
    phases.push_back(order.substr(at, comma - at));
    if (!actions.count(phases.back())) throw Error("--probe-cycle: unknown phase " + phases.back());
    at = comma + 1;
  }
  std::printf(
      "\ncycle probe (%s): engine A (1 slot) after each phase, mean of %d windows, us\n"
      "%-20s %10s %10s %10s\n",
      order.c_str(), kWindows, "phase", "graph", "pdl", "graph-pdl");
  for (const std::string& phase : phases) {
    if (phase != "A_alone") actions.at(phase)();
    time_after_phase(pb, kWindows, kLaunches, {{"order", q(order)}}, phase);
  }
  engines.clear();
  for (cublasHandle_t h : handles) runtime::cublas_api().destroy(h);
  for (void* p : device) cudaFree(p);
  for (void* p : host) cudaFreeHost(p);
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  for (cudaStream_t x : streams) cudaStreamDestroy(x);
  pb.json.write(out_dir + "/decode_cycle_probe.json", header);
}

// --probe-settle: does runtime::settle_gpu_state (two throwaway 2-layer engines) put the first
// engine of a process in the state the engines created after another one meet? Under
// TWINSTEP_PROBE_SETTLE=1 the process settles first (unset: it does not); engine A (1 slot) is
// timed in 10 windows, destroyed, and engine B created and timed the same way. Run once each
// way, each in a fresh process. Writes OUT/decode_settle_probe.json.
void probe_settle(const std::string& out_dir, const std::string& header) {
  const std::string settle = env_or_unset("TWINSTEP_PROBE_SETTLE");
  const auto t0 = std::chrono::steady_clock::now();
  if (settle == "1") runtime::settle_gpu_state(llama_config_from_spec(model_preset("llama-3-8b")));
  const double settle_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ProbeBench pb;
  constexpr int kWindows = 10, kLaunches = 16;
  std::printf(
      "\nsettle probe (settle %s, %.2f s): engines timed in turn, mean of %d windows, us\n"
      "%-24s %10s %10s %10s\n",
      settle.c_str(), settle_s, kWindows, "engine", "graph", "pdl", "graph-pdl");
  const std::vector<std::pair<std::string, std::string>> keys = {{"settle", q(settle)},
                                                                 {"settle_s", fmt(settle_s, 4)}};
  time_after_phase(pb, kWindows, kLaunches, keys, "A_first");
  pb.a.reset();
  pb.a = probe_engine(pb.config, 1);
  time_after_phase(pb, kWindows, kLaunches, keys, "B_after_A");
  pb.json.write(out_dir + "/decode_settle_probe.json", header);
}

// The CUDA variables a probe is run under, "NAME=VALUE " each where set (a probe record's command).
std::string cuda_env_prefix() {
  std::string out;
  for (const char* name : {"CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_MODULE_LOADING",
                           "TWINSTEP_PROBE_PHASES", "TWINSTEP_PROBE_SETTLE"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') out += std::string(name) + "=" + v + " ";
  }
  return out;
}

int main(int argc, char** argv) {
  // --probe-NAME runs that probe instead of the benchmark (scripts/gpu_probe.sh, TWINSTEP_PROBE).
  using Probe = void (*)(const std::string& out_dir, const std::string& header);
  const std::map<std::string, Probe> probes = {
      {"sizing", probe_sizing},   {"carveout", probe_carveout}, {"engines", probe_engines},
      {"thermal", probe_thermal}, {"graphs", probe_graphs},     {"alloc", probe_alloc},
      {"streams", probe_streams}, {"create", probe_create},     {"cycle", probe_cycle},
      {"settle", probe_settle}};
  std::string out_dir = ".", commit = "unknown", note, probe;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc)
      out_dir = argv[++i];
    else if (a == "--commit" && i + 1 < argc)
      commit = argv[++i];
    else if (a == "--quick")
      quick = true;
    else if (a.rfind("--probe-", 0) == 0)
      probe = a.substr(std::strlen("--probe-"));
    else if (a == "--note" && i + 1 < argc)
      note = argv[++i];
  }
  if (!probe.empty() && !probes.count(probe)) {
    std::fprintf(stderr,
                 "twinstep_decode_bench: unknown probe --probe-%s (sizing, carveout, engines, "
                 "thermal, graphs, alloc, streams, create, cycle)\n",
                 probe.c_str());
    return 2;
  }
  std::string why;
  if (!real_backend_available(&why)) {
    std::fprintf(stderr, "twinstep_decode_bench: %s\n", why.c_str());
    return 1;
  }
  try {
    cudaDeviceProp prop{};
    TS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    const std::string cmd =
        probe.empty() ? std::string("scripts/gpu_runtime.sh OUT (twinstep_decode_bench --out OUT)")
                      : cuda_env_prefix() + "TWINSTEP_PROBE=" + probe +
                            " scripts/gpu_probe.sh OUT (twinstep_decode_bench --probe-" + probe +
                            " --out OUT)";
    const std::string header = "  \"command\": " + q(cmd) + ",\n  \"commit\": " + q(commit) +
                               ",\n  \"gpu\": " + q(prop.name) + ",\n  \"date\": " + q(date) +
                               ",\n" + (note.empty() ? "" : "  \"note\": " + q(note) + ",\n");
    if (!probe.empty()) {
      probes.at(probe)(out_dir, header);
      return 0;
    }
    const Bandwidth bw = measure_bandwidth();
    std::printf("bandwidth: streaming read %.3f TB/s, d2d copy %.3f TB/s (read+write)\n",
                bw.read_tbps, bw.copy_tbps);

    const ModelSpec& model = model_preset("llama-3-8b");
    const LlamaConfig config = llama_config_from_spec(model);
    const int out_tokens = 257;  // first token from prefill + 256 decode steps
    // Engines sized to their workloads (as make_real_backend does): KV capacity decides the
    // attention split size, so a prompt-128 run does not pay for an 8K cache.
    auto make_engine = [&](int slots, int capacity) {
      EngineOptions eo;
      eo.max_slots = slots;
      eo.capacity_tokens = (capacity + 63) / 64 * 64;
      const auto t0 = std::chrono::steady_clock::now();
      auto e = Engine::create_synthetic(config, 1, eo);
      std::printf("engine: %.2f GB weights, %d slots x %d tokens, init %.2f s\n",
                  e->weight_bytes() / 1e9, eo.max_slots, eo.capacity_tokens,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      return e;
    };
    const int sweep_max = quick ? 8 : 64;
    std::unique_ptr<Engine> engine;
    // Host loop costs of the batch-1 runs (fixed, so lockstep's idle is easy to read).
    HostCostSpec hc;
    hc.ops[size_t(HostOp::kSchedule)] = {DistKind::kFixed, 50'000, 0, 0, 0};
    hc.ops[size_t(HostOp::kPrepareDecode)] = {DistKind::kFixed, 150'000, 0, 0, 0};
    hc.ops[size_t(HostOp::kProcessOutputs)] = {DistKind::kFixed, 100'000, 0, 0, 0};
    const double host_cost_us = 300;

    Json main_json;
    struct Config {
      const char* label;
      HostSchedule schedule;
      GraphMode mode;
    };
    const std::vector<Config> configs = {
        {"runahead_graph_pdl", HostSchedule::kRunahead, GraphMode::kCudaGraphPdl},
        {"runahead_graph", HostSchedule::kRunahead, GraphMode::kCudaGraph},
        {"lockstep_graph", HostSchedule::kLockstep, GraphMode::kCudaGraph},
        {"runahead_eager", HostSchedule::kRunahead, GraphMode::kEager},
    };
    std::map<std::string, double> unprofiled_tpot;
    std::printf("\nbatch 1, %d decode tokens, host loop %.0f us/step (fixed)\n", out_tokens - 1,
                host_cost_us);
    std::printf("%-20s %7s %9s %9s %8s %9s %8s %10s %10s %9s\n", "config", "prompt", "tpot_ms",
                "floor_ms", "%floor", "step_ms", "busy%", "idle_host", "idle_launch", "TB/s");
    for (int prompt : {128, 8192}) {
      engine.reset();
      engine =
          prompt == 128 ? make_engine(1, 128 + 16 + out_tokens) : make_engine(1, 8192 + out_tokens);
      // Warm-up (cuBLAS heuristics for the prefill shapes, graph capture, clocks): not recorded.
      for (const Config& c : configs) {
        WorkloadSpec w;
        w.input_len = {prompt, prompt};
        w.output_len = {16, 16};
        PolicySpec p;
        p.host_schedule = c.schedule;
        p.graph_mode = c.mode;
        run_once(*engine, model, w, p, hc, RealOptions{});
      }
      for (const Config& c : configs) {
        WorkloadSpec w;
        w.input_len = {prompt, prompt};
        w.output_len = {out_tokens, out_tokens};
        PolicySpec p;
        p.host_schedule = c.schedule;
        p.graph_mode = c.mode;
        RealOptions ro;
        ro.prompt_seed = 1;
        try {
          std::vector<int32_t> toks, toks2;
          // Two measured runs; the row holds their mean (tpot_ms_runs lists both).
          const RunRecord r1 = run_once(*engine, model, w, p, hc, ro, &toks);
          const RunRecord r2 = run_once(*engine, model, w, p, hc, ro, &toks2);
          if (toks != toks2) std::printf("WARNING: %s prompt %d: reruns differ\n", c.label, prompt);
          const Summary s1 = summarize(r1), s2 = summarize(r2);
          Summary s = s1;
          s.tpot_ms = (s1.tpot_ms + s2.tpot_ms) / 2;
          s.step_ms = (s1.step_ms + s2.step_ms) / 2;
          s.busy_pct = (s1.busy_pct + s2.busy_pct) / 2;
          s.idle_host_us = (s1.idle_host_us + s2.idle_host_us) / 2;
          s.idle_launch_us = (s1.idle_launch_us + s2.idle_launch_us) / 2;
          const double floor_ms = s.bytes_per_step / (bw.read_tbps * 1e12) * 1e3;
          const double pct = 100.0 * floor_ms / s.tpot_ms;
          const double tbps = s.bytes_per_step / (s.step_ms * 1e-3) / 1e12;
          std::printf("%-20s %7d %9.3f %9.3f %7.1f%% %9.3f %7.2f%% %8.1fus %8.1fus %9.3f\n",
                      c.label, prompt, s.tpot_ms, floor_ms, pct, s.step_ms, s.busy_pct,
                      s.idle_host_us, s.idle_launch_us, tbps);
          unprofiled_tpot[std::string(c.label) + "/" + std::to_string(prompt)] = s.tpot_ms;
          main_json.row({{"config", q(c.label)},
                         {"host_schedule", q(host_schedule_name(c.schedule))},
                         {"graph_mode", q(graph_mode_name(c.mode))},
                         {"batch", "1"},
                         {"prompt_tokens", std::to_string(prompt)},
                         {"decode_tokens", std::to_string(out_tokens - 1)},
                         {"tpot_ms", fmt(s.tpot_ms)},
                         {"tpot_ms_runs", q(fmt(s1.tpot_ms) + "," + fmt(s2.tpot_ms))},
                         {"floor_ms", fmt(floor_ms)},
                         {"pct_of_floor", fmt(pct, 3)},
                         {"gpt_fast_tpot_ms", prompt == 128 ? "4.96" : "7.24"},
                         {"step_ms", fmt(s.step_ms)},
                         {"ttft_ms", fmt(s.ttft_ms)},
                         {"gpu_busy_pct", fmt(s.busy_pct, 4)},
                         {"idle_host_us_per_step", fmt(s.idle_host_us)},
                         {"idle_launch_us_per_step", fmt(s.idle_launch_us)},
                         {"host_loop_us_per_step", fmt(s.host_loop_us)},
                         {"host_wait_us_per_step", fmt(s.host_wait_us)},
                         {"host_cost_model_us_per_step", fmt(host_cost_us)},
                         {"bytes_per_step", fmt(s.bytes_per_step, 6)},
                         {"achieved_tbps", fmt(tbps)},
                         {"stream_read_tbps", fmt(bw.read_tbps)},
                         {"d2d_copy_tbps", fmt(bw.copy_tbps)},
                         {"steady_steps", std::to_string(s.steady_steps)},
                         {"first_tokens", q(std::to_string(toks.size() > 0 ? toks[0] : -1) + "," +
                                            std::to_string(toks.size() > 1 ? toks[1] : -1) + "," +
                                            std::to_string(toks.size() > 2 ? toks[2] : -1))}});
        } catch (const std::exception& e) {
          std::printf("%s prompt %d failed: %s\n", c.label, prompt, e.what());
        }
      }
    }
    main_json.write(out_dir + "/decode.json", header);
    std::fflush(stdout);

    engine.reset();
    engine = make_engine(sweep_max, std::max(512 + 129, 128 + 16 + 64));
    // Concurrency sweep: prompt 512, 128 decode tokens, one request per slot.
    Json sweep_json;
    try {
      std::printf("\nconcurrency sweep (run-ahead, graphs + PDL, prompt 512, 128 decode tokens)\n");
      std::printf("%6s %10s %9s %9s %9s %9s %8s\n", "conc", "tok/s", "tpot_ms", "step_ms",
                  "floor_ms", "TB/s", "busy%");
      for (int conc = 1; conc <= sweep_max; conc *= 2) {
        {  // warm-up of this bucket's graphs and prefill shapes (not recorded)
          WorkloadSpec w;
          w.input_len = {512, 512};
          w.output_len = {4, 4};
          w.num_requests = conc;
          w.max_concurrency = conc;
          PolicySpec p;
          p.graph_mode = GraphMode::kCudaGraphPdl;
          run_once(*engine, model, w, p, HostCostSpec{}, RealOptions{});
        }
        WorkloadSpec w;
        w.input_len = {512, 512};
        w.output_len = {129, 129};
        w.num_requests = conc;
        w.max_concurrency = conc;
        PolicySpec p;
        p.host_schedule = HostSchedule::kRunahead;
        p.graph_mode = GraphMode::kCudaGraphPdl;
        RealOptions ro;
        ro.prompt_seed = 2;
        const RunRecord r = run_once(*engine, model, w, p, HostCostSpec{}, ro);
        const Summary s = summarize(r);
        const double floor_ms = s.bytes_per_step / (bw.read_tbps * 1e12) * 1e3;
        const double tbps = s.bytes_per_step / (s.step_ms * 1e-3) / 1e12;
        const double decode_tok_s = conc / (s.step_ms * 1e-3);
        std::printf("%6d %10.1f %9.3f %9.3f %9.3f %9.3f %7.2f%%\n", conc, s.throughput_tok_s,
                    s.tpot_ms, s.step_ms, floor_ms, tbps, s.busy_pct);
        sweep_json.row({{"concurrency", std::to_string(conc)},
                        {"prompt_tokens", "512"},
                        {"output_tokens", "129"},
                        {"output_throughput_tok_s", fmt(s.throughput_tok_s)},
                        {"steady_decode_tok_s", fmt(decode_tok_s)},
                        {"tpot_ms", fmt(s.tpot_ms)},
                        {"ttft_ms", fmt(s.ttft_ms)},
                        {"step_ms", fmt(s.step_ms)},
                        {"floor_ms", fmt(floor_ms)},
                        {"pct_of_floor", fmt(100.0 * floor_ms / s.step_ms, 3)},
                        {"bytes_per_step", fmt(s.bytes_per_step, 6)},
                        {"achieved_tbps", fmt(tbps)},
                        {"stream_read_tbps", fmt(bw.read_tbps)},
                        {"gpu_busy_pct", fmt(s.busy_pct, 4)}});
      }
    } catch (const std::exception& e) {
      std::printf("sweep failed: %s\n", e.what());
    }
    sweep_json.write(out_dir + "/decode_sweep.json", header);
    std::fflush(stdout);

    // Timeline of a few unprofiled steps, lockstep and run-ahead (graph), prompt 128.
    std::ofstream trace(out_dir + "/decode_trace.json");
    trace << "{\n" << header << "  \"rows\": [\n";
    bool first_row = true;
    auto dump = [&](const char* label, const RunRecord& r) {
      for (const TimelineSpan& t : r.timeline) {
        trace << (first_row ? "" : ",\n") << "    {\"run\": " << q(label) << ", \"lane\": "
              << q(t.lane == Lane::kHost      ? "host"
                   : t.lane == Lane::kCompute ? "compute"
                                              : "copy")
              << ", \"name\": " << q(t.name) << ", \"step\": " << t.step
              << ", \"start_us\": " << fmt(t.start_ns / 1e3, 10)
              << ", \"dur_us\": " << fmt(t.dur_ns / 1e3, 6) << ", \"flow\": " << t.flow << "}";
        first_row = false;
      }
    };
    for (HostSchedule sched : {HostSchedule::kLockstep, HostSchedule::kRunahead}) {
      WorkloadSpec w;
      w.input_len = {128, 128};
      w.output_len = {64, 64};
      PolicySpec p;
      p.host_schedule = sched;
      p.graph_mode = GraphMode::kCudaGraph;
      RealOptions ro;
      ro.trace_first_step = 40;
      ro.trace_steps = 3;
      dump(host_schedule_name(sched), run_once(*engine, model, w, p, hc, ro));
    }
    engine.reset();

    // Profiled: a globaltimer node before every kernel (PDL overlap lost, launches doubled).
    Json prof_json;
    EngineOptions po;
    po.max_slots = 1;
    po.capacity_tokens = (128 + 16 + out_tokens + 63) / 64 * 64;  // as the unprofiled engine
    po.profile_nodes = true;
    auto profiled = Engine::create_synthetic(config, 1, po);
    std::map<std::string, double> node_us;
    int traced_steps = 0;
    for (GraphMode mode : {GraphMode::kCudaGraph, GraphMode::kCudaGraphPdl}) {
      WorkloadSpec w;
      w.input_len = {128, 128};
      w.output_len = {out_tokens, out_tokens};
      PolicySpec p;
      p.host_schedule = HostSchedule::kRunahead;
      p.graph_mode = mode;
      RealOptions ro;
      ro.prompt_seed = 1;
      ro.trace_first_step = 100;
      ro.trace_steps = 20;
      const RunRecord r = run_once(*profiled, model, w, p, hc, ro);
      const Summary s = summarize(r);
      const std::string key =
          std::string(mode == GraphMode::kCudaGraph ? "runahead_graph" : "runahead_graph_pdl") +
          "/128";
      std::printf("\nprofiled %-22s tpot %.3f ms (unprofiled %.3f ms, +%.1f%%)\n", key.c_str(),
                  s.tpot_ms, unprofiled_tpot[key], 100.0 * (s.tpot_ms / unprofiled_tpot[key] - 1));
      prof_json.row(
          {{"config", q(key)},
           {"tpot_ms_unprofiled", fmt(unprofiled_tpot[key])},
           {"tpot_ms_profiled", fmt(s.tpot_ms)},
           {"profiling_overhead_pct", fmt(100.0 * (s.tpot_ms / unprofiled_tpot[key] - 1), 3)},
           {"step_ms_profiled", fmt(s.step_ms)}});
      if (mode == GraphMode::kCudaGraph) {
        for (const TimelineSpan& t : r.timeline)
          if (t.lane == Lane::kCompute && t.flow == 0) node_us[t.name] += t.dur_ns / 1e3;
        traced_steps = 20;
        dump("profiled_runahead_graph", [&] {
          RunRecord small;
          for (const TimelineSpan& t : r.timeline)
            if (t.step < 102) small.timeline.push_back(t);
          return small;
        }());
      }
    }
    trace << "\n  ]\n}\n";
    std::printf("\nper-kernel time per step (profiled graph, %d steps; sums over layers)\n",
                traced_steps);
    double total = 0;
    for (const auto& [name, us] : node_us) total += us / traced_steps;
    for (const auto& [name, us] : node_us) {
      std::printf("  %-16s %9.1f us %5.1f%%\n", name.c_str(), us / traced_steps,
                  100.0 * us / traced_steps / total);
      prof_json.row({{"kernel", q(name)},
                     {"us_per_step", fmt(us / traced_steps)},
                     {"pct_of_step", fmt(100.0 * us / traced_steps / total, 3)}});
    }
    prof_json.write(out_dir + "/decode_profile.json", header);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "twinstep_decode_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
