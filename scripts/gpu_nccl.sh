#!/usr/bin/env bash
# NCCL collective calibration on every GPU of this machine (docs/calibration.md "Collectives"):
# builds twinstep and the NCCL calibration tests, runs the CPU fit test and the 1-rank GPU loop
# test, then `mpirun -np GPUS twinstep calibrate-nccl`: all-reduce, all-gather, all-to-all and
# send/recv from 8 KB to 256 MB, eager and in captured graphs, fitted into a profile, then (2+
# GPUs) the skewed-arrival sweep: the graph all-reduce with the last rank late by 0-32 us, fitted
# into the profile's collective_skew curve (a few seconds). About a minute of GPU time on 2 H200s
# after the build.
#   scripts/gpu_nccl.sh OUT_DIR
# Writes OUT_DIR/{configure,build,fit_test,gpu_test,nccl}.log, OUT_DIR/gpu.txt and
# OUT_DIR/nccl.yaml (the profile; install it as results/profiles/NAME.yaml) and OUT_DIR/nccl.json
# (the table and fits as a record for results/h200/). Without mpirun or
# an MPI build it falls back to `calibrate-nccl --single-process` (one thread per GPU).
# Env: TWINSTEP_BUILD_DIR (default build), TWINSTEP_CMAKE_ARGS extra configure flags (an
# unpacked libsqlite3-dev from .device-deps is used (scripts/gpu_env.sh));
# TWINSTEP_NCCL_PROFILE a calibrated profile in results/profiles to extend (its tables of other
# GPU counts stay as nccl.r<N> groups; its name is kept;
# default: none, the GPU's datasheet preset, profile name h200-nccl); TWINSTEP_NCCL_QUICK=1 for
# x4 size steps; TWINSTEP_NCCL_SKEW=0 to skip the skewed-arrival sweep (--no-skew);
# TWINSTEP_MPIRUN_ARGS extra mpirun flags.
set -uo pipefail
out=${1:?usage: scripts/gpu_nccl.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }
status=0
# NVLink multicast stays off (the lent machines' rule; NCCL would use it for all-reduce).
export NCCL_NVLS_ENABLE=0
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

step configure
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  ${TWINSTEP_CMAKE_ARGS:-} >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
grep -E "twinstep:" "$out/configure.log"
step build
cmake --build "$build" -j16 --target twinstep runtime_nccl_fit_test \
  runtime_nccl_calibrate_gpu_test >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
nvidia-smi topo -m >"$out/topo.txt" 2>&1 || true
gpus=$(nvidia-smi -L | wc -l)

step "fit test (CPU)"
"$build/tests/runtime/runtime_nccl_fit_test" >"$out/fit_test.log" 2>&1 || status=1
tail -n 3 "$out/fit_test.log"
step "1-rank loop test (GPU)"
"$build/tests/runtime/runtime_nccl_calibrate_gpu_test" >"$out/gpu_test.log" 2>&1 || status=1
tail -n 3 "$out/gpu_test.log"
if grep -q "SKIPPED \]" "$out/gpu_test.log"; then echo "FAILED: the GPU test skipped"; status=1; fi

args=(calibrate-nccl --out "$out/nccl.yaml" --json "$out/nccl.json")
if [ -n "${TWINSTEP_NCCL_PROFILE:-}" ]; then
  args+=(--profile "$TWINSTEP_NCCL_PROFILE" --name "$TWINSTEP_NCCL_PROFILE")
else
  args+=(--name h200-nccl)
fi
[ "${TWINSTEP_NCCL_QUICK:-0}" = 1 ] && args+=(--quick)
[ "${TWINSTEP_NCCL_SKEW:-1}" = 0 ] && args+=(--no-skew)

step "calibrate-nccl on $gpus GPU(s)"
mpi=1
if ! command -v mpirun >/dev/null; then
  echo "note: mpirun is not on PATH (openmpi-bin): falling back to one process, one thread per GPU"
  mpi=0
elif ! grep -q "MPI (distributed sweeps) ON" "$out/configure.log"; then
  echo "note: twinstep was configured without MPI (libopenmpi-dev): one process, one thread per GPU"
  mpi=0
fi
if [ "$gpus" -gt 1 ] && [ $mpi = 1 ]; then
  # One rank per GPU (rank r takes GPU r: its local rank), no oversubscription, no core
  # binding (NCCL's proxy threads need cores of their own); the environment NCCL reads goes
  # to every rank.
  # shellcheck disable=SC2086
  timeout 300 mpirun --allow-run-as-root -np "$gpus" --bind-to none \
    -x NCCL_NVLS_ENABLE -x NCCL_DEBUG ${TWINSTEP_MPIRUN_ARGS:-} \
    "$build/twinstep" "${args[@]}" >"$out/nccl.log" 2>&1 || status=1
elif [ "$gpus" -gt 1 ]; then
  timeout 300 "$build/twinstep" "${args[@]}" --single-process >"$out/nccl.log" 2>&1 || status=1
else
  timeout 300 "$build/twinstep" "${args[@]}" >"$out/nccl.log" 2>&1 || status=1
fi
sed -n '/^fit:/,$p' "$out/nccl.log"
for f in nccl.yaml nccl.json; do
  [ -s "$out/$f" ] || { echo "FAILED: no $out/$f (see nccl.log)"; status=1; }
done
echo "commit $(git -C "$root" rev-parse HEAD 2>/dev/null)$(git -C "$root" diff --quiet 2>/dev/null || echo -dirty)" \
  | tee -a "$out/gpu.txt"
# The profile under its own name in OUT/profiles, ready for TWINSTEP_PROFILES (gpu_tp.sh: TP_PROFILES).
if [ -f "$out/nccl.yaml" ]; then
  mkdir -p "$out/profiles"
  cp "$out/nccl.yaml" "$out/profiles/${TWINSTEP_NCCL_PROFILE:-h200-nccl}.yaml"
fi
exit $status
