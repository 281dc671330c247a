// GPU faults with a message (docs/reliability.md): a model too big for the GPU is refused before
// anything is allocated, saying what it needs and what the GPU has; an engine that fits uses no
// more than its plan. Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "policies/model_spec.h"
#include "runtime/checkpoint.h"
#include "runtime/engine.h"
#include "runtime/memory_plan.h"

namespace twinstep {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Free device memory after the context exists (the first call creates it).
size_t free_now() {
  size_t free_bytes = 0, total_bytes = 0;
  EXPECT_EQ(cudaFree(nullptr), cudaSuccess);
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  return free_bytes;
}

TEST(GpuFaults, Llama70bOnOneGpuIsRefusedBeforeAllocating) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const LlamaConfig c = llama_config_from_spec(model_preset("llama-3-70b"));
  runtime::EngineOptions eo;
  eo.max_slots = 4;
  eo.capacity_tokens = 8192;
  const EngineMemoryPlan plan =
      plan_engine_memory(c, eo.max_slots, eo.capacity_tokens, eo.max_prefill_tokens);
  const size_t before = free_now();
  // 149.1 GiB (memory_plan_test.cc works it out by hand) > an H200's 139.7 GiB.
  if (uint64_t(plan.total_bytes()) <= before)
    GTEST_SKIP() << "this GPU has " << before << " bytes free: llama-3-70b with 4 x 8192 fits";
  int device = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  try {
    runtime::Engine::create_synthetic(c, 1, eo);
    FAIL() << "a 149 GiB engine was created";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    std::printf("refused: %s\n", msg.c_str());  // the log shows what the user sees
    const std::string expected_start =
        "a model of 80 layers, hidden 8192, needs 149.1 GiB (weights 131.4 GiB, KV 12.5 GiB for 4 "
        "slots (+1 padding) x 8192 tokens, buffers 5.2 GiB) but GPU " +
        std::to_string(device) + " has ";
    EXPECT_EQ(msg.substr(0, expected_start.size()), expected_start) << msg;
    EXPECT_NE(msg.find(" GiB free of "), std::string::npos) << msg;
  }
  // Nothing allocated, nothing left behind.
  EXPECT_EQ(free_now(), before);
}

TEST(GpuFaults, TinyEngineUsesNoMoreThanItsPlan) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const LlamaConfig c = llama_config_from_spec(tiny_runtime_spec());
  runtime::EngineOptions eo;
  eo.max_slots = 4;
  eo.capacity_tokens = 1024;
  const EngineMemoryPlan plan =
      plan_engine_memory(c, eo.max_slots, eo.capacity_tokens, eo.max_prefill_tokens);
  // Warm-up: the first engine loads the kernels' modules (lazy loading keeps them resident).
  runtime::Engine::create_synthetic(c, 1, eo).reset();
  const size_t before = free_now();
  {
    const auto engine = runtime::Engine::create_synthetic(c, 1, eo);
    EXPECT_EQ(engine->weight_bytes(), plan.weight_bytes);  // the same layout, byte for byte
    const size_t used = before - free_now();
    EXPECT_GE(int64_t(used), plan.weight_bytes + plan.kv_bytes);
    EXPECT_LE(int64_t(used), plan.total_bytes()) << "the plan under-estimates the engine";
  }
  EXPECT_EQ(free_now(), before);  // the engine frees everything it allocated
}

}  // namespace
}  // namespace twinstep
