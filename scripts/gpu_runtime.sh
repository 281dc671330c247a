#!/usr/bin/env bash
# Builds, tests and benchmarks the real runtime (runtime/) on a machine with a CUDA GPU.
#   scripts/gpu_runtime.sh OUT_DIR
# Writes OUT_DIR/{configure,build,cpu_tests,gpu_tests,bench}.log and the records
# OUT_DIR/decode.json, decode_sweep.json, decode_profile.json, decode_trace.json
# (results/h200 format). Env: TWINSTEP_CMAKE_ARGS extra configure flags (e.g. SQLite paths),
# TWINSTEP_COMMIT the commit to record, TWINSTEP_NOTE a note for the records, TWINSTEP_BUILD_DIR (default build), TWINSTEP_SKIP_TESTS=1.
# If the whole project fails to configure (other folders mid-edit), policies/, kernels/,
# runtime/ and tests/runtime/ are built alone through a generated wrapper project.
set -uo pipefail
out=${1:?usage: scripts/gpu_runtime.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90)
start=$(date +%s)

if [ "${TWINSTEP_PREBUILT:-0}" = 1 ]; then  # gpu_session.sh built everything already
  echo "prebuilt by gpu_session.sh"
elif cmake -S "$root" -B "$build" "${cmake_args[@]}" ${TWINSTEP_CMAKE_ARGS:-} >"$out/configure.log" 2>&1; then
  echo "configured the whole project"
else
  echo "whole-project configure failed (configure.log); building runtime/ standalone"
  wrapper=$(mktemp -d)
  cat >"$wrapper/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(twinstep_runtime_only LANGUAGES CXX CUDA)
set(CMAKE_CXX_STANDARD 20)
find_package(CUDAToolkit REQUIRED)
find_package(GTest REQUIRED)
set(TWINSTEP_HAVE_CUDA ON)
set(PROJECT_SOURCE_DIR ${TWINSTEP_ROOT})
enable_testing()
include(GoogleTest)
function(twinstep_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${TWINSTEP_ROOT})
endfunction()
add_subdirectory(${TWINSTEP_ROOT}/policies policies)
add_subdirectory(${TWINSTEP_ROOT}/kernels kernels)
add_subdirectory(${TWINSTEP_ROOT}/runtime runtime)
add_subdirectory(${TWINSTEP_ROOT}/tests/runtime tests/runtime)
CMAKE
  build="$build-runtime-only"
  cmake -S "$wrapper" -B "$build" "${cmake_args[@]}" -DTWINSTEP_ROOT="$root" >>"$out/configure.log" 2>&1 || {
    echo "standalone configure failed"; tail -30 "$out/configure.log"; exit 1; }
fi

[ "${TWINSTEP_PREBUILT:-0}" = 1 ] ||
  cmake --build "$build" -j"$(nproc)" --target runtime_cpu_test runtime_gpu_test twinstep_decode_bench \
    >"$out/build.log" 2>&1 || { echo "build failed"; grep -E "error" "$out/build.log" | head -40; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$out/gpu.txt"

find_exe() { find "$build" -name "$1" -type f -perm -u+x | head -1; }
test_status=0
if [ "${TWINSTEP_SKIP_TESTS:-0}" != 1 ]; then
  "$(find_exe runtime_cpu_test)" >"$out/cpu_tests.log" 2>&1 || test_status=1
  grep -E "^\[  (PASSED|FAILED) " "$out/cpu_tests.log"
  timeout 300 "$(find_exe runtime_gpu_test)" 2>&1 | tee "$out/gpu_tests.log" |
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[       OK|Failure|match the CPU|8B greedy|tiny greedy|error" | head -60
  [ "${PIPESTATUS[0]}" = 0 ] || test_status=1
  echo "runtime tests exit status: $test_status ($(( $(date +%s) - start )) s)"
fi

bench=$(find_exe twinstep_decode_bench)
timeout 420 "$bench" --out "$out" ${TWINSTEP_COMMIT:+--commit "$TWINSTEP_COMMIT"} ${TWINSTEP_NOTE:+--note "$TWINSTEP_NOTE"} 2>&1 | tee "$out/bench.log"
bench_status=${PIPESTATUS[0]}
echo "bench exit status: $bench_status, tests exit status: $test_status ($(( $(date +%s) - start )) s)"
[ "$test_status" = 0 ] && [ "$bench_status" = 0 ]
