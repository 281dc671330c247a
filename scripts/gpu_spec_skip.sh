#!/usr/bin/env bash
# What a confidence round's draft pays for the steps it skips, and its rounds traced (issue #6,
# docs/calibration.md "Speculative suite"): Llama-3-8B's speculative graphs measured again with
# calibrate's early-exit drafts that stop after one token in graphs of 3, 7 and 15 steps (sample
# draft_early_exit_skip), at 1, 4 and 32 requests, then at a 1K context (batch 1: where the
# suite's confidence rounds ran), into a copy of the committed calibration (6d90284 ran it on
# calibration_735cee4.db.xz, sessions 1-34: they made 35 and 36 of calibration_d1f6e37.db.xz,
# which replaced it; on that file this script adds 39 and 40); and
# experiments/validation/h200_spec_trace.yaml (every batch-1 round launch by launch, both
# backends) into a copy of the suite's database (its acceptance calibration), after the
# calibrate GPU tests.
#   scripts/gpu_spec_skip.sh OUT_DIR
# Writes OUT_DIR/{cal.db.xz,trace.db.xz,logs.tar.xz}.
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: scripts/gpu_spec_skip.sh OUT_DIR}"
recal_build twinstep runtime_calibrate_gpu_test || recal_finish cal trace
step "calibrate GPU tests"
"$build/tests/runtime/runtime_calibrate_gpu_test" --gtest_filter='Calibrate.*' \
  >"$logs/calibrate_tests.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]" "$logs/calibrate_tests.log"
recal_base_db "$root/results/h200/calibration_d1f6e37.db.xz" 39 38
step "speculative graphs with skipped early-exit steps"
run_cal spec_skip --spec-only --models llama-3-8b --spec-batches 1,4,32
grep -E "stopping after 1|batch 1 ctx [0-9]+ W (2|16):" "$logs/spec_skip.log" | cut -c1-160
run_cal spec_1k --spec-only --models llama-3-8b --contexts 1024 --spec-batches 1
grep -E "stopping after 1|W (2|6|16):" "$logs/spec_1k.log" | cut -c1-160
step "traced batch-1 rounds"
xz -dc "$root/results/h200/spec_suite_90834c8.db.xz" >"$out/trace.db"
"$ts" --db "$out/trace.db" run "$root/experiments/validation/h200_spec_trace.yaml" \
  >"$logs/trace.log" 2>&1 || { status=1; tail -5 "$logs/trace.log"; }
grep -E "^(variant|tpot_ms_mean|accept_len_mean) " "$logs/trace.log" | cut -c1-200
step done
recal_finish cal trace
