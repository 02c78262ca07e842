#!/usr/bin/env bash
# Issue 4's bar, side by side in one run: Gemma 3 270M as published (Q4_K_M) and re-quantized with
# llama-quantize to Q8_0, Q4_0, Q5_K_M, Q6_K, IQ4_XS, Q3_K_M and Q2_K; llama.cpp's AMX build in its
# default (repacking) mode and with --repack 0 (its plain path), and ferrox, 2 threads, pp512 and
# tg128, means of ROUNDS x REPS repeats taken in turns. Prints one markdown table plus the raw llama-bench/ferrox rows, and
# appends the normalized lines to benchmarks/results/cpu-e2e.jsonl (RECORD=0: not); then
# `python3 benchmarks/tables.py` regenerates the tables of benchmarks/e2e.md from them.
#
#   benchmarks/run_bar.sh                 (ROUNDS=5 REPS=1 THREADS=2; LLAMA_BIN, FERROX; KINDS to subset;
#                                          MACHINE labels the lines, default from the CPU)
#
# Holds /tmp/ferrox-cpu.lock for the whole run (builds that honour it wait), prints the load average
# before and after: a figure taken beside another process means little on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${REPS:-1}
rounds=${ROUNDS:-5}
threads=${THREADS:-2}
llama=${LLAMA_BIN:-$HOME/.cache/ferrox/llama.cpp-build/bin}
ferrox=${FERROX:-${CARGO_TARGET_DIR:-target}/release/ferrox}
models=$HOME/.cache/ferrox/models
src=$models/gemma-3-270m-q4_k_m.gguf
read -r -a kinds <<< "${KINDS:-Q4_K_M Q8_0 Q4_0 Q5_K_M Q6_K IQ4_XS Q3_K_M Q2_K}"
export LD_LIBRARY_PATH="$llama${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

file_for() {
  if [ "$1" = Q4_K_M ]; then echo "$src"; return; fi
  local f=$models/gemma-3-270m-$(echo "$1" | tr 'A-Z' 'a-z').llama.gguf
  [ -f "$f" ] || "$llama/llama-quantize" --allow-requantize "$src" "$f" "$1" 2 > /dev/null 2>&1
  echo "$f"
}

exec 9> /tmp/ferrox-cpu.lock
flock 9
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "llama.cpp: $("$llama/llama-bench" --version 2>&1 | head -1 || true); ferrox: $(git rev-parse --short HEAD)"
echo
# The read bandwidth the decode figures are held against (issue 36's bar: decode >= 85% of it),
# before and after the run, without and with the prefetch (2 KiB ahead streams most on the AVX2
# EPYC, 8 KiB on the Xeon); the best of the six is recorded.
bw_bin=$(mktemp)
gcc -O2 -march=native -fopenmp benchmarks/harness/read_bw.c -o "$bw_bin"
bw_runs=()
read_bw() { for pf in 0 2048 8192; do bw_runs+=("$("$bw_bin" "$threads" "$pf" | awk '{print $5}')"); done; }
read_bw
raw=$(mktemp)
# ROUNDS passes over the files, each running the three side by side for REPS repeats: on a shared
# host whose speed drifts over minutes, every tool then meets the same slow and fast stretches (one
# pass of five repeats had one file's ratio move from 1.39x to 1.03x between two runs an hour apart).
for round in $(seq "$rounds"); do
  for k in "${kinds[@]}"; do
    f=$(file_for "$k")
    for rp in 1 0; do
      "$llama/llama-bench" -m "$f" -p 512 -n 128 -t "$threads" -r "$reps" --repack "$rp" -o jsonl 2>/dev/null |
        sed "s/^/llama$rp $k /" >> "$raw"
    done
    "$ferrox" bench -m "$f" -p 512 -n 128 -t "$threads" -r "$reps" -o jsonl 2>/dev/null | sed "s/^/ferrox $k /" >> "$raw"
  done
done
# One row per tool, file and test: every round's samples, their mean and deviation, the largest RSS.
python3 - "$raw" <<'PY'
import json, statistics, sys
rows, order = {}, []
for line in open(sys.argv[1]):
    who, kind, js = line.split(" ", 2)
    d = json.loads(js)
    key = (who, kind, d.get("n_prompt", 0), d.get("n_gen", 0))
    if key not in rows:
        rows[key] = d
        order.append(key)
        continue
    m = rows[key]
    m["samples_ts"] = m.get("samples_ts", []) + d.get("samples_ts", [])
    m["peak_rss_bytes"] = max(m.get("peak_rss_bytes", 0), d.get("peak_rss_bytes", 0))
for key in order:
    m = rows[key]
    s = m.get("samples_ts", [])
    if s:
        m["avg_ts"], m["stddev_ts"] = statistics.fmean(s), statistics.stdev(s) if len(s) > 1 else 0.0
with open(sys.argv[1], "w") as out:
    for key in order:
        out.write(f"{key[0]} {key[1]} {json.dumps(rows[key])}\n")
PY
read_bw
bw=$(printf '%s\n' "${bw_runs[@]}" | sort -g | tail -1)
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); read bandwidth ($threads threads, before/after, plain/2 KiB/8 KiB ahead): ${bw_runs[*]} GB/s"
echo
python3 - "$raw" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    who, kind, js = line.split(" ", 2)
    d = json.loads(js)
    test = "pp" if d.get("n_prompt", 0) > 0 else "tg"
    rows.setdefault(kind, {})[(who, test)] = d
print("| file | size MiB | test | llama AMX t/s | llama --repack 0 t/s | ferrox t/s | vs AMX | vs plain | ferrox peak RSS MiB |")
print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
for kind, r in rows.items():
    for test in ("pp", "tg"):
        a, p, f = r.get(("llama1", test)), r.get(("llama0", test)), r.get(("ferrox", test))
        if not (a and p and f):
            print(f"| {kind} | | {test} | missing | | | | | |"); continue
        size = a.get("model_size", 0) / 2**20
        ta, tp, tf = a["avg_ts"], p["avg_ts"], f["avg_ts"]
        rss = f.get("peak_rss_bytes", 0) / 2**20
        name = "pp512" if test == "pp" else "tg128"
        print(f"| {kind} | {size:.0f} | {name} | {ta:.1f} ± {a['stddev_ts']:.1f} | {tp:.1f} ± {p['stddev_ts']:.1f} | {tf:.1f} ± {f['stddev_ts']:.1f} | {tf/ta:.2f} | {tf/tp:.2f} | {rss:.0f} |")
PY
echo
echo "raw rows: $raw"
if [ "${RECORD:-1}" = 1 ]; then
  python3 benchmarks/harness/record.py bench --out benchmarks/results/cpu-e2e.jsonl --set bar --rss \
    --source benchmarks/run_bar.sh --ref "llama1=llama.cpp default (repack)" \
    --ref "llama0=llama.cpp --repack 0" "$raw" > /dev/null
  python3 benchmarks/harness/record.py line --out benchmarks/results/cpu-e2e.jsonl --set bar \
    --source "benchmarks/run_bar.sh (benchmarks/harness/read_bw.c)" what=read_bw threads="$threads" \
    figure="$bw" unit=GB/s stat="best of before/after x plain/prefetch 2 KiB/8 KiB: ${bw_runs[*]}" > /dev/null
  echo "recorded in benchmarks/results/cpu-e2e.jsonl"
fi
