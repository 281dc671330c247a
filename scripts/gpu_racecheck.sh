#!/usr/bin/env bash
# compute-sanitizer racecheck on the bulk-copy stage ring: each protocol variant of
# tests/kernels/bulk_ring_race_test.cu alone (one gtest filter per run), then the real kernels
# that use the ring (the forced fill-0 GEMV variants and grouped MoE). Each run is time-boxed.
#   scripts/gpu_racecheck.sh OUT_DIR
# Writes OUT_DIR/<run>.log and OUT_DIR/racecheck_summary.txt, one line per run: the racecheck
# summary (hazards, errors, warnings), the gtest result and, with TWINSTEP_RACECHECK_REPORT=all,
# the hazard kinds among the printed reports (RAW/WAR/WAW, capped by --print-limit; far slower
# with many hazards: on the H200 the lane-0 rings did not finish in 30 s, GEMV and MoE in 70 s).
# Env: TWINSTEP_BUILD_DIR (default build), TWINSTEP_CMAKE_ARGS, TWINSTEP_RACECHECK_SECONDS (per
# run, default 120), TWINSTEP_RACECHECK_REPORT (analysis | all, default analysis),
# TWINSTEP_RACECHECK_BINS (a folder holding prebuilt kernels_test and bulk_ring_race_test: no
# build; a libcudart.so.13 beside them is used if the machine's own is missing),
# TWINSTEP_RACECHECK_RUNS (any of ring, kernels, all_kernels; default "ring kernels").
set -uo pipefail
out=${1:?usage: scripts/gpu_racecheck.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
limit=${TWINSTEP_RACECHECK_SECONDS:-120}
runs=${TWINSTEP_RACECHECK_RUNS:-ring kernels}
report=${TWINSTEP_RACECHECK_REPORT:-analysis}
if [ -n "${TWINSTEP_RACECHECK_BINS:-}" ]; then
  bins=$(cd "$TWINSTEP_RACECHECK_BINS" && pwd)
  kernels="$bins/kernels_test"
  ring="$bins/bulk_ring_race_test"
  if ! "$ring" --gtest_list_tests >/dev/null 2>&1; then
    export LD_LIBRARY_PATH="$bins${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
else
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    ${TWINSTEP_CMAKE_ARGS:-} >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
  cmake --build "$build" -j"$(nproc)" --target kernels_test bulk_ring_race_test \
    >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  kernels="$build/tests/kernels/kernels_test"
  ring="$build/tests/kernels/bulk_ring_race_test"
fi
summary="$out/racecheck_summary.txt"
: >"$summary"
racecheck() {  # run binary filter
  local run=$1 bin=$2 filter=$3
  local log="$out/$run.log"
  timeout "$limit" compute-sanitizer --tool racecheck --racecheck-report "$report" --print-limit 40 \
    "$bin" --gtest_filter="$filter" >"$log" 2>&1
  local rc=$?
  local result kinds
  result=$(grep -h "RACECHECK SUMMARY" "$log" | tail -1 | sed 's/^=* *//')
  [ -n "$result" ] || result=$(grep -h "ERROR SUMMARY" "$log" | tail -1 | sed 's/^=* *//')
  [ "$rc" = 124 ] && result="timed out after ${limit} s"
  kinds=$(grep -o "Potential [A-Z]* hazard" "$log" | awk '{print $2}' | sort | uniq -c |
    awk '{printf "%s %s ", $2, $1}')
  [ "$report" = analysis ] && kinds="n/a (analysis report)"
  echo "$run: ${result:-rc $rc}; printed kinds: ${kinds:-none}; tests $(grep -c '^\[       OK \]' "$log") OK, $(grep -c '^\[  FAILED  \]' "$log") failed lines; rc $rc" |
    tee -a "$summary"
}
for suite in $runs; do
  case $suite in
    ring)
      for variant in Lane0Arrive AllArrive ArriveAfterIssue AllArriveAfterIssue Libcuxx TensorCopy; do
        racecheck "ring_$variant" "$ring" "*BulkRingRace.*/$variant"
      done
      ;;
    kernels)
      # GemvShapes.MatchesCpuReference forces every fill mode, fill 0 (the bulk ring) first.
      racecheck gemv_fill_variants "$kernels" "*GemvShapes.MatchesCpuReference/*"
      racecheck moe "$kernels" "*MoeCases.*"
      ;;
    all_kernels)
      racecheck kernels_all "$kernels" "*"
      ;;
    *) echo "unknown run set: $suite" | tee -a "$summary" ;;
  esac
done
