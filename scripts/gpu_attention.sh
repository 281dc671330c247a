#!/usr/bin/env bash
# Decode attention on a machine with a CUDA GPU: build, the attention tests, the attention section
# of the kernel benchmark, then compute-sanitizer memcheck + racecheck on the tests (last: slow).
#   scripts/gpu_attention.sh OUT_DIR
# Writes OUT_DIR/{configure,build,tests,bench,memcheck,racecheck}.log, gpu.txt and
# attention.json (results/h200/kernels.json format, attention rows only).
# Env: TWINSTEP_BUILD_DIR (default build-gpu-attn), TWINSTEP_CMAKE_ARGS extra configure flags,
# TWINSTEP_COMMIT the commit to record when the tree has no .git.
# Conventions as scripts/gpu_kernels.sh (SQLite from .device-deps, sm_90, Ninja); if the whole
# project fails to configure (other folders mid-edit), kernels/ and tests/kernels/ are built alone.
set -uo pipefail
out=${1:?usage: scripts/gpu_attention.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build-gpu-attn}
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90)
start=$SECONDS

if cmake -S "$root" -B "$build" "${cmake_args[@]}" ${TWINSTEP_CMAKE_ARGS:-} >"$out/configure.log" 2>&1; then
  echo "configured the whole project"
else
  echo "whole-project configure failed (configure.log); building kernels/ standalone"
  wrapper=$(mktemp -d)
  cat >"$wrapper/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(twinstep_kernels_only LANGUAGES CXX CUDA)
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CUDA_STANDARD 20)
find_package(CUDAToolkit REQUIRED)
find_package(GTest REQUIRED)
function(twinstep_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
endfunction()
add_subdirectory(${TWINSTEP_ROOT}/kernels kernels)
add_subdirectory(${TWINSTEP_ROOT}/tests/kernels tests/kernels)
CMAKE
  build="$build-kernels-only"
  cmake -S "$wrapper" -B "$build" "${cmake_args[@]}" -DTWINSTEP_ROOT="$root" >>"$out/configure.log" 2>&1 || {
    echo "standalone configure failed"; tail -30 "$out/configure.log"; exit 1; }
fi
cmake --build "$build" -j16 --target kernels_test twinstep_kernels_bench >"$out/build.log" 2>&1 || {
  echo "build failed"; grep -E "error" "$out/build.log" | head -40; exit 1; }
grep -E "spill" "$out/build.log" | grep -i attention | sed 's/^/ptxas: /' | head -8
echo "build done at +$((SECONDS - start)) s"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$out/gpu.txt"

tests=$(find "$build" -name kernels_test -type f -perm -u+x | head -1)
timeout 180 "$tests" --gtest_filter='*Attention*' 2>&1 | tee "$out/tests.log" |
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|Failure|error|seed" | head -60
test_status=${PIPESTATUS[0]}
echo "attention tests exit status: $test_status (+$((SECONDS - start)) s)"

bench=$(find "$build" -name twinstep_kernels_bench -type f -perm -u+x | head -1)
(cd "$root" && timeout 300 "$bench" --only attention --out "$out/attention.json" \
  ${TWINSTEP_COMMIT:+--commit "$TWINSTEP_COMMIT"}) 2>&1 | tee "$out/bench.log"
bench_status=${PIPESTATUS[0]}
echo "bench exit status: $bench_status (+$((SECONDS - start)) s)"

# memcheck: every attention test.
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 "$tests" \
  --gtest_filter='*Attention*' >"$out/memcheck.log" 2>&1
memcheck_status=$?
echo "memcheck status: $memcheck_status (+$((SECONDS - start)) s)"
grep -E "ERROR SUMMARY|^\[  (FAILED|PASSED) " "$out/memcheck.log" | tail -4
# racecheck (shared-memory hazards) is slow: one case per split-kernel path (Q in registers, Q in
# shared memory (the default) with 2 and with 3 row tiles = 384 threads, the full ring + Q in
# shared memory).
timeout 150 compute-sanitizer --tool racecheck --error-exitcode 3 "$tests" \
  --gtest_filter='Cases/AttentionCases.MatchesCpuReference/two_launch_q32_kv8_len6_*:Cases/AttentionCases.MatchesCpuReference/two_launch_q_smem_q32_kv8_len6_*:Cases/AttentionCases.MatchesCpuReference/two_launch_q_smem_q8_kv2_len12_*:Cases/AttentionCases.MatchesCpuReference/two_launch_full_ring_q_smem_q32_kv8_len6_*' \
  >"$out/racecheck.log" 2>&1
racecheck_status=$?
echo "racecheck status: $racecheck_status (+$((SECONDS - start)) s)"
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|^\[  (FAILED|PASSED) " "$out/racecheck.log" | tail -4

echo "status: tests $test_status, bench $bench_status, memcheck $memcheck_status," \
  "racecheck $racecheck_status (+$((SECONDS - start)) s)"
[ "$test_status" = 0 ] && [ "$memcheck_status" = 0 ] && [ "$racecheck_status" = 0 ] &&
  [ "$bench_status" = 0 ]
