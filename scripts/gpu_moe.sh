#!/usr/bin/env bash
# Mixture of experts on the real runtime (Qwen3-MoE-like, one GPU), on a machine with a CUDA GPU:
# builds, runs the MoE kernel tests (every grouped-GEMV kernel against the CPU reference; with
# TWINSTEP_SANITIZE=1 also under compute-sanitizer memcheck), the runtime suites (CPU: MoE config.json, weight list, memory plan; GPU: the dense
# engine tests, and the MoE ones: tiny MoE models with and without a shared expert against the
# CPU reference, every graph mode byte-identical, checkpoint == in-memory weights, Qwen3-30B-A3B
# across graph modes), then the moe_forward kernel benchmark beside the streaming-read floor (the
# per-layer cost the decode step is made of), then experiments/validation/h200_moe.yaml on both
# backends and the simulated-vs-measured comparison.
#   scripts/gpu_moe.sh OUT_DIR
# Writes OUT_DIR/{configure,build,kernel_tests,cpu_tests,gpu_tests,moe_kernels}.log, moe_kernels.json,
# run.txt, run.err, sim_vs_real.txt, ops.txt and moe.db (the runs). Env: TWINSTEP_BUILD_DIR
# (default build), TWINSTEP_CMAKE_ARGS, TWINSTEP_COMMIT (recorded with the runs and the record).
# Budget: about 3 minutes of GPU time after the build (the experiment's real side holds 61 GB of
# weights and prefills 16 prompts of 1024 tokens through the grouped moe_prefill).
set -uo pipefail
out=${1:?usage: scripts/gpu_moe.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
start=$(date +%s)
step() { echo "== $1 (+$(( $(date +%s) - start )) s)"; }

step configure
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  ${TWINSTEP_CMAKE_ARGS:-} >"$out/configure.log" 2>&1 ||
  { echo "configure failed"; tail -30 "$out/configure.log"; exit 1; }
step build
cmake --build "$build" -j"$(nproc)" \
  --target kernels_test runtime_cpu_test runtime_gpu_test twinstep twinstep_kernels_bench \
  >"$out/build.log" 2>&1 || { echo "build failed"; grep -E "error" "$out/build.log" | head -40; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"

find_exe() { find "$build" -name "$1" -type f -perm -u+x | head -1; }
status=0
step "MoE kernel tests"
timeout 240 "$(find_exe kernels_test)" --gtest_filter='Moe*:*/Moe*' >"$out/kernel_tests.log" 2>&1 ||
  status=1
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure" "$out/kernel_tests.log" | head -40
if [ "${TWINSTEP_SANITIZE:-0}" = 1 ]; then
  step "MoE kernel tests under compute-sanitizer memcheck"
  timeout 400 compute-sanitizer --tool memcheck --error-exitcode 1 "$(find_exe kernels_test)" \
    --gtest_filter='Moe*:*/Moe*' >"$out/kernel_memcheck.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|^\[  (FAILED|PASSED) " "$out/kernel_memcheck.log"
fi
step "runtime CPU tests"
"$(find_exe runtime_cpu_test)" >"$out/cpu_tests.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED) " "$out/cpu_tests.log"
step "runtime GPU tests (dense and MoE)"
timeout 240 "$(find_exe runtime_gpu_test)" >"$out/gpu_tests.log" 2>&1 || status=1
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[       OK|Failure|match the CPU|greedy" \
  "$out/gpu_tests.log" | head -80

step "moe_forward benchmark (Qwen3-30B-A3B layer, cold weights)"
timeout 120 "$(find_exe twinstep_kernels_bench)" --only moe --out "$out/moe_kernels.json" \
  ${TWINSTEP_COMMIT:+--commit "$TWINSTEP_COMMIT"} >"$out/moe_kernels.log" 2>&1 || status=1
grep -E "floor|moe" "$out/moe_kernels.log"

step "validation-h200-moe, sim and real"
db="$out/moe.db"
timeout 300 "$build/twinstep" --db "$db" run -q "$root/experiments/validation/h200_moe.yaml" \
  >"$out/run.txt" 2>"$out/run.err" || { status=1; tail -20 "$out/run.err"; }
"$build/twinstep" --db "$db" compare --experiment validation-h200-moe --sim-vs-real \
  --metrics tpot_ms_mean itl_ms_p99 step_ms_mean ttft_ms_mean gpu_busy_frac \
  output_throughput_tok_s | tee "$out/sim_vs_real.txt" || status=1
"$build/twinstep" --db "$db" compare --experiment validation-h200-moe --ops >"$out/ops.txt" 2>&1 ||
  status=1
head -60 "$out/ops.txt"
step "done, status $status"
exit $status
