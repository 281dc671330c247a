#!/usr/bin/env bash
# Round 28 (docs/kernels.md): the attention split kernel on a ring of six tiles at one block per
# SM (AttentionTuning::split_stages = 6), in one call: its tests (kernels_test Attention*, the new
# bits test under compute-sanitizer memcheck), then the benchmark's attention (acceptance rows,
# every contender), attention_trace (per-block timelines) and chain_trigger (the layer chain)
# sections, each in its own process.
#   TWINSTEP_COMMIT=<sha> scripts/gpu_six_stages.sh OUT_DIR
# Writes OUT_DIR/{attention,attention_trace,chain_trigger}.json and OUT_DIR/logs.tar.xz.
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: scripts/gpu_six_stages.sh OUT_DIR}"
step build
gpu_build "$logs" kernels_test twinstep_kernels_bench || { status=1; recal_finish; }
nvidia-smi --query-gpu=index,name,driver_version,uuid --format=csv,noheader | tee "$logs/gpu.txt"
recal_kernel_tests 'Attention*:Cases/Attention*:Variants/Attention*'
step "memcheck: the six-stage bits test"
compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/kernels/kernels_test" \
  --gtest_filter='Attention.SixStageRingGivesTheSameBitsAsThree' >"$logs/memcheck.log" 2>&1 ||
  status=1
grep -E "ERROR SUMMARY|PASSED|FAILED" "$logs/memcheck.log" | head -5
for section in attention attention_trace chain_trigger; do
  step "bench $section"
  "$build/kernels/twinstep_kernels_bench" --only "$section" --out "$out/$section.json" \
    --commit "${TWINSTEP_COMMIT:-unknown}" >"$logs/bench_$section.log" 2>&1 || status=1
  grep -E "^floor|ctx= 8192|attention trace|layer chain m=1" "$logs/bench_$section.log" |
    cut -c1-230
done
step done
recal_finish
