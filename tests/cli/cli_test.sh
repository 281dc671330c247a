#!/usr/bin/env bash
# End-to-end checks of the twinstep CLI. Usage: cli_test.sh TWINSTEP_BINARY SOURCE_DIR
# Prints "N passed, M failed" and exits non-zero on any failure.
set -uo pipefail
bin=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok: $1"; }
bad() { failed=$((failed + 1)); echo "FAILED: $1"; }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
q() { "$bin" --db "$1" query --csv "$2" 2>/dev/null | tail -n +2; }

# validate runs nothing and lists the sweep.
out=$("$bin" validate "$src/experiments/quickstart.yaml")
check "validate lists 4 variants" grep -q "4 variant(s)" <<<"$out"
check "--version names the build's commit" grep -qE '^twinstep [0-9.]+ \(commit [0-9a-f]{7,}(-dirty)?; ' <("$bin" --version)
# scripts/gpu_env.sh's gpu_check_commit (the GPU scripts' guard against a build labelled with
# another commit): a binary built as abc1234 passes for abc1234 only, a dirty build of it never;
# this build is refused for a commit it is not.
fake=$work/fake_twinstep
printf '#!/bin/sh\necho "twinstep 0.1.0 (commit abc1234; GNU 12; CUDA 13.0; NCCL 2.28)"\n' >"$fake"
chmod +x "$fake"
commit_ok() {  # COMMIT BINARY: gpu_check_commit's verdict (the helper sourced as the scripts do)
  (source "$src/scripts/gpu_commit.sh" && TWINSTEP_COMMIT=$1 gpu_check_commit "$2") >/dev/null
}
not() { ! "$@"; }
check "gpu_check_commit accepts the commit a binary was built as" commit_ok abc1234 "$fake"
check "gpu_check_commit refuses another" not commit_ok abc1235 "$fake"
sed -i 's/abc1234;/abc1234-dirty;/' "$fake"
check "gpu_check_commit refuses a dirty build" not commit_ok abc1234 "$fake"
check "gpu_check_commit refuses this build for another commit" not commit_ok 0000000 "$bin"
# cuBLAS is loaded by the real backend when it runs (runtime/cublas_loader.h), never at start-up:
# linked, its initialisers cost every command ~0.5 s and ~200 MB.
if command -v ldd >/dev/null; then
  check "twinstep does not link cuBLAS" not grep -q libcublas <(ldd "$bin")
fi
# Every experiment the repository ships validates (models, hardware names, sweeps, policies).
bad_exp=""
while IFS= read -r f; do
  "$bin" validate "$f" >/dev/null 2>"$work/validate.err" || bad_exp="$bad_exp $f: $(head -1 "$work/validate.err")"
done < <(find "$src/experiments" -name '*.yaml' | sort)
check "every shipped experiment validates${bad_exp:+ (not:$bad_exp)}" test -z "$bad_exp"

# run: 4 complete runs with metrics, a comparison table on stdout.
db=$work/a.db
"$bin" --db "$db" run -q "$src/experiments/quickstart.yaml" >"$work/run.out" 2>"$work/run.err"
check "run exits 0" test $? -eq 0
check "run prints the comparison" grep -q "tpot_ms_mean" "$work/run.out"
check "4 complete runs" test "$(q "$db" "SELECT count(*) FROM run WHERE status='complete'")" = 4
check "every run has metrics" test "$(q "$db" "SELECT count(DISTINCT run_id) FROM metric WHERE key='tpot_ms_mean'")" = 4
check "step samples stored" test "$(q "$db" "SELECT count(*) > 20000 FROM step_sample")" = 1
# --db after the subcommand names the same database as before it.
"$bin" validate "$src/experiments/quickstart.yaml" --db "$work/none.db" >/dev/null 2>&1
check "--db after a subcommand is accepted" test $? -eq 0
check "--db after the subcommand reads that database" \
  test "$("$bin" query --csv "SELECT count(*) FROM run WHERE status='complete'" --db "$db" 2>/dev/null | tail -n +2)" = 4
check "--db after the subcommand, a missing file is refused by name" \
  grep -q "results database $work/missing.db does not exist" \
  <("$bin" query "SELECT 1" --db "$work/missing.db" 2>&1)
check "validate writes no database" test ! -e "$work/none.db"

# The seed's finding: lockstep pays the host loop, run-ahead hides it, the host pin brings back
# the 485 us prepare.
tpot() { q "$db" "SELECT m.value FROM metric m JOIN run r ON r.id=m.run_id WHERE m.key='tpot_ms_mean' AND r.variant_index=$1"; }
lock=$(tpot 0); ahead=$(tpot 2); pinned=$(tpot 3)
check "run-ahead beats lockstep by the host loop (~0.9 ms)" python3 -c "import sys; d=$lock-$ahead; sys.exit(0 if 0.7<d<1.1 else 1)"
check "host pin costs ~485 us per step" python3 -c "import sys; d=$pinned-$ahead; sys.exit(0 if 0.40<d<0.57 else 1)"

# Same YAML, same seed: byte-identical metrics.
db2=$work/b.db
"$bin" --db "$db2" run -q "$src/experiments/quickstart.yaml" >/dev/null 2>&1
sel="SELECT r.variant_index, m.key, m.value FROM metric m JOIN run r ON r.id=m.run_id ORDER BY 1, 2"
check "rerun gives identical metrics" test "$(q "$db" "$sel")" = "$(q "$db2" "$sel")"

# query formats.
check "query --json is JSON" bash -c "'$bin' --db '$db' query --json 'SELECT id, status FROM run' | python3 -m json.tool >/dev/null"
check "query rejects writes" bash -c "! '$bin' --db '$db' query 'DELETE FROM run' 2>/dev/null"

# trace: Chrome trace JSON with complete events on host and stream lanes, and flow arrows.
"$bin" --db "$db" trace 3 -o "$work/trace.json" 2>/dev/null
check "trace is Chrome trace JSON" python3 - "$work/trace.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"]
lanes = {e["tid"] for e in ev if e.get("ph") == "X"}
flows = [e for e in ev if e.get("ph") in ("s", "f")]
names = {e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
sys.exit(0 if lanes >= {0, 1, 2} and flows and "host" in names else 1)
PY

# Bad input: a clear error with file:line:column, and the database untouched.
before=$(sha256sum "$db" | cut -d' ' -f1)
n_bad=0
for f in "$src"/tests/experiments/bad/*.yaml; do
  [ -e "$f" ] || continue
  n_bad=$((n_bad + 1))
  if "$bin" --db "$db" run -q "$f" >/dev/null 2>"$work/err"; then
    bad "bad input accepted: $f"
  elif ! grep -qE "$(basename "$f"):[0-9]+:[0-9]+: |cannot read|empty" "$work/err"; then
    bad "error without location for $f: $(cat "$work/err")"
  fi
done
check "at least 15 bad inputs rejected with a location" test "$n_bad" -ge 15
check "bad inputs left the database untouched" test "$(sha256sum "$db" | cut -d' ' -f1)" = "$before"
check "bad input creates no database" bash -c "! '$bin' --db '$work/none.db' run '$src/tests/experiments/bad/$(ls "$src/tests/experiments/bad" | head -1)' 2>/dev/null; test ! -e '$work/none.db'"

# kill -9 in the middle of a sweep: the database stays consistent; every run is complete or
# reported as incomplete, and incomplete runs hold no samples.
cat >"$work/long.yaml" <<'YAML'
name: long
model: llama-3-8b
hardware: h200
workload: {input_len: 1024, output_len: 1024, requests: 300, concurrency: 1}
sweep:
  seed: [1, 2, 3, 4, 5, 6, 7, 8]
YAML
db3=$work/c.db
"$bin" --db "$db3" run -q "$work/long.yaml" >/dev/null 2>&1 &
pid=$!
sleep 1.5
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
check "integrity after kill -9" test "$(q "$db3" "PRAGMA integrity_check")" = ok
check "no samples for incomplete runs" test "$(q "$db3" "SELECT count(*) FROM step_sample s JOIN run r ON r.id=s.run_id WHERE r.status!='complete'")" = 0
check "complete runs have all their metrics" test "$(q "$db3" "SELECT count(*) FROM run r WHERE r.status='complete' AND (SELECT count(*) FROM metric m WHERE m.run_id=r.id) < 10")" = 0
"$bin" --db "$db3" query "SELECT 1" >/dev/null 2>"$work/note"
n_incomplete=$(q "$db3" "SELECT count(*) FROM run WHERE status!='complete'")
if [ "$n_incomplete" -gt 0 ]; then
  check "incomplete runs are reported" grep -q "never completed" "$work/note"
else
  ok "kill landed between runs (nothing incomplete)"
fi

# SIGINT: the run in progress finishes, the rest are not started, exit 130.
db4=$work/d.db
"$bin" --db "$db4" run -q "$work/long.yaml" >/dev/null 2>&1 &
pid=$!
sleep 1.5
kill -INT $pid
wait $pid
check "SIGINT exits 130" test $? -eq 130
check "SIGINT leaves no incomplete runs" test "$(q "$db4" "SELECT count(*) FROM run WHERE status!='complete'")" = 0

# Measured records imported as real runs of the same variants, beside the simulated ones.
db5=$work/e.db
val="$src/experiments/validation/h200_decode.yaml"
"$bin" --db "$db5" run -q "$val" >/dev/null 2>"$work/val.err"
check "sim+real experiment runs sim and says real was skipped" grep -q "real backend skipped" "$work/val.err"
# The same experiment with the real backend alone, on a machine without one (as the line above
# found): refused with the reason before anything is run or written.
if grep -q "real backend skipped" "$work/val.err"; then
  sed 's/^backends: .*/backends: [real]/' "$val" >"$work/real_only.yaml"
  "$bin" --db "$work/real_only.db" run -q "$work/real_only.yaml" >/dev/null 2>"$work/real_only.err"
  check "a real-only experiment without a GPU fails" test $? -ne 0
  check "and says why" grep -q "asks only for the real backend, but .*nothing was run or written" "$work/real_only.err"
  check "and creates no database" test ! -e "$work/real_only.db"
fi
"$bin" --db "$db5" import "$src/results/h200/decode.json" --as "$val" >"$work/import.out"
check "import stores 8 measured runs" grep -q "8 measured run(s)" "$work/import.out"
check "each variant has a sim and a real run" test "$(q "$db5" "SELECT count(*) FROM (SELECT variant_index FROM run GROUP BY variant_index HAVING count(DISTINCT backend) = 2)")" = 8
# The record's own figures, read here with Python: variant 1 is run-ahead graphs at prompt 128.
record_field() {
  python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
if sys.argv[2] == "tpot":
    print([r for r in d["rows"] if r["config"] == "runahead_graph" and r["prompt_tokens"] == 128][0]["tpot_ms"])
else:
    print(d["gpu"] + " " + d["commit"])' "$src/results/h200/decode.json" "$1"
}
check "measured TPOT imported exactly" test "$(q "$db5" "SELECT m.value FROM metric m JOIN run r ON r.id=m.run_id WHERE r.backend='real' AND r.variant_index=1 AND m.key='tpot_ms_mean'")" = "$(record_field tpot)"
check "measured runs carry the record's GPU and commit" test "$(q "$db5" "SELECT DISTINCT h.gpu_name || ' ' || b.git_sha FROM run r JOIN host h ON h.id=r.host_id JOIN build b ON b.id=r.build_id WHERE r.backend='real'")" = "$(record_field build)"
check "a second import is refused" bash -c "! '$bin' --db '$db5' import '$src/results/h200/decode.json' --as '$val' 2>/dev/null"
# Where no GPU is present, the GPU commands say so (on a GPU machine they would measure); a build
# without CUDA (the sanitizer build) says what the build lacks.
if ! nvidia-smi -L >/dev/null 2>&1; then
  check "calibrate without a GPU says it needs one" bash -c "'$bin' --db '$work/nogpu.db' calibrate --out '$work/nogpu.yaml' 2>&1 | grep -qE '^twinstep: calibrate needs (a CUDA GPU: |the CUDA runtime)'"
  check "calibrate-nccl without a GPU says it needs one" bash -c "'$bin' calibrate-nccl --out '$work/nogpu_nccl.yaml' 2>&1 | grep -qE '^twinstep: calibrate-nccl needs (CUDA GPUs: |a CUDA [+] NCCL [+] MPI build)'"
  check "calibrate without a GPU creates no database" test ! -e "$work/nogpu.db"
fi
# A refused command leaves no new database behind: calibrate's argument errors, a refit of a
# database that does not exist, an import whose second record is malformed (nothing stored).
"$bin" --db "$work/cal_args.db" calibrate --out "$work/cal_args.yaml" --sessions 1 2>/dev/null
check "calibrate --sessions without --fit-only is refused" test $? -ne 0
check "the refused calibrate creates no database" test ! -e "$work/cal_args.db"
check "calibrate --fit-only names a missing database" \
  grep -q "results database $work/missing_cal.db does not exist" \
  <("$bin" --db "$work/missing_cal.db" calibrate --fit-only --out "$work/m.yaml" 2>&1)
check "calibrate --fit-only creates no database" test ! -e "$work/missing_cal.db"
echo '{"command": "x", "commit": "abc1234", "gpu": "g", "date": "d", "rows": [1]}' >"$work/bad_record.json"
"$bin" --db "$work/import_bad.db" import "$src/results/h200/decode.json" "$work/bad_record.json" \
  --as "$val" >/dev/null 2>"$work/import_bad.err"
check "an import with a malformed record fails" test $? -ne 0
check "the import's error names the record" grep -q "record $work/bad_record.json: a row is not an object" "$work/import_bad.err"
check "a refused import creates no database (the good record before it is not stored either)" \
  test ! -e "$work/import_bad.db"
check "compare lines up sim and real" bash -c "'$bin' --db '$db5' compare --experiment validation-h200-decode --csv | head -1 | grep -q '\\[real\\]'"
# 16 runs: the table has a row per run, its swept parameters and backend in columns.
check "compare's table of many runs has a row per run" bash -c "out=\$('$bin' --db '$db5' compare --experiment validation-h200-decode); echo \"\$out\" | head -1 | grep -qE '^run +workload.input_len +cases +backend +tpot_ms_mean' && test \$(echo \"\$out\" | grep -cE '^ *[0-9]+  .*  (sim|real) ') -eq 16"

# compare as a gate: simulated vs measured TPOT is 4-13 % off before calibration.
"$bin" --db "$db5" compare --experiment validation-h200-decode --tolerance 50 >/dev/null 2>&1
check "compare --tolerance passes within tolerance" test $? -eq 0
"$bin" --db "$db5" compare --experiment validation-h200-decode --tolerance 1 >/dev/null 2>"$work/tol.err"
check "compare --tolerance exits 3 when exceeded" test $? -eq 3
check "compare --tolerance says by how much" grep -q "over the tolerance of 1.00%" "$work/tol.err"
"$bin" --db "$db5" compare --experiment validation-h200-decode --ops >/dev/null 2>"$work/ops.err"
check "compare --ops without timelines exits 1" test $? -eq 1
check "compare --ops says how to get timelines" grep -q "add \`trace:" "$work/ops.err"
"$bin" --db "$db5" compare --experiment validation-h200-decode --collectives >/dev/null 2>"$work/coll.err"
check "compare --collectives on one-rank runs exits 1" test $? -eq 1
check "compare --collectives says what it needs" grep -q "two or more ranks" "$work/coll.err"
# The stored two-H200 TP2-EP2 runs (traced steps 40-41): measured and simulated waits per rank.
xz -dc "$src/results/h200/ep2_b2ac37f.db.xz" > "$work/ep2.db"
"$bin" --db "$work/ep2.db" compare --experiment validation-h200-ep2-h200-calibrated --collectives --csv > "$work/coll.csv"
check "compare --collectives lists both ranks' MoE all-reduce waits" test "$(grep -c '^workload.concurrency=1,[01],moe_all_reduce,96,' "$work/coll.csv")" -eq 2
check "sim-vs-real rows carry the error" bash -c "'$bin' --db '$db5' compare --experiment validation-h200-decode --sim-vs-real --csv | head -1 | grep -q 'variant,metric,sim,real,error_pct'"
# --metrics: a name outside the metric catalogue is refused up front (it used to compare nothing
# and, under --tolerance, gate nothing); comma-separated lists equal space-separated ones; a gate
# on a metric the runs do not store cannot pass.
"$bin" --db "$db5" compare --experiment validation-h200-decode --sim-vs-real --metrics tpot_ms_meen >/dev/null 2>"$work/metric.err"
check "compare --metrics refuses an unknown metric" test $? -ne 0
check "and names it" grep -q "unknown metric \"tpot_ms_meen\"" "$work/metric.err"
check "comma-separated metrics equal space-separated" test "$("$bin" --db "$db5" compare --experiment validation-h200-decode --sim-vs-real --metrics tpot_ms_mean,ttft_ms_mean --csv 2>&1)" = "$("$bin" --db "$db5" compare --experiment validation-h200-decode --sim-vs-real --metrics tpot_ms_mean ttft_ms_mean --csv 2>&1)"
"$bin" --db "$db5" compare --experiment validation-h200-decode --tolerance 50 --metrics tpot_ms_mean moe_routing_passes >/dev/null 2>"$work/gate.err"
check "a gate on a metric no run stores exits 1" test $? -eq 1
check "and says it cannot check it" grep -q "moe_routing_passes in both its simulated and measured run" "$work/gate.err"
sims=$(q "$db5" "SELECT group_concat(id, ' ') FROM (SELECT r.id FROM run r JOIN experiment e ON e.id=r.experiment_id WHERE e.name='validation-h200-decode' AND r.backend='sim' ORDER BY r.variant_index LIMIT 2)")
"$bin" --db "$db5" compare --tolerance 50 $sims >/dev/null 2>"$work/unpaired.err"
check "a gate over variants with no measured run exits 1" test $? -eq 1
check "and names each variant" test "$(grep -c 'no measured run among these runs' "$work/unpaired.err")" -eq 2
# Run ids after --metrics (a greedy list option) are still run ids: the same table as before it.
ids=$(q "$db5" "SELECT group_concat(id, ' ') FROM (SELECT id FROM run ORDER BY id LIMIT 2)")
before=$("$bin" --db "$db5" compare $ids --metrics tpot_ms_mean --csv 2>&1)
after=$("$bin" --db "$db5" compare --metrics tpot_ms_mean $ids --csv 2>&1)
check "run ids after --metrics are run ids" test "$before" = "$after"
check "and the table has both runs" test "$(echo "$after" | head -1 | tr ',' '\n' | grep -c '\[')" -ge 2

# Calibrated acceptance: simulated policies replay the verify rounds of a measured chain run. A
# simulated chain stands in for the measurement here (its runs relabelled 'real' with sqlite3).
db6=$work/f.db
"$bin" --db "$db6" run -q "$src/tests/cli/spec/calibration.yaml" >/dev/null 2>&1
check "calibration stand-in stores its verify rounds" test "$(q "$db6" "SELECT count(*) > 500 FROM draft_round")" = 1
python3 -c "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute(\"UPDATE run SET backend = 'real'\"); c.commit()" "$db6"
"$bin" --db "$db6" run -q "$src/tests/cli/spec/spec.yaml" >/dev/null 2>"$work/spec.err"
check "calibrated simulation runs" test $? -eq 0
calib=$(q "$db6" "SELECT r.id FROM run r JOIN experiment e ON e.id=r.experiment_id WHERE e.name='cli-spec-calibration' AND r.variant_label LIKE '%0.9'")
chain=$(q "$db6" "SELECT r.id FROM run r JOIN experiment e ON e.id=r.experiment_id WHERE e.name='cli-spec' AND r.variant_index=0")
# A chain of 5 replaying 8-draft rounds commits min(accepted, 5) + 1 of each: computed in SQL.
table=$(q "$db6" "SELECT avg(min(accepted, 5) + 1) FROM draft_round WHERE run_id=$calib")
sim=$(q "$db6" "SELECT avg(accepted + 1) FROM draft_round WHERE run_id=$chain")
check "simulated chain(5) accept length is the table's ($sim vs $table)" python3 -c "import sys; sys.exit(0 if abs($sim - $table) < 0.03 else 1)"
check "simulated drafts never pass the measured 8" test "$(q "$db6" "SELECT max(draft_len) FROM draft_round r JOIN run x ON x.id=r.run_id JOIN experiment e ON e.id=x.experiment_id WHERE e.name='cli-spec'")" = 8
"$bin" --db "$db6" run -q "$src/tests/cli/spec/too_long.yaml" >/dev/null 2>"$work/long.err"
check "a policy longer than the calibration is refused" test $? -ne 0
check "the refusal names the YAML position and the lengths" grep -q "too_long.yaml:9:15: calibrated acceptance from run .* measured 8-token drafts, but variant 'base' drafts up to 9" "$work/long.err"
"$bin" --db "$db6" run -q "$src/tests/cli/spec/missing_db.yaml" >/dev/null 2>"$work/missing.err"
check "a missing calibration database is refused" test $? -ne 0
check "the refusal names the YAML position and the path" grep -q "missing_db.yaml:9:15: calibrated acceptance: results database /nonexistent/dir/calib.db does not exist" "$work/missing.err"
# Paired by variant index: the simulated chain(5) against calibration variant 0's chain of 8.
calib0=$(q "$db6" "SELECT r.id FROM run r JOIN experiment e ON e.id=r.experiment_id WHERE e.name='cli-spec-calibration' AND r.variant_index=0")
"$bin" --db "$db6" compare --accept "$chain" "$calib0" --accept-tolerance 5 >"$work/accept.out" 2>&1
check "compare --accept prints the distribution" grep -q "tv_distance" "$work/accept.out"
"$bin" --db "$db6" compare --accept "$chain" "$calib0" --accept-tolerance 0.01 >/dev/null 2>"$work/accept.err"
check "compare --accept-tolerance exits 3 when exceeded" test $? -eq 3
check "compare --accept-tolerance says by how much" grep -q "mean accept length differ by up to" "$work/accept.err"

# calibrate --fit-only over chosen sessions of a stored calibration (sessions 1-5 of the repo's
# H200 calibration, what calibration_321e4f2.db.xz held: 1-4 of b2ac37f, Qwen3-30B-A3B, the
# prefill passes, the TP2 shards of Llama-3-8B and Qwen3-30B-A3B; 5 of 321e4f2, the Llama-3-8B grid
# with its speculative graphs).
cdb=$work/calib.db
python3 "$src/scripts/cut_calibration.py" "$src/results/h200/calibration_d1f6e37.db.xz" "$cdb" 5
check "the cut keeps sessions 1-5" test "$(q "$cdb" 'SELECT max(id) FROM calibration_session')" = 5
if python3 "$src/scripts/cut_calibration.py" "$src/results/h200/calibration_d1f6e37.db.xz" \
  "$work/cut99.db" 99 2>"$work/cut.err"; then bad "a cut to a missing session fails"; else
  ok "a cut to a missing session fails"; fi
check "... saying which" grep -q "no session 99 (sessions 1..53)" "$work/cut.err"
check "... and writes nothing" test ! -e "$work/cut99.db" -a ! -e "$work/cut99.db.part"
"$bin" --db "$cdb" calibrate --fit-only --sessions 5 --out "$work/s1.yaml" >/dev/null 2>&1
check "fit-only of session 5 writes a profile" grep -q '^name: "s1"' "$work/s1.yaml"
"$bin" --db "$cdb" calibrate --fit-only --out "$work/latest.yaml" >/dev/null 2>&1
check "session 5 is the latest: same fits" test "$(grep -v -e '^name:' -e 'command:' "$work/s1.yaml")" = "$(grep -v -e '^name:' -e 'command:' "$work/latest.yaml")"
# The committed profile: sessions 1-5 above, 6 of 08b4588 (the TP2 shard's speculative graphs),
# 7 of 8a11021 (Qwen3-30B-A3B's speculative graphs, its draft an MoE layer), 12 of eca5783 and
# 15 of 6321eb9 (those of its TP4-EP4 and TP2-EP2 shards, measured with the attention combine of
# those commits; 8, 10 and 11 measured them before it); sessions 9, 13, 14 and 16 (those shards'
# decode grids) are stored but not fitted: they move the pooled fits the never-fitted 3B is
# priced by; 21-23 of e8341f9, the shards' collective breaks (calibrate --breaks-only; 17-20, the
# first narrower grids of b2772ed, are stored, not fitted); 24-27 of fd6530c stand for 1, 7, 3
# and 6 (Qwen3-30B-A3B's grid and speculative graphs, Llama-3-8B TP2's grid and speculative
# graphs, measured again under the GEMV split rule of fd6530c, scripts/gpu_split_rule.sh); 28 of
# 0bf7f6f stood for 5 (Llama-3-8B's main session, scripts/gpu_recal_main.sh); 29-33 of 3098933
# stand for 28 and 24-27, measured again under the one-wave attention split
# (scripts/gpu_attention_wave.sh); 34 of 735cee4, Llama-3-8B's speculative graphs at 8, 16 and 32
# requests (scripts/gpu_spec_batches.sh); 35 and 36 of 6d90284, its speculative graphs with the
# early-exit drafts that skip steps, and at a 1K context (scripts/gpu_spec_skip.sh); 37 and 38 of
# 8cf36ca, the same with every round from the prompt's context (scripts/gpu_spec_suite_recal.sh);
# 39 of a7acc12 stands for 31, Qwen3-30B-A3B's speculative graphs measured so too
# (scripts/gpu_moe_spec_recal.sh): the profile's speculative graphs are those of 12, 15, 33, 37,
# 38 and 39 (--spec-sessions); 40-42 of 74ae82a, Llama-3-8B's decode grid and speculative graphs
# with the runtime's kernel fusions (calibrate --fusion norms,rope / norms / rope: the labels
# llama-3-8b+norms+rope etc., fitted for those labels alone); 43 and 44 of 141d520, the fused
# speculative graphs at 1-32 requests and at 1K (scripts/gpu_fusion_spec_recal.sh), in place of
# 40's; 45-51 of 9386db7, Qwen3-30B-A3B's sessions measured again after its expert GEMVs moved to
# the split kernel's warp-owned tiles (scripts/gpu_moe_recal.sh; 7dd6e44's pass measured the
# 8-piece split kernel), in place of 30, 39, 4, 15, 12, 21 and 23 (the
# speculative graphs of 46, 48 and 49 in place of 39, 15 and 12); 53 of d1f6e37, Qwen3-30B-A3B's
# speculative graphs again at three attention split sizes at 8K (scripts/gpu_partition.sh;
# docs/calibration.md "Attention partition"), in place of 46 (52: calibrate --partition-only,
# read, not fitted). The collectives: the 2-GPU tables of 583eee2, and the 4-GPU ones of 631b9bd as group r4.
cdb6=$work/calib6.db
xz -dc "$src/results/h200/calibration_d1f6e37.db.xz" >"$cdb6"
"$bin" --db "$cdb6" calibrate --fit-only \
  --sessions 2,22,29,32,33,37,38,40,41,42,43,44,45,47,48,49,50,51,53 \
  --spec-sessions 33,37,38,41,42,43,44,48,49,53 \
  --collectives-from "$src/results/h200/nccl_profile_583eee2.yaml" \
  --collectives-from "$src/results/h200/nccl_profile_4gpu_631b9bd.yaml" \
  --out "$work/h200-calibrated.yaml" >/dev/null 2>&1
check "the committed profile is the refit of the committed sessions" test "$(grep -v 'command:' "$work/h200-calibrated.yaml")" = "$(grep -v 'command:' "$src/results/profiles/h200-calibrated.yaml")"
check "sessions 40-42 give the fused labels' own kernel fits and PDL, graph and eager gaps" test \
  "$(grep -c -E '^  "llama-3-8b\+(norms|rope|norms\+rope)":' "$work/h200-calibrated.yaml")" = 12
check "session 29's speculative graphs give residuals" grep -q '^spec_graph_residuals:' "$work/h200-calibrated.yaml"
check "session 37's stopped early-exit drafts give a cost per skipped step" grep -q 'graph: "draft_early_exit", mode: "graph", batch: 1, .*ns_per_skipped_step: [1-9]' "$work/h200-calibrated.yaml"
check "session 2's prefill passes give the prefill rates" grep -q '^  prefill_gemm_tflops: [1-9]' "$work/h200-calibrated.yaml"
check "the 4-GPU collectives are group r4" grep -q '"nccl.r4.all_reduce.graph.8K.median_ns"' "$work/h200-calibrated.yaml"
check "the grids' eager steps give eager gaps per model and rows" grep -q '^  "llama-3-8b": {1: 1873, ' <(sed -n '/^eager_node_gap_by_rows:/,/^[a-z]/p' "$work/h200-calibrated.yaml")
check "sessions 22, 50 and 51 give the shards' break gaps" grep -q '^  "qwen3-30b-a3b@tp4": {1: ' "$work/h200-calibrated.yaml"
"$bin" --db "$cdb" calibrate --fit-only --sessions 1,2,3,4 \
  --collectives-from "$src/results/h200/nccl_profile_583eee2.yaml" --out "$work/nospec.yaml" >/dev/null 2>&1
"$bin" --db "$cdb" calibrate --fit-only --sessions 1,8 --out "$work/bad.yaml" >/dev/null 2>"$work/sessions.err"
check "a missing session is refused by number" grep -q "has no calibration session 8" "$work/sessions.err"
check "and no profile is written" test ! -e "$work/bad.yaml"
"$bin" --db "$cdb6" calibrate --fit-only --sessions 2,4,29,35 --spec-sessions 36 --out "$work/bad.yaml" >/dev/null 2>"$work/specs.err"
check "--spec-sessions outside --sessions is refused" grep -q "36 is not one of --sessions" "$work/specs.err"
"$bin" --db "$cdb6" calibrate --fit-only --sessions 2,4,29,35 --spec-sessions 35 --out "$work/spec35.yaml" >/dev/null 2>&1
check "--spec-sessions keeps the speculative graphs of those sessions only (35: 1, 4, 32 requests)" test "$(grep -c '{model: "llama-3-8b", graph: "verify"' "$work/spec35.yaml")" = 3
"$bin" --db "$cdb" calibrate --sessions 1 --out "$work/bad.yaml" >/dev/null 2>"$work/sessions2.err"
check "--sessions without --fit-only is refused" grep -q "give it with --fit-only" "$work/sessions2.err"
"$bin" --db "$cdb" calibrate --fit-only --spec-only --out "$work/bad.yaml" >/dev/null 2>"$work/spec.err"
check "--spec-only with --fit-only is refused" grep -q "fit-only measures nothing" "$work/spec.err"
"$bin" --db "$cdb" calibrate --fit-only --spec-batches 8,32 --out "$work/bad.yaml" >/dev/null 2>"$work/specb.err"
check "--spec-batches with --fit-only is refused" grep -q "fit-only measures nothing" "$work/specb.err"
"$bin" --db "$cdb" calibrate --fit-only --spec-partitions 2 --out "$work/bad.yaml" >/dev/null 2>"$work/specp.err"
check "--spec-partitions with --fit-only is refused" grep -q "fit-only measures nothing" "$work/specp.err"
"$bin" --db "$cdb" calibrate --fit-only --spec-capacity-tokens 9280 --out "$work/bad.yaml" >/dev/null 2>"$work/specc.err"
check "--spec-capacity-tokens with --fit-only is refused" grep -q "fit-only measures nothing" "$work/specc.err"
"$bin" --db "$cdb" calibrate --no-spec --spec-batches 8 --out "$work/bad.yaml" >/dev/null 2>"$work/specb2.err"
check "--spec-batches with --no-spec is refused" grep -q "spec-batches sets the speculative graphs' batches; drop --no-spec" "$work/specb2.err"
"$bin" --db "$cdb" calibrate --in-situ --tp 2 --out "$work/bad.yaml" >/dev/null 2>"$work/insitu.err"
check "--in-situ without --breaks-only is refused" grep -q "give it with --breaks-only --tp N, under mpirun -np N" "$work/insitu.err"
# --fusion: the runtime's kernel fusions measured under their own label (calibrate_fusion).
"$bin" --db "$cdb" calibrate --fusion norms,ropes --out "$work/bad.yaml" >/dev/null 2>"$work/fus1.err"
check "--fusion with an unknown name is refused" grep -q "fusion takes norms and rope (policies.fusion's fields), got 'ropes'" "$work/fus1.err"
"$bin" --db "$cdb" calibrate --fit-only --fusion norms --out "$work/bad.yaml" >/dev/null 2>"$work/fus2.err"
check "--fusion with --fit-only is refused" grep -q "fusion chooses what calibrate measures" "$work/fus2.err"
"$bin" --db "$cdb" calibrate --fusion norms --models qwen3-30b-a3b --out "$work/bad.yaml" >/dev/null 2>"$work/fus3.err"
check "--fusion norms on a MoE model is refused" grep -q "fused norms need a dense GQA model.*qwen3-30b-a3b is not" "$work/fus3.err"
"$bin" --db "$cdb" calibrate --fusion rope --prefill-only --out "$work/bad.yaml" >/dev/null 2>"$work/fus4.err"
check "--fusion with --prefill-only is refused" grep -q "drop --prefill-only and --breaks-only" "$work/fus4.err"
check "sessions without speculative graphs: no residuals" bash -c "! grep -q spec_graph_residuals '$work/nospec.yaml'"
# --collectives-from keeps another profile's NCCL calibration through a kernel refit.
"$bin" --db "$cdb" calibrate --fit-only --collectives-from "$src/results/profiles/h200-calibrated.yaml" \
  --out "$work/kept.yaml" >/dev/null 2>&1
check "a refit keeps the collective tables" test "$(grep -c '"nccl\.all_reduce\.graph\.[0-9]*[KM]\.median_ns"' "$work/kept.yaml")" -ge 10
check "and the all-reduce alpha" test "$(grep 'allreduce_alpha_ns' "$work/kept.yaml")" = "$(grep 'allreduce_alpha_ns' "$src/results/profiles/h200-calibrated.yaml")"
# ... and its arrival-skew curve (calibrate-nccl's collective_skew section), when it has one.
cp "$src/results/h200/nccl_profile_583eee2.yaml" "$work/nccl_skew.yaml"
printf 'collective_skew:\n  ranks: 2\n  all_reduce: {graph: [[0, 0], [1500, 900.5]]}\n' >>"$work/nccl_skew.yaml"
"$bin" --db "$cdb" calibrate --fit-only --sessions 1,2,3,4 --collectives-from "$work/nccl_skew.yaml" \
  --out "$work/skew_kept.yaml" >/dev/null 2>&1
check "a refit keeps the arrival-skew curve" grep -q '^    graph: \[\[0, 0\], \[1500, 900.5\]\]$' "$work/skew_kept.yaml"
check "a refit of a profile without one writes none" test "$(grep -c '^collective_skew:' "$work/kept.yaml")" -eq 0
"$bin" --db "$cdb" calibrate --fit-only --collectives-from "$work/s1.yaml" --out "$work/none.yaml" >/dev/null 2>"$work/kept.err"
check "a profile without collectives is refused" grep -q "holds no nccl.\* measurements" "$work/kept.err"
# Repeated --collectives-from: the first profile as a whole, a further one's tables (another
# group size) as nccl.r<N>.*; the profile written loads with both.
nccl2=$src/results/h200/nccl_profile_583eee2.yaml
sed 's/"nccl.ranks": 2$/"nccl.ranks": 4/' "$nccl2" >"$work/nccl4.yaml"
"$bin" --db "$cdb" calibrate --fit-only --sessions 1,2,3,4 --collectives-from "$nccl2" \
  --collectives-from "$work/nccl4.yaml" --out "$work/groups.yaml" >/dev/null 2>&1
check "a further --collectives-from adds its tables as nccl.r4.*" test "$(grep -c '"nccl\.r4\.all_reduce\.graph\.[0-9]*[KM]\.median_ns"' "$work/groups.yaml")" -eq "$(grep -c '"nccl\.all_reduce\.graph\.[0-9]*[KM]\.median_ns"' "$nccl2")"
check "and keeps the first's as they were" test "$(grep '"nccl\.[a-z_]*\.' "$work/groups.yaml")" = "$(grep '"nccl\.[a-z_]*\.' "$work/nospec.yaml")"
mkdir -p "$work/groups"
cp "$work/groups.yaml" "$work/groups/"
check "the profile with two group sizes loads" bash -c "TWINSTEP_PROFILES='$work/groups' '$bin' hardware | grep -q '^groups '"
"$bin" --db "$cdb" calibrate --fit-only --sessions 1,2,3,4 --collectives-from "$nccl2" \
  --collectives-from "$nccl2" --out "$work/bad.yaml" >/dev/null 2>"$work/groups.err"
check "a group size given twice is refused" grep -q "measured on 2 GPUs (nccl.ranks), as were those of" "$work/groups.err"

# Held-out evaluation: Llama-3-8B (session 5) priced by a fit of sessions 1-4, i.e.
# by the pooled name and class fits, as a simulated run of a never-measured model would be.
"$bin" --db "$cdb" calibrate --fit-only --sessions 1,2,3,4 --out "$work/lomo.yaml" \
  --evaluate-db "$cdb" --evaluate-sessions 5 >"$work/lomo.out" 2>&1
check "--evaluate-db evaluates after the fit" test $? -eq 0
check "the held-out model has no fits of its own" grep -q "model llama-3-8b priced with the kernel fits of no model of its own" "$work/lomo.out"
check "errors per kernel name over every sample" grep -Eq "^llama-3-8b +qkv_proj +864 " "$work/lomo.out"
check "the lost lm_head from the step residuals" grep -Eq "^llama-3-8b +lm_head \(residual\) +27 " "$work/lomo.out"
check "and the step sums per mode" grep -q "^steps llama-3-8b pdl: 27 points" "$work/lomo.out"
"$bin" calibrate-eval --profile "$src/results/profiles/h200-calibrated.yaml" --db "$cdb" --sessions 3 --by-batch >"$work/eval.out" 2>&1
check "calibrate-eval prices a fitted shard by its own fits" grep -q "model llama-3-8b@tp2 priced with the kernel fits of 'llama-3-8b@tp2'" "$work/eval.out"
check "--by-batch splits the kernel errors by batch" grep -Eq "^llama-3-8b@tp2 +o_proj +16 +64 " "$work/eval.out"
"$bin" calibrate-eval --profile h200-calibrated --db "$work/nope.db" >/dev/null 2>"$work/eval.err"
check "calibrate-eval refuses a missing database" grep -q "nope.db does not exist" "$work/eval.err"

# scripts/validation_json.py: the record of an offline sim-vs-real CSV, with the counts within each
# tolerance (TPOT 2 %, 3 % held-out; busy fraction in points).
printf '%s\n' 'experiment,validation-h200-x-calibrated' 'variant,metric,sim,real,error_pct' \
  'a,tpot_ms_mean,1.03,1,3' 'b,tpot_ms_mean,1.01,1,1' 'a,gpu_busy_frac,0.9,0.93,-3.2' \
  'experiment,validation-h200-heldout-calibrated' 'variant,metric,sim,real,error_pct' \
  'a,tpot_ms_mean,1.025,1,2.5' >"$work/v.csv"
python3 "$src/scripts/validation_json.py" "$work/v.csv" "$work/v.json" --command c --commit x \
  --gpu g --date d >"$work/v.out" 2>&1
check "validation_json counts the fitted TPOT rows within 2 %" grep -q "^fitted_tpot_pct: 1 of 2 within tolerance" "$work/v.out"
check "and the held-out ones within 3 %" grep -q "^heldout_tpot_pct: 1 of 1 within tolerance" "$work/v.out"
check "and GPU busy in points" grep -q "^gpu_busy_points: 0 of 1 within tolerance" "$work/v.out"
check "and writes every row" python3 -c "import json,sys; d=json.load(open(sys.argv[1])); sys.exit(len(d['rows']) != 4 or d['rows'][0]['experiment'] != 'h200-x')" "$work/v.json"

# Commands that only read refuse a database that does not exist, and create nothing.
for cmd in "query 'SELECT 1'" compare "trace 1" "report -o $work/nodb.html" "plot -o $work/nodb_plots"; do
  eval "\"\$bin\" --db \"\$work/nodb.db\" $cmd" >/dev/null 2>"$work/nodb.err"
  rc=$?
  check "$cmd on a missing database fails, says so and creates nothing" \
    bash -c "[ $rc -ne 0 ] && grep -q 'results database $work/nodb.db does not exist' '$work/nodb.err' && [ ! -e '$work/nodb.db' ] && [ ! -e '$work/nodb.html' ]"
done
mkdir "$work/nodefault"
abs_bin=$(realpath "$bin")
(cd "$work/nodefault" && "$abs_bin" compare >/dev/null 2>"$work/nodefault.err")
check "compare without --db and no results/twinstep.db says to run an experiment first" \
  bash -c "grep -q 'no results database at results/twinstep.db: run an experiment first' '$work/nodefault.err' && [ -z \"\$(ls -A '$work/nodefault')\" ]"

# bench-sim --store: the run's rows stored in a database under $TMPDIR that is removed afterwards.
mkdir -p "$work/bench_tmp"
TMPDIR="$work/bench_tmp" "$bin" bench-sim --requests 20 --store >"$work/bench.out" 2>&1
check "bench-sim --store exits 0" test $? -eq 0
check "bench-sim --store counts the rows it stored (20 x 1024 chunks, 20 requests)" \
  grep -Eq "store: one transaction .*\(([0-9]+) rows: 20501 steps, 20480 chunks, " "$work/bench.out"
check "and leaves nothing under TMPDIR" test -z "$(ls -A "$work/bench_tmp")"

# models / hardware list presets.
check "models lists llama-3-8b" bash -c "'$bin' models | grep -q 'llama-3-8b .* 8.0303'"
check "hardware lists h200" bash -c "'$bin' hardware | grep -q '^h200 '"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
