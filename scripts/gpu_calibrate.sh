#!/usr/bin/env bash
# Calibrate this GPU and validate the calibrated simulator against the real runtime
# (docs/calibration.md):
#   1. build twinstep and the calibration GPU test;
#   2. the GPU test (calibrate --quick on llama-3.2-3b: profile loads, fitted sim vs its steps);
#   3. twinstep calibrate (full grid) -> OUT/h200-calibrated.yaml, samples in OUT/validation.db;
#   4. every experiments/validation/*.yaml with hardware: h200-calibrated (named NAME-calibrated),
#      sim and real, into OUT/validation.db; compare --sim-vs-real tables.
#   scripts/gpu_calibrate.sh OUT_DIR
# Writes OUT_DIR/{configure,build,calibrate_test,calibrate}.log, h200-calibrated.yaml,
# validation.db, <name>.sim_vs_real.txt. Copy the profile to results/profiles/ to commit it.
# Env: TWINSTEP_CMAKE_ARGS extra configure flags; TWINSTEP_BUILD_DIR (default build-calib);
# CALIBRATE_ARGS extra calibrate flags (e.g. --quick).
set -uo pipefail
out=${1:?usage: scripts/gpu_calibrate.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build-calib}
status=0
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }

step configure
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  ${TWINSTEP_CMAKE_ARGS:-} >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
step build
cmake --build "$build" -j"$(nproc)" --target twinstep runtime_calibrate_gpu_test \
  >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"

step "calibrate test (quick)"
"$build/tests/runtime/runtime_calibrate_gpu_test" >"$out/calibrate_test.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |kernel_class|^[a-z_]+ +[0-9]+ |measured .* fitted" \
  "$out/calibrate_test.log"

step calibrate
db="$out/validation.db"
profile="$out/h200-calibrated.yaml"
"$build/twinstep" calibrate --out "$profile" --db "$db" ${CALIBRATE_ARGS:-} \
  >"$out/calibrate.log" 2>&1 || { status=1; tail -30 "$out/calibrate.log"; }
cat "$out/calibrate.log" | grep -v "^calibrate: " || true

if [ -f "$profile" ]; then
  export TWINSTEP_PROFILES="$out"
  mkdir -p "$out/experiments"
  for exp in "$root"/experiments/validation/*.yaml; do
    name=$(basename "$exp" .yaml)
    # Multi-GPU (TP2, TP2-EP2): under mpirun (scripts/gpu_tp.sh, EP=1 for the EP one).
    case $name in *_tp[0-9]* | *_ep[0-9]*) continue ;; esac
    # Their own scripts: speculative decoding (gpu_spec_validation.sh, minutes and ordered
    # runs) and the MoE model (gpu_moe.sh, 61 GB of weights).
    case $name in *_spec* | *_moe*) continue ;; esac
    cal="$out/experiments/$name-calibrated.yaml"
    sed -e 's/^hardware: h200$/hardware: h200-calibrated/' \
        -e 's/^name: \(.*\)$/name: \1-calibrated/' "$exp" >"$cal"
    grep -q '^hardware: h200-calibrated$' "$cal" || { echo "$exp: no 'hardware: h200' line"; status=1; continue; }
    xname=$(sed -n 's/^name: //p' "$cal")
    step "validation $xname"
    "$build/twinstep" --db "$db" run -q "$cal" >"$out/$name.run.txt" 2>"$out/$name.err" || status=1
    tail -3 "$out/$name.err"
    "$build/twinstep" --db "$db" compare --experiment "$xname" --sim-vs-real \
      --metrics tpot_ms_mean itl_ms_p99 step_ms_mean gpu_busy_frac | tee "$out/$name.sim_vs_real.txt"
  done
fi
exit $status
