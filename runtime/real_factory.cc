#include "runtime/real_factory.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "policies/error.h"
#include "runtime/checkpoint.h"
#include "runtime/engine.h"

namespace twinstep {
namespace {

class OwningRealBackend final : public Backend {
 public:
  OwningRealBackend(const Variant& v, const std::vector<RequestSpec>& requests)
      : model_(v.model), host_(v.host_costs, v.seed) {
    const LlamaConfig config = llama_config_from_spec(model_);
    const bool spec = v.policy.spec.method != SpecMethod::kNone;
    int32_t need = 16;
    for (const RequestSpec& r : requests)
      need = std::max(need,
                      (r.input_len + 15) / 16 * 16 + r.output_len + spec_kv_margin(v.policy.spec));
    runtime::EngineOptions eo;
    // Tensor parallelism: this rank's GPU and shard (runtime/tensor_parallel.h).
    if (v.layout.tp > 1) eo.tp = runtime::tp_world(v.layout.tp);
    eo.max_slots = std::max(1, v.workload.max_concurrency);
    eo.capacity_tokens = (need + 63) / 64 * 64;
    eo.draft = spec;
    // The draft adds one layer of KV per slot (and one layer of weights, below).
    const int64_t kv_bytes = int64_t(eo.max_slots + 1) * eo.capacity_tokens *
                             model_.kv_bytes_per_token() * (config.layers + (spec ? 1 : 0)) /
                             config.layers;
    size_t free_bytes = 0, total_bytes = 0;
    TS_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    // Draft weights: about one decoder layer plus eh_proj (2 H^2 bf16).
    const int64_t draft_bytes =
        spec ? model_.weight_bytes_total() / config.layers + 4 * config.hidden * config.hidden : 0;
    const int64_t want = model_.weight_bytes_total() + kv_bytes + draft_bytes;
    if (double(want) > 0.92 * double(free_bytes))
      throw Error("real backend: " + model_.name + " needs " + std::to_string(want >> 20) +
                  " MiB (weights + KV for " + std::to_string(eo.max_slots) + " x " +
                  std::to_string(eo.capacity_tokens) + " tokens), the GPU has " +
                  std::to_string(free_bytes >> 20) + " MiB free");
    engine_ =
        runtime::Engine::create_synthetic(config, v.seed, eo, spec ? kRealDraftFidelity : -1.0);
    RealOptions ro;
    ro.trace_first_step = v.trace.first_step;
    ro.trace_steps = v.trace.step_count;
    ro.prepare_mode = v.policy.graph_mode;
    ro.prepare_max_batch = eo.max_slots;
    ro.prompt_seed = v.workload.seed;
    ro.spec = v.policy.spec;
    backend_ = std::make_unique<RealBackend>(*engine_, model_, host_, requests, ro);
  }
  void run(std::span<HostProgram* const> ranks, RunRecord& record) override {
    backend_->run(ranks, record);
  }

 private:
  ModelSpec model_;
  HostCostModel host_;
  std::unique_ptr<runtime::Engine> engine_;
  std::unique_ptr<RealBackend> backend_;
};

}  // namespace

std::unique_ptr<Backend> make_real_backend(const Variant& v,
                                           const std::vector<RequestSpec>& requests) {
  return std::make_unique<OwningRealBackend>(v, requests);
}

}  // namespace twinstep
