// runtime/memory_plan: the engine's allocation arithmetic against hand-worked sizes, and the
// out-of-memory message with injected free/total figures.
#include "runtime/memory_plan.h"

#include <gtest/gtest.h>

#include "policies/model_spec.h"

namespace twinstep {
namespace {

LlamaConfig llama3_70b() {
  LlamaConfig c;
  c.hidden = 8192;
  c.intermediate = 28672;
  c.vocab = 128256;
  c.layers = 80;
  c.q_heads = 64;
  c.kv_heads = 8;
  c.head_dim = 128;
  return c;
}

TEST(MemoryPlan, Llama3_70bWeightsAndKvByHand) {
  const EngineMemoryPlan p = plan_engine_memory(llama3_70b(), 4, 8192, 16384);
  // 70,553,706,496 parameters (every tensor already a multiple of 128 elements): embed and
  // lm_head 128256 x 8192 each, final norm 8192, and per layer 2 norms of 8192, qkv
  // (8192 + 2 x 1024) x 8192, o 8192 x 8192, gate_up 2 x 28672 x 8192, down 8192 x 28672.
  EXPECT_EQ(p.weight_bytes, int64_t{141'107'412'992});
  // 320 KiB per token (80 layers x K,V x 8 heads x 128 x 2 bytes), 4 slots + padding x 8192.
  EXPECT_EQ(p.kv_slots, 5);
  EXPECT_EQ(p.capacity_tokens, 8192);
  EXPECT_EQ(p.kv_bytes, int64_t{5} * 8192 * 327'680);
  // Buffers: 16384 prefill rows x (4 x 8192 + 10240 + 2 x 8192 + 3 x 28672) bf16 activations,
  // last rows and output ring of 4 slots, attention partials 16384 x 64 heads x 520 bytes,
  // 32 MiB cuBLAS workspace, 256 MiB allowance.
  EXPECT_EQ(p.buffer_bytes, int64_t{2} * 16384 * 145'408 + 2 * 2 * 4 * 8192 + 64 * 4 * 8 +
                                int64_t{16384} * 64 * 520 + (int64_t{32} << 20) +
                                (int64_t{256} << 20));
  EXPECT_EQ(p.total_bytes(), int64_t{160'141'297'664});
}

TEST(MemoryPlan, TinyModelWeightsPaddedAndTied) {
  LlamaConfig c = llama_config_from_spec(tiny_runtime_spec());
  // 5,769,728 elements: embed and lm_head 1024 x 512, final norm 512, and per layer (x2) norms
  // 2 x 512, qkv 1024 x 512, o 512 x 512, gate_up 2048 x 512, down 512 x 1024.
  EXPECT_EQ(plan_engine_memory(c, 1, 64, 16).weight_bytes, 2 * 5'769'728);
  c.tie_embeddings = true;
  EXPECT_EQ(plan_engine_memory(c, 1, 64, 16).weight_bytes, 2 * (5'769'728 - 1024 * 512));
  // A tensor not a multiple of 128 elements is padded: hidden 520 (norm 520 -> 640 elements).
  LlamaConfig odd = c;
  odd.hidden = 520;
  odd.vocab = 128;
  odd.intermediate = 128;
  odd.layers = 1;
  odd.q_heads = 1;
  odd.kv_heads = 1;
  // embed 128 x 520 = 66560 (a multiple of 128), final norm 640, norms 2 x 640,
  // qkv 384 x 520 = 199680, o 520 x 128 = 66560, gate_up 256 x 520 = 133120, down 66560.
  EXPECT_EQ(plan_engine_memory(odd, 1, 64, 16).weight_bytes,
            2 * (66560 + 640 + 2 * 640 + 199680 + 66560 + 133120 + 66560));
}

TEST(MemoryPlan, DraftModuleAddsItsWeightsAndOneKvLayer) {
  const LlamaConfig c = llama_config_from_spec(tiny_runtime_spec());
  const EngineMemoryPlan plain = plan_engine_memory(c, 2, 64, 16);
  const EngineMemoryPlan spec = plan_engine_memory(c, 2, 64, 16, /*draft=*/true);
  // mtp.*: enorm, hnorm, layer norms (4 x 512), eh_proj 512 x 1024, q 512 x 512, k and v
  // 256 x 512, o 512 x 512, gate, up 1024 x 512 and down 512 x 1024.
  EXPECT_EQ(spec.weight_bytes - plain.weight_bytes,
            2 * (4 * 512 + 524288 + 262144 + 2 * 131072 + 262144 + 3 * 524288));
  // 2 layers -> 3 layers of K and V: 3 slots x 64 tokens x 2 x 2 heads x 128 x 2 bytes each.
  EXPECT_EQ(plain.kv_bytes, int64_t{3} * 64 * 2 * 2 * 2 * 128 * 2);
  EXPECT_EQ(spec.kv_bytes, int64_t{3} * 64 * 3 * 2 * 2 * 128 * 2);
}

TEST(MemoryPlan, ShortfallMessage) {
  const LlamaConfig c = llama3_70b();
  const EngineMemoryPlan p = plan_engine_memory(c, 4, 8192, 16384);
  EXPECT_EQ(describe_shortfall(p, c, "llama-3-70b", 0, 140'000'000'000, 150'000'000'000),
            "model llama-3-70b needs 149.1 GiB (weights 131.4 GiB, KV 12.5 GiB for 4 slots "
            "(+1 padding) x 8192 tokens, buffers 5.2 GiB) but GPU 0 has 130.4 GiB free of "
            "139.7 GiB");
  EXPECT_EQ(describe_shortfall(p, c, "", 3, 0, 0).substr(0, 52),
            "a model of 80 layers, hidden 8192, needs 149.1 GiB (");
  try {
    require_fits(p, c, "llama-3-70b", 0, 140'000'000'000, 150'000'000'000);
    FAIL() << "149.1 GiB fitted in 130.4 GiB";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(std::string(e.what()),
              describe_shortfall(p, c, "llama-3-70b", 0, 140'000'000'000, 150'000'000'000));
  }
  // Exactly enough free memory fits; one byte less does not.
  EXPECT_NO_THROW(require_fits(p, c, "m", 0, uint64_t(p.total_bytes()), uint64_t{1} << 40));
  EXPECT_THROW(require_fits(p, c, "m", 0, uint64_t(p.total_bytes()) - 1, uint64_t{1} << 40),
               OutOfMemoryError);
}

TEST(MemoryPlan, DescribeBytes) {
  EXPECT_EQ(describe_bytes(uint64_t{3} << 29), "1.50 GiB (1610612736 bytes)");
  EXPECT_EQ(describe_bytes(uint64_t{16} << 20), "16.0 MiB (16777216 bytes)");
}

}  // namespace
}  // namespace twinstep
