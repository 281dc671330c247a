#!/usr/bin/env bash
# Llama-3-8B's speculative graphs at 8, 16 and 32 requests (calibrate --spec-only --spec-batches;
# the main session measures 1 and 4), measured in a copy of results/h200/calibration_3098933.db.xz
# (now sessions 1-33 of calibration_d1f6e37.db.xz)
# (session 34), and the profile refitted with it: sessions 2, 4, 12, 15, 21-23, 29-34. The
# speculative suite's real runs (results/h200/spec_suite_84ab754.db.xz) are then re-simulated with
# that profile without a GPU (scripts/sim_vs_real_offline.sh; docs/calibration.md "Speculative
# suite").
#   scripts/gpu_spec_batches.sh OUT_DIR
# Writes OUT_DIR/{h200-calibrated.yaml,cal.db.xz,logs.tar.xz}.
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: scripts/gpu_spec_batches.sh OUT_DIR}"
recal_build twinstep || recal_finish cal
recal_base_db "$root/results/h200/calibration_d1f6e37.db.xz" 34 33  # calibration_3098933's 1-33
step "speculative graphs at 8, 16, 32 requests"
run_cal spec_batches --spec-only --models llama-3-8b --spec-batches 8,16,32
grep -E "batch (8|16|32) ctx [0-9]+ W (6|16):" "$logs/spec_batches.log" | cut -c1-160
recal_refit 2,4,12,15,21,22,23,29,30,31,32,33,34
step done
recal_finish cal
