// Pipeline parallelism's stage configs (runtime/pipeline_parallel.h). Plain C++: CPU-tested.
#include "runtime/pipeline_parallel.h"

#include <string>

#include "policies/error.h"
#include "policies/layout.h"

namespace twinstep::runtime {

LlamaConfig pp_stage_config(const LlamaConfig& full, int32_t stage, int32_t stages) {
  auto need = [&](bool ok, const std::string& what) {
    if (!ok)
      throw ConfigError("", "pipeline parallelism pp " + std::to_string(stages) + ": " + what);
  };
  need(stages >= 1, "pp must be >= 1");
  need(stage >= 0 && stage < stages, "stage " + std::to_string(stage) + " outside [0, pp)");
  need(full.first_layer == 0 && full.holds_embedding && full.holds_head,
       "the config is already a pipeline stage");
  need(full.local_experts() == full.num_experts && full.expert_begin == 0,
       "the config is an expert-parallel shard (pipeline and expert parallelism together are not "
       "implemented)");
  need(full.layers >= stages, std::to_string(full.layers) + " layers leave a stage without one");
  const StageLayers sl = stage_layers(full.layers, stages, stage);
  LlamaConfig c = full;
  c.first_layer = sl.first;
  c.layers = sl.count;
  c.holds_embedding = stage == 0;
  c.holds_head = stage == stages - 1;
  return c;
}

}  // namespace twinstep::runtime
