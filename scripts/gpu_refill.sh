#!/usr/bin/env bash
# Round 24 (docs/kernels.md): the GEMV's ring of 3 refilled (GemvTuning::refill: each slot
# reissued as soon as its batch is in registers, 3 batches in flight instead of 2) beside the
# rings the runtime uses, on a machine with a CUDA GPU:
#   1. the GEMV kernel tests (the refilled ring gives the ring's bits; CPU references);
#   2. the benchmark's gemv section (the m = 1 variant sweep with the refilled rows, then the best
#      variant at m = 1, 6, 16, each with its steady-state period in a long PDL chain) and the
#      layer chain's configurations (chain_trigger, with the refilled ring).
#   TWINSTEP_COMMIT=<sha> scripts/gpu_refill.sh OUT_DIR
# Writes OUT_DIR/{refill.json,logs.tar.xz}.
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: scripts/gpu_refill.sh OUT_DIR}"
step build
gpu_build "$logs" kernels_test twinstep_kernels_bench || { status=1; recal_finish; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$logs/gpu.txt"
recal_kernel_tests 'Gemv*:*Gemv*'
step "bench gemv, chain_trigger"
"$build/kernels/twinstep_kernels_bench" --only gemv --only chain_trigger --out "$out/refill.json" \
  --commit "${TWINSTEP_COMMIT:-unknown}" >"$logs/bench.log" 2>&1 || status=1
grep -E "^(floor|gemv variant|gemv splitasync|gemv regpipe|  layer chain)" "$logs/bench.log" |
  cut -c1-200
step done
recal_finish
