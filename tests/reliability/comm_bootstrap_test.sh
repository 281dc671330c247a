#!/usr/bin/env bash
# The multi-rank bootstrap's deadline (runtime/comm.h bootstrap_world) under mpirun, on CPU:
# all ranks join and receive rank 0's payload; a rank that never joins makes every other rank
# fail with "rank R of N did not join within T s" soon after the deadline, instead of hanging.
# Usage: comm_bootstrap_test.sh PROBE_BINARY
set -uo pipefail
probe=${1:?usage: comm_bootstrap_test.sh PROBE_BINARY}
command -v mpirun >/dev/null || { echo "FAILED: mpirun not on PATH (install openmpi-bin)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failed=0
check() {
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failed=1; fi
}
# Open MPI leaves allocations of its components at finalize (see distributed_test.sh).
mpi() {
  local n=$1
  shift
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
    timeout 60 mpirun -n "$n" --oversubscribe "$@"
}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

mpi 3 "$probe" 2 -1 >"$out" 2>&1
check "3 ranks join: exit 0" test $? -eq 0
check "every rank gets rank 0's payload" test "$(grep -c 'payload id from rank 0' "$out")" -eq 3

start=$SECONDS
mpi 2 "$probe" 1 1 >"$out" 2>&1
rc=$?
cat "$out"
check "a missing rank fails the job" test $rc -ne 0
check "rank 0 names the missing rank" grep -qx "rank 0: bootstrap: rank 1 of 2 did not join within 1 s" "$out"
check "the job ends soon after the deadline (not a hang)" test $((SECONDS - start)) -lt 30

mpi 3 "$probe" 1 2 >"$out" 2>&1
cat "$out"
check "rank 0 names rank 2 of 3" grep -qx "rank 0: bootstrap: rank 2 of 3 did not join within 1 s" "$out"
check "rank 1 gets rank 0's verdict" grep -qx "rank 1: bootstrap: rank 2 of 3 did not join within 1 s" "$out"

mpi 2 "$probe" 1 1 late >"$out" 2>&1
cat "$out"
check "a rank joining after the deadline learns why" grep -qx "rank 1: bootstrap: rank 1 of 2 did not join within 1 s" "$out"

mpi 2 "$probe" 1 0 >"$out" 2>&1
cat "$out"
check "a missing rank 0 is named by the others" grep -qx "rank 1: bootstrap: rank 0 of 2 did not join within 2 s" "$out"
exit $failed
