// Diagnosis of the decode step's slowdown at 16 rows under programmatic dependent launch
// (docs/calibration.md: Llama-3-8B, batch 16, graph + PDL 8.1 ms vs 5.2 ms without PDL, while
// batch 8 and 32 were normal). The cause: the register-path GEMVs of more than 8 rows launched
// under PDL (kernels/tuning.h GemvTuning::pdl_max_rows). One synthetic Llama-3-8B engine per
// kernel tuning (and EngineOptions); for each, the decode graph of batches 8, 12 and 16 (16
// shares the bucket of 12; --batches for others, up to 16), graph and graph+PDL, timed with events
// around back-to-back replays at a short context (about 200 tokens).
//   twinstep_pdl_rows_bench [--reps N] [--ctx TOKENS] [--batches 8,12,16] [--only LABEL_PART ...]
// Prints one line per tuning, batch and mode; the kernel tunings are kernels/tuning.h's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/tuning.h"
#include "runtime/engine.h"
#include "runtime/real_backend.h"

using namespace twinstep;
using runtime::Engine;
using runtime::EngineOptions;
namespace kd = twinstep::kernels::detail;

namespace {

struct Tuning {
  const char* label;
  std::function<void()> apply;         // on top of the defaults
  bool drain_after_attention = false;  // EngineOptions::pdl_drain_after_attention
  bool fused_rope = false;             // EngineOptions::fused_rope
  bool fused_norms = false;            // EngineOptions::fused_norms
};

// Median step time (ms) of `reps` decode replays of `batch` slots in `mode`.
double time_decode_ms(Engine& engine, int batch, GraphMode mode, int reps) {
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  for (int i = 0; i < batch; ++i) slots[size_t(i)] = i;
  for (int w = 0; w < 3; ++w) engine.enqueue_decode(slots, mode);
  std::vector<cudaEvent_t> ev(size_t(reps) + 1);
  for (cudaEvent_t& e : ev) TS_CUDA_CHECK(cudaEventCreate(&e));
  TS_CUDA_CHECK(cudaEventRecord(ev[0], engine.compute_stream()));
  for (int r = 0; r < reps; ++r) {
    engine.enqueue_decode(slots, mode);
    TS_CUDA_CHECK(cudaEventRecord(ev[size_t(r) + 1], engine.compute_stream()));
  }
  TS_CUDA_CHECK(cudaStreamSynchronize(engine.compute_stream()));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    float x = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&x, ev[size_t(r)], ev[size_t(r) + 1]));
    ms.push_back(x);
  }
  for (cudaEvent_t e : ev) TS_CUDA_CHECK(cudaEventDestroy(e));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20, ctx = 192;
  std::vector<int> batches = {8, 12, 16};  // at most 16 (the engine's slots)
  std::vector<std::string> only;  // tunings whose label contains one of these (default: all)
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps") reps = std::max(3, std::atoi(argv[i + 1]));
    if (a == "--ctx") ctx = std::max(1, std::atoi(argv[i + 1]));
    if (a == "--only") only.push_back(argv[i + 1]);
    if (a == "--batches") {  // comma-separated
      batches.clear();
      std::istringstream list(argv[i + 1]);
      for (std::string item; std::getline(list, item, ',');)
        batches.push_back(std::clamp(std::atoi(item.c_str()), 1, 16));
    }
  }
  std::string why;
  if (!real_backend_available(&why)) {
    std::fprintf(stderr, "twinstep_pdl_rows_bench: %s\n", why.c_str());
    return 1;
  }
  try {
    const LlamaConfig config = llama_config_from_spec(model_preset("llama-3-8b"));
    const kd::KernelTuning kernel_defaults = kd::kernel_tuning();
    const kd::GemvTuning gemv_defaults = kd::gemv_tuning();
    const kd::AttentionTuning attention_defaults = kd::attention_tuning();
    const std::vector<Tuning> tunings = {
        {"default", [] {}},
        {"gemv pdl at any rows", [] { kd::gemv_tuning().pdl_max_rows = 16; }},
        {"attention max carveout at any rows",
         [] { kd::attention_tuning().carveout_max_shared_rows = 1 << 30; }},
        {"attention driver carveout", [] { kd::attention_tuning().carveout_max_shared = false; }},
        {"early triggers off", [] { kd::kernel_tuning().early_trigger = false; }},
        {"gemv ring path for m > 8", [] { kd::gemv_tuning().large_m_registers = false; }},
        {"gemv split 1 (no clusters)", [] { kd::gemv_tuning().split = 1; }},
        {"gemv register pipeline (fill 2)", [] { kd::gemv_tuning().fill = 2; }},
        {"gemv refilled ring for m > 8", [] { kd::gemv_tuning().large_m_stages = 2; }},
        {"gemv refilled ring m > 8, pdl any rows",
         [] {
           kd::gemv_tuning().large_m_stages = 2;
           kd::gemv_tuning().pdl_max_rows = 16;
         }},
        {"refilled ring, pdl + attn carveout any rows",
         [] {
           kd::gemv_tuning().large_m_stages = 2;
           kd::gemv_tuning().pdl_max_rows = 16;
           kd::attention_tuning().carveout_max_shared_rows = 1 << 30;
         }},
        {"pdl any rows, o_proj drains", [] { kd::gemv_tuning().pdl_max_rows = 16; }, true},
        {"refilled ring, pdl any rows, o_proj drains",
         [] {
           kd::gemv_tuning().large_m_stages = 2;
           kd::gemv_tuning().pdl_max_rows = 16;
         },
         true},
        {"rope fused into attention", [] {}, false, true},
        {"norms fused into the GEMVs", [] {}, false, false, true},
        {"norms fused into the GEMVs + rope fused", [] {}, false, true, true},
    };
    const int slots = 16;
    std::printf("Llama-3-8B synthetic, ctx %d, median of %d replays per point (ms per step)\n", ctx,
                reps);
    for (const Tuning& t : tunings) {
      const std::string label = t.label;
      if (!only.empty() && std::none_of(only.begin(), only.end(), [&](const std::string& o) {
            return label.find(o) != std::string::npos;
          }))
        continue;
      kd::kernel_tuning() = kernel_defaults;
      kd::gemv_tuning() = gemv_defaults;
      kd::attention_tuning() = attention_defaults;
      t.apply();  // read by the launchers while the graphs are captured
      EngineOptions eo;
      eo.max_slots = slots;
      eo.capacity_tokens = ctx + 320;
      eo.pdl_drain_after_attention = t.drain_after_attention;
      eo.fused_rope = t.fused_rope;
      eo.fused_norms = t.fused_norms;
      auto engine = Engine::create_synthetic(config, 1, eo);
      std::vector<int32_t> ids(slots);
      std::vector<std::vector<int32_t>> prompts(slots, std::vector<int32_t>(size_t(ctx)));
      for (int i = 0; i < slots; ++i) {
        ids[size_t(i)] = i;
        for (int k = 0; k < ctx; ++k) prompts[size_t(i)][size_t(k)] = (i * 7919 + k * 31) % 32000;
      }
      engine->enqueue_prefill(ids, prompts);
      for (const GraphMode mode : {GraphMode::kCudaGraph, GraphMode::kCudaGraphPdl})
        engine->prepare(mode, slots);
      for (const int batch : batches) {
        const double graph_ms = time_decode_ms(*engine, batch, GraphMode::kCudaGraph, reps);
        const double pdl_ms = time_decode_ms(*engine, batch, GraphMode::kCudaGraphPdl, reps);
        std::printf("%-44s batch %2d: graph %6.3f ms, graph+pdl %6.3f ms (pdl/graph %.3f)\n",
                    t.label, batch, graph_ms, pdl_ms, pdl_ms / graph_ms);
      }
    }
    kd::kernel_tuning() = kernel_defaults;
    kd::gemv_tuning() = gemv_defaults;
    kd::attention_tuning() = attention_defaults;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "twinstep_pdl_rows_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
