#!/usr/bin/env bash
# Speculative decoding of the MoE model on one GPU (its draft module an MoE layer,
# runtime/engine_spec.cc): the MoE kernel tests (rows independent of their batch, inactive rows
# select no expert), the speculative tests (tiny MoE and Qwen3-30B-A3B greedy output equal to
# plain greedy in every mode, the dense tiny and 8B ones; drafts loaded from checkpoints), then
# experiments/validation/h200_moe_spec_calibration.yaml (a chain of 7, real only: the verify
# rounds the simulator replays), h200_moe_spec_calibration_offset.yaml (a chain of 6: the bonus
# tokens the chain of 7 never drafts) and h200_moe_spec.yaml (none, chain(5), confidence on the device;
# measured and simulated with the profile named in it) into OUT/moe_spec.db, then the comparisons.
#   scripts/gpu_moe_spec.sh OUT_DIR
# Writes OUT_DIR/{moe_kernel_tests,spec_tests,calibration,run}.log, sim_vs_real.txt, accept.txt, metrics.csv and
# moe_spec.db. Env: TWINSTEP_BUILD_DIR (default build), TWINSTEP_CMAKE_ARGS, TWINSTEP_PROFILES
# (where h200-calibrated.yaml is read from; default results/profiles), MOE_SPEC_TESTS (1; 0 skips
# the tests). Budget: about 4 minutes of GPU time after the build (61 GB of weights per engine).
set -uo pipefail
out=${1:?usage: scripts/gpu_moe_spec.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
start=$(date +%s)
step() { echo "== $1 (+$(( $(date +%s) - start )) s)"; }
gpu_build "$out" twinstep runtime_spec_gpu_test kernels_test || exit 1
status=0
if [ "${MOE_SPEC_TESTS:-1}" = 1 ]; then
  step "MoE kernel tests"
  timeout 120 "$build/tests/kernels/kernels_test" --gtest_filter='Moe*' >"$out/moe_kernel_tests.log" 2>&1 ||
    status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure" "$out/moe_kernel_tests.log"
  step "speculative tests (MoE, dense tiny and 8B, checkpoints)"
  timeout 300 "$build/tests/runtime/runtime_spec_gpu_test" \
    --gtest_filter='SpecMoe.*:SpecCheckpoint.*:TinySpec.*:Spec8B.*' >"$out/spec_tests.log" 2>&1 ||
    status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[       OK|Failure|accept length" "$out/spec_tests.log"
fi
cd "$root"
db="$out/moe_spec.db"
rm -f "$db"
step "calibration runs (chain of 7)"
timeout 300 "$build/twinstep" --db "$db" run -q experiments/validation/h200_moe_spec_calibration.yaml \
  >"$out/calibration.log" 2>&1 || { status=1; tail -5 "$out/calibration.log"; }
step "calibration runs (chain of 6: the bonus tokens)"
timeout 300 "$build/twinstep" --db "$db" run -q experiments/validation/h200_moe_spec_calibration_offset.yaml \
  >"$out/calibration_offset.log" 2>&1 || { status=1; tail -5 "$out/calibration_offset.log"; }
step "validation runs"
timeout 400 "$build/twinstep" --db "$db" run -q experiments/validation/h200_moe_spec.yaml \
  >"$out/run.log" 2>&1 || status=1
tail -20 "$out/run.log"
x=validation-h200-moe-spec
"$build/twinstep" --db "$db" compare --experiment $x --sim-vs-real \
  --metrics tpot_ms_mean itl_ms_p99 accept_len_mean step_time_estimate_ms gpu_busy_frac ttft_ms_mean |
  tee "$out/sim_vs_real.txt" || status=1
"$build/twinstep" --db "$db" compare --experiment $x --accept >"$out/accept.txt" 2>&1 || status=1
grep -E "mean|tv_distance" "$out/accept.txt"
"$build/twinstep" --db "$db" query --csv "SELECT r.id, r.variant_label, r.backend, m.key,
  round(m.value, 4) FROM run r JOIN metric m ON m.run_id = r.id WHERE m.key IN ('tpot_ms_mean',
  'accept_len_mean', 'step_time_estimate_ms', 'gpu_busy_frac') ORDER BY r.id, m.key" \
  >"$out/metrics.csv" 2>&1 || status=1
step done
exit $status
