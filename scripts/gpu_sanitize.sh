#!/usr/bin/env bash
# compute-sanitizer over the GPU test suites, all four tools at one commit: memcheck, racecheck,
# initcheck and synccheck on every kernel test and on the tiny-model runtime tests (plain, MoE and
# speculative engines; the 8B-shape tests are far too slow under the tools). The runs go in
# parallel (the tools are host-bound); each suite is split into gtest shards so racecheck, ~3 s per
# test, finishes inside the time box. Each shard is time-boxed; the summary says which finished.
#   scripts/gpu_sanitize.sh OUT_DIR
# Writes OUT_DIR/<suite>.<tool>.<shard>.log and OUT_DIR/summary.txt: one line per tool and suite
# with the summed errors, the shards that finished, and the tests that passed or failed.
# The kernel shards and the runtime shards run as two concurrent pools (the runtime tests under a
# tool need more device memory per process: too many of them on one GPU fail inside the tool with
# "Unable to allocate enough memory"); on a machine with two GPUs give each pool its own.
# Two probes run first: tests/reliability/cublas_initcheck_probe.cu under initcheck (does the tool
# see what a cuBLAS GEMM writes? at 2025.3.1 it does not) and conditional_synccheck_probe.cu under
# synccheck, one process per launch kind (does the tool judge barriers in kernels inside
# conditional graph nodes? at 2025.3.1 not after a body of three kernels: kinds 3-6). Because of
# the first, the runtime suites run under initcheck with TWINSTEP_PREFILL_GEMM set to
# TWINSTEP_SANITIZE_INITCHECK_PREFILL_GEMM (default gemv: the engine's projections over more than
# 16 rows use the GEMV kernel instead of cuBLAS, so every byte the engine reads is written by a
# kernel the tool tracks); under racecheck too (the tool fails on cuBLAS's sm_90 GEMMs with
# "failed to handle a hardware exception"); under the other tools the engine uses cuBLAS. The runtime
# shards under synccheck and initcheck run with --force-synchronization-limit
# TWINSTEP_SANITIZE_RUNTIME_SYNC_LIMIT (default 16): a run-ahead engine queues launches faster
# than the tools drain them, and the tools then fail to allocate their own device memory.
# Env: TWINSTEP_CMAKE_ARGS, TWINSTEP_BUILD_DIR (default build), TWINSTEP_SANITIZE_SECONDS (per
# shard, default 300), TWINSTEP_SANITIZE_JOBS (kernel shards at once, default nproc / 2),
# TWINSTEP_SANITIZE_RUNTIME_JOBS (runtime shards at once, default 4), TWINSTEP_SANITIZE_KERNELS_GPU
# and TWINSTEP_SANITIZE_RUNTIME_GPU (CUDA_VISIBLE_DEVICES of each pool, default unset),
# TWINSTEP_SANITIZE_TOOLS (kernel tests, default "memcheck racecheck initcheck synccheck"),
# TWINSTEP_SANITIZE_RUNTIME_TOOLS (default "memcheck initcheck synccheck"),
# TWINSTEP_SANITIZE_KERNELS_FILTER (gtest filter of the kernel tests, default all),
# TWINSTEP_SANITIZE_SUITES (default "kernels runtime_tiny spec_tiny"),
# TWINSTEP_SANITIZE_RUNTIME_SYNCCHECK_GPU (a GPU of its own for the runtime synccheck shards,
# which otherwise run after the runtime pool's other tools), TWINSTEP_SANITIZE_RUNTIME_SYNCCHECK_JOBS
# (runtime racecheck and synccheck shards at once, default 1),
# TWINSTEP_SANITIZE_RUNTIME_FILTER / TWINSTEP_SANITIZE_SPEC_FILTER (gtest filters of the two
# runtime suites; a shard past the last test runs none), TWINSTEP_SANITIZE_RUNTIME_SHARDS /
# TWINSTEP_SANITIZE_SPEC_SHARDS (their shard counts, default 14 and 8: one test each; set them to
# the filtered test count), TWINSTEP_SANITIZE_PROBES=0 (skip the two probes),
# TWINSTEP_SANITIZE_SYNCCHECK_EXCLUDE (gtest names left out of synccheck runs, ':'-separated;
# default TinySpec.DeviceEarlyExitChangesNothingButTime, whose draft runs in conditional IF bodies
# of many kernels, which the tool misjudges: probe kinds 3-6; empty to include it), TWINSTEP_SANITIZE_ARGS (more
# compute-sanitizer options for every shard, e.g. "--kernel-name-exclude kns=gemv_kernel" to
# bisect a report), TWINSTEP_SANITIZE_RUNTIME_RACECHECK_ARGS (options of the runtime suites'
# racecheck shards; default: leave out the kernel families kernels_test already runs under
# racecheck and cuBLAS's, below), TWINSTEP_SANITIZE_PLAN (only these "tool:suite" pairs, e.g.
# "racecheck:runtime_tiny initcheck:spec_tiny"; default every tool of every suite),
# TWINSTEP_SANITIZE_RUNTIME_CONCURRENT=1 (the runtime one-at-a-time pool beside the other
# runtime pool on the same GPU, not after it).
set -uo pipefail
out=${1:?usage: scripts/gpu_sanitize.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps, gpu_build
build=${TWINSTEP_BUILD_DIR:-$root/build}
limit=${TWINSTEP_SANITIZE_SECONDS:-300}
jobs=${TWINSTEP_SANITIZE_JOBS:-$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))}
runtime_jobs=${TWINSTEP_SANITIZE_RUNTIME_JOBS:-4}
tools=${TWINSTEP_SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}
gpu_build "$out" kernels_test runtime_gpu_test runtime_spec_gpu_test cublas_initcheck_probe \
  conditional_synccheck_probe || exit 1

# suite name, binary, gtest filter, shards for racecheck (the slowest tool), shards otherwise,
# tools. The runtime suites run one test per shard (14 and 8 tests): under initcheck a test takes
# minutes. The runtime suites leave racecheck out by default: with every kernel instrumented their
# processes died at the first engine test (killed, or a segfault the tool blames on host access to
# mapped memory) after one test took 329 s. Racecheck checks shared memory inside kernels, and the
# kernel families of kernels/ with shared memory run under it in kernels_test; the runtime's
# racecheck shards leave those families (and cuBLAS) uninstrumented and check the rest: the
# runtime's own kernels (runtime/*.cu) and kernels/'s other ones, in the engine's graphs.
runtime_tools=${TWINSTEP_SANITIZE_RUNTIME_TOOLS:-memcheck initcheck synccheck}
runtime_racecheck_args=${TWINSTEP_SANITIZE_RUNTIME_RACECHECK_ARGS-}
if [ -z "${TWINSTEP_SANITIZE_RUNTIME_RACECHECK_ARGS+set}" ]; then
  for family in gemv attention_ grouped_gemm lm_head_ moe_ rmsnorm nvjet cutlass; do
    runtime_racecheck_args+=" --kernel-name-exclude kns=$family"
  done
fi
suites=(
  "kernels|$build/tests/kernels/kernels_test|${TWINSTEP_SANITIZE_KERNELS_FILTER:-*}|12|3|$tools"
  "runtime_tiny|$build/tests/runtime/runtime_gpu_test|${TWINSTEP_SANITIZE_RUNTIME_FILTER:-TinyEngine.*:*TinyMoeEngine.*}|14|${TWINSTEP_SANITIZE_RUNTIME_SHARDS:-14}|$runtime_tools"
  "spec_tiny|$build/tests/runtime/runtime_spec_gpu_test|${TWINSTEP_SANITIZE_SPEC_FILTER:-SpecTiny.*:TinySpec.*}|8|${TWINSTEP_SANITIZE_SPEC_SHARDS:-8}|$runtime_tools"
)
selected=${TWINSTEP_SANITIZE_SUITES:-kernels runtime_tiny spec_tiny}
for i in "${!suites[@]}"; do
  [[ " $selected " == *" ${suites[$i]%%|*} "* ]] || unset "suites[$i]"
done

# One shard: tool suite binary filter shards index. Prints nothing; its log holds everything.
run_shard() {
  local tool=$1 suite=$2 bin=$3 filter=$4 shards=$5 index=$6
  local log="$out/$suite.$tool.$index.log"
  local gemm=cublas extra=()
  if [ "$suite" != kernels ] && [ "$tool" != memcheck ]; then
    extra=(--force-synchronization-limit "$runtime_sync_limit")
    [ "$tool" = initcheck ] && gemm=$initcheck_prefill_gemm
    # Racecheck fails on cuBLAS's sm_90 GEMMs ("failed to handle a hardware exception", even
    # with them excluded from instrumentation): the GEMV prefill path, as for initcheck.
    [ "$tool" = racecheck ] && gemm=$initcheck_prefill_gemm
  fi
  # Tests synccheck cannot judge (conditional IF bodies of three or more kernels: the probe's kinds
  # 3-6) leave its runs; every kernel they launch runs under it in the other tests.
  if [ "$tool" = synccheck ] && [ -n "$synccheck_exclude" ]; then
    if [[ $filter == *-* ]]; then filter="$filter:$synccheck_exclude"; else filter="$filter-$synccheck_exclude"; fi
  fi
  [ "$suite" != kernels ] && [ "$tool" = racecheck ] && extra+=($runtime_racecheck_args)
  TWINSTEP_PREFILL_GEMM=$gemm GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$index timeout "$limit" \
    compute-sanitizer --tool "$tool" --print-limit 20 "${extra[@]}" $sanitizer_args "$bin" \
    --gtest_filter="$filter" >"$log" 2>&1
  echo "exit $?" >>"$log"
}
export -f run_shard
initcheck_prefill_gemm=${TWINSTEP_SANITIZE_INITCHECK_PREFILL_GEMM:-gemv}
runtime_sync_limit=${TWINSTEP_SANITIZE_RUNTIME_SYNC_LIMIT:-16}
sanitizer_args=${TWINSTEP_SANITIZE_ARGS:-}
synccheck_exclude=${TWINSTEP_SANITIZE_SYNCCHECK_EXCLUDE-TinySpec.DeviceEarlyExitChangesNothingButTime}
export out limit initcheck_prefill_gemm runtime_sync_limit sanitizer_args synccheck_exclude \
  runtime_racecheck_args

plan="$out/plan.txt"
: >"$plan"
for tool in memcheck racecheck initcheck synccheck; do
  for entry in "${suites[@]}"; do
    IFS='|' read -r suite bin filter race_shards shards suite_tools <<<"$entry"
    [[ " $suite_tools " == *" $tool "* ]] || continue
    [ -z "${TWINSTEP_SANITIZE_PLAN:-}" ] || [[ " $TWINSTEP_SANITIZE_PLAN " == *" $tool:$suite "* ]] ||
      continue
    [ "$tool" = racecheck ] && shards=$race_shards
    for ((i = 0; i < shards; i++)); do
      echo "$tool $suite $bin $filter $shards $i" >>"$plan"
    done
  done
done
: >"$out/summary.txt"
runtime_gpu=${TWINSTEP_SANITIZE_RUNTIME_GPU:-}
probes=${TWINSTEP_SANITIZE_PROBES:-1}
for v in 0 1 2; do
  [ "$probes" = 1 ] || break  # one process per writer, so each has its own print limit and summary
  log="$out/cublas_probe.$v.initcheck.log"
  env ${runtime_gpu:+CUDA_VISIBLE_DEVICES=$runtime_gpu} compute-sanitizer --tool initcheck \
    --print-limit 5 "$build/tests/reliability/cublas_initcheck_probe" "$v" >"$log" 2>&1
  echo "cublas probe writer $v under initcheck (exit $?): $(grep -h 'ERROR SUMMARY' "$log" | sed 's/=* *//' | head -1); $(grep -v '^cublas_initcheck_probe' "$log" | grep -c "read_kernel<$v>") printed reports name read_kernel<$v>" |
    tee -a "$out/summary.txt"
  grep -h '^cublas_initcheck_probe' "$log" | tee -a "$out/summary.txt"
done
if [ "$probes" = 1 ]; then
  for k in 0 1 2 3 4 5 6; do  # one process per launch kind: the tool kills a kind it misjudges
    log="$out/conditional_probe.$k.synccheck.log"
    env ${runtime_gpu:+CUDA_VISIBLE_DEVICES=$runtime_gpu} compute-sanitizer --tool synccheck \
      --print-limit 5 "$build/tests/reliability/conditional_synccheck_probe" "$k" >"$log" 2>&1
    echo "conditional probe kind $k under synccheck (exit $?): $(grep -h 'ERROR SUMMARY' "$log" | sed 's/=* *//' | head -1); $(grep -v '^conditional_synccheck_probe' "$log" | grep -c "norm_kernel<(int)$k>") printed reports name norm_kernel<$k>" |
      tee -a "$out/summary.txt"
    grep -h '^conditional_synccheck_probe' "$log" | tee -a "$out/summary.txt"
  done
fi

start=$(date +%s)
# Two pools (three with TWINSTEP_SANITIZE_RUNTIME_SYNCCHECK_GPU: the runtime synccheck shards on
# that GPU); in each, racecheck shards first (the long pole), then initcheck, synccheck, memcheck.
pool() {  # suite-pattern jobs gpu tools
  local pattern=$1 n=$2 gpu=$3 tool
  for tool in $4; do grep "^$tool $pattern " "$plan"; done |
    env ${gpu:+CUDA_VISIBLE_DEVICES=$gpu} xargs -r -P "$n" -L 1 bash -c 'run_shard "$@"' _
}
all_tools="racecheck initcheck synccheck memcheck"
sync_gpu=${TWINSTEP_SANITIZE_RUNTIME_SYNCCHECK_GPU:-}
# Per tool and suite: errors summed over shards (memcheck/initcheck/synccheck "ERROR SUMMARY: N
# errors"; racecheck "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)"). Also run
# when the script is stopped (SIGTERM from an outer time limit): the shards still running are
# stopped and counted as unfinished.
summarize() {
  shopt -s nullglob  # a tool that never started has no logs
  for tool in memcheck racecheck initcheck synccheck; do
    for entry in "${suites[@]}"; do
      IFS='|' read -r suite _ _ _ _ suite_tools <<<"$entry"
      [[ " $suite_tools " == *" $tool "* ]] || continue
      [ -z "${TWINSTEP_SANITIZE_PLAN:-}" ] || [[ " $TWINSTEP_SANITIZE_PLAN " == *" $tool:$suite "* ]] ||
        continue
      logs=("$out/$suite.$tool".*.log)
      total=${#logs[@]}
      finished=0 errors=0 warnings=0 ok=0 failed=0 timed_out=0 empty=0
      for log in "${logs[@]}"; do
        grep -q "^exit 124$" "$log" && timed_out=$((timed_out + 1))
        # A shard past the last test (a filter narrower than the shard count) runs no CUDA at all.
        if grep -q '^\[==========\] Running 0 tests' "$log"; then
          empty=$((empty + 1))
          continue
        fi
        if [ "$tool" = racecheck ]; then
          line=$(grep -h "RACECHECK SUMMARY" "$log" | tail -1)
          if [ -n "$line" ]; then
            finished=$((finished + 1))
            errors=$((errors + $(sed -E 's/.*\(([0-9]+) errors?.*/\1/' <<<"$line")))
            warnings=$((warnings + $(sed -E 's/.* ([0-9]+) warnings?\).*/\1/' <<<"$line")))
          fi
        else
          line=$(grep -h "ERROR SUMMARY" "$log" | tail -1)
          if [ -n "$line" ]; then
            finished=$((finished + 1))
            errors=$((errors + $(sed -E 's/.*ERROR SUMMARY: ([0-9]+) error.*/\1/' <<<"$line")))
          fi
        fi
        ok=$((ok + $(grep -c '^\[       OK \]' "$log")))
        failed=$((failed + $(grep -c '^\[  FAILED  \] .* ms)$' "$log")))
      done
      echo "$tool $suite: $errors errors, $warnings warnings; $finished of $((total - empty)) shards finished ($timed_out timed out, $empty empty left out); tests $ok OK, $failed failed" |
        tee -a "$out/summary.txt"
    done
  done
}

kill_tree() {  # PID: the process and everything it started
  local child
  for child in $(pgrep -P "$1"); do kill_tree "$child"; done
  kill -TERM "$1" 2>/dev/null
}
on_term() {
  local child
  for child in $(pgrep -P $$); do kill_tree "$child"; done
  echo "stopped after $(( $(date +%s) - start )) s: the shards still running were stopped" |
    tee -a "$out/summary.txt"
  summarize
  exit 124
}
trap on_term TERM
pool kernels "$jobs" "${TWINSTEP_SANITIZE_KERNELS_GPU:-}" "$all_tools" &
pools=($!)
# The runtime synccheck shards run one at a time, alone on their GPU: with three or more engine
# processes under synccheck on one GPU the tool fails to set up launches ("Unable to allocate
# enough memory"), with one it does not (gpu_synccheck_bisect.sh moe_alone, 2880eff). Runtime
# racecheck shards (not in the default tools: their processes died several to a GPU) run the same
# way, before synccheck.
sync_jobs=${TWINSTEP_SANITIZE_RUNTIME_SYNCCHECK_JOBS:-1}
if [ -n "$sync_gpu" ] || [ "${TWINSTEP_SANITIZE_RUNTIME_CONCURRENT:-0}" = 1 ]; then
  pool '[a-z_]*tiny' "$sync_jobs" "${sync_gpu:-${TWINSTEP_SANITIZE_RUNTIME_GPU:-}}" "racecheck synccheck" &
  pools+=($!)
  pool '[a-z_]*tiny' "$runtime_jobs" "${TWINSTEP_SANITIZE_RUNTIME_GPU:-}" "initcheck memcheck" &
else
  (
    pool '[a-z_]*tiny' "$runtime_jobs" "${TWINSTEP_SANITIZE_RUNTIME_GPU:-}" "initcheck memcheck"
    pool '[a-z_]*tiny' "$sync_jobs" "${TWINSTEP_SANITIZE_RUNTIME_GPU:-}" "racecheck synccheck"
  ) &
fi
pools+=($!)
wait "${pools[@]}"  # the pools run in the background so that a SIGTERM is handled at once
echo "all shards done in $(( $(date +%s) - start )) s ($jobs kernel and $runtime_jobs runtime shards at a time, $limit s limit each)" |
  tee -a "$out/summary.txt"
summarize
