#!/usr/bin/env bash
# The attention split count rounded down to one wave of blocks (AttentionTuning::
# splits_within_one_wave; docs/kernels.md round 12) measured and recalibrated in one call:
#   1. build; the attention kernel tests; the `attention_batch` bench section (2-32 requests at
#      ctx 1K / 2K / 8K over a run's capacity, one wave beside the old round-up, side by side);
#   2. the calibration sessions whose attention launches the rule changed (every batch of 2 or
#      more requests whose requests x KV heads do not divide 2 x SMs), measured again in a copy of
#      results/h200/calibration_0bf7f6f.db.xz (sessions 1-28 of calibration_d1f6e37.db.xz, which
#      replaced it): Llama-3-8B's main session (28's command),
#      Qwen3-30B-A3B's grid and speculative graphs (24, 25), Llama-3-8B TP2's grid and
#      speculative graphs (26, 27); the refit keeps 2, 4, 12, 15, 21-23 and takes the new ones in
#      place of 24-28 -> OUT/h200-calibrated.yaml;
#   3. Llama-3.2-3B (never fitted) beside Llama-3-8B in one calibrate session at the one-GPU
#      validation's capacities (ctx 1K / 8K, batches 1 and 8), priced with the new profile.
#   scripts/gpu_attention_wave.sh OUT_DIR
# Writes OUT_DIR/{attention_batch.json,h200-calibrated.yaml,cal.db.xz,heldout.db.xz,logs.tar.xz}.
# Env: TWINSTEP_COMMIT.
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: scripts/gpu_attention_wave.sh OUT_DIR}"
recal_build twinstep twinstep_kernels_bench kernels_test || recal_finish cal heldout
recal_kernel_tests '*Attention*'
recal_bench attention_batch
step "calibration sessions"
recal_base_db "$root/results/h200/calibration_d1f6e37.db.xz" 29 28  # calibration_0bf7f6f's 1-28
run_cal main
run_cal qwen3 --models qwen3-30b-a3b --contexts 128,1024 --batches 1,2,4,8,16 --no-spec
run_cal qwen3_spec --spec-only --models qwen3-30b-a3b
run_cal tp2 --models llama-3-8b --tp 2 --contexts 128,1024 --batches 1,2,4,8,16 --no-spec
run_cal tp2_spec --spec-only --tp 2 --models llama-3-8b
new="$first,$((first + 1)),$((first + 2)),$((first + 3)),$((first + 4))"
echo "new sessions: $new"
recal_refit "2,4,12,15,21,22,23,$new"
"$ts" calibrate-eval --profile "$out/h200-calibrated.yaml" --db "$out/cal.db" --sessions "$first" \
  --by-batch >"$logs/main_eval.txt" 2>&1 || status=1
grep -E "^steps|^llama-3-8b +attention " "$logs/main_eval.txt"
recal_heldout "^llama-3.2-3b +attention +[18] |^llama-3.2-3b +(pdl|graph) "
step done
recal_finish cal heldout
