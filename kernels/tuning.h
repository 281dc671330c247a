// Internal tunables of the kernels (not part of the runtime's API): defaults are the measured
// best on the H200; the benchmark switches them to compare variants in one process. Host-side
// globals, read by the launchers at launch time (so a captured graph keeps the values it saw).
#pragma once

#include "kernels/attention_split.h"  // the attention partition's defaults

namespace twinstep::kernels::detail {

struct KernelTuning {
  // Small kernels between two streaming kernels (rmsnorm, rope, attention combine) trigger their
  // dependent launch before their own dependency wait (see device.cuh, pdl_trigger_then_wait).
  bool early_trigger = true;
  // With trigger_at_exit those small kernels do not trigger at all (overrides early_trigger): their
  // dependent launches as their blocks exit, so its prologue loads (weights, older KV tokens)
  // cannot queue on the SMs ahead of the small kernel's own loads. Benchmark option
  // (attention_trace, chain_trigger): docs/kernels.md round 23.
  bool trigger_at_exit = false;
  // Shared-memory carveout asked by every launch of kernels/ and of the runtime's decode relay
  // kernels (cudaLaunchAttributePreferredSharedMemoryCarveout, percent of the maximum): -1 = no
  // preference (the driver picks per launch, which can depend on the SMs' current L1/shared
  // split). The attention's own max-shared request (AttentionTuning) applies where this is -1.
  int carveout_percent = -1;
};
KernelTuning& kernel_tuning();
// The small kernels' trigger placement for their launch argument (device.cuh pdl_small_wait):
// 0 trigger before the wait, 1 after it, 2 none (at exit).
inline int small_kernel_trigger_mode() {
  const KernelTuning& t = kernel_tuning();
  return t.trigger_at_exit ? 2 : t.early_trigger ? 0 : 1;
}

struct GemvTuning {
  int kc = 256;                        // k elements per pipeline stage (multiple of 64, <= 256)
  int smem_budget_bytes = 100 * 1024;  // stage ring per block; <= ~110 KB keeps 2 blocks per SM
  // 0 = stage ring filled by one cp.async.bulk per row (copy-issue bound, ~31% of floor on the
  // H200), 1 = ring filled by 16-byte cp.async from one producer warp (~10%), 2 = the
  // register-pipelined kernel of 70e44e1 for dense gemv / SwiGLU / LM head (72-93%: the default;
  // grouped MoE then uses the ring with fill 0). See docs/kernels.md.
  // 3 = fill 2 generalised (gemv_split_kernel): split-K over thread-block clusters (`split`:
  // 0 = chosen per shape, else 1, 2 or 4) and optionally a per-thread cp.async shared-memory
  // ring of `stages` batches (0 = registers, 3 = 96 KB/block, 6 = 192 KB/block).
  // stages -1 = chosen per shape (see launch_gemv_split); large_m_registers: m > 8 takes the
  // register path with the same split (bit-identical rows). Default: measured best, see
  // docs/kernels.md. stages 2: the 2-slot ring refilled right after each batch is consumed.
  int fill = 3;
  int split = 0;
  int stages = -1;
  bool large_m_registers = true;
  // Dense GEMVs of more than this many rows launch without the PDL attribute (they start when
  // their predecessor has finished; their successors still overlap them). Chained under PDL the
  // m > 8 register path made the Llama-3-8B decode step at batch 12-16 run 8.1 ms against 5.3 ms
  // without PDL; with this rule the PDL step is 5.27 ms at batch 16 (twinstep_pdl_rows_bench on
  // an H200, 583eee2, results/h200/pdl_rows.txt; the ring path for m > 8 gave 6.0 ms). 16: PDL
  // at every row count.
  int pdl_max_rows = 8;
  // Shared-memory carveout (percent of the maximum) asked by the m > 8 register path, which keeps
  // only its 16 KB of partial sums in shared memory and re-reads the 16 activation rows from L1
  // (128 KB at k = 4096): -1 = KernelTuning::carveout_percent's rule. Nsight Compute (8289c5b)
  // saw the driver give these launches a 102 KB carveout and an L1 hit rate of ~44 % on the
  // activation loads, with long-scoreboard stalls 3-4x those of m <= 8.
  int large_m_carveout_percent = -1;
  // Weight path of m > 8 when large_m_registers: 0 = registers (one batch in flight per warp),
  // 2 = the 2-slot cp.async ring refilled as soon as a batch is consumed (two in flight, 64 KB
  // of shared memory per block). Same bits either way (the split is chosen before).
  int large_m_stages = 0;
  // Grouped MoE expert GEMVs (moe_forward's gate+up and down): 3 = gemv_split_kernel's grouped
  // mode (S = 1, per-thread 16-byte loads; the ring of `moe_stages`, 0 = registers), else the
  // stage ring of gemv_kernel filled by `fill` 0 (one cp.async.bulk per row, the default until
  // session 27: 21-28 % of the floor, copy-issue bound) or 1. Rows depend on k only either way;
  // the two kernels differ at rounding level (K in 8 warp pieces against one warp in order).
  // m > 8 rows take moe_large_m_stages: the ring of 2 (64 KB per block) leaves L1 room for the
  // 16 activation rows of gate+up (64 KB at hidden 2048), and the 16-row register path spills in
  // grouped mode (ptxas: 36 bytes).
  int moe_fill = 3;
  int moe_stages = 3;
  int moe_large_m_stages = 2;
  // Each warp owns whole tiles over the full k (gemv_split_kernel's kWarpTiles): no block barrier
  // or cross-warp sum per tile. Other bits than the 8-piece split (false). Measured 9-11 % faster
  // at 6 and 16 rows and +1 % at one (2d83629, docs/kernels.md round 22); the default since
  // session 28, with the MoE sessions calibrated again on it (scripts/gpu_moe_recal.sh).
  bool moe_warp_tiles = true;
};
GemvTuning& gemv_tuning();

// Decode attention (attention.cu): the split + combine pair of 179ce97. A one-launch variant
// (cluster merge through DSMEM, the last cluster combining) was measured slower and withdrawn;
// see docs/kernels.md.
struct AttentionTuning {
  int ctas_per_sm = kAttentionCtasPerSm;  // context splits are sized so a full cache gives this
                                          // many blocks per SM
  // How the split count rounds (attention.cu split_tokens_for): true, down: a full cache gives at
  // most ctas_per_sm x SMs blocks, one wave, wherever requests x KV heads alone fit in it; false,
  // up (179ce97..): at least that many, so 2 to 32 requests of 8 KV heads launched 272-512 blocks
  // into 264 slots and the last 8-248 ran as a second wave behind the first (the calibration's
  // batch-8 attention at ctx 1040: 320 blocks of 4 tiles, 21.1 us, against 16.5-16.9 us for one
  // request's 208-264 blocks of the same bytes). Either way the partition depends on capacity, KV
  // heads and requests only; results differ between the two at rounding level.
  bool splits_within_one_wave = kAttentionSplitsWithinOneWave;
  // Split-kernel options (same bits either way). split_full_ring: the split kernel's prologue
  // issues all 3 ring stages (96 KB per block, 192 KB per SM in flight at the start) instead of 2;
  // split_q_smem: Q staged in shared memory instead of 32 registers per thread (no spill at 8 and
  // 16 warps per block). Measured on the H200 at ctx 8192, graph+PDL (results/h200/attention.json,
  // 1550db9): default 14.98 / 25.16 us (q_len 1 / 6), q_smem 14.51 / 22.41, full ring 15.88 /
  // 25.47, both 15.68 / 23.38: q_smem alone is the default.
  bool split_full_ring = false;
  bool split_q_smem = true;
  // Measured and not kept (session 15, docs/kernels.md round 8; ctx 8192, q_len 1, against
  // 14.67 us): the split triggering its dependent before its wait (14.70 us), one block per SM
  // (17.14 us; 15.83 with the early trigger), a bulk L2 prefetch of the split's older K/V before
  // the wait (16.11 us; results/h200/kernels_round8_6f25d1f.json).
  // Every attention launch asks for the largest shared-memory carveout (the split kernel's
  // configuration), so the small combine can be resident beside the split kernel under PDL.
  // Measured (1550db9): 14.98 us at q_len 1 vs 16.10 us with the driver's choice.
  bool carveout_max_shared = true;
  // ... only up to this many token rows (requests x q_len). While GEMVs of more than 8 rows were
  // PDL-launched, their register path (re-reading activation rows from L1) ran inside the
  // attention's max-shared split: the 16-row layer chain (ctx 8192, cec62eb) took 259.5 us with
  // the max carveout vs 174.9 us with the driver's. Since those GEMVs wait for their predecessor
  // (GemvTuning::pdl_max_rows) the SMs drain first, and the max carveout measured ahead at every
  // row count: decode step at batch 16, 5.19 ms vs 5.27 ms limited to 8 rows (pdl_rows_bench,
  // 583eee2, results/h200/pdl_rows.txt). The limit stays at 8 until the calibration and the
  // validation runs (measured at 583eee2 with it) are redone without it. At 1 and 6 rows:
  // 137.3 vs 139.6 us, 143.2 vs 145.1 us.
  int carveout_max_shared_rows = 8;
  // The combine kernel: 4 x 128 threads per (row, head, request), each part merging every 4th
  // split (attention_combine_parts_kernel), for launches of at least combine_parts_min_splits
  // splits; below, and with combine_parts off, the earlier 128-thread form merging every split in
  // one thread per dimension, whose serial work per split cost a shard with few KV heads
  // (Qwen3-30B-A3B at TP4 and TP2: 129 splits at ctx 8192) 18.8 us per combine against 5.1 us
  // (attention pair 25.7 / 9.5 us at one KV head, q_len 1; attention_kv_heads_eca5783.json).
  // First set at 97 (eca5783), now 66: the TP2 shard's launches at 8K (2 KV heads, 67-73 splits of
  // 128 tokens at the runtime's capacities 8512-9280) ran the serial form, and its attention took
  // 16.3 us at batch 1 against 12.1 priced from the shard's 1K grid (session 13 of
  // results/h200/calibration_a7acc12.db.xz, measured at eca5783). 65 splits or fewer (every shape
  // with 4 or more KV heads per GPU at 8K) keep the serial form the calibration profile and the
  // one-GPU validation runs measured (at 65: 7.3 / 3.9 us, not switched). The choice depends on the
  // launch's split count (capacity, KV heads, requests), so verify and plain decode rows still
  // match bit for bit.
  bool combine_parts = true;
  int combine_parts_min_splits = 66;
  // The combine loads the request's context length before its dependency wait (the preceding
  // kernel does not write it), so its partials' loads after the wait are not behind that load.
  // Same bits. Measured in round 23 (docs/kernels.md: -0.3 us per layer at ctx 8192), the
  // default since round 29 (session 36), with the split's padded partials: both only shorten the
  // attention the calibration profile priced (docs/calibration.md, the drift check after it).
  bool combine_ctx_before_wait = true;
  bool launch_split = true, launch_combine = true;  // benchmark only: either kernel alone
  // Benchmark only (section attention_trace): non-null = the pair's blocks write their timeline
  // (attention.h, kAttentionTrace*) into this buffer, in instantiations of their own (the default
  // kernels' code is not touched). Needs split_q_smem and decode_attention (not the fused rope).
  unsigned long long* trace = nullptr;
  // Benchmark only, read by the trace instantiations: at most this many tiles issued before the
  // split's dependency wait (-1: the prologue's, 2 or 3).
  int split_prewait_tiles = -1;
  bool skip_math = false;  // benchmark only: stream K/V, skip the tile math (wrong output)
};
AttentionTuning& attention_tuning();

}  // namespace twinstep::kernels::detail
