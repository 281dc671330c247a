#!/usr/bin/env bash
# Calibrate's decode step against the real backend's, batch 1, in one call (docs/calibration.md,
# issue 6's prompt-128 graph cases): experiments/validation/h200_decode.yaml on both backends, then
# `calibrate` of Llama-3-8B's grid at ctx 128 and 8192 with batch 1 alone (an engine of one slot)
# and at ctx 128 with batches 1..64 (an engine of 64 slots, as the full grid builds it), then the
# experiment again; prints the real runs' mean step and each calibration's step medians per mode.
#   scripts/gpu_step_probe.sh OUT_DIR
# Writes OUT_DIR/{configure,build,run1,run2,cal1,cal64}.log and OUT_DIR/probe.db.
set -uo pipefail
out=${1:?usage: scripts/gpu_step_probe.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
db="$out/probe.db"
status=0
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }
step build
gpu_build "$out" twinstep || exit 1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
exp="$root/experiments/validation/h200_decode.yaml"
step "h200_decode (1)"
"$build/twinstep" --db "$db" run -q "$exp" >"$out/run1.log" 2>&1 || status=1
step "calibrate ctx 128,8192 batch 1"
"$build/twinstep" --db "$db" calibrate --out "$out/cal1.yaml" --models llama-3-8b --contexts 128,8192 \
  --batches 1 --no-spec --no-prefill >"$out/cal1.log" 2>&1 || status=1
step "calibrate ctx 128 batches 1..64"
"$build/twinstep" --db "$db" calibrate --out "$out/cal64.yaml" --models llama-3-8b --contexts 128 \
  --batches 1,2,4,8,16,32,64 --no-spec --no-prefill >"$out/cal64.log" 2>&1 || status=1
step "h200_decode (2)"
"$build/twinstep" --db "$db" run -q "$exp" >"$out/run2.log" 2>&1 || status=1
echo "## real runs: mean decode step (us) by run and variant"
"$build/twinstep" --db "$db" query "SELECT r.id, r.variant_label, round(avg(s.dur_ns) / 1000.0, 1)
  AS step_us, count(*) AS steps FROM run r JOIN step_sample s ON s.run_id = r.id WHERE r.backend =
  'real' AND s.batch = 1 AND s.prefills = 0 GROUP BY r.id ORDER BY r.id"
echo "## calibrate: decode step medians (us) by session, mode and context"
"$build/twinstep" --db "$db" query "SELECT session_id, mode, ctx_tokens, count(*) AS n,
  round(avg(value_ns) / 1000.0, 1) AS mean_us, round(min(value_ns) / 1000.0, 1) AS min_us FROM
  calibration_sample WHERE kind = 'step' AND batch = 1 GROUP BY session_id, mode, ctx_tokens
  ORDER BY session_id, mode, ctx_tokens"
exit $status
