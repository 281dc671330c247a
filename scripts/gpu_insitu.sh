#!/usr/bin/env bash
# The TP2 shards' collective breaks measured in situ and the two-GPU validation priced with them,
# in one call on two GPUs (docs/calibration.md "Settled GPU state"): scripts/gpu_breaks.sh with
# INSITU=1 (Llama-3-8B and Qwen3-30B-A3B, tp 2, four contexts, batches 1-16, under mpirun) into a
# copy of CAL_DB; the committed profile's refit plus those sessions into OUT/profiles/
# h200-calibrated.yaml; then scripts/gpu_tp.sh (TP2 and TP2-EP2, both backends, that profile).
#   scripts/gpu_insitu.sh OUT_DIR
# Writes OUT_DIR/breaks/ (cal.db, logs), OUT_DIR/profiles/h200-calibrated.yaml, OUT_DIR/fit.log,
# OUT_DIR/tp/ (gpu_tp.sh's records). Env: CAL_DB (default results/h200/calibration_d1f6e37.db.xz),
# FIT_SESSIONS and FIT_SPEC_SESSIONS (the committed profile's sessions and those of its speculative
# graphs; default those of the committed profile, tests/cli/cli_test.sh), TWINSTEP_COMMIT,
# TWINSTEP_BUILD_DIR (default build).
set -uo pipefail
out=${1:?usage: scripts/gpu_insitu.sh OUT_DIR}
mkdir -p "$out/profiles"
out=$(cd "$out" && pwd)
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
status=0
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }
export CAL_DB=${CAL_DB:-$root/results/h200/calibration_d1f6e37.db.xz}
INSITU=1 BREAKS="llama-3-8b 2 1024,2048,4096,8192 1,2,4,8,16
qwen3-30b-a3b 2 1024,2048,4096,8192 1,2,4,8,16" bash "$root/scripts/gpu_breaks.sh" "$out/breaks" ||
  status=1
db="$out/breaks/cal.db"
fitted=${FIT_SESSIONS:-2,22,29,32,33,37,38,40,41,42,43,44,45,46,47,48,49,50,51}
spec_sessions=${FIT_SPEC_SESSIONS:-33,37,38,41,42,43,44,46,48,49}
base=$(echo "$fitted" | tr ',' '\n' | sort -n | tail -1)
new=$("$build/twinstep" --db "$db" query --csv \
  "SELECT group_concat(id) FROM calibration_session WHERE id > $base" | tail -1 | tr -d '"')
step "refit: sessions $fitted and $new (speculative graphs of $spec_sessions)"
"$build/twinstep" --db "$db" calibrate --fit-only --sessions "$fitted${new:+,$new}" \
  --spec-sessions "$spec_sessions" \
  --collectives-from "$root/results/h200/nccl_profile_583eee2.yaml" \
  --collectives-from "$root/results/h200/nccl_profile_4gpu_631b9bd.yaml" \
  --out "$out/profiles/h200-calibrated.yaml" >"$out/fit.log" 2>&1 || { status=1; tail -5 "$out/fit.log"; }
grep -E "break gap .*@tp2" "$out/fit.log"
step "two-GPU validation"
TP_TESTS=0 EP=1 TP_HARDWARE=h200-calibrated TP_PROFILES="$out/profiles" \
  bash "$root/scripts/gpu_tp.sh" "$out/tp" >"$out/tp.log" 2>&1 || status=1
grep -E "tpot_ms_mean" "$out/tp/tp2.sim_vs_real.txt" "$out/tp/ep2.sim_vs_real.txt"
exit $status
