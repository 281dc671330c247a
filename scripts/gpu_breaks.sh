#!/usr/bin/env bash
# What a collective costs its neighbours in a TP graph, measured on one GPU (docs/calibration.md
# "Collective breaks"): build; the stub test (TensorParallel.CollectiveStubsChangeNoTokens); then
# `calibrate --breaks-only` of the TP shards (their decode steps with and without an empty non-PDL
# kernel at each collective position) into a copy of CAL_DB, one session per line of BREAKS.
#   scripts/gpu_breaks.sh OUT_DIR
# Writes OUT_DIR/{configure,build,stub_test,breaks_*}.log and OUT_DIR/cal.db.
# Env: CAL_DB (default results/h200/calibration_d1f6e37.db.xz); BREAKS, lines of "MODEL TP
# CONTEXTS BATCHES" (default: qwen3-30b-a3b and llama-3-8b at tp 2, qwen3-30b-a3b at tp 4, each
# over at least four contexts: the fit takes the median over contexts, and one context's pair can
# be off by 2 us per position, as the first context of every session is);
# INSITU=1: each line under mpirun -np TP (one GPU per rank) with --in-situ, the shard's steps with
# its real collectives instead of the stubs (docs/calibration.md "Settled GPU state"; no stub test);
# TWINSTEP_BUILD_DIR (default build). Sessions 21-23 of calibration_d1f6e37.db.xz are the default
# lines, measured into a copy of its sessions 1-20 (17-20: b2772ed's first, narrower grids; then
# calibration_e8341f9.db.xz held sessions 1-23).
set -uo pipefail
out=${1:?usage: scripts/gpu_breaks.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
status=0
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }

step build
gpu_build "$out" twinstep runtime_tp_gpu_test || exit 1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$out/gpu.txt"

insitu=${INSITU:-0}
if [ "$insitu" != 1 ]; then
  step "stub test"
  timeout 300 "$build/tests/runtime/runtime_tp_gpu_test" \
    --gtest_filter='TensorParallel.CollectiveStubs*' >"$out/stub_test.log" 2>&1 || status=1
  grep -E "OK \]|FAILED|SKIPPED \]" "$out/stub_test.log" | head
fi

cal=${CAL_DB:-$root/results/h200/calibration_d1f6e37.db.xz}
python3 "$root/scripts/cut_calibration.py" "$cal" "$out/cal.db" || status=1
breaks=${BREAKS:-"qwen3-30b-a3b 2 128,512,1024,2048,4096,8192 1,2,4,8,16
llama-3-8b 2 128,512,1024,2048,4096,8192 1,2,4,8,16
qwen3-30b-a3b 4 1024,2048,4096,8192 1,2,4,8,16"}
while read -r model tp contexts batches; do
  [ -n "$model" ] || continue
  name=${model}_tp${tp}_${contexts//,/-}
  launch=() how=()
  if [ "$insitu" = 1 ]; then
    launch=(mpirun --allow-run-as-root -np "$tp" -x NCCL_NVLS_ENABLE=0)
    how=(--in-situ)
    name=${name}_insitu
  fi
  step "calibrate --breaks-only ${how[*]} $model --tp $tp --contexts $contexts"
  timeout 300 "${launch[@]}" "$build/twinstep" --db "$out/cal.db" calibrate --out "$out/$name.yaml" \
    --breaks-only "${how[@]}" --tp "$tp" --models "$model" --contexts "$contexts" \
    --batches "$batches" >"$out/breaks_$name.log" 2>&1 || status=1
  grep -E "break gap" "$out/breaks_$name.log" | head -12
done <<<"$breaks"
exit $status
