#!/usr/bin/env bash
# Issue #5 on a machine with a CUDA GPU: speculative decoding measured and simulated side by side.
# Runs the speculative runtime suite, then experiments/validation/h200_spec_calibration.yaml (the
# measured verify rounds the simulator replays) and experiments/validation/h200_spec.yaml (none,
# chain(5), confidence in three modes at two draft fidelities, real and simulated), then the
# comparisons: accept-length distributions (compare --accept), TPOT side by side.
#   scripts/gpu_spec_validation.sh OUT_DIR
# Writes OUT_DIR/{spec_tests.log, calibration.log, spec_run.log, accept.txt, sim_vs_real.txt,
# compare.txt, replay_accept.txt, spec_validation.db}. Env: TWINSTEP_BUILD_DIR (default build), TWINSTEP_CMAKE_ARGS,
# SPEC_STEPS (default "tests calibration spec": a subset runs part of it, so the work can be
# split over calls; the database lives in the build directory between them),
# SPEC_TEST_FILTER (gtest filter for the speculative suite, default all).
# Budget: about 9 minutes of GPU time after the build (the experiments' comments say what runs).
set -uo pipefail
out=${1:?usage: scripts/gpu_spec_validation.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
start=$(date +%s)
gpu_build "$out" twinstep runtime_spec_gpu_test || exit 1
echo "built at +$(( $(date +%s) - start )) s"

find_exe() { find "$build" -name "$1" -type f -perm -u+x | head -1; }
bin=$(find_exe twinstep)
db="$build/spec_validation.db"
steps=${SPEC_STEPS:-tests calibration spec}
status=0
has() { [[ " $steps " == *" $1 "* ]]; }
if has tests; then
  timeout 420 "$(find_exe runtime_spec_gpu_test)" --gtest_filter="${SPEC_TEST_FILTER:-*}" \
    >"$out/spec_tests.log" 2>&1 || status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[       OK|Failure" "$out/spec_tests.log" | head -40
  echo "spec tests done at +$(( $(date +%s) - start )) s"
fi
cd "$root"
if has calibration; then
  rm -f "$db" "$db-wal" "$db-shm"
  "$bin" --db "$db" run -q experiments/validation/h200_spec_calibration.yaml \
    >"$out/calibration.log" 2>&1 || { status=1; tail -5 "$out/calibration.log"; }
  echo "calibration runs done at +$(( $(date +%s) - start )) s"
fi
if ! has spec; then
  cp "$db"* "$out/"
  exit $status
fi
"$bin" --db "$db" run -q experiments/validation/h200_spec.yaml >"$out/spec_run.log" 2>&1 ||
  { status=1; tail -5 "$out/spec_run.log"; }
echo "spec runs done at +$(( $(date +%s) - start )) s"
"$bin" --db "$db" compare --experiment h200-spec --accept >"$out/accept.txt" 2>&1 || status=1
"$bin" --db "$db" compare --experiment h200-spec --sim-vs-real \
  --metrics tpot_ms_mean accept_len_mean step_time_estimate_ms gpu_busy_frac \
  >"$out/sim_vs_real.txt" 2>&1 || status=1
"$bin" --db "$db" compare --experiment h200-spec --csv >"$out/compare.txt" 2>&1 || status=1
"$bin" --db "$db" query "SELECT r.variant_label, r.backend, m.key, round(m.value, 4) FROM metric m
  JOIN run r ON r.id = m.run_id WHERE m.key IN ('tpot_ms_mean', 'accept_len_mean',
  'step_time_estimate_ms') ORDER BY r.id" 2>&1 | tee "$out/summary_metrics.txt"
grep -E "mean|tv_distance" "$out/accept.txt"
# The replay (h200_spec_replay.yaml): f0.87 simulated from the measured f0.87/device rounds.
"$bin" --db "$db" run -q experiments/validation/h200_spec_replay.yaml >"$out/replay_run.log" 2>&1 ||
  status=1
ids() {  # the latest complete runs of experiment $1 on backend $2, by variant
  "$bin" --db "$db" query --csv "SELECT max(r.id) FROM run r JOIN experiment e ON
    e.id = r.experiment_id WHERE e.name = '$1' AND r.backend = '$2' AND r.status = 'complete'
    GROUP BY r.variant_index ORDER BY r.variant_index" | tail -n +2
}
"$bin" --db "$db" compare --accept $(ids h200-spec-replay sim) $(ids h200-spec real) \
  >"$out/replay_accept.txt" 2>&1 || status=1
grep -E "mean|tv_distance" "$out/replay_accept.txt"
cp "$db"* "$out/"
echo "gpu_spec_validation.sh done in $(( $(date +%s) - start )) s, status $status"
exit $status
