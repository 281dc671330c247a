#!/usr/bin/env bash
# cuBLAS loaded on first use (runtime/cublas_loader.h) checked on a GPU machine in one call: the
# binary links no libcublas and starts in milliseconds; the loader, engine and speculative suites
# pass (prefill GEMMs through the loaded library); the batch-1 decode validation runs on both
# backends (its prefills are cuBLAS GEMMs) and is compared; bench-sim's wall time and memory.
#   scripts/gpu_cublas_lazy.sh OUT_DIR
# Writes OUT_DIR/{configure,build}.log, startup.txt, tests_*.log, decode.db, compare.txt,
# bench_sim.txt. Env: TWINSTEP_COMMIT, TWINSTEP_BUILD_DIR (default build).
set -uo pipefail
out=${1:?usage: scripts/gpu_cublas_lazy.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
status=0
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }
step build
gpu_build "$out" twinstep runtime_cublas_loader_test runtime_gpu_test runtime_spec_gpu_test || exit 1
gpu_check_commit "$build/twinstep" || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
step "start-up: libraries, time and memory of --version"
{
  echo "# ldd $build/twinstep | grep -E 'cublas|cudart|nccl'"
  ldd "$build/twinstep" | grep -E 'cublas|cudart|nccl'
  for i in 1 2 3; do /usr/bin/time -f "twinstep --version: %e s wall, %M KB max RSS" \
    "$build/twinstep" --version >/dev/null; done
} >"$out/startup.txt" 2>&1
cat "$out/startup.txt"
step "loader, engine and speculative suites"
for t in runtime_cublas_loader_test runtime_gpu_test runtime_spec_gpu_test; do
  exe=$(find "$build" -name "$t" -type f -perm -u+x | head -1)
  "$exe" >"$out/tests_$t.log" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED) |tests? ran|SKIPPED \]" "$out/tests_$t.log" | head -5
done
step "validation-h200-decode on both backends"
(cd "$root" && "$build/twinstep" --db "$out/decode.db" run -q experiments/validation/h200_decode.yaml) \
  >"$out/run.log" 2>&1 || { status=1; tail -5 "$out/run.log"; }
"$build/twinstep" --db "$out/decode.db" compare --sim-vs-real --experiment validation-h200-decode \
  --metrics tpot_ms_mean,ttft_ms_mean >"$out/compare.txt" 2>&1 || status=1
cat "$out/compare.txt"
step bench-sim
"$build/twinstep" bench-sim >"$out/bench_sim.txt" 2>&1 || status=1
cat "$out/bench_sim.txt"
step "done (status $status)"
exit "$status"
