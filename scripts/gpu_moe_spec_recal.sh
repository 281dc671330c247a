#!/usr/bin/env bash
# Qwen3-30B-A3B's speculative graphs measured again with the current calibrate (issue #6,
# docs/calibration.md "MoE speculative graphs again, session 22"). The committed profile took them
# from session 31 of results/h200/calibration_8cf36ca.db.xz, measured before calibrate started
# every round from the prompt's context and timed early-exit drafts that stop after one token
# (draft_early_exit_skip): its Qwen3 graphs have no skipped-step cost and a grown capacity. In one
# call: the speculative GPU tests and the engine's, those graphs into a copy of that database
# (session 39), and the committed profile refitted with them in place of 31's (sessions 2, 4, 12,
# 15, 21-23, 29, 30, 32, 33, 37, 38 and 39; the speculative graphs of 12, 15, 33, 37, 38 and 39).
# a7acc12 ran it: its database is results/h200/calibration_d1f6e37.db.xz (sessions 1-38 are
# 8cf36ca's, which it replaced), so this script now starts from its sessions 1-38.
#   scripts/gpu_moe_spec_recal.sh OUT_DIR
# Writes OUT_DIR/{h200-calibrated.yaml,cal.db.xz,logs.tar.xz}. The MoE speculative validation's
# real runs (results/h200/moe_spec_bc10203.db.xz: the runtime has not changed since) are then
# simulated again with the new profile on any machine (scripts/sim_vs_real_offline.sh).
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: scripts/gpu_moe_spec_recal.sh OUT_DIR}"
recal_build twinstep runtime_spec_gpu_test runtime_gpu_test || recal_finish cal
step "speculative and engine GPU tests"
"$build/tests/runtime/runtime_spec_gpu_test" >"$logs/spec_tests.log" 2>&1 || status=1
"$build/tests/runtime/runtime_gpu_test" >"$logs/engine_tests.log" 2>&1 || status=1
grep -hE "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]" "$logs/spec_tests.log" "$logs/engine_tests.log"
recal_base_db "$root/results/h200/calibration_d1f6e37.db.xz" 39 38
step "Qwen3-30B-A3B speculative graphs"
run_cal qwen3_spec --spec-only --models qwen3-30b-a3b
grep -E "stopping after 1|W (2|8):" "$logs/qwen3_spec.log" | cut -c1-170
RECAL_SPEC_SESSIONS="12,15,33,37,38,$first" \
  recal_refit "2,4,12,15,21,22,23,29,30,32,33,37,38,$first"
recal_finish cal
