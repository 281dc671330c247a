#!/usr/bin/env bash
# Issue #6's validation suite with speculative decoding, on a machine with a CUDA GPU: build, then
# experiments/validation/h200_spec_suite_calibration.yaml (the verify rounds the simulator
# replays, measured at each concurrency) and h200_spec_suite.yaml (chain(5) and confidence/device
# x lockstep / run-ahead x
# context 1K / 8K x concurrency 1 / 8 / 32, real and simulated with the committed profile) into
# one database, then the comparisons.
#   scripts/gpu_spec_suite.sh OUT_DIR
# Writes OUT_DIR/{sim_vs_real.txt, accept.txt, spec_suite.db.xz, logs.tar.xz}.
# Env: SPEC_SUITE=fusion runs h200_fusion_spec_calibration.yaml and h200_fusion_spec.yaml instead
# (fused, run-ahead, concurrency 1 and 8); TWINSTEP_BUILD_DIR (default build), TWINSTEP_CMAKE_ARGS; SPEC_SUITE_TRACE=1 also runs
# h200_spec_trace.yaml into the database and writes OUT_DIR/spec_rounds.txt.
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: scripts/gpu_spec_suite.sh OUT_DIR}"
db=$out/spec_suite.db
recal_build twinstep || exit 1
cd "$root"
# SPEC_SUITE=fusion: the same for h200_fusion_spec{_calibration,}.yaml (the suite's run-ahead rows
# at concurrency 1 and 8 with policies.fusion norms + rope).
suite=h200_spec_suite
[ "${SPEC_SUITE:-}" = fusion ] && suite=h200_fusion_spec
name=${suite//_/-}
for exp in ${suite}_calibration $suite; do
  step "$exp"
  "$ts" --db "$db" run -q "experiments/validation/$exp.yaml" >"$logs/$exp.log" 2>&1 ||
    { status=1; tail -5 "$logs/$exp.log"; }
done
step compare
"$ts" --db "$db" compare --experiment "$name" --sim-vs-real \
  --metrics tpot_ms_mean itl_ms_p99 accept_len_mean gpu_busy_frac >"$out/sim_vs_real.txt" 2>&1 ||
  status=1
grep -E "tpot_ms_mean|accept_len_mean" "$out/sim_vs_real.txt" | cut -c1-150
"$ts" --db "$db" compare --experiment "$name" --accept >"$out/accept.txt" 2>&1 || status=1
if [ "${SPEC_SUITE_TRACE:-0}" = 1 ]; then  # the batch-1 rounds launch by launch, same database
  step h200_spec_trace
  "$ts" --db "$db" run -q experiments/validation/h200_spec_trace.yaml >"$logs/h200_spec_trace.log" 2>&1 ||
    { status=1; tail -5 "$logs/h200_spec_trace.log"; }
  python3 scripts/spec_rounds.py "$db" h200-spec-trace >"$out/spec_rounds.txt" 2>&1 || status=1
fi
step "done, status $status"
recal_finish spec_suite
