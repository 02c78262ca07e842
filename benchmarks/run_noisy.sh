#!/usr/bin/env bash
# Decode under a noisy neighbour: tg128 (2 threads, -r 3) quiet, then with a busy loop on one of the
# machine's cores started a second before, for ferrox and both llama.cpp modes, one file. Holds
# /tmp/ferrox-cpu.lock. Appends the kept share (noisy / quiet) to benchmarks/results/cpu-e2e.jsonl
# (set "noisy"; RECORD=0: not; MACHINE labels the lines).
#
#   benchmarks/run_noisy.sh [MODEL]     (FERROX, LLAMA_BIN; default the Q4_K_M file)
set -euo pipefail
cd "$(dirname "$0")/.."
llama=${LLAMA_BIN:-$HOME/.cache/ferrox/llama.cpp-build/bin}
ferrox=${FERROX:-${CARGO_TARGET_DIR:-target}/release/ferrox}
f=${1:-$HOME/.cache/ferrox/models/gemma-3-270m-q4_k_m.gguf}
export LD_LIBRARY_PATH="$llama${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec 9> /tmp/ferrox-cpu.lock
flock 9
tg() { "$@" -p 0 -n 128 -t 2 -r 3 -o jsonl 2>/dev/null | python3 -c 'import json,sys; print("%.2f" % json.loads(sys.stdin.readline())["avg_ts"])'; }
noisy() { sh -c 'while :; do :; done' & local pid=$!; sleep 1; tg "$@"; kill $pid; }
fq=$(tg "$ferrox" bench -m "$f"); fn=$(noisy "$ferrox" bench -m "$f")
echo "ferrox: $fq -> $fn t/s"
for rp in 1 0; do
  lq=$(tg "$llama/llama-bench" -m "$f" --repack $rp); ln=$(noisy "$llama/llama-bench" -m "$f" --repack $rp)
  ref="llama.cpp default (repack)"; [ $rp = 0 ] && ref="llama.cpp --repack 0"
  echo "$ref: $lq -> $ln t/s"
  [ "${RECORD:-1}" = 1 ] || continue
  python3 benchmarks/harness/record.py line --out benchmarks/results/cpu-e2e.jsonl --set noisy \
    --source benchmarks/run_noisy.sh what=tg128_noisy_kept "file=$(basename "$f")" \
    "kind=$(python3 benchmarks/harness/record.py kind "$f")" backend=cpu threads=2 \
    "figure=$(awk -v a="$fn" -v b="$fq" 'BEGIN {printf "%d", 100 * a / b + 0.5}')" "quiet=$fq" "noisy=$fn" \
    unit=% "stat=noisy / quiet t/s, -r 3" "ref=$ref" \
    "ref_figure=$(awk -v a="$ln" -v b="$lq" 'BEGIN {printf "%d", 100 * a / b + 0.5}')" "ref_quiet=$lq" "ref_noisy=$ln" > /dev/null
done
