# Sourced by the recalibration scripts (gpu_split_rule.sh, gpu_attention_wave.sh,
# gpu_recal_main.sh, gpu_spec_batches.sh) and gpu_spec_suite.sh: the output folder, the build, calibration sessions into
# a copy of a committed database, the refit with the committed collective tables, and the packing
# of what comes back. Every function records a failure in `status` and goes on.
#
# recal_init OUT_DIR: out (absolute), logs (OUT/logs), root and SQLite (gpu_env.sh), build
#   (TWINSTEP_BUILD_DIR or root/build), ts (its twinstep), status 0.
recal_init() {
  out=$1
  mkdir -p "$out/logs"
  out=$(cd "$out" && pwd)
  logs=$out/logs
  source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
  build=${TWINSTEP_BUILD_DIR:-$root/build}
  ts=$build/twinstep
  status=0
}
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }
# recal_build TARGET...: builds them (gpu_build) and writes logs/gpu.txt; returns 1 on failure.
recal_build() {
  step build
  gpu_build "$logs" "$@" || { status=1; return 1; }
  gpu_check_commit "$ts" || { status=1; return 1; }
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$logs/gpu.txt"
}
# recal_kernel_tests GTEST_FILTER: kernels_test on those tests (logs/tests.log), its summary.
recal_kernel_tests() {
  step "kernel tests ($1)"
  "$build/tests/kernels/kernels_test" --gtest_filter="$1" >"$logs/tests.log" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]" "$logs/tests.log"
}
# recal_bench SECTION: the kernel benchmark's section -> OUT/SECTION.json (logs/bench.log).
recal_bench() {
  step "bench $1"
  "$build/kernels/twinstep_kernels_bench" --only "$1" --out "$out/$1.json" \
    --commit "${TWINSTEP_COMMIT:-unknown}" >"$logs/bench.log" 2>&1 || status=1
  grep -E "^(floor|$1)" "$logs/bench.log" | cut -c1-170
}
# recal_base_db COMMITTED_DB_XZ FALLBACK_ID [LAST]: OUT/cal.db from it, cut to sessions 1..LAST
# when given (the committed calibration is cumulative: its first sessions are what an earlier
# file held); first = its next session id (FALLBACK_ID where the sqlite3 shell is missing).
recal_base_db() {
  python3 "$root/scripts/cut_calibration.py" "$1" "$out/cal.db" ${3:+"$3"} || status=1
  first=$(sqlite3 "$out/cal.db" "select max(id) + 1 from calibration_session" 2>/dev/null || echo "$2")
}
# run_cal NAME ARGS...: twinstep calibrate ARGS into OUT/cal.db (logs/NAME.{yaml,log}).
run_cal() {
  local name=$1
  shift
  echo "-- $name ($(date -u +%H:%M:%S))"
  "$ts" --db "$out/cal.db" calibrate --out "$logs/$name.yaml" "$@" >"$logs/$name.log" 2>&1 ||
    { status=1; tail -5 "$logs/$name.log"; }
}
# recal_refit SESSIONS: the profile of those sessions of OUT/cal.db with the committed collective
# tables (2 GPUs of 583eee2, 4 GPUs of 631b9bd) -> OUT/h200-calibrated.yaml (logs/refit.log).
# RECAL_SPEC_SESSIONS: the ones among them whose speculative graphs are fitted (--spec-sessions).
recal_refit() {
  step "refit: sessions $1${RECAL_SPEC_SESSIONS:+, speculative graphs of $RECAL_SPEC_SESSIONS}"
  "$ts" --db "$out/cal.db" calibrate --fit-only --sessions "$1" \
    ${RECAL_SPEC_SESSIONS:+--spec-sessions "$RECAL_SPEC_SESSIONS"} \
    --collectives-from "$root/results/h200/nccl_profile_583eee2.yaml" \
    --collectives-from "$root/results/h200/nccl_profile_4gpu_631b9bd.yaml" \
    --out "$out/h200-calibrated.yaml" >"$logs/refit.log" 2>&1 || status=1
  tail -2 "$logs/refit.log"
}
# recal_heldout GREP_PATTERN: Llama-3.2-3B (never fitted) beside Llama-3-8B in one calibrate
# session at the one-GPU validation's capacities (ctx 1K / 8K, batches 1 and 8) into
# OUT/heldout.db, priced with OUT/h200-calibrated.yaml (logs/heldout_eval.txt; the matching lines
# printed).
recal_heldout() {
  step "held-out calibrate session"
  "$ts" --db "$out/heldout.db" calibrate --out "$logs/heldout.yaml" \
    --models llama-3-8b,llama-3.2-3b --contexts 1024,8192 --batches 1,8 --no-spec --no-prefill \
    >"$logs/heldout_calibrate.log" 2>&1 || status=1
  "$ts" calibrate-eval --profile "$out/h200-calibrated.yaml" --db "$out/heldout.db" --by-batch \
    >"$logs/heldout_eval.txt" 2>&1 || status=1
  grep -E "$1" "$logs/heldout_eval.txt"
}
# recal_finish DB...: logs into OUT/logs.tar.xz, each OUT/DB.db xz-compressed; exits with status.
recal_finish() {
  (cd "$out" && tar cJf logs.tar.xz logs && rm -rf logs)
  local db
  for db in "$@"; do [ -f "$out/$db.db" ] && xz -T0 -f "$out/$db.db"; done
  exit "$status"
}
