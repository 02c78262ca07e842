#!/usr/bin/env python3
"""Where a decode step's time goes on the GPU, from a kernel trace.

Record one on the device (measuring only; kernels compiled with FERROX_TRACE):
    FERROX_CUDA_DEFINES=FERROX_TRACE=1 FERROX_CUDA_TRACE=/tmp/trace.txt \\
        ferrox bench --backend cuda -m model.gguf -p 0 -n 16 -r 1
then `python3 tools/cuda/trace.py /tmp/trace.txt [--start NAME] [--skip N]`.

Each line of the trace: index, the ns timer when the kernel's first block
reached its PDL wait, when that wait returned (the previous kernel had
finished), the source line, the kernel's name (a macro-made kernel is named
by its DEFINE_... line). Kernels are in the order their waits returned, so
the time from one kernel's release to the next one's is the first kernel's
share of the critical path ("exposed" time; a host copy or a graph launch
between two kernels is counted in the first). "early" is how long the first
block waited at PDL_ENTER: how far ahead of its predecessor's end it started.

Steps begin at each kernel whose name starts with --start (default
DEFINE_KIND: the embedding's get_rows opens a decode step); the first --skip
steps (default 2) are warm-up. Prints, per kernel name, calls a step, mean
exposed and early us, and its share of the step; then the first --positions
kernels of a step one by one (Q/K/V, O, gate/up and down share a name).

A server's steps differ in size, and their first kernel is no mark: with
--gap US, runs of kernels are cut where the GPU waited over US between two
releases (the host's share: read-back, sampling, the next batch). Each size
of run (kernels in it) is listed with its count, median span and the median
wait after it; the per-kernel table is then over the runs of the size that
takes the most time (a server's full steps), the wait after each counted in
its last kernel.
"""
import argparse
import collections
import statistics
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--start", default="DEFINE_KIND")
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--gap", type=float, default=0.0,
                    help="cut steps where the GPU idled over this many us (a server's steps)")
    ap.add_argument("--positions", type=int, default=12,
                    help="also list the first N kernels of a step by position (one matrix each)")
    a = ap.parse_args()
    recs = []
    for line in open(a.trace):
        f = line.split(maxsplit=4)
        if len(f) == 5:
            recs.append((int(f[0]), int(f[1]), int(f[2]), f[4].strip()))
    recs.sort()
    if len(recs) < 2:
        sys.exit("fewer than two trace records")
    if a.gap > 0:
        steps = runs_between_gaps(recs, a.gap)
    else:
        starts = [i for i, r in enumerate(recs) if r[3].startswith(a.start)]
        steps = list(zip(starts, starts[1:]))[a.skip:]
    if not steps:
        sys.exit(f"no whole step after {a.skip} warm-up ones ({len(starts)} starts named {a.start}*)")
    exposed = collections.defaultdict(list)
    early = collections.defaultdict(list)
    per_step = collections.Counter()
    step_us = []
    for s, e in steps:
        step_us.append((recs[e][2] - recs[s][2]) / 1e3)
        for k in range(s, e):
            name = recs[k][3]
            exposed[name].append((recs[k + 1][2] - recs[k][2]) / 1e3)
            early[name].append((recs[k][2] - recs[k][1]) / 1e3)
            per_step[name] += 1
    n = len(steps)
    step = statistics.median(step_us)
    # (a decode step is one token a sequence; a server's step is many)
    rate = "" if a.gap > 0 else f" ({1e6 / step:.1f} t/s at this rate)"
    print(f"{n} steps, median {step:.1f} us a step{rate}")
    print(f"{'kernel':<34} {'calls':>6} {'exposed us':>11} {'early us':>9} {'us/step':>9} {'share':>6}")
    rows = sorted(exposed, key=lambda k: -sum(exposed[k]))
    for k in rows:
        tot = sum(exposed[k]) / n
        print(f"{k[:34]:<34} {per_step[k] / n:>6.1f} {statistics.mean(exposed[k]):>11.2f} "
              f"{statistics.mean(early[k]):>9.2f} {tot:>9.1f} {100 * tot / step:>5.1f}%")
    width = min(e - s for s, e in steps)
    print(f"\nby position in the step (median over steps):")
    for p in range(min(a.positions, width)):
        ex = [(recs[s + p + 1][2] - recs[s + p][2]) / 1e3 for s, _ in steps]
        ea = [(recs[s + p][2] - recs[s + p][1]) / 1e3 for s, _ in steps]
        print(f"{p:>3} {recs[steps[0][0] + p][3][:34]:<34} exposed {statistics.median(ex):>8.2f} us  early {statistics.median(ea):>8.2f} us")


def runs_between_gaps(recs, gap_us):
    """Runs of kernels between waits over gap_us; prints each run size's count,
    median span and median wait after; returns the runs of the most common
    size as (first index, first index of the next run)."""
    cuts = [i for i in range(1, len(recs)) if (recs[i][2] - recs[i - 1][2]) / 1e3 > gap_us]
    runs = list(zip([0] + cuts, cuts))
    if not runs:
        sys.exit(f"no wait over {gap_us} us between two kernels")
    sizes = collections.Counter(e - s for s, e in runs)
    print(f"runs of kernels between waits over {gap_us:g} us:")
    print(f"{'kernels':>8} {'runs':>6} {'span ms':>9} {'wait after ms':>14}  first kernel")
    for size, count in sizes.most_common(8):
        sel = [(s, e) for s, e in runs if e - s == size]
        span = statistics.median((recs[e - 1][2] - recs[s][2]) / 1e6 for s, e in sel)
        wait = statistics.median((recs[e][2] - recs[e - 1][2]) / 1e6 for s, e in sel)
        print(f"{size:>8} {count:>6} {span:>9.2f} {wait:>14.2f}  {recs[sel[0][0]][3][:40]}")
    # The size the GPU spends the most time in (a server's full steps).
    total = collections.Counter()
    for s, e in runs:
        total[e - s] += recs[e][2] - recs[s][2]
    common = total.most_common(1)[0][0]
    print(f"\nthe {sizes[common]} runs of {common} kernels (the most GPU time):")
    return [(s, e) for s, e in runs if e - s == common]


if __name__ == "__main__":
    main()
