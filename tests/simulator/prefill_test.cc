// Prefill pricing (issue #6, docs/calibration.md "Prefill"): the roofline beyond the rows the
// kernel fits were measured at, the physical floor under every fit, decode prices of the
// committed profile unchanged, prefill attention as the runtime's chunks read it, the profile's
// optional figures, and the fit of the prefill rates.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "policies/calibration_model.h"
#include "policies/calibration_profile.h"
#include "policies/hardware_spec.h"
#include "policies/model_spec.h"
#include "policies/step_kernels.h"
#include "simulator/calibration.h"
#include "simulator/cost_model.h"
#include "simulator/prefill_fit.h"
#include "tests/simulator/profile_text.h"

namespace twinstep {
namespace {

// Round figures: 4 TB/s streaming (4000 B/ns), a 1000 TFLOP/s peak (1e6 FLOP/ns), efficiency
// 0.5 (a rate of 5e5 FLOP/ns beyond the fits), fits held to 64 rows. One gemm class fit:
// narrow 3000 + 2.5e-4/B + 1e-7/FLOP, above 16.5 FLOP/B 4000 + 2.4e-4/B + 5e-8/FLOP.
HardwareSpec round_hw() {
  HardwareSpec hw = hardware_preset("h200");
  hw.stream_read_tbps = 4.0;
  hw.bf16_tflops = 1000;
  hw.flop_efficiency = 0.5;
  hw.kernel_fit_max_rows = 64;
  KernelFit& f = hw.kernel_fits[size_t(KernelClass::kGemm)];
  f.fitted = true;
  f.base_ns = 3000;
  f.ns_per_byte = 2.5e-4;
  f.ns_per_flop = 1e-7;
  f.split_intensity = 16.5;
  f.wide_base_ns = 4000;
  f.wide_ns_per_byte = 2.4e-4;
  f.wide_ns_per_flop = 5e-8;
  return hw;
}

// Llama-3-8B's gate_up projection (k = 4096, n = 28672, bf16) over `rows` rows.
KernelDesc gate_up(int64_t rows) {
  KernelDesc k{"gate_up_proj", KernelClass::kGemm, 4096LL * 28672 * 2 + rows * 4096 * 2,
               rows * 28672 * 2, 2 * rows * 4096 * 28672};
  k.rows = int32_t(rows);
  return k;
}

TEST(PrefillPricing, BigGemmBeyondTheFitsIsItsBasePlusTheRoofline) {
  const KernelDesc k = gate_up(8192);
  ASSERT_EQ(k.bytes_read + k.bytes_written, 771751936);
  ASSERT_EQ(k.flops, 1924145348608);
  HardwareSpec hw = round_hw();
  // bytes: 771751936 / 4000 = 192937.98 ns; FLOPs: 1924145348608 / 5e5 = 3848290.70 ns; the wide
  // base 4000 on top: 3852290.70.
  EXPECT_EQ(CostModel(hw).kernel_ns(k), 3852291);
  // The fit alone would charge 4000 + 771751936 · 2.4e-4 + 1924145348608 · 5e-8 = 285428 ns,
  // 6.7 PFLOP/s: faster than the peak.
  EXPECT_GT(CostModel(hw).kernel_ns(k), k.flops / 1'000'000);
  // A measured rate replaces peak × efficiency: 1924145348608 / 4e5 + 4000 = 4814363.37.
  hw.prefill_gemm_tflops = 400;
  EXPECT_EQ(CostModel(hw).kernel_ns(k), 4814363);
}

TEST(PrefillPricing, TheFitHoldsUpToItsRowsAndTheRooflineAbove) {
  const CostModel cost(round_hw());
  KernelDesc k = gate_up(64);
  ASSERT_EQ(k.bytes_read + k.bytes_written, 239075328);
  ASSERT_EQ(k.flops, 15032385536);
  // 64 rows, wide regime: 4000 + 239075328 · 2.4e-4 + 15032385536 · 5e-8 = 62129.70 (above the
  // floor max(59768.83, 15032.39)).
  EXPECT_EQ(cost.kernel_ns(k), 62130);
  // The same kernel counted as 65 rows: 4000 + max(59768.83, 15032385536 / 5e5 = 30064.77).
  k.rows = 65;
  EXPECT_EQ(cost.kernel_ns(k), 63769);
  EXPECT_EQ(cost.beyond_fit_base_ns(k), 4000.0);
  k.rows = 64;
  EXPECT_FALSE(cost.beyond_fit_base_ns(k).has_value());
}

TEST(PrefillPricing, NoFitIsFasterThanTheHardware) {
  HardwareSpec hw = round_hw();
  KernelFit& norm = hw.kernel_fits[size_t(KernelClass::kNorm)];
  norm.fitted = true;
  norm.base_ns = 2800;  // a decode norm: latency only, no byte term
  const CostModel cost(hw);
  // 16 rows, 1 GB: 1e9 / 4000 B/ns = 250000 ns, not 2800.
  KernelDesc n{"attn_norm", KernelClass::kNorm, 500'000'000, 500'000'000, 0};
  n.rows = 16;
  EXPECT_EQ(cost.kernel_ns(n), 250000);
  // A wide GEMM of 32 rows whose FLOP term is far above the peak: the fit's 4000 + 1e8 · 2.4e-4
  // + 1e12 · 5e-8 = 78000 ns against 1e12 FLOPs / 1e6 FLOP/ns = 1e6 ns.
  KernelDesc g{"qkv_proj", KernelClass::kGemm, 100'000'000, 0, 1'000'000'000'000};
  g.rows = 32;
  EXPECT_EQ(cost.kernel_ns(g), 1'000'000);
}

// Graph busy time of one decode-like step of `model` (tp 1 or rank 0 of the calibration layout
// of tp 2) priced with the committed profile.
int64_t committed_step_ns(const std::string& model, int32_t tp, int32_t batch, int32_t q,
                          int64_t ctx) {
  static const CalibrationProfile p = load_calibration_profile(
      std::string(TWINSTEP_SOURCE_DIR) + "/results/profiles/h200-calibrated.yaml");
  const ModelSpec& spec = model_preset(model);
  const LayoutSpec layout = tp == 1 ? LayoutSpec{} : calibration_layout(spec, tp);
  const CostModel cost(p.hw, kernel_fit_model(p.hw, model, tp));
  StepKernels sk;
  step_kernels(spec, decode_shape(batch, q, batch * ctx), layout, 0, sk);
  return cost.graph_cost(sk).busy_ns;
}

// The committed profile's decode prices for shapes inside what it measured, as its validation
// runs were compared with them (results/h200/validation_321e4f2.json): a pricing change that
// moves a decode price shows here (the prefill rates must not). Re-pinned with each new profile
// (9386db7's: Qwen3-30B-A3B's warp-owned MoE tiles, its 16-row step at 8K 16.58 -> 15.56 ms and
// its TP2-EP2 shard's 10.44 -> 9.88; Llama-3-8B +0.016 %, Llama-3.2-3B +0.16 %).
TEST(PrefillPricing, DecodeOfTheCommittedProfileIsUnchanged) {
  EXPECT_EQ(committed_step_ns("llama-3-8b", 1, 1, 1, 128), 4295737);
  EXPECT_EQ(committed_step_ns("llama-3-8b", 1, 16, 1, 8192), 8655412);
  EXPECT_EQ(committed_step_ns("llama-3-8b", 1, 64, 1, 8192), 21967211);
  EXPECT_EQ(committed_step_ns("llama-3-8b", 1, 4, 16, 8192), 6825355);  // verify, 64 rows
  EXPECT_EQ(committed_step_ns("llama-3.2-3b", 1, 32, 1, 8192), 9920680);
  EXPECT_EQ(committed_step_ns("qwen3-30b-a3b", 1, 16, 1, 8192), 15564936);
  EXPECT_EQ(committed_step_ns("llama-3-8b", 2, 16, 1, 8192), 5001819);
  EXPECT_EQ(committed_step_ns("qwen3-30b-a3b", 2, 16, 1, 8192), 9882932);
}

TEST(PrefillPricing, AttentionChunkFollowsTheRuntimeRule) {
  EXPECT_EQ(prefill_attention_chunk(32, 8), 16);  // group 4: 64 / 4
  EXPECT_EQ(prefill_attention_chunk(24, 8), 16);  // group 3: 21, at most 16
  EXPECT_EQ(prefill_attention_chunk(40, 8), 12);  // group 5
  EXPECT_EQ(prefill_attention_chunk(64, 8), 8);   // group 8
  EXPECT_EQ(prefill_attention_chunk(128, 1), 1);  // group 128: at least 1
}

// Brute force, as Engine::prefill_pass runs it: each piece (ctx cached, q new, both multiples of
// the chunk) is cut into q / chunk pseudo-requests; chunk j reads the keys 0 .. ctx + chunk·(j+1).
struct Piece {
  int64_t ctx, q;
};
int64_t loop_keys(const std::vector<Piece>& pieces, int32_t chunk) {
  int64_t keys = 0;
  for (const Piece& p : pieces) {
    for (int64_t j = 0; j < p.q / chunk; ++j) keys += p.ctx + chunk * (j + 1);
  }
  return keys;
}

TEST(PrefillPricing, ChunkKeysClosedFormMatchesTheLoop) {
  const std::vector<std::vector<Piece>> cases = {
      {{0, 16}},
      {{0, 48}},
      {{0, 1024}},
      {{0, 64}, {0, 128}, {0, 16}},  // three prompts in one pass
      {{256, 64}, {0, 32}},          // a piece after a cached prefix (pipeline chunks)
      {{0, 8192}},
  };
  for (const int32_t chunk : {16, 12, 8, 4, 1}) {
    for (const std::vector<Piece>& pieces : cases) {
      int64_t pairs = 0, tokens = 0;
      std::vector<Piece> scaled;
      for (const Piece& p : pieces) {
        // Multiples of the chunk, as the runtime pads them.
        const Piece s{p.ctx / 16 * chunk, p.q / 16 * chunk};
        scaled.push_back(s);
        pairs += s.q * s.ctx + s.q * (s.q + 1) / 2;
        tokens += s.q;
      }
      EXPECT_EQ(prefill_chunk_keys(pairs, tokens, chunk), loop_keys(scaled, chunk))
          << "chunk " << chunk << ", first piece q " << scaled.front().q;
    }
  }
  // Prompts of 1024 and 8192 tokens at chunk 16: 16 · 64 · 65 / 2 and 16 · 512 · 513 / 2 keys,
  // against 1024 and 8192 if every key were read once.
  EXPECT_EQ(prefill_chunk_keys(1024 * 1025 / 2, 1024, 16), 33280);
  EXPECT_EQ(prefill_chunk_keys(8192LL * 8193 / 2, 8192, 16), 2101248);
}

TEST(PrefillPricing, PrefillAttentionReadsEveryChunksPrefix) {
  // Two prompts of Llama-3-8B (32 query heads, 8 KV heads of 128, bf16 KV: 4096 B of K and V per
  // token and layer; chunk 16): 1024 and 48 tokens.
  const ModelSpec& m = model_preset("llama-3-8b");
  StepKernels sk;
  step_kernels(m, prefill_shape(2, 1024 + 48, 1024LL * 1024 + 48 * 48), sk);
  const KernelDesc* attn = nullptr;
  for (const KernelDesc& k : sk.kernels) {
    if (k.cls == KernelClass::kAttention) attn = &k;
  }
  ASSERT_NE(attn, nullptr);
  const int64_t keys = loop_keys({{0, 1024}, {0, 48}}, 16);  // 33280 + 96
  ASSERT_EQ(keys, 33376);
  const int64_t q_bytes = (1024 + 48) * 4096 * 2;  // the queries, 32 heads × 128, bf16
  EXPECT_EQ(attn->bytes_read, keys * 4096 + q_bytes);
  EXPECT_EQ(attn->bytes_written, q_bytes);
  EXPECT_EQ(attn->requests, 64 + 3);  // one pseudo-request per chunk
  EXPECT_EQ(attn->rows, 1024 + 48);
  // Decode is unchanged: each request reads its context and new key once.
  step_kernels(m, decode_shape(2, 1, 2 * 1000), sk);
  for (const KernelDesc& k : sk.kernels) {
    if (k.cls == KernelClass::kAttention) {
      EXPECT_EQ(k.bytes_read, (2000 + 2) * 4096 + 2 * 4096 * 2);
      EXPECT_EQ(k.requests, 2);
    }
  }
}

const char* kMinimalProfile = R"(format: 1
name: "p"
base: "h200"
header: {command: "c", commit: "x", gpu: "g", driver: "d", date: "t"}
figures:
  stream_read_tbps: 4.5
)";

TEST(PrefillPricing, OptionalFiguresReadAndWriteOnlyWhenSet) {
  CalibrationProfile p = parse_calibration_profile(kMinimalProfile, "p.yaml");
  EXPECT_EQ(p.hw.kernel_fit_max_rows, 64);  // profiles before the figure
  EXPECT_EQ(p.hw.prefill_gemm_tflops, 0);
  const std::string plain = write_calibration_profile(p);
  EXPECT_EQ(plain.find("kernel_fit_max_rows"), std::string::npos);
  EXPECT_EQ(plain.find("prefill_"), std::string::npos);
  p.hw.kernel_fit_max_rows = 16;
  p.hw.prefill_gemm_tflops = 512.5;
  p.hw.prefill_moe_tflops = 170;
  p.hw.prefill_attention_tbps = 6.25;
  const CalibrationProfile q = parse_calibration_profile(write_calibration_profile(p), "q.yaml");
  EXPECT_EQ(q.hw.kernel_fit_max_rows, 16);
  EXPECT_EQ(q.hw.prefill_gemm_tflops, 512.5);
  EXPECT_EQ(q.hw.prefill_moe_tflops, 170);
  EXPECT_EQ(q.hw.prefill_attention_tbps, 6.25);
  EXPECT_NE(test::profile_error_of(test::replace_once(kMinimalProfile, "  stream_read_tbps: 4.5",
                                                      "  kernel_fit_max_rows: 0"))
                .find("figures.kernel_fit_max_rows"),
            std::string::npos);
  EXPECT_NE(test::profile_error_of(test::replace_once(kMinimalProfile, "  stream_read_tbps: 4.5",
                                                      "  prefill_gemm_tflops: -1"))
                .find("figures.prefill_gemm_tflops"),
            std::string::npos);
}

// Prefill samples made by the simulator's own price at known rates: the fit recovers them.
std::vector<CalibrationSample> priced_prefill_samples(const HardwareSpec& truth,
                                                      const std::string& label) {
  std::vector<CalibrationSample> v;
  for (const int64_t tokens : {1024, 2048, 4096, 8192}) {
    CalibrationSample s;
    s.kind = "prefill";
    s.model = label;
    s.mode = "eager";
    s.batch = 1;
    s.ctx_tokens = tokens;
    s.value_ns = prefill_parts(truth, label, tokens).priced_ns;
    v.push_back(s);
  }
  return v;
}

TEST(PrefillPricing, FitRecoversTheRatesItWasMadeWith) {
  const CalibrationProfile committed = load_calibration_profile(
      std::string(TWINSTEP_SOURCE_DIR) + "/results/profiles/h200-calibrated.yaml");
  HardwareSpec truth = committed.hw;
  truth.prefill_gemm_tflops = 450;
  truth.prefill_attention_tbps = 3.0;
  const std::vector<CalibrationSample> samples = priced_prefill_samples(truth, "llama-3-8b");
  // Before the fit (no measured rates: datasheet 989 × 0.7 TFLOP/s, attention at the stream
  // rate) every point is priced low.
  HardwareSpec unfitted = committed.hw;
  unfitted.prefill_gemm_tflops = 0;
  unfitted.prefill_moe_tflops = 0;
  unfitted.prefill_attention_tbps = 0;
  const PrefillFit fit = fit_prefill_rates(samples, unfitted);
  EXPECT_EQ(fit.points, 4);
  EXPECT_LT(fit.mean_err_unfitted, -0.2);
  // Up to the nanosecond rounding of each kernel's price (a few parts in a million).
  EXPECT_NEAR(fit.gemm_tflops, 450, 450 * 1e-5);
  EXPECT_NEAR(fit.attention_tbps, 3.0, 3.0 * 1e-5);
  EXPECT_EQ(fit.moe_tflops, 0);  // a dense model: no experts
  EXPECT_LT(fit.max_rel_err, 1e-6);
  // The split holds: the price is fixed + FLOPs / rate + bytes / rate at the true rates, up to
  // the rounding of each kernel's price to a nanosecond (~330 kernels).
  const PrefillParts parts = prefill_parts(truth, "llama-3-8b", 8192);
  EXPECT_NEAR(parts.priced_ns,
              parts.fixed_ns + parts.gemm_flops * 1e-3 / 450 + parts.attention_bytes * 1e-3 / 3.0,
              200);
}

// Decode kernel samples of two classes on exact lines, batches 1 .. 32: the gemm class (qkv_proj,
// 2000 + 2.5e-4/B + 1e-7/FLOP, one regime) and attention (8000 + 2.5e-4/B + 100/request).
std::vector<CalibrationSample> decode_kernel_samples() {
  std::vector<CalibrationSample> v;
  for (const int64_t batch : {1, 4, 32}) {
    for (const double bytes : {1e7, 4e7, 1.6e8}) {
      CalibrationSample g;
      g.kind = "kernel";
      g.name = "qkv_proj";
      g.cls = "gemm";
      g.model = "llama-3-8b";
      g.mode = "graph";
      g.batch = batch;
      g.bytes = int64_t(bytes);
      g.flops = int64_t(2 * bytes);
      g.value_ns = 2000 + 2.5e-4 * bytes + 1e-7 * 2 * bytes;
      v.push_back(g);
      CalibrationSample a = g;
      a.name = "attention";
      a.cls = "attention";
      a.flops = 0;
      a.value_ns = 8000 + 2.5e-4 * bytes + 100.0 * double(batch);
      v.push_back(a);
    }
  }
  return v;
}

TEST(PrefillPricing, FitCalibrationWritesThePrefillFigures) {
  const ProfileHeader header{"c", "x", "g", "d", "t"};
  std::vector<CalibrationSample> samples = decode_kernel_samples();
  // The kernel fits alone, then prefill samples priced with them at known rates.
  HardwareSpec truth = fit_calibration(samples, "p", "h200", header).hw;
  EXPECT_EQ(truth.kernel_fit_max_rows, 32);  // the largest batch of the kernel samples
  truth.prefill_gemm_tflops = 600;
  truth.prefill_attention_tbps = 2.5;
  for (const CalibrationSample& s : priced_prefill_samples(truth, "llama-3-8b"))
    samples.push_back(s);
  const CalibrationProfile p = fit_calibration(samples, "p", "h200", header);
  EXPECT_NEAR(p.hw.prefill_gemm_tflops, 600, 600 * 1e-6);
  EXPECT_NEAR(p.hw.prefill_attention_tbps, 2.5, 2.5 * 1e-6);
  EXPECT_EQ(p.hw.prefill_moe_tflops, 0);
  const std::string text = write_calibration_profile(p);
  EXPECT_NE(text.find("kernel_fit_max_rows: 32"), std::string::npos);
  EXPECT_NE(text.find("prefill_gemm_tflops: "), std::string::npos);
  EXPECT_NE(text.find("prefill.llama-3-8b.8192.median_ns"), std::string::npos);
  const CalibrationProfile back = parse_calibration_profile(text, "p.yaml");
  EXPECT_EQ(back.hw.prefill_gemm_tflops, p.hw.prefill_gemm_tflops);
  EXPECT_EQ(back.hw.prefill_attention_tbps, p.hw.prefill_attention_tbps);
  EXPECT_EQ(back.hw.kernel_fit_max_rows, 32);
}

}  // namespace
}  // namespace twinstep
