#!/usr/bin/env bash
# A whole GPU session in one command: build the project once, then run the named stages in
# order, each under its own time limit, with its logs in OUT/<stage>/ and one status line in
# OUT/summary.txt. At the end every log is packed into OUT/logs.tgz and the loose files are
# removed (the remote-device tool brings back only a few files).
#   scripts/gpu_session.sh OUT STAGE[@GPU][:SECONDS][+STAGE...] ...
# (parts joined by '+' run concurrently, each on the GPU after @ when given, and the stages of a
# part joined by ',' in turn; e.g. `sanitize@1:300+calibrate@0:100,tests@0:200 nccl:120`).
# Stages (each is scripts/gpu_<stage>.sh OUT/<stage>, except `tests`):
#   tests        every ctest suite labelled gpu (they skip where a GPU is missing)
#   spec calibrate nccl tp attention kernels reliability runtime sanitize synccheck_bisect
#   spec_validation moe_spec ncu all
# Env: TWINSTEP_SMI_MS=N samples the SM and memory clocks, power, temperatures and clock-event
# reasons with nvidia-smi every N ms into OUT/smi.csv for the whole session (packed with the logs).
# TWINSTEP_BUILD_DIR (default build), TWINSTEP_CMAKE_ARGS; an unpacked libsqlite3-dev in
# .device-deps/root (from .device-deps/*.deb, unpacked here when present) provides SQLite.
set -uo pipefail
out=${1:?usage: scripts/gpu_session.sh OUT STAGE[:SECONDS] ...}
shift
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
export TWINSTEP_BUILD_DIR=${TWINSTEP_BUILD_DIR:-$root/build}
# The device copy of a working tree may carry a stale .git: pass TWINSTEP_COMMIT from the
# machine that has the real history.
export TWINSTEP_COMMIT=${TWINSTEP_COMMIT:-$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)}
summary="$out/summary.txt"
start=$(date +%s)
note() { echo "$*" | tee -a "$summary"; }

smi_pid=
if [ -n "${TWINSTEP_SMI_MS:-}" ]; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,temperature.memory,clocks_event_reasons.active \
    --format=csv -lms "$TWINSTEP_SMI_MS" >"$out/smi.csv" 2>&1 &
  smi_pid=$!
fi
note "commit $TWINSTEP_COMMIT, $(nvidia-smi -L 2>/dev/null | wc -l) GPU(s): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
cmake -S "$root" -B "$TWINSTEP_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 ${TWINSTEP_CMAKE_ARGS:-} >"$out/configure.log" 2>&1 &&
  cmake --build "$TWINSTEP_BUILD_DIR" -j"$(nproc)" >"$out/build.log" 2>&1
build_status=$?
# The stages' scripts skip their own configure and build (stages may run concurrently).
[ $build_status = 0 ] && export TWINSTEP_PREBUILT=1
note "build: status $build_status at +$(( $(date +%s) - start )) s"
[ $build_status = 0 ] || grep -E "error|Error" "$out/configure.log" "$out/build.log" | head -30 | tee -a "$summary"

# One stage: NAME[@GPU][:SECONDS] (@GPU sets CUDA_VISIBLE_DEVICES for it). Writes its status line.
run_stage() {
  local spec=$1 stage secs gpu dir st
  secs=${spec#*:}
  [ "$secs" = "$spec" ] && secs=300
  stage=${spec%%:*}
  gpu=
  [[ $stage == *@* ]] && { gpu=${stage#*@}; stage=${stage%@*}; }
  dir="$out/$stage"
  mkdir -p "$dir"
  if [ "$stage" = tests ]; then
    (cd "$TWINSTEP_BUILD_DIR" && env ${gpu:+CUDA_VISIBLE_DEVICES=$gpu} timeout "$secs" \
      ctest -L gpu --output-on-failure) >"$dir/ctest.log" 2>&1
  else
    env ${gpu:+CUDA_VISIBLE_DEVICES=$gpu} timeout "$secs" bash "$root/scripts/gpu_$stage.sh" "$dir" \
      >"$dir/run.txt" 2>&1
  fi
  st=$?
  note "$stage${gpu:+ (GPU $gpu)}: status $st$([ $st = 124 ] && echo ' (time limit)') at +$(( $(date +%s) - start )) s"
}

# Each argument is a group: parts joined by '+' run at the same time (give each its own GPU with
# @GPU), the stages of a part joined by ',' one after another; the groups run one after another.
for group in "$@"; do
  pids=()
  IFS='+' read -ra parts <<<"$group"
  for part in "${parts[@]}"; do
    (
      IFS=',' read -ra chain <<<"$part"
      for spec in "${chain[@]}"; do run_stage "$spec"; done
    ) &
    pids+=($!)
  done
  wait "${pids[@]}"
done

[ -n "$smi_pid" ] && kill "$smi_pid" 2>/dev/null
pack=$(mktemp -d)
if tar -C "$out" -czf "$pack/logs.tgz" . ; then
  find "$out" -mindepth 1 -maxdepth 1 ! -name summary.txt -exec rm -rf {} +
  mv "$pack/logs.tgz" "$out/logs.tgz"
else
  echo "packing the logs failed: left them unpacked" | tee -a "$summary"
fi
cat "$summary"
