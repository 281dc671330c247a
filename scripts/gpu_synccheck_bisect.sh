#!/usr/bin/env bash
# The two unresolved synccheck results of scripts/gpu_sanitize.sh, bisected in one GPU call
# (docs/reliability.md "compute-sanitizer on the H200"):
#   1. TinySpec.DeviceEarlyExitChangesNothingButTime: "divergent thread(s) in warp" at the first
#      __syncthreads of concat_norm_kernel inside the draft's conditional IF bodies. Run with only
#      concat_norm instrumented (is the report about that kernel alone?) and with it excluded (do
#      the body's other kernels get reports too?).
#   2. The MoE engine tests: the tool's own "Unable to allocate enough memory" on launches.
#      TinyMoeEngine.GreedyMatchesCpuReference alone on the GPU (one process), then with the
#      cuBLAS kernels (nvjet) and the GEMV kernels excluded in turn.
#   scripts/gpu_synccheck_bisect.sh OUT_DIR
# Writes OUT_DIR/<case>/ (gpu_sanitize.sh's logs and summary per case), OUT_DIR/summary.txt and
# OUT_DIR/compute_sanitizer_help.txt (the tool's options, for the next bisection).
# Env: TWINSTEP_SANITIZE_SECONDS (per test, default 150), TWINSTEP_BUILD_DIR as gpu_sanitize.sh.
set -uo pipefail
out=${1:?usage: scripts/gpu_synccheck_bisect.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
compute-sanitizer --version >"$out/compute_sanitizer_help.txt" 2>&1
compute-sanitizer --help >>"$out/compute_sanitizer_help.txt" 2>&1
export TWINSTEP_SANITIZE_SECONDS=${TWINSTEP_SANITIZE_SECONDS:-150}
export TWINSTEP_SANITIZE_RUNTIME_TOOLS=synccheck

# case NAME SUITE FILTER JOBS ARGS
run_case() {
  local name=$1 suite=$2 filter=$3 jobs=$4 args=$5 begin
  begin=$(date +%s)
  if [ "$suite" = spec_tiny ]; then
    TWINSTEP_SANITIZE_SPEC_FILTER=$filter TWINSTEP_SANITIZE_SUITES=$suite TWINSTEP_SANITIZE_SPEC_SHARDS=1 \
      TWINSTEP_SANITIZE_RUNTIME_JOBS=$jobs TWINSTEP_SANITIZE_ARGS=$args \
      bash "$here/gpu_sanitize.sh" "$out/$name" >"$out/$name.txt" 2>&1
  else
    TWINSTEP_SANITIZE_RUNTIME_FILTER=$filter TWINSTEP_SANITIZE_SUITES=$suite TWINSTEP_SANITIZE_RUNTIME_SHARDS=2 \
      TWINSTEP_SANITIZE_RUNTIME_JOBS=$jobs TWINSTEP_SANITIZE_ARGS=$args \
      bash "$here/gpu_sanitize.sh" "$out/$name" >"$out/$name.txt" 2>&1
  fi
  {
    echo "== $name ($suite, $filter, $jobs process(es), args '${args}'): $(( $(date +%s) - begin )) s"
    grep -h "^synccheck" "$out/$name/summary.txt"
    # The first distinct report lines, with the kernel they name.
    cat "$out/$name"/*.synccheck.*.log 2>/dev/null | grep -E "^=+ +(Barrier|Internal|Unable|.*error)|^=+ +at .* in " |
      sed 's/^=* *//' | sort | uniq -c | sort -rn | head -12
  } | tee -a "$out/summary.txt"
}

early='TinySpec.DeviceEarly*'
run_case early_all spec_tiny "$early" 1 ''
run_case early_norm_only spec_tiny "$early" 1 '--kernel-name kns=concat_norm'
run_case early_norm_excluded spec_tiny "$early" 1 '--kernel-name-exclude kns=concat_norm'
moe='*TinyMoeEngine.GreedyMatches*'
run_case moe_alone runtime_tiny "$moe" 1 ''
run_case moe_no_nvjet runtime_tiny "$moe" 1 '--kernel-name-exclude kns=nvjet'
run_case moe_no_gemv runtime_tiny "$moe" 1 '--kernel-name-exclude kns=gemv_kernel'
