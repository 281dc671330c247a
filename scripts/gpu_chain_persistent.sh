#!/usr/bin/env bash
# The persistent GEMV chain (kernels/gemv_chain.h; docs/kernels.md round 27) on one GPU: its
# kernel tests, compute-sanitizer memcheck over them, then the benchmark's chain_persistent
# section (the Llama-3-8B layer chain at m = 1 and 4, ctx 8192: the fused 6-kernel chain and the
# persistent GEMVs + attention side by side, PDL on and off, REPEATS processes with a floor each).
#   TWINSTEP_COMMIT=<sha> [REPEATS=2] scripts/gpu_chain_persistent.sh OUT_DIR
# Writes OUT_DIR/{chain_persistent_N.json,logs/}.
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: scripts/gpu_chain_persistent.sh OUT_DIR}"
step build
gpu_build "$logs" kernels_test twinstep_kernels_bench || { status=1; recal_finish; }
nvidia-smi --query-gpu=index,name,driver_version,uuid --format=csv,noheader | tee "$logs/gpu.txt"
step "kernel tests (GemvChain*)"  # time limits: a barrier that never opens must not eat the call
timeout 240 "$build/tests/kernels/kernels_test" --gtest_filter='GemvChain*' >"$logs/tests.log" 2>&1 ||
  status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]|Failure|error" "$logs/tests.log" | head -20
step "memcheck (GemvChain, small shapes)"
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$build/tests/kernels/kernels_test" \
  --gtest_filter='GemvChain.LayerStages*:GemvChain.Rows*:GemvChain.Rejects*' \
  >"$logs/memcheck.log" 2>&1 || status=1
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) " "$logs/memcheck.log"
for i in $(seq 1 "${REPEATS:-2}"); do
  step "chain_persistent, run $i"
  timeout 300 "$build/kernels/twinstep_kernels_bench" --only chain_persistent \
    --out "$out/chain_persistent_$i.json" --commit "${TWINSTEP_COMMIT:-unknown}" \
    >"$logs/bench_$i.log" 2>&1 || status=1
  grep -E "^floor|  layer chain" "$logs/bench_$i.log" | cut -c1-200
done
step done
recal_finish
