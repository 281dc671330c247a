#!/usr/bin/env bash
# The layer chain's configurations (the benchmark's chain_trigger section: Llama-3-8B, ctx 8192,
# m = 1 and 6, the 9 kernels and the 6 fused ones, PDL on) in REPEATS separate processes, each
# with its own floor, so that a ratio's spread across runs is measured (docs/kernels.md round 26).
#   TWINSTEP_COMMIT=<sha> [REPEATS=3] scripts/gpu_chain_repeat.sh OUT_DIR
# Writes OUT_DIR/{chain_1.json ..,logs.tar.xz}.
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: scripts/gpu_chain_repeat.sh OUT_DIR}"
step build
gpu_build "$logs" twinstep_kernels_bench || { status=1; recal_finish; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$logs/gpu.txt"
for i in $(seq 1 "${REPEATS:-3}"); do
  step "chain_trigger, run $i"
  "$build/kernels/twinstep_kernels_bench" --only chain_trigger --out "$out/chain_$i.json" \
    --commit "${TWINSTEP_COMMIT:-unknown}" >"$logs/bench_$i.log" 2>&1 || status=1
  grep -E "^floor|  layer chain m=1" "$logs/bench_$i.log" | cut -c1-200
done
step done
recal_finish
