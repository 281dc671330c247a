#!/usr/bin/env bash
# Llama-3-8B's decode grid measured again on this GPU and fitted together with the committed
# sessions, so the profile prices the middle of the H200s measured rather than the one that
# measured session 29 (docs/calibration.md "The one-GPU validation again, on two more H200s"):
#   1. build twinstep;
#   2. a copy of results/h200/calibration_d1f6e37.db.xz (sessions 1-53), then `calibrate --models
#      llama-3-8b --no-spec --no-prefill` into it: session 54, the decode grid of session 29's
#      command on this machine;
#   3. the committed profile's refit (its --sessions, --spec-sessions and collectives) with 54 added
#      -> OUT/h200-calibrated.yaml;
#   4. h200_suite and h200_heldout with hardware: h200-calibrated on both backends, against that
#      profile; compare --sim-vs-real per experiment.
#   scripts/gpu_second_machine.sh OUT_DIR
# Writes OUT_DIR/{gpu_id.txt,build.log,session54.log,fit.log,h200-calibrated.yaml,
# <experiment>.sim_vs_real.txt,calibration.db.xz} (the database: sessions 1-54 and the runs).
# The runs' simulated side with the committed profile, for the same machine, comes from
# scripts/sim_vs_real_offline.sh on that database. Env: TWINSTEP_COMMIT, TWINSTEP_CMAKE_ARGS.
set -uo pipefail
out=${1:?usage: scripts/gpu_second_machine.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
gpu_build "$out" twinstep || exit 1
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee "$out/gpu_id.txt"
work=$(mktemp -d)
db=$work/calibration.db
xz -dc "$root/results/h200/calibration_d1f6e37.db.xz" >"$db" || exit 1
status=0
"$build/twinstep" --db "$db" calibrate --out "$work/session54.yaml" --models llama-3-8b \
  --no-spec --no-prefill >"$out/session54.log" 2>&1 || { status=1; tail -5 "$out/session54.log"; }
new=$("$build/twinstep" --db "$db" query --csv "SELECT max(id) FROM calibration_session" | tail -1 | tr -d '"')
echo "measured session $new"
mkdir -p "$work/profiles"
"$build/twinstep" --db "$db" calibrate --fit-only \
  --sessions "2,22,29,32,33,37,38,40,41,42,43,44,45,47,48,49,50,51,53,$new" \
  --spec-sessions 33,37,38,41,42,43,44,48,49,53 \
  --collectives-from "$root/results/h200/nccl_profile_583eee2.yaml" \
  --collectives-from "$root/results/h200/nccl_profile_4gpu_631b9bd.yaml" \
  --out "$work/profiles/h200-calibrated.yaml" >"$out/fit.log" 2>&1 || { status=1; tail -5 "$out/fit.log"; }
cp "$work/profiles/h200-calibrated.yaml" "$out/" || exit 1
export TWINSTEP_PROFILES=$work/profiles
for name in h200_suite h200_heldout; do
  cal=$work/$name-calibrated.yaml
  sed -e 's/^hardware: h200$/hardware: h200-calibrated/' \
    -e 's/^name: \(.*\)$/name: \1-calibrated/' "$root/experiments/validation/$name.yaml" >"$cal"
  xname=$(sed -n 's/^name: //p' "$cal")
  "$build/twinstep" --db "$db" run -q "$cal" >/dev/null 2>"$out/$name.err" || status=1
  "$build/twinstep" --db "$db" compare --experiment "$xname" --sim-vs-real \
    --metrics tpot_ms_mean itl_ms_p99 gpu_busy_frac | tee "$out/$name.sim_vs_real.txt"
done
xz -T0 -c "$db" >"$out/calibration.db.xz"
rm -rf "$work"
exit $status
