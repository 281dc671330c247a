#!/usr/bin/env bash
# Nsight Compute profiles of the decode kernels on a machine with a CUDA GPU: the GEMV on the
# Llama-3-8B shapes at m = 1, 6, 16 and the attention pair at ctx 8192, q_len 1 and 6, one eager
# launch each (`twinstep_kernels_bench --only ncu`), cold caches (ncu flushes them before every
# replay), clocks left alone.
#   scripts/gpu_ncu.sh OUT_DIR
# Writes OUT_DIR/{run,details,raw}.txt: ncu's log, the sections per kernel (speed of light,
# memory workload, warp states, scheduler, occupancy, launch, instruction statistics) and the
# raw metrics as CSV. Env: TWINSTEP_NCU_KERNELS (kernel-name regex), TWINSTEP_NCU_SECTIONS.
set -uo pipefail
out=${1:?usage: scripts/gpu_ncu.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
gpu_build "$out" twinstep_kernels_bench || exit 1
ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu_bin" ] || { echo "ncu not found"; exit 1; }
kernels=${TWINSTEP_NCU_KERNELS:-gemv_split_kernel|attention_split_kernel|attention_combine_kernel}
sections=${TWINSTEP_NCU_SECTIONS:-SpeedOfLight MemoryWorkloadAnalysis WarpStateStats SchedulerStats Occupancy LaunchStats InstructionStats ComputeWorkloadAnalysis}
args=()
for s in $sections; do args+=(--section "$s"); done
"$ncu_bin" --clock-control none --cache-control all -k "regex:$kernels" "${args[@]}" \
  -f -o "$out/profile" "$build/kernels/twinstep_kernels_bench" --only ncu >"$out/run.txt" 2>&1
status=$?
echo "ncu status $status"
tail -5 "$out/run.txt"
[ -f "$out/profile.ncu-rep" ] || exit 1
"$ncu_bin" -i "$out/profile.ncu-rep" --page details >"$out/details.txt" 2>&1
"$ncu_bin" -i "$out/profile.ncu-rep" --page raw --csv >"$out/raw.txt" 2>&1
grep -E "gemv_split_kernel|attention_(split|combine)_kernel|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|No Eligible|Issued Warp" \
  "$out/details.txt" | head -200
exit $status
