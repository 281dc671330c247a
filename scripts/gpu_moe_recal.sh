#!/usr/bin/env bash
# Qwen3-30B-A3B measured again after its expert GEMVs moved to gemv_split_kernel's grouped mode
# (session 27, GemvTuning::moe_fill 3: moe_forward 1.8-2.6x faster than on the bulk-copy ring it
# replaced; docs/kernels.md round 22). Every calibration session of the committed profile that
# timed moe_forward is measured again, like for like, into a copy of the committed database
# (sessions 1-44 of results/h200/calibration_d1f6e37.db.xz), and the profile refitted with the new
# sessions in place of the old ones:
#   45 the one-GPU decode grid          (replaces 30)    46 its speculative graphs     (39)
#   47 the TP2-EP2 shard's decode grid  (4)              48 its speculative graphs     (15)
#   49 the TP4-EP4 shard's speculative graphs (12)
#   50 the TP2-EP2 shard's collective breaks (21)        51 the TP4-EP4 shard's         (23)
# (the dense sessions 2, 22, 29, 32, 33, 37, 38 and 40-44 stay). Then experiments/validation/
# h200_moe.yaml, sim and real, against that profile (scripts/gpu_calibrate.sh CALIBRATE_PROFILE).
# The same call serves each change of the MoE kernels (session 28: GemvTuning::moe_warp_tiles on,
# sessions 45-51 of calibration_d1f6e37.db.xz): MOE_KERNELS=1 first runs the MoE kernel tests and the benchmark's moe section (OUT_DIR/moe.json),
# MOE_SPEC=1 last runs scripts/gpu_moe_spec.sh against the refitted profile (OUT_DIR/spec.tar;
# about 80 s more).
#   [MOE_KERNELS=1] [MOE_SPEC=1] TWINSTEP_COMMIT=<sha> scripts/gpu_moe_recal.sh OUT_DIR
# Writes OUT_DIR/{h200-calibrated.yaml,cal.db.xz,logs.tar.xz} and OUT_DIR/moe.tar (gpu_calibrate.sh's
# folder: validation.db.xz, h200_moe.sim_vs_real.txt, logs). Give TWINSTEP_COMMIT literally: on the
# GPU machine `git rev-parse` may name another commit than the tree's (docs/calibration.md "MoE on
# the split kernel"); a twinstep built as another commit is refused (gpu_check_commit).
set -uo pipefail
source "$(dirname "$0")/gpu_recal_lib.sh"
recal_init "${1:?usage: scripts/gpu_moe_recal.sh OUT_DIR}"
targets=(twinstep)
[ "${MOE_KERNELS:-0}" = 1 ] && targets+=(kernels_test twinstep_kernels_bench)
recal_build "${targets[@]}" || recal_finish cal
if [ "${MOE_KERNELS:-0}" = 1 ]; then
  recal_kernel_tests 'Moe*:*/Moe*'
  recal_bench moe
fi
recal_base_db "$root/results/h200/calibration_d1f6e37.db.xz" 45 44
[ "$first" = 45 ] || { echo "expected the next session to be 45, got $first"; status=1; }
step "Qwen3-30B-A3B sessions 45-51"
narrow="--contexts 128,1024 --batches 1,2,4,8,16"
run_cal qwen3 --models qwen3-30b-a3b $narrow --no-spec
run_cal qwen3_spec --spec-only --models qwen3-30b-a3b
run_cal qwen3_tp2 --models qwen3-30b-a3b --tp 2 $narrow --no-spec
run_cal qwen3_tp2_spec --spec-only --tp 2 --models qwen3-30b-a3b
run_cal qwen3_tp4_spec --spec-only --tp 4 --models qwen3-30b-a3b
run_cal qwen3_tp2_breaks --breaks-only --tp 2 --models qwen3-30b-a3b \
  --contexts 128,512,1024,2048,4096,8192 --batches 1,2,4,8,16
run_cal qwen3_tp4_breaks --breaks-only --tp 4 --models qwen3-30b-a3b \
  --contexts 1024,2048,4096,8192 --batches 1,2,4,8,16
RECAL_SPEC_SESSIONS="33,37,38,41,42,43,44,46,48,49" \
  recal_refit "2,22,29,32,33,37,38,40,41,42,43,44,45,46,47,48,49,50,51"
grep -E '^ *"?moe_(gate_up|down)' "$out/h200-calibrated.yaml" | cut -c1-160
step "validation-h200-moe against the refitted profile"
TWINSTEP_BUILD_DIR=$build TWINSTEP_PREBUILT=1 CALIBRATE_PROFILE="$out/h200-calibrated.yaml" \
  CALIBRATE_MOE=1 CALIBRATE_VALIDATE=h200_moe bash "$root/scripts/gpu_calibrate.sh" "$out/moe" \
  >"$logs/validate.log" 2>&1 || status=1
grep -E "tpot_ms_mean|itl_ms_p99|gpu_busy" "$out"/moe/*sim_vs_real* 2>/dev/null
[ -f "$out/moe/validation.db" ] && xz -T0 -f "$out/moe/validation.db"
(cd "$out" && tar cf moe.tar moe && rm -rf moe)
if [ "${MOE_SPEC:-0}" = 1 ]; then
  step "validation-h200-moe-spec against the refitted profile"
  mkdir -p "$out/profiles" && cp "$out/h200-calibrated.yaml" "$out/profiles/"
  TWINSTEP_BUILD_DIR=$build TWINSTEP_PREBUILT=1 TWINSTEP_PROFILES="$out/profiles" MOE_SPEC_TESTS=0 \
    bash "$root/scripts/gpu_moe_spec.sh" "$out/spec" >"$logs/spec.log" 2>&1 || status=1
  grep -E "tpot_ms_mean|itl_ms_p99" "$out/spec/sim_vs_real.txt" 2>/dev/null
  [ -f "$out/spec/moe_spec.db" ] && xz -T0 -f "$out/spec/moe_spec.db"
  rm -rf "$out/profiles"
  (cd "$out" && tar cf spec.tar spec && rm -rf spec)
fi
recal_finish cal
