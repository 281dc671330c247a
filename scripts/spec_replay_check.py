#!/usr/bin/env python3
"""What the aligned acceptance replay assumes, checked on measured runs (docs/calibration.md,
"Speculative suite, session 21"; simulator/acceptance_model.cc). For each real run of EXPERIMENT
whose variant label matches the SQL pattern LIKE (the newest per label), against the newest real
run of SOURCE_EXPERIMENT labelled SOURCE_VARIANT (the chain run it replays by output position):
  - rounds that start where a source round started, and how many of them drew every
    confidence equal to it (the post-miss positions included);
  - bonus tokens (the token after a source round accepted whole): how often the next source
    round agreed at its first draft, how often real rounds that drafted a bonus token agreed
    there, and the mean confidences (real at the bonus token, the next round's first, the
    source round's last).
  scripts/spec_replay_check.py DB SOURCE_EXPERIMENT SOURCE_VARIANT EXPERIMENT LIKE
Standard library only."""
import collections
import json
import sqlite3
import sys


def rounds(db, run):
    per = collections.defaultdict(list)
    for req, length, acc, conf in db.execute(
            "SELECT request_id, draft_len, accepted, confidence FROM draft_round WHERE run_id = ? "
            "ORDER BY request_id, idx", (run,)):
        per[req].append((length, acc, json.loads(conf)))
    out = {}
    for req, rs in per.items():
        start, lst = 0, []
        for length, acc, conf in rs:
            lst.append((start, length, acc, conf))
            start += acc + 1
        out[req] = lst
    return out


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    db = sqlite3.connect(sys.argv[1])
    source, source_variant, experiment, like = sys.argv[2:6]
    src_rows = db.execute(
        "SELECT r.id FROM run r JOIN experiment e ON e.id = r.experiment_id WHERE e.name = ? AND "
        "r.variant_label = ? AND r.backend = 'real' AND r.status = 'complete' ORDER BY r.id",
        (source, source_variant)).fetchall()
    if not src_rows:
        sys.exit(f"no real run of {source} labelled '{source_variant}' in {sys.argv[1]}")
    src = src_rows[-1][0]
    s = rounds(db, src)
    starts = {(q, o): (length, a, c) for q, lst in s.items() for o, length, a, c in lst}
    bonus = {}
    for q, lst in s.items():
        for i, (o, length, a, c) in enumerate(lst):
            if a == length:
                bonus[(q, o + length)] = (lst[i + 1] if i + 1 < len(lst) else None, c[-1])
    nxt = [b[0] for b in bonus.values() if b[0] is not None]
    print(f"source: {source} '{source_variant}' (real run {src}): {len(nxt)} rounds accepted whole "
          f"and followed, the next agreed at its first draft in {sum(r[2] >= 1 for r in nxt)}")
    runs = db.execute(
        "SELECT r.id, r.variant_label FROM run r JOIN experiment e ON e.id = r.experiment_id "
        "WHERE e.name = ? AND r.variant_label LIKE ? AND r.backend = 'real' AND r.status = "
        "'complete' ORDER BY r.id", (experiment, like)).fetchall()
    newest = {label: rid for rid, label in runs}
    mean = lambda v: sum(v) / len(v) if v else float("nan")
    for label, rid in sorted(newest.items()):
        at_start = equal = drafted = agreed = 0
        real_conf, next_conf, last_conf = [], [], []
        for q, lst in rounds(db, rid).items():
            for o, length, a, c in lst:
                if (q, o) in starts:
                    sl, _, sc = starts[(q, o)]
                    at_start += 1
                    equal += all(abs(c[i] - sc[i]) < 1e-6 for i in range(min(length, sl)))
                for p in range(1, min(length, a + 1) + 1):
                    key = (q, o + p - 1)
                    if key in bonus and bonus[key][0] is not None:
                        drafted += 1
                        agreed += p <= a
                        real_conf.append(c[p - 1])
                        next_conf.append(bonus[key][0][3][0])
                        last_conf.append(bonus[key][1])
        print(f"{label} (real run {rid}): rounds at a source round's start {at_start}, every "
              f"confidence equal {equal}; bonus tokens drafted {drafted}, agreed {agreed}; mean "
              f"confidence there {mean(real_conf):.3f}, the next round's first "
              f"{mean(next_conf):.3f}, the source round's last {mean(last_conf):.3f}")


if __name__ == "__main__":
    main()
