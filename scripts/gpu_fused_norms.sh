#!/usr/bin/env bash
# EngineOptions::fused_norms (kernels' gemv_norm.h in the engine's layers; docs/kernels.md round
# 21): its GPU tests (CPU reference, graph modes, speculative decoding byte-identical to plain),
# then the Llama-3-8B decode step of the default engine, the fused rope, the fused norms and both
# (runtime/bench/pdl_rows_bench.cc, graph and graph + PDL) at contexts 192 and 8192, batches 1, 8
# and 16.
#   scripts/gpu_fused_norms.sh OUT_DIR
# Writes OUT_DIR/{configure,build}.log, tests.log, spec_tests.log, decode_ctx192.txt,
# decode_ctx8192.txt. Env: TWINSTEP_BUILD_DIR (default build), TWINSTEP_CMAKE_ARGS.
set -uo pipefail
out=${1:?usage: scripts/gpu_fused_norms.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps, gpu_build
build=${TWINSTEP_BUILD_DIR:-$root/build}
gpu_build "$out" runtime_gpu_test runtime_spec_gpu_test twinstep_pdl_rows_bench || exit 1
status=0
"$build/tests/runtime/runtime_gpu_test" --gtest_filter='RealRuntime.FusedNorms*' \
  >"$out/tests.log" 2>&1 || status=1
"$build/tests/runtime/runtime_spec_gpu_test" --gtest_filter='*FusedNorms*' \
  >"$out/spec_tests.log" 2>&1 || status=1
grep -hE "^\[  (PASSED|FAILED|SKIPPED) |tokens match the CPU|accept length" "$out/tests.log" \
  "$out/spec_tests.log" | head -40
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for ctx in 192 8192; do
  "$build/runtime/twinstep_pdl_rows_bench" --ctx "$ctx" --batches 1,8,16 --reps 30 \
    --only default --only fused | tee "$out/decode_ctx$ctx.txt" || status=1
done
exit $status
