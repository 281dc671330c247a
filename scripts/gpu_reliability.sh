#!/usr/bin/env bash
# The GPU side of docs/reliability.md: builds the targets it needs and runs the GPU fault tests
# on a machine with a CUDA GPU (about a minute of GPU time after the build):
#   - reliability_gpu_test: llama-3-70b with 4 x 8192 tokens of KV refused on one H200 before
#     anything is allocated, with what it needs and what the GPU has; a tiny engine uses no
#     more than its memory plan and frees all of it;
#   - runtime_comm_test: a 1-rank NCCL communicator (all-reduce and all-to-all return the input,
#     checked argument errors);
#   - MemoryPlan.* of runtime_cpu_test (the plan's arithmetic, for the record).
#   scripts/gpu_reliability.sh OUT_DIR
# Writes OUT_DIR/{configure,build,memory_plan,gpu_faults,comm}.log and OUT_DIR/summary.txt.
# Env: TWINSTEP_BUILD_DIR (default build), TWINSTEP_CMAKE_ARGS extra configure flags; an
# unpacked libsqlite3-dev from .device-deps is used (scripts/gpu_env.sh).
set -uo pipefail
out=${1:?usage: scripts/gpu_reliability.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }
status=0

step configure
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  ${TWINSTEP_CMAKE_ARGS:-} >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
grep -E "twinstep:" "$out/configure.log"
step build
cmake --build "$build" -j"$(nproc)" --target reliability_gpu_test runtime_cpu_test \
  >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
# The communicator needs NCCL (configure.log says when it was not found): built on its own so
# the out-of-memory tests run either way.
have_comm=1
cmake --build "$build" -j"$(nproc)" --target runtime_comm_test >>"$out/build.log" 2>&1 || {
  echo "FAILED: runtime_comm_test did not build (NCCL missing? see build.log)"
  have_comm=0
  status=1
}
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader \
  | tee "$out/gpu.txt"

run() {  # NAME BINARY [ARGS]: a gtest binary; a skipped test counts as a failure here (GPU run)
  local name=$1
  shift
  step "$name"
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -n 4 "$out/$name.log"
  if [ $rc -ne 0 ] || grep -q "SKIPPED \]" "$out/$name.log"; then
    echo "FAILED or SKIPPED: $name (see $name.log)"
    status=1
  fi
}
run memory_plan "$build/tests/runtime/runtime_cpu_test" --gtest_filter='MemoryPlan.*'
run gpu_faults "$build/tests/reliability/reliability_gpu_test"
[ $have_comm -eq 1 ] && run comm env NCCL_DEBUG=WARN "$build/tests/runtime/runtime_comm_test"
grep -h -E "^refused: |Failure|Expected|Which is" "$out"/gpu_faults.log | head -20
{
  echo "commit $(git -C "$root" rev-parse HEAD 2>/dev/null)$(git -C "$root" diff --quiet 2>/dev/null || echo -dirty)"
  cat "$out/gpu.txt"
  grep -h -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test" "$out"/{memory_plan,gpu_faults,comm}.log 2>/dev/null
} >"$out/summary.txt"
cat "$out/summary.txt"
exit $status
