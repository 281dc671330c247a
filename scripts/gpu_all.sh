#!/usr/bin/env bash
# The whole GPU run: build everything, run every test suite (GPU ones included), then run the
# validation experiments on both backends into one results database, so every measured run
# lands beside its simulated twin. Kernel and decode benchmarks: scripts/gpu_kernels.sh and
# scripts/gpu_runtime.sh (they write the results/h200/*.json records).
#   scripts/gpu_all.sh OUT_DIR
# Writes OUT_DIR/{configure,build,tests}.log, OUT_DIR/twinstep.db and, per validation
# experiment, OUT_DIR/<name>.compare.csv (sim beside real) and OUT_DIR/<name>.runs.csv.
# Env: TWINSTEP_CMAKE_ARGS extra configure flags; TWINSTEP_BUILD_DIR (default build).
# SQLite's header where the machine lacks it: scripts/gpu_env.sh (.device-deps).
set -uo pipefail
out=${1:?usage: scripts/gpu_all.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"  # root, SQLite from .device-deps
build=${TWINSTEP_BUILD_DIR:-$root/build}
status=0
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }

step configure
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  ${TWINSTEP_CMAKE_ARGS:-} >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
step build
cmake --build "$build" -j"$(nproc)" >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
step tests
(cd "$build" && ctest -j4 --output-on-failure -E 'distributed|report_cli|cli_end_to_end|reliability') \
  >"$out/tests.log" 2>&1 || status=1
grep -E "tests passed|tests failed" "$out/tests.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"

db="$out/twinstep.db"
for exp in "$root"/experiments/validation/*.yaml; do
  name=$(basename "$exp" .yaml)
  # Multi-GPU (TP2, TP2-EP2): under mpirun (scripts/gpu_tp.sh, EP=1 for the EP one).
  case $name in *_tp[0-9]* | *_ep[0-9]* | *_pp[0-9]*) continue ;; esac
  # Their own scripts: speculative decoding (gpu_spec_validation.sh, minutes and ordered
  # runs) and the MoE model (gpu_moe.sh, 61 GB of weights).
  case $name in *_spec* | *_moe*) continue ;; esac
  step "validation $name"
  "$build/twinstep" --db "$db" run -q --csv "$exp" >"$out/$name.compare.csv" 2>"$out/$name.err" || status=1
  tail -3 "$out/$name.err"
done
"$build/twinstep" --db "$db" query --csv "SELECT r.id, x.name AS experiment, r.variant_index,
  r.variant_label, r.backend, r.status, r.wall_s,
  max(CASE WHEN m.key='tpot_ms_mean' THEN m.value END) AS tpot_ms_mean,
  max(CASE WHEN m.key='ttft_ms_mean' THEN m.value END) AS ttft_ms_mean,
  max(CASE WHEN m.key='gpu_busy_frac' THEN m.value END) AS gpu_busy_frac,
  max(CASE WHEN m.key='idle_host_frac' THEN m.value END) AS idle_host_frac,
  max(CASE WHEN m.key='output_throughput_tok_s' THEN m.value END) AS output_throughput_tok_s
  FROM run r JOIN experiment x ON x.id = r.experiment_id LEFT JOIN metric m ON m.run_id = r.id
  GROUP BY r.id ORDER BY x.name, r.variant_index, r.backend" >"$out/runs.csv"
cat "$out/runs.csv"
exit $status
