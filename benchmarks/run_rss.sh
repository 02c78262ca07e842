#!/usr/bin/env bash
# Whole-process peak RSS, side by side: `/usr/bin/time -f %M` around one `-p 512 -n 128 -r 1` bench,
# ferrox as shipped beside llama.cpp's default (repacking) build, and ferrox with
# FERROX_CPU_PREPACK=0 beside llama.cpp's --repack 0 (neither keeps a repacked copy). 2 threads,
# holds /tmp/ferrox-cpu.lock. Appends the lines to benchmarks/results/cpu-e2e.jsonl (set "rss";
# RECORD=0: not; MACHINE labels them).
#
#   benchmarks/run_rss.sh [MODEL...]     (FERROX, LLAMA_BIN; default: the Q4_K_M, Q4_0, Q8_0 bar files)
set -euo pipefail
cd "$(dirname "$0")/.."
llama=${LLAMA_BIN:-$HOME/.cache/ferrox/llama.cpp-build/bin}
ferrox=${FERROX:-${CARGO_TARGET_DIR:-target}/release/ferrox}
m=$HOME/.cache/ferrox/models
models=("${@:-$m/gemma-3-270m-q4_k_m.gguf $m/gemma-3-270m-q4_0.llama.gguf $m/gemma-3-270m-q8_0.llama.gguf}")
read -r -a models <<< "${models[*]}"
export LD_LIBRARY_PATH="$llama${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec 9> /tmp/ferrox-cpu.lock
flock 9
# peak RSS in MiB of one command
rss() { /usr/bin/time -f %M "$@" 2>&1 >/dev/null | tail -1 | awk '{printf "%d", $1 / 1024}'; }
echo "| file | llama.cpp default | ferrox | llama.cpp --repack 0 | ferrox FERROX_CPU_PREPACK=0 |"
echo "|---|---:|---:|---:|---:|"
for f in "${models[@]}"; do
  la=$(rss "$llama/llama-bench" -m "$f" -p 512 -n 128 -r 1 -t 2 --repack 1)
  fa=$(rss "$ferrox" bench -m "$f" -p 512 -n 128 -r 1 -t 2)
  lp=$(rss "$llama/llama-bench" -m "$f" -p 512 -n 128 -r 1 -t 2 --repack 0)
  fp=$(FERROX_CPU_PREPACK=0 rss "$ferrox" bench -m "$f" -p 512 -n 128 -r 1 -t 2)
  echo "| $(basename "$f") | $la | $fa | $lp | $fp |"
  [ "${RECORD:-1}" = 1 ] || continue
  k=$(python3 benchmarks/harness/record.py kind "$f")
  for v in "default $fa llama.cpp default (repack)|$la" "FERROX_CPU_PREPACK=0 $fp llama.cpp --repack 0|$lp"; do
    read -r variant fig rest <<< "$v"
    python3 benchmarks/harness/record.py line --out benchmarks/results/cpu-e2e.jsonl --set rss \
      --source benchmarks/run_rss.sh what=peak_rss_process "file=$(basename "$f")" "kind=$k" backend=cpu \
      threads=2 "variant=$variant" "figure=$fig" unit=MiB "stat=one run" "ref=${rest%|*}" \
      "ref_figure=${rest#*|}" > /dev/null
  done
done
