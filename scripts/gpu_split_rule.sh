#!/usr/bin/env bash
# The GEMV split rule of d6e1903+ (kernels/gemv_split.h: S = 1 but for shapes of at most ~100
# tiles; docs/kernels.md round 11) measured and recalibrated in one call:
#   1. build; the GEMV / LM-head / MoE kernel tests; the `gemv_split` bench section (the rule's
#      choice beside forced splits and rings);
#   2. the calibration sessions whose shapes the rule changed, measured again in a copy of the
#      committed calibration database (results/h200/calibration_e8341f9.db.xz): Qwen3-30B-A3B's
#      grid (its qkv 5120 x 2048 was S = 2) and speculative graphs, Llama-3-8B's TP2 shard grid
#      (qkv 3072 x 4096 was S = 4, lm_head S = 2) and speculative graphs; the sessions they
#      stand for (1, 7, 3, 6) are left out of the refit, the others kept;
#   3. the refit -> OUT/h200-calibrated.yaml, its calibrate-eval;
#   4. Llama-3.2-3B (never fitted; its qkv was S = 2, down_proj S = 4) beside Llama-3-8B in one
#      calibrate session, priced with the new profile (calibrate-eval).
#   scripts/gpu_split_rule.sh OUT_DIR
# Writes OUT_DIR/{gemv_split.json,h200-calibrated.yaml,cal.db.xz,heldout.db.xz,logs.tar.xz}.
# Env: TWINSTEP_COMMIT.
set -uo pipefail
out=${1:?usage: scripts/gpu_split_rule.sh OUT_DIR}
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
logs=$out/logs
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
ts=$build/twinstep
status=0
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }
finish() {
  (cd "$out" && tar cJf logs.tar.xz logs && rm -rf logs)
  for db in cal heldout; do [ -f "$out/$db.db" ] && xz -T0 -f "$out/$db.db"; done
  exit $status
}
step build
gpu_build "$logs" twinstep twinstep_kernels_bench kernels_test || { status=1; finish; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$logs/gpu.txt"
step "kernel tests"
"$build/tests/kernels/kernels_test" --gtest_filter='*Gemv*:*LmHead*:*Moe*' >"$logs/tests.log" 2>&1 ||
  status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]" "$logs/tests.log"
step bench
"$build/kernels/twinstep_kernels_bench" --only gemv_split --out "$out/gemv_split.json" \
  --commit "${TWINSTEP_COMMIT:-unknown}" >"$logs/bench.log" 2>&1 || status=1
grep -E "^(floor|gemv_split)" "$logs/bench.log" | cut -c1-150
step "calibration sessions"
xz -dc "$root/results/h200/calibration_e8341f9.db.xz" >"$out/cal.db"
first=$(sqlite3 "$out/cal.db" "select max(id) + 1 from calibration_session" 2>/dev/null || echo 24)
run_cal() {  # NAME ARGS...
  local name=$1
  shift
  echo "-- $name"
  "$ts" --db "$out/cal.db" calibrate --out "$logs/$name.yaml" "$@" >"$logs/$name.log" 2>&1 ||
    { status=1; tail -5 "$logs/$name.log"; }
}
run_cal qwen3 --models qwen3-30b-a3b --contexts 128,1024 --batches 1,2,4,8,16 --no-spec
run_cal qwen3_spec --spec-only --models qwen3-30b-a3b
run_cal tp2 --models llama-3-8b --tp 2 --contexts 128,1024 --batches 1,2,4,8,16 --no-spec
run_cal tp2_spec --spec-only --tp 2 --models llama-3-8b
new="$first,$((first + 1)),$((first + 2)),$((first + 3))"
echo "new sessions: $new"
step refit
"$ts" --db "$out/cal.db" calibrate --fit-only --sessions "2,4,5,12,15,21,22,23,$new" \
  --collectives-from "$root/results/h200/nccl_profile_583eee2.yaml" \
  --collectives-from "$root/results/h200/nccl_profile_4gpu_631b9bd.yaml" \
  --out "$out/h200-calibrated.yaml" >"$logs/refit.log" 2>&1 || status=1
tail -3 "$logs/refit.log"
step "held-out calibrate session"
"$ts" --db "$out/heldout.db" calibrate --out "$logs/heldout.yaml" \
  --models llama-3-8b,llama-3.2-3b --contexts 1024,8192 --batches 1,8 --no-spec --no-prefill \
  >"$logs/heldout_calibrate.log" 2>&1 || status=1
"$ts" calibrate-eval --profile "$out/h200-calibrated.yaml" --db "$out/heldout.db" --by-batch \
  >"$logs/heldout_eval.txt" 2>&1 || status=1
grep -E "^llama-3.2-3b +(down_proj|qkv_proj) +[18] |^llama-3.2-3b +(pdl|graph) " \
  "$logs/heldout_eval.txt"
finish
