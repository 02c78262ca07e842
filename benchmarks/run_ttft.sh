#!/usr/bin/env bash
# Load to first token, side by side: the wall time of one process that loads the model, reads a
# one-word prompt and prints one token, ferrox `run` beside llama.cpp's `llama-cli` (single turn,
# no warm-up run), 2 threads, medians of REPS alternated runs. Holds /tmp/ferrox-cpu.lock. Appends
# one line a model to benchmarks/results/cpu-e2e.jsonl (set "ttft"; RECORD=0: not; MACHINE labels it).
#
#   benchmarks/run_ttft.sh [MODEL...]     (FERROX, LLAMA_BIN, REPS=5)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${REPS:-5}
llama=${LLAMA_BIN:-$HOME/.cache/ferrox/llama.cpp-build/bin}
ferrox=${FERROX:-${CARGO_TARGET_DIR:-target}/release/ferrox}
models=("${@:-$HOME/.cache/ferrox/models/gemma-3-270m-q4_k_m.gguf}")
export LD_LIBRARY_PATH="$llama${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec 9> /tmp/ferrox-cpu.lock
flock 9
wall() { local s e; s=$(date +%s%N); "$@" </dev/null >/dev/null 2>&1; e=$(date +%s%N); echo $(( (e - s) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "| model | llama-cli ms | ferrox run ms | ratio |"
echo "|---|---:|---:|---:|"
for m in "${models[@]}"; do
  l=(); f=()
  for _ in $(seq "$reps"); do
    l+=("$(wall "$llama/llama-cli" -m "$m" -p Hello -n 1 -st --no-warmup --simple-io -t 2)")
    f+=("$(wall "$ferrox" run "$m" -p Hello -n 1 -t 2)")
  done
  lm=$(printf '%s\n' "${l[@]}" | median); fm=$(printf '%s\n' "${f[@]}" | median)
  echo "| $(basename "$m") | $lm | $fm | $(awk -v a="$lm" -v b="$fm" 'BEGIN {printf "%.2fx", a / b}') |"
  if [ "${RECORD:-1}" = 1 ]; then
    python3 benchmarks/harness/record.py line --out benchmarks/results/cpu-e2e.jsonl --set ttft \
      --source benchmarks/run_ttft.sh what=load_to_first_token "file=$(basename "$m")" \
      "kind=$(python3 benchmarks/harness/record.py kind "$m")" \
      backend=cpu threads=2 "figure=$fm" unit=ms "stat=median of $reps alternated" \
      "ref=llama-cli (single turn, no warm-up)" "ref_figure=$lm" > /dev/null
  fi
done
