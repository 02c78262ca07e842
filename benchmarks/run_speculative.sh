#!/usr/bin/env bash
# Speculative decoding, issue 34's bar: Gemma 3 270M re-quantized to F16 (the target) and to Q4_0
# (the draft) with `ferrox quantize`, greedy decoding of N tokens. ferrox: `bench`'s sgN test
# (plain and speculative runs alternated, decode time only, the same token ids checked), beside
# llama.cpp's `llama-speculative` on the same pair, prompt and draft size (-t 2, greedy; its
# "decoded ... speed" line, median of REPS runs). Then prompt lookup on an editing prompt
# (benchmarks/data/edit-prompt.txt), ferrox plain beside ferrox --lookup. Holds
# /tmp/ferrox-cpu.lock. Appends lines to benchmarks/results/speculative.jsonl (set
# "speculative"; RECORD=0: not; MACHINE labels it).
#
#   benchmarks/run_speculative.sh     (FERROX, LLAMA_BIN, REPS=7, N=128, DRAFT_MAX=4, DRAFT_VOCAB=16384,
#                                      DRAFT_P_MIN=0.3, given to llama-speculative too)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${REPS:-7}
n=${N:-128}
dmax=${DRAFT_MAX:-4}
dvocab=${DRAFT_VOCAB:-16384}
pmin=${DRAFT_P_MIN:-0.3}
llama=${LLAMA_BIN:-$HOME/.cache/ferrox/llama.cpp-build/bin}
ferrox=${FERROX:-${CARGO_TARGET_DIR:-target}/release/ferrox}
src=${MODEL:-$HOME/.cache/ferrox/models/gemma-3-270m-q4_k_m.gguf}
dir=${SPEC_DIR:-/tmp/ferrox-spec}
export LD_LIBRARY_PATH="$llama${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$dir"
[ -f "$dir/g-f16.gguf" ] || "$ferrox" quantize --allow-requantize "$src" "$dir/g-f16.gguf" f16 > /dev/null
[ -f "$dir/g-q4_0.gguf" ] || "$ferrox" quantize --allow-requantize "$src" "$dir/g-q4_0.gguf" q4_0 > /dev/null
exec 9> /tmp/ferrox-cpu.lock
flock 9
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
prompt="Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker who"
printf '%s' "$prompt" > "$dir/story.txt"

sg() {  # sg NAME ARGS...: one ferrox bench sgN row as JSON
  "$ferrox" bench -m "$dir/g-f16.gguf" -p 0 -n "$n" -r "$reps" -t 2 -o jsonl "$@" | grep '"speculative"'
}
record() {  # record WHAT VARIANT JSON [REF REF_FIGURE]
  [ "${RECORD:-1}" = 1 ] || return 0
  python3 - "$@" <<'EOF'
import json, subprocess, sys
what, variant, row = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
s = row["speculative"]
fields = [f"what={what}", f"variant={variant}", "file=g-f16.gguf", "kind=F16", "backend=cpu",
          f"threads={row['n_threads']}", f"figure={row['avg_ts']:.2f}", f"sd={row['stddev_ts']:.2f}", "unit=t/s",
          f"stat=mean of {len(row['samples_ts'])} (plain and speculative alternated)",
          f"plain={s['plain_avg_ts']:.2f}", f"speedup={s['speedup']:.3f}", f"acceptance={s['acceptance']:.3f}",
          f"tokens_per_pass={s['tokens_per_pass']:.3f}", f"draft_max={s['draft_max']}",
          f"draft_vocab={s['draft_vocab']}", f"same_tokens={json.dumps(s['same_tokens'])}"]
if len(sys.argv) > 4:
    fields += [f"ref={sys.argv[4]}", f"ref_figure={sys.argv[5]}"]
subprocess.run(["python3", "benchmarks/harness/record.py", "line", "--out", "benchmarks/results/speculative.jsonl",
                "--set", "speculative", "--source", "benchmarks/run_speculative.sh", *fields],
               check=True, stdout=subprocess.DEVNULL)
EOF
}

# The pair: ferrox, then llama-speculative.
row=$(sg -md "$dir/g-q4_0.gguf" --draft-max "$dmax" --draft-vocab "$dvocab" --draft-p-min "$pmin" --spec-prompt-file "$dir/story.txt")
ls=()
for _ in $(seq "$reps"); do
  ls+=("$("$llama/llama-speculative" -m "$dir/g-f16.gguf" -md "$dir/g-q4_0.gguf" -p "$prompt" -n "$n" \
      --temp 0 -t 2 -td 2 --spec-draft-n-max "$dmax" --spec-draft-p-min "$pmin" -c 1024 2>&1 \
      | sed -n 's/.*decoded .* speed: *\([0-9.]*\) t\/s.*/\1/p' | tail -1)")
done
lsm=$(printf '%s\n' "${ls[@]}" | median)
echo "pair: $row"
echo "llama-speculative t/s: ${ls[*]} (median $lsm)"
record "sg$n" "F16 target, Q4_0 draft (max $dmax, vocab $dvocab, p-min $pmin)" "$row" "llama-speculative (-t 2, --spec-draft-n-max $dmax, --spec-draft-p-min $pmin)" "$lsm"

# Prompt lookup on the editing prompt.
row=$(sg --lookup --draft-max "$dmax" --spec-prompt-file benchmarks/data/edit-prompt.txt)
echo "lookup: $row"
record "sg$n" "F16, prompt lookup on an editing prompt (max $dmax)" "$row"
