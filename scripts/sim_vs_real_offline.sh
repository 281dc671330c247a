#!/usr/bin/env bash
# Sim-vs-real without a GPU (docs/calibration.md, "Sim vs real, offline"): copies a database that
# holds measured runs of the validation experiments, re-runs only their simulated side with the
# profiles in PROFILE_DIR (the real backend is skipped where no GPU is present; the experiment
# YAML text, hence its hash, is the stored one, so the new simulated runs pair with the stored
# real ones), and writes `compare --sim-vs-real` per experiment as CSV, each block after a line
# "experiment,NAME".
#   [METRICS='ttft_ms_mean tpot_ms_mean'] scripts/sim_vs_real_offline.sh SESSION_DB[.xz] PROFILE_DIR \
#     OUT_PREFIX [TWINSTEP]
# writes OUT_PREFIX.db and OUT_PREFIX.csv (METRICS: the compared metrics, default mean TPOT, p99
# ITL and GPU busy fraction). YAML_DIR=DIR: an experiment whose name is that of a file in DIR
# (e.g. experiments/validation, its `name:` line) is simulated from that file as it is now
# instead of the stored text (a simulator setting changed since the runs), and compared run by
# run: the stored measured runs against the newest simulated run of each variant.
set -euo pipefail
db=$1 profiles=$2 out=$3 twinstep=${4:-build/twinstep}
read -r -a metrics <<< "${METRICS:-tpot_ms_mean itl_ms_p99 gpu_busy_frac}"
case $db in  # stored results databases are xz-compressed (results/h200/*.db.xz)
  *.xz) xz -dc "$db" >"$out.db" ;;
  *) cp "$db" "$out.db" ;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The experiments with both a measured and a simulated run (a real-only one, such as the
# speculative acceptance calibration, stays in the copy for the others to read).
names=$(sqlite3 "$out.db" "SELECT DISTINCT e.name FROM experiment e JOIN run r ON r.experiment_id = e.id WHERE r.backend = 'real' AND EXISTS (SELECT 1 FROM run s JOIN experiment f ON f.id = s.experiment_id WHERE f.name = e.name AND s.backend = 'sim') ORDER BY e.id")
current_yaml() {  # the file of YAML_DIR whose name: is $1, if any
  [ -n "${YAML_DIR:-}" ] || return 0
  grep -l "^name: $1\$" "$YAML_DIR"/*.yaml 2>/dev/null | head -1
}
for name in $names; do
  file=$(current_yaml "$name")
  if [ -z "$file" ]; then
    # The stored YAML text, byte for byte (sqlite3's output adds one newline; strip it back).
    sqlite3 "$out.db" "SELECT yaml_text FROM experiment WHERE name = '$name' ORDER BY id DESC LIMIT 1" |
      head -c -1 > "$tmp/$name.yaml"
    file=$tmp/$name.yaml
  fi
  TWINSTEP_PROFILES=$profiles "$twinstep" --db "$out.db" run -q "$file" > /dev/null
done
for name in $names; do
  echo "experiment,$name"
  if [ -n "$(current_yaml "$name")" ]; then
    ids=$(sqlite3 "$out.db" "SELECT max(r.id) FROM run r JOIN experiment e ON e.id = r.experiment_id
      WHERE e.name = '$name' AND r.backend = 'sim' AND r.status = 'complete' GROUP BY r.variant_label
      UNION ALL SELECT max(r.id) FROM run r JOIN experiment e ON e.id = r.experiment_id
      WHERE e.name = '$name' AND r.backend = 'real' AND r.status = 'complete' GROUP BY r.variant_label")
    # shellcheck disable=SC2086
    "$twinstep" --db "$out.db" compare --sim-vs-real --metrics "${metrics[@]}" --csv $ids
  else
    "$twinstep" --db "$out.db" compare --experiment "$name" --sim-vs-real \
      --metrics "${metrics[@]}" --csv
  fi
done > "$out.csv"
echo "wrote $out.csv ($(grep -c "${metrics[0]}" "$out.csv") variants)"
