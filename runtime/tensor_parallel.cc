// Tensor parallelism (runtime/tensor_parallel.h): shard configs and slices, the sharded
// synthetic init, the all-reduce hook of the engine's forwards, the process's communicator; and
// the engine side of pipeline parallelism (runtime/pipeline_parallel.h): a stage's synthetic init
// and its NCCL send/recv hand-offs, which share the communicator plumbing.
#include "runtime/tensor_parallel.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "policies/calibration_model.h"
#include "policies/error.h"
#include "runtime/comm.h"
#include "runtime/device_ops.h"
#include "runtime/engine.h"
#include "runtime/engine_internal.h"
#include "runtime/pipeline_parallel.h"
#include "runtime/synthetic.h"

namespace twinstep::runtime {

namespace {

// Routed experts [first, end) of EP rank `rank` of `size`: floor(E rank / size) .. as
// policies/layout.cc layer_shard (the simulator's contiguous blocks).
std::pair<int32_t, int32_t> expert_block(int32_t experts, int32_t rank, int32_t size) {
  return {int32_t(int64_t{experts} * rank / size), int32_t(int64_t{experts} * (rank + 1) / size)};
}

// J of a tensor named "model.layers.L.mlp.experts.J.<proj>.weight"; -1 for any other tensor.
int32_t routed_expert_of(const std::string& name) {
  const std::string key = ".mlp.experts.";
  const size_t at = name.find(key);
  if (at == std::string::npos) return -1;
  return int32_t(std::stol(name.substr(at + key.size())));
}

}  // namespace

LlamaConfig tp_shard_config(const LlamaConfig& full, int32_t rank, int32_t size) {
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw ConfigError("", "tensor parallelism tp " + std::to_string(size) + ": " + what);
  };
  need(size >= 1, "tp must be >= 1");
  need(rank >= 0 && rank < size, "rank " + std::to_string(rank) + " outside [0, tp)");
  need(full.q_heads % size == 0, std::to_string(full.q_heads) + " query heads do not divide");
  need(full.kv_heads % size == 0, std::to_string(full.kv_heads) +
                                      " KV heads do not divide (replicating KV heads across "
                                      "ranks is not implemented)");
  need(full.intermediate % (64 * int64_t{size}) == 0,
       "intermediate " + std::to_string(full.intermediate) +
           " is not a multiple of 64 x tp (each rank's gate/up/down slice must be a multiple of "
           "64)");
  LlamaConfig c = full;
  c.q_heads = full.q_heads / size;
  c.kv_heads = full.kv_heads / size;
  c.intermediate = full.intermediate / size;
  if (full.moe()) {
    need(full.local_experts() == full.num_experts && full.expert_begin == 0,
         "the config is already an expert-parallel shard");
    need(full.num_experts % size == 0,
         std::to_string(full.num_experts) +
             " routed experts do not divide into equal blocks (expert parallelism ep = tp: rank "
             "i holds experts [E i/tp, E (i+1)/tp); unequal blocks are not implemented)");
    need(full.shared_intermediate % (64 * int64_t{size}) == 0,
         "shared expert intermediate " + std::to_string(full.shared_intermediate) +
             " is not a multiple of 64 x tp (each rank's shared gate/up/down slice must be a "
             "multiple of 64)");
    const auto [first, end] = expert_block(full.num_experts, rank, size);
    c.expert_begin = first;
    c.num_local_experts = end - first;
    c.shared_intermediate = full.shared_intermediate / size;
  }
  return c;
}

TensorSlice tp_slice(const LlamaConfig& full, const WeightDesc& w, int32_t rank, int32_t size) {
  TensorSlice s;
  const bool two_d = w.shape.size() == 2;
  s.full_cols = two_d ? w.shape[1] : w.shape.at(0);
  s.rows = two_d ? w.shape[0] : 1;
  s.cols = s.full_cols;
  auto ends = [&](const char* suffix) {
    const std::string x = suffix;
    return w.name.size() > x.size() && w.name.compare(w.name.size() - x.size(), x.size(), x) == 0;
  };
  auto rows = [&](int64_t total) {  // column-parallel: a block of output rows
    s.rows = total / size;
    s.row0 = s.rows * rank;
  };
  auto cols = [&](int64_t total) {  // row-parallel: a block of input columns
    s.cols = total / size;
    s.col0 = s.cols * rank;
  };
  // Embeddings, final norm, lm_head and the draft's input (enorm, hnorm, eh_proj): replicated.
  // The draft's layer (mtp.layer.*) is sharded as a model layer (the simulator's nextn draft).
  if (w.name.rfind("model.layers.", 0) != 0 && w.name.rfind("mtp.layer.", 0) != 0) return s;
  if (const int32_t j = routed_expert_of(w.name); j >= 0) {  // whole, on its EP rank only
    const auto [first, end] = expert_block(full.num_experts, rank, size);
    if (j < first || j >= end) s.rows = s.cols = 0;
    return s;
  }
  if (ends(".self_attn.q_proj.weight"))
    rows(full.q_dim());
  else if (ends(".self_attn.k_proj.weight") || ends(".self_attn.v_proj.weight"))
    rows(full.kv_dim());
  else if (ends(".self_attn.o_proj.weight"))
    cols(full.q_dim());
  else if (ends(".mlp.gate_proj.weight") || ends(".mlp.up_proj.weight"))
    rows(full.intermediate);
  else if (ends(".mlp.down_proj.weight"))
    cols(full.intermediate);
  else if (ends(".mlp.shared_expert.gate_proj.weight") || ends(".mlp.shared_expert.up_proj.weight"))
    rows(full.shared_intermediate);
  else if (ends(".mlp.shared_expert.down_proj.weight"))
    cols(full.shared_intermediate);
  return s;  // norms, the MoE router: replicated
}

// tensor_parallel_ops.cu (nvcc, C++17: plain arguments).
void launch_init_synthetic_slice_raw(uint16_t* dst, int64_t rows, int64_t cols, int64_t row0,
                                     int64_t col0, int64_t full_cols, uint64_t seed,
                                     uint64_t stream_id, float scale, cudaStream_t stream);

void launch_init_synthetic_slice(uint16_t* dst, const TensorSlice& s, uint64_t seed,
                                 uint64_t stream_id, float scale, cudaStream_t stream) {
  launch_init_synthetic_slice_raw(dst, s.rows, s.cols, s.row0, s.col0, s.full_cols, seed, stream_id,
                                  scale, stream);
}

std::vector<uint16_t> tp_shard_bits(const LlamaConfig& full, const WeightDesc& w, uint64_t seed,
                                    int32_t rank, int32_t size) {
  const TensorSlice s = tp_slice(full, w, rank, size);
  std::vector<uint16_t> out(size_t(s.rows * s.cols));
  for (int64_t r = 0; r < s.rows; ++r)
    synthetic_tensor_bits(w, seed, uint64_t((s.row0 + r) * s.full_cols + s.col0), uint64_t(s.cols),
                          out.data() + r * s.cols);
  return out;
}

std::pair<LayoutSpec, int32_t> engine_shard(const EngineOptions& o, const ModelSpec& m) {
  if (o.tp.size > 1) return {calibration_layout(m, o.tp.size), o.tp.rank};
  LayoutSpec l;
  if (o.pp.stages > 1) {
    l.pp = o.pp.stages;
    l.microbatches = 1;
    l.vocab_parallel = false;
    return {l, o.pp.stage};
  }
  return {l, 0};
}

// ---------------------------------------------------------------------------------------------
// Engine members of tensor parallelism (declared in engine.h)

namespace {

// Communicator calls, which exist only where NCCL was found (twinstep_comm).
#ifdef TWINSTEP_HAVE_NCCL
int comm_size(Communicator& c) { return c.size(); }
int comm_rank(Communicator& c) { return c.rank(); }
void all_reduce_bf16(Communicator& c, void* x, size_t n, cudaStream_t s) {
  c.all_reduce_sum(x, x, n, CommType::kBF16, s);
}
void comm_send(Communicator& c, const void* x, size_t n, CommType t, int peer, cudaStream_t s) {
  c.send(x, n, t, peer, s);
}
void comm_recv(Communicator& c, void* x, size_t n, CommType t, int peer, cudaStream_t s) {
  c.recv(x, n, t, peer, s);
}
#else
[[noreturn]] void no_nccl() {
  throw Error("tensor parallelism: this build has no NCCL (runtime/comm.cc not built)");
}
int comm_size(Communicator&) { no_nccl(); }
int comm_rank(Communicator&) { no_nccl(); }
void all_reduce_bf16(Communicator&, void*, size_t, cudaStream_t) { no_nccl(); }
void comm_send(Communicator&, const void*, size_t, CommType, int, cudaStream_t) { no_nccl(); }
void comm_recv(Communicator&, void*, size_t, CommType, int, cudaStream_t) { no_nccl(); }
#endif

}  // namespace

std::unique_ptr<Engine> Engine::create_synthetic_tp(const LlamaConfig& full, uint64_t seed,
                                                    const EngineOptions& options,
                                                    double draft_fidelity) {
  const TensorParallel& tp = options.tp;
#ifndef TWINSTEP_HAVE_NCCL
  throw Error("tensor parallelism: this build has no NCCL (runtime/comm.cc not built)");
#endif
  if (options.draft && options.draft_early_exit)
    throw ConfigError("",
                      "speculative decoding with tensor parallelism: early exit "
                      "(policies.spec.early_exit) is not implemented there (the draft steps' "
                      "all-reduces would sit in conditional graph nodes); set early_exit: false");
  if (comm_size(*tp.comm) != tp.size || comm_rank(*tp.comm) != tp.rank)
    throw Error("tensor parallelism: rank " + std::to_string(tp.rank) + " of " +
                std::to_string(tp.size) + " given a communicator of rank " +
                std::to_string(comm_rank(*tp.comm)) + " of " + std::to_string(comm_size(*tp.comm)));
  std::unique_ptr<Engine> e(new Engine(tp_shard_config(full, tp.rank, tp.size), options));
  e->init_synthetic_tp(full, seed, draft_fidelity);
  return e;
}

void Engine::init_synthetic_tp(const LlamaConfig& full, uint64_t seed, double draft_fidelity) {
  const TensorParallel& tp = options_.tp;
  size_t held = 0;
  for (const WeightDesc& d : synthetic_weight_list(full, options_.draft, draft_fidelity)) {
    const TensorSlice s = tp_slice(full, d, tp.rank, tp.size);
    if (s.empty()) continue;  // another rank's expert
    ++held;
    const auto& [p, n] = b_->by_name.at(d.name);
    if (s.rows * s.cols != n)
      throw Error("tensor parallelism: shard of " + d.name + " has " +
                  std::to_string(s.rows * s.cols) + " elements, the engine's tensor " +
                  std::to_string(n));
    if (d.eye) {  // a structured tensor (the draft's eh_proj), made on the host as init_synthetic
      const std::vector<uint16_t> bits = tp_shard_bits(full, d, seed, tp.rank, tp.size);
      TS_CUDA_CHECK(cudaMemcpy(p, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
      continue;
    }
    const float scale = d.init_std == 0 ? 0.0f : synthetic::scale_for_std(d.init_std);
    launch_init_synthetic_slice(reinterpret_cast<uint16_t*>(p), s, seed,
                                synthetic::tensor_stream(d.name), scale, compute_);
  }
  if (held != b_->by_name.size())
    throw Error("tensor parallelism: rank " + std::to_string(tp.rank) + " initialised " +
                std::to_string(held) + " tensors, the engine holds " +
                std::to_string(b_->by_name.size()));
  TS_CUDA_CHECK(cudaStreamSynchronize(compute_));
}

void Engine::tp_all_reduce(bf16* x, int rows, const char* name) {
  if (!options_.tp.active()) {
    if (options_.collective_stubs) {
      if (name != nullptr) node(name);
      launch_collective_stub(compute_);
    }
    return;
  }
  if (name != nullptr) node(name);
  all_reduce_bf16(*options_.tp.comm, x, size_t(rows) * size_t(config_.hidden), compute_);
}

// ---------------------------------------------------------------------------------------------
// Engine members of pipeline parallelism (declared in engine.h)

std::unique_ptr<Engine> Engine::create_synthetic_pp(const LlamaConfig& full, uint64_t seed,
                                                    const EngineOptions& options,
                                                    double draft_fidelity) {
  const PipelineParallel& pp = options.pp;
#ifndef TWINSTEP_HAVE_NCCL
  throw Error("pipeline parallelism: this build has no NCCL (runtime/comm.cc not built)");
#endif
  if (options.draft)
    throw ConfigError("", "speculative decoding with pipeline parallelism is not implemented");
  if (comm_size(*pp.comm) != pp.stages || comm_rank(*pp.comm) != pp.stage)
    throw Error("pipeline parallelism: stage " + std::to_string(pp.stage) + " of " +
                std::to_string(pp.stages) + " given a communicator of rank " +
                std::to_string(comm_rank(*pp.comm)) + " of " + std::to_string(comm_size(*pp.comm)));
  std::unique_ptr<Engine> e(new Engine(pp_stage_config(full, pp.stage, pp.stages), options));
  e->init_synthetic_pp(full, seed, draft_fidelity);
  return e;
}

void Engine::init_synthetic_pp(const LlamaConfig& full, uint64_t seed, double draft_fidelity) {
  // The full model's list (its init scales: draft_layer_scale depends on the model's depth),
  // restricted to the tensors this stage holds, each generated whole as the one-GPU engine does.
  size_t held = 0;
  for (const WeightDesc& d : synthetic_weight_list(full, false, draft_fidelity)) {
    const auto it = b_->by_name.find(d.name);
    if (it == b_->by_name.end()) continue;  // another stage's
    ++held;
    const auto& [p, n] = it->second;
    int64_t elements = 1;
    for (const int64_t x : d.shape) elements *= x;
    if (d.eye || elements != n)
      throw Error("pipeline parallelism: " + d.name + " has " + std::to_string(elements) +
                  " elements, the stage's tensor " + std::to_string(n));
    const float scale = d.init_std == 0 ? 0.0f : synthetic::scale_for_std(d.init_std);
    launch_init_synthetic(reinterpret_cast<uint16_t*>(p), uint64_t(n), seed,
                          synthetic::tensor_stream(d.name), scale, compute_);
  }
  if (held != b_->by_name.size())
    throw Error("pipeline parallelism: stage " + std::to_string(options_.pp.stage) +
                " initialised " + std::to_string(held) + " tensors, the engine holds " +
                std::to_string(b_->by_name.size()));
  TS_CUDA_CHECK(cudaStreamSynchronize(compute_));
}

// The hand-offs are plain NCCL sends and receives on compute_ (captured into the decode graphs
// like the all-reduces). Each rank's sends and receives of one launch go in one fixed order,
// sends to the next stage before the receive from the last stage, and the peer posts them in
// the same order (stage s: recv from s-1, send to s+1, recv ids from the last; the last: recv,
// send ids to 0, 1, ...), so no two ranks wait on each other: no group call is needed.
void Engine::pp_send_hidden(int rows) {
  const PipelineParallel& pp = options_.pp;
  if (!pp.active() || pp.last()) return;
  const size_t n = size_t(rows) * size_t(config_.hidden);
  node("pp_send");  // one node: the simulator's pp_send of hidden state + residual
  comm_send(*pp.comm, b_->residual, n, CommType::kBF16, pp.stage + 1, compute_);
  comm_send(*pp.comm, b_->mlp, n, CommType::kBF16, pp.stage + 1, compute_);
}

void Engine::pp_recv_hidden(int rows) {
  const PipelineParallel& pp = options_.pp;
  if (!pp.active() || pp.first()) return;
  const size_t n = size_t(rows) * size_t(config_.hidden);
  node("pp_recv");
  comm_recv(*pp.comm, b_->residual, n, CommType::kBF16, pp.stage - 1, compute_);
  comm_recv(*pp.comm, b_->mlp, n, CommType::kBF16, pp.stage - 1, compute_);
}

void Engine::pp_ids(int rows) {
  const PipelineParallel& pp = options_.pp;
  if (!pp.active() || pp.stages == 1) return;
  if (pp.last()) {
    node("pp_ids_send");
    for (int to = 0; to < pp.stages - 1; ++to)
      comm_send(*pp.comm, b_->sampled, size_t(rows), CommType::kI32, to, compute_);
  } else {
    node("pp_ids_recv");
    comm_recv(*pp.comm, b_->sampled, size_t(rows), CommType::kI32, pp.stages - 1, compute_);
  }
}

// ---------------------------------------------------------------------------------------------
// The process's communicator

namespace {

Communicator* g_world = nullptr;

int env_local_rank() {
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "PMI_LOCAL_RANK"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return std::atoi(v);
  }
  return -1;
}

}  // namespace

Communicator& tp_world_communicator() {
  if (g_world != nullptr) return *g_world;
  const int rank = world_rank(), size = world_size();
  int local = env_local_rank();
  if (local < 0) local = rank;  // one node
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    (void)cudaGetLastError();
    devices = 0;
  }
  if (local >= devices)
    throw Error("tensor parallelism: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                " is local rank " + std::to_string(local) + " on its node, which has " +
                std::to_string(devices) + " visible GPU(s): one GPU per rank is needed");
  TS_CUDA_CHECK(cudaSetDevice(local));
#ifdef TWINSTEP_HAVE_NCCL
  g_world = Communicator::create_world().release();
  return *g_world;
#else
  no_nccl();
#endif
}

TensorParallel tp_world(int32_t tp) {
  Communicator& comm = tp_world_communicator();
  if (comm_size(comm) != tp)
    throw Error("tensor parallelism tp " + std::to_string(tp) + " needs " + std::to_string(tp) +
                " ranks (mpirun -np " + std::to_string(tp) + "), this job has " +
                std::to_string(comm_size(comm)));
  return TensorParallel{comm_rank(comm), tp, &comm};
}

PipelineParallel pp_world(int32_t pp) {
  Communicator& comm = tp_world_communicator();
  if (comm_size(comm) != pp)
    throw Error("pipeline parallelism pp " + std::to_string(pp) + " needs " + std::to_string(pp) +
                " ranks (mpirun -np " + std::to_string(pp) + "), this job has " +
                std::to_string(comm_size(comm)));
  return PipelineParallel{comm_rank(comm), pp, &comm};
}

void tp_release_world_communicator() {
#ifdef TWINSTEP_HAVE_NCCL
  delete g_world;
#endif
  g_world = nullptr;
}

double time_graph_all_reduce_ns(Communicator& comm, int64_t count, int reps, int iters,
                                cudaStream_t stream) {
#ifndef TWINSTEP_HAVE_NCCL
  (void)comm, (void)count, (void)reps, (void)iters, (void)stream;
  no_nccl();
#else
  void* buf = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&buf, size_t(std::max<int64_t>(count, 1)) * 2));
  TS_CUDA_CHECK(cudaMemsetAsync(buf, 0, size_t(count) * 2, stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t start = nullptr, end = nullptr;
  double ns = 0;
  try {
    comm.all_reduce_sum(buf, buf, size_t(count), CommType::kBF16, stream);  // eager warm-up
    comm.synchronize(stream, "all-reduce timing warm-up");
    TS_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < reps; ++i)
      comm.all_reduce_sum(buf, buf, size_t(count), CommType::kBF16, stream);
    TS_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    TS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    TS_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    comm.synchronize(stream, "all-reduce timing (graph warm-up)");
    TS_CUDA_CHECK(cudaEventCreate(&start));
    TS_CUDA_CHECK(cudaEventCreate(&end));
    TS_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < iters; ++i) TS_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TS_CUDA_CHECK(cudaEventRecord(end, stream));
    comm.synchronize(stream, "all-reduce timing");
    float ms = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
    ns = double(ms) * 1e6 / double(std::max(1, iters * reps));
  } catch (...) {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (start) cudaEventDestroy(start);
    if (end) cudaEventDestroy(end);
    cudaFree(buf);
    throw;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  cudaFree(buf);
  return ns;
#endif
}

}  // namespace twinstep::runtime
