#!/usr/bin/env bash
# Llama-3-8B's fused speculative graphs (calibrate --fusion norms,rope) measured where the fused
# speculative validation needs them (docs/calibration.md "Calibrated fusions"): session 40 timed
# them at batches 1 and 4, contexts 128 and 8192 only, and the fused suite's confidence rows at a
# 1K context and 8 requests came out -2.1 to -4.5 %. As sessions 37 and 38 did for the unfused
# label: at 1, 4, 8, 16 and 32 requests, and at batch 1 at a 1K context. In one call: those two
# sessions into a copy of the committed database (43 and 44), the committed profile refitted with
# them in place of 40's speculative graphs (sessions 2, 4, 12, 15, 21-23, 29, 30, 32, 33, 37-44;
# the speculative graphs of 12, 15, 33, 37-39 and 41-44), then the fused speculative validation
# (SPEC_SUITE=fusion scripts/gpu_spec_suite.sh) against that profile. 141d520 ran it: its database
# is results/h200/calibration_d1f6e37.db.xz (sessions 1-42 are 74ae82a's, which it replaced), so
# this script starts from its sessions 1-42.
#   scripts/gpu_fusion_spec_recal.sh OUT_DIR
# Writes OUT_DIR/{h200-calibrated.yaml,cal.db.xz,logs.tar.xz} and OUT_DIR/suite/ (gpu_spec_suite.sh's
# files).
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: scripts/gpu_fusion_spec_recal.sh OUT_DIR}"
recal_build twinstep || recal_finish cal
recal_base_db "$root/results/h200/calibration_d1f6e37.db.xz" 43 42
step "fused speculative graphs (norms + rope) at 1-32 requests, and at 1K"
run_cal fused_spec_all --spec-only --fusion norms,rope --models llama-3-8b --spec-batches 1,4,8,16,32
run_cal fused_spec_1k --spec-only --fusion norms,rope --models llama-3-8b --contexts 1024 \
  --spec-batches 1
second=$((first + 1))
RECAL_SPEC_SESSIONS="12,15,33,37,38,39,41,42,$first,$second" \
  recal_refit "2,4,12,15,21,22,23,29,30,32,33,37,38,39,40,41,42,$first,$second"
grep -E '^llama-3-8b\+norms\+rope +(verify|draft_early_exit) ' "$logs/refit.log" | cut -c1-150
mkdir -p "$out/profiles" && cp "$out/h200-calibrated.yaml" "$out/profiles/"
step "fused speculative validation"
TWINSTEP_PROFILES="$out/profiles" TWINSTEP_PREBUILT=1 SPEC_SUITE=fusion \
  bash "$root/scripts/gpu_spec_suite.sh" "$out/suite" >"$logs/suite.log" 2>&1 || status=1
grep -E "tpot_ms_mean" "$out/suite/sim_vs_real.txt"
rm -rf "$out/profiles"
recal_finish cal
