#!/usr/bin/env bash
# Kernel benchmark sections of this tree beside a baseline commit's, in one call on one GPU: the
# baseline's twinstep_kernels_bench built from its source (a `git archive` of BASE, made here when
# the tree is a git checkout, else BASE_TAR: such an archive, xz-compressed), this tree's bench and
# kernels_test built as usual; TESTS (a gtest filter, optional) run, MEMCHECK (a filter, optional)
# under compute-sanitizer memcheck; then for each of ROUNDS rounds every section of SECTIONS by
# this tree and by the baseline, alternating (this tree first in odd rounds, the baseline first in
# even ones), each in its own process.
#   TWINSTEP_COMMIT=<sha> BASE=<sha> [BASE_TAR=file.tar.xz] SECTIONS="attention chain_trigger" \
#     [ROUNDS=2] [TESTS=filter] [MEMCHECK=filter] scripts/gpu_ab_kernels.sh OUT_DIR
# Writes OUT_DIR/records.tar.xz ({new,base}_SECTION_ROUND.json: few files come back from the GPU
# machine) and OUT_DIR/logs.tar.xz.
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: BASE=<sha> SECTIONS=... scripts/gpu_ab_kernels.sh OUT_DIR}"
: "${BASE:?BASE (the baseline commit) is required}" "${SECTIONS:?SECTIONS is required}"
base_src=$root/.ab_base
step "baseline $BASE: source"
rm -rf "$base_src" && mkdir -p "$base_src"
if git -C "$root" rev-parse --verify -q "$BASE^{commit}" >/dev/null; then
  git -C "$root" archive "$BASE" -- . ':!results/h200' ':!docs' | tar -x -C "$base_src" || status=1
elif [ -n "${BASE_TAR:-}" ]; then
  tar -xJf "$BASE_TAR" -C "$base_src" || status=1
else
  echo "no git history for $BASE and no BASE_TAR"
  status=1
  recal_finish
fi
step "build (this tree)"
gpu_build "$logs" kernels_test twinstep_kernels_bench || { status=1; recal_finish; }
step "build (baseline $BASE)"
mkdir -p "$logs/base"
(TWINSTEP_COMMIT=$BASE root=$base_src build=$base_src/build \
  gpu_build "$logs/base" twinstep_kernels_bench) ||
  { status=1; recal_finish; }
nvidia-smi --query-gpu=index,name,driver_version,uuid --format=csv,noheader | tee "$logs/gpu.txt"
[ -n "${TESTS:-}" ] && recal_kernel_tests "$TESTS"
if [ -n "${MEMCHECK:-}" ]; then
  step "memcheck ($MEMCHECK)"
  compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/kernels/kernels_test" \
    --gtest_filter="$MEMCHECK" >"$logs/memcheck.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$logs/memcheck.log" | head -5
fi
run_side() {  # run_side new|base SECTION ROUND
  local bench=$build/kernels/twinstep_kernels_bench commit=${TWINSTEP_COMMIT:-unknown}
  [ "$1" = base ] && bench=$base_src/build/kernels/twinstep_kernels_bench commit=$BASE
  step "bench $2, $1 ($commit), round $3"
  "$bench" --only "$2" --out "$out/$1_$2_$3.json" --commit "$commit" \
    >"$logs/bench_$1_$2_$3.log" 2>&1 || status=1
  grep -E "^floor|ctx= 8192 q_len= 1|attention trace .*q_len=1|layer chain m=1 " \
    "$logs/bench_$1_$2_$3.log" | cut -c1-200
}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for section in $SECTIONS; do
    if [ $((round % 2)) = 1 ]; then
      run_side new "$section" "$round"
      run_side base "$section" "$round"
    else
      run_side base "$section" "$round"
      run_side new "$section" "$round"
    fi
  done
done
step done
(cd "$out" && tar cJf records.tar.xz ./*.json && rm -f ./*.json) || status=1
recal_finish
