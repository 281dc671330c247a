#!/usr/bin/env bash
# The GEMV side by side on a machine with a CUDA GPU (docs/kernels.md rounds 24-25): the GEMV
# kernel tests, then the benchmark's gemv section (the m = 1 variant sweep, each row with its
# steady-state period in a long PDL chain; then the best variant at m = 1, 6, 16) and the layer
# chain's configurations (chain_trigger).
#   TWINSTEP_COMMIT=<sha> scripts/gpu_gemv_sweep.sh OUT_DIR
# Writes OUT_DIR/{gemv.json,logs.tar.xz}.
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: scripts/gpu_gemv_sweep.sh OUT_DIR}"
step build
gpu_build "$logs" kernels_test twinstep_kernels_bench || { status=1; recal_finish; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$logs/gpu.txt"
recal_kernel_tests 'Gemv*:*Gemv*'
step "bench gemv, chain_trigger"
"$build/kernels/twinstep_kernels_bench" --only gemv --only chain_trigger --out "$out/gemv.json" \
  --commit "${TWINSTEP_COMMIT:-unknown}" >"$logs/bench.log" 2>&1 || status=1
grep -E "^(floor|gemv variant|gemv splitasync|gemv regpipe|  layer chain)" "$logs/bench.log" |
  cut -c1-200
step done
recal_finish
