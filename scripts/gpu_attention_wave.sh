#!/usr/bin/env bash
# The attention split count rounded down to one wave of blocks (AttentionTuning::
# splits_within_one_wave; docs/kernels.md round 12) measured and recalibrated in one call:
#   1. build; the attention kernel tests; the `attention_batch` bench section (2-32 requests at
#      ctx 1K / 2K / 8K over a run's capacity, one wave beside the old round-up, side by side);
#   2. the calibration sessions whose attention launches the rule changed (every batch of 2 or
#      more requests whose requests x KV heads do not divide 2 x SMs), measured again in a copy of
#      results/h200/calibration_0bf7f6f.db.xz: Llama-3-8B's main session (28's command),
#      Qwen3-30B-A3B's grid and speculative graphs (24, 25), Llama-3-8B TP2's grid and
#      speculative graphs (26, 27); the refit keeps 2, 4, 12, 15, 21-23 and takes the new ones in
#      place of 24-28 -> OUT/h200-calibrated.yaml;
#   3. Llama-3.2-3B (never fitted) beside Llama-3-8B in one calibrate session at the one-GPU
#      validation's capacities (ctx 1K / 8K, batches 1 and 8), priced with the new profile.
#   scripts/gpu_attention_wave.sh OUT_DIR
# Writes OUT_DIR/{attention_batch.json,h200-calibrated.yaml,cal.db.xz,heldout.db.xz,logs.tar.xz}.
# Env: TWINSTEP_COMMIT.
set -uo pipefail
out=${1:?usage: scripts/gpu_attention_wave.sh OUT_DIR}
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
step "attention tests"
"$build/tests/kernels/kernels_test" --gtest_filter='*Attention*' >"$logs/tests.log" 2>&1 ||
  status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]" "$logs/tests.log"
step bench
"$build/kernels/twinstep_kernels_bench" --only attention_batch --out "$out/attention_batch.json" \
  --commit "${TWINSTEP_COMMIT:-unknown}" >"$logs/bench.log" 2>&1 || status=1
grep -E "^(floor|attention_batch)" "$logs/bench.log" | cut -c1-170
step "calibration sessions"
xz -dc "$root/results/h200/calibration_0bf7f6f.db.xz" >"$out/cal.db"
first=$(sqlite3 "$out/cal.db" "select max(id) + 1 from calibration_session" 2>/dev/null || echo 29)
run_cal() {  # NAME ARGS...
  local name=$1
  shift
  echo "-- $name ($(date -u +%H:%M:%S))"
  "$ts" --db "$out/cal.db" calibrate --out "$logs/$name.yaml" "$@" >"$logs/$name.log" 2>&1 ||
    { status=1; tail -5 "$logs/$name.log"; }
}
run_cal main
run_cal qwen3 --models qwen3-30b-a3b --contexts 128,1024 --batches 1,2,4,8,16 --no-spec
run_cal qwen3_spec --spec-only --models qwen3-30b-a3b
run_cal tp2 --models llama-3-8b --tp 2 --contexts 128,1024 --batches 1,2,4,8,16 --no-spec
run_cal tp2_spec --spec-only --tp 2 --models llama-3-8b
new="$first,$((first + 1)),$((first + 2)),$((first + 3)),$((first + 4))"
echo "new sessions: $new"
step refit
"$ts" --db "$out/cal.db" calibrate --fit-only --sessions "2,4,12,15,21,22,23,$new" \
  --collectives-from "$root/results/h200/nccl_profile_583eee2.yaml" \
  --collectives-from "$root/results/h200/nccl_profile_4gpu_631b9bd.yaml" \
  --out "$out/h200-calibrated.yaml" >"$logs/refit.log" 2>&1 || status=1
tail -3 "$logs/refit.log"
"$ts" calibrate-eval --profile "$out/h200-calibrated.yaml" --db "$out/cal.db" --sessions "$first" \
  --by-batch >"$logs/main_eval.txt" 2>&1 || status=1
grep -E "^steps|^llama-3-8b +attention " "$logs/main_eval.txt"
step "held-out calibrate session"
"$ts" --db "$out/heldout.db" calibrate --out "$logs/heldout.yaml" \
  --models llama-3-8b,llama-3.2-3b --contexts 1024,8192 --batches 1,8 --no-spec --no-prefill \
  >"$logs/heldout_calibrate.log" 2>&1 || status=1
"$ts" calibrate-eval --profile "$out/h200-calibrated.yaml" --db "$out/heldout.db" --by-batch \
  >"$logs/heldout_eval.txt" 2>&1 || status=1
grep -E "^llama-3.2-3b +attention +[18] |^llama-3.2-3b +(pdl|graph) " "$logs/heldout_eval.txt"
step done
finish
