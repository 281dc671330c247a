#!/usr/bin/env bash
# A speculative step's bytes_read on the real backend, counted launch by launch as the simulator
# counts them (issue #6; docs/calibration.md "Speculative steps' bytes"), on a machine with a GPU:
#   1. the speculative runtime suite's tiny-model tests (with
#      TinySpec.StepBytesEqualTheSimulatorReplayingTheRun: every step's bytes equal to the
#      simulator's replaying the run's rounds) and the engine's GPU tests;
#   2. experiments/validation/h200_spec_trace.yaml (Llama-3-8B batch 1, chain(5) and
#      confidence/device at 1K and 8K, real and simulated) into a copy of the speculative suite's
#      database (its acceptance calibration), then compare: achieved_tbps and pct_of_floor of the
#      real runs against the simulated ones (before: the real backend counted a verify as one
#      plain decode step and no draft, results/h200/spec_trace_6d90284.db.xz).
#   TWINSTEP_COMMIT=<sha> scripts/gpu_spec_bytes.sh OUT_DIR
# Writes OUT_DIR/{trace.db.xz,compare.txt,logs.tar.xz}.
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: scripts/gpu_spec_bytes.sh OUT_DIR}"
recal_build twinstep runtime_spec_gpu_test runtime_gpu_test || recal_finish trace
step "speculative tiny-model tests"
"$build/tests/runtime/runtime_spec_gpu_test" \
  --gtest_filter='TinySpec.*:SpecTiny.*:SpecMoe.Tiny*:SpecMoe.Recorded*' \
  >"$logs/spec_tests.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]|Failure" "$logs/spec_tests.log" | head -20
step "engine tests"
"$build/tests/runtime/runtime_gpu_test" >"$logs/engine_tests.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]" "$logs/engine_tests.log" | head -20
step "h200_spec_trace, real and simulated"
xz -dc "$root/results/h200/spec_suite_90834c8.db.xz" >"$out/trace.db"
"$ts" --db "$out/trace.db" run "$root/experiments/validation/h200_spec_trace.yaml" \
  >"$logs/trace.log" 2>&1 || { status=1; tail -5 "$logs/trace.log"; }
"$ts" --db "$out/trace.db" compare >"$out/compare.txt" 2>&1 || status=1
grep -E "^(variant|backend|tpot_ms_mean|accept_len_mean|achieved_tbps|pct_of_floor|floor_ms) " \
  "$out/compare.txt" | cut -c1-220
step done
recal_finish trace
