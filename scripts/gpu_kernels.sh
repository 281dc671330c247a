#!/usr/bin/env bash
# Builds, tests and benchmarks kernels/ on a machine with a CUDA GPU.
#   scripts/gpu_kernels.sh OUT_DIR
# Writes OUT_DIR/{configure,build,tests,bench}.log and OUT_DIR/kernels.json (results/h200 format).
# Env: TWINSTEP_CMAKE_ARGS extra configure flags (e.g. SQLite paths), TWINSTEP_COMMIT the commit
# to record when the tree has no .git, TWINSTEP_SANITIZE=1 also runs compute-sanitizer memcheck
# (TWINSTEP_SANITIZE_FILTER: its gtest filter), TWINSTEP_BENCH_ARGS extra bench flags,
# TWINSTEP_SKIP_TESTS=1 (benchmark only; e.g. after `ctest -L gpu` in the same session).
# Configured with -DTWINSTEP_KERNELS_AB=ON (TWINSTEP_CMAKE_ARGS), it also runs the benchmark built
# without the L2 prefetch hint into OUT_DIR/kernels_noprefetch.json (sections:
# TWINSTEP_BENCH_AB_ARGS, default gemv, attention, layer_chain).
# If the whole project fails to configure (other folders mid-edit), kernels/ and tests/kernels/
# are built alone through a generated wrapper project; the log says which.
set -uo pipefail
out=${1:?usage: scripts/gpu_kernels.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90)

if [ "${TWINSTEP_PREBUILT:-0}" = 1 ]; then  # gpu_session.sh built everything already
  echo "prebuilt by gpu_session.sh"
elif cmake -S "$root" -B "$build" "${cmake_args[@]}" ${TWINSTEP_CMAKE_ARGS:-} >"$out/configure.log" 2>&1; then
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
enable_testing()
include(GoogleTest)
function(twinstep_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${ARG_LABELS}")
endfunction()
add_subdirectory(${TWINSTEP_ROOT}/kernels kernels)
add_subdirectory(${TWINSTEP_ROOT}/tests/kernels tests/kernels)
CMAKE
  build="$build-kernels-only"
  cmake -S "$wrapper" -B "$build" "${cmake_args[@]}" -DTWINSTEP_ROOT="$root" >>"$out/configure.log" 2>&1 || {
    echo "standalone configure failed"; tail -30 "$out/configure.log"; exit 1; }
fi

[ "${TWINSTEP_PREBUILT:-0}" = 1 ] ||
  cmake --build "$build" -j"$(nproc)" --target twinstep_kernels kernels_test twinstep_kernels_bench \
    >"$out/build.log" 2>&1 || { echo "build failed"; grep -E "error" "$out/build.log" | head -40; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$out/gpu.txt"

tests=$(find "$build" -name kernels_test -type f -perm -u+x | head -1)
test_status=0
if [ "${TWINSTEP_SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TWINSTEP_TEST_TIMEOUT:-180}" "$tests" 2>&1 | tee "$out/tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|Failure|error" | head -60
  test_status=${PIPESTATUS[0]}
  echo "kernels_test exit status: $test_status"
fi

if [ "${TWINSTEP_SANITIZE:-0}" = 1 ]; then
  timeout 240 compute-sanitizer --tool memcheck "$tests" \
    --gtest_filter="${TWINSTEP_SANITIZE_FILTER:-*Attention*:*Rope*:*LmHead*:*Moe*:Shapes/GemvShapes.*/2}" \
    >"$out/sanitizer.log" 2>&1
  echo "compute-sanitizer memcheck status: $?"
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/sanitizer.log" | tail -3
fi

bench=$(find "$build" -name twinstep_kernels_bench -type f -perm -u+x | head -1)
(cd "$root" && timeout "${TWINSTEP_BENCH_TIMEOUT:-360}" "$bench" --out "$out/kernels.json" ${TWINSTEP_COMMIT:+--commit "$TWINSTEP_COMMIT"} ${TWINSTEP_BENCH_ARGS:-}) 2>&1 | tee "$out/bench.log"
bench_status=${PIPESTATUS[0]}
# Configured with -DTWINSTEP_KERNELS_AB=ON: the same sections without the L2 prefetch hint.
before=$(find "$build" -name twinstep_kernels_bench_noprefetch -type f -perm -u+x | head -1)
if [ -n "$before" ]; then
  (cd "$root" && timeout "${TWINSTEP_BENCH_TIMEOUT:-360}" "$before" --out "$out/kernels_noprefetch.json" \
    ${TWINSTEP_COMMIT:+--commit "$TWINSTEP_COMMIT"} ${TWINSTEP_BENCH_AB_ARGS:---only gemv --only attention --only layer_chain}) \
    >"$out/bench_noprefetch.log" 2>&1 || bench_status=1
  grep -E "^floor|variant used|gemv variant" "$out/bench_noprefetch.log"
fi
echo "bench exit status: $bench_status, tests exit status: $test_status"
[ "$test_status" = 0 ] && [ "$bench_status" = 0 ]
