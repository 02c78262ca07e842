#!/usr/bin/env bash
# End-to-end throughput and perplexity, ferrox beside llama.cpp, same files, same thread count,
# back to back on one machine. Prints markdown and appends normalized lines to
# benchmarks/results/cpu-e2e.jsonl (sets "suite" and "perplexity"; RECORD=0: not), from which
# `python3 benchmarks/tables.py` regenerates benchmarks/e2e.md's tables.
#
#   benchmarks/run_suite.sh [MODEL...]     (default: the models of benchmarks/suite.json that exist)
#
# Environment: THREADS (2), REPS (3), N_PROMPT (512), N_GEN (128), CTX (512, perplexity),
# CHUNKS (perplexity chunks; default all), MACHINE (the lines' label, default from the CPU),
# PPL_TEXT (benchmarks/data/docutils-peps.txt), LLAMA_BIN (the llama.cpp build's bin/),
# FERROX_MODELS (where suite.json's files live). Needs a quiet machine for figures that mean much:
# the load average is printed before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
reps=${REPS:-3}
np=${N_PROMPT:-512}
ng=${N_GEN:-128}
ctx=${CTX:-512}
text=${PPL_TEXT:-benchmarks/data/docutils-peps.txt}
llama=${LLAMA_BIN:-/root/.cache/ferrox/llama.cpp-build/bin}
models_dir=${FERROX_MODELS:-$HOME/.cache/ferrox/models}
export LD_LIBRARY_PATH="$llama${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

cargo build -q --release -p ferrox
ferrox=${CARGO_TARGET_DIR:-target}/release/ferrox

models=("$@")
if [ ${#models[@]} -eq 0 ]; then
  while read -r f; do
    case $f in /*) p=$f ;; *) p=$models_dir/$f ;; esac
    [ -f "$p" ] && models+=("$p")
  done < <(python3 -c 'import json,sys; [print(c["file"]) for c in json.load(open(sys.argv[1]))["checkpoints"] if not c.get("skip")]' benchmarks/suite.json)
fi

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
raw=$(mktemp)
echo "## ferrox bench"
echo
"$ferrox" bench --suite benchmarks/suite.json -p "$np" -n "$ng" -t "$threads" -r "$reps" -o md
for m in "${models[@]}"; do
  k=$(python3 benchmarks/harness/record.py kind "$m")
  "$ferrox" bench -m "$m" -p "$np" -n "$ng" -t "$threads" -r "$reps" -o jsonl 2>/dev/null | sed "s/^/ferrox $k /" >> "$raw"
  for repack in 1 0; do
    echo
    echo "## llama-bench --repack $repack: $(basename "$m")"
    echo
    "$llama/llama-bench" -m "$m" -p "$np" -n "$ng" -t "$threads" -r "$reps" --repack "$repack" -o jsonl 2>/dev/null |
      tee >(sed "s/^/llama$repack $k /" >> "$raw") |
      python3 -c 'import json,sys
for l in sys.stdin:
    r = json.loads(l); t = "pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"]
    print("| %s | %.2f ± %.2f |" % (t, r["avg_ts"], r["stddev_ts"]))'
  done
done
[ "${RECORD:-1}" = 1 ] && python3 benchmarks/harness/record.py bench --out benchmarks/results/cpu-e2e.jsonl \
  --set suite --rss --source benchmarks/run_suite.sh --ref "llama1=llama.cpp default (repack)" \
  --ref "llama0=llama.cpp --repack 0" "$raw" > /dev/null
echo
echo "## perplexity, -c $ctx${CHUNKS:+ --chunks $CHUNKS}, $text"
for m in "${models[@]}"; do
  echo
  fo=$("$ferrox" perplexity -m "$m" -f "$text" -c "$ctx" -t "$threads" ${CHUNKS:+--chunks $CHUNKS} 2>/dev/null | tail -1)
  lo=$("$llama/llama-perplexity" -m "$m" -f "$text" -c "$ctx" -t "$threads" ${CHUNKS:+--chunks $CHUNKS} 2>&1 | grep -E "Final estimate" || echo "(llama-perplexity failed)")
  echo "ferrox $(basename "$m"): $fo"
  echo "llama-perplexity $(basename "$m"): $lo"
  # "... PPL = 15.7790 +/- 0.68140" in both tools' last line
  f=$(echo "$fo" | grep -oE '[0-9]+\.[0-9]+ \+/- [0-9]+\.[0-9]+' | head -1)
  l=$(echo "$lo" | grep -oE '[0-9]+\.[0-9]+ \+/- [0-9]+\.[0-9]+' | head -1)
  if [ "${RECORD:-1}" = 1 ] && [ -n "$f" ] && [ -n "$l" ]; then
    python3 benchmarks/harness/record.py line --out benchmarks/results/cpu-e2e.jsonl --set perplexity \
      --source "benchmarks/run_suite.sh" what=perplexity "file=$(basename "$m")" "kind=$(python3 benchmarks/harness/record.py kind "$m")" \
      backend=cpu "threads=$threads" "variant=${FERROX_AMX_GEMM:+FERROX_AMX_GEMM=}${FERROX_AMX_GEMM:-default}" \
      "figure=${f%% *}" "sd=${f##* }" unit=PPL "stat=-c $ctx${CHUNKS:+ --chunks $CHUNKS}" \
      ref=llama-perplexity "ref_figure=${l%% *}" "ref_sd=${l##* }" > /dev/null
  fi
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
