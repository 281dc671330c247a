#!/usr/bin/env bash
# The GPU state of timed engines (runtime::settle_gpu_state; docs/calibration.md "Two states of
# the GPU"), in one call: the settle probe in four fresh processes (unsettled, settled, twice
# each: engine A timed, then engine B created after it), the settle and warm-up GPU tests, then
# the one-GPU validation experiments against the committed profile with the real runs made now
# (scripts/gpu_calibrate.sh with CALIBRATE_PROFILE).
#   scripts/gpu_settle.sh OUT_DIR
# Writes OUT_DIR/{configure,build,tests}.log, settle_{unset,1}_{1,2}/decode_settle_probe.json with
# probe.log, and OUT_DIR/validation/ (validation.db, <name>.sim_vs_real.txt).
# Env: TWINSTEP_COMMIT; SETTLE_VALIDATE (default "h200_concurrency h200_decode h200_heldout
# h200_suite").
set -uo pipefail
out=${1:?usage: scripts/gpu_settle.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
status=0
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }
step build
gpu_build "$out" twinstep twinstep_decode_bench runtime_gpu_test || exit 1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for round in 1 2; do
  for settle in unset 1; do
    dir="$out/settle_${settle}_$round"
    mkdir -p "$dir"
    step "settle probe, settle $settle ($round)"
    env $([ "$settle" = 1 ] && echo TWINSTEP_PROBE_SETTLE=1) "$build/runtime/twinstep_decode_bench" \
      --probe-settle --out "$dir" --commit "${TWINSTEP_COMMIT:-unknown}" >"$dir/probe.log" 2>&1 ||
      status=1
    grep -E "^(settle|A_first|B_after_A|engine )" "$dir/probe.log"
  done
done
step tests
"$build/tests/runtime/runtime_gpu_test" --gtest_filter='*Settle*:*WarmUp*' >"$out/tests.log" 2>&1 ||
  status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]" "$out/tests.log"
step validation
CALIBRATE_PROFILE="$root/results/profiles/h200-calibrated.yaml" \
  CALIBRATE_VALIDATE="${SETTLE_VALIDATE:-h200_concurrency h200_decode h200_heldout h200_suite}" \
  TWINSTEP_BUILD_DIR="$build" TWINSTEP_PREBUILT=1 bash "$root/scripts/gpu_calibrate.sh" \
  "$out/validation" >"$out/validation.log" 2>&1 || status=1
grep -E "^== |tpot_ms_mean" "$out/validation.log"
exit $status
