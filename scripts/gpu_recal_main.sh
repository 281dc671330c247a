#!/usr/bin/env bash
# Llama-3-8B's main calibration session measured again (session 5's command: the default grid,
# speculative graphs, prefill) in a copy of results/h200/calibration_fd6530c.db.xz, the profile
# refitted with it in place of session 5, and the one-GPU validation experiments run against that
# profile (real runs now, the same day as the calibration), in one call:
#   scripts/gpu_recal_main.sh OUT_DIR
# Writes OUT_DIR/{h200-calibrated.yaml,cal.db.xz,validation.db.xz,*.sim_vs_real.txt,logs.tar.xz}.
# Env: TWINSTEP_COMMIT; RECAL_VALIDATE (default "h200_heldout h200_suite h200_decode
# h200_concurrency h200_moe").
set -uo pipefail
out=${1:?usage: scripts/gpu_recal_main.sh OUT_DIR}
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
logs=$out/logs
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
ts=$build/twinstep
status=0
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }
step build
gpu_build "$logs" twinstep || exit 1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$logs/gpu.txt"
step "calibrate llama-3-8b (session 5's command)"
xz -dc "$root/results/h200/calibration_fd6530c.db.xz" >"$out/cal.db"
"$ts" --db "$out/cal.db" calibrate --out "$logs/main.yaml" >"$logs/main.log" 2>&1 ||
  { status=1; tail -5 "$logs/main.log"; }
new=$("$ts" --db "$out/cal.db" query --csv "SELECT max(id) FROM calibration_session" | tail -1 |
  tr -d '"')
step "refit: sessions 2,4,12,15,21-27 and $new"
"$ts" --db "$out/cal.db" calibrate --fit-only --sessions "2,4,12,15,21,22,23,24,25,26,27,$new" \
  --collectives-from "$root/results/h200/nccl_profile_583eee2.yaml" \
  --collectives-from "$root/results/h200/nccl_profile_4gpu_631b9bd.yaml" \
  --out "$out/h200-calibrated.yaml" >"$logs/refit.log" 2>&1 || status=1
tail -2 "$logs/refit.log"
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
(cd "$out" && tar cJf logs.tar.xz logs && rm -rf logs)
for db in cal validation; do [ -f "$out/$db.db" ] && xz -T0 -f "$out/$db.db"; done
exit $status
