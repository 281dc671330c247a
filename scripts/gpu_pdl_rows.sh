#!/usr/bin/env bash
# The decode step at 8, 12 and 16 rows with and without PDL, per kernel tuning
# (runtime/bench/pdl_rows_bench.cc; kernels/tuning.h carveout_max_shared_rows), then the kernel
# layer chain at 1, 6 and 16 rows with its PDL diagnostics.
#   scripts/gpu_pdl_rows.sh OUT_DIR
# Writes OUT_DIR/{configure,build}.log, pdl_rows.txt, layer_chain.txt, layer_chain.json.
# Env: TWINSTEP_BUILD_DIR (default build), TWINSTEP_CMAKE_ARGS, TWINSTEP_COMMIT.
set -uo pipefail
out=${1:?usage: scripts/gpu_pdl_rows.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps, gpu_build
build=${TWINSTEP_BUILD_DIR:-$root/build}
gpu_build "$out" twinstep_pdl_rows_bench twinstep_kernels_bench || exit 1
status=0
"$build/runtime/twinstep_pdl_rows_bench" --reps 20 | tee "$out/pdl_rows.txt" || status=1
"$build/kernels/twinstep_kernels_bench" --out "$out/layer_chain.json" \
  --commit "${TWINSTEP_COMMIT:-unknown}" --only layer_chain >"$out/layer_chain.txt" 2>&1 || status=1
grep -E "^layer chain|pdl on except|tuning|fastest" "$out/layer_chain.txt"
exit $status
