#!/usr/bin/env bash
# Speculative decoding on the real runtime (docs/runtime.md "Speculative decoding"), on a machine
# with a CUDA GPU: builds, runs the runtime suites (CPU and GPU; the speculative one prints the
# fidelity dial and the confidence calibration), then a small measurement.
#   scripts/gpu_spec.sh OUT_DIR
# Writes OUT_DIR/{configure,build,cpu_tests,gpu_tests,spec_tests,spec_bench}.log, spec.json.
# Env: TWINSTEP_BUILD_DIR (default build), TWINSTEP_CMAKE_ARGS, TWINSTEP_COMMIT,
# SPEC_FIDELITIES (default 0.5,0.95), SPEC_PROMPT (8192), SPEC_OUTPUT (256), SPEC_REQUESTS (3),
# SPEC_THRESHOLD (confidence threshold, default 0.2).
# Budget: about 6 minutes of GPU time after the build.
set -uo pipefail
out=${1:?usage: scripts/gpu_spec.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
start=$(date +%s)

gpu_build "$out" runtime_cpu_test runtime_gpu_test runtime_spec_gpu_test twinstep_spec_bench ||
  exit 1
echo "built in $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"

find_exe() { find "$build" -name "$1" -type f -perm -u+x | head -1; }
status=0
"$(find_exe runtime_cpu_test)" >"$out/cpu_tests.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED) |fidelity .* bigram" "$out/cpu_tests.log"
# The plain-decode suite still passes with the engine changes (relay, prefill, output rows).
timeout 300 "$(find_exe runtime_gpu_test)" >"$out/gpu_tests.log" 2>&1 || status=1
grep -E "^\[  (FAILED|PASSED|SKIPPED) " "$out/gpu_tests.log"
# Speculative suite: CPU-reference acceptance, speculative == plain greedy (tiny and 8B), rerun
# equality, fidelity sweep (accept length per F, acceptance per confidence bucket), checkpoint.
timeout 420 "$(find_exe runtime_spec_gpu_test)" >"$out/spec_tests.log" 2>&1 || status=1
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[       OK|Failure|fidelity|accept length|rounds of" \
  "$out/spec_tests.log" | head -80

timeout 420 "$(find_exe twinstep_spec_bench)" --out "$out" --commit "${TWINSTEP_COMMIT:-}" \
  --fidelity "${SPEC_FIDELITIES:-0.5,0.95}" --prompt "${SPEC_PROMPT:-8192}" \
  --output "${SPEC_OUTPUT:-256}" --requests "${SPEC_REQUESTS:-3}" \
  --threshold "${SPEC_THRESHOLD:-0.2}" 2>&1 | tee "$out/spec_bench.log" ||
  status=1
echo "gpu_spec.sh done in $(( $(date +%s) - start )) s, status $status"
exit $status
