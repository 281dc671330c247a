#!/usr/bin/env bash
# The split-phase cluster barrier of the split-K GEMV (kernels/tuning.h GemvTuning::split_phase;
# docs/kernels.md round 11) in one call: the GEMV / LM-head / MoE kernel tests, compute-sanitizer
# memcheck of the split-phase test, the `gemv_split` bench section (cluster.sync vs split phase
# side by side), then the never-fitted Llama-3.2-3B beside Llama-3-8B in one calibrate session
# priced with the committed profile (calibrate-eval), and the held-out validation experiment
# against the committed profile with the real runs made now.
#   scripts/gpu_gemv_split.sh OUT_DIR
# Writes OUT_DIR/{configure,build,tests,memcheck,bench}.log, gemv_split.json, heldout.{db,yaml},
# heldout_eval.txt and OUT_DIR/validation/. Env: TWINSTEP_COMMIT; SPLIT_VALIDATE (default
# "h200_heldout"; empty: none).
set -uo pipefail
out=${1:?usage: scripts/gpu_gemv_split.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
status=0
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }
step build
gpu_build "$out" twinstep twinstep_kernels_bench kernels_test || exit 1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
step tests
"$build/tests/kernels/kernels_test" --gtest_filter='*Gemv*:*LmHead*:*Moe*' >"$out/tests.log" 2>&1 ||
  status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]" "$out/tests.log"
step memcheck
timeout 180 compute-sanitizer --tool memcheck --error-exitcode 3 "$build/tests/kernels/kernels_test" \
  --gtest_filter='Gemv.SplitPhaseBarrierKeepsTheBits' >"$out/memcheck.log" 2>&1 || status=1
grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log"
step bench
"$build/kernels/twinstep_kernels_bench" --only gemv_split --out "$out/gemv_split.json" \
  --commit "${TWINSTEP_COMMIT:-unknown}" >"$out/bench.log" 2>&1 || status=1
grep -E "^(floor|gemv_split)" "$out/bench.log"
step "held-out calibrate session"
"$build/twinstep" --db "$out/heldout.db" calibrate --out "$out/heldout.yaml" \
  --models llama-3-8b,llama-3.2-3b --contexts 1024,8192 --batches 1,8 --no-spec --no-prefill \
  >"$out/heldout_calibrate.log" 2>&1 || status=1
"$build/twinstep" calibrate-eval --profile "$root/results/profiles/h200-calibrated.yaml" \
  --db "$out/heldout.db" --by-batch >"$out/heldout_eval.txt" 2>&1 || status=1
grep -E "^(llama-3.2-3b|llama-3-8b) +(down_proj|qkv_proj|gate_up|o_proj)|(pdl|graph) +[18] " \
  "$out/heldout_eval.txt"
validate=${SPLIT_VALIDATE-h200_heldout}
if [ -n "$validate" ]; then
  step validation
  CALIBRATE_PROFILE="$root/results/profiles/h200-calibrated.yaml" CALIBRATE_VALIDATE="$validate" \
    TWINSTEP_BUILD_DIR="$build" TWINSTEP_PREBUILT=1 bash "$root/scripts/gpu_calibrate.sh" \
    "$out/validation" >"$out/validation.log" 2>&1 || status=1
  grep -E "^== |tpot_ms_mean" "$out/validation.log"
fi
exit $status
