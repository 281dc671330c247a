// Tensor parallelism of the real runtime (runtime/tensor_parallel.h), with expert parallelism of
// MoE layers (ep = tp), and pipeline parallelism (runtime/pipeline_parallel.h: two stages whose
// greedy tokens must equal one GPU's exactly, tiny dense and MoE models and the Llama-3-8B
// shape). Run as a plain process (CPU: shard slicing and config errors; one GPU:
// the tp = 1 path through the NCCL hooks, dense and MoE, and a one-stage pipeline) and under
//   mpirun --allow-run-as-root -np 2 runtime_tp_gpu_test
// (one GPU per rank): the ranks' greedy tokens agree, TP2 against TP1 on the Llama-3-8B shape
// over 256 tokens (agreement rate and first divergence printed: bf16 all-reduce rounding may
// flip a near-tie), and the tiny model's TP2 against the CPU reference; likewise TP2-EP2 of the
// tiny MoE model (against the CPU reference) and of the Qwen3-30B-A3B shape (against one GPU);
// and a collective that hangs because rank 1 stays out of it ends on rank 0 at the deadline with
// a CommError, both ranks tearing down cleanly (a communicator of its own, not the world one).
// Tests needing more ranks or GPUs than present skip.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "experiments/tp_run.h"
#include "policies/decode_loop.h"
#include "policies/layout.h"
#include "policies/model_spec.h"
#include "policies/step_kernels.h"
#include "runtime/checkpoint.h"
#include "runtime/comm.h"
#include "runtime/engine.h"
#include "runtime/memory_plan.h"
#include "runtime/pipeline_parallel.h"
#include "runtime/real_backend.h"
#include "runtime/tensor_parallel.h"
#include "tests/runtime/cpu_reference.h"
#include "tests/runtime/gpu_skip.h"

#ifdef TWINSTEP_HAVE_MPI
#include <mpi.h>
#endif

namespace twinstep {
namespace {

using runtime::Engine;
using runtime::EngineOptions;
using runtime::TensorParallel;

int launched_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(name); v != nullptr && std::atoi(v) > 0) return std::atoi(v);
  return 1;
}

// Set by main once this rank joined the world communicator (a GPU per rank).
bool g_world_ready = false;

#define SKIP_WITHOUT_RANKS(n)                                                                      \
  do {                                                                                             \
    SKIP_WITHOUT_GPU();                                                                            \
    if (world_size() != (n) || !g_world_ready)                                                     \
      GTEST_SKIP() << "needs exactly " << (n) << " ranks, a GPU each: mpirun --allow-run-as-root " \
                   << "-np " << (n) << " runtime_tp_gpu_test";                                     \
  } while (0)

// Greedy tokens of request 0..n-1 for workload w (prompt seed 1) on `engine`, under speculative
// policy `spec` (none by default); accept_len: tokens committed per verified request-step.
std::vector<std::vector<int32_t>> greedy(Engine& engine, const ModelSpec& model,
                                         const WorkloadSpec& w, HostSchedule schedule,
                                         GraphMode mode, const SpecSpec& spec = {},
                                         double* accept_len = nullptr) {
  const std::vector<RequestSpec> requests = generate_requests(w);
  PolicySpec p;
  p.host_schedule = schedule;
  p.graph_mode = mode;
  p.spec = spec;
  RunRecord record;
  DecodeLoop loop(p, w, requests, &record);
  const HostCostModel host(HostCostSpec{}, 1);
  RealOptions ro;
  ro.prompt_seed = 1;
  ro.prepare_mode = mode;
  ro.prepare_max_batch = w.max_concurrency;
  ro.spec = spec;
  RealBackend backend(engine, model, host, requests, ro);
  HostProgram* ranks[] = {&loop};
  backend.run(ranks, record);
  if (accept_len != nullptr) {
    int64_t committed = 0, verified = 0;
    for (const StepSample& s : record.steps) {
      if (s.draft_len == 0) continue;
      committed += s.tokens;
      verified += s.batch;
    }
    *accept_len = verified ? double(committed) / double(verified) : 0;
  }
  std::vector<std::vector<int32_t>> out;
  for (const RequestSpec& q : requests) out.push_back(backend.output_tokens(q.id));
  return out;
}

WorkloadSpec workload(int32_t input, int32_t output, int32_t requests = 1) {
  WorkloadSpec w;
  w.input_len = {input, input};
  w.output_len = {output, output};
  w.num_requests = requests;
  w.max_concurrency = requests;
  return w;
}

// Every rank's tokens (flattened, same length on every rank), gathered through the communicator.
std::vector<std::vector<int32_t>> gather_tokens(Communicator& comm, const std::vector<int32_t>& t) {
  const size_t n = t.size(), all = n * size_t(comm.size());
  std::vector<int32_t> host(all, 0);
  std::copy(t.begin(), t.end(), host.begin() + std::ptrdiff_t(n * size_t(comm.rank())));
  void* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, all * 4), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), all * 4, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  comm.all_reduce_sum(d, d, all, CommType::kI32, s);
  comm.synchronize(s, "gather tokens");
  EXPECT_EQ(cudaMemcpy(host.data(), d, all * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaStreamDestroy(s);
  cudaFree(d);
  std::vector<std::vector<int32_t>> out;
  for (int r = 0; r < comm.size(); ++r)
    out.emplace_back(host.begin() + std::ptrdiff_t(n * size_t(r)),
                     host.begin() + std::ptrdiff_t(n * size_t(r + 1)));
  return out;
}

std::vector<int32_t> flat(const std::vector<std::vector<int32_t>>& v) {
  std::vector<int32_t> f;
  for (const auto& x : v) f.insert(f.end(), x.begin(), x.end());
  return f;
}

// Every rank's shard of full tensor w (tp_shard_bits) put back at its slice (tp_slice): the
// reassembled tensor (0xffff where no rank wrote), and how many ranks hold all of it or a part.
struct Tiling {
  std::vector<uint16_t> bits;
  int whole = 0, part = 0;
};
Tiling tile_over_ranks(const LlamaConfig& full, const WeightDesc& w, uint64_t seed, int size) {
  uint64_t n = 1;
  for (int64_t d : w.shape) n *= uint64_t(d);
  Tiling t;
  t.bits.assign(n, 0xffff);
  for (int r = 0; r < size; ++r) {
    const runtime::TensorSlice s = runtime::tp_slice(full, w, r, size);
    const std::vector<uint16_t> bits = runtime::tp_shard_bits(full, w, seed, r, size);
    EXPECT_EQ(bits.size(), size_t(s.rows * s.cols)) << w.name;
    if (bits.size() != size_t(s.rows * s.cols)) return t;
    if (s.empty()) continue;
    ++(s.rows * s.cols == int64_t(n) ? t.whole : t.part);
    for (int64_t i = 0; i < s.rows; ++i)
      for (int64_t j = 0; j < s.cols; ++j)
        t.bits[size_t((s.row0 + i) * s.full_cols + s.col0 + j)] = bits[size_t(i * s.cols + j)];
  }
  return t;
}

std::vector<uint16_t> full_bits(const WeightDesc& w, uint64_t seed) {
  uint64_t n = 1;
  for (int64_t d : w.shape) n *= uint64_t(d);
  std::vector<uint16_t> bits(n);
  synthetic_tensor_bits(w, seed, 0, n, bits.data());
  return bits;
}

// What init_synthetic_tp relies on: rank r's non-empty slices of the full model's tensors are
// exactly the tensors of its shard config's weight list (the engine's allocation), element
// counts equal. `list`: llama_weight_list (the model) or draft_weight_list (the draft module).
void expect_slices_match_shard_lists(
    const LlamaConfig& full, int size,
    std::vector<WeightDesc> (*list)(const LlamaConfig&) = llama_weight_list) {
  for (int r = 0; r < size; ++r) {
    std::map<std::string, int64_t> sliced, listed;
    for (const WeightDesc& w : list(full))
      if (const runtime::TensorSlice s = runtime::tp_slice(full, w, r, size); !s.empty())
        sliced[w.name] = s.rows * s.cols;
    for (const WeightDesc& w : list(runtime::tp_shard_config(full, r, size))) {
      int64_t n = 1;
      for (int64_t d : w.shape) n *= d;
      listed[w.name] = n;
    }
    EXPECT_EQ(sliced, listed) << "rank " << r << " of " << size;
  }
}

// CPU, no GPU: the ranks' shards tile every full tensor exactly once.
TEST(TensorParallel, ShardsTileTheFullTensors) {
  const LlamaConfig full = llama_config_from_spec(tiny_runtime_spec());
  for (const WeightDesc& w : llama_weight_list(full)) {
    const Tiling t = tile_over_ranks(full, w, 5, 2);
    EXPECT_EQ(t.bits, full_bits(w, 5)) << w.name;
    const bool sharded = w.name.find("proj") != std::string::npos;
    EXPECT_EQ(t.whole, sharded ? 0 : 2) << w.name;
    EXPECT_EQ(t.part, sharded ? 2 : 0) << w.name;
  }
  expect_slices_match_shard_lists(full, 2);
  // The draft module (speculative decoding under TP) at fidelity 0.5 (eh_proj a structured
  // tensor): its input (enorm, hnorm, eh_proj) whole on every rank, its layer split as a model
  // layer; the union is the full module bit for bit, and each rank's slices are its shard
  // config's draft tensors.
  for (const WeightDesc& w : synthetic_weight_list(full, true, 0.5)) {
    if (w.name.rfind("mtp.", 0) != 0) continue;
    const Tiling t = tile_over_ranks(full, w, 5, 2);
    EXPECT_EQ(t.bits, full_bits(w, 5)) << w.name;
    const bool sharded = w.name.find("proj") != std::string::npos && w.name != "mtp.eh_proj.weight";
    EXPECT_EQ(t.whole, sharded ? 0 : 2) << w.name;
    EXPECT_EQ(t.part, sharded ? 2 : 0) << w.name;
  }
  expect_slices_match_shard_lists(full, 2, draft_weight_list);
  const LlamaConfig shard = runtime::tp_shard_config(full, 1, 2);
  EXPECT_EQ(shard.q_heads, 2);
  EXPECT_EQ(shard.kv_heads, 1);
  EXPECT_EQ(shard.intermediate, 512);
  EXPECT_EQ(shard.num_experts, 0);
  EXPECT_THROW(runtime::tp_shard_config(full, 0, 4), ConfigError);  // 2 KV heads over 4 ranks
  EXPECT_THROW(runtime::tp_shard_config(full, 2, 2), ConfigError);  // no rank 2 of 2
}

// CPU: expert parallelism (ep = tp) of the tiny MoE model with a shared expert (16 experts,
// shared width 256) over 2 ranks: rank r holds experts [8r, 8r + 8) whole and shared rows /
// columns [128r, 128r + 128); router and norms on both; attention as dense TP. The union over
// the ranks is the full model, bit for bit.
TEST(ExpertParallel, ShardsTileTheFullMoeModel) {
  const LlamaConfig full = llama_config_from_spec(tiny_moe_runtime_spec(true));
  ASSERT_EQ(full.num_experts, 16);
  ASSERT_EQ(full.shared_intermediate, 256);
  for (int r = 0; r < 2; ++r) {
    const LlamaConfig shard = runtime::tp_shard_config(full, r, 2);
    EXPECT_EQ(shard.num_experts, 16);  // routing over all of them
    EXPECT_EQ(shard.expert_begin, 8 * r);
    EXPECT_EQ(shard.num_local_experts, 8);
    EXPECT_EQ(shard.local_experts(), 8);
    EXPECT_EQ(shard.shared_intermediate, 128);
    EXPECT_EQ(shard.expert_intermediate, full.expert_intermediate);  // experts are not split
    EXPECT_EQ(shard.q_heads, 2);
    EXPECT_EQ(shard.kv_heads, 1);
    int experts_listed = 0;
    for (const WeightDesc& w : llama_weight_list(shard)) {
      const size_t at = w.name.find(".mlp.experts.");
      if (at == std::string::npos) continue;
      const int j = std::stoi(w.name.substr(at + 13));
      EXPECT_TRUE(j >= 8 * r && j < 8 * r + 8) << "rank " << r << " lists " << w.name;
      ++experts_listed;
    }
    EXPECT_EQ(experts_listed, 2 * 8 * 3) << "2 layers x 8 experts x gate/up/down";
  }
  for (const WeightDesc& w : llama_weight_list(full)) {
    const Tiling t = tile_over_ranks(full, w, 5, 2);
    EXPECT_EQ(t.bits, full_bits(w, 5)) << w.name;
    if (const size_t at = w.name.find(".mlp.experts."); at != std::string::npos) {
      EXPECT_EQ(t.whole, 1) << w.name << ": one owner";
      EXPECT_EQ(t.part, 0) << w.name;
      const int j = std::stoi(w.name.substr(at + 13));
      const int owner = j / 8;
      EXPECT_FALSE(runtime::tp_slice(full, w, owner, 2).empty()) << w.name;
      EXPECT_TRUE(runtime::tp_slice(full, w, 1 - owner, 2).empty()) << w.name;
      // The owner's shard is the full tensor.
      EXPECT_EQ(runtime::tp_shard_bits(full, w, 5, owner, 2), full_bits(w, 5)) << w.name;
    } else if (w.name.find("proj") != std::string::npos) {  // attention, shared expert
      EXPECT_EQ(t.whole, 0) << w.name;
      EXPECT_EQ(t.part, 2) << w.name;
    } else {  // norms, embeddings, lm_head, the router
      EXPECT_EQ(t.whole, 2) << w.name;
      EXPECT_EQ(t.part, 0) << w.name;
    }
  }
  // The shared expert: gate rows [128r, +128), down columns [128r, +128) of the full tensors.
  const WeightDesc* gate = nullptr;
  const WeightDesc* down = nullptr;
  const std::vector<WeightDesc> list = llama_weight_list(full);
  for (const WeightDesc& w : list) {
    if (w.name == "model.layers.1.mlp.shared_expert.gate_proj.weight") gate = &w;
    if (w.name == "model.layers.1.mlp.shared_expert.down_proj.weight") down = &w;
  }
  ASSERT_TRUE(gate != nullptr && down != nullptr);
  const runtime::TensorSlice g1 = runtime::tp_slice(full, *gate, 1, 2);
  EXPECT_EQ(g1.row0, 128);
  EXPECT_EQ(g1.rows, 128);
  EXPECT_EQ(g1.cols, full.hidden);
  const runtime::TensorSlice d1 = runtime::tp_slice(full, *down, 1, 2);
  EXPECT_EQ(d1.col0, 128);
  EXPECT_EQ(d1.cols, 128);
  EXPECT_EQ(d1.rows, full.hidden);
  expect_slices_match_shard_lists(full, 2);
  expect_slices_match_shard_lists(llama_config_from_spec(tiny_moe_runtime_spec(false)), 2);
  // The draft module's MoE layer (fidelity 0.5) is sharded as a model layer: each routed expert
  // whole on its owner, the shared expert and attention split, the rest (input, norms, router)
  // whole on both; the union is the full module and each rank's slices are its shard's list.
  for (const WeightDesc& w : synthetic_weight_list(full, true, 0.5)) {
    if (w.name.rfind("mtp.", 0) != 0) continue;
    const Tiling t = tile_over_ranks(full, w, 5, 2);
    EXPECT_EQ(t.bits, full_bits(w, 5)) << w.name;
    const bool expert = w.name.find(".mlp.experts.") != std::string::npos;
    const bool split =
        !expert && w.name.find("proj") != std::string::npos && w.name != "mtp.eh_proj.weight";
    EXPECT_EQ(t.whole, expert ? 1 : split ? 0 : 2) << w.name;
    EXPECT_EQ(t.part, split ? 2 : 0) << w.name;
  }
  expect_slices_match_shard_lists(full, 2, draft_weight_list);
  // tp = 1: the whole model on the one rank.
  const LlamaConfig one = runtime::tp_shard_config(full, 0, 1);
  EXPECT_EQ(one.expert_begin, 0);
  EXPECT_EQ(one.local_experts(), 16);
  EXPECT_EQ(one.shared_intermediate, 256);
  expect_slices_match_shard_lists(full, 1);
}

// CPU: Qwen3-30B-A3B at TP2-EP2 (as the simulator's layer_shard: rank 1 holds [64, 128)), and
// the memory plan of a rank: its 64 experts, all 128 router rows. By hand, per layer: norms 2H,
// qkv (2048 + 2 x 256) H (16 of 32 q heads, 2 of 4 KV heads), o_proj H x 2048, router 128 H,
// experts 64 x 3 x 768 H; plus embedding and lm_head V H and the final norm H (H 2048,
// V 151936; every tensor a multiple of 128 elements, so no padding).
TEST(ExpertParallel, Qwen3ShardAndMemoryPlan) {
  const LlamaConfig full = llama_config_from_spec(model_preset("qwen3-30b-a3b"));
  const LlamaConfig r1 = runtime::tp_shard_config(full, 1, 2);
  EXPECT_EQ(r1.expert_begin, 64);
  EXPECT_EQ(r1.local_experts(), 64);
  EXPECT_EQ(r1.num_experts, 128);
  EXPECT_EQ(r1.shared_intermediate, 0);
  const int64_t H = 2048, V = 151936;
  const int64_t layer = 2 * H + (2048 + 2 * 256) * H + H * 2048 + 128 * H + 64 * 3 * 768 * H;
  const int64_t want = 2 * (2 * V * H + H + 48 * layer);
  EXPECT_EQ(plan_engine_memory(r1, 1, 64, 16).weight_bytes, want);
  // The full model's plan minus the shard's: the other 64 experts and the other half of the
  // attention projections (q, k, v, o) of every layer.
  const int64_t diff = 2 * 48 * (64 * 3 * 768 * H + (2048 + 2 * 256) * H + H * 2048);
  EXPECT_EQ(plan_engine_memory(full, 1, 64, 16).weight_bytes - want, diff);
}

// CPU: what expert parallelism refuses, each error naming the reason.
TEST(ExpertParallel, ConfigErrors) {
  LlamaConfig c = llama_config_from_spec(tiny_moe_runtime_spec(true));
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(no ConfigError)";
  };
  // 16 experts over 3 ranks (6 q heads and 3 KV heads, so only the experts fail).
  LlamaConfig three = c;
  three.q_heads = 6;
  three.kv_heads = 3;
  three.shared_intermediate = 192 * 3;
  EXPECT_NE(message([&] {
              runtime::tp_shard_config(three, 0, 3);
            }).find("16 routed experts do not divide"),
            std::string::npos)
      << message([&] { runtime::tp_shard_config(three, 0, 3); });
  // A shared expert whose slices would not be multiples of 64.
  LlamaConfig shared = c;
  shared.shared_intermediate = 192;
  EXPECT_NE(message([&] {
              runtime::tp_shard_config(shared, 0, 2);
            }).find("shared expert intermediate 192"),
            std::string::npos);
  // Sharding a shard.
  LlamaConfig twice = runtime::tp_shard_config(c, 1, 2);
  twice.q_heads = 4;
  twice.kv_heads = 2;
  EXPECT_NE(message([&] { runtime::tp_shard_config(twice, 0, 2); }).find("already"),
            std::string::npos);
}

// CPU: the layout and rank a real engine's step bytes are counted over (engine_shard) are those
// the simulator gives the same rank of the variant's layout: one GPU, a TP2 rank of a dense model
// (ep 1) and of an MoE model (ep 2), both with the whole vocabulary per rank, and a PP2 stage; so
// TP2 rank 1 of Llama-3-8B counts its layers' projections halved (step_kernels' own test) and the
// same bytes as the simulated rank 1.
TEST(TensorParallel, EngineShardIsTheSimulatorsRank) {
  const ModelSpec& llama = model_preset("llama-3-8b");
  EngineOptions o;
  auto [one, r0] = runtime::engine_shard(o, llama);
  EXPECT_EQ(one.world(), 1);
  EXPECT_EQ(r0, 0);
  o.tp = TensorParallel{1, 2, nullptr};  // rank 1 of 2 (a shard measured alone: no communicator)
  auto [tp, r1] = runtime::engine_shard(o, llama);
  EXPECT_EQ(tp.tp, 2);
  EXPECT_EQ(tp.ep, 1);
  EXPECT_FALSE(tp.vocab_parallel);
  EXPECT_EQ(r1, 1);
  const auto [moe, rm] = runtime::engine_shard(o, model_preset("qwen3-30b-a3b"));
  EXPECT_EQ(moe.tp, 2);
  EXPECT_EQ(moe.ep, 2);
  EXPECT_EQ(rm, 1);
  LayoutSpec variant;  // what h200_tp2.yaml gives the simulator
  variant.tp = 2;
  variant.vocab_parallel = false;
  StepKernels real, sim;
  step_kernels(llama, decode_shape(1, 1, 1024), tp, r1, real);
  step_kernels(llama, decode_shape(1, 1, 1024), variant, 1, sim);
  EXPECT_EQ(real.bytes_read(), sim.bytes_read());
  o.tp = TensorParallel{};
  o.pp.stages = 2;
  o.pp.stage = 1;
  auto [pp, rp] = runtime::engine_shard(o, llama);
  EXPECT_EQ(pp.pp, 2);
  EXPECT_EQ(pp.microbatches, 1);
  EXPECT_EQ(rp, 1);
}

// CPU: which real multi-GPU variants the runner refuses, and the error says why.
TEST(TensorParallel, RealLayoutChecks) {
  Variant v;
  v.label = "base";
  v.layout.tp = 2;
  v.layout.vocab_parallel = false;  // the runtime holds the whole embedding and LM head per rank
  RealLayoutEnv ok;
  ok.world = 2;
  ok.local_ranks = 2;
  ok.devices = 2;
  ok.mpi = ok.nccl = true;
  EXPECT_EQ(real_layout_problem(v, ok), "");
  auto problem = [&](const Variant& x, const RealLayoutEnv& env) {
    return real_layout_problem(x, env);
  };
  RealLayoutEnv one = ok;
  one.world = 1;
  EXPECT_NE(problem(v, one).find("mpirun -np 2` (this is a single process)"), std::string::npos)
      << problem(v, one);
  RealLayoutEnv few = ok;
  few.devices = 1;
  EXPECT_NE(problem(v, few).find("1 visible GPU(s)"), std::string::npos) << problem(v, few);
  RealLayoutEnv nompi = ok;
  nompi.mpi = false;
  EXPECT_NE(problem(v, nompi).find("without MPI"), std::string::npos);
  // Pipeline parallelism: pp 2 alone with one microbatch runs; the default microbatches (pp),
  // other counts, chunked prefill, pp with tp, and pp 4 are refused, saying what to write.
  Variant pp = v;
  pp.layout.tp = 1;
  pp.layout.pp = 2;
  pp.layout.microbatches = 1;
  EXPECT_EQ(problem(pp, ok), "");
  pp.layout.vocab_parallel = true;  // a stage of one GPU: nothing to split, nothing refused
  EXPECT_EQ(problem(pp, ok), "");
  EXPECT_NE(problem(pp, one).find("mpirun -np 2` (this is a single process)"), std::string::npos)
      << problem(pp, one);
  Variant pp_default = pp;
  pp_default.layout.microbatches = 0;
  EXPECT_NE(problem(pp_default, ok)
                .find("the default splits it into pp = 2; set `layout: {pp: 2, "
                      "microbatches: 1}`"),
            std::string::npos)
      << problem(pp_default, ok);
  Variant pp_mb = pp;
  pp_mb.layout.microbatches = 4;
  EXPECT_NE(problem(pp_mb, ok).find("microbatches 4 splits it"), std::string::npos)
      << problem(pp_mb, ok);
  Variant pp_chunk = pp;
  pp_chunk.layout.prefill_chunk_tokens = 512;
  EXPECT_NE(problem(pp_chunk, ok).find("prefill_chunk_tokens"), std::string::npos);
  Variant pp_tp = pp;
  pp_tp.layout.tp = 2;
  EXPECT_NE(problem(pp_tp, ok).find("two stages alone"), std::string::npos) << problem(pp_tp, ok);
  Variant pp4 = pp;
  pp4.layout.pp = 4;
  RealLayoutEnv four = ok;
  four.world = four.local_ranks = four.devices = 4;
  EXPECT_NE(problem(pp4, four).find("two stages alone"), std::string::npos);
  Variant pp_moe = pp;
  pp_moe.model = model_preset("qwen3-30b-a3b");
  EXPECT_EQ(problem(pp_moe, ok), "");
  Variant pp_spec = pp;
  pp_spec.policy.spec.method = SpecMethod::kChain;
  EXPECT_NE(problem(pp_spec, ok).find("speculative decoding with pipeline parallelism"),
            std::string::npos);
  Variant pp_open = pp;
  pp_open.workload.arrival_rate_per_s = 5;
  EXPECT_NE(problem(pp_open, ok).find("closed loop"), std::string::npos);
  Variant dp = v;
  dp.layout.tp = 1;
  dp.layout.dp = 2;
  EXPECT_NE(problem(dp, ok).find("tensor parallelism only"), std::string::npos);
  // Speculative decoding of a dense model under TP runs (its draft layer sharded); early exit
  // of device-decided drafts does not (conditional graph nodes around all-reduces).
  Variant spec = v;
  spec.policy.spec.method = SpecMethod::kChain;
  EXPECT_EQ(problem(spec, ok), "");
  Variant conf = v;
  conf.policy.spec.method = SpecMethod::kConfidence;
  conf.policy.spec.mode = DraftMode::kDevice;
  EXPECT_NE(problem(conf, ok).find("set policies.spec.early_exit: false"), std::string::npos)
      << problem(conf, ok);
  conf.policy.spec.mode = DraftMode::kHostBlocking;
  EXPECT_NE(problem(conf, ok).find("early_exit"), std::string::npos);
  conf.policy.spec.early_exit = false;
  EXPECT_EQ(problem(conf, ok), "");
  conf.policy.spec.early_exit = true;
  conf.policy.spec.mode = DraftMode::kHostLate;  // the host decides: early exit never applies
  EXPECT_EQ(problem(conf, ok), "");
  Variant vocab = v;
  vocab.layout.vocab_parallel = true;
  EXPECT_NE(problem(vocab, ok).find("give layout.vocab_parallel: false"), std::string::npos)
      << problem(vocab, ok);
  Variant open = v;
  open.workload.arrival_rate_per_s = 5;
  EXPECT_NE(problem(open, ok).find("closed loop"), std::string::npos);
  Variant single = v;
  single.layout.tp = 1;
  EXPECT_EQ(problem(single, one), "");
  // Expert parallelism: ep = tp on an MoE model runs; ep on a dense model, MoE without ep = tp,
  // ep != tp, experts not dividing into ep blocks are refused.
  Variant moe = v;
  moe.model = model_preset("qwen3-30b-a3b");
  moe.layout.ep = 2;
  EXPECT_EQ(problem(moe, ok), "");
  EXPECT_NE(problem(moe, one).find("mpirun -np 2"), std::string::npos) << problem(moe, one);
  Variant dense_ep = v;
  dense_ep.model = model_preset("llama-3-8b");
  dense_ep.layout.ep = 2;
  EXPECT_NE(problem(dense_ep, ok).find("on the dense model"), std::string::npos)
      << problem(dense_ep, ok);
  Variant moe_tp = moe;
  moe_tp.layout.ep = 1;
  EXPECT_NE(problem(moe_tp, ok).find("expert parallelism only"), std::string::npos)
      << problem(moe_tp, ok);
  Variant ep4 = moe;
  ep4.layout.ep = 4;
  EXPECT_NE(problem(ep4, ok).find("tensor parallelism only"), std::string::npos)
      << problem(ep4, ok);
  Variant odd = moe;
  for (LayerSpec& l : odd.model.layers) l.mlp.num_experts = 130;
  odd.layout.tp = odd.layout.ep = 4;
  EXPECT_NE(problem(odd, ok).find("130 routed experts do not divide into 4"), std::string::npos)
      << problem(odd, ok);
  // Speculative decoding of an MoE model under EP2 (its draft layer an MoE layer) runs.
  Variant moe_spec = moe;
  moe_spec.policy.spec.method = SpecMethod::kChain;
  EXPECT_EQ(problem(moe_spec, ok), "");
  // Verify widths: Qwen3-30B-A3B (8 query heads per KV head) verifies at most 8 positions, so 7
  // drafts run and 8 are refused up front, saying what to write; Llama-3-8B (group 4) takes 15.
  SpecSpec device_spec;
  device_spec.method = SpecMethod::kConfidence;
  device_spec.mode = DraftMode::kDevice;
  device_spec.max_steps = 7;
  moe_spec.policy.spec = device_spec;
  EXPECT_NO_THROW(check_real_spec_width(moe_spec));
  moe_spec.policy.spec.max_steps = 8;
  try {
    check_real_spec_width(moe_spec);
    ADD_FAILURE() << "8 drafts of Qwen3-30B-A3B accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("verifies 9 positions per request, more than the "
                                         "runtime's 8 for model qwen3-30b-a3b"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("draft at most 7"), std::string::npos) << e.what();
  }
  Variant dense_spec = v;
  dense_spec.model = model_preset("llama-3-8b");
  dense_spec.policy.spec = device_spec;
  dense_spec.policy.spec.max_steps = 15;
  EXPECT_NO_THROW(check_real_spec_width(dense_spec));
}

// One GPU: tp = 1 through the tensor-parallel path (sliced init, an NCCL all-reduce of one rank
// after every o_proj and down_proj, in prefill and inside the graphs) gives the plain engine's
// weights and tokens bit for bit.
TEST(TensorParallel, OneRankPathEqualsPlainEngine) {
  SKIP_WITHOUT_GPU();
  const std::unique_ptr<Communicator> comm =
      Communicator::create(Communicator::new_unique_id(), 0, 1);
  const ModelSpec spec = tiny_runtime_spec();
  const LlamaConfig config = llama_config_from_spec(spec);
  EngineOptions eo;
  eo.max_slots = 4;
  eo.capacity_tokens = 256;
  auto plain = Engine::create_synthetic(config, 7, eo);
  eo.tp = TensorParallel{0, 1, comm.get()};
  auto tp1 = Engine::create_synthetic(config, 7, eo);
  for (const WeightDesc& w : llama_weight_list(config))
    EXPECT_EQ(plain->download_weight(w.name), tp1->download_weight(w.name)) << w.name;
  for (GraphMode mode : {GraphMode::kEager, GraphMode::kCudaGraph, GraphMode::kCudaGraphPdl}) {
    const auto a = greedy(*plain, spec, workload(37, 48, 3), HostSchedule::kRunahead, mode);
    const auto b = greedy(*tp1, spec, workload(37, 48, 3), HostSchedule::kRunahead, mode);
    EXPECT_EQ(a, b) << "graph mode " << int(mode);
  }
}

// A shard measured alone with collective stubs (calibrate's collective_break pass): an empty
// non-PDL kernel at each all-reduce position changes no data, so the shard's greedy tokens equal
// those of the same shard without them in every graph mode, and its decode graph names the
// positions (2 per layer: after o_proj and after the MLP). Stubs without tp.size > 1, or with a
// communicator, are refused.
TEST(TensorParallel, CollectiveStubsChangeNoTokens) {
  SKIP_WITHOUT_GPU();
  const ModelSpec spec = tiny_runtime_spec();
  const LlamaConfig full = llama_config_from_spec(spec);
  const LlamaConfig shard = runtime::tp_shard_config(full, 0, 2);
  EngineOptions eo;
  eo.max_slots = 4;
  eo.capacity_tokens = 256;
  eo.tp.size = 2;
  auto plain = Engine::create_synthetic(shard, 7, eo);
  eo.collective_stubs = true;
  auto stubbed = Engine::create_synthetic(shard, 7, eo);
  for (GraphMode mode : {GraphMode::kEager, GraphMode::kCudaGraph, GraphMode::kCudaGraphPdl}) {
    const auto a = greedy(*plain, spec, workload(37, 48, 3), HostSchedule::kRunahead, mode);
    const auto b = greedy(*stubbed, spec, workload(37, 48, 3), HostSchedule::kRunahead, mode);
    EXPECT_EQ(a, b) << "graph mode " << int(mode);
  }
  plain->prepare(GraphMode::kCudaGraph, 1);
  stubbed->prepare(GraphMode::kCudaGraph, 1);
  int64_t positions = 0;
  for (const char* name : stubbed->decode_node_names(1)) positions += group_collective_name(name);
  EXPECT_EQ(positions, 2 * shard.layers);
  EXPECT_EQ(plain->decode_node_names(1).size() + size_t(positions),
            stubbed->decode_node_names(1).size());
  eo.tp.size = 1;
  EXPECT_THROW(Engine::create_synthetic(full, 7, eo), ConfigError);
}

// The speculative policies a TP engine runs: chain(5), and confidence-scheduled drafts decided on
// the device (without early exit) and late on the host.
std::vector<std::pair<const char*, SpecSpec>> tp_spec_policies() {
  SpecSpec chain5;
  chain5.method = SpecMethod::kChain;
  chain5.steps = 5;
  chain5.draft_tokens = 6;
  SpecSpec device;
  device.method = SpecMethod::kConfidence;
  device.mode = DraftMode::kDevice;
  device.threshold = 0.5;
  device.max_steps = 8;
  device.early_exit = false;
  SpecSpec late = device;
  late.mode = DraftMode::kHostLate;
  return {{"chain(5)", chain5}, {"confidence/device", device}, {"confidence/host_late", late}};
}

// One GPU: speculative decoding through the tensor-parallel path (draft module sliced by
// tp_slice, its layer's two all-reduces of one rank): the draft weights are the plain engine's
// bit for bit, and greedy speculative output equals plain greedy output (speculation is lossless
// under greedy acceptance). Early exit is refused under TP with a message saying so.
TEST(TensorParallel, OneRankSpeculativeEqualsPlainGreedy) {
  SKIP_WITHOUT_GPU();
  const std::unique_ptr<Communicator> comm =
      Communicator::create(Communicator::new_unique_id(), 0, 1);
  // Dense, and MoE with a shared expert (the draft layer an MoE layer, EP1).
  for (const ModelSpec& spec : {tiny_runtime_spec(), tiny_moe_runtime_spec(true)}) {
    const LlamaConfig config = llama_config_from_spec(spec);
    EngineOptions eo;
    eo.max_slots = 2;
    eo.capacity_tokens = 512;
    eo.draft = true;
    auto plain = Engine::create_synthetic(config, 5, eo, 0.85);
    eo.tp = TensorParallel{0, 1, comm.get()};
    auto tp1 = Engine::create_synthetic(config, 5, eo, 0.85);
    for (const WeightDesc& w : synthetic_weight_list(config, true, 0.85))
      EXPECT_EQ(plain->download_weight(w.name), tp1->download_weight(w.name))
          << spec.name << " " << w.name;
    const WorkloadSpec w = workload(37, 200, 2);
    const auto ref = greedy(*plain, spec, w, HostSchedule::kRunahead, GraphMode::kCudaGraphPdl);
    for (const auto& [label, policy] : tp_spec_policies()) {
      double accept = 0;
      EXPECT_EQ(
          greedy(*tp1, spec, w, HostSchedule::kRunahead, GraphMode::kCudaGraphPdl, policy, &accept),
          ref)
          << spec.name << " " << label;
      EXPECT_GT(accept, 1.0) << spec.name << " " << label;
      std::printf("%s TP1-with-communicator %-22s accept length %.3f\n", spec.name.c_str(), label,
                  accept);
    }
    eo.draft_early_exit = true;
    try {
      Engine::create_synthetic(config, 5, eo, 0.85);
      ADD_FAILURE() << spec.name << ": early exit under tensor parallelism was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("set early_exit: false"), std::string::npos) << e.what();
    }
  }
}

// Two ranks, the tiny model with its draft module: for each speculative policy the ranks agree,
// and the tokens equal the same engines' plain greedy tokens (lossless speculation).
TEST(TensorParallel, TinyTwoRanksSpeculativeEqualsPlainGreedy) {
  SKIP_WITHOUT_RANKS(2);
  Communicator& comm = runtime::tp_world_communicator();
  // Dense TP2, and TP2-EP2 of the MoE model with a shared expert (each rank's draft layer holds
  // its 8 experts and half the shared expert, summed by the draft step's second all-reduce).
  for (const ModelSpec& spec : {tiny_runtime_spec(), tiny_moe_runtime_spec(true)}) {
    const LlamaConfig config = llama_config_from_spec(spec);
    EngineOptions eo;
    eo.max_slots = 2;
    eo.capacity_tokens = 512;
    eo.draft = true;
    eo.tp = runtime::tp_world(2);
    auto engine = Engine::create_synthetic(config, 5, eo, 0.85);
    const WorkloadSpec w = workload(37, 200, 2);
    const auto ref = greedy(*engine, spec, w, HostSchedule::kRunahead, GraphMode::kCudaGraphPdl);
    for (const auto& [label, policy] : tp_spec_policies()) {
      double accept = 0;
      const auto tokens = greedy(*engine, spec, w, HostSchedule::kRunahead,
                                 GraphMode::kCudaGraphPdl, policy, &accept);
      EXPECT_EQ(tokens, ref) << spec.name << " " << label;
      const auto ranks = gather_tokens(comm, flat(tokens));
      EXPECT_EQ(ranks[0], ranks[1])
          << spec.name << " " << label << ": the ranks committed different tokens";
      EXPECT_GT(accept, 1.0) << spec.name << " " << label;
      std::printf("%s TP2 rank %d %-22s accept length %.3f\n", spec.name.c_str(), comm.rank(),
                  label, accept);
    }
  }
}

// Two ranks, the tiny model: the ranks' tokens agree, and the TP2 tokens match the CPU
// reference of the full model teacher-forced (a different pick only as a near-tie).
// The CPU reference's greedy walk beside `tokens` (prompt: request 0 of prompt seed 1, 37
// tokens): every differing token must be a near-tie (logit gap < 0.02); prints how many matched
// before the first difference. Returns the number of near-ties.
int cpu_near_ties(const LlamaConfig& config, uint64_t seed, const std::vector<int32_t>& tokens,
                  const std::string& what) {
  testing::CpuLlama cpu(config, seed);
  std::vector<int32_t> prompt;
  for (int32_t t = 0; t < 37; ++t)
    prompt.push_back(RealBackend::prompt_token(1, 0, t, config.vocab));
  std::vector<float> logits = cpu.prefill(prompt);
  int ties = 0, exact = -1;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t want = cpu.argmax(logits), got = tokens[i];
    if (got != want) {
      if (exact < 0) exact = int(i);
      ++ties;
      EXPECT_LT(logits[size_t(want)] - logits[size_t(got)], 0.02f) << "token " << i;
    }
    logits = cpu.decode(got);
  }
  if (exact < 0) exact = int(tokens.size());
  std::printf("%s: %d of %zu tokens equal the CPU reference before any difference, %d near-ties\n",
              what.c_str(), exact, tokens.size(), ties);
  return ties;
}

TEST(TensorParallel, TinyTwoRanksAgreeAndMatchCpuReference) {
  SKIP_WITHOUT_RANKS(2);
  Communicator& comm = runtime::tp_world_communicator();
  const ModelSpec spec = tiny_runtime_spec();
  const LlamaConfig config = llama_config_from_spec(spec);
  EngineOptions eo;
  eo.max_slots = 4;
  eo.capacity_tokens = 256;
  eo.tp = runtime::tp_world(2);
  auto engine = Engine::create_synthetic(config, 7, eo);
  EXPECT_EQ(engine->config().q_heads, 2);
  const auto tokens =
      greedy(*engine, spec, workload(37, 48, 1), HostSchedule::kRunahead, GraphMode::kCudaGraphPdl);
  ASSERT_EQ(tokens[0].size(), 48u);
  const auto ranks = gather_tokens(comm, tokens[0]);
  EXPECT_EQ(ranks[0], ranks[1]) << "the ranks sampled different tokens";
  EXPECT_LE(cpu_near_ties(config, 7, tokens[0], "tiny TP2 rank " + std::to_string(comm.rank())), 1);
}

// Two ranks, Llama-3-8B shape, 256 greedy tokens at batch 1 (run-ahead, graphs with PDL) and
// 4 concurrent requests: the ranks agree; against TP1 on one GPU the agreement rate and the first
// divergence are printed (bf16 rounding of the two partial sums differs from one fp32-accumulated
// projection, so a near-tie can flip, and after a flip the sequences part).
// Rank 0 only, after the sharded run: the same workload on one GPU (when `free_gb` are free)
// and the greedy agreement of the first request's `n` tokens printed; the prefill's token must
// match (later tokens may diverge: the all-reduce changes the bf16 summation order).
// draft_fidelity: the sharded engine's (it scales the target's synthetic weights too; -1: none).
void compare_with_one_gpu(const LlamaConfig& config, const ModelSpec& spec, const EngineOptions& eo,
                          const WorkloadSpec& one, const std::vector<int32_t>& sharded, size_t n,
                          size_t free_gb, const char* what, double draft_fidelity = -1) {
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  if (free_bytes < (free_gb << 30)) GTEST_SKIP() << "one GPU needs " << free_gb << " GB free";
  auto single = Engine::create_synthetic(config, 1, eo, draft_fidelity);
  const auto ref = greedy(*single, spec, one, HostSchedule::kRunahead, GraphMode::kCudaGraphPdl);
  ASSERT_GE(sharded.size(), n);
  int same = 0, first = -1;
  for (size_t i = 0; i < n; ++i) {
    if (ref[0][i] == sharded[i])
      ++same;
    else if (first < 0)
      first = int(i);
  }
  std::printf(
      "%s vs one GPU, %zu greedy tokens at batch 1: %s; %d of %zu positions equal "
      "(agreement %.3f)\n",
      what, n,
      first < 0 ? "identical"
                : ("first divergence at token " + std::to_string(first) + " (one GPU " +
                   std::to_string(ref[0][size_t(first)]) + ", sharded " +
                   std::to_string(sharded[size_t(first)]) + ")")
                      .c_str(),
      same, n, same / double(n));
  EXPECT_EQ(ref[0][0], sharded[0]) << "the prefill's token differs";
}

TEST(TensorParallel, Llama8BTwoRanksAgainstOneGpu) {
  SKIP_WITHOUT_RANKS(2);
  Communicator& comm = runtime::tp_world_communicator();
  const ModelSpec& spec = model_preset("llama-3-8b");
  const LlamaConfig config = llama_config_from_spec(spec);
  EngineOptions eo;
  eo.max_slots = 4;
  eo.capacity_tokens = 512;
  const WorkloadSpec one = workload(128, 256, 1), four = workload(128, 64, 4);
  std::vector<std::vector<int32_t>> tp2_one, tp2_four;
  {
    EngineOptions o = eo;
    o.tp = runtime::tp_world(2);
    auto engine = Engine::create_synthetic(config, 1, o);
    tp2_one = greedy(*engine, spec, one, HostSchedule::kRunahead, GraphMode::kCudaGraphPdl);
    tp2_four = greedy(*engine, spec, four, HostSchedule::kRunahead, GraphMode::kCudaGraphPdl);
    const auto lock = greedy(*engine, spec, one, HostSchedule::kLockstep, GraphMode::kEager);
    EXPECT_EQ(lock, tp2_one) << "TP2 eager lockstep vs graphs with PDL run-ahead";
  }
  ASSERT_EQ(tp2_one[0].size(), 256u);
  const auto ranks = gather_tokens(comm, flat(tp2_one));
  EXPECT_EQ(ranks[0], ranks[1]) << "the ranks sampled different tokens (batch 1)";
  const auto ranks4 = gather_tokens(comm, flat(tp2_four));
  EXPECT_EQ(ranks4[0], ranks4[1]) << "the ranks sampled different tokens (4 requests)";
  if (comm.rank() != 0) return;
  compare_with_one_gpu(config, spec, eo, one, tp2_one[0], 256, 24, "8B TP2");
}

// One GPU: expert parallelism at tp = 1 through the same path (tp_shard_config's expert block of
// all 16 experts, the sliced init with expert ownership, the NCCL all-reduce of one rank after
// every MoE FFN, in prefill and inside the graphs) gives the plain MoE engine's weights and
// tokens bit for bit, with and without a shared expert.
TEST(ExpertParallel, OneRankPathEqualsPlainMoeEngine) {
  SKIP_WITHOUT_GPU();
  const std::unique_ptr<Communicator> comm =
      Communicator::create(Communicator::new_unique_id(), 0, 1);
  for (bool shared : {true, false}) {
    const ModelSpec spec = tiny_moe_runtime_spec(shared);
    const LlamaConfig config = llama_config_from_spec(spec);
    EngineOptions eo;
    eo.max_slots = 4;
    eo.capacity_tokens = 256;
    auto plain = Engine::create_synthetic(config, 25, eo);
    eo.tp = TensorParallel{0, 1, comm.get()};
    auto ep1 = Engine::create_synthetic(config, 25, eo);
    EXPECT_EQ(ep1->config().local_experts(), config.num_experts);
    EXPECT_EQ(ep1->weight_bytes(), plain->weight_bytes());
    for (const WeightDesc& w : llama_weight_list(config))
      EXPECT_EQ(plain->download_weight(w.name), ep1->download_weight(w.name)) << w.name;
    for (GraphMode mode : {GraphMode::kEager, GraphMode::kCudaGraph, GraphMode::kCudaGraphPdl}) {
      const auto a = greedy(*plain, spec, workload(37, 48, 3), HostSchedule::kRunahead, mode);
      const auto b = greedy(*ep1, spec, workload(37, 48, 3), HostSchedule::kRunahead, mode);
      EXPECT_EQ(a, b) << (shared ? "shared expert, " : "") << "graph mode " << int(mode);
    }
    // The moe_all_reduce node sits right after every MoE FFN in the decode forward (the
    // simulator's moe_all_reduce after the experts), and there is no other all-reduce but
    // attn_all_reduce.
    int moe = 0, reduce = 0, other = 0;
    const std::vector<const char*>& names = ep1->decode_node_names(3);
    ASSERT_FALSE(names.empty());
    for (size_t i = 0; i < names.size(); ++i) {
      if (std::string(names[i]) == "moe") {
        ++moe;
        ASSERT_LT(i + 1, names.size());
        EXPECT_EQ(std::string(names[i + 1]), "moe_all_reduce");
      }
      reduce += std::string(names[i]) == "moe_all_reduce";
      other += std::string(names[i]) == "mlp_all_reduce";
    }
    EXPECT_EQ(moe, config.layers);
    EXPECT_EQ(reduce, config.layers);
    EXPECT_EQ(other, 0);
  }
}

// Two ranks, TP2-EP2 of the tiny MoE model with a shared expert: each rank holds its 8 experts
// (the full tensors' bits) and half the shared expert, not the other rank's experts; the ranks'
// tokens agree, and match the CPU reference of the full model teacher-forced (a different pick
// only as a near-tie).
TEST(ExpertParallel, TinyMoeTwoRanksAgreeAndMatchCpuReference) {
  SKIP_WITHOUT_RANKS(2);
  Communicator& comm = runtime::tp_world_communicator();
  const ModelSpec spec = tiny_moe_runtime_spec(true);
  const LlamaConfig config = llama_config_from_spec(spec);
  EngineOptions eo;
  eo.max_slots = 4;
  eo.capacity_tokens = 256;
  eo.tp = runtime::tp_world(2);
  auto engine = Engine::create_synthetic(config, 25, eo);
  const int r = comm.rank();
  EXPECT_EQ(engine->config().expert_begin, 8 * r);
  EXPECT_EQ(engine->config().local_experts(), 8);
  EXPECT_EQ(engine->config().shared_intermediate, 128);
  EXPECT_EQ(engine->weight_bytes(),
            plan_engine_memory(engine->config(), eo.max_slots, eo.capacity_tokens,
                               engine->options().max_prefill_tokens)
                .weight_bytes);
  for (const WeightDesc& w : llama_weight_list(config)) {
    const runtime::TensorSlice s = runtime::tp_slice(config, w, r, 2);
    if (s.empty()) {
      EXPECT_THROW(engine->download_weight(w.name), Error) << w.name;
      continue;
    }
    EXPECT_EQ(engine->download_weight(w.name), runtime::tp_shard_bits(config, w, 25, r, 2))
        << w.name;
  }
  const auto tokens =
      greedy(*engine, spec, workload(37, 48, 1), HostSchedule::kRunahead, GraphMode::kCudaGraphPdl);
  ASSERT_EQ(tokens[0].size(), 48u);
  const auto lock =
      greedy(*engine, spec, workload(37, 48, 1), HostSchedule::kLockstep, GraphMode::kEager);
  EXPECT_EQ(lock, tokens) << "TP2-EP2 eager lockstep vs graphs with PDL run-ahead";
  const auto ranks = gather_tokens(comm, tokens[0]);
  EXPECT_EQ(ranks[0], ranks[1]) << "the ranks sampled different tokens";
  const int ties =
      cpu_near_ties(config, 25, tokens[0], "tiny MoE TP2-EP2 rank " + std::to_string(r));
  EXPECT_LE(ties, 1);
}

// Two ranks, Qwen3-30B-A3B shape at TP2-EP2 (64 experts per rank), 128 greedy tokens at batch 1
// and 4 concurrent requests: the ranks agree; against the one-GPU engine (rank 0, 72 GB free
// needed) the agreement and first divergence are printed (the layer output is two bf16 partial
// sums added by the all-reduce instead of one fp32 sum, so a near-tie can flip); only the
// prefill's token is asserted equal.
TEST(ExpertParallel, Qwen3TwoRanksAgainstOneGpu) {
  SKIP_WITHOUT_RANKS(2);
  Communicator& comm = runtime::tp_world_communicator();
  const ModelSpec& spec = model_preset("qwen3-30b-a3b");
  const LlamaConfig config = llama_config_from_spec(spec);
  EngineOptions eo;
  eo.max_slots = 4;
  eo.capacity_tokens = 512;
  const WorkloadSpec one = workload(128, 128, 1), four = workload(128, 32, 4);
  std::vector<std::vector<int32_t>> ep_one, ep_four;
  {
    EngineOptions o = eo;
    o.tp = runtime::tp_world(2);
    auto engine = Engine::create_synthetic(config, 1, o);
    EXPECT_EQ(engine->config().expert_begin, 64 * comm.rank());
    ep_one = greedy(*engine, spec, one, HostSchedule::kRunahead, GraphMode::kCudaGraphPdl);
    ep_four = greedy(*engine, spec, four, HostSchedule::kRunahead, GraphMode::kCudaGraphPdl);
    const auto lock = greedy(*engine, spec, one, HostSchedule::kLockstep, GraphMode::kEager);
    EXPECT_EQ(lock, ep_one) << "TP2-EP2 eager lockstep vs graphs with PDL run-ahead";
  }
  ASSERT_EQ(ep_one[0].size(), 128u);
  const auto ranks = gather_tokens(comm, flat(ep_one));
  EXPECT_EQ(ranks[0], ranks[1]) << "the ranks sampled different tokens (batch 1)";
  const auto ranks4 = gather_tokens(comm, flat(ep_four));
  EXPECT_EQ(ranks4[0], ranks4[1]) << "the ranks sampled different tokens (4 requests)";
  if (comm.rank() != 0) return;
  compare_with_one_gpu(config, spec, eo, one, ep_one[0], 128, 72, "qwen3-30b-a3b TP2-EP2");
}

// Four ranks (issue 8's layout), Qwen3-30B-A3B at TP4-EP4 (8 q heads, 1 KV head and 32 experts
// per rank) with its MoE draft layer: 128 greedy tokens at batch 1, the ranks agree, eager
// lockstep equals graphs with PDL run-ahead, and chain(5) and confidence-on-the-device
// speculation commit the plain greedy tokens (lossless); against the one-GPU engine (rank 0)
// the agreement is printed and the prefill's token asserted, as at two ranks.
TEST(ExpertParallel, Qwen3FourRanksSpeculativeAndAgainstOneGpu) {
  SKIP_WITHOUT_RANKS(4);
  Communicator& comm = runtime::tp_world_communicator();
  const ModelSpec& spec = model_preset("qwen3-30b-a3b");
  const LlamaConfig config = llama_config_from_spec(spec);
  EngineOptions eo;
  eo.max_slots = 1;
  eo.capacity_tokens = 512;
  const WorkloadSpec one = workload(128, 128, 1);
  SpecSpec chain5;
  chain5.method = SpecMethod::kChain;
  chain5.steps = 5;
  chain5.draft_tokens = 6;
  SpecSpec device;  // at most 7 drafts: Qwen3's verify width (GQA group 8 x 8 positions)
  device.method = SpecMethod::kConfidence;
  device.mode = DraftMode::kDevice;
  device.threshold = 0.2;
  device.max_steps = 7;
  device.early_exit = false;
  std::vector<std::vector<int32_t>> plain;
  {
    EngineOptions o = eo;
    o.tp = runtime::tp_world(4);
    o.draft = true;
    auto engine = Engine::create_synthetic(config, 1, o, 0.55);
    EXPECT_EQ(engine->config().expert_begin, 32 * comm.rank());
    EXPECT_EQ(engine->config().kv_heads, 1);
    plain = greedy(*engine, spec, one, HostSchedule::kRunahead, GraphMode::kCudaGraphPdl);
    const auto lock = greedy(*engine, spec, one, HostSchedule::kLockstep, GraphMode::kEager);
    EXPECT_EQ(lock, plain) << "TP4-EP4 eager lockstep vs graphs with PDL run-ahead";
    for (const auto& [label, policy] :
         {std::pair<const char*, SpecSpec>{"chain(5)", chain5}, {"confidence/device", device}}) {
      double accept = 0;
      const auto tokens = greedy(*engine, spec, one, HostSchedule::kRunahead,
                                 GraphMode::kCudaGraphPdl, policy, &accept);
      EXPECT_EQ(tokens, plain) << label << ": speculation changed the greedy tokens";
      const auto ranks = gather_tokens(comm, flat(tokens));
      for (int r = 1; r < comm.size(); ++r)
        EXPECT_EQ(ranks[0], ranks[size_t(r)]) << label << ": rank " << r << " differs";
      EXPECT_GT(accept, 1.0) << label;
      std::printf("qwen3-30b-a3b TP4-EP4 rank %d %-18s accept length %.3f\n", comm.rank(), label,
                  accept);
    }
  }
  ASSERT_EQ(plain[0].size(), 128u);
  const auto ranks = gather_tokens(comm, flat(plain));
  for (int r = 1; r < comm.size(); ++r)
    EXPECT_EQ(ranks[0], ranks[size_t(r)]) << "rank " << r << " sampled different tokens";
  if (comm.rank() != 0) return;
  compare_with_one_gpu(config, spec, eo, one, plain[0], 128, 72, "qwen3-30b-a3b TP4-EP4", 0.55);
}

// ---------------------------------------------------------------------------------------------
// Pipeline parallelism (runtime/pipeline_parallel.h): no sum is split across ranks, so a pipeline
// must give one GPU's tokens exactly.

// One GPU: a pipeline of one stage over a one-rank communicator (create_synthetic_pp: the
// stage's init from the full model's list; no hand-offs) is the plain engine, weights and tokens.
TEST(PipelineParallel, OneStageEqualsPlainEngine) {
  SKIP_WITHOUT_GPU();
  const std::unique_ptr<Communicator> comm =
      Communicator::create(Communicator::new_unique_id(), 0, 1);
  const ModelSpec spec = tiny_runtime_spec();
  const LlamaConfig config = llama_config_from_spec(spec);
  EngineOptions eo;
  eo.max_slots = 4;
  eo.capacity_tokens = 256;
  auto plain = Engine::create_synthetic(config, 7, eo);
  eo.pp = runtime::PipelineParallel{0, 1, comm.get()};
  auto pp1 = Engine::create_synthetic(config, 7, eo);
  EXPECT_EQ(pp1->weight_bytes(), plain->weight_bytes());
  for (const WeightDesc& w : llama_weight_list(config))
    EXPECT_EQ(plain->download_weight(w.name), pp1->download_weight(w.name)) << w.name;
  for (GraphMode mode : {GraphMode::kEager, GraphMode::kCudaGraph, GraphMode::kCudaGraphPdl}) {
    const auto a = greedy(*plain, spec, workload(37, 48, 3), HostSchedule::kRunahead, mode);
    const auto b = greedy(*pp1, spec, workload(37, 48, 3), HostSchedule::kRunahead, mode);
    EXPECT_EQ(a, b) << "graph mode " << int(mode);
  }
}

// Stage `stage` of 2 of `full`: its config is pp_stage_config's, its weight allocation its memory
// plan's, and (check_bits: small models) it holds exactly its tensors, with the bits of the
// model's synthetic init.
void expect_stage(const Engine& engine, const LlamaConfig& full, uint64_t seed, int stage,
                  bool check_bits) {
  const LlamaConfig want = runtime::pp_stage_config(full, stage, 2);
  EXPECT_EQ(engine.config().first_layer, want.first_layer);
  EXPECT_EQ(engine.config().layers, want.layers);
  EXPECT_EQ(engine.weight_bytes(), plan_engine_memory(engine.config(), engine.options().max_slots,
                                                      engine.options().capacity_tokens,
                                                      engine.options().max_prefill_tokens)
                                       .weight_bytes);
  if (!check_bits) return;
  std::map<std::string, int64_t> held;
  for (const WeightDesc& w : llama_weight_list(want)) held[w.name] = 1;
  for (const WeightDesc& w : llama_weight_list(full)) {
    if (!held.count(w.name)) {
      EXPECT_THROW(engine.download_weight(w.name), Error) << w.name << " on stage " << stage;
      continue;
    }
    EXPECT_EQ(engine.download_weight(w.name), full_bits(w, seed)) << w.name;
  }
}

// The hand-offs a stage's decode launch makes (its node names starting with "pp_"), against the
// simulator's collectives of the same rank and layout (pipeline_step_kernels at one microbatch).
void expect_simulator_hand_offs(const Engine& engine, const ModelSpec& spec, int stage) {
  std::vector<std::string> engine_pp, sim_pp;
  for (const char* n : engine.decode_node_names(1))
    if (std::string(n).rfind("pp_", 0) == 0) engine_pp.push_back(n);
  LayoutSpec l;
  l.pp = 2;
  l.microbatches = 1;
  std::vector<StepShape> shapes;
  const int64_t ctx[] = {100};
  decode_microbatch_shapes(l, ctx, 1, shapes);
  StepKernels k;
  pipeline_step_kernels(spec, shapes, l, stage, k);
  for (const KernelDesc& d : k.kernels)
    if (d.coll != CollectiveKind::kNone) sim_pp.push_back(d.name);
  const std::vector<std::string> want = stage == 0
                                            ? std::vector<std::string>{"pp_send", "pp_ids_recv"}
                                            : std::vector<std::string>{"pp_recv", "pp_ids_send"};
  EXPECT_EQ(sim_pp, want) << "the simulator's hand-offs of stage " << stage;
  EXPECT_EQ(engine_pp, sim_pp) << "stage " << stage;
}

// Two ranks, the tiny model (dense, and MoE with a shared expert): stage r holds layer r (and
// the embedding on 0, the final norm and LM head on 1) with the one-GPU bits; greedy tokens over
// 48 steps at batch 1 and 3 in eager, graph and graph+PDL modes (and eager lockstep) are the
// same on both ranks and identical to the one-GPU engine's (each rank runs it on its own GPU).
TEST(PipelineParallel, TinyTwoStagesEqualOneGpu) {
  SKIP_WITHOUT_RANKS(2);
  Communicator& comm = runtime::tp_world_communicator();
  if (comm.size() != 2) GTEST_SKIP() << "written for 2 ranks";
  const int r = comm.rank();
  for (const bool moe : {false, true}) {
    const ModelSpec spec = moe ? tiny_moe_runtime_spec(true) : tiny_runtime_spec();
    const LlamaConfig config = llama_config_from_spec(spec);
    const char* what = moe ? "tiny MoE PP2" : "tiny PP2";
    EngineOptions eo;
    eo.max_slots = 4;
    eo.capacity_tokens = 256;
    struct Case {
      HostSchedule schedule;
      GraphMode mode;
      int requests;
    };
    std::vector<Case> cases;
    for (GraphMode mode : {GraphMode::kEager, GraphMode::kCudaGraph, GraphMode::kCudaGraphPdl})
      for (int n : {1, 3}) cases.push_back({HostSchedule::kRunahead, mode, n});
    cases.push_back({HostSchedule::kLockstep, GraphMode::kEager, 3});
    std::vector<std::vector<std::vector<int32_t>>> staged;
    {
      EngineOptions o = eo;
      o.pp = runtime::pp_world(2);
      auto stage = Engine::create_synthetic(config, 7, o);
      expect_stage(*stage, config, 7, r, /*check_bits=*/true);
      for (const Case& c : cases)
        staged.push_back(greedy(*stage, spec, workload(37, 48, c.requests), c.schedule, c.mode));
      expect_simulator_hand_offs(*stage, spec, r);
    }
    auto single = Engine::create_synthetic(config, 7, eo);
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      ASSERT_EQ(staged[i].size(), size_t(c.requests));
      ASSERT_EQ(staged[i][0].size(), 48u);
      const auto ranks = gather_tokens(comm, flat(staged[i]));
      EXPECT_EQ(ranks[0], ranks[1])
          << what << ": the stages committed different tokens, case " << i;
      const auto ref = greedy(*single, spec, workload(37, 48, c.requests), c.schedule, c.mode);
      EXPECT_EQ(staged[i], ref) << what << " vs one GPU, graph mode " << int(c.mode) << ", "
                                << c.requests << " requests";
    }
    if (!HasFailure())
      std::printf("%s rank %d: %zu cases x 48 greedy tokens identical to one GPU\n", what, r,
                  cases.size());
  }
}

// Two ranks, Llama-3-8B shape: stage r holds layers [16 r, 16 r + 16) (the simulator's split);
// 128 greedy tokens at batch 1 and 32 for 4 concurrent requests (run-ahead, graphs with PDL; and
// batch 1 in eager lockstep) are the same on both ranks and identical to one GPU's (each rank
// runs the one-GPU engine on its own GPU after freeing its stage; 24 GB free needed).
TEST(PipelineParallel, Llama8BTwoStagesEqualOneGpu) {
  SKIP_WITHOUT_RANKS(2);
  Communicator& comm = runtime::tp_world_communicator();
  if (comm.size() != 2) GTEST_SKIP() << "written for 2 ranks";
  const ModelSpec& spec = model_preset("llama-3-8b");
  const LlamaConfig config = llama_config_from_spec(spec);
  EngineOptions eo;
  eo.max_slots = 4;
  eo.capacity_tokens = 512;
  const WorkloadSpec one = workload(128, 128, 1), four = workload(128, 32, 4);
  std::vector<std::vector<int32_t>> pp_one, pp_four;
  {
    EngineOptions o = eo;
    o.pp = runtime::pp_world(2);
    auto stage = Engine::create_synthetic(config, 1, o);
    expect_stage(*stage, config, 1, comm.rank(), /*check_bits=*/false);
    pp_one = greedy(*stage, spec, one, HostSchedule::kRunahead, GraphMode::kCudaGraphPdl);
    pp_four = greedy(*stage, spec, four, HostSchedule::kRunahead, GraphMode::kCudaGraphPdl);
    const auto lock = greedy(*stage, spec, one, HostSchedule::kLockstep, GraphMode::kEager);
    EXPECT_EQ(lock, pp_one) << "PP2 eager lockstep vs graphs with PDL run-ahead";
  }
  ASSERT_EQ(pp_one[0].size(), 128u);
  const auto ranks = gather_tokens(comm, flat(pp_one));
  EXPECT_EQ(ranks[0], ranks[1]) << "the stages committed different tokens (batch 1)";
  const auto ranks4 = gather_tokens(comm, flat(pp_four));
  EXPECT_EQ(ranks4[0], ranks4[1]) << "the stages committed different tokens (4 requests)";
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  if (free_bytes < (size_t{24} << 30)) GTEST_SKIP() << "one GPU needs 24 GB free";
  auto single = Engine::create_synthetic(config, 1, eo);
  const auto ref_one =
      greedy(*single, spec, one, HostSchedule::kRunahead, GraphMode::kCudaGraphPdl);
  const auto ref_four =
      greedy(*single, spec, four, HostSchedule::kRunahead, GraphMode::kCudaGraphPdl);
  int first = -1;
  for (size_t i = 0; i < pp_one[0].size() && first < 0; ++i)
    if (pp_one[0][i] != ref_one[0][i]) first = int(i);
  std::printf(
      "8B PP2 rank %d vs one GPU, 128 greedy tokens at batch 1: %s\n", comm.rank(),
      first < 0 ? "identical" : ("first divergence at token " + std::to_string(first)).c_str());
  EXPECT_EQ(pp_one, ref_one) << "PP2 vs one GPU, batch 1";
  EXPECT_EQ(pp_four, ref_four) << "PP2 vs one GPU, 4 requests";
}

// Ends the process when a test outlives `limit_s`, naming the rank and the phase it is stuck in:
// under mpirun the job then ends at once instead of at its wall-clock limit.
class Watchdog {
 public:
  explicit Watchdog(double limit_s) : limit_s_(limit_s), thread_([this] { watch(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  void phase(const char* p) { phase_.store(p); }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (done_cv_.wait_for(lock, std::chrono::duration<double>(limit_s_), [this] { return done_; }))
      return;
    std::fflush(stdout);
    std::fprintf(stderr, "rank %d: hung in \"%s\" (test past its %g s limit); exiting\n",
                 world_rank(), phase_.load(), limit_s_);
    std::fflush(stderr);
    std::_Exit(3);
  }
  const double limit_s_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::atomic<const char*> phase_{"start"};
  std::thread thread_;  // last: starts once the members above exist
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// True once `stream`'s work is done, false if it is still running after limit_s.
bool stream_drains(cudaStream_t stream, double limit_s) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q != cudaErrorNotReady) return q == cudaSuccess;
    if (seconds_since(start) > limit_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

struct DeviceFloats {
  explicit DeviceFloats(size_t n) { EXPECT_EQ(cudaMalloc(&p, n * 4), cudaSuccess); }
  ~DeviceFloats() { cudaFree(p); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* p = nullptr;
};

// Two ranks, a communicator of their own (3 s op deadline; the world communicator the other
// tests use is not touched until the end). Both enter one all-reduce, which completes (and makes
// NCCL's connections, so the next enqueue does not wait for the peer). Rank 1 then stays out of
// the next all-reduce while rank 0 enqueues it and synchronizes: rank 0 gets a CommError at the
// deadline naming the operation, the rank and the deadline, its communicators aborted. Rank 1
// waits for rank 0's report over MPI (bootstrap_world, with its own deadline: an abort that
// needed rank 1 would fail the test rather than hang it), then destroys its communicator, whose
// peer is gone (the finalize fails or times out, then abort). Last, both ranks all-reduce over
// the world communicator, which still works, and learn whether the other rank's part passed.
TEST(Comm, TwoRanksAllReduceWithoutRankOneEndsAtTheDeadline) {
  SKIP_WITHOUT_RANKS(2);
  if (world_size() != 2) GTEST_SKIP() << "written for 2 ranks";
  Watchdog watchdog(120);
  constexpr double kDeadline = 3;
  constexpr size_t kN = 1024;
  const std::string expected =
      "all-reduce without rank 1 on rank 0 of 2: did not complete within 3 s (a rank is missing "
      "or stuck; last enqueued: all_reduce_sum of 1024 elements); communicator aborted";
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  DeviceFloats send(kN), recv(kN);  // outlive the communicator: destroyed after it
  CommOptions o;
  o.join_timeout_s = 30;
  o.op_timeout_s = kDeadline;
  watchdog.phase("creating the test communicator");
  std::unique_ptr<Communicator> comm = Communicator::create_world(o);
  const int rank = comm->rank();
  ASSERT_EQ(rank, world_rank());

  watchdog.phase("the all-reduce both ranks enter");
  const std::vector<float> mine(kN, float(rank + 1));
  EXPECT_EQ(cudaMemcpy(send.p, mine.data(), kN * 4, cudaMemcpyHostToDevice), cudaSuccess);
  comm->all_reduce_sum(send.p, recv.p, kN, CommType::kF32, stream);
  comm->synchronize(stream, "all-reduce of both ranks");
  std::vector<float> sum(kN);
  EXPECT_EQ(cudaMemcpy(sum.data(), recv.p, kN * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(sum, std::vector<float>(kN, 3.0f)) << "1 + 2 on every element";

  std::string report;  // rank 0's outcome, carried to rank 1
  if (rank == 0) {
    watchdog.phase("rank 0: the all-reduce rank 1 stays out of");
    EXPECT_EQ(cudaMemset(recv.p, 0, kN * 4), cudaSuccess);
    const auto start = std::chrono::steady_clock::now();
    double enqueue_s = -1, error_s = -1;
    try {
      comm->all_reduce_sum(send.p, recv.p, kN, CommType::kF32, stream);
      enqueue_s = seconds_since(start);
      comm->synchronize(stream, "all-reduce without rank 1");
      report = "the all-reduce completed without rank 1";
    } catch (const CommError& e) {
      error_s = seconds_since(start);
      report = e.what();
    }
    std::printf("rank 0: enqueue %.4f s, CommError after %.3f s (deadline %g s): %s\n", enqueue_s,
                error_s, kDeadline, report.c_str());
    EXPECT_STREQ(report.c_str(), expected.c_str());
    EXPECT_GE(enqueue_s, 0.0) << "the enqueue threw";
    EXPECT_LT(enqueue_s, 1.0) << "the enqueue waited for rank 1";
    EXPECT_GE(error_s, kDeadline) << "the error came before the deadline";
    EXPECT_LT(error_s, kDeadline + 10) << "the abort after the deadline took too long";
    if (error_s >= 0) {
      // The abort stopped the kernel (it returns instead of waiting for rank 1) ...
      EXPECT_TRUE(stream_drains(stream, 10)) << "the aborted all-reduce still runs on the GPU";
      // ... and the communicator refuses further work instead of hanging in it.
      try {
        comm->all_reduce_sum(send.p, recv.p, kN, CommType::kF32, stream);
        ADD_FAILURE() << "an aborted communicator accepted an all-reduce";
      } catch (const CommError& e) {
        EXPECT_STREQ(e.what(), "all_reduce_sum of 1024 elements: the communicator was aborted");
      }
    }
    watchdog.phase("rank 0: reporting to rank 1");
    bootstrap_world([&] { return report; }, 15);
    watchdog.phase("rank 0: destroying its aborted communicator");
    const auto destroy = std::chrono::steady_clock::now();
    comm.reset();
    EXPECT_LT(seconds_since(destroy), 1.0) << "an aborted communicator has nothing to destroy";
  } else {
    watchdog.phase("rank 1: waiting for rank 0's report");
    try {
      report = bootstrap_world([] { return std::string(); }, 15);
    } catch (const CommError& e) {
      report = std::string("no report from rank 0: ") + e.what();
    }
    EXPECT_STREQ(report.c_str(), expected.c_str()) << "what rank 0 reported";
    watchdog.phase("rank 1: destroying its communicator, rank 0's aborted");
    const auto destroy = std::chrono::steady_clock::now();
    comm.reset();
    const double destroy_s = seconds_since(destroy);
    std::printf("rank 1: communicator destroyed in %.3f s (finalize deadline %g s)\n", destroy_s,
                kDeadline);
    EXPECT_LT(destroy_s, kDeadline + 10) << "the finalize deadline and abort took too long";
  }

  watchdog.phase("an all-reduce on the world communicator after the test one's abort");
  const auto passed = gather_tokens(runtime::tp_world_communicator(), {HasFailure() ? 0 : 1});
  EXPECT_EQ(passed[size_t(1 - rank)], std::vector<int32_t>{1})
      << "rank " << 1 - rank << "'s part failed (its log says why)";
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

}  // namespace
}  // namespace twinstep

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
#ifdef TWINSTEP_HAVE_MPI
  const bool mpi = twinstep::launched_ranks() > 1;
  if (mpi) MPI_Init(&argc, &argv);
#endif
  int rc = 0;
  try {
    // Under mpirun: this rank's GPU (the local rank) before anything touches CUDA. Too few
    // GPUs: the multi-rank tests skip (every rank sees the same count, so all skip alike).
    if (twinstep::world_size() > 1) {
      try {
        (void)twinstep::runtime::tp_world_communicator();
        twinstep::g_world_ready = true;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: multi-rank tests skip: %s\n", twinstep::world_rank(),
                     e.what());
      }
    }
    rc = RUN_ALL_TESTS();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", twinstep::world_rank(), e.what());
    rc = 1;
  }
  twinstep::runtime::tp_release_world_communicator();
#ifdef TWINSTEP_HAVE_MPI
  if (mpi) {
    int worst = 0;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    rc = worst;
    MPI_Finalize();
  }
#endif
  return rc;
}
