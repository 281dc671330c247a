#!/usr/bin/env python3
"""Per-kernel summary of an Nsight Compute raw CSV (scripts/gpu_ncu.sh writes OUT/raw.txt).

    scripts/ncu_summary.py RAW_CSV [LABEL ...]

One line per profiled launch, in launch order: duration, grid, registers, DRAM throughput,
issue activity, L1 / L2 hit rates, and the six largest warp-stall reasons (cycles per issued
instruction). LABELs name the launches in order (default: the kernel names); for
`twinstep_kernels_bench --only ncu` the order is qkv, o, gate_up, gate_up_swiglu, down, lm_head
at m = 1, 6, 16, then the attention pair at q_len 1 and 6.
"""
import csv
import sys


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], newline="") as f:  # '#' lines: a record's header (results/h200)
        rows = list(csv.reader(line for line in f if not line.startswith("#")))
    if len(rows) < 3:
        print(f"{sys.argv[1]}: no profiled launches", file=sys.stderr)
        return 1
    header, data = rows[0], rows[2:]  # rows[1] holds the units
    col = {name: i for i, name in enumerate(header)}
    labels = sys.argv[2:]
    prefix, suffix = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
    stalls = [h for h in header if h.startswith(prefix) and h.endswith(suffix)]

    def get(row, name):
        return row[col[name]] if name in col else "n/a"

    print("launch | us | grid | regs | dram % | issue % | L1 hit % | L2 hit % | top stalls")
    for i, row in enumerate(data):
        label = labels[i] if i < len(labels) else get(row, "Kernel Name")[:40]
        top = sorted(((float(row[col[s]] or 0), s[len(prefix):-len(suffix)]) for s in stalls),
                     reverse=True)[:6]
        print(" | ".join([
            label,
            get(row, "gpu__time_duration.sum"),
            get(row, "launch__grid_size"),
            get(row, "launch__registers_per_thread"),
            get(row, "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
            get(row, "smsp__issue_active.avg.pct_of_peak_sustained_active"),
            get(row, "l1tex__t_sector_hit_rate.pct"),
            get(row, "lts__t_sector_hit_rate.pct"),
            " ".join(f"{name}={value:.2f}" for value, name in top),
        ]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
