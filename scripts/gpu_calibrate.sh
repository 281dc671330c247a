#!/usr/bin/env bash
# Calibrate this GPU and validate the calibrated simulator against the real runtime
# (docs/calibration.md):
#   1. build twinstep and the calibration GPU test;
#   2. the GPU test (calibrate --quick on llama-3.2-3b: profile loads, fitted sim vs its steps);
#   3. twinstep calibrate (full grid) -> OUT/h200-calibrated.yaml, samples in OUT/validation.db;
#   4. every experiments/validation/*.yaml with hardware: h200-calibrated (named NAME-calibrated),
#      sim and real, into OUT/validation.db; compare --sim-vs-real tables.
#   scripts/gpu_calibrate.sh OUT_DIR
# Writes OUT_DIR/{configure,build,calibrate_test,calibrate[,measure]}.log, h200-calibrated.yaml,
# validation.db, <name>.sim_vs_real.txt. Copy the profile to results/profiles/ to commit it.
# Env: TWINSTEP_CMAKE_ARGS extra configure flags; TWINSTEP_BUILD_DIR (default build-calib);
# CALIBRATE_ARGS extra calibrate flags (e.g. --quick); CALIBRATE_MOE=1 also measures
# qwen3-30b-a3b on the narrow grid (contexts 128, 1024; batches 1..16) and validates
# h200_moe.yaml; CALIBRATE_TP=N also measures rank 0's TP-N shards (calibrate --tp N, narrow
# grid) of llama-3-8b (and qwen3-30b-a3b with CALIBRATE_MOE=1); the profile is the fit of every
# session. CALIBRATE_INSTALL=1 copies the profile into results/profiles/ (for gpu_nccl.sh
# TWINSTEP_NCCL_PROFILE=h200-calibrated in the same session). CALIBRATE_VALIDATE="NAME ..."
# validates only those experiments/validation/NAME.yaml (default: all that run on one GPU).
# CALIBRATE_PROFILE=FILE skips steps 2-3 and validates against that profile (e.g. the committed
# results/profiles/h200-calibrated.yaml), with the real runs made here and now.
# CALIBRATE_FROM_DB=FILE (.db, or .db.xz as results/ stores them) starts OUT/validation.db as a copy
# of that calibration database, so the profile is the fit of its sessions and the ones measured
# here (with CALIBRATE_ARGS=--spec-only:
# the committed profile's sessions plus the speculative graphs measured now, ~15 s of GPU for
# llama-3-8b; docs/calibration.md "Speculative graphs"); CALIBRATE_COLLECTIVES_FROM="FILE ..." keeps
# those profiles' collective calibration in the final fit (calibrate --collectives-from, in order).
# CALIBRATE_PREFILL=1 adds a `calibrate --prefill-only` session (llama-3-8b, qwen3-30b-a3b).
# CALIBRATE_MAIN=0 skips the main session (the full grid, or CALIBRATE_ARGS): the sessions of
# CALIBRATE_FROM_DB stand for it and only the extra sessions above are measured.
# CALIBRATE_FUSION="norms,rope norms ..." adds one `calibrate --fusion F` session per word (the
# fused engines' decode grid and speculative graphs of llama-3-8b, labelled llama-3-8b+norms+rope
# etc.; docs/calibration.md "Calibrated fusions").
# CALIBRATE_FIT_SESSIONS=IDS (with CALIBRATE_FROM_DB): the stored sessions the profile is fitted
# from (the committed profile's list, in its header), plus every session measured here;
# CALIBRATE_SPEC_SESSIONS=IDS the same for --spec-sessions. Default: every session of the database.
set -uo pipefail
out=${1:?usage: scripts/gpu_calibrate.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build-calib}
status=0
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }

if [ "${TWINSTEP_PREBUILT:-0}" != 1 ]; then  # gpu_session.sh built everything already
step configure
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  ${TWINSTEP_CMAKE_ARGS:-} >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
step build
cmake --build "$build" -j"$(nproc)" --target twinstep runtime_calibrate_gpu_test \
  >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
fi
gpu_check_commit "$build/twinstep" || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"

db="$out/validation.db"
profile="$out/h200-calibrated.yaml"
if [ -n "${CALIBRATE_FROM_DB:-}" ]; then
  case $CALIBRATE_FROM_DB in  # the stored databases are xz-compressed, but for the latest
    *.xz) xz -dc "$CALIBRATE_FROM_DB" >"$db" || exit 1 ;;
    *) cp "$CALIBRATE_FROM_DB" "$db" || exit 1 ;;
  esac
  echo "calibration sessions of $CALIBRATE_FROM_DB copied into $db"
fi
stored_max=0  # sessions above this id are measured by this call
[ -f "$db" ] && stored_max=$("$build/twinstep" --db "$db" query --csv \
  "SELECT coalesce(max(id), 0) FROM calibration_session" | tail -1 | tr -d '"')
collectives=()
for f in ${CALIBRATE_COLLECTIVES_FROM:-}; do collectives+=(--collectives-from "$f"); done
if [ -n "${CALIBRATE_PROFILE:-}" ]; then
  cp "$CALIBRATE_PROFILE" "$profile" || exit 1
  echo "validating against $CALIBRATE_PROFILE (no calibration)"
else
step "calibrate test (quick)"
"$build/tests/runtime/runtime_calibrate_gpu_test" >"$out/calibrate_test.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |kernel_class|^[a-z_]+ +[0-9]+ |measured .* fitted" \
  "$out/calibrate_test.log"

if [ "${CALIBRATE_MAIN:-1}" = 1 ]; then
  step calibrate
  "$build/twinstep" calibrate --out "$profile" --db "$db" ${CALIBRATE_ARGS:-} \
    >"$out/calibrate.log" 2>&1 || { status=1; tail -30 "$out/calibrate.log"; }
else
  : >"$out/calibrate.log"
fi
narrow="--contexts 128,1024 --batches 1,2,4,8,16"
extra() {  # extra NAME ARGS...: one more calibration session into the same database
  local name=$1
  shift
  step "calibrate $name"
  "$build/twinstep" calibrate --out "$out/$name.yaml" --db "$db" "$@" >"$out/$name.log" 2>&1 ||
    { status=1; tail -5 "$out/$name.log"; }
}
[ "${CALIBRATE_MOE:-0}" = 1 ] && extra moe --models qwen3-30b-a3b $narrow
[ "${CALIBRATE_PREFILL:-0}" = 1 ] && extra prefill --prefill-only --models llama-3-8b,qwen3-30b-a3b
for fusion in ${CALIBRATE_FUSION:-}; do
  extra "fused_${fusion/,/_}" --fusion "$fusion" --models llama-3-8b
done
if [ "${CALIBRATE_TP:-1}" -gt 1 ]; then
  extra tp_dense --models llama-3-8b --tp "$CALIBRATE_TP" $narrow
  [ "${CALIBRATE_MOE:-0}" = 1 ] && extra tp_moe --models qwen3-30b-a3b --tp "$CALIBRATE_TP" $narrow
fi
sessions=$("$build/twinstep" --db "$db" query --csv \
  "SELECT group_concat(id) FROM calibration_session" | tail -1 | tr -d '"')
spec_sessions=()
if [ -n "${CALIBRATE_FIT_SESSIONS:-}" ]; then
  # The given stored sessions and the ones measured in this call (ids above the stored ones').
  new=$("$build/twinstep" --db "$db" query --csv "SELECT group_concat(id) FROM calibration_session \
    WHERE id > $stored_max" | tail -1 | tr -d '"')
  sessions=$CALIBRATE_FIT_SESSIONS${new:+,$new}
  [ -n "${CALIBRATE_SPEC_SESSIONS:-}" ] &&
    spec_sessions=(--spec-sessions "$CALIBRATE_SPEC_SESSIONS${new:+,$new}")
fi
if [ -n "$sessions" ] && [ "$sessions" != 1 ]; then
  step "fit sessions $sessions"
  cp "$out/calibrate.log" "$out/measure.log"  # the measuring session's progress lines
  "$build/twinstep" calibrate --fit-only --sessions "$sessions" ${spec_sessions[@]+"${spec_sessions[@]}"} \
    --out "$profile" --db "$db" ${collectives[@]+"${collectives[@]}"} >"$out/calibrate.log" 2>&1 ||
    { status=1; tail -30 "$out/calibrate.log"; }
fi
cat "$out/calibrate.log" | grep -v "^calibrate: " || true
[ "${CALIBRATE_INSTALL:-0}" = 1 ] && [ -f "$profile" ] && cp "$profile" "$root/results/profiles/"
fi

if [ -f "$profile" ]; then
  export TWINSTEP_PROFILES="$out"
  mkdir -p "$out/experiments"
  for exp in "$root"/experiments/validation/*.yaml; do
    name=$(basename "$exp" .yaml)
    # Multi-GPU (TP2, TP2-EP2): under mpirun (scripts/gpu_tp.sh, EP=1 for the EP one).
    case $name in *_tp[0-9]* | *_ep[0-9]* | *_pp[0-9]*) continue ;; esac
    # Their own scripts: speculative decoding (gpu_spec_validation.sh, minutes and ordered
    # runs) and, unless CALIBRATE_MOE=1, the MoE model (gpu_moe.sh, 61 GB of weights).
    if [ -n "${CALIBRATE_VALIDATE:-}" ]; then
      case " $CALIBRATE_VALIDATE " in *" $name "*) ;; *) continue ;; esac
    fi
    case $name in *_spec*) continue ;; esac
    case $name in *_moe*) [ "${CALIBRATE_MOE:-0}" = 1 ] || continue ;; esac
    cal="$out/experiments/$name-calibrated.yaml"
    sed -e 's/^hardware: h200$/hardware: h200-calibrated/' \
        -e 's/^name: \(.*\)$/name: \1-calibrated/' "$exp" >"$cal"
    grep -q '^hardware: h200-calibrated$' "$cal" || { echo "$exp: no 'hardware: h200' line"; status=1; continue; }
    xname=$(sed -n 's/^name: //p' "$cal")
    step "validation $xname"
    "$build/twinstep" --db "$db" run -q "$cal" >"$out/$name.run.txt" 2>"$out/$name.err" || status=1
    tail -3 "$out/$name.err"
    "$build/twinstep" --db "$db" compare --experiment "$xname" --sim-vs-real \
      --metrics tpot_ms_mean itl_ms_p99 step_ms_mean gpu_busy_frac | tee "$out/$name.sim_vs_real.txt"
  done
fi
exit $status
