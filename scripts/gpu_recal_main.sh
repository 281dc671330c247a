#!/usr/bin/env bash
# Llama-3-8B's main calibration session measured again (session 5's command: the default grid,
# speculative graphs, prefill) in a copy of results/h200/calibration_fd6530c.db.xz (now sessions
# 1-27 of calibration_d1f6e37.db.xz), the profile
# refitted with it in place of session 5, and the one-GPU validation experiments run against that
# profile (real runs now, the same day as the calibration), in one call:
#   scripts/gpu_recal_main.sh OUT_DIR
# Writes OUT_DIR/{h200-calibrated.yaml,cal.db.xz,validation.db.xz,*.sim_vs_real.txt,logs.tar.xz}.
# Env: TWINSTEP_COMMIT; RECAL_VALIDATE (default "h200_heldout h200_suite h200_decode
# h200_concurrency h200_moe").
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: scripts/gpu_recal_main.sh OUT_DIR}"
recal_build twinstep || exit 1
step "calibrate llama-3-8b (session 5's command)"
recal_base_db "$root/results/h200/calibration_d1f6e37.db.xz" 28 27  # calibration_fd6530c's 1-27
run_cal main
recal_refit "2,4,12,15,21,22,23,24,25,26,27,$first"
step validation
CALIBRATE_PROFILE="$out/h200-calibrated.yaml" CALIBRATE_MOE=1 \
  CALIBRATE_VALIDATE="${RECAL_VALIDATE:-h200_heldout h200_suite h200_decode h200_concurrency h200_moe}" \
  TWINSTEP_BUILD_DIR="$build" TWINSTEP_PREBUILT=1 bash "$root/scripts/gpu_calibrate.sh" \
  "$out/v" >"$logs/validation.log" 2>&1 || status=1
grep -E "^== |tpot_ms_mean" "$logs/validation.log" | cut -c1-160
cp "$out"/v/*.sim_vs_real.txt "$out/" 2>/dev/null
[ -f "$out/v/validation.db" ] && mv "$out/v/validation.db" "$out/validation.db"
cp "$out"/v/*.err "$out"/v/*.run.txt "$logs/" 2>/dev/null
rm -rf "$out/v"
recal_finish cal validation
