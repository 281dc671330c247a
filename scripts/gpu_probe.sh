#!/usr/bin/env bash
# Engine-sizing probe of the decode step (runtime/bench/decode_bench.cc probe_sizing): batch-1
# graph and PDL decode on engines sized as the runner and as `twinstep calibrate` size them, then
# the warm-up tests of the real backend (RealOptions::warmup_launches).
#   [TWINSTEP_PROBE=sizing|carveout|engines|thermal|graphs|alloc|streams|create|cycle|settle]
#   scripts/gpu_probe.sh OUT_DIR
# Writes OUT_DIR/decode_sizing_probe.json (decode_carveout_probe.json: --probe-carveout, the
# kernels' shared-memory carveout left to the driver vs pinned; decode_engines_probe.json:
# --probe-engines, three engines alive, timed in turn over 40 rounds; decode_thermal_probe.json:
# --probe-thermal, graph and PDL steps after idle spells; decode_graphs_probe.json: --probe-graphs,
# one engine's steps while another engine's graphs are alive or not; decode_alloc_probe.json:
# --probe-alloc, one engine's steps after raw allocations and engine creations;
# decode_streams_probe.json: --probe-streams, one engine's steps as streams are created;
# decode_create_probe.json: --probe-create, one engine's steps as 2-layer and full engines come
# and go; decode_cycle_probe.json: --probe-cycle, one engine's steps after releases and creations
# in the order of TWINSTEP_PROBE_PHASES), probe.log,
# tests.log.
# Env: TWINSTEP_COMMIT.
set -uo pipefail
out=${1:?usage: scripts/gpu_probe.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
gpu_build "$out" twinstep_decode_bench runtime_gpu_test runtime_spec_gpu_test || exit 1
find_exe() { find "$build" -name "$1" -type f -perm -u+x | head -1; }
status=0
"$(find_exe twinstep_decode_bench)" "--probe-${TWINSTEP_PROBE:-sizing}" --out "$out" \
  --commit "${TWINSTEP_COMMIT:-unknown}" >"$out/probe.log" 2>&1 || status=1
cat "$out/probe.log"
for t in runtime_gpu_test runtime_spec_gpu_test; do
  "$(find_exe "$t")" --gtest_filter='*WarmUp*' >>"$out/tests.log" 2>&1 || status=1
done
grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]" "$out/tests.log"
exit $status
