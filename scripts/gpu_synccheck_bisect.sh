#!/usr/bin/env bash
# The two unresolved synccheck results of scripts/gpu_sanitize.sh, bisected by the tool's kernel
# filters (docs/reliability.md "compute-sanitizer on the H200"):
#   early_*: TinySpec.DeviceEarlyExitChangesNothingButTime, "divergent thread(s) in warp" at the
#     first __syncthreads of concat_norm_kernel inside the draft's conditional IF bodies. At
#     1c0e379: 256 reports with every kernel checked, none with only concat_norm checked. The
#     x_* cases leave one kernel family unchecked each: the family whose absence clears the
#     report is the one whose checking disturbs concat_norm's.
#   moe_*: the MoE engine tests, the tool's own "Unable to allocate enough memory" on launches:
#     TinyMoeEngine.GreedyMatchesCpuReference alone on its GPU (one process), then with the
#     cuBLAS kernels (nvjet) and the GEMV kernels unchecked in turn.
#   scripts/gpu_synccheck_bisect.sh OUT_DIR
# Env: BISECT_CASES (names from the table below, default all of them), BISECT_JOBS (cases at once,
# default 1), TWINSTEP_SANITIZE_SECONDS (per test, default 150), TWINSTEP_BUILD_DIR as
# gpu_sanitize.sh. Writes OUT_DIR/<case>/ (gpu_sanitize.sh's logs), OUT_DIR/summary.txt (per
# case: errors, tests, the most frequent report lines) and OUT_DIR/compute_sanitizer_help.txt.
set -uo pipefail
out=${1:?usage: scripts/gpu_synccheck_bisect.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
compute-sanitizer --version >"$out/compute_sanitizer_help.txt" 2>&1
compute-sanitizer --help >>"$out/compute_sanitizer_help.txt" 2>&1
export TWINSTEP_SANITIZE_SECONDS=${TWINSTEP_SANITIZE_SECONDS:-150}
export TWINSTEP_SANITIZE_RUNTIME_TOOLS=synccheck TWINSTEP_SANITIZE_PROBES=0 out here

early='TinySpec.DeviceEarly*'
moe='*TinyMoeEngine.GreedyMatches*'
# name|suite|filter|compute-sanitizer filter options
cases=(
  "early_all|spec_tiny|$early|"
  "early_norm_only|spec_tiny|$early|--kernel-name kns=concat_norm"
  "early_norm_embedding_only|spec_tiny|$early|--kernel-name kns=concat_norm --kernel-name kns=embedding_gather"
  "early_x_norm|spec_tiny|$early|--kernel-name-exclude kns=concat_norm"
  "early_x_embedding|spec_tiny|$early|--kernel-name-exclude kns=embedding_gather"
  "early_x_gemv|spec_tiny|$early|--kernel-name-exclude kns=gemv_kernel"
  "early_x_attention|spec_tiny|$early|--kernel-name-exclude kns=attention"
  "early_x_rmsnorm|spec_tiny|$early|--kernel-name-exclude kns=rmsnorm"
  "early_x_rope|spec_tiny|$early|--kernel-name-exclude kns=rope"
  "early_x_draft_control|spec_tiny|$early|--kernel-name-exclude kns=draft"
  "early_x_lm_head|spec_tiny|$early|--kernel-name-exclude kns=lm_head"
  "early_x_step_commit|spec_tiny|$early|--kernel-name-exclude kns=draft_step_commit"
  "early_x_set_condition|spec_tiny|$early|--kernel-name-exclude kns=set_draft_condition"
  "early_x_draft_begin|spec_tiny|$early|--kernel-name-exclude kns=draft_begin"
  "moe_alone|runtime_tiny|$moe|"
  "moe_x_nvjet|runtime_tiny|$moe|--kernel-name-exclude kns=nvjet"
  "moe_x_gemv|runtime_tiny|$moe|--kernel-name-exclude kns=gemv_kernel"
)

run_case() {  # one table row
  local name suite filter args begin
  IFS='|' read -r name suite filter args <<<"$1"
  begin=$(date +%s)
  # One shard per test (1 speculative, 2 MoE), run one after another inside the case.
  TWINSTEP_SANITIZE_SUITES=$suite TWINSTEP_SANITIZE_SPEC_FILTER=$filter \
    TWINSTEP_SANITIZE_RUNTIME_FILTER=$filter TWINSTEP_SANITIZE_SPEC_SHARDS=1 \
    TWINSTEP_SANITIZE_RUNTIME_SHARDS=2 TWINSTEP_SANITIZE_RUNTIME_JOBS=1 TWINSTEP_SANITIZE_ARGS=$args \
    bash "$here/gpu_sanitize.sh" "$out/$name" >"$out/$name.txt" 2>&1
  {
    echo "== $name ($filter; args '$args'): $(($(date +%s) - begin)) s"
    grep -h "^synccheck" "$out/$name/summary.txt"
    cat "$out/$name"/*.synccheck.*.log 2>/dev/null |
      grep -E "^=+ +(Barrier|Internal|Unable|.*rror)|^=+ +at .* in " | sed 's/^=* *//' |
      sort | uniq -c | sort -rn | head -8
  } >"$out/$name.summary"
}
export -f run_case

selected=${BISECT_CASES:-}
for c in "${cases[@]}"; do
  [ -z "$selected" ] || [[ " $selected " == *" ${c%%|*} "* ]] && printf '%s\n' "$c"
done | xargs -d '\n' -P "${BISECT_JOBS:-1}" -I{} bash -c 'run_case "$1"' _ {}
for c in "${cases[@]}"; do
  [ -f "$out/${c%%|*}.summary" ] && cat "$out/${c%%|*}.summary"
done | tee "$out/summary.txt"
