// Tensor parallelism of the real runtime (Megatron style, docs/runtime.md "Tensor parallelism"):
// one process per GPU under mpirun, every rank an Engine holding its shard of the same model.
//   qkv      column-parallel: rank r owns query heads [r Q/tp, (r+1) Q/tp) and KV heads
//            [r K/tp, (r+1) K/tp) (their rows of q_proj / k_proj / v_proj) and its KV cache slice;
//   o_proj   row-parallel (the matching q_dim/tp columns), then an all-reduce (bf16 sum) of the
//            hidden state;
//   gate/up  column-parallel (intermediate/tp rows each), down_proj row-parallel, all-reduce;
//   embeddings, norms and lm_head replicated: after each all-reduce every rank holds the same
//            residual stream, so every rank computes the same logits and samples the same token
//            (vocab-parallel lm_head is a later step).
// The all-reduces are NCCL calls enqueued on the compute stream, inside the captured decode
// graphs and in prefill (runtime/comm.h Communicator). Every rank then adds the reduced values
// to its residual stream with the same kernel in the same order, so the ranks stay identical.
//
// MoE models (the simulator's TP-EP layout with ep = tp, docs/layouts.md): attention as above;
//   router   replicated (every rank routes every token over all experts);
//   experts  expert parallel: rank r holds the routed experts [floor(E r/tp), floor(E (r+1)/tp))
//            whole (the tensors mlp.experts.J.* of its J), computes only the selected experts of
//            its block for every token;
//   shared   the shared expert split like the dense FFN (its intermediate/tp);
//   then ONE all-reduce of the layer's output (routed and shared partial sums together), the
//            simulator's moe_all_reduce: tokens are on every rank already, no dispatch.
//
// The Engine of a rank is built from the *local* config (tp_shard_config: q_heads, kv_heads and
// intermediate divided by tp; MoE: its expert block and shared-expert slice); hidden, vocab and
// layers are the model's. Synthetic weights are the full model's tensors (synthetic.h: a
// function of seed, name and full index) sliced, so TP1 and TP2 hold the same model bit for
// bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/checkpoint.h"

typedef struct CUstream_st* cudaStream_t;

namespace twinstep {
class Communicator;
}

namespace twinstep::runtime {

// This rank's place in a tensor-parallel group. comm == nullptr: no tensor parallelism (the
// plain engine); with size > 1 the engine is one rank's shard config run alone, without its
// collectives (calibrate --tp: a rank's kernels timed on one GPU; its MoE output is a partial
// sum nothing completes). A communicator of one rank exercises the same code path on one GPU
// (its all-reduces are NCCL calls that return the input).
struct TensorParallel {
  int32_t rank = 0;
  int32_t size = 1;
  Communicator* comm = nullptr;
  bool active() const { return comm != nullptr; }
};

// Rank `rank`'s config of `full` split `size` ways; throws ConfigError (naming what does not
// divide) when q heads, KV heads or intermediate/64 are not multiples of size. MoE: the expert
// block of the rank (expert_begin, num_local_experts = num_experts / size) and shared
// intermediate / size; throws when num_experts or shared intermediate/64 do not divide.
LlamaConfig tp_shard_config(const LlamaConfig& full, int32_t rank, int32_t size);

// Where rank `rank`'s shard of a full tensor lies: rows [row0, row0 + rows) and columns
// [col0, col0 + cols) of the full [full_rows][full_cols] tensor (1-D tensors: one row).
// rows == cols == 0: the rank holds none of it (another rank's routed expert).
struct TensorSlice {
  int64_t row0 = 0, rows = 0, col0 = 0, cols = 0, full_cols = 0;
  bool empty() const { return rows * cols == 0; }
};
TensorSlice tp_slice(const LlamaConfig& full, const WeightDesc& w, int32_t rank, int32_t size);

// Host copy of rank `rank`'s shard of a synthetic tensor (tests, CPU references): the slice of
// synthetic_tensor_bits of the full tensor.
std::vector<uint16_t> tp_shard_bits(const LlamaConfig& full, const WeightDesc& w, uint64_t seed,
                                    int32_t rank, int32_t size);

// dst[r][c] = synthetic::element_bits(seed, stream_id, (row0 + r) * full_cols + col0 + c, scale)
// (bf16 1.0 when scale == 0), r < rows, c < cols: a shard generated on the device.
void launch_init_synthetic_slice(uint16_t* dst, const TensorSlice& slice, uint64_t seed,
                                 uint64_t stream_id, float scale, cudaStream_t stream);

// The process's communicator over every MPI rank (created on first use: collective, so every
// rank must call it at the same point; the runner does, as every rank runs the same variants).
// Before creating it, selects this rank's GPU: the launcher's local rank (OMPI_COMM_WORLD_
// LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID), checked against the device count. Throws
// CommError / Error when the build has no NCCL or the GPUs are fewer than the local ranks.
Communicator& tp_world_communicator();
// Destroys it (before MPI_Finalize; later calls create a new one).
void tp_release_world_communicator();
// This process's place in a tp-way group over the world communicator; throws Error unless the
// job has exactly tp ranks.
TensorParallel tp_world(int32_t tp);

// Time of one bf16 all-reduce of `count` elements on `comm`, inside a captured graph of `reps`
// back-to-back all-reduces on `stream` (mean over `iters` graph launches after a warm-up), in
// ns. Collective: every rank of comm calls it with the same arguments.
double time_graph_all_reduce_ns(Communicator& comm, int64_t count, int reps, int iters,
                                cudaStream_t stream);

}  // namespace twinstep::runtime
