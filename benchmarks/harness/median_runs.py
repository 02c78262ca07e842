#!/usr/bin/env python3
"""Merges several outputs of benchmarks/run_matvec.sh (1 and 2 threads) into one markdown table:
per cell, the median over runs of each run's median. Usage: median_runs.py RUN.txt..."""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record import parse_matvec  # noqa: E402  (one parser of run_matvec.sh's tables)

runs = [parse_matvec(open(p).read()) for p in sys.argv[1:]]
print("| kind | shape | llama.cpp 1t | ferrox scalar 1t | ferrox SIMD 1t | ratio 1t | llama.cpp 2t | ferrox scalar 2t | ferrox SIMD 2t | ratio 2t |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for key in runs[0][0]:
    g = [statistics.median(r[0][key][i] for r in runs) for i in range(2)]
    f = [statistics.median(r[1][key][i] for r in runs) for i in range(4)]
    print(f"| {key[0]} | {key[1]} | {g[0]:.2f} | {f[0]:.2f} | {f[2]:.2f} | **{f[2] / g[0]:.2f}** "
          f"| {g[1]:.2f} | {f[1]:.2f} | {f[3]:.2f} | **{f[3] / g[1]:.2f}** |")
