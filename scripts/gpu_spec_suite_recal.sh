#!/usr/bin/env bash
# The speculative suite on the machine that calibrates it, in one call (docs/calibration.md
# "Speculative suite"): Llama-3-8B's speculative graphs measured again on this machine at 1, 4, 8,
# 16 and 32 requests (contexts 128 and 8192, with the early-exit drafts that skip steps) and at a
# 1K context (batch 1), into a copy of the committed calibration (8cf36ca ran it on sessions 1-36,
# making 37 and 38 of results/h200/calibration_d1f6e37.db.xz: they stand for 29's speculative
# graphs and 34-36; on that file, cut to sessions 1-39, it adds 40 and 41); the profile refitted
# with them (sessions 2, 4, 12, 15, 21-23, 29, 30, 32, 33, 39 and the two new ones; the
# speculative graphs of 12, 15, 33, 39 and the new ones only) and installed as
# results/profiles/h200-calibrated.yaml in this checkout; then
# scripts/gpu_spec_suite.sh into OUT/suite against it, and h200_spec_trace.yaml into its database.
#   scripts/gpu_spec_suite_recal.sh OUT_DIR
# Writes OUT_DIR/cal/{h200-calibrated.yaml,cal.db.xz,logs.tar.xz} and OUT_DIR/suite/ (the suite).
set -uo pipefail
out=${1:?usage: scripts/gpu_spec_suite_recal.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
(
  source "$here/gpu_recal_lib.sh"
  recal_init "$out/cal"
  recal_build twinstep || recal_finish cal
  recal_base_db "$root/results/h200/calibration_d1f6e37.db.xz" 40 39
  step "speculative graphs of this machine"
  run_cal spec_all --spec-only --models llama-3-8b --spec-batches 1,4,8,16,32
  run_cal spec_1k --spec-only --models llama-3-8b --contexts 1024 --spec-batches 1
  grep -E "stopping after 1|batch 1 ctx [0-9]+ W 16:" "$logs"/spec_*.log | cut -c1-170
  RECAL_SPEC_SESSIONS="12,15,33,39,$first,$((first + 1))" \
    recal_refit "2,4,12,15,21,22,23,29,30,32,33,39,$first,$((first + 1))"
  cp "$out/h200-calibrated.yaml" "$root/results/profiles/h200-calibrated.yaml" || status=1
  recal_finish cal
)
status=$?
TWINSTEP_PREBUILT=1 SPEC_SUITE_TRACE=1 bash "$here/gpu_spec_suite.sh" "$out/suite" || status=1
exit $status
