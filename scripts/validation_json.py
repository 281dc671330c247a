#!/usr/bin/env python3
"""The results/<gpu>/ record of a sim-vs-real comparison: reads the CSV that
scripts/sim_vs_real_offline.sh writes (blocks "experiment,NAME" then "variant,metric,sim,real,
error_pct" rows) and writes JSON with the record's header fields, every row, the worst absolute
error per group and the count within each tolerance.

  scripts/validation_json.py CSV OUT.json --command C --commit C --gpu G --date D \
      [--profile P] [--database D] [--note N]

Tolerances (issue #6): mean TPOT 2 % on fitted shapes, 3 % on the held-out experiment (name
containing "heldout"), p99 ITL 5 %, GPU busy fraction 2 percentage points (its error_pct column
is relative; the points are recomputed from sim and real).
"""
import argparse
import csv
import json
import sys


def read_rows(path):
    rows, experiment = [], None
    with open(path, newline="") as f:
        for rec in csv.reader(f):
            if not rec:
                continue
            if rec[0] == "experiment":
                experiment = rec[1].removeprefix("validation-").removesuffix("-calibrated")
                continue
            if rec[0] == "variant":
                continue
            if experiment is None or len(rec) != 5:
                sys.exit(f"{path}: unexpected line {rec}")
            variant, metric, sim, real, err = rec
            rows.append({"experiment": experiment, "variant": variant, "metric": metric,
                         "sim": round(float(sim), 5), "real": round(float(real), 5),
                         "error_pct": round(float(err), 3)})
    return rows


def group_of(row):
    m = row["metric"]
    if m == "gpu_busy_frac":
        return "gpu_busy_points", 2.0, abs(row["sim"] - row["real"]) * 100
    if m == "itl_ms_p99":
        return "itl_p99_pct", 5.0, abs(row["error_pct"])
    if m == "tpot_ms_mean":
        held = "heldout" in row["experiment"]
        return ("heldout_tpot_pct" if held else "fitted_tpot_pct"), (3.0 if held else 2.0), \
            abs(row["error_pct"])
    return m + "_pct", None, abs(row["error_pct"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("out")
    for k in ("command", "commit", "gpu", "date"):
        ap.add_argument("--" + k, required=True)
    for k in ("profile", "database", "note"):
        ap.add_argument("--" + k)
    a = ap.parse_args()
    rows = read_rows(a.csv)
    worst, within = {}, {}
    for r in rows:
        group, tol, err = group_of(r)
        if group not in worst or err > worst[group][0]:
            worst[group] = (err, r)
        if tol is not None:
            n, ok = within.get(group, (0, 0))
            within[group] = (n + 1, ok + (err <= tol))
    record = {k: getattr(a, k) for k in ("command", "commit", "gpu", "date", "profile", "database",
                                         "note") if getattr(a, k)}
    record["within_tolerance"] = {g: f"{ok} of {n}" for g, (n, ok) in sorted(within.items())}
    record["worst_abs"] = {g: r for g, (_, r) in sorted(worst.items())}
    record["rows"] = rows
    with open(a.out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    for g, (n, ok) in sorted(within.items()):
        print(f"{g}: {ok} of {n} within tolerance; worst {worst[g][1]['experiment']} "
              f"{worst[g][1]['variant']} {worst[g][1]['error_pct']:+.3f} %")


if __name__ == "__main__":
    main()
