#!/usr/bin/env bash
# End-to-end throughput and perplexity, ferrox beside llama.cpp, same files, same thread count,
# back to back on one machine. Prints markdown; benchmarks/e2e.md records a run.
#
#   benchmarks/run_suite.sh [MODEL...]     (default: the models of benchmarks/suite.json that exist)
#
# Environment: THREADS (2), REPS (3), N_PROMPT (512), N_GEN (128), CTX (512, perplexity),
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
echo "## ferrox bench"
echo
"$ferrox" bench --suite benchmarks/suite.json -p "$np" -n "$ng" -t "$threads" -r "$reps" -o md
for m in "${models[@]}"; do
  for repack in 1 0; do
    echo
    echo "## llama-bench --repack $repack: $(basename "$m")"
    echo
    "$llama/llama-bench" -m "$m" -p "$np" -n "$ng" -t "$threads" -r "$reps" --repack "$repack" -o md 2>/dev/null
  done
done
echo
echo "## perplexity, -c $ctx, $text"
for m in "${models[@]}"; do
  echo
  echo "ferrox $(basename "$m"):"
  "$ferrox" perplexity -m "$m" -f "$text" -c "$ctx" -t "$threads" 2>/dev/null | tail -1
  echo "llama-perplexity $(basename "$m"):"
  "$llama/llama-perplexity" -m "$m" -f "$text" -c "$ctx" -t "$threads" 2>&1 | grep -E "Final estimate" || echo "(llama-perplexity failed)"
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
