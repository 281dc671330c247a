#!/usr/bin/env python3
"""Speculative rounds by draft length, measured beside simulated (docs/calibration.md,
"Speculative suite"): for each variant of EXPERIMENT in a results database that holds a real run
and a simulated one, per device-decided draft length L, the rounds of each backend, the real
launches' median spans (draft, verify, extend: timeline spans of traced rounds) and both
backends' mean GPU busy per round, with real - sim.
  scripts/spec_rounds.py DB EXPERIMENT
Reads the newest real and simulated run of each variant; standard library only."""
import collections
import sqlite3
import statistics
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    db = sqlite3.connect(sys.argv[1])
    runs = db.execute(
        "SELECT r.id, r.backend, r.variant_label FROM run r JOIN experiment e ON e.id = "
        "r.experiment_id WHERE e.name = ? AND r.status = 'complete' ORDER BY r.id",
        (sys.argv[2],)).fetchall()
    newest = {}
    for run_id, backend, label in runs:
        newest[(label, backend)] = run_id
    labels = sorted({label for label, _ in newest})
    if not labels:
        sys.exit(f"no complete runs of experiment '{sys.argv[2]}' in {sys.argv[1]}")
    for label in labels:
        real, sim = newest.get((label, "real")), newest.get((label, "sim"))
        if real is None or sim is None:
            continue
        print(f"## {label} (real run {real}, sim run {sim})")
        print(f"{'L':>3} {'real':>5} {'sim':>5} {'draft_us':>9} {'verify_us':>9} {'extend_us':>9} "
              f"{'real_busy_us':>12} {'sim_busy_us':>11} {'real-sim_us':>11}")
        rounds = {}
        busy = {}
        for which, run in (("real", real), ("sim", sim)):
            lens = dict(db.execute(
                "SELECT step, draft_len FROM step_sample WHERE run_id = ? AND rank = 0 AND "
                "prefills = 0 AND draft_len > 0", (run,)).fetchall())
            rounds[which] = lens
            per = collections.defaultdict(list)
            for step, b in db.execute(
                    "SELECT step, gpu_busy_ns FROM step_sample WHERE run_id = ? AND rank = 0 AND "
                    "prefills = 0 AND draft_len > 0", (run,)):
                per[lens[step]].append(b / 1e3)
            busy[which] = per
        spans = collections.defaultdict(lambda: collections.defaultdict(list))
        for step, name, dur in db.execute(
                "SELECT step, name, dur_ns FROM timeline_span WHERE run_id = ? AND rank = 0 AND "
                "lane = 'compute' AND name IN ('draft_graph', 'verify_graph', 'extend_graph')",
                (real,)):
            if step in rounds["real"]:
                spans[name][rounds["real"][step]].append(dur / 1e3)
        for length in sorted(set(busy["real"]) | set(busy["sim"])):
            r, s = busy["real"].get(length, []), busy["sim"].get(length, [])
            med = [statistics.median(spans[n][length]) if spans[n][length] else float("nan")
                   for n in ("draft_graph", "verify_graph", "extend_graph")]
            rm = statistics.mean(r) if r else float("nan")
            sm = statistics.mean(s) if s else float("nan")
            print(f"{length:>3} {len(r):>5} {len(s):>5} {med[0]:>9.1f} {med[1]:>9.1f} {med[2]:>9.1f} "
                  f"{rm:>12.1f} {sm:>11.1f} {rm - sm:>+11.1f}")


if __name__ == "__main__":
    main()
