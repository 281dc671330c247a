#!/usr/bin/env bash
# The GEMV split rule of d6e1903+ (kernels/gemv_split.h: S = 1 but for shapes of at most ~100
# tiles; docs/kernels.md round 11) measured and recalibrated in one call:
#   1. build; the GEMV / LM-head / MoE kernel tests; the `gemv_split` bench section (the rule's
#      choice beside forced splits and rings);
#   2. the calibration sessions whose shapes the rule changed, measured again in a copy of the
#      committed calibration database (then calibration_e8341f9.db.xz, now sessions 1-23 of
#      results/h200/calibration_d1f6e37.db.xz): Qwen3-30B-A3B's
#      grid (its qkv 5120 x 2048 was S = 2) and speculative graphs, Llama-3-8B's TP2 shard grid
#      (qkv 3072 x 4096 was S = 4, lm_head S = 2) and speculative graphs; the sessions they
#      stand for (1, 7, 3, 6) are left out of the refit, the others kept;
#   3. the refit -> OUT/h200-calibrated.yaml, its calibrate-eval;
#   4. Llama-3.2-3B (never fitted; its qkv was S = 2, down_proj S = 4) beside Llama-3-8B in one
#      calibrate session, priced with the new profile (calibrate-eval).
#   scripts/gpu_split_rule.sh OUT_DIR
# Writes OUT_DIR/{gemv_split.json,h200-calibrated.yaml,cal.db.xz,heldout.db.xz,logs.tar.xz}.
# Env: TWINSTEP_COMMIT.
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: scripts/gpu_split_rule.sh OUT_DIR}"
recal_build twinstep twinstep_kernels_bench kernels_test || recal_finish cal heldout
recal_kernel_tests '*Gemv*:*LmHead*:*Moe*'
recal_bench gemv_split
step "calibration sessions"
recal_base_db "$root/results/h200/calibration_d1f6e37.db.xz" 24 23  # calibration_e8341f9's 1-23
run_cal qwen3 --models qwen3-30b-a3b --contexts 128,1024 --batches 1,2,4,8,16 --no-spec
run_cal qwen3_spec --spec-only --models qwen3-30b-a3b
run_cal tp2 --models llama-3-8b --tp 2 --contexts 128,1024 --batches 1,2,4,8,16 --no-spec
run_cal tp2_spec --spec-only --tp 2 --models llama-3-8b
new="$first,$((first + 1)),$((first + 2)),$((first + 3))"
echo "new sessions: $new"
recal_refit "2,4,5,12,15,21,22,23,$new"
recal_heldout "^llama-3.2-3b +(down_proj|qkv_proj) +[18] |^llama-3.2-3b +(pdl|graph) "
recal_finish cal heldout
