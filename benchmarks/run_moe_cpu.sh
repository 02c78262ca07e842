#!/usr/bin/env bash
# Issue 33's CPU bar, side by side in one run: a synthetic mixture of experts that fits this
# machine — Qwen3-30B-A3B's shapes (make_synthetic_gguf.py --shape qwen3moe-30b, seed 0: 128
# experts of 768, 8 a token) cut to LAYERS layers — quantized by llama-quantize to each of KINDS,
# then llama.cpp's build in its default (repacking) mode and with --repack 0, and ferrox, THREADS
# threads, pp512 and tg128, means of REPS repeats. Prints a markdown table, appends the normalized
# lines to benchmarks/results/moe.jsonl (RECORD=0: not); `python3 benchmarks/tables.py` then
# regenerates benchmarks/moe.md.
#
#   benchmarks/run_moe_cpu.sh       (LAYERS=8 KINDS="Q4_K_M" REPS=3 THREADS=2; LLAMA_BIN, FERROX,
#                                    GGUF_PY: a gguf-py folder when the `gguf` package is missing;
#                                    PREPARE_ONLY=1: make the files and stop)
#
# The files (F16 ~11 GB at 8 layers, removed after quantizing unless KEEP_F16=1) are cached under
# ~/.cache/ferrox/models/synthetic/. Holds /tmp/ferrox-cpu.lock for the measuring part and prints
# the load average before and after: a figure taken beside another process means little on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${REPS:-3}
threads=${THREADS:-2}
layers=${LAYERS:-8}
llama=${LLAMA_BIN:-$HOME/.cache/ferrox/llama.cpp-build/bin}
ferrox=${FERROX:-${CARGO_TARGET_DIR:-target}/release/ferrox}
dir=$HOME/.cache/ferrox/models/synthetic
read -r -a kinds <<< "${KINDS:-Q4_K_M}"
export LD_LIBRARY_PATH="$llama${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$dir"
base=$dir/qwen3moe-30b-l$layers
model="qwen3moe-30b cut to $layers layers (synthetic, seed 0)"

file_for() {
  local f=$base-$(echo "$1" | tr 'A-Z' 'a-z').gguf
  if [ ! -f "$f" ]; then
    if [ ! -f "$base-f16.gguf" ]; then
      PYTHONPATH=/work/shared/tools${GGUF_PY:+:$GGUF_PY} python3 - "$base-f16.gguf" "$layers" >&2 <<'PY'
import sys
import make_synthetic_gguf as m
m.SHAPES["cut"] = dict(m.SHAPES["qwen3moe-30b"], layers=int(sys.argv[2]))
sys.argv = [sys.argv[0], "--shape", "cut", "--out", sys.argv[1], "--seed", "0", "--jobs", "2"]
sys.exit(m.main())
PY
    fi
    [ "$1" = F16 ] || "$llama/llama-quantize" "$base-f16.gguf" "$f" "$1" "$threads" > /dev/null 2>&1
  fi
  echo "$f"
}

for k in "${kinds[@]}"; do file_for "$k" > /dev/null; done
[ "${KEEP_F16:-0}" = 1 ] || [[ " ${kinds[*]} " == *" F16 "* ]] || rm -f "$base-f16.gguf"
if [ "${PREPARE_ONLY:-0}" = 1 ]; then echo "files ready under $dir"; exit 0; fi

exec 9> /tmp/ferrox-cpu.lock
flock 9
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "llama.cpp: $("$llama/llama-bench" --version 2>&1 | head -1 || true); ferrox: $(git rev-parse --short HEAD)"
echo "model: $model"
"$ferrox" kernels "$(file_for "${kinds[0]}")" 2>/dev/null | grep -i "per decoded token" | head -2 || true
raw=$(mktemp)
for k in "${kinds[@]}"; do
  f=$(file_for "$k")
  for rp in 1 0; do
    "$llama/llama-bench" -m "$f" -p 512 -n 128 -t "$threads" -r "$reps" --repack "$rp" -o jsonl 2>/dev/null |
      sed "s/^/llama$rp $k /" >> "$raw"
  done
  "$ferrox" bench -m "$f" -p 512 -n 128 -t "$threads" -r "$reps" -o jsonl 2>/dev/null | sed "s/^/ferrox $k /" >> "$raw"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$raw" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    who, kind, js = line.split(" ", 2)
    d = json.loads(js)
    rows.setdefault(kind, {})[(who, "pp" if d.get("n_prompt", 0) > 0 else "tg")] = d
print("| kind | test | llama default t/s | llama --repack 0 t/s | ferrox t/s | vs default | vs plain |")
print("|---|---|---:|---:|---:|---:|---:|")
for kind, r in rows.items():
    for test in ("pp", "tg"):
        a, p, f = r.get(("llama1", test)), r.get(("llama0", test)), r.get(("ferrox", test))
        if not (a and p and f):
            print(f"| {kind} | {test} | missing | | | | |"); continue
        print(f"| {kind} | {test} | {a['avg_ts']:.1f} | {p['avg_ts']:.1f} | {f['avg_ts']:.1f} | {f['avg_ts']/a['avg_ts']:.2f} | {f['avg_ts']/p['avg_ts']:.2f} |")
PY
echo "raw rows: $raw"
if [ "${RECORD:-1}" = 1 ]; then
  python3 benchmarks/harness/record.py bench --out benchmarks/results/moe.jsonl --set moe-cpu --rss \
    --source benchmarks/run_moe_cpu.sh --model "$model" --ref "llama1=llama.cpp default (repack)" \
    --ref "llama0=llama.cpp --repack 0" "$raw" > /dev/null
  echo "recorded in benchmarks/results/moe.jsonl"
fi
