#!/usr/bin/env bash
# Issue 8's run on four H200s (and the two-GPU and one-GPU steps it rests on), in one go:
#   1. build; the attention kernel tests and the bench section attention_kv_heads (the attention
#      of Qwen3-30B-A3B's shards: 4, 2 and 1 KV heads) on GPU 0;
#   2. the speculative graphs of the Qwen3-30B-A3B TP2 and TP4 shards (calibrate --spec-only
#      --tp N, one GPU each), then their plain decode grid at ctx 8192, into a copy of the
#      calibration database CAL_DB, sessions appended;
#   3. the four-rank tests (ExpertParallel.Qwen3FourRanks*: TP4-EP4 speculation lossless, ranks
#      agree, tokens equal one GPU's) and experiments/validation/h200_tp4_spec{,_calibration}.yaml
#      under mpirun -np 4 (scripts/gpu_tp.sh NP=4 TP4_SPEC=1);
#   4. experiments/validation/h200_ep2_spec{,_calibration}.yaml on GPUs 0-1 (NP=2 MOE_SPEC=1).
# The validations run with hardware h200-calibrated (TP_HARDWARE) so that their measured runs can
# be re-simulated offline with a refitted profile (scripts/sim_vs_real_offline.sh).
#   scripts/gpu_tp4.sh OUT_DIR
# Writes OUT_DIR/{kernels_test,bench,calibrate_tp2,calibrate_tp4,calibrate_grid8k_tp*}.log,
# bench.json, cal.db and
# OUT_DIR/tp4/, OUT_DIR/ep2/ (gpu_tp.sh's files). Env: CAL_DB and CAL_LAST (default sessions
# 1-10 of results/h200/calibration_d1f6e37.db.xz, what calibration_969770c.db.xz held; CAL_LAST
# empty: all of CAL_DB); STEPS (default "kernels calibrate tp4 ep2"); CAL_TPS (default "2 4": the
# shards calibrated).
set -uo pipefail
out=${1:?usage: scripts/gpu_tp4.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
steps=${STEPS:-kernels calibrate tp4 ep2}
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off (the lent machines' rule)
status=0
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }
has() { [[ " $steps " == *" $1 "* ]]; }

step configure
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  ${TWINSTEP_CMAKE_ARGS:-} >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
step build
cmake --build "$build" -j"$(nproc)" --target twinstep runtime_tp_gpu_test kernels_test \
  twinstep_kernels_bench >"$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -30; exit 1; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$out/gpu.txt"

if has kernels; then
  step "attention kernel tests (GPU 0)"
  CUDA_VISIBLE_DEVICES=0 timeout 300 "$build/tests/kernels/kernels_test" --gtest_filter='*ttention*' \
    >"$out/kernels_test.log" 2>&1 || status=1
  grep -E "FAILED|PASSED|SKIPPED \]" "$out/kernels_test.log" | head -20
  step "bench attention_kv_heads (GPU 0)"
  CUDA_VISIBLE_DEVICES=0 timeout 300 "$build/kernels/twinstep_kernels_bench" --out "$out/bench.json" \
    --commit "${TWINSTEP_COMMIT:-unknown}" --only attention_kv_heads >"$out/bench.log" 2>&1 || status=1
  grep -E "floor|attention_kv_heads" "$out/bench.log"
fi

if has calibrate; then
  cal=${CAL_DB:-$root/results/h200/calibration_d1f6e37.db.xz}
  last=${CAL_LAST-10}
  python3 "$root/scripts/cut_calibration.py" "$cal" "$out/cal.db" $last || status=1
  for tp in ${CAL_TPS:-2 4}; do
    step "calibrate --spec-only --tp $tp (GPU 0)"
    CUDA_VISIBLE_DEVICES=0 timeout 300 "$build/twinstep" --db "$out/cal.db" calibrate \
      --out "$out/tp${tp}spec.yaml" --spec-only --tp $tp --models qwen3-30b-a3b \
      >"$out/calibrate_tp$tp.log" 2>&1 || status=1
    grep -E "W [0-9]+:" "$out/calibrate_tp$tp.log" | head -20
  done
  # The shards' plain decode grid at ctx 8192 (their stored grids stop at 1024), for a fit of the
  # shard's own kernels at the validation's context.
  for tp in ${CAL_TPS:-2 4}; do
    step "calibrate --tp $tp --contexts 8192 decode grid (GPU 0)"
    CUDA_VISIBLE_DEVICES=0 timeout 300 "$build/twinstep" --db "$out/cal.db" calibrate \
      --out "$out/tp${tp}grid8k.yaml" --tp $tp --models qwen3-30b-a3b --contexts 8192 \
      --batches 1,2,4,8,16 --no-spec --no-prefill >"$out/calibrate_grid8k_tp$tp.log" 2>&1 || status=1
    tail -3 "$out/calibrate_grid8k_tp$tp.log"
  done
fi

hw=(TP_HARDWARE=h200-calibrated TP_PROFILES="$root/results/profiles")
if has tp4; then
  step "four ranks: tests and h200_tp4_spec"
  env "${hw[@]}" NP=4 TP_TESTS=ranks TP2_RUN=0 TP_FILTER='ExpertParallel.Qwen3FourRanks*' \
    TP4_SPEC=1 timeout 400 bash "$root/scripts/gpu_tp.sh" "$out/tp4" \
    >"$out/tp4.log" 2>&1 || status=1
  grep -E "TP4|OK \]|FAILED|tpot_ms_mean|rc=" "$out/tp4.log" | head -30
fi
if has ep2; then
  step "two ranks (GPUs 0-1): h200_ep2_spec"
  env "${hw[@]}" CUDA_VISIBLE_DEVICES=0,1 NP=2 TP_TESTS=0 TP2_RUN=0 MOE_SPEC=1 \
    timeout 400 bash "$root/scripts/gpu_tp.sh" "$out/ep2" >"$out/ep2.log" 2>&1 || status=1
  grep -E "tpot_ms_mean" "$out/ep2.log" | head -10
fi
exit $status
