#!/usr/bin/env bash
# Crash-safety trials: start `twinstep run` on a sweep, SIGKILL it after a random delay, and check
# the results database. Usage:
#   scripts/kill_trials.sh [-n TRIALS] [-b TWINSTEP] [-s SEED] [-k]
#     -n  trials (default 100)            -b  binary (default build/twinstep)
#     -s  seed for the random delays      -k  keep the work directory
# Every trial kills one run of a 6-variant sweep at a uniformly random point of its expected
# duration (measured once up front), and all trials write into ONE database, so later trials
# also open a database whose previous writer was killed (WAL recovery, stale 'running' rows).
# After each kill:
#   - PRAGMA integrity_check is "ok" and PRAGMA foreign_key_check is empty;
#   - the schema is all there or not at all (a kill before the first run's schema transaction
#     leaves an empty database);
#   - every run is either 'complete' with its metrics, all its request samples (one per
#     request), its chunk samples (one token each: output_len per request) and its step
#     samples, or not complete with no samples and no metrics at all.
# When `twinstep run --help` lists --resume, the trial then reruns with --resume and checks that
# every (variant, backend) of the experiment has exactly one complete run, and that the rerun
# did not redo any run that was already complete, and that the metrics equal those of an
# uninterrupted run of the same sweep. Without --resume only the checks above run.
# Prints one line per trial and a summary; exits 1 on the first failed check (the database is
# kept and its path printed).
set -uo pipefail
trials=100
bin=build/twinstep
seed=$$
keep=0
while getopts "n:b:s:k" opt; do
  case $opt in
    n) trials=$OPTARG ;;
    b) bin=$OPTARG ;;
    s) seed=$OPTARG ;;
    k) keep=1 ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "kill_trials: no twinstep binary at $bin (build first or pass -b)"; exit 2; }
RANDOM=$seed
work=$(mktemp -d "${TMPDIR:-/tmp}/twinstep_kill.XXXXXX")
[ "$keep" = 1 ] || trap 'rm -rf "$work"' EXIT
db=$work/trials.db
requests=100
output_len=512
cat >"$work/sweep.yaml" <<YAML
name: kill_trials
model: llama-3-8b
hardware: h200
workload: {input_len: 1024, output_len: $output_len, requests: $requests, concurrency: 1}
trace: {first_step: 10, steps: 4}
sweep:
  seed: [1, 2, 3, 4, 5, 6]
YAML
variants=6
resume=0
"$bin" run --help 2>/dev/null | grep -q -- '--resume' && resume=1

# Expected duration of one full, uninterrupted run (also the reference of a clean database).
t0=$(date +%s%N)
"$bin" --db "$work/reference.db" run -q "$work/sweep.yaml" >/dev/null 2>&1 || {
  echo "kill_trials: the uninterrupted reference run failed"; exit 1; }
full_ms=$(( ($(date +%s%N) - t0) / 1000000 ))

check_db() {  # check_db DB -> prints "complete incomplete", exits non-zero with a reason
  python3 - "$1" "$requests" "$output_len" <<'PY'
import sqlite3, sys
db, requests, output_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = sqlite3.connect(db)
def one(sql, *a): return c.execute(sql, a).fetchone()[0]
bad = []
ic = c.execute("PRAGMA integrity_check").fetchall()
if ic != [("ok",)]: bad.append(f"integrity_check: {ic}")
fk = c.execute("PRAGMA foreign_key_check").fetchall()
if fk: bad.append(f"foreign_key_check: {fk[:5]}")
complete = incomplete = 0
tables = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
if "run" not in tables and tables:  # a schema half there: never (it is one transaction)
    bad.append(f"tables without the run table: {tables}")
# No tables at all: the first trial was killed before its schema transaction committed (an empty
# database, zero runs).
runs = c.execute("SELECT id, status FROM run ORDER BY id").fetchall() if "run" in tables else []
for run_id, status in runs:
    n = {t: one(f"SELECT count(*) FROM {t} WHERE run_id=?", run_id)
         for t in ("metric", "request_sample", "chunk_sample", "step_sample", "timeline_span")}
    if status == "complete":
        complete += 1
        tokens = one("SELECT coalesce(sum(tokens), 0) FROM chunk_sample WHERE run_id=?", run_id)
        if n["metric"] < 10 or n["request_sample"] != requests or tokens != requests * output_len \
                or n["step_sample"] == 0 or n["timeline_span"] == 0:
            bad.append(f"run {run_id} complete but partial: {n}, tokens {tokens}")
    else:
        incomplete += 1
        if any(n.values()):
            bad.append(f"run {run_id} is {status} but has rows: {n}")
print(complete, incomplete)
if bad:
    print("\n".join(bad), file=sys.stderr)
    sys.exit(1)
PY
}

killed_mid=0
incomplete=0
run_flags=(-q)
[ "$resume" = 1 ] && run_flags+=(--resume)
for ((i = 1; i <= trials; i++)); do
  delay_ms=$(( (RANDOM * 32768 + RANDOM) % (full_ms + 1) ))
  # A new description makes a new experiment version (YAML hash) per trial, so --resume has
  # work left in every trial.
  { echo "description: kill trial $i"; cat "$work/sweep.yaml"; } >"$work/trial.yaml"
  incomplete_before=$incomplete
  "$bin" --db "$db" run "${run_flags[@]}" "$work/trial.yaml" >/dev/null 2>&1 &
  pid=$!
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  if kill -9 "$pid" 2>/dev/null; then outcome=killed; else outcome=finished; fi
  wait "$pid" 2>/dev/null
  if ! counts=$(check_db "$db" 2>"$work/why"); then
    echo "trial $i (kill after ${delay_ms} ms): FAILED"; cat "$work/why"
    echo "database kept: $db"; trap - EXIT; exit 1
  fi
  read -r complete incomplete <<<"$counts"
  [ "$incomplete" -gt "$incomplete_before" ] && killed_mid=$((killed_mid + 1))
  line="trial $i: $outcome after ${delay_ms} ms; runs: $complete complete, $incomplete incomplete"
  if [ "$resume" = 1 ]; then
    "$bin" --db "$db" run -q --resume "$work/trial.yaml" >/dev/null 2>"$work/resume.err" || {
      echo "$line; --resume FAILED:"; cat "$work/resume.err"; echo "database kept: $db"
      trap - EXIT; exit 1; }
    per_variant=$(python3 -c "
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
rows = c.execute(\"SELECT variant_index, backend, count(*) FROM run r JOIN experiment e ON e.id = r.experiment_id WHERE e.id = (SELECT max(id) FROM experiment) AND r.status = 'complete' GROUP BY 1, 2\").fetchall()
print(len(rows), max((n for _, _, n in rows), default=0))" "$db")
    read -r pairs max_dup <<<"$per_variant"
    if [ "$pairs" != "$variants" ] || [ "$max_dup" != 1 ]; then
      echo "$line; after --resume: $pairs of $variants variants complete, max $max_dup complete runs per variant: FAILED"
      trap - EXIT; exit 1
    fi
    # Deterministic runs: the resumed experiment's metrics equal the uninterrupted reference's.
    same=$(python3 -c "
import sqlite3, sys
sel = 'SELECT r.variant_index, m.key, m.value FROM metric m JOIN run r ON r.id = m.run_id WHERE r.status = \'complete\' AND r.experiment_id = (SELECT max(id) FROM experiment) ORDER BY 1, 2'
a = sqlite3.connect(sys.argv[1]).execute(sel).fetchall()
b = sqlite3.connect(sys.argv[2]).execute(sel).fetchall()
print(int(a == b and len(a) > 0))" "$db" "$work/reference.db")
    if [ "$same" != 1 ]; then
      echo "$line; after --resume the metrics differ from an uninterrupted run: FAILED"
      trap - EXIT; exit 1
    fi
    line="$line; --resume completed the sweep without redoing a complete run, metrics as uninterrupted"
  fi
  echo "$line"
done
echo "kill_trials: $trials trials, $killed_mid left a run incomplete (killed mid-run), full run ${full_ms} ms;" \
     "integrity and all-or-nothing runs held in every trial$([ "$resume" = 1 ] && echo "; --resume checked" || echo "; --resume not available: integrity only")"
