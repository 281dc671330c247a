#!/usr/bin/env bash
# compute-sanitizer over the GPU test suites: memcheck, racecheck, initcheck and synccheck on the
# kernel tests, memcheck on the tiny-model runtime tests (the 8B-shape ones are far too slow
# under the tools). Each tool invocation is time-boxed; the log says which finished.
#   scripts/gpu_sanitize.sh OUT_DIR
# Writes OUT_DIR/<suite>.<tool>.log and OUT_DIR/summary.txt (one line per run: tool, suite,
# "ERROR SUMMARY" or "timed out"). Env: TWINSTEP_CMAKE_ARGS, TWINSTEP_BUILD_DIR (default build),
# TWINSTEP_SANITIZE_SECONDS (per invocation, default 90).
set -uo pipefail
out=${1:?usage: scripts/gpu_sanitize.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
limit=${TWINSTEP_SANITIZE_SECONDS:-90}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  ${TWINSTEP_CMAKE_ARGS:-} >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
cmake --build "$build" -j"$(nproc)" --target kernels_test runtime_gpu_test >"$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }
kernels="$build/tests/kernels/kernels_test"
runtime="$build/tests/runtime/runtime_gpu_test"
: >"$out/summary.txt"
sanitize() {  # tool suite binary [gtest filter]
  local tool=$1 suite=$2 bin=$3 filter=${4:-*}
  local log="$out/$suite.$tool.log"
  timeout "$limit" compute-sanitizer --tool "$tool" --print-limit 20 "$bin" \
    --gtest_filter="$filter" >"$log" 2>&1
  local rc=$?
  local summary
  summary=$(grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$log" | tail -1)
  [ "$rc" = 124 ] && summary="timed out after ${limit} s ($(grep -c '^\[       OK \]' "$log") tests passed before)"
  echo "$tool $suite: ${summary:-rc $rc} ($(grep -c '^\[       OK \]' "$log") tests OK, $(grep -c '^\[  FAILED  \]' "$log") failed lines)" |
    tee -a "$out/summary.txt"
}
sanitize memcheck kernels "$kernels"
sanitize racecheck kernels "$kernels"
sanitize initcheck kernels "$kernels"
sanitize synccheck kernels "$kernels"
sanitize memcheck runtime "$runtime" 'TinyEngine.*'
