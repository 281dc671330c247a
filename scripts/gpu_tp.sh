#!/usr/bin/env bash
# Tensor parallelism on two GPUs (runtime/tensor_parallel.h, issues 7 and 11): build, run the TP
# test suite as one process (slicing, the tp = 1 path) and under mpirun with one rank per GPU
# (ranks agree; Llama-3-8B TP2 vs TP1 over 256 tokens; tiny TP2 vs the CPU reference), then the
# validation experiment experiments/validation/h200_tp2.yaml on both backends into OUT/tp2.db
# and `twinstep compare --sim-vs-real` of it. With EP=1, also expert parallelism of the MoE model
# (TP2-EP2): the ExpertParallel tests in both test runs (tp = 1 path == plain MoE engine; tiny
# MoE TP2-EP2 vs the CPU reference; Qwen3-30B-A3B TP2-EP2 vs one GPU) and
# experiments/validation/h200_ep2.yaml into OUT/ep2.db (about 31 GB of weights per rank). With
# PP=1, also pipeline parallelism (runtime/pipeline_parallel.h): the PipelineParallel tests (a
# one-stage pipeline == the plain engine; tiny dense and MoE PP2 and Llama-3-8B PP2 identical to
# one GPU) and experiments/validation/h200_pp2.yaml into OUT/pp2.db.
#   scripts/gpu_tp.sh OUT_DIR            EP=1 scripts/gpu_tp.sh OUT_DIR     PP=1 scripts/gpu_tp.sh OUT_DIR
# Writes OUT_DIR/{configure,build,tp_test_1rank,tp_test_2ranks,tp2_run}.log, OUT_DIR/tp2.db,
# OUT_DIR/tp2.sim_vs_real.txt, OUT_DIR/tp2.ops.txt (traced steps per operation),
# OUT_DIR/tp2.collectives.txt (collective waits per rank, traced steps), OUT_DIR/tp2.metrics.csv;
# with EP=1 the same ep2_run.log, ep2.db, ep2.ops.txt,
# ep2.sim_vs_real.txt, ep2.routing.txt (the moe_* routing metrics, sim vs real), ep2.metrics.csv; with PP=1 pp2_run.log, pp2.db, pp2.ops.txt,
# pp2.sim_vs_real.txt, pp2.metrics.csv; with SPEC=1 experiments/validation/
# h200_tp2_spec_calibration.yaml then h200_tp2_spec.yaml into OUT/tp2spec.db,
# tp2spec_calibration.log, tp2spec.sim_vs_real.txt, tp2spec.accept.txt; with MOE_SPEC=1 the same
# of h200_ep2_spec_calibration.yaml and h200_ep2_spec.yaml (the MoE model's draft at TP2-EP2) as
# ep2spec.*; with EP_GRAPHS=1 h200_ep2_graphs.yaml (TP2-EP2 batch 1, PDL against plain graphs)
# as ep2graphs.*.
# Env: TWINSTEP_CMAKE_ARGS extra configure flags; TWINSTEP_BUILD_DIR (default build); NP (2);
# EP (0: TP2 only, the ExpertParallel tests filtered out; 1: also TP2-EP2); PP (0: the
# PipelineParallel tests filtered out; 1: also PP2); TP_TESTS (1; 0: the validation runs only,
# no test suites: the two-rank suites take several minutes; ranks: only the NP-rank run, e.g. NP=4
# for the four-rank tests, every other case skipping there); TP_FILTER a gtest filter for both
# test runs (overrides EP / PP's); TP2_RUN (1; 0: no TP2 validation run,
# for EP=1 or PP=1 alone).
set -uo pipefail
out=${1:?usage: scripts/gpu_tp.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
np=${NP:-2}
ep=${EP:-0}
pp=${PP:-0}
status=0
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }
# NVLink multicast stays off (the lent machines' rule; runtime/comm.cc defaults it off too).
export NCCL_NVLS_ENABLE=0
mpi="mpirun --allow-run-as-root -np $np -x NCCL_NVLS_ENABLE"
skip=""
[ "$ep" = 1 ] || skip="ExpertParallel.*"
[ "$pp" = 1 ] || skip="${skip:+$skip:}PipelineParallel.*"
filter="--gtest_filter=${skip:+-$skip}"
[ -z "$skip" ] && filter="--gtest_filter=*"
[ -n "${TP_FILTER:-}" ] && filter="--gtest_filter=$TP_FILTER"

step configure
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  ${TWINSTEP_CMAKE_ARGS:-} >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
grep -E "MPI|NCCL" "$out/configure.log"
step build
cmake --build "$build" -j16 --target twinstep runtime_tp_gpu_test >"$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$out/gpu.txt"

if [ "${TP_TESTS:-1}" != 0 ]; then
  if [ "${TP_TESTS:-1}" != ranks ]; then
    step "tp tests, one process"
    timeout 600 "$build/tests/runtime/runtime_tp_gpu_test" "$filter" >"$out/tp_test_1rank.log" 2>&1 ||
      status=1
    grep -E "OK \]|FAILED|SKIPPED|PASSED" "$out/tp_test_1rank.log"
  fi

  step "tp tests, $np ranks"
  timeout 900 $mpi "$build/tests/runtime/runtime_tp_gpu_test" "$filter" \
    >"$out/tp_test_2ranks.log" 2>&1 || status=1
  grep -E "TP2|TP4|tiny TP2|tiny MoE|PP2|OK \]|FAILED \]|SKIPPED \]|diverge|ranks sampled|stages committed" \
    "$out/tp_test_2ranks.log"
fi

# validate TAG YAML: the experiment on both backends under mpirun into OUT/TAG.db, then the
# simulated-vs-measured comparison and the per-rank / all-reduce metrics.
validate() {
  local tag=$1 exp=$2 xname db
  step "validation $(basename "$exp" .yaml) ($np ranks)"
  db="$out/$tag.db"
  rm -f "$db"
  # The speculative runs' simulated twins replay measured verify rounds (acceptance.calibrated):
  # those of <exp>_calibration.yaml (a chain at the same layout, real only), run first.
  local spec=0
  [[ $tag == *spec ]] && spec=1
  if [ $spec = 1 ]; then
    timeout 600 $mpi "$build/twinstep" --db "$db" run -q "${exp%.yaml}_calibration.yaml" \
      >"$out/${tag}_calibration.log" 2>&1 || status=1
    tail -4 "$out/${tag}_calibration.log"
  fi
  xname=$(sed -n 's/^name: //p' "$exp")
  # TP_HARDWARE=NAME (with TP_PROFILES=DIR holding NAME.yaml): simulate with that profile instead.
  if [ -n "${TP_HARDWARE:-}" ]; then
    [ -n "${TP_PROFILES:-}" ] && export TWINSTEP_PROFILES="$TP_PROFILES"
    xname="$xname-$TP_HARDWARE"
    sed -e "s/^hardware: h200$/hardware: $TP_HARDWARE/" -e "s/^name: .*$/name: $xname/" "$exp" \
      >"$out/$(basename "$exp" .yaml)-$TP_HARDWARE.yaml"
    exp="$out/$(basename "$exp" .yaml)-$TP_HARDWARE.yaml"
  fi
  timeout 900 $mpi "$build/twinstep" --db "$db" run -q "$exp" >"$out/${tag}_run.log" 2>&1 ||
    status=1
  tail -8 "$out/${tag}_run.log"
  "$build/twinstep" --db "$db" compare --experiment "$xname" --sim-vs-real \
    --metrics tpot_ms_mean step_ms_mean ttft_ms_mean gpu_busy_frac output_throughput_tok_s |
    tee "$out/$tag.sim_vs_real.txt" || status=1
  # MoE routing of the traced steps, simulated draws against the real router (issue #11; rows
  # only where both backends recorded it: EP with sampled routing in the simulator; the dense
  # experiments, TP2 and PP2, have none, and compare refuses to print an empty table).
  if [ $spec = 1 ]; then
    "$build/twinstep" --db "$db" compare --experiment "$xname" --accept |
      tee "$out/$tag.accept.txt" || status=1
  elif [[ $tag == ep2* ]]; then
    "$build/twinstep" --db "$db" compare --experiment "$xname" --sim-vs-real \
      --metrics moe_routing_passes moe_rank_experts_mean moe_rank_experts_max_mean \
      moe_expert_share_max | tee "$out/$tag.routing.txt" || status=1
  fi
  # The traced steps (the YAML's trace), operation by operation: measured against simulated.
  "$build/twinstep" --db "$db" compare --experiment "$xname" --ops >"$out/$tag.ops.txt" 2>&1 ||
    [ $spec = 1 ] || status=1  # (no traced steps in the speculative experiments)
  head -40 "$out/$tag.ops.txt"
  # Collective waits per rank over the traced steps, measured against simulated (one estimate
  # on both sides: a span less the group's shortest span of the instance).
  "$build/twinstep" --db "$db" compare --experiment "$xname" --collectives \
    >"$out/$tag.collectives.txt" 2>&1 || [ "$tag" = pp2 ] || [ $spec = 1 ] || status=1
  cat "$out/$tag.collectives.txt"
  "$build/twinstep" --db "$db" query --csv "SELECT r.id, r.variant_label, r.backend, r.status,
    m.key, m.value, m.unit FROM run r JOIN metric m ON m.run_id = r.id
    WHERE m.key LIKE 'rank%' OR m.key LIKE 'tp_%' OR m.key LIKE 'moe_%' OR m.key IN ('tpot_ms_mean', 'gpu_busy_frac',
    'idle_host_frac', 'idle_launch_frac') ORDER BY r.id, m.key" | tee "$out/$tag.metrics.csv"
}
[ "${TP2_RUN:-1}" = 1 ] && validate tp2 "$root/experiments/validation/h200_tp2.yaml"
[ "$ep" = 1 ] && validate ep2 "$root/experiments/validation/h200_ep2.yaml"
[ "$pp" = 1 ] && validate pp2 "$root/experiments/validation/h200_pp2.yaml"
[ "${SPEC:-0}" = 1 ] && validate tp2spec "$root/experiments/validation/h200_tp2_spec.yaml"
[ "${MOE_SPEC:-0}" = 1 ] && validate ep2spec "$root/experiments/validation/h200_ep2_spec.yaml"
[ "${EP_GRAPHS:-0}" = 1 ] && validate ep2graphs "$root/experiments/validation/h200_ep2_graphs.yaml"
if [ "${TP4_SPEC:-0}" = 1 ]; then  # issue 8: needs NP=4 and four GPUs
  validate tp4spec "$root/experiments/validation/h200_tp4_spec.yaml"
  # One traced step of each case on every rank, measured and simulated, as trace JSON.
  for id in $("$build/twinstep" --db "$out/tp4spec.db" query --csv "SELECT r.id FROM run r JOIN
      experiment e ON e.id = r.experiment_id WHERE e.name LIKE 'validation-h200-tp4-spec%'" | tail -n +2); do
    "$build/twinstep" --db "$out/tp4spec.db" trace "$id" -o "$out/tp4spec_run$id.trace.json" || status=1
  done
fi
exit $status
