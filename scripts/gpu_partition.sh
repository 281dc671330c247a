#!/usr/bin/env bash
# The attention partition in the twin (issue #6, docs/calibration.md "Attention partition"): the
# decode attention's split size follows the engine's KV capacity; calibrate measured the
# speculative graphs at its own capacity (the context plus one round) and the runs hold their
# whole output, so Qwen3-30B-A3B's graphs at 8K were measured at 128-token splits and run at
# 192-token ones (scripts/gpu_spec_capacity.sh measured the difference: verify 1.4-3.0 % faster).
# calibrate now measures the graphs at three split sizes at the largest context (spec_partitions)
# and the residual's corrections are kept per split size.
#   1. the attention kernel tests (the partition rule moved to kernels/attention_split.h) and
#      calibrate's GPU tests;
#   2. into a copy of results/h200/calibration_d1f6e37.db.xz (sessions 1-51): session 52 =
#      calibrate --partition-only for llama-3-8b and qwen3-30b-a3b (read, not fitted), session 53
#      = Qwen3-30B-A3B's speculative graphs again (its session 46's grid, now at three split sizes
#      at 8192);
#   3. the profile refitted with session 53 in place of 46, then h200_moe_spec.yaml measured and
#      simulated against it (scripts/gpu_moe_spec.sh without its tests).
#   TWINSTEP_COMMIT=<sha> scripts/gpu_partition.sh OUT_DIR
# Writes OUT_DIR/{cal.db.xz,h200-calibrated.yaml,logs.tar.xz,spec.tar}.
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: scripts/gpu_partition.sh OUT_DIR}"
recal_build twinstep kernels_test runtime_calibrate_gpu_test runtime_spec_gpu_test ||
  recal_finish cal
recal_kernel_tests 'Attention*:*/Attention*'
step "calibrate GPU tests"
"$build/tests/runtime/runtime_calibrate_gpu_test" --gtest_filter='Calibrate.*' \
  >"$logs/calibrate_tests.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]" "$logs/calibrate_tests.log"
recal_base_db "$root/results/h200/calibration_d1f6e37.db.xz" 52 51
[ "$first" = 52 ] || { echo "expected the next session to be 52, got $first"; status=1; }
step "sessions 52-53"
run_cal partition --partition-only --models llama-3-8b,qwen3-30b-a3b
run_cal qwen3_spec --spec-only --models qwen3-30b-a3b
grep -E "speculative graphs, ctx" "$logs/qwen3_spec.log"
RECAL_SPEC_SESSIONS="33,37,38,41,42,43,44,48,49,53" \
  recal_refit "2,22,29,32,33,37,38,40,41,42,43,44,45,47,48,49,50,51,53"
cp "$out/h200-calibrated.yaml" "$logs/"
"$ts" calibrate-eval --profile "$out/h200-calibrated.yaml" --db "$out/cal.db" --sessions 53 \
  >"$logs/eval_qwen3_spec.txt" 2>&1 || status=1
grep -E "^qwen3-30b-a3b +verify +graph +1 " "$logs/eval_qwen3_spec.txt" | cut -c1-160
step "validation-h200-moe-spec against the refitted profile"
mkdir -p "$out/profiles" && cp "$out/h200-calibrated.yaml" "$out/profiles/"
TWINSTEP_BUILD_DIR=$build TWINSTEP_PREBUILT=1 TWINSTEP_PROFILES="$out/profiles" MOE_SPEC_TESTS=0 \
  bash "$root/scripts/gpu_moe_spec.sh" "$out/spec" >"$logs/spec.log" 2>&1 || status=1
grep -E "tpot_ms_mean|itl_ms_p99" "$out/spec/sim_vs_real.txt"
[ -f "$out/spec/moe_spec.db" ] && xz -T0 -f "$out/spec/moe_spec.db"
(cd "$out" && tar cf spec.tar spec && rm -rf spec profiles)
step done
recal_finish cal
