#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build of the CPU code and its whole test suite
# (every ctest suite: unit tests, CLI end-to-end, reliability with 20 kill -9 trials).
# Usage: scripts/sanitize.sh [ctest args...]      (build dir: $TWINSTEP_ASAN_BUILD_DIR or
# build-asan). Any sanitizer report fails the test that triggered it (halt_on_error), so a
# passing run means no finding. Debug with -O1: assertions stay on, tests stay fast enough.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TWINSTEP_ASAN_BUILD_DIR:-build-asan}
jobs=${TWINSTEP_JOBS:-$(nproc)}
start=$(date +%s)
cmake -S . -B "$build" -G Ninja -DTWINSTEP_SANITIZE=ON -DTWINSTEP_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1"
cmake --build "$build" -j"$jobs"
built=$(date +%s)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
ctest --test-dir "$build" --output-on-failure -j"$jobs" "$@" || status=$?
end=$(date +%s)
echo "sanitize.sh: build $((built - start)) s, tests $((end - built)) s, total $((end - start)) s"
exit "$status"
