#!/usr/bin/env python3
"""Per-kernel GPU time from an Nsight Compute CSV, to set two engines' decode
steps side by side (ncu runs kernels one at a time, so these are each
kernel's own durations, without launch gaps or overlap).

Record on the device (Firecracker machines; the clocks left alone):
    ncu --clock-control none --metrics gpu__time_duration.sum --csv \\
        ferrox bench --backend cuda -m model.gguf -p 0 -n 4 -r 1 >ferrox.csv
then `python3 tools/cuda/ncu_sum.py ferrox.csv --steps N`, N the decode steps
the run made (the totals are divided by it). Prints, per kernel name (the
template arguments cut), launches a step, microseconds a step and share.
"""
import argparse
import collections
import csv
import io
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    text = open(a.csv, errors="replace").read()
    # ncu prints its own lines (==PROF== ...) and the program's output around the table.
    start = text.find('"ID"')
    if start < 0:
        sys.exit("no ncu table in " + a.csv)
    rows = csv.DictReader(io.StringIO(text[start:]))
    total = collections.Counter()
    count = collections.Counter()
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"].split("(")[0].split("<")[0].strip()
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        us = v / 1000.0 if unit in ("ns", "nsecond") else v * 1000.0 if unit in ("ms", "msecond") else v
        total[name] += us
        count[name] += 1
    all_us = sum(total.values())
    print(f"{'kernel':48} {'calls/step':>10} {'us/step':>9} {'share':>6}")
    for name, us in total.most_common(a.top):
        print(f"{name[:48]:48} {count[name] / a.steps:10.1f} {us / a.steps:9.1f} {100 * us / all_us:5.1f}%")
    print(f"{'all':48} {sum(count.values()) / a.steps:10.1f} {all_us / a.steps:9.1f}")


if __name__ == "__main__":
    main()
