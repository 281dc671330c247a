#!/usr/bin/env bash
# The CLI under bad inputs and faults (exact messages, exit codes, nothing written), determinism
# of a rerun, and 20 kill -9 trials. Usage: cli_reliability_test.sh TWINSTEP_BINARY SOURCE_DIR
# Prints "N passed, M failed" and exits non-zero on any failure.
set -uo pipefail
bin=$1
src=$2
work=$(mktemp -d)
chmod 755 "$work"  # the read-only-directory case runs as an unprivileged user
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok: $1"; }
bad() { failed=$((failed + 1)); echo "FAILED: $1"; }
quickstart=$src/experiments/quickstart.yaml

# expect_error WHAT EXPECTED_STDERR CMD...: exit status 1 and exactly that one line on stderr.
expect_error() {
  local what=$1 expected=$2; shift 2
  "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  if [ "$rc" -eq 1 ] && [ "$(cat "$work/err")" = "$expected" ]; then
    ok "$what"
  else
    bad "$what (exit $rc): got '$(cat "$work/err")', expected '$expected'"
  fi
}

# ---- bad inputs and faults ----------------------------------------------------------------------
printf 'this is a text file, not SQLite %.0s' {1..64} >"$work/notes.db"
expect_error "database file that is not SQLite" \
  "twinstep: results database $work/notes.db is not an SQLite database (SQLite: file is not a database); give --db a new file name or an existing twinstep database" \
  "$bin" --db "$work/notes.db" run -q "$quickstart"

# The version this binary writes, read from a database it just created (from an empty file:
# query refuses a database that does not exist).
: >"$work/fresh.db"
current=$("$bin" --db "$work/fresh.db" query --csv "PRAGMA user_version" 2>/dev/null | tail -1)
python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA user_version=99'); c.commit()" "$work/v99.db"
expect_error "database with a newer schema version" \
  "twinstep: results database $work/v99.db has schema version 99, newer than this twinstep supports ($current); use a newer twinstep build" \
  "$bin" --db "$work/v99.db" query "SELECT 1"

mkdir "$work/ro" && chmod 555 "$work/ro"
as_user=()
[ "$(id -u)" = 0 ] && as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)  # root ignores modes
expect_error "read-only directory for the database" \
  "twinstep: cannot open results database $work/ro/r.db: directory $work/ro is not writable (Permission denied)" \
  "${as_user[@]}" "$bin" --db "$work/ro/r.db" run -q "$quickstart"
check_none() { if [ -e "$1" ]; then bad "$2"; else ok "$2"; fi; }
check_none "$work/ro/r.db" "read-only directory: nothing created"

expect_error "database directory missing" \
  "twinstep: cannot open results database $work/nodir/r.db: directory $work/nodir does not exist (create it first)" \
  "$bin" --db "$work/nodir/r.db" run -q "$quickstart"

mkdir "$work/exp.yaml"
expect_error "YAML path that is a directory" \
  "twinstep: $work/exp.yaml: cannot read experiment file '$work/exp.yaml': it is a directory" \
  "$bin" --db "$work/a.db" run -q "$work/exp.yaml"

: >"$work/empty.yaml"
expect_error "empty YAML file" \
  "twinstep: $work/empty.yaml:1:1: the experiment is empty (no YAML content)" \
  "$bin" --db "$work/a.db" run -q "$work/empty.yaml"

cat >"$work/huge.yaml" <<'YAML'
name: huge
model: llama-3-8b
hardware: h200
workload: {input_len: 8, output_len: 8, requests: 99999999999999999999}
YAML
expect_error "huge YAML integer" \
  "twinstep: $work/huge.yaml:4:51: workload.requests = 99999999999999999999 is out of range (1 to 10000000)" \
  "$bin" --db "$work/a.db" run -q "$work/huge.yaml"

python3 - "$work/sweep.yaml" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write("name: big\nmodel: llama-3-8b\nhardware: h200\n"
            "workload: {input_len: 8, output_len: 8, requests: 1}\nsweep:\n")
    f.write("  seed: [%s]\n" % ", ".join(str(i) for i in range(1000)))
    f.write("  workload.requests: [%s]\n" % ", ".join(str(i) for i in range(1, 1002)))
PY
expect_error "sweep over a million variants" \
  "twinstep: $work/sweep.yaml:5:1: sweep expands to 1001000 variants (1000 x 1001), over the limit of 1000000" \
  "$bin" --db "$work/a.db" run -q "$work/sweep.yaml"
check_none "$work/a.db" "rejected experiments created no database"

# ---- determinism: the same experiment and seed give the same database ---------------------------
"$bin" --db "$work/d1.db" run -q "$quickstart" >/dev/null 2>&1
"$bin" --db "$work/d2.db" run -q "$quickstart" >/dev/null 2>&1
dump() {  # every table, every column except wall-clock ones, rows sorted
  python3 - "$1" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
time_columns = {"started_at", "ended_at", "wall_s", "created_at", "owner"}  # owner: the pid
for (table,) in c.execute("SELECT name FROM sqlite_schema WHERE type='table' ORDER BY name"):
    cols = [r[1] for r in c.execute(f"PRAGMA table_info({table})") if r[1] not in time_columns]
    rows = c.execute(f"SELECT {', '.join(cols)} FROM {table}").fetchall()
    print(table, len(rows))
    for row in sorted(rows, key=repr):
        print(repr(row))
PY
}
dump "$work/d1.db" >"$work/d1.txt"
dump "$work/d2.db" >"$work/d2.txt"
if cmp -s "$work/d1.txt" "$work/d2.txt" && [ "$(grep -c . "$work/d1.txt")" -gt 20000 ]; then
  ok "quickstart twice: identical databases except time columns ($(wc -l <"$work/d1.txt") rows)"
else
  bad "quickstart twice: databases differ: $(diff "$work/d1.txt" "$work/d2.txt" | head -5)"
fi

# ---- a run in progress in another process -------------------------------------------------------
# Process A is stopped (SIGSTOP) while its first run is 'running' and A holds no write lock (it
# simulates between begin_run and finish_run; stopped inside finish_run's transaction it would
# keep every writer out, which is the "locked" error, not this case); B opens the same database
# with --resume: B must leave A's run alone (no "never completed" note, not marked interrupted, its
# variant not started), run the rest, and A must then finish normally.
cat >"$work/slow.yaml" <<'YAML'
name: live_runs
model: llama-3-8b
hardware: h200
workload: {input_len: 1024, output_len: 1024, requests: 1000, concurrency: 1}
sweep:
  seed: [1, 2]
YAML
live_db=$work/live.db
"$bin" --db "$live_db" run -q "$work/slow.yaml" >"$work/a.out" 2>"$work/a.err" &
a_pid=$!
# Stops A once its run is 'running' and no write lock is held, checked again after the stop (A
# may have begun its write in between; then it is continued and the watch goes on). Prints the id.
running=$(python3 - "$live_db" "$a_pid" <<'PY' 2>/dev/null
import os, signal, sqlite3, sys, time
path, pid = sys.argv[1], int(sys.argv[2])
def running_unlocked():
    c = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        r = c.execute("SELECT id FROM run WHERE status='running'").fetchall()
        if not r:
            return None
        c.execute("BEGIN IMMEDIATE")  # 'database is locked' while A is mid-write
        c.execute("ROLLBACK")
        return r[0][0]
    except sqlite3.OperationalError:
        return None
    finally:
        c.close()
deadline = time.time() + 120
while time.time() < deadline:
    if running_unlocked() is not None:
        os.kill(pid, signal.SIGSTOP)
        run_id = running_unlocked()
        if run_id is not None:
            print(run_id)
            break
        os.kill(pid, signal.SIGCONT)
    time.sleep(0.005)
PY
)
"$bin" --db "$live_db" run -q --resume "$work/slow.yaml" >"$work/b.out" 2>"$work/b.err"
b_rc=$?
a_status=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT status FROM run WHERE id=?', (int(sys.argv[2]),)).fetchone()[0])" "$live_db" "${running:-0}" 2>&1)
kill -CONT "$a_pid"
wait "$a_pid"
a_rc=$?
if [ -z "$running" ]; then
  bad "live run: process A never had a run 'running'"
elif [ "$b_rc" = 0 ] && [ "$a_rc" = 0 ] && [ "$a_status" = running ] &&
  grep -q "run $running (seed=[12] \[sim\]) is in progress in another process; not started here" "$work/b.err" &&
  ! grep -q "never completed" "$work/b.err"; then
  ok "a run in progress in another process: --resume left it alone, both processes exit 0"
else
  bad "live run: A exit $a_rc, B exit $b_rc, A's run $running '$a_status' while A was stopped; B: $(tr '\n' ' ' <"$work/b.err")"
fi

# ---- kill -9 trials -----------------------------------------------------------------------------
if bash "$src/scripts/kill_trials.sh" -n "${TWINSTEP_KILL_TRIALS:-20}" -b "$bin" -s 20 >"$work/kill.log" 2>&1; then
  ok "$(tail -1 "$work/kill.log")"
else
  bad "kill trials: $(tail -5 "$work/kill.log")"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
