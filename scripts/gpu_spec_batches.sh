#!/usr/bin/env bash
# Llama-3-8B's speculative graphs at 8, 16 and 32 requests (calibrate --spec-only --spec-batches;
# the main session measures 1 and 4), measured in a copy of results/h200/calibration_3098933.db.xz
# (session 34), and the profile refitted with it: sessions 2, 4, 12, 15, 21-23, 29-34. The
# speculative suite's real runs (results/h200/spec_suite_84ab754.db.xz) are then re-simulated with
# that profile without a GPU (scripts/sim_vs_real_offline.sh; docs/calibration.md "Speculative
# suite").
#   scripts/gpu_spec_batches.sh OUT_DIR
# Writes OUT_DIR/{h200-calibrated.yaml,cal.db.xz,logs.tar.xz}.
set -uo pipefail
out=${1:?usage: scripts/gpu_spec_batches.sh OUT_DIR}
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
status=0
echo "== build ($(date -u +%H:%M:%S))"
gpu_build "$out/logs" twinstep || exit 1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$out/logs/gpu.txt"
xz -dc "$root/results/h200/calibration_3098933.db.xz" >"$out/cal.db"
echo "== speculative graphs at 8, 16, 32 requests ($(date -u +%H:%M:%S))"
"$build/twinstep" --db "$out/cal.db" calibrate --out "$out/logs/spec_batches.yaml" --spec-only \
  --models llama-3-8b --spec-batches 8,16,32 >"$out/logs/spec_batches.log" 2>&1 ||
  { status=1; tail -5 "$out/logs/spec_batches.log"; }
grep -E "batch (8|16|32) ctx [0-9]+ W (6|16):" "$out/logs/spec_batches.log" | cut -c1-160
echo "== refit ($(date -u +%H:%M:%S))"
"$build/twinstep" --db "$out/cal.db" calibrate --fit-only \
  --sessions 2,4,12,15,21,22,23,29,30,31,32,33,34 \
  --collectives-from "$root/results/h200/nccl_profile_583eee2.yaml" \
  --collectives-from "$root/results/h200/nccl_profile_4gpu_631b9bd.yaml" \
  --out "$out/h200-calibrated.yaml" >"$out/logs/refit.log" 2>&1 || status=1
tail -2 "$out/logs/refit.log"
(cd "$out" && tar cJf logs.tar.xz logs && rm -rf logs)
xz -T0 -f "$out/cal.db"
echo "== done, status $status ($(date -u +%H:%M:%S))"
exit $status
