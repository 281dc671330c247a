// Pipeline parallelism of the real runtime (docs/runtime.md "Pipeline parallelism"): one process
// per GPU under mpirun, every rank an Engine holding one stage of the model, the simulator's PP
// with one microbatch (policies/step_kernels.cc step_kernels / pipeline_step_kernels):
//   stage 0         embedding, layers [0, n0), then sends the hidden state: the residual stream
//                   and the last layer's MLP output (its residual add is the next layer's, as on
//                   one GPU), rows x hidden bf16 each (the simulator's pp_send: 2 x rows x H);
//   stage s > 0     receives them (pp_recv), runs its layers; the last stage then the final norm,
//                   the LM head and sampling, and sends the sampled ids to stage 0 (pp_ids_send /
//                   pp_ids_recv), so every stage commits the same tokens and lengths to its relay.
// Layers split as the simulator's stage_layers (policies/layout.h): earlier stages take the extra
// layer. Each stage holds only its layers' weights and KV cache; the embedding lives on stage 0,
// the final norm and LM head on the last stage. No sum is split across ranks, so the stages
// compute exactly what one GPU computes: greedy tokens equal one GPU's bit for bit.
#pragma once

#include <cstdint>

#include "runtime/checkpoint.h"

namespace twinstep {
class Communicator;
}

namespace twinstep::runtime {

// This rank's place in a pipeline. comm == nullptr: no pipeline (the plain engine). The ranks of
// the communicator are the stages (rank s = stage s).
struct PipelineParallel {
  int32_t stage = 0;
  int32_t stages = 1;
  Communicator* comm = nullptr;
  bool active() const { return comm != nullptr; }
  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
};

// Stage `stage`'s config of `full` split over `stages` (policies/layout.h stage_layers: layers
// [first_layer, first_layer + layers), holds_embedding on stage 0, holds_head on the last).
// Throws ConfigError when a stage would get no layer, the stage is outside [0, stages), or `full`
// is already a stage or an expert-parallel shard.
LlamaConfig pp_stage_config(const LlamaConfig& full, int32_t stage, int32_t stages);

// This process's stage of a `pp`-stage pipeline over the world communicator (rank = stage;
// runtime/tensor_parallel.h tp_world_communicator). Throws Error unless the job has exactly pp
// ranks. CUDA runtime only (defined in tensor_parallel.cc, beside tp_world).
PipelineParallel pp_world(int32_t pp);

}  // namespace twinstep::runtime
